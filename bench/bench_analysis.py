"""Speed of the analysis part, each against a baseline measured in the same run:

  merge      `straggler merge` of 4 synthetic node stores (node-aware copy of every table, clock
             alignment per event, UNIQUE (node, seq) and the standard indexes) vs SQLite's own
             INSERT … SELECT of the same events into one unindexed table (the floor for any copy),
             and that copy plus the same four indexes
  explain    explain_db on the merged cluster database (1M and 10M events); baseline: one
             full-scan aggregate over the same events (SELECT node, op, COUNT, AVG … GROUP BY)
  clock      straggler.clock.clock_segments (one sort: O(n log n)) on 1k, 5k and a week of clock pairs
             (one every 5 s: 120,961) vs its former form, mono_to_real at each pair, which sorts all
             pairs again each time (O(n² log n); run up to 5k pairs only: a week would take hours)
  week       `straggler merge` of one node store holding a week of clock pairs (120,961) beside 10k
             events: the whole merge, its row checks and clock alignment included, in seconds
(The timeline export has its own benchmark: bench_export.py, .pftrace against Chrome JSON.)

Inputs come from straggler_lab.synth (scenario io_cpu, four nodes). Writes
bench/results/analysis.json and prints a table. `--quick`: 100k and 300k events instead of 1M and 10M.
"""
import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import clock, render  # noqa: E402
from straggler.analysis import explain, merge  # noqa: E402
from straggler_lab import synth  # noqa: E402

CLOCK_SIZES = (1_000, 5_000, 7 * 24 * 720 + 1)    # pairs; the last a week at one every 5 s
CLOCK_BASELINE_MAX = 5_000                         # the per-knot form beyond this takes minutes to hours


def timed(fn, *a, **kw):
    t = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t, out


def make_nodes(work, events, tag):
    d = os.path.join(work, f"nodes-{tag}")
    secs, facts = timed(synth.write_nodes, d, synth.SynthSpec(scenario="io_cpu", events=events))
    return secs, facts


def baseline_insert_select(paths, out):
    """SQLite's own INSERT … SELECT of every input's events into one unindexed table."""
    if os.path.exists(out):
        os.unlink(out)
    conn = sqlite3.connect(out, isolation_level=None)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    cols = [r[1] for r in sqlite3.connect(paths[0]).execute("PRAGMA table_info(events)") if r[1] != "id"]
    conn.execute(f"CREATE TABLE events ({', '.join(cols)})")
    t = time.perf_counter()
    for p in paths:
        conn.execute("ATTACH DATABASE ? AS src", (p,))
        conn.execute("BEGIN")
        conn.execute(f"INSERT INTO events SELECT {', '.join(cols)} FROM src.events")
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE src")
    secs = time.perf_counter() - t
    n = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    t = time.perf_counter()       # the same four indexes merge builds
    conn.execute("CREATE UNIQUE INDEX events_node_seq ON events(node, seq)")
    conn.execute("CREATE INDEX events_source_op_ts ON events(source, op, ts)")
    conn.execute("CREATE INDEX events_pid_ts ON events(pid, ts)")
    conn.execute("CREATE INDEX events_ts ON events(ts)")
    index_secs = time.perf_counter() - t
    conn.close()
    os.unlink(out)
    return secs, index_secs, n


def clock_segments_per_knot(pairs):
    """clock_segments as it was before it moved to straggler.clock: mono_to_real at every knot (each
    call sorts all the pairs again). The baseline; its segments must equal clock_segments'."""
    knots = sorted({int(m) for m, _ in pairs})
    if not knots:
        return []
    real = {m: clock.mono_to_real(pairs, m) for m in knots}
    segs = [(-(1 << 62), knots[0], real[knots[0]] - knots[0], 0.0)]
    for m0, m1 in zip(knots, knots[1:]):
        segs.append((m0, m0, real[m0] - m0, (real[m1] - real[m0]) / (m1 - m0) - 1.0))
    segs.append((knots[-1], knots[-1], real[knots[-1]] - knots[-1], 0.0))
    return segs


def week_of_pairs(n=CLOCK_SIZES[-1]):
    """n clock pairs one every 5 s with a wandering rate (±20 ppm, deterministic), newest first."""
    pairs, real = [], 1_767_225_600_000_000_000
    for k in range(n):
        pairs.append((3_600_000_000_000 + k * 5_000_000_000, real))
        real += 5_000_000_000 + (k * 7919) % 200_000 - 100_000
    pairs.reverse()                                                      # not in order
    return pairs


