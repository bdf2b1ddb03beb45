"""Run the tests that could depend on this machine's clock or load under perturbations, and say
which perturbation breaks which test (docs/testing.md).

    .venv/bin/python scripts/perturb_tests.py [--fast] [--only TEXT] [--list] [--log-dir DIR]

Control: every test below, once, unperturbed: a test that fails there fails for another reason
(it is still reported, and marked so, under each perturbation it fails).
Clock: the tests that read CLOCK_MONOTONIC themselves (the watch and /metrics, the API's clock and
health, the writer's retention, merge/export alignment, the clock facts) run in a time namespace
(`unshare --time`) whose CLOCK_MONOTONIC and CLOCK_BOOTTIME read as if this machine had booted 2
minutes, 1 hour, 1.5 hours or 100000 s ago. eBPF's bpf_ktime_get_ns and processes started
outside the namespace are not shifted, so no eBPF test and no test-bed test is among them.
Load: the real-time tests (the stand-in synchronous job, the watch; without --fast also the agent's
eBPF tests) run while a CPU hog spins on the last core; the hog is started and ended here, by its
pid, and ends by itself after --hog-limit-s in any case.

Each perturbation is one pytest run; a line per perturbation (PASS/FAIL, counts, the failed tests),
then one summary line. Exit status 0 when every perturbation passed, 1 when any failed, 2 when the
perturbations cannot be made here (not root, no time namespaces). Each run's pytest output is kept
in --log-dir. This script must not change the machine's clocks or leave a process behind.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parent.parent
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
UNIT = "collections/ansible_collections/straggler/fleet/tests/unit/plugins"

# tests that read this machine's CLOCK_MONOTONIC (directly or through the code they test) and
# compare it with times they made or stored: a shifted clock must not change their outcome
CLOCK_TESTS = [
    "tests/test_watch.py",
    "tests/test_collection.py::test_watch_fails_the_task_at_the_straggler_and_check_mode_skips",
    "tests/test_api_server.py",
    "tests/test_agent_writer.py",
    "tests/test_devices_store.py",
    "tests/test_analysis_merge.py",
    "tests/test_analysis_export.py",
    "tests/test_export_pftrace.py",
    "tests/test_clock.py",
    "tests/test_fleet.py",
    f"{UNIT}/modules/test_clock_facts_module.py",
    f"{UNIT}/action/test_clock_facts_action.py",
    f"{UNIT}/action/test_merge_action.py",
]
# tests whose subjects run in real time: a busy machine must not change their outcome
LOAD_TESTS_FAST = ["tests/test_syncjob.py", "tests/test_watch.py"]
LOAD_TESTS_SLOW = ["tests/test_agent.py"]     # eBPF: the agent traces the stand-in job

# (name, this machine's age in seconds as the time namespace shows it at the start of the run)
CLOCK_AGES = [("booted 2 min ago", 120), ("booted 1 h ago", 3600), ("booted 1.5 h ago", 5400),
              ("booted 100000 s ago", 100_000)]


@dataclass
class Perturbation:
    name: str
    tests: list
    age_s: int | None = None       # run in a time namespace with this uptime
    hog: bool = False              # run beside a CPU hog on the last core
    control: bool = False          # the unperturbed run the others are compared with


@dataclass
class Outcome:
    perturbation: Perturbation
    ok: bool
    counts: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0


def perturbations(fast):
    load = LOAD_TESTS_FAST + ([] if fast else LOAD_TESTS_SLOW)
    every = list(dict.fromkeys(CLOCK_TESTS + load))
    return ([Perturbation("control: unperturbed", every, control=True)]
            + [Perturbation(f"clock: {name}", CLOCK_TESTS, age_s=age) for name, age in CLOCK_AGES]
            + [Perturbation(f"load: a CPU hog on core {os.cpu_count() - 1}", load, hog=True)])


def uptime_s():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def check_time_namespace():
    """None when a time namespace can be made here, else why not (one line)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "a time namespace needs root: run it as root"
    probe = subprocess.run(["unshare", "--time", "--fork", "--monotonic", "1", "--boottime", "1", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare --time failed ({probe.stderr.strip() or probe.returncode}): the kernel needs CONFIG_TIME_NS"
    return None


class Hog:
    """One process spinning on one core, for at most limit_s; ended by its pid."""

    CODE = ("import os, sys, time\n"
            "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
            "end = time.monotonic() + float(sys.argv[2])\n"
            "while time.monotonic() < end:\n"
            "    pass\n")

    def __init__(self, cpu, limit_s):
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, str(cpu), str(limit_s)],
                                     stdin=subprocess.DEVNULL)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def results_of(junit_path):
    """(counts, failed test ids) from pytest's JUnit XML, or None when it wrote none."""
    try:
        root = ElementTree.parse(junit_path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed = []
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(test_id)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failed


def run_one(p, python, log_dir, index, timeout_s, hog_limit_s):
    stem = f"{index:02d}-" + "".join(c if c.isalnum() else "-" for c in p.name).strip("-")
    junit, log = log_dir / f"{stem}.xml", log_dir / f"{stem}.log"
    tests = [t for t in p.tests if (REPO / t.split("::")[0]).exists()]
    argv = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", f"--junitxml={junit}", *tests]
    note = ""
    if p.age_s is not None:
        offset = int(p.age_s - uptime_s())
        argv = ["unshare", "--time", "--fork", "--monotonic", str(offset), "--boottime", str(offset), "--", *argv]
        note = f"offset {offset:+d} s"
    hog = Hog(os.cpu_count() - 1, hog_limit_s) if p.hog else None
    started = time.monotonic()
    try:
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
            except BaseException as exc:   # past its bound, or this script interrupted: end the run first
                os.killpg(proc.pid, signal.SIGKILL)   # the run's own process group: pytest and what it started
                proc.wait(timeout=30)
                if not isinstance(exc, subprocess.TimeoutExpired):
                    raise
                rc = None
    finally:
        if hog is not None:
            hog.stop()
    seconds = time.monotonic() - started
    found = results_of(junit)
    if rc is None:
        return Outcome(p, False, note=f"did not finish within {timeout_s} s (see {log})", seconds=seconds)
    if found is None or sum(found[0].values()) == 0:
        return Outcome(p, False, note=f"pytest exit {rc} and no test ran (see {log})", seconds=seconds)
    counts, failed = found
    ok = rc == 0 and not failed
    if not ok and not failed:
        note = f"pytest exit {rc} (see {log})"
    return Outcome(p, ok, counts, failed, note, seconds)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", action="store_true",
                        help="leave out the eBPF agent tests under load (the clock perturbations are all fast)")
    parser.add_argument("--only", metavar="TEXT", help="run only the perturbations whose name contains TEXT")
    parser.add_argument("--list", action="store_true", help="list the perturbations and their tests, run nothing")
    parser.add_argument("--log-dir", type=Path, help="where each run's pytest output goes (default: a new "
                                                     "directory under /tmp, named at the end)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="bound of one pytest run (default 1800)")
    parser.add_argument("--hog-limit-s", type=float, default=2400.0,
                        help="the hog ends by itself after this even if this script dies (default 2400)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    runs = [p for p in perturbations(args.fast) if not args.only or args.only in p.name or p.control]
    if args.list:
        for p in runs:
            print(f"{p.name}: {' '.join(p.tests)}")
        return 0
    if not runs:
        print(f"perturb_tests: error: no perturbation's name contains {args.only!r} (see --list)", file=sys.stderr)
        return 2
    if any(p.age_s is not None for p in runs):
        why = check_time_namespace()
        if why:
            print(f"perturb_tests: error: {why}", file=sys.stderr)
            return 2
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="straggler-perturb-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    outcomes, unperturbed_failures = [], set()
    for index, p in enumerate(runs, start=1):
        outcome = run_one(p, python, log_dir, index, args.timeout_s, args.hog_limit_s)
        outcomes.append(outcome)
        if p.control:
            unperturbed_failures = set(outcome.failed)
        counts = ", ".join(f"{n} {k}" for k, n in outcome.counts.items() if n)
        extra = f"; {outcome.note}" if outcome.note else ""
        print(f"{'PASS' if outcome.ok else 'FAIL'}  {p.name}: {counts or 'no result'} in {outcome.seconds:.0f} s{extra}",
              flush=True)
        for test_id in outcome.failed:
            also = " (fails unperturbed too)" if not p.control and test_id in unperturbed_failures else ""
            print(f"        failed: {test_id}{also}", flush=True)
    bad = [o for o in outcomes if not o.ok]
    summary = f"perturb_tests: {len(outcomes) - len(bad)} of {len(outcomes)} runs passed"
    if bad:
        summary += "; failed: " + "; ".join(f"{o.perturbation.name} ({why_failed(o, unperturbed_failures)})" for o in bad)
    print(f"{summary} (logs: {log_dir})")
    return 1 if bad else 0


def why_failed(outcome, unperturbed_failures):
    if not outcome.failed:
        return outcome.note
    if outcome.perturbation.control:
        return f"{len(outcome.failed)} tests"
    new = len(set(outcome.failed) - unperturbed_failures)
    return f"{len(outcome.failed)} tests, {new} of them only when perturbed"


if __name__ == "__main__":
    sys.exit(main())
