"""The read-only query guard (store/query.py), `straggler query`, and `straggler snapshot`.

What a user would notice: SQL that writes, attaches, changes a setting, smuggles a second
statement or never ends is refused or stopped, with a reason, and the database is unchanged;
reads work, including views, table-valued functions and read-only PRAGMAs."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from test_api_helpers import REPO, db_fingerprint, make_node_db, venv_env

from straggler.store.query import (DatabaseUnavailable, QueryError, QueryRejected, QueryTimeout,
                                   run_query)
from straggler.store.snapshot import snapshot

STRAGGLER = [sys.executable, "-m", "straggler.cli"]


@pytest.fixture(scope="module")
def node_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("guard") / "node.db"
    make_node_db(path, "gpu-node-01", 1)
    return path


REFUSED = [
    ("insert", "INSERT INTO events(seq, node, source, op, ts) VALUES (999, 'x', 'cuda', 'op', 1)"),
    ("update", "UPDATE events SET duration = 0"),
    ("delete", "DELETE FROM events"),
    ("drop", "DROP TABLE events"),
    ("create", "CREATE TABLE stolen(x)"),
    ("create temp", "CREATE TEMP TABLE scratch AS SELECT * FROM events"),
    ("alter", "ALTER TABLE events ADD COLUMN z"),
    ("attach", "ATTACH DATABASE '{tmp}/attached.db' AS other"),
    ("vacuum into", "VACUUM INTO '{tmp}/vacuum.db'"),
    ("writing pragma user_version", "PRAGMA user_version = 7"),
    ("writing pragma journal_mode", "PRAGMA journal_mode = DELETE"),
    ("writing pragma query_only off", "PRAGMA query_only = 0"),
    ("writing pragma writable_schema", "PRAGMA writable_schema = 1"),
    ("two statements", "SELECT 1; DELETE FROM events"),
    ("two statements, no space", "SELECT count(*) FROM events;INSERT INTO meta VALUES ('a', 'b')"),
    ("transaction", "BEGIN IMMEDIATE"),
    ("schema write", "UPDATE sqlite_master SET sql = 'x'"),
    ("cte then write", "WITH x AS (SELECT 1) DELETE FROM events"),
    ("load_extension", "SELECT load_extension('/tmp/evil.so')"),
    ("reindex", "REINDEX"),
    ("analyze", "ANALYZE"),
    ("empty", "   "),
]


@pytest.mark.parametrize("label,sql", REFUSED, ids=[r[0] for r in REFUSED])
def test_sql_that_writes_or_escapes_is_refused_and_the_database_is_unchanged(node_db, tmp_path, label, sql):
    before = db_fingerprint(node_db)
    with pytest.raises(QueryRejected) as caught:
        run_query(str(node_db), sql.replace("{tmp}", str(tmp_path)), timeout_s=5)
    message = str(caught.value)
    assert message and "\n" not in message, "a one-line reason"
    assert db_fingerprint(node_db) == before
    assert os.listdir(tmp_path) == [], "no file was created by ATTACH / VACUUM INTO"


def test_a_query_that_runs_forever_is_stopped_at_its_time_limit(node_db):
    before = db_fingerprint(node_db)
    outcome = []

    def endless():   # in a thread: if the limit failed, the test must fail, not hang
        try:
            run_query(str(node_db), "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                                    "SELECT count(*) FROM c", timeout_s=0.5)
            outcome.append("finished")
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=endless, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert outcome, "the endless query was not stopped"
    assert isinstance(outcome[0], QueryTimeout) and "time limit" in str(outcome[0])
    assert db_fingerprint(node_db) == before


ALLOWED = [
    ("select", "SELECT op, count(*) FROM events GROUP BY op ORDER BY op", 3),
    ("view", "SELECT count(*) FROM calls", 1),
    ("bounded recursive cte", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT x FROM c", 5),
    ("read pragma", "PRAGMA table_info(events)", None),
    ("pragma function", "SELECT name FROM pragma_table_info('events') WHERE name = 'ts'", 1),
    ("json_each", "SELECT value FROM json_each('[1,2,3]')", 3),
    ("trailing semicolon and comment", "SELECT 1; -- the end", 1),
    ("user_version read", "PRAGMA user_version", 1),
]


@pytest.mark.parametrize("label,sql,rows", ALLOWED, ids=[a[0] for a in ALLOWED])
def test_read_only_sql_is_answered(node_db, label, sql, rows):
    result = run_query(str(node_db), sql)
    assert result.columns
    if rows is not None:
        assert len(result.rows) == rows
    assert not result.truncated


def test_rows_are_capped_and_marked_truncated(node_db):
    result = run_query(str(node_db), "SELECT seq FROM events ORDER BY seq", limit=4)
    assert [r[0] for r in result.rows] == [0, 1, 2, 3]
    assert result.truncated
    full = run_query(str(node_db), "SELECT seq FROM events", limit=1000)
    assert len(full.rows) == 12 and not full.truncated


def test_sql_errors_are_reported_as_such(node_db):
    with pytest.raises(QueryError) as caught:
        run_query(str(node_db), "SELECT nope FROM events")
    assert not isinstance(caught.value, QueryRejected)
    assert "no such column" in str(caught.value)


def test_a_file_that_is_not_sqlite_gives_a_one_line_error(tmp_path):
    bogus = tmp_path / "garbage.db"
    bogus.write_bytes(b"this is not a database at all\n" * 200)
    with pytest.raises(DatabaseUnavailable) as caught:
        run_query(str(bogus), "SELECT 1")
    assert "not a SQLite database" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(DatabaseUnavailable) as missing:
        run_query(str(tmp_path / "missing.db"), "SELECT 1")
    assert "no database" in str(missing.value)


def test_query_cli_json_is_what_the_ansible_module_parses(node_db):
    out = subprocess.run(STRAGGLER + ["query", "--db", str(node_db), "--json",
                                      "SELECT op, count(*) AS n FROM events GROUP BY op ORDER BY op"],
                         capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert set(answer) == {"node", "columns", "rows", "truncated", "elapsed_ms"}
    assert answer["node"] == "gpu-node-01"
    assert answer["columns"] == ["op", "n"]
    assert answer["rows"] == [["cuLaunchKernel", 2], ["cuMemAlloc", 4], ["ncclAllReduce", 6]]


def test_query_cli_refusal_is_one_line_without_traceback(node_db):
    out = subprocess.run(STRAGGLER + ["query", "--db", str(node_db), "DELETE FROM events"],
                         capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "read-only" in out.stderr


def test_database_in_a_directory_this_user_cannot_write_is_still_readable():
    """A reader without write access to the directory (no -shm can be made there) still reads a
    WAL database whose WAL was checkpointed (the agent stopped)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the reader as an unprivileged user")
    outer = tempfile.mkdtemp(prefix="straggler-guard-")   # /tmp/pytest-of-root is 0700: not for nobody
    locked = Path(outer) / "locked"
    locked.mkdir()
    make_node_db(locked / "node.db", "gpu-node-01", 0)   # closed: WAL checkpointed and removed
    os.chmod(outer, 0o755)
    locked.chmod(0o555)
    code = ("import sys, json; sys.path.insert(0, %r); from straggler.store.query import run_query; "
            "r = run_query(%r, 'SELECT count(*) FROM events'); print(json.dumps(r.rows))"
            % (str(REPO / "agent"), str(locked / "node.db")))
    try:
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60)
    finally:
        locked.chmod(0o755)
        shutil.rmtree(outer, ignore_errors=True)
    if "Permission denied" in out.stderr and "python" in out.stderr.lower() and "straggler" not in out.stderr:
        pytest.skip("the unprivileged user cannot run this Python")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[6]]


