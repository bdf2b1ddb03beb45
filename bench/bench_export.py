"""Timeline export: Perfetto's native protobuf trace (.pftrace) against the Chrome JSON export of the
same database, measured in the same run.

For each size (1M and 10M events; `--quick`: 100k and 300k) a synthetic four-node cluster database
(straggler_lab.synth, scenario io_cpu, merged and clock-aligned) is exported in a fresh
subprocess per run, formats interleaved (json, perfetto, json, perfetto, ...) so that both see the
same machine: wall time, CPU time (user + system, its worker processes included), peak RSS
(ru_maxrss of the export or its largest worker) and the output's size. The .pftrace export runs its
default number of worker processes (one per node up to the CPUs: 2 on the 2-core VM).
Medians over --runs runs. A third subprocess per size only opens the database and counts its events
(the RSS floor). Targets (issue: timelines at cluster scale): the .pftrace at least 5x smaller than
the JSON, no slower, peak RSS under 300 MB.

Writes bench/results/export.json and prints a table.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import render  # noqa: E402

CHILD = r"""
import json, resource, sqlite3, sys, time
sys.path.insert(0, sys.argv[1])
fmt, db, out = sys.argv[2], sys.argv[3], sys.argv[4]
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
t, c = time.perf_counter(), cpu()
if fmt == "open":
    conn = sqlite3.connect("file:" + db + "?mode=ro", uri=True)
    n, size = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0], 0
else:
    from straggler.analysis.export import export_perfetto
    summary = export_perfetto(db, out, findings=False, fmt=fmt)
    n, size = summary["slices"], summary["bytes"]
print(json.dumps(dict(wall_s=time.perf_counter() - t, cpu_s=cpu() - c, slices=n, bytes=size,
                      jobs=summary.get("jobs", 1) if fmt != "open" else 0,
                      maxrss_kib=max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                     resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))))
"""
SYNTH = r"""
import sys
sys.path.insert(0, sys.argv[1])
from straggler_lab import synth
synth.write_cluster(sys.argv[2], synth.SynthSpec(scenario="io_cpu", events=int(sys.argv[3])), work_dir=sys.argv[4])
"""
TARGET_RATIO = 5.0
TARGET_RSS_MIB = 300


def child(fmt, db, out):
    res = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "agent"), fmt, db, out],
                         capture_output=True, text=True, timeout=7200)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k and 300k events instead of 1M and 10M")
    ap.add_argument("--sizes", help="comma-separated event counts (overrides the defaults)")
    ap.add_argument("--runs", type=int, default=None, help="runs per format (default 3, 1 for 10M events)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [100_000, 300_000] if args.quick else [1_000_000, 10_000_000])
    work = tempfile.mkdtemp(prefix="bench-export-", dir=args.work)
    results = dict(quick=args.quick, machine=dict(cpus=os.cpu_count()), sizes=[])
    rows = []
    try:
        for size in sizes:
            db = os.path.join(work, f"cluster-{size}.db")
            # in a child of its own: Linux carries a parent's peak RSS into the children it starts
            # (ru_maxrss survives fork and exec), so this process must stay small
            subprocess.run([sys.executable, "-c", SYNTH, str(REPO / "agent"), db, str(size), work], check=True,
                           timeout=7200)
            runs = args.runs or (1 if size >= 5_000_000 else 3)
            floor = child("open", db, "")
            by_fmt = {"json": [], "perfetto": []}
            for i in range(runs):
                for fmt, ext in (("json", "json"), ("perfetto", "pftrace")):
                    out = os.path.join(work, f"trace-{size}.{ext}")
                    by_fmt[fmt].append(child(fmt, db, out))
                    os.unlink(out)
                    print(f"[{size:,} events] run {i + 1}/{runs} {fmt}: {by_fmt[fmt][-1]['wall_s']:.1f} s",
                          file=sys.stderr, flush=True)
            j, p = by_fmt["json"], by_fmt["perfetto"]
            entry = dict(events=size, runs=runs, db_bytes=os.path.getsize(db), open_only_maxrss_kib=floor["maxrss_kib"],
                         bench_maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                         slices=p[0]["slices"],
                         json=dict(wall_s=round(median_of(j, "wall_s"), 2), cpu_s=round(median_of(j, "cpu_s"), 2),
                                   maxrss_kib=max(r["maxrss_kib"] for r in j), bytes=j[0]["bytes"]),
                         perfetto=dict(wall_s=round(median_of(p, "wall_s"), 2), cpu_s=round(median_of(p, "cpu_s"), 2),
                                       maxrss_kib=max(r["maxrss_kib"] for r in p), bytes=p[0]["bytes"]),
                         all_runs=by_fmt)
            entry["size_ratio"] = round(entry["json"]["bytes"] / entry["perfetto"]["bytes"], 1)
            entry["cpu_ratio"] = round(entry["perfetto"]["cpu_s"] / entry["json"]["cpu_s"], 2)
            entry["wall_ratio"] = round(entry["perfetto"]["wall_s"] / entry["json"]["wall_s"], 2)
            entry["jobs"] = p[0]["jobs"]
            entry["targets"] = dict(smaller_5x=entry["size_ratio"] >= TARGET_RATIO,
                                    not_slower=entry["wall_ratio"] <= 1.0,
                                    rss_under_300_mib=entry["perfetto"]["maxrss_kib"] < TARGET_RSS_MIB * 1024)
            results["sizes"].append(entry)
            for fmt in ("json", "perfetto"):
                e = entry[fmt]
                rows.append((f"{size:,}", fmt, e["wall_s"], e["cpu_s"], round(e["maxrss_kib"] / 1024, 1),
                             round(e["bytes"] / 1e6, 1),
                             f"{entry['size_ratio']}x smaller, wall x{entry['wall_ratio']}, CPU x{entry['cpu_ratio']} "
                             f"({entry['jobs']} jobs)" if fmt == "perfetto" else ""))
            os.unlink(db)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "export.json").write_text(json.dumps(results, indent=2) + "\n")
    print(render.table_text(["events", "format", "wall s (median)", "CPU s (median)", "peak RSS MiB", "MB",
                             "vs JSON"], rows, title="export: .pftrace vs Chrome JSON, same run"), end="")
    floor = [round(e["open_only_maxrss_kib"] / 1024, 1) for e in results["sizes"]]
    print(f"peak RSS of a process that only opens the database and counts its events (the floor): {floor} MiB")
    print(f"results: {out_dir / 'export.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
