"""`straggler merge` of sparse against dense data, the same number of rows, measured in the same run.

  sparse     one node store of N thread_time summaries ten minutes apart (a summary alone in each
             ten-minute window of the clock, as a job that reports rarely over weeks writes)
  dense      the same N summaries one every 0.25 s over four threads (a busy job's minutes)
Each is merged (`straggler merge`: the copy, its checks and the roll-up, thread_rollup, rebuilt from
the rows copied) --runs times, the median kept. The roll-up alone is also timed on each merged
database: rollup.rebuild against its former form in the same run (one INSERT … SELECT per
ten-minute window that holds a row: twice as many statements as windows; run up to
BASELINE_MAX_ROWS rows: beyond, it takes minutes), both leaving the same roll-ups (checked).
Target (issue: sparse data made merge slow, 60k summaries ten minutes apart 23 s, dense 1 s): merge
costs O(rows), dense or sparse: the sparse merge within SPARSE_TARGET x the dense one (sparse
writes one roll-up per summary, dense one per 240: a little more work per row, never per window).

  value check   merge of 4 synthetic node stores (straggler_lab.synth, io_cpu) with the check of
                every copied value's type (merge.values, the copy's own WHERE) against the same
                merge with that check switched off: what refusing bad values costs a sound merge

Writes bench/results/merge_sparse.json and prints a table. `--quick`: 20k and 60k summaries and 300k
events instead of 60k and 600k summaries and 1M events.
"""
import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import render  # noqa: E402
from straggler.analysis import merge  # noqa: E402
from straggler.analysis.merge import values  # noqa: E402
from straggler.store import rollup, schema  # noqa: E402
from straggler_lab import synth  # noqa: E402

MIN_NS = rollup.ROLLUP_NS
BASELINE_MAX_ROWS = 60_000
SPARSE_TARGET = 5.0
COLUMNS = ("node, ts, interval_ns, pid, tid, rank, comm, calls, work_ns, sync_ns, coll_ns, runq_ns, runq_work_ns, "
           "runq_sync_ns, runq_coll_ns, blocked_ns, io_ns, thieves")


def summary_row(ts, tid, k):
    return ("gpu-node-01", ts, 1_000_000_000, 4242, tid, tid - 4242, f"t{tid}", 10 + k % 7, 500_000 + k * 13 % 9000,
            100_000 + k % 5000, 200_000 + k * 7 % 30000, 1000 + k % 300, k % 200, k % 100, k % 50, 3000 + k % 400,
            k % 11, '[["process", 5151, "ckpt-writer", 1000]]' if k % 3 == 0 else None)


def make_store(path, n, sparse):
    """A node store of n thread_time summaries: ten minutes apart (sparse), or one every 0.25 s over
    four threads (dense)."""
    conn = sqlite3.connect(path)
    schema.create(conn, node="gpu-node-01")
    if sparse:
        rows = (summary_row(3600 * 10**9 + k * 10 * MIN_NS, 4242, k) for k in range(n))
    else:
        rows = (summary_row(3600 * 10**9 + k * 250_000_000, 4242 + k % 4, k) for k in range(n))
    conn.executemany(f"INSERT INTO thread_time ({COLUMNS}) VALUES ({', '.join('?' * 18)})", rows)
    conn.commit()
    conn.close()
    return path


def per_window_rebuild(conn):
    """rollup.rebuild's former form: one INSERT … SELECT per ten-minute window that holds a row."""
    conn.execute("DELETE FROM thread_rollup")
    conn.execute("DELETE FROM meta WHERE key = ?", (rollup.META_KEY,))
    at = conn.execute("SELECT MIN(ts) FROM thread_time").fetchone()[0]
    while at is not None:
        start = int(at) // rollup.REBUILD_NS * rollup.REBUILD_NS
        conn.execute(rollup.roll_sql(f"ts >= {start} AND ts < {start + rollup.REBUILD_NS}"))
        at = conn.execute("SELECT MIN(ts) FROM thread_time WHERE ts >= ?", (start + rollup.REBUILD_NS,)).fetchone()[0]


