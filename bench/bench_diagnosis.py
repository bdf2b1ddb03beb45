"""Accuracy of the diagnosis, explain with its DEFAULTS (never told when the fault was): every fault class,
and every shape of fault in time, x several runs on the synchronous-job harness (straggler_lab.demo.harness
and .schedule: a real 4-rank job on the test bed, real agents, real faults), in both collective styles
(blocking; enqueue = NCCL on a GPU, the wait in synchronize).

Fault classes (one fault on one rank after a clean warm-up) and shapes: late (a CPU hog in the job's last
12 s), intermittent (1 s on / 1 s off), from the first step (host compute), small (about x1.2), two ranks
per node with one slow GPU, two ranks per node with a node-wide CPU hog, one rank doing more work every
step (1.5x the kernels), one rank pausing 300 ms every 2 s, and the clean job; and, on stand-in GPUs read
through NVML beside an idle spare GPU per host, one GPU throttled all along (enqueue style).
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
NET_RANK = 2
NET_ALL_ALONG = "net-slow, all along"


def run_style(bed, out, style, faults, runs, log):
    rows = []
    h = hz.SyncJobHarness(bed, out / style, style=style, standin_links=True)
    try:
        h.start_agents(extra_args=h.standin_lib_args())
        cases = [(fault, fault, False) for fault in faults]
        if "net-slow" in faults:           # a link slow from the job's first step (after a clean case: its measure)
            cases.append((NET_ALL_ALONG, "net-slow", True))
        for run in range(runs):
            for name, fault, from_start in cases:
                # a link's fault on a spoke of the stand-in NCCL's star (a slow hub looks like a slow fabric)
                rank = NET_RANK if fault.startswith("net-") else 0
                if from_start:
                    case = h.run_case(fault, rank=rank, fault_s=20.0, from_start=True)
                else:
                    case = h.run_case(fault, rank=rank, warmup_s=8.0, fault_s=12.0)
                row = dict(style=style, run=run, fault=name, slowdown=round(case.slowdown, 2), valid=case.valid,
                           reason=case.reason)
                if case.valid:
                    report = hz.diagnose(case, out / style / "reports")
                    node_ok, cause_ok = hz.score(case, report)
                    causes = [(f.node, f.cause, round(f.share, 2)) for f in report.findings
                              if f.cause in set(hz.EXPECTED_CAUSE_ENQUEUE.values()) | set(hz.EXPECTED_CAUSE.values())]
                    row.update(node_ok=node_ok, cause_ok=cause_ok, stragglers=report.stragglers, causes=causes[:3])
                rows.append(row)
                _drop_merged(out / style / "reports")
                log(f"{style:8s} run {run} {name:16s} x{case.slowdown:.2f} valid={case.valid} "
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
        # a CPU hog already there when the job's steps are first timed (the job slow all along)
        "hog-from-first-step": (lambda: [sc.Phase("cpu-hog", host=0, start_s=0, end_s=None, size=4,
                                                  valid_slowdown=sc.SMALL_VALID)], 24, {}),
        # moving imbalance: a different rank does 3x the work at each step; nobody is named, its cost is reported
        "imbalance": (lambda: [sc.Phase("imbalance", start_s=6, end_s=None, expect_named=False)], 30,
                      dict(kernel_us=1200, hosts=3)),
        # the work itself (GPU-bound steps, three ranks: see tests/test_diagnosis.py): one rank launching 1.5x
        # the kernels every step, and one rank pausing 300 ms every 2 s (a full garbage collection)
        "more-work": (lambda: [sc.Phase("more-work", rank=2, start_s=0, end_s=None, valid_slowdown=sc.SMALL_VALID)],
                      24, dict(kernel_us=1200, hosts=3)),
        "more-work-mid-job": (lambda: [sc.Phase("more-work", rank=2, start_s=8, end_s=22,
                                                valid_slowdown=sc.SMALL_VALID)], 30, dict(kernel_us=1200, hosts=3)),
        # a longer batch: the same kernels on 1.5x the blocks each, every step
        "bigger-batch": (lambda: [sc.Phase("bigger-batch", rank=2, start_s=0, end_s=None, valid_slowdown=sc.SMALL_VALID)],
                         24, dict(kernel_us=1200, hosts=3)),
        "pauses": (lambda: [sc.Phase("pause", rank=1, start_s=6, end_s=None, valid_slowdown=1.06)], 40,
                   dict(kernel_us=1200, hosts=3)),
        "clean": (lambda: [], 24, {}),
    }


# behind collectives that only enqueue every rank waits in synchronize alike: a slower GPU, or more work on one
# rank's GPU, cannot be told from the calls; without the GPU's own word nobody can be named
HIDDEN_IN_ENQUEUE = ("gpu-slow", "more-work", "bigger-batch")
# ... where a warning, naming nobody, points at the one rank that launches more work per collective
MORE_WORK_SHAPES = ("more-work", "bigger-batch")


def device_shapes():
    """The GPU's own word, on stand-in GPUs read through NVML (enqueue style), each host with a spare GPU
    that idles: name -> (phases factory, seconds)."""
    return {"gpu-throttled-all-along": (lambda: [sc.Phase("gpu-throttled", rank=2, start_s=0, end_s=None, size=3)], 30)}


def run_shapes(bed, out, style, runs, log, names=None):
    rows = []
    h = hz.SyncJobHarness(bed, out / f"{style}-shapes", style=style)
    try:
        h.start_agents(extra_args=h.standin_lib_args())
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
                               phantoms=phantoms if clean else 0, **lost_check(result, report))
                    if clean:
                        row.update(node_ok=not report.episodes, cause_ok=not report.episodes, start_ok=True)
                    rows.append(row)
                    log(f"{style:8s} run {run} {name:18s} no fault, {why}: {len(report.episodes)} episode(s) named "
                        f"{[e['node'] for e in report.episodes]} phantoms={phantoms}")
                lost = lost_check(result, report)
                for p in result.phases:
                    expected = p.expected_cause
                    if style == "enqueue" and p.fault in HIDDEN_IN_ENQUEUE:
                        expected = "device-wide"       # no device evidence here: nobody can be named
                        if p.fault in MORE_WORK_SHAPES:     # ... and a warning points at the rank doing more work
                            expected = "pointed at"
                    row = dict(style=style, run=run, fault=name, expected=expected or "no straggler", valid=p.valid,
                               reason=p.reason, slowdown=None if p.slowdown is None else round(p.slowdown, 2),
                               phantoms=phantoms, **lost)
                    if p.valid and not p.expect_named:     # the job's own fault (imbalance): nobody, its cost said
                        said = any(f.cause == "imbalance" for f in report.findings) or not lost.get("lost_measured")
                        row.update(node_ok=not report.episodes, cause_ok=said, start_ok=True)
                    elif p.valid:
                        if expected in ("device-wide", "pointed at"):
                            none = sc.episode_of(result, p, report) is None
                            pointed = any(f.severity == "warning" and f.node is None
                                          and str(f.numbers.get("heavier_rank", "")).startswith(f"{p.node} ")
                                          for f in report.findings)
                            # a slower GPU is pointed at by nobody; more work, by the warning
                            row.update(node_ok=none, cause_ok=none and pointed == (expected == "pointed at"),
                                       start_ok=True)
                        else:
                            row.update(zip(("node_ok", "cause_ok", "start_ok"), sc.score_phase(result, p, report)))
                    rows.append(row)
                    log(f"{style:8s} run {run} {name:18s} {row.get('reason', '')} node={row.get('node_ok')} "
                        f"cause={row.get('cause_ok')} start={row.get('start_ok')} phantoms={phantoms}")
    finally:
        h.close()
    return rows


LOST_TOLERANCE = 0.15         # the time lost explain reports, within this share of what the job's own logs say


def lost_check(result, report):
    """explain's what-if (the job's time lost at its sync points) against the truth the ranks' own step logs
    give over the same sync points: {lost_measured, lost_s, lost_truth_s, lost_ok}."""
    w = report.whatif or {}
    if not w.get("measured"):
        return dict(lost_measured=False)
    rmm = result.real_minus_mono_ns
    truth, _ = sc.lost_truth(result, w["first_ns"] - rmm, w["last_ns"] - rmm)
    ok = abs(w["lost_s"] - truth) <= max(LOST_TOLERANCE * truth, 0.01 * w["span_s"])
    return dict(lost_measured=True, lost_s=w["lost_s"], lost_truth_s=round(truth, 2), lost_ok=ok)


def run_devices(bed, out, runs, log):
    """device_shapes(), enqueue style, on a harness whose agents read the stand-in GPUs through NVML."""
    rows = []
    h = hz.SyncJobHarness(bed, out / "devices", style="enqueue", gpus=True, spare_gpus=1)
    try:
        h.start_agents(extra_args=h.standin_lib_args())
        for run in range(runs):
            for name, (make, seconds) in device_shapes().items():
                result = sc.run_schedule(h, make(), seconds, name=f"{name}-{run}")
                report = sc.diagnose(result, out / "devices" / "reports", f"{name}-{run}")
                phantoms = len(sc.phantom_episodes(result, report))
                _drop_merged(out / "devices" / "reports")
                for p in result.phases:
                    row = dict(style="enqueue", run=run, fault=name, expected=p.expected_cause, valid=p.valid,
                               reason=p.reason, slowdown=None if p.slowdown is None else round(p.slowdown, 2),
                               phantoms=phantoms, **lost_check(result, report))
                    if p.valid:
                        row.update(zip(("node_ok", "cause_ok", "start_ok"), sc.score_phase(result, p, report)))
                    rows.append(row)
                    log(f"enqueue  run {run} {name:18s} {p.reason} node={row.get('node_ok')} cause={row.get('cause_ok')} "
                        f"start={row.get('start_ok')} phantoms={phantoms}")
    finally:
        h.close()
    return rows


def matrix(rows):
    out = []
    for style in sorted({r["style"] for r in rows}):
        for fault in hz.FAULTS + (NET_ALL_ALONG,):
            mine = [r for r in rows if r["style"] == style and r["fault"] == fault]
            if not mine:
                continue
            valid = [r for r in mine if r["valid"]]
            expected = (hz.EXPECTED_CAUSE_ENQUEUE if style == "enqueue" else hz.EXPECTED_CAUSE)[
                "net-slow" if fault == NET_ALL_ALONG else fault]
            out.append(dict(style=style, fault=fault, expected=expected or "no straggler",
                            runs=len(mine), valid=len(valid), node_right=sum(1 for r in valid if r["node_ok"]),
                            cause_right=sum(1 for r in valid if r["cause_ok"])))
        for name in list(shapes()) + list(device_shapes()):
            mine = [r for r in rows if r["style"] == style and r["fault"] == name]
            if not mine:
                continue
            valid = [r for r in mine if r["valid"]]
            measured = [r for r in valid if r.get("lost_measured")]
            out.append(dict(style=style, fault=name, expected=mine[0]["expected"], runs=len(mine), valid=len(valid),
                            node_right=sum(1 for r in valid if r["node_ok"]),
                            cause_right=sum(1 for r in valid if r["cause_ok"]),
                            start_right=sum(1 for r in valid if r.get("start_ok")),
                            phantoms=sum(r.get("phantoms", 0) for r in mine),
                            lost_measured=len(measured), lost_right=sum(1 for r in measured if r["lost_ok"])))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.bench_diagnosis", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run, blocking style only")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--faults", default=",".join(hz.FAULTS))
    ap.add_argument("--styles", default="blocking,enqueue")
    ap.add_argument("--shapes", default=",".join(shapes()), help="the shapes in time to run ('' for none)")
    ap.add_argument("--devices", default=",".join(device_shapes()),
                    help="the shapes of the GPU's own word to run, enqueue style ('' for none)")
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
        if [n for n in args.devices.split(",") if n] and "enqueue" in styles:
            rows += run_devices(bed, out, runs, lambda text: print(text, flush=True))
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
                             "start within 5 s", "named without a fault", "time lost within 15 %"],
                            [(m["style"], m["fault"], m["expected"], m["runs"], m["valid"],
                              f"{m['node_right']}/{m['valid']}", f"{m['cause_right']}/{m['valid']}",
                              f"{m['start_right']}/{m['valid']}" if "start_right" in m else "",
                              m.get("phantoms", ""),
                              f"{m['lost_right']}/{m['lost_measured']}" if m.get("lost_measured") else "")
                             for m in table],
                            title="diagnosis accuracy, explain with its defaults (valid cases only)"))
    print(f"results: {res_dir / 'diagnosis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
