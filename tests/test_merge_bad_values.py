"""Bad values are bad input. A value of the wrong type anywhere in a node's store (a text timestamp,
which stopped merge with a ValueError; a text duration, which passed merge and stopped export with a
TypeError; a blob where text belongs, JSON that is not, a fraction or a number past 64 bits in an
integer column, a NULL where the schema says NOT NULL) refuses the merge in one line naming the
input, the table, the column, the node, the row and the value: no traceback, no output, an existing
output left as it was, the inputs unchanged. A merged database changed afterwards (or written by an
older merge) that stops export does so in one line naming the same, from the CLI and from the
Ansible actions; a failure that is no bad value keeps its traceback.

And merge's roll-up (thread_rollup, rebuilt from the rows copied) costs O(rows), dense or sparse:
the same roll-ups as the former one statement per ten-minute window, in a number of statements that
follows the rows, not the time they span (60k summaries ten minutes apart took 23 s, the same rows
dense 1 s)."""
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from straggler.analysis import export as export_mod
from straggler.analysis.export import ExportError, export_perfetto
from straggler.analysis.merge import MergeError, merge
from straggler.store import rollup, schema
from straggler_lab import synth

REPO = Path(__file__).resolve().parent.parent
HANG_GUARD_S = 120.0
OWN, OTHER = "gpu-node-02", "gpu-node-01"


@pytest.fixture(scope="module")
def node_dbs(tmp_path_factory):
    """Two small valid node stores (gpu-node-01, gpu-node-02), as the agent writes them."""
    base = tmp_path_factory.mktemp("nodes")
    facts = synth.write_nodes(str(base), synth.SynthSpec(nodes=2, events=3000, scenario="io_cpu", straggler=1))
    return [f["path"] for f in facts["files"]]


