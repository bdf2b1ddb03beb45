"""Faults on a schedule in one real synchronous job, for explain's episodes: several faults at their
own times (late in the job, from its first step, coming and going), on one rank or on all the ranks of
a host, with one or more ranks per host — on the harness's test bed and agents
(straggler_lab.demo.harness.SyncJobHarness):

    run = run_schedule(h, [Phase("cpu-hog", host=1, start_s=10, end_s=25, on_s=1, off_s=1),
                           Phase("gpu-slow", rank=2, start_s=35, end_s=50, size=1.5),
                           Phase("cpu-hog", host=0, start_s=60, end_s=None)], seconds=74)
    report = diagnose(run, out_dir)        # explain with its DEFAULTS: it is not told when the faults were
    for p in run.phases: score_phase(run, p, report)   # -> (node right, cause right, start within 5 s)

Each phase checks itself: its slowdown is the job's mean step time over the phase (its first second
left out) against the job's clean steps (outside every phase); a phase that did not slow the job by
its `valid_slowdown` is invalid (its expectations are not asserted; the reason says so).

CPU pinning: while a cpu-hog phase runs, the ranks it targets are pinned (every thread) to the CPU its
hog burns on, and unpinned when it ends; no rank is pinned otherwise (the scheduler moves the others
off a busy core, as ranks on other machines would not share it). Every wait is bounded; everything
started is stopped by process group.
"""
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from straggler.analysis.explain.episodes import EpisodeOptions

from .harness import (CPU_HOG_NICE_BELOW_JOB, CPU_HOG_THREADS, EXPECTED_CAUSE, GPU_FACTOR, HOST_MS, IO_SELF_MB,
                      IMBALANCE, MORE_WORK_GRID, MORE_WORK_KERNELS, PAUSE_EVERY_S, PAUSE_MS, SELF_THREADS, VALID_SLOWDOWN, HarnessError, _write_atomic, read_steps, stop_procs)

CONTROL_FAULTS = {"self-contention": ("threads", SELF_THREADS), "host-compute": ("host_ms", HOST_MS),
                  "gpu-slow": ("gpu_factor", GPU_FACTOR), "io-self": ("io_mb", IO_SELF_MB),
                  # a stand-in GPU that says why (SyncJobHarness(gpus=True)): its kernels slower and its NVML
                  "gpu-throttled": ("gpu_factor", GPU_FACTOR), "gpu-errors": ("gpu_factor", GPU_FACTOR),
                  # the work itself: more kernels every step (a heavier pipeline stage, a longer batch)
                  "more-work": ("kernels", MORE_WORK_KERNELS),
                  # the same kernels on bigger grids every step (a longer batch, a longer sequence)
                  "bigger-batch": ("grid", MORE_WORK_GRID),
                  # a full garbage collection every PAUSE_EVERY_S: a pause of host compute
                  "pause": ("pause_ms", PAUSE_MS),
                  # every rank's file: a different rank does IMBALANCE times the work at each step (uneven batches)
                  "imbalance": ("imbalance", IMBALANCE)}
ALL_RANKS = ("imbalance",)   # faults of the whole job: every rank's control file
# the other lines of a fault's control file: what a stand-in GPU says of itself, a pause's rhythm
DEVICE_LINES = {"gpu-throttled": "throttle=thermal\n", "pause": f"pause_every_s={PAUSE_EVERY_S:g}\n"}
EXPECTED = {"gpu-throttled": "gpu-throttled", "gpu-errors": "gpu-errors", "more-work": "more-work",
            "bigger-batch": "more-work",
            "pause": "host-compute", "imbalance": None}
SKIP_S = 1.0                 # a phase's first second and the job's first seconds are not steady state
WARMUP_SKIP_S = 3.0
START_TOLERANCE_S = 5.0      # an episode starts within this of its phase
JOB_MARGIN_NS = 2_000_000_000    # the job's span explain is asked about, with a little of its start and end

# explain names a rank the others wait for at least min_gap of their time more (EpisodeOptions): a job
# 1 / (1 - min_gap) slower, x1.18. An episode's mean gap, over the dozen one-second bins of a test-bed
# phase, varies by about GAP_NOISE from run to run on the test bed's shared cores (its bins spread by 0.07
# to 0.08), so a phase that near the threshold is found in some runs and not in others: no case either way.
# A small fault counts from SMALL_VALID, clear of that noise.
GAP_NOISE = 0.05
SMALL_VALID = round(1 / (1 - EpisodeOptions().min_gap - GAP_NOISE), 2)


