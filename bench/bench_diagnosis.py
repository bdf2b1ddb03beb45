"""Accuracy of the diagnosis: every fault class x several runs on the synchronous-job harness
(straggler_lab.demo.harness: a real 4-rank job on the test bed, real agents, one real fault on one
rank), in both collective styles (blocking; enqueue = NCCL on a GPU, the wait in synchronize).

For each case: was it valid (the fault slowed the job >= 1.3x; invalid cases are counted apart,
never as right or wrong), was the node right (exactly the faulted node; nobody for the clean run
and the machine-wide load step), was the first cause class right. Writes
bench/results/diagnosis.json and prints the matrix. `--quick`: one run, blocking style only.

Needs root and eBPF (it brings up a test bed of its own, id 246, and tears it down).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import render  # noqa: E402
from straggler_lab.demo import harness as hz  # noqa: E402

TESTBED_ID = 246


def run_style(bed, out, style, faults, runs, log):
    rows = []
    h = hz.SyncJobHarness(bed, out / style, style=style)
    try:
        h.start_agents()
        for run in range(runs):
            for fault in faults:
                case = h.run_case(fault, rank=0, warmup_s=8.0, fault_s=12.0)
                row = dict(style=style, run=run, fault=fault, slowdown=round(case.slowdown, 2), valid=case.valid,
                           reason=case.reason)
                if case.valid:
                    report = hz.diagnose(case, out / style / "reports")
                    node_ok, cause_ok = hz.score(case, report)
                    causes = [(f.node, f.cause, round(f.share, 2)) for f in report.findings
                              if f.cause in set(hz.EXPECTED_CAUSE_ENQUEUE.values()) | set(hz.EXPECTED_CAUSE.values())]
                    row.update(node_ok=node_ok, cause_ok=cause_ok, stragglers=report.stragglers, causes=causes[:3])
                rows.append(row)
                log(f"{style:8s} run {run} {fault:16s} x{case.slowdown:.2f} valid={case.valid} "
                    f"node={row.get('node_ok')} cause={row.get('cause_ok')} {row.get('stragglers')} {row.get('causes')}")
    finally:
        h.close()
    return rows


def matrix(rows):
    out = []
    for style in sorted({r["style"] for r in rows}):
        for fault in hz.FAULTS:
            mine = [r for r in rows if r["style"] == style and r["fault"] == fault]
            if not mine:
                continue
            valid = [r for r in mine if r["valid"]]
            expected = (hz.EXPECTED_CAUSE_ENQUEUE if style == "enqueue" else hz.EXPECTED_CAUSE)[fault]
            out.append(dict(style=style, fault=fault, expected=expected or "no straggler",
                            runs=len(mine), valid=len(valid), node_right=sum(1 for r in valid if r["node_ok"]),
                            cause_right=sum(1 for r in valid if r["cause_ok"])))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.bench_diagnosis", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run, blocking style only")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--faults", default=",".join(hz.FAULTS))
    ap.add_argument("--styles", default="blocking,enqueue")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_diagnosis: needs root (test bed, eBPF): skipped", file=sys.stderr)
        return 0
    runs = 1 if args.quick else args.runs
    styles = ["blocking"] if args.quick else [s for s in args.styles.split(",") if s]
    faults = [f for f in args.faults.split(",") if f]
    from straggler_lab import testbed
    lock = testbed.TestbedLock(TESTBED_ID)
    if not lock.try_acquire():
        print(f"bench_diagnosis: test bed {TESTBED_ID} is in use (pid {lock.holder()})", file=sys.stderr)
        return 1
    out = Path(f"/tmp/straggler-bench-diagnosis-{os.getpid()}")
    started = time.monotonic()
    rows = []
    bed = None
    try:
        bed = testbed.up(hosts=4, dead=0, testbed_id=TESTBED_ID, _lock_held=True)
        for style in styles:
            rows += run_style(bed, out, style, faults, runs, lambda text: print(text, flush=True))
    finally:
        if bed is not None:
            testbed.down(bed.id, bed.state_dir, _lock_held=True)
        lock.release()
    table = matrix(rows)
    results = dict(quick=args.quick, runs=runs, styles=styles, seconds=round(time.monotonic() - started, 1),
                   machine=dict(cpus=os.cpu_count()), matrix=table, cases=rows)
    res_dir = REPO / "bench" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "diagnosis.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(render.table_text(["style", "fault", "expected", "runs", "valid", "node right", "cause right"],
                            [(m["style"], m["fault"], m["expected"], m["runs"], m["valid"],
                              f"{m['node_right']}/{m['valid']}", f"{m['cause_right']}/{m['valid']}") for m in table],
                            title="diagnosis accuracy (valid cases only)"))
    print(f"results: {res_dir / 'diagnosis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
