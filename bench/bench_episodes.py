"""explain's episodes over a long trace of a large job, against one full scan of the same table measured
in the same run.

A synthetic cluster database (straggler_lab.series: thread_time at 1 s for every rank's calling thread,
clocks aligned, rolled up per minute as merge does) of N nodes x 8 ranks over hours, with faults of
different shapes in it: a late short CPU hog, a GPU slowdown on one rank of eight, a fault that comes and
goes. explain_db with its defaults must find each as an episode on its node (it reads the roll-ups, then
thread_time only in the stretches they point to); its time is compared with two baselines over the same
file:
  scan       SELECT COUNT(*), SUM(coll_ns) FROM thread_time   (every row read once)
  group      SELECT node, pid, tid, COUNT(*), SUM(...) FROM thread_time GROUP BY node, pid, tid
             (every row read once and sorted by thread: what any per-thread analysis costs at least)

    python -m bench.bench_episodes             64 nodes x 8 ranks x 24 h (44M rows; about 5 GB, minutes to build)
    python -m bench.bench_episodes --quick     8 nodes x 8 ranks x 1 h
    python -m bench.bench_episodes --hours H --nodes N

Writes bench/results/episodes.json and prints a table. The database is built in a temporary directory
(or --keep DIR) and removed afterwards.
"""
import argparse
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from straggler.analysis import explain
from straggler.render import table_text
from straggler_lab import series

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn, *a, **kw):
    t = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t, out


def scan(db, sql):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def faults_for(hours, nodes):
    """A late short CPU hog, a slow GPU on one rank of eight, and a fault that comes and goes, spread over
    the trace; returns [(Fault, node name, what)]."""
    end = hours * 3600
    return [series.Fault(node=nodes - 1, start_s=end - 300, end_s=end - 280, kind="cpu", slow=2.5),
            series.Fault(node=nodes // 2, ranks=(3,), start_s=end * 0.4, end_s=end * 0.4 + 120, kind="gpu", slow=1.8),
            series.Fault(node=1, start_s=end * 0.7, end_s=end * 0.7 + 60, kind="cpu", slow=2.2, on_s=4, off_s=4)]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.bench_episodes", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 nodes x 8 ranks x 1 h")
    p.add_argument("--hours", type=float, default=None)
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--keep", help="build the database in this directory and keep it")
    p.add_argument("--reuse", action="store_true", help="with --keep: use the database already there (built by an "
                                                         "earlier run with the same --hours and --nodes)")
    args = p.parse_args(argv)
    hours = args.hours or (1.0 if args.quick else 24.0)
    nodes = args.nodes or (8 if args.quick else 64)
    faults = faults_for(hours, nodes)
    spec = series.SeriesSpec(nodes=nodes, ranks_per_node=8, seconds=hours * 3600, helper_thread=False, faults=faults,
                             noise=0.02)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-episodes-"))
    work.mkdir(parents=True, exist_ok=True)
    db = str(work / "cluster.db")
    try:
        if args.reuse and args.keep and os.path.exists(db):
            build_s = None
        else:
            build_s, _ = timed(series.write_cluster, db, spec)
        rows = scan(db, "SELECT COUNT(*) FROM thread_time")[0][0]
        size = os.path.getsize(db)
        scan_s, _ = timed(scan, db, "SELECT COUNT(*), SUM(coll_ns) FROM thread_time")
        group_s, _ = timed(scan, db, "SELECT node, pid, tid, COUNT(*), SUM(calls), SUM(coll_ns), SUM(runq_ns) "
                                     "FROM thread_time GROUP BY node, pid, tid")
        explain_s, report = timed(explain.explain_db, db)
        found = []
        for f in faults:
            node = spec.node_name(f.node)
            start = series.REFERENCE_T0_NS + int(f.start_s * 1e9)
            hit = [e for e in report.episodes if e["node"] == node and abs(e["start_ns"] - start) <= 5 * 10**9 +
                   report.timeline["bin_s"] * 1e9]
            found.append(dict(node=node, kind=f.kind, start_s=f.start_s, found=bool(hit),
                              intermittent=bool(hit and hit[0]["intermittent"])))
        rolled = (report.timeline or {}).get("rollup") or {}
        result = dict(nodes=nodes, ranks=nodes * 8, hours=hours, rows=rows, db_bytes=size,
                      build_s=None if build_s is None else round(build_s, 1),
                      rollup_rows=scan(db, "SELECT COUNT(*) FROM thread_rollup")[0][0],
                      rollup_bin_s=rolled.get("bin_s"), rollup_marked=rolled.get("marked"),
                      stretches=[dict(start=st["start"], end=st["end"], ranks=st["ranks"])
                                 for st in rolled.get("stretches", [])],
                      scan_s=round(scan_s, 2), group_s=round(group_s, 2), explain_s=round(explain_s, 2),
                      explain_vs_scan=round(explain_s / scan_s, 2), explain_vs_group=round(explain_s / group_s, 2),
                      bin_s=report.timeline["bin_s"] if report.timeline else None, episodes=len(report.episodes),
                      faults=found, elapsed_inside_explain_s=report.elapsed_s)
    finally:
        if not args.keep:
            for name in os.listdir(work):
                os.unlink(work / name)
            os.rmdir(work)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "episodes.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"roll-ups: {result['rollup_rows']:,} rows, read in bins of {result['rollup_bin_s']} s; "
          f"{result['rollup_marked']} marked, {len(result['stretches'])} stretch(es) read at 1 s")
    print(table_text(["what", "seconds"], [("build the database", result["build_s"]), ("one full scan", result["scan_s"]),
                                           ("one grouped scan (per thread)", result["group_s"]),
                                           ("explain (episodes, defaults)", result["explain_s"])],
                     title=f"{nodes} nodes x 8 ranks x {hours:g} h: {rows:,} thread_time rows, {size / 1e9:.2f} GB"))
    print(table_text(["node", "fault", "from (s)", "found", "intermittent"],
                     [(f["node"], f["kind"], f["start_s"], f["found"], f["intermittent"]) for f in found],
                     title=f"episodes found: {result['episodes']} (bins of {result['bin_s']} s)"))
    return 0 if all(f["found"] for f in found) else 1


if __name__ == "__main__":
    raise SystemExit(main())
