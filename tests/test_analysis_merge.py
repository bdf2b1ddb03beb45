"""merge: four node databases become one cluster database with every row, unique ids and
aligned times that follow the given clock offsets; each bad input is refused and leaves nothing."""
import json
import os
import shutil
import sqlite3

import pytest

from straggler import cli, clock
from straggler.analysis import merge as merge_mod
from straggler_lab import synth
from straggler.analysis.merge import MergeError, merge

TABLES = ("events", "aggregates", "clock_pairs", "processes", "lost_events", "agent_cost", "probes")


@pytest.fixture(scope="module")
def node_dbs(tmp_path_factory):
    base = tmp_path_factory.mktemp("nodes")
    spec = synth.SynthSpec(scenario="io_cpu", events=12_000, offsets_ns={0: -9_000_000, 1: 0, 2: 250_000_000, 3: 3_000_000},
                           drift_ppm={1: 40.0, 3: -25.0}, clock_pair_every_s=2.0,
                           record_all=True)   # every call a row: the tests pick events by seq
    facts = synth.write_nodes(str(base), spec)
    return facts


def _count(db, sql):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _leftovers(directory):
    return [n for n in os.listdir(directory) if ".tmp" in n or n.endswith("-journal")]


def test_four_nodes_merge_with_every_row_and_unique_ids(node_dbs, tmp_path):
    paths = [f["path"] for f in node_dbs["files"]]
    out = str(tmp_path / "cluster.db")
    summary = merge(paths, out, offsets=node_dbs["offsets"])
    for table in TABLES:
        expected = sum(_count(p, f"SELECT COUNT(*) FROM {table}")[0][0] for p in paths)
        assert _count(out, f"SELECT COUNT(*) FROM {table}")[0][0] == expected == summary["rows"][table], table
    assert _count(out, "SELECT COUNT(*) - COUNT(DISTINCT id) FROM events")[0][0] == 0
    assert _count(out, "SELECT COUNT(DISTINCT node) FROM events")[0][0] == 4
    unique = [r for r in _count(out, "PRAGMA index_list(events)") if r[1] == "events_node_seq"]
    assert unique and unique[0][2] == 1
    keys = dict(_count(out, "SELECT key, value FROM meta"))
    assert keys["node.gpu-node-03.node"] == "gpu-node-03" and keys["node.gpu-node-01.scenario"] == "io_cpu"
    assert json.loads(keys["nodes"]) == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    assert not _leftovers(tmp_path)


def test_aligned_times_follow_the_given_offsets(node_dbs, tmp_path):
    paths = [f["path"] for f in node_dbs["files"]]
    out = str(tmp_path / "cluster.db")
    merge(paths, out, offsets=node_dbs["offsets"])
    # step 0, slot 0 (seq 0) starts at the same reference time on every node: raw ts differ by minutes
    rows = _count(out, "SELECT node, ts, ts_aligned FROM events WHERE seq = 0 ORDER BY node")
    assert len({ts for _, ts, _ in rows}) == 4
    assert {al for _, _, al in rows} == {synth.REFERENCE_T0_NS}
    stored = _count(out, "SELECT node, offset_ns, uncertainty_ns FROM clock_offsets WHERE method = 'merge' ORDER BY node")
    assert stored == [(n, off, unc) for n, (off, unc) in sorted(node_dbs["offsets"].items())]
    # shift one node's offset by 40 ms: exactly that node moves, by -40 ms
    shifted = dict(node_dbs["offsets"], **{"gpu-node-02": (node_dbs["offsets"]["gpu-node-02"][0] + 40_000_000, 1000)})
    out2 = str(tmp_path / "cluster2.db")
    merge(paths, out2, offsets=shifted)
    rows2 = dict((n, al) for n, _, al in _count(out2, "SELECT node, ts, ts_aligned FROM events WHERE seq = 0"))
    assert rows2["gpu-node-02"] == synth.REFERENCE_T0_NS - 40_000_000
    assert rows2["gpu-node-01"] == synth.REFERENCE_T0_NS