def time_rebuild(db, fn):
    """Seconds `fn` takes to rebuild db's roll-ups (in a transaction rolled back after), and the
    roll-ups it made (sorted)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        t = time.perf_counter()
        fn(conn)
        secs = time.perf_counter() - t
        rows = sorted(conn.execute("SELECT * FROM thread_rollup").fetchall(), key=repr)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return secs, rows


def merge_median(paths, out, runs):
    times = []
    for _ in range(runs):
        if os.path.exists(out):
            os.unlink(out)
        t = time.perf_counter()
        merge.merge(paths, out)
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def bench_sparse_dense(work, n, runs):
    entry = dict(rows=n, runs=runs)
    for kind in ("dense", "sparse"):
        src = make_store(os.path.join(work, f"{kind}-{n}.db"), n, kind == "sparse")
        out = os.path.join(work, f"{kind}-{n}-cluster.db")
        med, times = merge_median([src], out, runs)
        conn = sqlite3.connect(out)
        rolled = conn.execute("SELECT COUNT(*) FROM thread_rollup").fetchone()[0]
        windows = conn.execute(f"SELECT COUNT(DISTINCT ts / {rollup.REBUILD_NS}) FROM thread_time").fetchone()[0]
        conn.close()
        new_s, new_rows = time_rebuild(out, rollup.rebuild)
        part = dict(merge_s=round(med, 3), merge_runs_s=[round(t, 3) for t in times], rollups=rolled, windows=windows,
                    rebuild_s=round(new_s, 3), per_window_rebuild_s=None)
        if n <= BASELINE_MAX_ROWS:
            old_s, old_rows = time_rebuild(out, per_window_rebuild)
            assert old_rows == new_rows, f"{kind}: rebuild and the per-window form disagree"
            part["per_window_rebuild_s"] = round(old_s, 3)
        entry[kind] = part
        os.unlink(src)
        os.unlink(out)
    entry["sparse_over_dense"] = round(entry["sparse"]["merge_s"] / entry["dense"]["merge_s"], 2)
    entry["target_met"] = entry["sparse_over_dense"] <= SPARSE_TARGET
    return entry


def bench_value_check(work, events, runs):
    facts = synth.write_nodes(os.path.join(work, "synth"), synth.SynthSpec(scenario="io_cpu", events=events))
    paths = [f["path"] for f in facts["files"]]
    out = os.path.join(work, "synth-cluster.db")
    checked, unchecked = [], []
    for _ in range(runs):                          # interleaved: both see the same machine
        checked.append(merge_median(paths, out, 1)[0])
        with mock.patch.object(values, "checked_columns", lambda table, columns: []):
            unchecked.append(merge_median(paths, out, 1)[0])
    conn = sqlite3.connect(out)
    rows = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    conn.close()
    shutil.rmtree(os.path.join(work, "synth"), ignore_errors=True)
    os.unlink(out)
    c, u = statistics.median(checked), statistics.median(unchecked)
    return dict(events=rows, runs=runs, checked_s=round(c, 3), unchecked_s=round(u, 3),
                overhead=round(c / u - 1.0, 3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k and 60k summaries, 300k events")
    ap.add_argument("--sizes", help="comma-separated summary counts (overrides the defaults)")
    ap.add_argument("--events", type=int, help="events of the value-check merge (overrides the default)")
    ap.add_argument("--runs", type=int, default=3, help="merges per measurement (median)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [20_000, 60_000] if args.quick else [60_000, 600_000])
    events = args.events or (300_000 if args.quick else 1_000_000)
    work = tempfile.mkdtemp(prefix="bench-merge-sparse-", dir=args.work)
    results = dict(quick=args.quick, machine=dict(cpus=os.cpu_count()), batch_rows=rollup.BATCH_ROWS, sizes=[])
    try:
        for n in sizes:
            results["sizes"].append(bench_sparse_dense(work, n, args.runs))
            print(f"[{n:,} summaries] done", file=sys.stderr, flush=True)
        results["value_check"] = bench_value_check(work, events, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "merge_sparse.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = []
    for e in results["sizes"]:
        for kind in ("dense", "sparse"):
            p = e[kind]
            rows.append((f"{e['rows']:,}", kind, p["windows"], p["rollups"], p["merge_s"], p["rebuild_s"],
                         "-" if p["per_window_rebuild_s"] is None else p["per_window_rebuild_s"],
                         f"x{e['sparse_over_dense']} dense ({'met' if e['target_met'] else 'MISSED'}: "
                         f"<= x{SPARSE_TARGET:g})" if kind == "sparse" else ""))
    print(render.table_text(["summaries", "data", "10-min windows", "roll-ups", "merge s (median)", "roll-up s",
                             "per-window roll-up s (before)", "sparse vs dense"], rows,
                            title="merge: sparse vs dense, the same rows, same run"), end="")
    v = results["value_check"]
    print(f"value check: merge of {v['events']:,} events {v['checked_s']} s with it, {v['unchecked_s']} s without "
          f"(+{v['overhead']:.0%})")
    print(f"results: {out_dir / 'merge_sparse.json'}")
    return 0 if all(e["target_met"] for e in results["sizes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
