"""explain on an already-merged store holding a bad value (a database changed after its merge, or
written by an older straggler): one line naming the table, the column, the node and the row, never a
traceback; a store without one is explained as before (straggler.analysis.merge.values' rules)."""
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from straggler.analysis import explain
from straggler.analysis.merge import merge
from straggler.errors import StragglerError
from straggler_lab import synth

REPO = Path(__file__).resolve().parents[1]
STRAGGLER = str(REPO / ".venv" / "bin" / "straggler")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    out = tmp_path_factory.mktemp("bad-values")
    facts = synth.write_nodes(str(out), synth.SynthSpec(scenario="cpu_hog", events=20000, straggler=1))
    merge([f["path"] for f in facts["files"]], str(out / "cluster.db"))
    return out / "cluster.db"


@pytest.mark.parametrize("table, column, value", [
    ("thread_time", "interval_ns", "'abc'"),
    ("thread_time", "pid", "X'00ff'"),
    ("processes", "world_size", "'four'"),
    ("thread_rollup", "summary_ns", "'abc'"),
])
def test_explain_of_a_bad_value_fails_in_one_line_naming_it(cluster, tmp_path, table, column, value):
    db = tmp_path / "cluster.db"
    shutil.copy(cluster, db)
    conn = sqlite3.connect(db)
    conn.execute(f"UPDATE {table} SET {column} = {value} WHERE rowid IN (SELECT rowid FROM {table} LIMIT 5 OFFSET 1)")
    conn.commit()
    conn.close()
    with pytest.raises(StragglerError) as refused:
        explain.explain_db(str(db))
    assert f"{table}.{column} of node gpu-node-" in str(refused.value) and "\n" not in str(refused.value)
    proc = subprocess.run([STRAGGLER, "explain", "-d", str(db)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and f"{table}.{column}" in proc.stderr, proc.stderr


def test_a_sound_store_is_explained_as_before(cluster):
    report = explain.explain_db(str(cluster))
    assert report.straggler == "gpu-node-02"
