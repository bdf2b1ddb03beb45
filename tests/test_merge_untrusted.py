"""merge treats node databases as untrusted: a crafted input (a view or virtual table where merge
reads, a trigger, a generated column, malformed meta values or clock values) is refused before
any of its SQL runs, with one line naming the file and what is wrong in it (not the deadline's
line: an endless view that ran would end only at merge's deadline, 30 min by default, far past
the tests' hang guard), no traceback, no output, and the input left byte-identical; a deadline stops a merge that runs too long; an input holding another node than
the host it came from is refused; outputs and fetched copies are mode 0600."""
import hashlib
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from straggler.analysis import merge as merge_mod
from straggler_lab import synth
from straggler.analysis.merge import MergeError, merge
from straggler.text import sql_quote

REPO = Path(__file__).resolve().parent.parent
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)"   # ... FROM c WHERE x < 0: no row, ever
HANG_GUARD_S = 60.0      # a merge subprocess that runs longer is hung (it ran the input's SQL): never a measure


@pytest.fixture(scope="module")
def node_dbs(tmp_path_factory):
    """Two small valid node databases (gpu-node-01, gpu-node-02), as the agent writes them."""
    base = tmp_path_factory.mktemp("nodes")
    facts = synth.write_nodes(str(base), synth.SynthSpec(nodes=2, events=3000, scenario="io_cpu", straggler=1))
    return [f["path"] for f in facts["files"]]


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _craft(src, dest, statements):
    """A copy of node database `src` at `dest` changed by `statements` (writable_schema allowed),
    as a single file (no -wal)."""
    shutil.copy(src, dest)
    conn = sqlite3.connect(dest, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA writable_schema=ON")
        for sql in statements:
            conn.execute(sql)
    finally:
        conn.close()
    assert not os.path.exists(str(dest) + "-wal")
    return str(dest)


def _run_cli(args, timeout=HANG_GUARD_S):
    """`python -m straggler.cli merge ARGS` in a subprocess: a hang fails the test instead of hanging it."""
    try:
        proc = subprocess.run([sys.executable, "-m", "straggler.cli", "merge", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        pytest.fail(f"straggler merge {' '.join(args)} did not finish within {timeout} s (it ran the input's SQL)")
    return proc


def _assert_refused(proc, path, fragment, out_dir):
    """Refused by the check that names what is wrong (fragment), not stopped by the deadline."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and fragment in lines[0], lines[0]
    assert "(--deadline)" not in lines[0], lines[0]
    assert os.listdir(out_dir) == [], "a refusal left output behind"


# ---- objects merge reads must be plain tables; no triggers ----

SCHEMA_CASES = {
    "meta is a view with an endless recursive CTE": (
        ["DROP TABLE meta",
         f"CREATE VIEW meta(key, value) AS {ENDLESS} SELECT 'schema_version', x FROM c WHERE x < 0"],
        "`meta` is a view, not a table"),
    "META (other case) is an endless view": (
        ["DROP TABLE meta",
         f"CREATE VIEW \"META\"(key, value) AS {ENDLESS} SELECT 'node', 'gpu-node-02' FROM c WHERE x < 0"],
        "`meta` is a view, not a table"),
    "events is an endless view": (
        ["DROP TABLE events",
         f"CREATE VIEW events AS {ENDLESS} SELECT x AS seq, 'gpu-node-02' AS node, 'cuda' AS source, "
         f"'cuLaunchKernel' AS op, x AS ts, 0 AS duration FROM c WHERE x < 0"],
        "`events` is a view, not a table"),
    "clock_pairs is a view over a pragma_ table-valued function": (
        ["DROP TABLE clock_pairs",
         "CREATE VIEW clock_pairs AS SELECT 'gpu-node-02' AS node, seq AS mono_ns, seq AS real_ns "
         "FROM pragma_database_list"],
        "`clock_pairs` is a view, not a table"),
    "probes is an fts5 virtual table": (
        ["DROP TABLE probes",
         "CREATE VIRTUAL TABLE probes USING fts5(node, name, library, attached_at)"],
        "`probes` is a virtual table, not a table"),
    "meta is an index": (
        ["DROP TABLE meta", "CREATE INDEX meta ON events(seq)"],
        "`meta` is an index, not a table"),
    "a view shadowing sqlite_master": (
        ["INSERT INTO sqlite_master VALUES ('view', 'sqlite_master', 'sqlite_master', 0, "
         f"'CREATE VIEW sqlite_master(type, name, tbl_name, rootpage, sql) AS {ENDLESS} "
         "SELECT ''table'', ''meta'', ''meta'', 2, ''CREATE TABLE meta(key, value)'' FROM c WHERE x < 0')"],
        "malformed database schema"),
    "a trigger": (
        ["CREATE TRIGGER wipe AFTER INSERT ON meta BEGIN DELETE FROM events; END"],
        "holds trigger 'wipe'"),
    "processes has a generated column": (
        ["DROP TABLE processes",
         "CREATE TABLE processes (node TEXT NOT NULL, pid INTEGER NOT NULL, "
         "cmdline TEXT GENERATED ALWAYS AS (printf('%.*c', 100000000, 'x')) VIRTUAL)",
         "INSERT INTO processes (node, pid) VALUES ('gpu-node-02', 1)"],
        "column 'cmdline' of `processes` is computed by its own SQL"),
}

# ---- every value merge uses is type-checked ----

VALUE_CASES = {
    "NULL meta key": (["INSERT INTO meta (key, value) VALUES (NULL, 'x')"], "meta has a key None"),
    "meta key with a newline": (["INSERT INTO meta (key, value) VALUES ('a\nb', 'x')"], "meta has a key 'a\\nb'"),
    "non-numeric schema_version": (["UPDATE meta SET value = 'two' WHERE key = 'schema_version'"],
                                   "meta key schema_version is 'two'; expected an integer"),
    "schema_version as a blob": (["UPDATE meta SET value = X'32' WHERE key = 'schema_version'"],
                                 "meta key schema_version is b'2'"),
    "schema_version of 5000 digits": ([f"UPDATE meta SET value = '{'9' * 5000}' WHERE key = 'schema_version'"],
                                      "meta key schema_version is"),
    "node name as a JSON list": (["UPDATE meta SET value = '[\"gpu-node-02\"]' WHERE key = 'node'"],
                                 "meta key node is '[\"gpu-node-02\"]'; expected a node name without spaces"),
    "empty node name": (["UPDATE meta SET value = '' WHERE key = 'node'"],
                        "meta key node is ''; expected a non-empty node name"),
    "node name with a newline": (["UPDATE meta SET value = 'gpu-node-02\nstraggler: gpu-node-01' WHERE key = 'node'"],
                                 "expected a node name without control characters"),
    "NULL node name": (["UPDATE meta SET value = NULL WHERE key = 'node'"], "meta key node is None"),
    "node name as a blob": (["UPDATE meta SET value = X'41' WHERE key = 'node'"],
                            "meta key node is b'A'; expected a node name (text)"),
    "nodes as a JSON object": (["INSERT INTO meta (key, value) VALUES ('nodes', '{\"gpu-node-02\": 1}')"],
                               "meta key nodes is '{\"gpu-node-02\": 1}'; expected a JSON list of node names"),
    "nodes holding a list": (["INSERT INTO meta (key, value) VALUES ('nodes', '[[\"gpu-node-02\"]]')"],
                             "a name in meta key nodes is ['gpu-node-02']"),
    "nodes nested 100000 deep": ([f"INSERT INTO meta (key, value) VALUES ('nodes', '{'[' * 100000}')"],
                                 "meta key nodes is '[[[["),
    "a meta key twice": (["CREATE TABLE meta2 (key TEXT, value TEXT)", "INSERT INTO meta2 SELECT * FROM meta",
                          "INSERT INTO meta2 VALUES ('schema_version', '1')", "DROP TABLE meta",
                          "ALTER TABLE meta2 RENAME TO meta"], "meta key 'schema_version' appears twice"),
    "node with a newline in processes": (["UPDATE processes SET node = 'x\ny' WHERE rowid = (SELECT MIN(rowid) FROM processes)"],
                                         "processes holds a row of node 'x\\ny', but the input is node gpu-node-02"),
    "no node in meta": (["DELETE FROM meta WHERE key = 'node'"], "says no node (meta has neither node nor nodes)"),
    "meta node and nodes disagree": (["INSERT INTO meta (key, value) VALUES ('nodes', '[\"gpu-node-03\"]')"],
                                     "meta key node is gpu-node-02 but meta key nodes is ['gpu-node-03']"),
    "nodes naming a node twice": (["DELETE FROM meta WHERE key = 'node'",
                                   "INSERT INTO meta (key, value) VALUES ('nodes', '[\"gpu-node-02\", \"gpu-node-02\"]')"],
                                  "meta key nodes names gpu-node-02 twice"),
    "meta keys of another node": (["INSERT INTO meta (key, value) VALUES ('node.gpu-node-01.agent_version', 'forged')"],
                                  "meta key 'node.gpu-node-01.agent_version' describes a node the input does not hold "
                                  "(it is node gpu-node-02)"),
    "clock pair as text": (["UPDATE clock_pairs SET mono_ns = 'soon' WHERE rowid = (SELECT MIN(rowid) FROM clock_pairs)"],
                           "clock_pairs of node gpu-node-02 holds ('soon',"),
    "clock offset as text": (["INSERT INTO clock_offsets VALUES ('gpu-node-02', 'late', 1, 1, 'https')"],
                             "clock_offsets of node gpu-node-02 holds ('late', 1, 1)"),
}

CASES = dict(SCHEMA_CASES, **VALUE_CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_crafted_input_is_refused_before_its_sql_runs_in_one_line(node_dbs, tmp_path, case):
    statements, fragment = CASES[case]
    crafted = _craft(node_dbs[1], tmp_path / "gpu-node-02.db", statements)
    good_before, crafted_before = _sha(node_dbs[0]), _sha(crafted)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _run_cli([node_dbs[0], crafted, "-o", str(out_dir / "cluster.db")])
    _assert_refused(proc, crafted, fragment, out_dir)
    assert (_sha(node_dbs[0]), _sha(crafted)) == (good_before, crafted_before), "merge changed an input"


def test_the_deadline_stops_a_merge_that_runs_the_inputs_sql(node_dbs, tmp_path):
    """The deadline is the backstop: with the schema check switched off, the endless view runs
    and the progress handler stops it after the deadline, with one line and no output."""
    crafted = _craft(node_dbs[1], tmp_path / "gpu-node-02.db", SCHEMA_CASES["meta is a view with an endless recursive CTE"][0])
    out = tmp_path / "out" / "cluster.db"
    out.parent.mkdir()
    script = textwrap.dedent(f"""
        import sys
        from straggler.analysis import merge as m
        m.vetting.vet_schema = lambda conn, path, schema_name="main": set(m.READ_OBJECTS)   # the check switched off
        try:
            m.merge([{node_dbs[0]!r}, {crafted!r}], {str(out)!r}, deadline_s=0.5)
        except m.MergeError as exc:
            print(exc)
            sys.exit(2)
        """)
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        pytest.fail("the deadline did not stop a merge running an endless view")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.strip() == (f"merge stopped after 0.5 s (--deadline): still checking {crafted}; nothing was "
                                   f"written (raise --deadline for inputs this large)")
    assert os.listdir(out.parent) == []


def test_a_tiny_deadline_stops_a_normal_merge_in_one_line(node_dbs, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _run_cli([*node_dbs, "-o", str(out_dir / "cluster.db"), "--deadline", "0.000001"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "merge stopped after 1e-06 s (--deadline)" in lines[0]
    assert os.listdir(out_dir) == []


def test_the_progress_handler_alone_stops_a_running_statement(node_dbs, tmp_path, monkeypatch):
    """No check between steps: the deadline passes while SQLite copies rows, and the progress
    handler aborts the statement."""
    monkeypatch.setattr(merge_mod.Deadline, "check", lambda self: None)
    monkeypatch.setattr(merge_mod.deadline, "PROGRESS_OPS", 100)
    out = tmp_path / "cluster.db"
    with pytest.raises(MergeError, match=r"^merge stopped after 1e-06 s \(--deadline\): still checking ") as err:
        merge(node_dbs, str(out), deadline_s=1e-6)
    assert "\n" not in str(err.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("deadline", [0, -1, float("nan"), "10"])
def test_a_deadline_must_be_a_positive_number(node_dbs, tmp_path, deadline):
    with pytest.raises(MergeError, match="expected a positive number of seconds"):
        merge(node_dbs, str(tmp_path / "c.db"), deadline_s=deadline)


# ---- the node an input holds is the host it was collected from ----

def test_an_input_holding_another_node_than_expected_is_refused(node_dbs, tmp_path):
    out = tmp_path / "out" / "cluster.db"
    out.parent.mkdir()
    # gpu-node-02's store fetched as if from host gpu-node-03
    with pytest.raises(MergeError) as err:
        merge(node_dbs, str(out), expected_nodes={node_dbs[1]: "gpu-node-03"})
    assert str(err.value) == (f"{node_dbs[1]}: holds node gpu-node-02, expected gpu-node-03 (the host it was "
                              f"collected from); refusing it")
    assert os.listdir(out.parent) == []
    summary = merge(node_dbs, str(out), expected_nodes={node_dbs[0]: "gpu-node-01", node_dbs[1]: "gpu-node-02"})
    assert summary["nodes"] == ["gpu-node-01", "gpu-node-02"]


def test_cli_expect_refuses_in_one_line(node_dbs, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _run_cli([*node_dbs, "-o", str(out_dir / "c.db"), "--expect", f"{node_dbs[0]}=gpu-node-01",
                              "--expect", f"{node_dbs[1]}=gpu-node-03"])
    _assert_refused(proc, node_dbs[1], "holds node gpu-node-02, expected gpu-node-03", out_dir)
    proc = _run_cli([node_dbs[0], "-o", str(out_dir / "c.db"), "--expect", f"{node_dbs[1]}=gpu-node-02"])
    _assert_refused(proc, node_dbs[1], "not one of the inputs", out_dir)
    proc = _run_cli([node_dbs[0], "-o", str(out_dir / "c.db"), "--expect", f"{node_dbs[0]}=a\tb"])
    _assert_refused(proc, node_dbs[0], "expected a node name without control characters", out_dir)


def test_the_merge_action_expects_each_collected_hosts_node():
    pytest.importorskip("ansible")
    sys.path.insert(0, str(REPO / "collections"))
    try:
        from ansible_collections.straggler.fleet.plugins.action.merge import expected_nodes_of
    finally:
        sys.path.remove(str(REPO / "collections"))
    task_vars = dict(hostvars={"gpu-node-01": {}, "gpu-node-02": {"straggler_agent_node": "trainer-2"}})
    inputs = ["/c/gpu-node-01.db", "/c/gpu-node-02.db", "/c/other.db"]
    assert expected_nodes_of(task_vars, inputs, ["gpu-node-01", "gpu-node-02"], {"/c/other.db": "n9"}) == {
        "/c/gpu-node-01.db": "gpu-node-01", "/c/gpu-node-02.db": "trainer-2", "/c/other.db": "n9"}
    assert expected_nodes_of(task_vars, inputs, None) == {}


# ---- every row of every node table is of the node the input says it is ----

OWN, OTHER = "gpu-node-02", "gpu-node-01"      # the crafted input's node, and the other input's


def _forge_a_middle_row(path, table, node):
    """One row of `table` in the middle of it (neither its first nor its last row) made a row of
    `node`; a table with fewer than three rows gets three: its own node's, `node`'s, its own's."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        count = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        if count >= 3:
            conn.execute(f"UPDATE {table} SET node = ? WHERE rowid = (SELECT rowid FROM {table} ORDER BY rowid "
                         f"LIMIT 1 OFFSET ?)", (node, count // 2))
            return
        columns = [(r[1], (r[2] or "").upper()) for r in conn.execute(f"PRAGMA table_info({table})")]
        for n, who in enumerate((OWN, node, OWN)):
            values = [who if name == "node" else 90_000_000 + n if "INT" in kind else 1.5 if "REAL" in kind
                      else f"forged-{n}" for name, kind in columns]
            conn.execute(f"INSERT INTO {table} ({', '.join(c for c, _ in columns)}) "
                         f"VALUES ({', '.join('?' * len(columns))})", values)
    finally:
        conn.close()


@pytest.mark.parametrize("table", merge_mod.NODE_TABLES)
def test_a_row_of_another_node_anywhere_in_any_table_is_refused(node_dbs, tmp_path, table):
    """`merge --expect gpu-node-02.db=gpu-node-02` of an input that says it is gpu-node-02 and carries
    one row of gpu-node-01 in the middle of a table: refused in one line naming the table, nothing
    written, the input unchanged (before, only the first and last event and five small tables were
    looked at: thread_time, clock_offsets, aggregates and the device tables not at all)."""
    crafted = str(tmp_path / f"{OWN}.db")
    shutil.copy(node_dbs[1], crafted)
    _forge_a_middle_row(crafted, table, OTHER)
    before = _sha(crafted)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _run_cli([node_dbs[0], crafted, "-o", str(out_dir / "cluster.db"), "--expect", f"{crafted}={OWN}"])
    _assert_refused(proc, crafted, f"{table} holds a row of node '{OTHER}', but the input is node {OWN} "
                                            f"(its meta); refusing a forged or mixed input", out_dir)
    assert _sha(crafted) == before


def test_a_forged_row_is_refused_whatever_collation_the_input_declares(node_dbs, tmp_path):
    """A node column declared COLLATE NOCASE would make 'GPU-NODE-02' equal 'gpu-node-02': names are
    compared byte for byte."""
    crafted = str(tmp_path / f"{OWN}.db")
    shutil.copy(node_dbs[1], crafted)
    _forge_a_middle_row(crafted, "thread_time", OWN.upper())
    conn = sqlite3.connect(crafted)
    ddl = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'thread_time'").fetchone()[0]
    conn.close()
    nocase = re.sub(r"node\s+TEXT\s+NOT NULL", "node TEXT NOT NULL COLLATE NOCASE", ddl, count=1)
    assert nocase != ddl
    _craft(crafted, crafted + ".nocase", [f"UPDATE sqlite_master SET sql = {sql_quote(nocase)} WHERE name = 'thread_time'"])
    out = tmp_path / "out" / "cluster.db"
    out.parent.mkdir()
    with pytest.raises(MergeError, match=re.escape(f"thread_time holds a row of node '{OWN.upper()}', but the input "
                                                   f"is node {OWN}")):
        merge([node_dbs[0], crafted + ".nocase"], str(out))
    assert os.listdir(out.parent) == []


def test_a_merged_input_holds_only_the_nodes_it_names(node_dbs, tmp_path):
    """A merged database says which nodes it holds (meta nodes): merged again it keeps them, and a
    row of a node it does not name is refused."""
    half = str(tmp_path / "half.db")
    merge(node_dbs, half)
    out = tmp_path / "out" / "cluster.db"
    out.parent.mkdir()
    assert merge([half], str(out))["nodes"] == [OTHER, OWN]
    os.unlink(out)
    _forge_a_middle_row(half, "events", "gpu-node-07")
    with pytest.raises(MergeError, match=r"events holds a row of node 'gpu-node-07', but the input is nodes "
                                         r"gpu-node-01, gpu-node-02"):
        merge([half], str(out))
    assert os.listdir(out.parent) == []


# ---- clock alignment runs under the deadline ----

SLOW_CLOCK_WORK = {
    # each pair slow to read (20 s in all): SQLite's progress handler stops the fetching
    "reading the pairs": """
        fast = clock.as_int_ns
        def slow(value):
            time.sleep(0.001)          # the first input's few pairs: well within the deadline
            return fast(value)
        m.vetting.clock.as_int_ns = slow
        """,
    # the segments slow to compute (pure Python, which the progress handler does not see): the
    # deadline is checked right after, before any row is copied
    "computing the segments": """
        fast = clock.clock_segments
        def slow(pairs):
            if len(pairs) > 1000:      # the crafted input's node only
                time.sleep(2.0)
            return fast(pairs)
        m.copy.clock.clock_segments = slow
        """,
}


@pytest.mark.parametrize("slow", list(SLOW_CLOCK_WORK))
def test_the_deadline_stops_the_clock_alignment_in_one_line(node_dbs, tmp_path, slow):
    """A node's clock pairs (one every 5 s for days) are read and turned into segments in Python:
    past the deadline the merge stops there, in one line, writing nothing."""
    crafted = str(tmp_path / f"{OWN}.db")
    shutil.copy(node_dbs[1], crafted)
    conn = sqlite3.connect(crafted)
    conn.execute("DELETE FROM clock_pairs")
    conn.executemany("INSERT INTO clock_pairs (node, mono_ns, real_ns) VALUES (?, ?, ?)",
                     [(OWN, k * 5_000_000_000, 1_767_225_600_000_000_000 + k * 5_000_000_000) for k in range(20_000)])
    conn.commit()
    conn.close()
    out = tmp_path / "out" / "cluster.db"
    out.parent.mkdir()
    script = "import sys, time\nfrom straggler import clock\nfrom straggler.analysis import merge as m\n" + \
        textwrap.dedent(SLOW_CLOCK_WORK[slow]) + textwrap.dedent(f"""
        try:
            m.merge([{node_dbs[0]!r}, {crafted!r}], {str(out)!r}, deadline_s=1.0)
        except m.MergeError as exc:
            print(exc)
            sys.exit(2)
        """)
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=15, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        pytest.fail("the deadline did not stop the clock alignment")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.strip() == (f"merge stopped after 1 s (--deadline): still aligning the clocks of {crafted}; "
                                   f"nothing was written (raise --deadline for inputs this large)")
    assert os.listdir(out.parent) == []


# ---- modes ----

def test_the_output_is_mode_0600_whatever_the_umask_and_the_old_file(node_dbs, tmp_path):
    out = tmp_path / "cluster.db"
    out.write_bytes(b"")
    os.chmod(out, 0o644)
    old_umask = os.umask(0)
    try:
        merge(node_dbs, str(out))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


def test_a_fetched_node_store_is_mode_0600(tmp_path):
    pytest.importorskip("ansible")
    sys.path.insert(0, str(REPO / "collections"))
    try:
        from ansible_collections.straggler.fleet.plugins.action.collect import install_fetched, sha256_of
    finally:
        sys.path.remove(str(REPO / "collections"))
    fetched, final = tmp_path / ".gpu-node-01.db.x", tmp_path / "gpu-node-01.db"
    fetched.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    os.chmod(fetched, 0o644)
    assert install_fetched(str(fetched), str(final), sha256_of(str(fetched))) is True
    assert stat.S_IMODE(os.stat(final).st_mode) == 0o600