def test_alignment_equals_clock_mono_to_real_minus_offset_under_drift(node_dbs, tmp_path):
    paths = [f["path"] for f in node_dbs["files"]]
    out = str(tmp_path / "cluster.db")
    merge(paths, out, offsets=node_dbs["offsets"])
    for node in ("gpu-node-02", "gpu-node-04"):        # the drifting clocks
        pairs = _count(out, f"SELECT mono_ns, real_ns FROM clock_pairs WHERE node = '{node}'")
        off = node_dbs["offsets"][node][0]
        sample = _count(out, f"SELECT ts, ts_aligned FROM events WHERE node = '{node}' AND seq % 53 = 0")
        assert len(sample) > 10
        for ts, aligned in sample:
            assert abs(aligned - (clock.mono_to_real(pairs, ts) - off)) <= 1


def test_offsets_come_from_the_inputs_clock_offsets_when_not_given(node_dbs, tmp_path):
    src = node_dbs["files"][2]["path"]
    copy = str(tmp_path / "n3.db")
    shutil.copy(src, copy)
    conn = sqlite3.connect(copy)
    conn.execute("INSERT INTO clock_offsets VALUES ('gpu-node-03', 250000000, 700, 1, 'https')")
    conn.commit()
    conn.close()
    out = str(tmp_path / "c.db")
    summary = merge([copy], out)
    assert summary["clock_alignment"]["gpu-node-03"]["source"] == "input"
    assert _count(out, "SELECT ts_aligned FROM events WHERE seq = 0") == [(synth.REFERENCE_T0_NS,)]


def test_committed_rows_still_in_the_wal_are_merged(node_dbs, tmp_path):
    copy = str(tmp_path / "live.db")
    shutil.copy(node_dbs["files"][0]["path"], copy)
    writer = sqlite3.connect(copy)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    before = writer.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    writer.execute("INSERT INTO events (seq, node, source, op, ts, duration) "
                   "SELECT seq + 10000000, node, source, op, ts, duration FROM events LIMIT 500")
    writer.commit()
    try:
        assert os.path.getsize(copy + "-wal") > 0
        out = str(tmp_path / "c.db")
        merge([copy], out)
        assert _count(out, "SELECT COUNT(*) FROM events")[0][0] == before + 500
    finally:
        writer.close()