@dataclass
class Phase:
    """One fault of a schedule. Either `rank` (a rank's own fault, or a hog on its host) or `host` (a
    hog on that host: all its ranks). start_s/end_s from the job's start (end None: to its end);
    on_s/off_s: it comes and goes; size: the fault's size (the harness's default for the kind)."""
    fault: str
    rank: int = None
    host: int = None
    start_s: float = 0.0
    end_s: float = None
    on_s: float = None
    off_s: float = None
    size: float = None
    valid_slowdown: float = VALID_SLOWDOWN
    expect_named: bool = True          # False: a fault every GPU shares alike, which names nobody
    # filled by the run:
    t_on_ns: int = None
    t_off_ns: int = None
    slowdown: float = None
    valid: bool = False
    reason: str = ""
    node: str = None
    ranks: list = field(default_factory=list)

    @property
    def expected_cause(self):
        return EXPECTED[self.fault] if self.fault in EXPECTED else EXPECTED_CAUSE[self.fault]


@dataclass
class ScheduleRun:
    phases: list
    style: str
    t_start_ns: int
    t_end_ns: int
    clean_step_ms: float
    agent_dbs: dict
    rank_nodes: dict
    case_dir: str
    real_minus_mono_ns: int           # this machine's realtime minus monotonic (the test bed's hosts share it)


