"""`straggler snapshot` (store/snapshot.py) while the agent writes.

What a user would notice: a snapshot of a ~60 MB store finishes while another process commits as
fast as it can (SQLite's stepped backup restarts on every commit and never finished; how fast it
finishes is bench/bench_snapshot.py's measure, against that baseline in the same run);
the copy is consistent (a prefix of the writer's commits), one self-contained file in rollback-
journal mode, mode 0600 whatever the umask; a deadline stops it with one line and nothing left; a
SIGKILLed snapshot's temporary (and a dead server's staging directory) is removed by the next one;
what was refused before still is. With root and eBPF: the same while the real agent records a
flood (`straggler trace --record-all`).

Every helper process is ended in a finally block, by its pid, with bounded waits.
"""
import json
import os
import re
import select
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_api_helpers import REPO, venv_env

from straggler.errors import StragglerError
from straggler.store import snapshot as snapmod
from straggler.store.snapshot import remove_stale_temporaries, snapshot, stage_dir
from straggler.store.writer import EVENT_INSERT, open_store

NODE = "gpu-node-07"
HANG_GUARD_S = 120   # a snapshot's deadline in the tests under load: far beyond a copy of 60 MB, never judged
STORE_MB = 60
STRAGGLER = [sys.executable, "-m", "straggler.cli"]
DETAIL = json.dumps({"symbol": "cuLaunchKernel_ptsz", "stream": "0x7f3a5c000000", "pad": "x" * 240})

# a writer as the agent's, in a process of its own: one row per transaction, as fast as it can
WRITER_CODE = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from straggler.store.writer import EVENT_INSERT, open_store
db, node, max_s = sys.argv[2], sys.argv[3], float(sys.argv[4])
conn = open_store(db, node)
seq = (conn.execute("SELECT max(seq) FROM events").fetchone()[0] or 0) + 1
print("ready", flush=True)
end = time.monotonic() + max_s   # ends by itself even if the test dies
while time.monotonic() < end:
    conn.execute("BEGIN")
    conn.execute(EVENT_INSERT, (seq, node, 0, 0, "driver", "cuLaunchKernel", 4242, 4243, "python", seq * 1000,
                                5000, 0, None, 1, 1, 1, 32, 1, 1, None, None, None, 1, None, None, None))
    conn.execute("COMMIT")
    seq += 1
"""
KILLED_STAGE_CODE = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from straggler.store.snapshot import stage_dir
d = stage_dir(sys.argv[2])
open(os.path.join(d, "snapshot.db"), "wb").write(b"partial")
print(d, flush=True)
time.sleep(60)
"""


def _row(seq):
    """An event row in EVENT_INSERT order (seq, node first)."""
    return (seq, NODE, 0, 0, "driver", "cuLaunchKernel", 4242, 4243, "python", seq * 1000, 5000, 0, None,
            40000, 3, 2, 256, 1, 1, None, None, None, 1, None, None, DETAIL)


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    """A ~60 MB store made by the agent's open_store (WAL, schema, settings), seq 1..N contiguous,
    checkpointed so that its main file alone is complete."""
    path = tmp_path_factory.mktemp("base") / "base.db"
    conn = open_store(str(path), NODE)
    seq = 1
    while os.path.getsize(path) + os.path.getsize(str(path) + "-wal") < STORE_MB << 20:
        conn.execute("BEGIN")
        conn.executemany(EVENT_INSERT, [_row(s) for s in range(seq, seq + 20000)])
        conn.execute("COMMIT")
        seq += 20000
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    return path


@pytest.fixture
def store(base_store, tmp_path):
    """A fresh copy of the base store for one test (the writers append to it)."""
    path = tmp_path / "live" / "straggler.db"
    path.parent.mkdir()
    shutil.copyfile(base_store, path)
    return path


def count_events(db):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        conn.close()


