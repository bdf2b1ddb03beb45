"""Accuracy of the diagnosis, explain with its DEFAULTS (never told when the fault was): every fault class,
and every shape of fault in time, x several runs on the synchronous-job harness (straggler_lab.demo.harness
and .schedule: a real 4-rank job on the test bed, real agents, real faults), in both collective styles
(blocking; enqueue = NCCL on a GPU, the wait in synchronize).

Fault classes (one fault on one rank after a clean warm-up) and shapes: late (a CPU hog in the job's last
12 s), intermittent (1 s on / 1 s off), from the first step (host compute), small (about x1.2), two ranks
per node with one slow GPU, two ranks per node with a node-wide CPU hog, and the clean job.
For each case or phase: was it valid (the fault slowed the job; the clean job: no rank held it back all
along, schedule.clean_check; invalid ones are counted apart, never as right or wrong), was the node right (its episode on exactly that node; nobody for the clean job, the
machine-wide load step, and a slow GPU behind enqueued collectives without device evidence), was the first
cause class right, did the episode start within 5 s, and episodes named where there was no fault. Writes
bench/results/diagnosis.json and prints the matrix. `--quick`: one run, blocking style only.

Needs root and eBPF (it brings up a test bed of its own, id 246, and tears it down).
"""
import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from straggler import render  # noqa: E402
from straggler_lab.demo import harness as hz, schedule as sc  # noqa: E402

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
                _drop_merged(out / style / "reports")
                log(f"{style:8s} run {run} {fault:16s} x{case.slowdown:.2f} valid={case.valid} "
                    f"node={row.get('node_ok')} cause={row.get('cause_ok')} {row.get('stragglers')} {row.get('causes')}")
    finally:
        h.close()
    return rows


def _drop_merged(reports):
    """Each case's merged store holds the agents' whole history (they trace every case): once explained,
    only its report is kept (42 of them had filled 68 GB)."""
    for db in Path(reports).glob("*.db"):
        db.unlink()


def shapes():
    """name -> (phases factory, seconds, keyword arguments of run_schedule)."""
    return {
        "late": (lambda: [sc.Phase("cpu-hog", host=0, start_s=40, end_s=None)], 52, {}),
        "intermittent": (lambda: [sc.Phase("cpu-hog", host=1, start_s=8, end_s=22, on_s=1, off_s=1)], 30, {}),
        # small faults are valid from SMALL_VALID (x1.25): explain's threshold (x1.18) clear of the noise
        "from-first-step": (lambda: [sc.Phase("host-compute", rank=3, start_s=0, end_s=None, size=7,
                                              valid_slowdown=sc.SMALL_VALID)], 24, {}),
        "small": (lambda: [sc.Phase("host-compute", rank=2, start_s=8, end_s=22, size=7,
                                    valid_slowdown=sc.SMALL_VALID)], 30, {}),
        "8-ranks-one-gpu": (lambda: [sc.Phase("gpu-slow", rank=5, start_s=8, end_s=22)], 30,
                            dict(ranks_per_host=2, kernel_us=1200)),
        # two hosts of two ranks: with eight ranks on two shared cores a hog pinned to one core starves every
        # host's ranks alike (no node is then slower than the others)
        "2x2-ranks-node-hog": (lambda: [sc.Phase("cpu-hog", host=1, start_s=8, end_s=22)], 30,
                               dict(ranks_per_host=2, hosts=2)),
        "clean": (lambda: [], 24, {}),
    }


