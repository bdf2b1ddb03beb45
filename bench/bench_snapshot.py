"""`straggler snapshot` on a live store: time to a consistent copy against store size, idle and while
another process commits as fast as it can, for the method in straggler.store.snapshot (SQLite's
backup API in steps inside ONE read transaction of the source) against, in the same run:

- the baseline, the method before issue 13: the backup API in steps of 4096 pages with a read
  transaction per step (SQLite's default), which starts over whenever another connection commits;
  it runs under a timeout (--old-timeout, default 30 s) and is reported as "did not finish in N s";
- VACUUM INTO on the read-only connection (also one read transaction; rebuilds the file), for
  reference.

Stores are made with the agent's own writer settings (store.writer.open_store: WAL, schema,
auto_vacuum) from events rows of about 400 bytes, checkpointed; every measurement starts from a
fresh copy of that store (the writer grows it, by ~30 MB in a 30 s timeout). The writer is a separate process
committing one event per transaction in a loop (like WRITER_CODE in tests/test_snapshot_under_load.py);
its rate during each measurement is reported. Each copy is checked (header not WAL, journal_mode
delete, quick_check ok). Medians over --runs runs (default 3; 1 at 1 GB and above).

Sizes: 100 MB and 1 GB (`make bench`, a few minutes), --quick: 100 MB only; --sizes overrides (MB).
Writes bench/results/snapshot.json and prints a table.
"""
import argparse
import json
import os
import select
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import render  # noqa: E402
from straggler.errors import StragglerError  # noqa: E402
from straggler.store.query import open_readonly  # noqa: E402
from straggler.store.snapshot import snapshot  # noqa: E402
from straggler.store.writer import EVENT_INSERT, open_store  # noqa: E402

NODE = "bench-node"
DETAIL = json.dumps({"symbol": "cuLaunchKernel_ptsz", "stream": "0x7f3a5c000000", "pad": "x" * 240})
WRITER_CODE = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from straggler.store.writer import EVENT_INSERT, open_store
db, node, max_s = sys.argv[2], sys.argv[3], float(sys.argv[4])
conn = open_store(db, node)
seq = (conn.execute("SELECT max(seq) FROM events").fetchone()[0] or 0) + 1
print("ready", flush=True)
end = time.monotonic() + max_s
while time.monotonic() < end:
    conn.execute("BEGIN")
    conn.execute(EVENT_INSERT, (seq, node, 0, 0, "driver", "cuLaunchKernel", 4242, 4243, "python", seq * 1000,
                                5000, 0, None, 1, 1, 1, 32, 1, 1, None, None, None, 1, None, None, None))
    conn.execute("COMMIT")
    seq += 1