def _bad_inputs(node_dbs, tmp_path):
    good = [f["path"] for f in node_dbs["files"]]
    text = tmp_path / "notes.db"
    text.write_text("this is not a database\n" * 100)
    corrupt = str(tmp_path / "corrupt.db")
    shutil.copy(good[1], corrupt)
    size = os.path.getsize(corrupt)
    with open(corrupt, "r+b") as fh:
        fh.seek(size // 4)
        fh.write(b"\xa5" * (size // 2))
    newer = str(tmp_path / "newer.db")
    shutil.copy(good[2], newer)
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    dup = str(tmp_path / "dup.db")
    shutil.copy(good[0], dup)
    return {
        "not sqlite": ([good[0], str(text)], "not an SQLite database"),
        "corrupt": ([good[0], corrupt], "corrupt"),
        "newer schema": ([good[0], newer], "newer"),
        "same node twice": ([good[0], dup], "both hold node gpu-node-01"),
        "missing file": ([good[0], str(tmp_path / "nope.db")], "no such file"),
    }


@pytest.mark.parametrize("case", ["not sqlite", "corrupt", "newer schema", "same node twice", "missing file"])
def test_bad_input_is_refused_and_leaves_no_output(node_dbs, tmp_path, case):
    inputs, message = _bad_inputs(node_dbs, tmp_path)[case]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = str(out_dir / "cluster.db")
    with pytest.raises(MergeError) as err:
        merge(inputs, out)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert os.listdir(out_dir) == []


def test_output_equal_to_an_input_is_refused_and_the_input_untouched(node_dbs, tmp_path):
    copy = str(tmp_path / "a.db")
    shutil.copy(node_dbs["files"][0]["path"], copy)
    before = os.path.getsize(copy), os.path.getmtime(copy)
    with pytest.raises(MergeError, match="also an input"):
        merge([copy, node_dbs["files"][1]["path"]], copy)
    assert (os.path.getsize(copy), os.path.getmtime(copy)) == before
    assert not _leftovers(tmp_path)


def test_rename_resolves_a_duplicate_node(node_dbs, tmp_path):
    dup = str(tmp_path / "dup.db")
    shutil.copy(node_dbs["files"][0]["path"], dup)
    out = str(tmp_path / "c.db")
    summary = merge([node_dbs["files"][0]["path"], dup], out, rename=[("gpu-node-01", "gpu-node-01b")])
    assert summary["nodes"] == ["gpu-node-01", "gpu-node-01b"]
    n = _count(node_dbs["files"][0]["path"], "SELECT COUNT(*) FROM events")[0][0]
    assert _count(out, "SELECT node, COUNT(*) FROM events GROUP BY node") == [("gpu-node-01", n), ("gpu-node-01b", n)]
    assert _count(out, "SELECT COUNT(DISTINCT node) FROM processes") == [(2,)]
    out2 = str(tmp_path / "c2.db")
    assert merge([node_dbs["files"][0]["path"], dup], out2, rename=True)["nodes"] == ["gpu-node-01", "gpu-node-01-2"]


def test_cli_merge_with_offsets_file_and_a_one_line_refusal(node_dbs, tmp_path, capsys):
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({n: {"offset_ns": o, "uncertainty_ns": u} for n, (o, u) in node_dbs["offsets"].items()}))
    out = str(tmp_path / "cluster.db")
    paths = [f["path"] for f in node_dbs["files"]]
    assert cli.main(["merge", *paths, "-o", out, "--offsets", str(offsets), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["clock_alignment"]["gpu-node-03"]["offset_ns"] == 250_000_000
    assert cli.main(["merge", paths[0], paths[0], "-o", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "given twice" in err[0]
    assert not os.path.exists(tmp_path / "x.db")


def test_merging_a_merged_database_keeps_node_names_and_meta(node_dbs, tmp_path):
    paths = [f["path"] for f in node_dbs["files"]]
    half1, half2 = str(tmp_path / "h1.db"), str(tmp_path / "h2.db")
    merge(paths[:2], half1, offsets=node_dbs["offsets"])
    merge(paths[2:], half2, offsets=node_dbs["offsets"])
    out = str(tmp_path / "all.db")
    summary = merge([half1, half2], out)
    assert summary["nodes"] == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    assert _count(out, "SELECT ts_aligned FROM events WHERE seq = 0 AND node = 'gpu-node-03'") == [(synth.REFERENCE_T0_NS,)]
    assert dict(_count(out, "SELECT key, value FROM meta"))["node.gpu-node-04.node"] == "gpu-node-04"
    assert merge_mod.parse_renames(["a=b"]) == [("a", "b")]


def test_the_device_tables_of_every_node_are_merged(tmp_path):
    """gpus, gpu_samples, gpu_processes and gpu_errors (schema 3) are node tables: a merged cluster.db
    holds every node's rows under its node name; a node store without them (schema 2) merges as before."""
    from straggler.store.schema import GPU_SAMPLE_COLUMNS
    from straggler.store.writer import open_store
    paths = []
    for n, node in enumerate(("gpu-node-01", "gpu-node-02")):
        path = str(tmp_path / f"{node}.db")
        conn = open_store(path, node)
        conn.execute("INSERT INTO clock_pairs(node, mono_ns, real_ns) VALUES (?, 1000, 1700000000000000000)", (node,))
        for gpu in range(2):
            conn.execute("INSERT INTO gpus(node, gpu, uuid, pci_bus_id, ts) VALUES (?, ?, ?, '0000:c1:00.0', 5)",
                         (node, gpu, f"GPU-{n}{gpu}"))
            sample = dict.fromkeys(GPU_SAMPLE_COLUMNS)
            sample.update(node=node, ts=2000, gpu=gpu, sm_clock_mhz=990 if (n, gpu) == (1, 1) else 1980)
            conn.execute(f"INSERT INTO gpu_samples({', '.join(sample)}) VALUES ({', '.join('?' * len(sample))})",
                         tuple(sample.values()))
        conn.execute("INSERT INTO gpu_processes(node, pid, gpu, how, first_seen) VALUES (?, 42, 1, 'nvml', 10)", (node,))
        conn.execute("INSERT INTO gpu_errors(node, ts, gpu, pci_bus_id, xid, origin, message) "
                     "VALUES (?, 3000, 1, '0000:c1:00', 79, 'kernel', 'NVRM: Xid ...')", (node,))
        conn.close()
        paths.append(path)
    old = str(tmp_path / "old.db")
    conn = sqlite3.connect(old)
    conn.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
                       "INSERT INTO meta VALUES ('schema_version', '2'), ('node', 'gpu-node-03');"
                       "CREATE TABLE clock_pairs (node TEXT NOT NULL, mono_ns INTEGER NOT NULL, real_ns INTEGER NOT NULL);"
                       "INSERT INTO clock_pairs VALUES ('gpu-node-03', 1000, 1700000000000000000);")
    conn.close()
    out = str(tmp_path / "cluster.db")
    summary = merge(paths + [old], out)
    assert summary["rows"]["gpu_samples"] == 4 and summary["rows"]["gpu_errors"] == 2
    assert _count(out, "SELECT node, gpu, uuid FROM gpus ORDER BY node, gpu") == [
        ("gpu-node-01", 0, "GPU-00"), ("gpu-node-01", 1, "GPU-01"), ("gpu-node-02", 0, "GPU-10"), ("gpu-node-02", 1, "GPU-11")]
    assert _count(out, "SELECT node, gpu FROM gpu_samples WHERE sm_clock_mhz < 1980") == [("gpu-node-02", 1)]
    assert _count(out, "SELECT node, pid, gpu FROM gpu_processes ORDER BY node") == [("gpu-node-01", 42, 1),
                                                                                   ("gpu-node-02", 42, 1)]
    assert _count(out, "SELECT node, xid FROM gpu_errors ORDER BY node") == [("gpu-node-01", 79), ("gpu-node-02", 79)]


def test_the_merged_rollups_are_made_from_the_rows_merged_never_copied(tmp_path):
    """thread_rollup (what explain reads a long trace by) in a cluster.db is rolled up from the
    thread_time merged into it: an input's own roll-ups, crafted or stale, never reach explain."""
    from straggler_lab import series
    facts = series.write_nodes(str(tmp_path / "nodes"), series.SeriesSpec(nodes=2, seconds=300))
    paths = [f["path"] for f in facts["files"]]
    conn = sqlite3.connect(paths[0])
    conn.execute("UPDATE thread_rollup SET calls = calls * 1000, wait_lo_blocking = -5")
    conn.commit()
    conn.close()
    out = str(tmp_path / "cluster.db")
    merge(paths, out)
    by_minute = ("SELECT node, ts / 60000000000 AS m, SUM(calls), SUM(coll_ns) FROM {} GROUP BY node, m ORDER BY node, m")
    assert _count(out, by_minute.format("thread_rollup")) == _count(out, by_minute.format("thread_time"))
    assert _count(out, "SELECT COUNT(DISTINCT node), MIN(wait_lo_blocking) >= 0 FROM thread_rollup") == [(2, 1)]