def run_shapes(bed, out, style, runs, log, names=None):
    rows = []
    h = hz.SyncJobHarness(bed, out / f"{style}-shapes", style=style)
    try:
        h.start_agents()
        for run in range(runs):
            for name, (make, seconds, kw) in shapes().items():
                if names and name not in names:
                    continue
                phases = make()
                result = sc.run_schedule(h, phases, seconds, name=f"{name}-{run}", **kw)
                report = sc.diagnose(result, out / f"{style}-shapes" / "reports", f"{name}-{run}")
                phantoms = len(sc.phantom_episodes(result, report))
                _drop_merged(out / f"{style}-shapes" / "reports")
                if not phases:             # a clean job checks itself too: did some rank hold it back all along?
                    clean, why = sc.clean_check(result)
                    row = dict(style=style, run=run, fault=name, expected="no straggler", valid=clean, reason=why,
                               phantoms=phantoms if clean else 0)
                    if clean:
                        row.update(node_ok=not report.episodes, cause_ok=not report.episodes, start_ok=True)
                    rows.append(row)
                    log(f"{style:8s} run {run} {name:18s} no fault, {why}: {len(report.episodes)} episode(s) named "
                        f"{[e['node'] for e in report.episodes]} phantoms={phantoms}")
                for p in result.phases:
                    expected = p.expected_cause
                    if style == "enqueue" and p.fault == "gpu-slow":
                        expected = "device-wide"       # no device evidence here: nobody can be named
                    row = dict(style=style, run=run, fault=name, expected=expected, valid=p.valid, reason=p.reason,
                               slowdown=None if p.slowdown is None else round(p.slowdown, 2), phantoms=phantoms)
                    if p.valid:
                        if expected == "device-wide":
                            none = sc.episode_of(result, p, report) is None
                            row.update(node_ok=none, cause_ok=none, start_ok=True)
                        else:
                            row.update(zip(("node_ok", "cause_ok", "start_ok"), sc.score_phase(result, p, report)))
                    rows.append(row)
                    log(f"{style:8s} run {run} {name:18s} {row.get('reason', '')} node={row.get('node_ok')} "
                        f"cause={row.get('cause_ok')} start={row.get('start_ok')} phantoms={phantoms}")
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
        for name in shapes():
            mine = [r for r in rows if r["style"] == style and r["fault"] == name]
            if not mine:
                continue
            valid = [r for r in mine if r["valid"]]
            out.append(dict(style=style, fault=name, expected=mine[0]["expected"], runs=len(mine), valid=len(valid),
                            node_right=sum(1 for r in valid if r["node_ok"]),
                            cause_right=sum(1 for r in valid if r["cause_ok"]),
                            start_right=sum(1 for r in valid if r.get("start_ok")),
                            phantoms=sum(r.get("phantoms", 0) for r in mine)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.bench_diagnosis", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run, blocking style only")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--faults", default=",".join(hz.FAULTS))
    ap.add_argument("--styles", default="blocking,enqueue")
    ap.add_argument("--shapes", default=",".join(shapes()), help="the shapes in time to run ('' for none)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_diagnosis: needs root (test bed, eBPF): skipped", file=sys.stderr)
        return 0
    runs = 1 if args.quick else args.runs
    styles = ["blocking"] if args.quick else [s for s in args.styles.split(",") if s]
    faults = [f for f in args.faults.split(",") if f]
    from straggler_lab import testbed
    # a SIGTERM (a CI timeout, kill PID) ends it like ^C: the harness and the test bed are taken down
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    lock = testbed.TestbedLock(TESTBED_ID)
    if not lock.try_acquire():
        print(f"bench_diagnosis: test bed {TESTBED_ID} is in use (pid {lock.holder()})", file=sys.stderr)
        return 1
    out = Path(f"/tmp/straggler-bench-diagnosis-{os.getpid()}")
    started = time.monotonic()
    rows = []
    bed = None
    complete = False
    try:
        bed = testbed.up(hosts=4, dead=0, testbed_id=TESTBED_ID, _lock_held=True)
        for style in styles:
            rows += run_style(bed, out, style, faults, runs, lambda text: print(text, flush=True))
            names = [n for n in args.shapes.split(",") if n]
            if names:
                rows += run_shapes(bed, out, style, runs, lambda text: print(text, flush=True), names)
        complete = True
    finally:
        if bed is not None:
            testbed.down(bed.id, bed.state_dir, _lock_held=True)
        lock.release()
        # what was measured is kept, an interrupted run marked as one (complete: false)
        table = matrix(rows)
        results = dict(quick=args.quick, runs=runs, styles=styles, complete=complete,
                       seconds=round(time.monotonic() - started, 1), machine=dict(cpus=os.cpu_count()), matrix=table,
                       cases=rows)
        res_dir = REPO / "bench" / "results"
        res_dir.mkdir(parents=True, exist_ok=True)
        (res_dir / "diagnosis.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(render.table_text(["style", "fault or shape", "expected", "runs", "valid", "node right", "cause right",
                             "start within 5 s", "named without a fault"],
                            [(m["style"], m["fault"], m["expected"], m["runs"], m["valid"],
                              f"{m['node_right']}/{m['valid']}", f"{m['cause_right']}/{m['valid']}",
                              f"{m['start_right']}/{m['valid']}" if "start_right" in m else "",
                              m.get("phantoms", "")) for m in table],
                            title="diagnosis accuracy, explain with its defaults (valid cases only)"))
    print(f"results: {res_dir / 'diagnosis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