def bench_week_merge(work):
    """`straggler merge` of one node store whose clock_pairs hold a week (one every 5 s) beside 10k
    events: the merge as a user runs it, under its default deadline."""
    facts = synth.write_nodes(os.path.join(work, "week"), synth.SynthSpec(nodes=1, straggler=0, events=10_000))
    path, node = facts["files"][0]["path"], facts["files"][0]["node"]
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM clock_pairs")
    conn.executemany("INSERT INTO clock_pairs (node, mono_ns, real_ns) VALUES (?, ?, ?)",
                     [(node, m, r) for m, r in week_of_pairs()])
    conn.commit()
    conn.close()
    secs, summary = timed(merge.merge, [path], os.path.join(work, "week.db"))
    alignment = summary["clock_alignment"][node]
    assert alignment["clock_pairs"] == CLOCK_SIZES[-1] and alignment["aligned"]
    return dict(pairs=alignment["clock_pairs"], events=summary["rows"]["events"], merge_s=round(secs, 2),
                deadline_s=merge.DEFAULT_DEADLINE_S)


def bench_clock(sizes):
    """clock_segments against the per-knot baseline on pairs one every 5 s with a wandering rate."""
    runs = []
    for n in sizes:
        pairs = week_of_pairs(n)
        secs, segs = timed(clock.clock_segments, pairs)
        run = dict(pairs=n, clock_segments_s=round(secs, 4), per_knot_s=None, speedup=None)
        if n <= CLOCK_BASELINE_MAX:
            base_s, base = timed(clock_segments_per_knot, pairs)
            assert base == segs
            run.update(per_knot_s=round(base_s, 3), speedup=round(base_s / secs, 1))
        runs.append(run)
    return runs


def scan_baseline(db):
    conn = sqlite3.connect(db)
    t = time.perf_counter()
    conn.execute("SELECT node, op, COUNT(*), AVG(duration) FROM events GROUP BY node, op").fetchall()
    secs = time.perf_counter() - t
    conn.close()
    return secs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k and 300k events instead of 1M and 10M")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    sizes = [100_000, 300_000] if args.quick else [1_000_000, 10_000_000]
    work = tempfile.mkdtemp(prefix="bench-analysis-", dir=args.work)
    results = dict(quick=args.quick, sizes=sizes, runs=[], machine=dict(cpus=os.cpu_count()))
    rows = []
    results["clock"] = bench_clock(CLOCK_SIZES)
    try:
        results["week_merge"] = bench_week_merge(work)
        for size in sizes:
            synth_s, facts = make_nodes(work, size, size)
            paths = [f["path"] for f in facts["files"]]
            n_events = facts["events"]
            cluster = os.path.join(work, f"cluster-{size}.db")
            base_s, index_s, base_n = baseline_insert_select(paths, os.path.join(work, "baseline.db"))
            merge_s, summary = timed(merge.merge, paths, cluster, offsets=facts["offsets"])
            assert summary["rows"]["events"] == base_n == n_events
            scan_s = scan_baseline(cluster)
            explain_s, report = timed(explain.explain_db, cluster)
            run = dict(events=n_events, synth_s=round(synth_s, 2),
                       merge_s=round(merge_s, 2), merge_rows_per_s=int(n_events / merge_s),
                       insert_select_s=round(base_s, 2), insert_select_rows_per_s=int(n_events / base_s),
                       merge_vs_insert_select=round(merge_s / base_s, 2),
                       insert_select_plus_indexes_s=round(base_s + index_s, 2),
                       merge_vs_insert_select_plus_indexes=round(merge_s / (base_s + index_s), 2),
                       explain_s=round(explain_s, 2), scan_baseline_s=round(scan_s, 2),
                       explain_vs_scan=round(explain_s / scan_s, 2), straggler=report.straggler,
                       cluster_db_bytes=os.path.getsize(cluster))
            results["runs"].append(run)
            rows.append((f"{n_events:,}", run["merge_s"], run["merge_rows_per_s"], run["insert_select_rows_per_s"],
                         run["merge_vs_insert_select"], run["merge_vs_insert_select_plus_indexes"], run["explain_s"],
                         run["scan_baseline_s"], report.straggler))
            print(f"[{n_events:,} events] synth {synth_s:.1f} s, merge {merge_s:.1f} s, explain {explain_s:.1f} s",
                  file=sys.stderr, flush=True)
            for p in paths:
                os.unlink(p)
            os.unlink(cluster)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "analysis.json").write_text(json.dumps(results, indent=2) + "\n")
    print(render.table_text(["events", "merge s", "merge rows/s", "INSERT…SELECT rows/s", "merge ÷ INSERT…SELECT",
                             "merge ÷ (INSERT…SELECT + indexes)", "explain s", "GROUP BY scan s", "straggler"],
                            rows, title="merge and explain"), end="")
    print(render.table_text(["clock pairs", "clock_segments s", "per-knot mono_to_real s", "speed-up"],
                            [(f"{r['pairs']:,}", r["clock_segments_s"], r["per_knot_s"] or "not run",
                              r["speedup"] or "") for r in results["clock"]],
                            title="clock alignment: segments from a node's clock pairs"), end="")
    week = results["week_merge"]
    print(f"a week of clock pairs ({week['pairs']:,}) and {week['events']:,} events merged in {week['merge_s']:g} s "
          f"(deadline {week['deadline_s']:g} s)")
    print(f"results: {out_dir / 'analysis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