class Writer:
    """WRITER_CODE as a subprocess; stop() kills it by pid (bounded)."""

    def __init__(self, db, max_s=120):
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER_CODE, str(REPO / "agent"), str(db), NODE, str(max_s)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.stop()
            pytest.fail(f"the writer did not start: {line!r} {self.proc.stderr.read()[-2000:]}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


def wait_for(condition, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    value = condition()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = condition()
    return value


def temporaries(directory):
    return sorted(n for n in os.listdir(directory) if ".straggler-snap-" in n or n.endswith(".tmp")
                  or n.endswith("-journal") or n.endswith("-wal") or n.endswith("-shm"))


def assert_self_contained_copy(path):
    raw = Path(path).read_bytes()[:100]
    assert raw[:16] == b"SQLite format 3\x00"
    assert (raw[18], raw[19]) == (1, 1), "the header still says WAL: the copy is not one self-contained file"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        count, low, high = conn.execute("SELECT count(*), min(seq), max(seq) FROM events").fetchone()
    finally:
        conn.close()
    assert not [p for p in os.listdir(os.path.dirname(path)) if p.startswith(os.path.basename(path) + "-")]
    return count, low, high


# ---- under load -----------------------------------------------------------------------------------
def test_snapshot_completes_while_a_writer_commits_as_fast_as_it_can(store, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "snap.db"
    old_umask = os.umask(0o022)
    writer = Writer(store, max_s=4 * HANG_GUARD_S)
    try:
        initial = count_events(store)
        assert wait_for(lambda: count_events(store) >= initial + 200, 30), "the writer does not commit"
        before = count_events(store)
        # the deadline is a hang guard: a copy that restarts on every commit would never finish and be
        # stopped by it with one line (StragglerError), however long the machine makes a real copy take
        summary = snapshot(str(store), str(out), deadline_s=HANG_GUARD_S)
        after = count_events(store)
        assert writer.alive(), "the writer stopped: the snapshot was not taken under load"
    finally:
        writer.stop()
        os.umask(old_umask)
    assert after - before >= 10, "the writer committed too little during the snapshot to test anything"
    assert summary["path"] == str(out) and summary["bytes"] == os.path.getsize(out) > (STORE_MB - 5) << 20
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    count, low, high = assert_self_contained_copy(out)
    # one point in the writer's history: every commit up to it (seq contiguous), none after
    assert low == 1 and count == high
    assert before <= count <= after
    assert temporaries(out_dir) == []


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077], ids=["umask000", "umask022", "umask077"])
def test_the_copy_is_0600_whatever_the_umask(store, tmp_path, umask):
    old_umask = os.umask(umask)
    try:
        snapshot(str(store), str(tmp_path / "snap.db"))
        # and over an existing file that was readable by all
        (tmp_path / "again.db").write_bytes(b"old")
        os.chmod(tmp_path / "again.db", 0o644)
        snapshot(str(store), str(tmp_path / "again.db"))
    finally:
        os.umask(old_umask)
    for name in ("snap.db", "again.db"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600, name


# ---- deadline ---------------------------------------------------------------------------------------
def test_a_deadline_stops_the_snapshot_with_one_line_and_leaves_nothing(store, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    previous = out_dir / "kept.db"
    previous.write_bytes(b"the previous snapshot")
    writer = Writer(store)
    try:
        with pytest.raises(StragglerError) as info:
            snapshot(str(store), str(out_dir / "snap.db"), deadline_s=0.001)
        cli = subprocess.run(STRAGGLER + ["snapshot", "--db", str(store), "-o", str(previous), "--deadline", "0.001"],
                             capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    finally:
        writer.stop()
    message = str(info.value)
    assert "\n" not in message
    assert re.match(rf"snapshot of {re.escape(str(store))} stopped after 0.001 s \(deadline\): \d+ of \d+ pages", message)
    assert "--deadline" in message
    assert cli.returncode == 2
    assert cli.stderr.count("\n") == 1 and "stopped after 0.001 s (deadline)" in cli.stderr, cli.stderr
    assert sorted(os.listdir(out_dir)) == ["kept.db"], "a stopped snapshot left something behind"
    assert previous.read_bytes() == b"the previous snapshot"


# ---- killed snapshots and staging directories -----------------------------------------------------
def test_a_killed_snapshot_leaves_a_temporary_that_the_next_snapshot_removes(store, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "snap.db"
    writer = Writer(store)
    killed_pid = None
    try:
        for _attempt in range(3):   # killed too late (it had finished): try again
            proc = subprocess.Popen(STRAGGLER + ["snapshot", "--db", str(store), "-o", str(out)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=venv_env(), cwd=REPO)
            try:
                mark = f".snap.db.straggler-snap-{proc.pid}-"
                seen = wait_for(lambda: proc.poll() is not None or any(n.startswith(mark) for n in os.listdir(out_dir)),
                                60, interval=0.002)
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
            finally:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
            assert seen, "the snapshot made no temporary within 60 s"
            if proc.returncode == -signal.SIGKILL:
                killed_pid = proc.pid
                break
            out.unlink(missing_ok=True)
        assert killed_pid, "could not kill a snapshot while it worked in 3 tries"
        left = temporaries(out_dir)
        assert any(n.startswith(f".snap.db.straggler-snap-{killed_pid}-") and n.endswith(".tmp") for n in left), left
        assert not out.exists()
        # the next start: same output directory
        nxt = subprocess.run(STRAGGLER + ["snapshot", "--db", str(store), "-o", str(out)],
                             capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    finally:
        writer.stop()
    assert nxt.returncode == 0, nxt.stderr
    assert os.listdir(out_dir) == ["snap.db"], "the killed snapshot's temporary is still there"
    assert_self_contained_copy(out)


def test_remove_stale_temporaries_keeps_those_of_live_snapshots(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    names = {
        f".a.db.straggler-snap-{dead.pid}-abc_123.tmp": False,          # owner gone
        f".a.db.straggler-snap-{dead.pid}-abc_123.tmp-journal": False,
        f".b.db.straggler-snap-{dead.pid}-zzzzzzzz.tmp-wal": False,     # orphan side file
        f".c.db.straggler-snap-{os.getpid()}-q1w2e3r4.tmp": True,      # owner alive (this process)
        f".d.db.straggler-snap-{os.getpid()}-reused00.tmp": False,     # pid alive, but started after the file
        "snap.db": True,
        ".snap.db.abcdefgh.tmp": True,                                  # not ours to judge by pid
        f"straggler-snap-{dead.pid}-x.tmp": True,                       # not our pattern (no leading .OUT.)
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    long_ago = time.time() - 30 * 24 * 3600   # before this process started
    os.utime(tmp_path / f".d.db.straggler-snap-{os.getpid()}-reused00.tmp", (long_ago, long_ago))
    removed = remove_stale_temporaries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, keep in names.items() if keep)
    assert sorted(map(os.path.basename, removed)) == sorted(n for n, keep in names.items() if not keep)


def test_stage_dir_is_0700_named_after_its_pid_and_removes_those_of_dead_servers(tmp_path):
    parent = tmp_path / "stage"
    parent.mkdir()
    killed = subprocess.Popen([sys.executable, "-c", KILLED_STAGE_CODE, str(REPO / "agent"), str(parent)],
                              stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", KILLED_STAGE_CODE, str(REPO / "agent"), str(parent)],
                            stdout=subprocess.PIPE, text=True)
    try:
        dirs = {}
        for name, proc in (("killed", killed), ("live", live)):
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            dirs[name] = Path(proc.stdout.readline().strip()) if ready else None
            assert dirs[name] and dirs[name].is_dir(), name
            assert dirs[name].name.startswith(f"straggler-snapshot-{proc.pid}-")
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        unrelated = parent / "straggler-snapshot-abcdefgh"     # the old naming, without a pid: not touched
        unrelated.mkdir()
        mine = Path(stage_dir(str(parent)))
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
    assert mine.parent == parent and mine.name.startswith(f"straggler-snapshot-{os.getpid()}-")
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    assert not dirs["killed"].exists(), "the staging directory of a killed server is still there"
    assert dirs["live"].exists(), "the staging directory of a running server was removed"
    assert unrelated.exists()
    # the live one's process has ended by now: the next call removes it too
    again = Path(stage_dir(str(parent)))
    assert sorted(p.name for p in parent.iterdir()) == sorted([mine.name, again.name, unrelated.name])


def test_stage_dir_in_the_system_temporary_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(snapmod.tempfile, "gettempdir", lambda: str(tmp_path))
    made = Path(stage_dir())
    assert made.parent == tmp_path and made.is_dir()
    with pytest.raises(StragglerError, match=r"cannot make a staging directory in .*missing.*snapshot-dir"):
        stage_dir(str(tmp_path / "missing"))


# ---- what is refused -------------------------------------------------------------------------------
def test_what_was_refused_still_is_with_one_line(store, tmp_path):
    link = tmp_path / "link.db"
    link.symlink_to(store)
    cases = [
        (str(store), "is the database itself"),
        (str(link), "is the database itself"),
        (str(tmp_path / "missing" / "snap.db"), "does not exist; create it or choose another -o"),
    ]
    for out, reason in cases:
        with pytest.raises(StragglerError, match=re.escape(reason)) as info:
            snapshot(str(store), out)
        assert "\n" not in str(info.value)
    with pytest.raises(StragglerError, match="not positive"):
        snapshot(str(store), str(tmp_path / "snap.db"), deadline_s=0)
    cli = subprocess.run(STRAGGLER + ["snapshot", "--db", str(store), "-o", str(tmp_path / "s.db"), "--deadline", "-1"],
                         capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    assert cli.returncode == 2 and "not a positive number of seconds" in cli.stderr
    assert not (tmp_path / "s.db").exists() and not (tmp_path / "snap.db").exists()
    assert temporaries(tmp_path) == []


def test_an_unwritable_directory_is_refused_with_one_line(store, tmp_path):
    """As an unprivileged user (root may write anywhere)."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        try:
            with pytest.raises(StragglerError, match="is not writable by this user; choose another -o"):
                snapshot(str(store), str(locked / "snap.db"))
        finally:
            locked.chmod(0o755)
        return
    outer = Path("/tmp") / f"straggler-unwritable-{os.getpid()}"   # pytest's tmp_path is 0700: not for nobody
    outer.mkdir(mode=0o755)
    try:
        (outer / "locked").mkdir(mode=0o555)
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from straggler.errors import StragglerError\n"
                "from straggler.store.snapshot import snapshot\n"
                "try:\n    snapshot(%r, %r)\nexcept StragglerError as exc:\n    print(exc)\n"
                % (str(REPO / "agent"), str(store), str(outer / "locked" / "snap.db")))
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(outer, ignore_errors=True)
    if out.returncode != 0 and "straggler" not in out.stderr:
        pytest.skip(f"the unprivileged user cannot run this Python: {out.stderr.strip()[-200:]}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("is not writable by this user; choose another -o"), out.stdout
    assert out.stdout.count("\n") == 1


# ---- the real agent ------------------------------------------------------------------------------
def max_rowid(db):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT max(rowid) FROM events").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.bpf
def test_snapshot_while_the_real_agent_records_a_flood(store, tmp_path):
    """`straggler trace --record-all` on the 60 MB store while a stand-in workload calls
    cuLaunchKernel as fast as it can. The agent commits a batch every few seconds here (its
    Python side is the bottleneck), so snapshots are taken back to back until one of them
    spanned a commit of the agent (bounded); every one must finish (its deadline a hang guard)."""
    from straggler_lab.standin import build_standin, build_workload
    from test_agent import AgentRun, Launcher, standin_libs, start_child_workload

    lib_dir = tmp_path / "standin"
    build_standin(lib_dir)
    standin = {"lib_dir": str(lib_dir), "workload": build_workload(lib_dir)}
    out = tmp_path / "snap.db"
    base_rowid = max_rowid(store)
    launcher = Launcher(tmp_path)
    agent = child = None
    spanned = None
    took = 0
    try:
        agent = AgentRun(store, ["--node", "agent-snap", "--record-all", "--pid", str(launcher.pid), "--interval", "1",
                                 "--rescan", "0.5", *standin_libs(standin)])
        agent.wait_ready()
        child = start_child_workload(launcher, standin, "--mode", "launch", "--seconds", "30",
                                     env={"STRAGGLER_STANDIN_LAUNCH_US": "0"})
        assert wait_for(lambda: max_rowid(store) > base_rowid, 60, interval=0.1), "the agent recorded nothing"
        give_up = time.monotonic() + 20
        while spanned is None and time.monotonic() < give_up:
            before = max_rowid(store)
            summary = snapshot(str(store), str(out), deadline_s=HANG_GUARD_S)
            took += 1
            after = max_rowid(store)
            if after > before:
                spanned = (before, after)
        assert agent.proc.poll() is None, "the agent stopped during the snapshots"
    finally:
        if child is not None:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if agent is not None:
            agent.stop(signal.SIGKILL, timeout=30)
        launcher.close()
    assert spanned, f"no snapshot spanned a commit of the agent in 20 s ({took} snapshots)"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert_self_contained_copy(summary["path"])
    conn = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
    copied, agent_rows = conn.execute("SELECT max(rowid), count(*) FILTER (WHERE node = 'agent-snap') FROM events").fetchone()
    conn.close()
    assert spanned[0] <= copied <= spanned[1] and agent_rows > 0