@pytest.fixture(scope="module")
def cluster(node_dbs, tmp_path_factory):
    """Their sound merge."""
    path = str(tmp_path_factory.mktemp("cluster") / "cluster.db")
    merge(node_dbs, path)
    return path


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _spoil(src, dest, table, column, value_sql, where="1", schema_edit=None):
    """A copy of `src` at `dest` (one file, no -wal) with `column` of one of gpu-node-02's `table` rows
    (the middle one of those matching `where`) set to the SQL `value_sql`; schema_edit: (old, new) text
    replaced in the table's declaration first. Returns (dest, the row's rowid)."""
    shutil.copy(src, dest)
    conn = sqlite3.connect(dest, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        if schema_edit:
            ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
            edited = re.sub(schema_edit[0], schema_edit[1], ddl, count=1)
            assert edited != ddl
            conn.execute("PRAGMA writable_schema=ON")
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (edited, table))
            conn.execute("PRAGMA writable_schema=OFF")
        conn.close()
        conn = sqlite3.connect(dest, isolation_level=None)      # the edited schema, read afresh
        rowids = [r[0] for r in conn.execute(f"SELECT rowid FROM {table} WHERE node = ? AND ({where}) ORDER BY rowid",
                                             (OWN,))]
        assert rowids, f"no {table} row of {OWN} to spoil"
        rowid = rowids[len(rowids) // 2]
        conn.execute(f"UPDATE {table} SET {column} = {value_sql} WHERE rowid = ?", (rowid,))
    finally:
        conn.close()
    assert not os.path.exists(str(dest) + "-wal")
    return str(dest), rowid


def _cli(command, args):
    """`python -m straggler.cli COMMAND ARGS` in a subprocess (what a user runs)."""
    try:
        return subprocess.run([sys.executable, "-m", "straggler.cli", command, *args], capture_output=True, text=True,
                              timeout=HANG_GUARD_S, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        pytest.fail(f"straggler {command} {' '.join(args)} did not finish within {HANG_GUARD_S} s")


def _one_line_refusal(proc):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ---- merge refuses an input with a bad value ----

# case: (table, column, value as SQL, where among its rows, the value as the line shows it, expected)
MERGE_CASES = {
    "a text timestamp in thread_time (was: ValueError)": ("thread_time", "ts", "'abc'", "1", "'abc'", "an integer"),
    "a text duration in events (was: TypeError in export)": ("events", "duration", "'slow'",
                                                              "source IN ('cuda', 'driver', 'nccl')", "'slow'",
                                                              "an integer"),
    "a text timestamp in events": ("events", "ts", "'soon'", "1", "'soon'", "an integer"),
    "a fraction in an integer column": ("aggregates", "count", "2.5", "1", "2.5", "an integer"),
    "a number past 64 bits": ("thread_time", "work_ns", "1e30", "1", "1e+30", "an integer"),
    "a blob in an integer column": ("processes", "pid", "x'2a'", "1", "b'*'", "an integer"),
    "a blob where text belongs": ("processes", "cmdline", "x'00ff'", "1", "b'\\x00\\xff'", "text or NULL"),
    "text where a number belongs": ("agent_cost", "cpu_seconds", "'lots'", "1", "'lots'", "a number"),
    "thread_time.thieves that is not JSON": ("thread_time", "thieves", "'[[\"process\", 5151'", "1",
                                             "'[[\"process\", 5151'", "JSON text or NULL"),
    "events.detail that is not JSON": ("events", "detail", "'{\"in_call\": '", "1", "'{\"in_call\": '",
                                       "JSON text or NULL"),
    "a text rank": ("thread_time", "rank", "'one'", "1", "'one'", "an integer or NULL"),
}


@pytest.mark.parametrize("case", list(MERGE_CASES))
def test_merge_refuses_a_bad_value_in_one_line_naming_it(node_dbs, tmp_path, case):
    table, column, value_sql, where, shown, expected = MERGE_CASES[case]
    crafted, rowid = _spoil(node_dbs[1], tmp_path / f"{OWN}.db", table, column, value_sql, where)
    before = (_sha(node_dbs[0]), _sha(crafted))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    line = _one_line_refusal(_cli("merge", [node_dbs[0], crafted, "-o", str(out_dir / "cluster.db")]))
    assert f"{crafted}: {table}.{column} of node {OWN} holds {shown} (row {rowid}); expected {expected}" in line, line
    assert os.listdir(out_dir) == [], "a refused merge left output behind"
    assert (_sha(node_dbs[0]), _sha(crafted)) == before, "merge changed an input"


def test_a_null_where_the_schema_says_not_null_is_refused(node_dbs, tmp_path):
    """An input whose events declare op without NOT NULL, and one row without an op."""
    crafted, rowid = _spoil(node_dbs[1], tmp_path / f"{OWN}.db", "events", "op", "NULL",
                            schema_edit=(r"op\s+TEXT\s+NOT NULL", "op TEXT"))
    with pytest.raises(MergeError) as err:
        merge([node_dbs[0], crafted], str(tmp_path / "cluster.db"))
    assert str(err.value) == (f"{crafted}: events.op of node {OWN} holds None (row {rowid}); expected text; refusing "
                              f"an input with bad values (take a fresh copy with `straggler snapshot`)")
    assert sorted(os.listdir(tmp_path)) == [f"{OWN}.db"]


def test_a_refused_merge_leaves_the_existing_output_as_it_was(node_dbs, tmp_path):
    out = tmp_path / "cluster.db"
    merge(node_dbs, str(out))
    before = _sha(out)
    (tmp_path / "spoiled").mkdir()
    crafted, _ = _spoil(node_dbs[1], tmp_path / "spoiled" / f"{OWN}.db", "events", "duration", "'slow'")
    with pytest.raises(MergeError, match=r"events\.duration of node gpu-node-02 holds 'slow'"):
        merge([node_dbs[0], crafted], str(out))
    assert _sha(out) == before
    assert sorted(os.listdir(tmp_path)) == ["cluster.db", "spoiled"], "a temporary file was left behind"


def test_what_an_integer_column_stores_as_an_integer_is_taken(node_dbs, tmp_path):
    """Numeric text and a whole real in an input column declared without a type (SQLite keeps them
    as they are) are what the cluster's INTEGER column stores as integers: merged, not refused."""
    crafted, text_row = _spoil(node_dbs[1], tmp_path / f"{OWN}.db", "thread_time", "work_ns", "'123'",
                               schema_edit=(r"work_ns\s+INTEGER", "work_ns"))
    conn = sqlite3.connect(crafted)
    real_row = conn.execute("SELECT MAX(rowid) FROM thread_time WHERE node = ?", (OWN,)).fetchone()[0]
    conn.execute("UPDATE thread_time SET work_ns = 456.0 WHERE rowid = ?", (real_row,))
    conn.commit()
    assert conn.execute("SELECT typeof(work_ns) FROM thread_time WHERE rowid IN (?, ?) ORDER BY rowid",
                        (text_row, real_row)).fetchall() == [("text",), ("real",)]
    conn.close()
    out = tmp_path / "cluster.db"
    merge([node_dbs[0], crafted], str(out))
    conn = sqlite3.connect(out)
    got = conn.execute("SELECT work_ns, typeof(work_ns) FROM thread_time WHERE node = ? AND work_ns IN (123, 456) "
                       "ORDER BY work_ns", (OWN,)).fetchall()
    conn.close()
    assert got == [(123, "integer"), (456, "integer")]


# ---- export of a merged database with a bad value: one line, not a traceback ----

EXPORT_CASES = {
    # was: TypeError: '>' not supported between instances of 'str' and 'int'
    "a text duration": ("events", "duration", "'slow'", "source IN ('cuda', 'driver', 'nccl')", "'slow'",
                        "an integer"),
    # was: TypeError: can only concatenate str (not "int") to str
    "a text ts_aligned": ("events", "ts_aligned", "'late'", "source IN ('cuda', 'driver', 'nccl')", "'late'",
                          "an integer or NULL"),
}


@pytest.mark.parametrize("how", [["--format", "json"], ["--format", "perfetto", "--jobs", "1"],
                                 ["--format", "perfetto", "--jobs", "2"]], ids=["json", "pftrace", "pftrace-2-jobs"])
@pytest.mark.parametrize("case", list(EXPORT_CASES))
def test_export_of_a_bad_value_fails_in_one_line_naming_it(cluster, tmp_path, case, how):
    if "perfetto" in how:
        pytest.importorskip("perfetto")
    table, column, value_sql, where, shown, expected = EXPORT_CASES[case]
    db, rowid = _spoil(cluster, tmp_path / "cluster.db", table, column, value_sql, where)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "trace.out"
    line = _one_line_refusal(_cli("export", ["-d", db, "-o", str(out), *how]))
    assert f"{db}: {table}.{column} of node {OWN} holds {shown} (row {rowid}); expected {expected}" in line, line
    assert os.listdir(out_dir) == [], "a failed export left output behind"
    out.write_bytes(b"the previous trace")
    _one_line_refusal(_cli("export", ["-d", db, "-o", str(out), *how]))
    assert out.read_bytes() == b"the previous trace" and os.listdir(out_dir) == ["trace.out"]


def test_a_failure_that_is_no_bad_value_keeps_its_traceback(cluster, tmp_path, monkeypatch):
    """Looking for a bad value must not hide a bug: on a sound database the original error stands."""
    def broken(*args, **kwargs):
        raise TypeError("a bug")
    monkeypatch.setattr(export_mod, "write", broken)
    with pytest.raises(TypeError, match="a bug"):
        export_perfetto(cluster, str(tmp_path / "t.json"), findings=False)
    assert os.listdir(tmp_path) == []


# ---- the Ansible actions fail the task with the line ----

def _action(module, args):
    sys.path.insert(0, str(REPO / "collections"))
    try:
        pytest.importorskip("ansible")
        action = __import__(f"ansible_collections.straggler.fleet.plugins.action.{module}", fromlist=["ActionModule"])
        from ansible.errors import AnsibleActionFail
    finally:
        sys.path.remove(str(REPO / "collections"))
    task = mock.MagicMock()
    task.args, task.check_mode, task.diff, task.async_val = dict(args), False, False, 0
    task.action = f"straggler.fleet.{module}"
    connection = mock.MagicMock()
    connection._shell.tmpdir, connection.become = None, False
    return action.ActionModule(task, connection, mock.MagicMock(), loader=None, templar=None,
                               shared_loader_obj=None), AnsibleActionFail


def test_the_export_action_fails_the_task_naming_the_bad_value(cluster, tmp_path):
    db, rowid = _spoil(cluster, tmp_path / "cluster.db", "events", "duration", "'slow'",
                       "source IN ('cuda', 'driver', 'nccl')")
    action, fail = _action("export", dict(db=db, dest=str(tmp_path / "out" / "trace.json")))
    with pytest.raises(fail) as err:
        action.run(task_vars={})
    assert f"export failed: {db}: events.duration of node {OWN} holds 'slow' (row {rowid})" in str(err.value)
    assert os.listdir(tmp_path / "out") == []


def test_the_merge_action_fails_the_task_naming_the_bad_value(node_dbs, tmp_path):
    crafted, rowid = _spoil(node_dbs[1], tmp_path / f"{OWN}.db", "thread_time", "ts", "'abc'")
    dest = tmp_path / "out" / "cluster.db"
    action, fail = _action("merge", dict(src=[node_dbs[0], crafted], dest=str(dest)))
    with pytest.raises(fail) as err:
        action.run(task_vars={})
    assert f"merge failed: {crafted}: thread_time.ts of node {OWN} holds 'abc' (row {rowid})" in str(err.value)
    assert not dest.exists() and os.listdir(dest.parent) == []


# ---- the roll-up: O(rows), dense or sparse, the same roll-ups ----

MIN_NS = rollup.ROLLUP_NS
COLUMNS = ("node, ts, interval_ns, pid, tid, rank, comm, calls, work_ns, sync_ns, coll_ns, runq_ns, runq_work_ns, "
           "runq_sync_ns, runq_coll_ns, blocked_ns, io_ns, thieves")


def _summary(node, ts, tid, k):
    """One thread_time row (1-s summary) with values that differ from row to row."""
    return (node, ts, 1_000_000_000, 4242, tid, tid - 4242, f"t{tid}", 10 + k % 7, 500_000 + k * 13 % 9000,
            100_000 + k % 5000, 200_000 + k * 7 % 30000, 1000 + k % 300, k % 200, k % 100, k % 50, 3000 + k % 400,
            k % 11, None)


def _store(path, rows, node="n1"):
    conn = sqlite3.connect(path)
    schema.create(conn, node=node)
    conn.executemany(f"INSERT INTO thread_time ({COLUMNS}) VALUES ({', '.join('?' * 18)})", rows)
    conn.commit()
    conn.close()
    return str(path)


def _sparse_and_dense_rows(node="n1"):
    """A day of one summary every ten minutes (sparse, each alone in its window), a stretch of 4
    threads every second for 25 min (dense: windows fuller than a small batch), and a summary weeks
    later (the empty time between)."""
    rows, k = [], 0
    for i in range(144):
        rows.append(_summary(node, 7 * MIN_NS + i * 10 * MIN_NS + (i % 3) * 1_000_000_000, 4242 + i % 2, k))
        k += 1
    start = 144 * 10 * MIN_NS + 30 * MIN_NS
    for s in range(25 * 60):
        for t in range(4):
            rows.append(_summary(node, start + s * 1_000_000_000, 4242 + t, k))
            k += 1
    rows.append(_summary(node, 40 * 24 * 60 * MIN_NS + 5, 4242, k))
    return rows


def _per_window_rollup(conn):
    """The former rebuild: one INSERT … SELECT per ten-minute window of the clock that holds a row."""
    conn.execute("DELETE FROM thread_rollup")
    at = conn.execute("SELECT MIN(ts) FROM thread_time").fetchone()[0]
    while at is not None:
        start = int(at) // rollup.REBUILD_NS * rollup.REBUILD_NS
        conn.execute(rollup.roll_sql(f"ts >= {start} AND ts < {start + rollup.REBUILD_NS}"))
        at = conn.execute("SELECT MIN(ts) FROM thread_time WHERE ts >= ?", (start + rollup.REBUILD_NS,)).fetchone()[0]


def _rollups(conn):
    return conn.execute("SELECT * FROM thread_rollup ORDER BY rowid").fetchall()


@pytest.mark.parametrize("batch_rows", [7, 500, rollup.BATCH_ROWS])
def test_merges_rollup_of_a_sparse_store_is_the_per_window_one(tmp_path, monkeypatch, batch_rows):
    """Merged with stretches of 7 rows (each window alone, dense windows beyond a stretch), 500 and
    the default (the whole store at once): row for row (rowid order too) what one statement per
    window made, and its sums, counts and ends those of the summaries of each minute, counted here."""
    monkeypatch.setattr(rollup, "BATCH_ROWS", batch_rows)
    rows = _sparse_and_dense_rows()
    src = _store(tmp_path / "n1.db", rows)
    out = tmp_path / "cluster.db"
    merge([src], str(out))
    conn = sqlite3.connect(out)
    got = _rollups(conn)
    conn.execute("BEGIN")
    _per_window_rollup(conn)
    reference = _rollups(conn)
    conn.execute("ROLLBACK")
    conn.close()
    assert len(got) == len(reference) > 144 and got == reference
    minutes = {}
    for r in rows:
        m = minutes.setdefault((r[0], r[3], r[4], r[1] // MIN_NS * MIN_NS), dict(calls=0, n=0, first=None, last=None))
        m["calls"] += r[7]
        m["n"] += 1
        m["first"] = r[1] if m["first"] is None else min(m["first"], r[1])
        m["last"] = max(m["last"] or 0, r[1] + r[2])
    conn = sqlite3.connect(out)
    counted = {(n, p, t, ts): dict(calls=c, n=s, first=f, last=l) for n, p, t, ts, c, s, f, l in conn.execute(
        "SELECT node, pid, tid, ts, calls, summaries, first_ts, last_ts FROM thread_rollup")}
    conn.close()
    assert counted == minutes


def _statements_of_rebuild(path):
    conn = sqlite3.connect(path, isolation_level=None)
    statements = []
    conn.execute("BEGIN")
    conn.set_trace_callback(statements.append)
    rollup.rebuild(conn)
    conn.set_trace_callback(None)
    n = conn.execute("SELECT COUNT(*) FROM thread_rollup").fetchone()[0]
    conn.execute("ROLLBACK")
    conn.close()
    return len(statements), n


def test_rebuild_takes_as_many_statements_sparse_as_dense(tmp_path, monkeypatch):
    """6,000 summaries ten minutes apart (6,000 windows, 12,000 statements before) and the same rows
    dense: a handful of statements each, at the default stretch; with stretches of 1,000 rows, a few
    per stretch either way (statements follow the rows, not the time they span)."""
    n = 6000
    sparse = _store(tmp_path / "sparse.db", [_summary("n1", k * 10 * MIN_NS, 4242, k) for k in range(n)])
    dense = _store(tmp_path / "dense.db", [_summary("n1", k * 1_000_000_000 // 4, 4242 + k % 4, k) for k in range(n)])
    s_count, s_rolled = _statements_of_rebuild(sparse)
    d_count, d_rolled = _statements_of_rebuild(dense)
    assert s_rolled == n and 0 < d_rolled < n
    assert s_count <= 5 and d_count <= 5, (s_count, d_count)
    monkeypatch.setattr(rollup, "BATCH_ROWS", 1000)
    s_count, _ = _statements_of_rebuild(sparse)
    d_count, _ = _statements_of_rebuild(dense)
    assert s_count <= 3 * (n // 1000 + 1) + 2 and d_count <= 3 * (n // 1000 + 1) + 2, (s_count, d_count)