"""


class DidNotFinish(Exception):
    pass


def make_store(path, megabytes):
    conn = open_store(str(path), NODE)
    seq, batch = 1, 20000
    while os.path.getsize(path) + os.path.getsize(str(path) + "-wal") < megabytes * 1_000_000:
        conn.execute("BEGIN")
        conn.executemany(EVENT_INSERT, [(s, NODE, 0, 0, "driver", "cuLaunchKernel", 4242, 4243, "python", s * 1000, 5000,
                                         0, None, 40000, 3, 2, 256, 1, 1, None, None, None, 1, None, None, DETAIL)
                                        for s in range(seq, seq + batch)])
        conn.execute("COMMIT")
        seq += batch
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()


def old_stepped_backup(db, out, timeout_s):
    """The method before issue 13: a backup step per 4096 pages, each its own read transaction."""
    started = time.monotonic()

    def progress(_status, remaining, _total):
        if remaining and time.monotonic() - started > timeout_s:
            raise DidNotFinish()

    source = open_readonly(db)
    try:
        target = sqlite3.connect(out, isolation_level=None)
        try:
            source.backup(target, pages=4096, progress=progress)
            target.execute("PRAGMA journal_mode = DELETE")
        finally:
            target.close()
    finally:
        source.close()


def vacuum_into(db, out, timeout_s):
    started = time.monotonic()
    source = open_readonly(db)
    source.set_progress_handler(lambda: 1 if time.monotonic() - started > timeout_s else 0, 10000)
    try:
        source.execute("PRAGMA query_only = 0")   # the connection stays read-only (mode=ro)
        source.execute("VACUUM INTO ?", (out,))
    except sqlite3.OperationalError as exc:
        if "interrupt" in str(exc):
            raise DidNotFinish() from None
        raise
    finally:
        source.close()
    target = sqlite3.connect(out, isolation_level=None)
    target.execute("PRAGMA journal_mode = DELETE")
    target.close()


def new_snapshot(db, out, timeout_s):
    try:
        snapshot(db, out, deadline_s=timeout_s)
    except StragglerError as exc:
        if "(deadline)" in str(exc):
            raise DidNotFinish() from None
        raise


METHODS = {"new": new_snapshot, "old (baseline)": old_stepped_backup, "vacuum into": vacuum_into}


def check_copy(path):
    with open(path, "rb") as fh:
        header = fh.read(20)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        ok = (header[18], header[19]) == (1, 1) and conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete" \
            and conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    return ok


def max_rowid(db):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT max(rowid) FROM events").fetchone()[0] or 0
    finally:
        conn.close()


class Writer:
    def __init__(self, db, max_s):
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER_CODE, str(REPO / "agent"), str(db), NODE, str(max_s)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        if not ready or self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("the writer process did not start")

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.proc.stdout.close()


def remove(path):
    for suffix in ("", "-journal", "-wal", "-shm"):
        try:
            os.unlink(path + suffix)
        except OSError:
            pass


def measure(method, pristine, db, out, timeout_s, writer_on):
    remove(out)
    remove(db)
    shutil.copyfile(pristine, db)
    writer = Writer(db, max_s=timeout_s + 120) if writer_on else None
    try:
        if writer:
            time.sleep(0.5)   # at full rate
        before, started = max_rowid(db), time.monotonic()
        try:
            METHODS[method](db, out, timeout_s)
            elapsed, finished = time.monotonic() - started, True
        except DidNotFinish:
            elapsed, finished = time.monotonic() - started, False
        commits = max_rowid(db) - before
    finally:
        if writer:
            writer.stop()
    result = dict(finished=finished, wall_s=round(elapsed, 3), writer_commits_per_s=round(commits / elapsed) if writer_on else 0)
    if finished:
        result.update(bytes=os.path.getsize(out), copy_ok=check_copy(out))
    remove(out)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 MB only")
    ap.add_argument("--sizes", help="comma-separated store sizes in MB (overrides the defaults)")
    ap.add_argument("--runs", type=int, default=None, help="runs per method and load (default 3; 1 at 1 GB and above)")
    ap.add_argument("--old-timeout", type=float, default=30.0, help="seconds after which a method is stopped and "
                                                                      "reported as not finished (default 30)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [100] if args.quick else [100, 1000]
    work = tempfile.mkdtemp(prefix="bench-snapshot-", dir=args.work)
    results = dict(quick=args.quick, machine=dict(cpus=os.cpu_count()), timeout_s=args.old_timeout,
                   sqlite=sqlite3.sqlite_version, sizes=[])
    rows = []
    try:
        for size in sizes:
            pristine = os.path.join(work, f"store-{size}.db")
            db = os.path.join(work, "live.db")
            t = time.monotonic()
            make_store(pristine, size)
            made_s = time.monotonic() - t
            runs = args.runs or (1 if size >= 1000 else 3)
            entry = dict(megabytes=size, db_bytes=os.path.getsize(pristine), made_in_s=round(made_s, 1), runs=runs, results={})
            print(f"[{size} MB] store made in {made_s:.1f} s", file=sys.stderr, flush=True)
            for load in ("idle", "writer"):
                for method in METHODS:
                    all_runs = []
                    for i in range(runs):
                        all_runs.append(measure(method, pristine, db, os.path.join(work, "copy.db"), args.old_timeout,
                                                load == "writer"))
                        print(f"[{size} MB] {load} {method} run {i + 1}/{runs}: {all_runs[-1]}", file=sys.stderr,
                              flush=True)
                        if not all_runs[-1]["finished"]:
                            break   # one timeout says it: do not wait for it again
                    done = [r for r in all_runs if r["finished"]]
                    summary = dict(finished=len(done) == len(all_runs), runs=all_runs,
                                   wall_s=round(statistics.median(r["wall_s"] for r in done), 3) if done else None,
                                   copy_ok=all(r.get("copy_ok") for r in done) if done else None,
                                   writer_commits_per_s=round(statistics.median(r["writer_commits_per_s"]
                                                                                for r in all_runs)))
                    entry["results"][f"{load}/{method}"] = summary
                    shown = (f"{summary['wall_s']:.2f}" if summary["finished"]
                             else f"did not finish in {args.old_timeout:g} s")
                    rows.append((f"{size} MB", load, method, shown,
                                 {True: "ok", False: "BAD", None: "-"}[summary["copy_ok"]],
                                 summary["writer_commits_per_s"] if load == "writer" else "-"))
            new_w = entry["results"]["writer/new"]
            old_w = entry["results"]["writer/old (baseline)"]
            entry["new_under_load_vs_idle"] = (round(new_w["wall_s"] / entry["results"]["idle/new"]["wall_s"], 2)
                                               if new_w["wall_s"] else None)
            entry["old_finished_under_load"] = old_w["finished"]
            results["sizes"].append(entry)
            remove(db)
            remove(pristine)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "snapshot.json").write_text(json.dumps(results, indent=2) + "\n")
    print(render.table_text(["store", "load", "method", "wall s (median)", "copy", "writer commits/s"], rows,
                            title="snapshot: one read transaction (new) vs stepped backup (old), same run"), end="")
    print(f"results: {out_dir / 'snapshot.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