def test_snapshot_copies_committed_rows_still_in_the_wal(tmp_path):
    db = tmp_path / "live.db"
    make_node_db(db, "gpu-node-02", 0)
    writer = sqlite3.connect(str(db))
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.executemany("INSERT INTO events(seq, node, source, op, ts) VALUES (?, 'gpu-node-02', 'cuda', 'late', ?)",
                       [(1000 + i, i) for i in range(50)])
    writer.commit()   # committed, but only in the WAL: a raw copy of the main file would miss it
    try:
        raw_copy = tmp_path / "raw.db"
        shutil.copy(db, raw_copy)
        raw = sqlite3.connect(str(raw_copy)).execute("SELECT count(*) FROM events WHERE op = 'late'").fetchone()[0]
        assert raw == 0, "the test needs rows that live only in the WAL"
        summary = snapshot(str(db), str(tmp_path / "snap.db"))
        copy = sqlite3.connect(summary["path"])
        assert copy.execute("SELECT count(*) FROM events WHERE op = 'late'").fetchone()[0] == 50
        assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        copy.close()
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")], "no temporary file left behind"
    finally:
        writer.close()


def test_snapshot_cli_writes_the_copy(tmp_path):
    db = tmp_path / "n.db"
    make_node_db(db, "gpu-node-03", 2)
    out = subprocess.run(STRAGGLER + ["snapshot", "--db", str(db), "-o", str(tmp_path / "copy.db")],
                         capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    conn = sqlite3.connect(str(tmp_path / "copy.db"))
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 18


@pytest.fixture
def starved_watchdog(monkeypatch):
    """A watchdog whose thread never gets the CPU (two busy cores can do that for a while)."""
    from straggler.store import query, watchdog
    starved = watchdog.Watchdog()
    monkeypatch.setattr(starved, "_ensure_thread", lambda: None)
    monkeypatch.setattr(query, "WATCHDOG", starved)
    return starved


def test_a_deadline_is_kept_when_the_watchdog_thread_never_runs(node_db, starved_watchdog):
    """The deadline does not depend on the watchdog thread being scheduled in time: a deadline
    already past before SQLite starts, or passed while the statement runs, stops the query."""
    with pytest.raises(QueryTimeout, match="time limit of 0 s"):
        run_query(str(node_db), "SELECT count(*) FROM events", timeout_s=0)
    with pytest.raises(QueryTimeout, match="time limit"):
        run_query(str(node_db), "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                                "SELECT count(*) FROM c", timeout_s=0.2)
    assert run_query(str(node_db), "SELECT count(*) FROM events", timeout_s=5).rows