def _layout(hosts, ranks_per_host):
    world = len(hosts) * ranks_per_host
    return world, {r: hosts[r // ranks_per_host] for r in range(world)}


def _targets(phase, ranks_per_host, world):
    if phase.fault in ALL_RANKS:
        return list(range(world))
    if phase.host is not None:
        return [r for r in range(world) if r // ranks_per_host == phase.host]
    return [phase.rank]


def run_schedule(h, phases, seconds, ranks_per_host=1, name=None, ready_timeout_s=120.0, kernel_us=None,
                 hosts=None):
    """Run one job of `seconds` with `phases` applied at their times; -> ScheduleRun. kernel_us: the
    stand-in GPU's time per kernel (more: fewer steps a second, less CPU per rank — for several ranks per
    host on a small machine). hosts: how many of the test bed's hosts the job runs on (default: all) —
    fewer ranks in all on a small machine, where a hog pinned to one core must not starve the other
    hosts' ranks too (they share the machine's cores)."""
    case_dir, stop_file = h.new_case(name or f"{{n:02d}}-schedule-{h.style}")
    world, node_of = _layout(h.hosts[:hosts] if hosts else h.hosts, ranks_per_host)
    for p in phases:
        p.ranks = _targets(p, ranks_per_host, world)
        p.node = node_of[p.ranks[0]]
    controls = {r: h.control_path(r, case_dir) for r in range(world)}
    at_start = {r: "" for r in range(world)}
    for p in phases:               # a fault from the first step is in the control file before the job starts
        if p.fault in CONTROL_FAULTS and p.start_s <= 0 and p.on_s is None:
            for r in p.ranks:
                at_start[r] += _control_line(p)
    for r, path in controls.items():
        _write_atomic(path, at_start[r])
    port = 29640 + 500 + h.n_cases
    root = f"{h.bed.hosts[h.hosts[0]]}:{port}"
    hogs = []
    try:
        for r in range(world):
            argv = [sys.executable, "-m", "straggler_lab.demo.syncjob", "--rank", r, "--world", world,
                    "--local-rank", r % ranks_per_host, "--root", root, "--style", h.style,
                    "--standin-dir", h.standin_dir, "--seconds", seconds + ready_timeout_s + 60,
                    "--stop-file", stop_file, "--log", case_dir / f"steps-rank{r}.csv", "--control", controls[r],
                    "--job-dir", case_dir]
            if h.job_nice is not None:
                argv += ["--autogroup-nice", h.job_nice]
            env = dict(h.job_env(node_of[r]), **({"STRAGGLER_STANDIN_KERNEL_US": str(kernel_us)} if kernel_us else {}))
            h.job.append(h._popen("rank", node_of[r], argv, case_dir / f"rank{r}.log", env=env))
        _wait_ready(h, case_dir, world, ready_timeout_s)
        t_start = time.monotonic_ns()
        real_minus_mono = time.time_ns() - time.monotonic_ns()
        end = t_start + int(seconds * 1e9)
        pending = sorted(phases, key=lambda p: p.start_s)
        active = []
        while True:
            h._check_job(case_dir)
            now = time.monotonic_ns()
            if now >= end:
                break
            for p in list(pending):
                if now >= t_start + int(max(0.0, p.start_s) * 1e9):
                    pending.remove(p)
                    p.t_on_ns = now if p.start_s > 0 else t_start
                    hogs += _apply(h, p, controls, at_start, case_dir, seconds)
                    active.append(p)
            for p in list(active):
                if p.end_s is not None and now >= t_start + int(p.end_s * 1e9):
                    active.remove(p)
                    p.t_off_ns = now
                    hogs = _remove(h, p, controls, at_start, hogs, case_dir)
                elif p.fault in CONTROL_FAULTS and p.on_s:
                    _toggle(p, controls, at_start, now)
            time.sleep(0.05)
        for p in active:
            p.t_off_ns = time.monotonic_ns()
            hogs = _remove(h, p, controls, at_start, hogs, case_dir)
        h._stop_job(stop_file)
        t_end = time.monotonic_ns()
        h._wait_agents_wrote(t_end - 2_000_000_000)
    finally:
        if hogs:
            stop_procs(hogs, grace_s=10.0)
        for r, path in controls.items():
            _write_atomic(path, "")
        h._stop_job(stop_file)
    clean = _judge(case_dir, world, phases, t_start, t_end)
    return ScheduleRun(phases=phases, style=h.style, t_start_ns=t_start, t_end_ns=t_end, clean_step_ms=clean,
                       agent_dbs=dict(h.agent_dbs), rank_nodes=node_of, case_dir=str(case_dir),
                       real_minus_mono_ns=real_minus_mono)


def _control_line(p):
    key, default = CONTROL_FAULTS[p.fault]
    return f"{key}={p.size if p.size is not None else default}\n" + DEVICE_LINES.get(p.fault, "")


HOG_CPU = 0


def _rank_pids(case_dir, ranks):
    """The pids of the given ranks' processes (found by their step log on the command line)."""
    marks = {r: f"{case_dir}/steps-rank{r}.csv".encode() for r in ranks}
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        for r, mark in marks.items():
            if mark in cmdline and b"straggler_lab.demo.syncjob" in cmdline:
                out[r] = int(entry)
    return out


def _pin(case_dir, ranks, cpus):
    """Every thread of the ranks' processes on `cpus` (best effort: a thread may just have gone)."""
    for pid in _rank_pids(case_dir, ranks).values():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass


def _apply(h, p, controls, at_start, case_dir, seconds):
    if p.fault == "cpu-hog":
        _pin(case_dir, p.ranks, {HOG_CPU})
        argv = [sys.executable, "-m", "straggler_lab.demo.hogs", "cpu", "--threads", int(p.size or CPU_HOG_THREADS),
                "--cpu", HOG_CPU, "--nice", max(-20, (h.job_nice or 0) - CPU_HOG_NICE_BELOW_JOB),
                "--seconds", seconds + 60]
        if p.on_s:
            argv += ["--on-s", p.on_s, "--off-s", p.off_s or 0]
        return [h._popen("cpuhog", p.node, argv, case_dir / f"cpuhog-{p.node}-{p.start_s:g}.log")]
    if p.fault in CONTROL_FAULTS:
        if p.start_s > 0 or p.on_s:
            for r in p.ranks:
                _write_atomic(controls[r], at_start[r] + _control_line(p))
        if p.fault == "gpu-errors":      # the driver's word, as root writes it into the one kernel log
            with open("/dev/kmsg", "w") as kmsg:
                kmsg.write(f"<3>NVRM: Xid (PCI:{h.gpu_bus(p.node)}): 79, pid='<unknown>', name=<unknown>, "
                           f"GPU has fallen off the bus.\n")
        return []
    raise HarnessError(f"a schedule does not take the fault {p.fault!r}")


def _toggle(p, controls, at_start, now):
    cycle = p.on_s + (p.off_s or 0)
    on = ((now - p.t_on_ns) / 1e9) % cycle < p.on_s
    for r in p.ranks:
        want = at_start[r] + (_control_line(p) if on else "")
        try:
            if controls[r].read_text() != want:
                _write_atomic(controls[r], want)
        except OSError:
            _write_atomic(controls[r], want)


def _remove(h, p, controls, at_start, hogs, case_dir):
    if p.fault == "cpu-hog":
        mine = [x for x in hogs if x.host == p.node and x.kind == "cpuhog"]
        stop_procs(mine, grace_s=10.0)
        _pin(case_dir, p.ranks, set(range(os.cpu_count() or 1)))
        return [x for x in hogs if x not in mine]
    for r in p.ranks:
        at_start[r] = at_start[r].replace(_control_line(p), "", 1)
        _write_atomic(controls[r], at_start[r])
    return hogs


def _wait_ready(h, case_dir, world, timeout_s):
    deadline = time.monotonic() + timeout_s
    while True:
        h._check_job(case_dir)
        counts = [len(read_steps(case_dir / f"steps-rank{r}.csv")) for r in range(world)]
        if min(counts) >= 5 and h._agents_see_uprobes():
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"the job was not ready after {timeout_s:.0f}s: steps per rank {counts} (see {case_dir})")
        time.sleep(0.5)


def _judge(case_dir, world, phases, t_start, t_end):
    """Each phase's slowdown (its mean step time over the clean median) and validity; returns the clean
    median step time (ms). Steps are the slowest rank's: in lockstep the ranks' steps end together."""
    steps = {}
    for r in range(world):
        for t, ms in read_steps(case_dir / f"steps-rank{r}.csv"):
            steps.setdefault(r, []).append((t, ms))
    rows = [(t, ms) for r in steps for t, ms in steps[r]]
    skip = int(SKIP_S * 1e9)

    def in_any(t):
        return any(p.t_on_ns is not None and p.t_on_ns - skip <= t <= (p.t_off_ns or t_end) + 2 * skip
                   for p in phases)
    clean = [ms for t, ms in rows if t_start + int(WARMUP_SKIP_S * 1e9) < t <= t_end and not in_any(t)]
    clean_ms = statistics.median(clean) if clean else float("nan")
    for p in phases:
        if p.t_on_ns is None:
            p.valid, p.reason = False, "never applied"
            continue
        if clean_ms != clean_ms and p.start_s <= 0 and p.end_s is None:
            _judge_whole_job(p, case_dir, world, t_start, t_end)
            continue
        during = [ms for t, ms in rows if p.t_on_ns + skip < t <= (p.t_off_ns or t_end)]
        if not during or clean_ms != clean_ms:
            p.valid, p.reason = False, "no steps to compare (the job logged nothing in the phase or outside)"
            continue
        p.slowdown = statistics.mean(during) / clean_ms
        p.valid = p.slowdown >= p.valid_slowdown
        p.reason = (f"{p.fault} on {p.node}: the job x{p.slowdown:.2f}" +
                    ("" if p.valid else f", under the x{p.valid_slowdown:g} a valid phase needs"))
    return clean_ms


def _coll_ms(path):
    """[(t_end_mono_ns, step_ms, coll_done_ms)] of a step log: the collective's time until it is done (with
    collectives that only enqueue, the rank waits for its peers in the synchronize after the call)."""
    import csv
    out = []
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    out.append((int(row["t_end_mono_ns"]), float(row["step_ms"]), float(row["coll_done_ms"])))
                except (KeyError, TypeError, ValueError):
                    continue
    except OSError:
        pass
    return out


def _whole_job_slowdown(case_dir, world, t_start, t_end, ranks):
    """How much slower the whole job ran for `ranks` (a fault over the whole job has no clean steps to
    compare with): how much longer the other ranks wait for each allreduce to be done than they do is the
    time the job loses to them every step (it would run that much faster without it). -> (slowdown,
    lost_ms) or None without steps."""
    skip = int(WARMUP_SKIP_S * 1e9)
    logs = {r: [x for x in _coll_ms(Path(case_dir) / f"steps-rank{r}.csv") if t_start + skip < x[0] <= t_end]
            for r in range(world)}
    waits = {r: [c for _, _, c in rows] for r, rows in logs.items()}
    steps = [ms for rows in logs.values() for _, ms, _ in rows]
    mine = [statistics.median(waits[r]) for r in ranks if waits.get(r)]
    others = [statistics.median(w) for r, w in waits.items() if r not in ranks and w]
    if not mine or not others or not steps:
        return None
    lost_ms = max(0.0, statistics.median(others) - min(mine))
    step = statistics.median(steps)
    return step / max(1e-6, step - lost_ms), lost_ms


# A job with no fault checks itself too: a rank the others waited for all along (the shared cores can
# make one slower) holds the whole job back, and naming it is no phantom. A clean job is one that no rank
# held back by CLEAN_MAX or more: explain's threshold (min_gap) less the run-to-run noise (GAP_NOISE).
CLEAN_MAX = round(1 / (1 - EpisodeOptions().min_gap + GAP_NOISE), 2)


def clean_check(run):
    """Whether a job run without faults ran clean: (True, why) or (False, why), from its step logs."""
    world = len(run.rank_nodes)
    worst = None
    for r in range(world):
        found = _whole_job_slowdown(run.case_dir, world, run.t_start_ns, run.t_end_ns, [r])
        if found is not None and (worst is None or found[0] > worst[1]):
            worst = (r, found[0], found[1])
    if worst is None:
        return False, "no steps to compare (the job logged nothing)"
    r, slowdown, lost_ms = worst
    if slowdown >= CLEAN_MAX:
        return False, (f"not clean: the others waited {lost_ms:.1f} ms more per step for rank {r} all along, the "
                       f"job x{slowdown:.2f} (x{CLEAN_MAX:g} or more is no clean job)")
    return True, f"clean: no rank held the job back by x{CLEAN_MAX:g} (at most rank {r}, x{slowdown:.2f})"


def _judge_whole_job(p, case_dir, world, t_start, t_end):
    """A fault over the whole job: how much slower the job ran for its ranks (_whole_job_slowdown)."""
    found = _whole_job_slowdown(case_dir, world, t_start, t_end, p.ranks)
    if found is None:
        p.valid, p.reason = False, "no steps to compare (the job logged nothing)"
        return
    p.slowdown, lost_ms = found
    p.valid = p.slowdown >= p.valid_slowdown
    p.reason = (f"{p.fault} on {p.node} from the first step: the others wait {lost_ms:.1f} ms more per step, the "
                f"job x{p.slowdown:.2f}" + ("" if p.valid else f", under the x{p.valid_slowdown:g} a valid phase needs"))


def lost_truth(run, t_from_ns=None, t_to_ns=None):
    """What the job lost, by its own step logs, to its slowest rank at each step ending in [t_from, t_to]:
    the median of the ranks' waits for the step's allreduce to be done less the least (the ranks log the
    same step numbers) -> (seconds lost, steps)."""
    world = len(run.rank_nodes)
    by_step = {}
    for r in range(world):
        for step, (t, _, done) in enumerate(_coll_ms(Path(run.case_dir) / f"steps-rank{r}.csv")):
            if (t_from_ns is None or t >= t_from_ns) and (t_to_ns is None or t <= t_to_ns):
                by_step.setdefault(step, {})[r] = done
    lost_ms = sum(statistics.median(w.values()) - min(w.values()) for w in by_step.values() if len(w) == world)
    return lost_ms / 1e3, sum(1 for w in by_step.values() if len(w) == world)


def diagnose(run, out_dir, name="schedule", **explain_options):
    """explain with its defaults over the agents' stores merged (the real merge), over the job's span (the
    agents trace every job of the harness; a user asks about the job they ran): it is not told when the
    faults were. The job's span is on CLOCK_MONOTONIC, one bound for every node: the test bed's hosts share
    one kernel."""
    from straggler.analysis import explain
    from straggler.analysis.merge import merge
    from straggler.render.report import to_text
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    db = out_dir / f"{name}.db"
    if db.exists():
        db.unlink()
    merge(sorted(set(run.agent_dbs.values())), str(db))
    report = explain.explain_db(str(db), since_mono_ns=run.t_start_ns - JOB_MARGIN_NS,
                                until_mono_ns=run.t_end_ns + JOB_MARGIN_NS,
                                **explain_options)
    (out_dir / f"{name}-explain.txt").write_text(to_text(report, show_sql=False, width=140))
    return report


def episode_of(run, phase, report):
    """The report's episode of `phase`: on its node, overlapping its time (fleet time = realtime)."""
    on = phase.t_on_ns + run.real_minus_mono_ns
    off = (phase.t_off_ns or run.t_end_ns) + run.real_minus_mono_ns
    found = [e for e in report.episodes if phase.node in (e.get("nodes") or [e["node"]])
             and e["start_ns"] < off and e["end_ns"] > on]
    return max(found, key=lambda e: min(off, e["end_ns"]) - max(on, e["start_ns"]), default=None)


def score_phase(run, phase, report):
    """(node right, first cause right, start within START_TOLERANCE_S) of one phase's episode."""
    e = episode_of(run, phase, report)
    if e is None:
        return False, False, False
    top = max(e.get("causes") or [], key=lambda c: c["share"], default=None)
    cause_ok = top is not None and top["cause"] == phase.expected_cause
    on = phase.t_on_ns + run.real_minus_mono_ns
    if phase.start_s <= 0:           # from the first step: the episode starts with the job (its first summaries)
        start_ok = e["start_ns"] <= on + START_TOLERANCE_S * 1e9
    else:
        start_ok = abs(e["start_ns"] - on) <= START_TOLERANCE_S * 1e9
    return True, cause_ok, start_ok


def phantom_episodes(run, report):
    """Episodes that belong to no phase of their node that names one (a straggler named where there was
    no fault, or where every GPU shared the fault alike)."""
    out = []
    for e in report.episodes:
        nodes = e.get("nodes") or [e["node"]]
        if not any(p.node in nodes and p.expect_named and episode_of(run, p, report) is e
                   for p in run.phases if p.t_on_ns):
            out.append(e)
    return out


# ---------------------------------------------------------------- the CLI: one schedule, explained

SCENARIOS = {
    # README's episodes example: a fault that comes and goes, a short one, and one still going at the end
    "three-episodes": ([Phase("cpu-hog", host=1, start_s=10, end_s=24, on_s=1, off_s=1),
                        Phase("io-self", rank=2, start_s=34, end_s=46),
                        Phase("cpu-hog", host=0, start_s=56, end_s=None)], 70),
    "late": ([Phase("cpu-hog", host=0, start_s=50, end_s=None)], 70),
}


def main(argv=None):
    """python -m straggler_lab.demo.schedule [--scenario NAME] [--out DIR]: bring up the test bed, run one
    job with the scenario's faults at their times, explain it with its defaults, print each phase's check
    and score and the report's path, tear everything down."""
    import argparse

    from straggler_lab import testbed
    from .harness import SyncJobHarness
    p = argparse.ArgumentParser(prog="python -m straggler_lab.demo.schedule",
                                description="One real job with faults on a schedule, explained with explain's "
                                            "defaults (it is not told when the faults were).")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="three-episodes")
    p.add_argument("--out", default="/tmp/straggler-schedule", help="output directory (the merged store, the report)")
    p.add_argument("--testbed-id", type=int, default=242)
    p.add_argument("--style", choices=["blocking", "enqueue"], default="blocking")
    args = p.parse_args(argv)
    phases, seconds = SCENARIOS[args.scenario]
    lock = testbed.TestbedLock(args.testbed_id)
    if not lock.try_acquire():
        print(f"schedule: test bed id {args.testbed_id} is in use (pid {lock.holder()})", file=sys.stderr)
        return 2
    out = Path(args.out)
    bed = h = None
    rc = 0
    try:
        bed = testbed.up(hosts=4, dead=0, testbed_id=args.testbed_id, _lock_held=True)
        h = SyncJobHarness(bed, out, style=args.style)
        h.start_agents(extra_args=h.standin_lib_args())
        run = run_schedule(h, [Phase(**{k: getattr(q, k) for k in ("fault", "rank", "host", "start_s", "end_s",
                                                                    "on_s", "off_s", "size")}) for q in phases],
                           seconds=seconds, name=args.scenario)
        report = diagnose(run, out, args.scenario)
        for q in run.phases:
            node_ok, cause_ok, start_ok = score_phase(run, q, report)
            print(f"{q.fault:14s} {q.node}: {q.reason}; named {'yes' if node_ok else 'no'}, cause "
                  f"{'right' if cause_ok else 'wrong'}, start {'within' if start_ok else 'not within'} "
                  f"{START_TOLERANCE_S:g} s", flush=True)
            rc = rc or (0 if q.valid and node_ok else 1)
        print(f"explain's report: {out / (args.scenario + '-explain.txt')}; the merged store: "
              f"{out / (args.scenario + '.db')}", flush=True)
    except HarnessError as exc:
        print(f"schedule: error: {exc}", file=sys.stderr)
        rc = 1
    finally:
        try:
            if h is not None:
                h.close()
        finally:
            if bed is not None:
                testbed.down(bed.id, bed.state_dir, _lock_held=True)
            lock.release()
    return rc


if __name__ == "__main__":
    sys.exit(main())
