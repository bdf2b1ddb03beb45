"""`make demo`: the field case end to end, on the test bed of this machine.

Four SSH hosts gpu-node-01..04 (network namespaces, straggler_lab.testbed), the straggler agent
deployed and tracing on each with `ansible-playbook playbooks/trace.yml` (real SSH, eBPF,
mutual TLS, --scope netns since the hosts share one kernel), a real four-rank gloo training
job across them (straggler_lab.demo.trainer, its GPU work through the STAND-IN libcuda), a clean
warm-up, then a checkpoint writer on gpu-node-01 only; then the user's path: fleet_query.yml
with the SQL from the field, explain over the fleet, collect.yml into demo-output/ (cluster.db
and trace.pftrace for ui.perfetto.dev). Everything it started is stopped at the end, on Ctrl-C
and on failure too: it kills only the process groups it started and tears down its own test
bed id.

The phases are methods of `Demo`, so that tests/test_acceptance.py runs the same scenario
(shorter, and three variants on one shared test bed).

It must not hold any analysis logic: what the job's step log shows (every rank slowed down) is
the only number computed here; the finding comes from `straggler explain`.
"""
import argparse
import csv
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from straggler.errors import StragglerError
from straggler_lab import testbed

REPO_ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
FIELD_SQL = "SELECT node, source, count(*) AS cnt, avg(duration)/1000 AS avg_us FROM events GROUP BY node, source"
RANKS_SQL = "SELECT node, group_concat(DISTINCT rank) AS ranks FROM events WHERE rank IS NOT NULL GROUP BY node"
STRAGGLER_NODE = "gpu-node-01"
DEFAULT_TESTBED_ID = 42
MASTER_PORT = 29500
# The test bed shares one 2-core machine with whatever else runs on it (other users, CI). Each
# host's job runs in a session of its own, and so does gpu-node-01's checkpoint writer (a
# separate service, as measured on a 2-core test VM); all of them get the same, larger CPU share
# (autogroup nice) so that outside load does not drown the scenario: measured x1.1-1.2 at
# nice 0 under a load average of 5-10, x2.6-2.9 at nice -10. Between the job's sessions and
# the writer's it changes nothing: they keep equal weights.
JOB_AUTOGROUP_NICE = -10


class DemoError(RuntimeError):
    """A phase of the demo failed: one line, what and where to look."""


# ------------------------------------------------------------------------------ progress

class Progress:
    """Step lines with the elapsed time, for a person watching (and the same text in a log)."""

    def __init__(self, stream=None, log_path=None):
        self.t0 = time.monotonic()
        self.stream = stream or sys.stdout
        self.log = open(log_path, "a", buffering=1) if log_path else None
        self.step_no = 0

    def _emit(self, text):
        self.stream.write(text + "\n")
        self.stream.flush()
        if self.log:
            self.log.write(text + "\n")

    def elapsed(self):
        return time.monotonic() - self.t0

    def step(self, text):
        self.step_no += 1
        self._emit(f"\n[{self.elapsed():6.1f}s] {self.step_no}. {text}")

    def info(self, text):
        for line in str(text).rstrip("\n").split("\n"):
            self._emit(f"           {line}")

    def raw(self, text):
        self._emit(str(text).rstrip("\n"))

    def close(self):
        if self.log:
            self.log.close()
            self.log = None


# ------------------------------------------------------------------------------ results

@dataclass
class StepStats:
    """Per rank: mean step time before and while the checkpoint writer ran."""
    rows: list = field(default_factory=list)  # (rank, node, baseline_ms, during_ms, ratio, n_base, n_during)

    def table(self):
        return (["rank", "node", "ms/step before", "ms/step with writer", "slowdown"],
                [[r, n, f"{b:.1f}", f"{d:.1f}", f"×{x:.2f}"] for r, n, b, d, x, _, _ in self.rows])


@dataclass
class CommandResult:
    argv: list
    returncode: int
    output: str
    seconds: float
    log_path: Path


# ------------------------------------------------------------------------------ the demo

class Demo:
    """The field case on a running test bed `bed`, writing into `out_dir`.

    hosts: the live hosts that run the job (rank i on hosts[i]) and that the playbooks and
    explain address unless a phase is given other hosts (`limit`, `nodes`: e.g. with a dead one).
    Each phase raises DemoError with one line (and the command's log) when it fails."""

    def __init__(self, bed, out_dir, progress=None, hosts=None):
        self.bed = bed
        self.out = Path(out_dir).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = self.out / "logs"
        self.logs.mkdir(exist_ok=True)
        self.progress = progress or Progress()
        self.hosts = list(hosts or sorted(bed.hosts))
        self.pki_dir = self.out / "pki"
        self.job_procs = []       # Popen of each host's launcher (own session: killpg-able)
        self.job_dir = None
        self.t_writer_on = None
        self.t_job_stop = None
        self.n_runs = 0

    # ---------------------------------------------------------------- helpers
    def _env(self):
        env = self.bed.ansible_env()
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("ANSIBLE_FORCE_COLOR", "0")
        # the fleet summary table at the end of a play (the repository's ansible.cfg enables it too)
        env.setdefault("ANSIBLE_CALLBACKS_ENABLED", "straggler.fleet.summary")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def command(self, argv, name, timeout_s=300, ok_codes=(0,), show=None, env=None):
        """Run a controller command (bounded: killed after timeout_s), its output into
        logs/<name>.log; print progress (a playbook's task names, with the time) while it runs."""
        log_path = self.logs / f"{name}.log"
        t0 = time.monotonic()
        lines = []
        with open(log_path, "w") as log:
            log.write("$ " + shlex.join(str(a) for a in argv) + "\n")
            proc = subprocess.Popen([str(a) for a in argv], cwd=REPO_ROOT, env=env or self._env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)

            def pump():
                for line in proc.stdout:
                    log.write(line)
                    lines.append(line)
                    if show == "tasks" and line.startswith("TASK ["):
                        self.progress.info(f"[{time.monotonic() - t0:5.1f}s] {line.strip().rstrip('*').strip()}")
            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise DemoError(f"{Path(str(argv[0])).name} {' '.join(str(a) for a in argv[1:2])} did not finish in "
                                f"{timeout_s:.0f}s (stopped): see {log_path}") from None
            except KeyboardInterrupt:
                _kill_group(proc)
                raise
            finally:
                reader.join(timeout=10)
                proc.stdout.close()
        result = CommandResult(argv, proc.returncode, "".join(lines), time.monotonic() - t0, log_path)
        if result.returncode not in ok_codes:
            tail = "".join(lines[-15:])
            raise DemoError(f"{Path(str(argv[0])).name} {' '.join(str(a) for a in argv[1:3])} exited {result.returncode} "
                            f"after {result.seconds:.0f}s: see {log_path}\n{tail}")
        return result

    def playbook(self, playbook, name, extra_vars=None, limit=None, ok_codes=(0,), timeout_s=300, show="tasks",
                 typed=()):
        """ansible-playbook playbooks/<playbook> against the test bed's inventory. The demo's own
        settings go as one JSON -e; `typed`: more arguments as a user types them (-e sql=...)."""
        argv = [VENV_BIN / "ansible-playbook", f"playbooks/{playbook}", "-i", self.bed.inventory]
        if limit:
            argv += ["--limit", ":".join(limit)]
        if extra_vars:
            argv += ["-e", json.dumps(extra_vars)]
        argv += list(typed)
        return self.command(argv, name, timeout_s=timeout_s, ok_codes=ok_codes, show=show)

    def pki_vars(self, **more):
        """The fleet CA and the wheel cache in this demo's own directories (self-contained: nothing
        under ~/.local/share/straggler), and the playbook variables `more`."""
        return dict(straggler_pki_dir=str(self.pki_dir), straggler_agent_wheel_cache=str(REPO_ROOT / "build" / "wheels"),
                    **more)

    def tls_args(self):
        return ["--ca", self.pki_dir / "ca.crt", "--cert", self.pki_dir / "controller.crt",
                "--key", self.pki_dir / "controller.key"]

    # ---------------------------------------------------------------- phases
    def deploy_agents(self, limit=None, ok_codes=(0,)):
        """trace.yml: PKI, agent install, tracing started (--scope netns) on every host."""
        return self.playbook("trace.yml", "trace", self.pki_vars(straggler_agent_scope="netns"), limit=limit or self.hosts,
                             ok_codes=ok_codes, timeout_s=420)

    def stop_agents(self, limit=None):
        return self.playbook("trace.yml", "trace-stop", self.pki_vars(straggler_agent_state="stopped", straggler_agent_scope="netns"),
                             limit=limit or self.hosts, ok_codes=(0, 4), timeout_s=180, show=None)

    def start_job(self, seconds, with_writer, writer_seconds=None, trainer_args="",
                  launcher_args=("--autogroup-nice", str(JOB_AUTOGROUP_NICE))):
        """torchrun on every host (one rank each) through that host's launcher, in the host's
        namespaces. Only gpu-node-01's trainer is pinned (CPU 0), beside its writer."""
        self.n_runs += 1
        self.job_dir = self.out / f"job-{self.n_runs}"
        if self.job_dir.exists():
            shutil.rmtree(self.job_dir)
        self.job_dir.mkdir(parents=True)
        self.stop_file = self.job_dir / "STOP"
        self.writer_trigger = self.job_dir / "START-WRITER"
        self.with_writer = with_writer
        self.t_writer_on = None
        from straggler_lab.standin import build_standin
        build_standin(self.out / "standin")  # once here, not by four ranks at the same time
        master = self.bed.hosts[self.hosts[0]]
        for rank, name in enumerate(self.hosts):
            targs = f"--seconds {seconds} --stop-file {self.stop_file} --standin-dir {self.out / 'standin'} {trainer_args}"
            argv = [sys.executable, "-m", "straggler_lab.demo.node", "--rank", str(rank), "--nnodes", str(len(self.hosts)),
                    "--master-addr", master, "--master-port", str(MASTER_PORT), "--ifname", "eth0",
                    "--job-dir", str(self.job_dir), "--max-seconds", str(seconds + 120), "--stop-file", str(self.stop_file)]
            if name == STRAGGLER_NODE:
                targs += " --pin-cpu 0"
                if with_writer:
                    argv += ["--writer-trigger", str(self.writer_trigger), "--writer-cpu", "0",
                             "--writer-seconds", str(writer_seconds or seconds)]
            argv += list(launcher_args) + ["--trainer-args", targs]
            log = open(self.job_dir / f"{name}.log", "w")
            try:
                proc = self.bed.popen(name, argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, cwd=str(REPO_ROOT),
                                      env=dict(os.environ, PYTHONPATH=str(REPO_ROOT / "agent")))
            finally:
                log.close()
            self.job_procs.append(proc)

    def wait_for_steps(self, min_steps=20, timeout_s=120):
        """Wait (bounded) until every rank has logged `min_steps` steps; fail with the logs' tail."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            counts = self.step_counts()
            if len(counts) == len(self.hosts) and min(counts.values()) >= min_steps:
                return counts
            dead = [p for p in self.job_procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        tails = []
        for name in self.hosts:
            path = self.job_dir / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            tails.append(f"--- {name}: " + " | ".join(text.strip().splitlines()[-3:]))
        raise DemoError(f"the training job did not reach {min_steps} steps on every rank (counts {self.step_counts()}): "
                        f"see {self.job_dir}/*.log\n" + "\n".join(tails))

    def step_counts(self):
        counts = {}
        for path in self.job_dir.glob("steps-rank*.csv"):
            with open(path) as f:
                counts[path.name] = max(0, sum(1 for _ in f) - 1)
        return counts

    def start_writer(self):
        self.t_writer_on = time.time()
        self.writer_trigger.touch()

    def stop_job(self, timeout_s=30):
        """The stop file first (the ranks agree to stop), then TERM/KILL of what is left."""
        if self.job_dir is not None and self.job_procs:
            self.t_job_stop = time.time()
            self.stop_file.touch()
        deadline = time.monotonic() + timeout_s
        for proc in self.job_procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.job_procs:
            if proc.poll() is None:
                _kill_group(proc)
        self.job_procs = []

    def step_stats(self, skip_s=3.0):
        """Mean step time per rank before the writer started and while it ran."""
        stats = StepStats()
        t_on = self.t_writer_on
        for path in sorted(self.job_dir.glob("steps-rank*.csv")):
            with open(path) as f:
                rows = list(csv.DictReader(f))
            if not rows:
                continue
            t_first = float(rows[0]["t_end_unix"])
            t_end = self.t_job_stop or float(rows[-1]["t_end_unix"])
            split = t_on if t_on else (t_first + t_end) / 2
            base = [float(r["step_ms"]) for r in rows if t_first + skip_s < float(r["t_end_unix"]) < split]
            during = [float(r["step_ms"]) for r in rows if split + skip_s < float(r["t_end_unix"]) <= t_end]
            if base and during:
                b, d = sum(base) / len(base), sum(during) / len(during)
                stats.rows.append((int(rows[0]["rank"]), rows[0]["node"], b, d, d / b, len(base), len(during)))
        stats.rows.sort()
        return stats

    def fleet_query(self, sql=FIELD_SQL, limit=None, name="fleet-query", ok_codes=(0,)):
        """fleet_query.yml with the SQL; returns (command result, the results file as a dict)."""
        results_dir = self.out / "results"
        before = set(results_dir.glob("*.json")) if results_dir.exists() else set()
        result = self.playbook("fleet_query.yml", name, self.pki_vars(straggler_results_dir=str(results_dir)),
                               limit=limit or self.hosts, ok_codes=ok_codes, timeout_s=180, show=None,
                               typed=("-e", f"sql={sql}"))       # as users type it: -e sql="SELECT ..."
        new = sorted(set(results_dir.glob("*.json")) - before)
        if not new:
            raise DemoError(f"fleet_query.yml wrote no results file into {results_dir}: see {result.log_path}")
        return result, json.loads(new[-1].read_text())

    def explain(self, nodes=None, name="explain"):
        """`straggler explain --nodes …` over HTTPS with the controller's client certificate:
        the text report, and the JSON one (returned as a dict)."""
        nodes = nodes or self.hosts
        spec = ",".join(f"{self.bed.all_hosts[n]}:7433" for n in nodes)
        base = [VENV_BIN / "straggler", "explain", "--nodes", spec] + self.tls_args()
        text = self.command(base + ["--no-sql"], name, timeout_s=120, ok_codes=(0, 1, 3, 4))
        js = self.command(base + ["--json"], f"{name}-json", timeout_s=120, ok_codes=(0, 1, 3, 4))
        report = _json_from_output(js.output)
        (self.logs / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
        return text, report

    def collect(self, limit=None, ok_codes=(0,), name="collect"):
        return self.playbook("collect.yml", name, self.pki_vars(), limit=limit or self.hosts,
                             ok_codes=ok_codes, timeout_s=240, show=None, typed=("-e", f"out={self.out}"))


def _json_from_output(text):
    """The JSON document in a command's output (which may have log lines around it)."""
    start = text.find("{")
    end = text.rfind("}")
    if start < 0 or end < start:
        raise DemoError(f"no JSON in the output: {text[-300:]}")
    return json.loads(text[start:end + 1])


def _kill_group(proc, grace_s=5.0):
    """TERM, then KILL, the process group of a child we started in its own session."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    if pgid != proc.pid:  # not a group leader we made: only the process itself
        proc.terminate()
    else:
        with _suppress():
            os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with _suppress():
            os.killpg(pgid, signal.SIGKILL) if pgid == proc.pid else proc.kill()
        with _suppress():
            proc.wait(timeout=5)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], (ProcessLookupError, PermissionError, subprocess.TimeoutExpired))


# ------------------------------------------------------------------------------ the CLI

def build_arg_parser():
    p = argparse.ArgumentParser(prog="python -m straggler_lab.demo.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO_ROOT / "demo-output"), help="output directory (default demo-output/)")
    p.add_argument("--testbed-id", type=int, default=int(os.environ.get("STRAGGLER_DEMO_TESTBED_ID", DEFAULT_TESTBED_ID)),
                   help=f"test bed id (subnet 10.213.<id>.0/24; default {DEFAULT_TESTBED_ID} or $STRAGGLER_DEMO_TESTBED_ID)")
    p.add_argument("--warmup-s", type=float, default=16.0, help="clean steps before the checkpoint writer starts")
    p.add_argument("--straggle-s", type=float, default=40.0, help="how long the writer runs before the queries")
    p.add_argument("--no-writer", action="store_true", help="the control run: no checkpoint writer (no straggler)")
    p.add_argument("--keep-up", action="store_true", help="leave the test bed and agents up at the end (to explore)")
    return p


def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    out = Path(args.out).resolve()
    _clean_output(out)
    progress = Progress(log_path=out / "demo.log")
    lock = testbed.TestbedLock(args.testbed_id)
    if not lock.try_acquire():
        print(f"demo: error: test bed id {args.testbed_id} is in use by another session (pid {lock.holder()}): "
              f"set STRAGGLER_DEMO_TESTBED_ID to a free id", file=sys.stderr)
        return 2

    def on_term(signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C cleans up, even if started with SIGINT ignored
    bed = demo = None
    rc = 1
    try:
        progress.step(f"Test bed: four hosts gpu-node-01..04 in network namespaces "
                      f"(id {args.testbed_id}, 10.213.{args.testbed_id}.0/24, each with its own sshd)")
        bed = testbed.up(hosts=4, dead=0, testbed_id=args.testbed_id, _lock_held=True)
        progress.info(f"inventory {bed.inventory}")
        for name, addr in bed.hosts.items():
            progress.info(f"{name}  {addr}")
        demo = Demo(bed, out, progress)
        rc = run_story(demo, args)
    except KeyboardInterrupt:
        progress.raw("\ninterrupted: cleaning up (the job, the agents, the test bed)")
        rc = 130
    except (DemoError, testbed.TestbedError, StragglerError) as exc:
        progress.raw(f"\ndemo: error: {exc}")
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave hosts behind
        try:
            if demo is not None:
                demo.stop_job()
            if bed is not None and not args.keep_up:
                progress.step("Tear down: the job, the agents (with their hosts) and the test bed")
                teardown_testbed(testbed, bed, progress)
            elif bed is not None:
                progress.info(f"left up (--keep-up): ANSIBLE_CONFIG={bed.ansible_cfg}; "
                              f"tear down with: .venv/bin/python -m straggler_lab.testbed down --id {bed.id}")
        finally:
            lock.release()
            progress.raw(f"\ndemo finished in {progress.elapsed():.0f}s (exit {rc}); full log: {out / 'demo.log'}, "
                         f"each command's output: {out / 'logs'}/")
            progress.close()
    return rc


def _clean_output(out):
    """Remove what an earlier run of the demo wrote (only the demo's own names)."""
    for stale in ("cluster.db", "trace.json", "trace.pftrace", "explain.json", "explain.md", "logs", "demo.log", "nodes", "results"):
        path = out / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for old_job in out.glob("job-*"):
        shutil.rmtree(old_job)
    out.mkdir(parents=True, exist_ok=True)


def teardown_testbed(testbed, bed, progress, attempts=6, pause_s=10.0):
    """testbed down, retried (bounded): an agent that detaches its probes can take a while to
    exit, even after SIGKILL (uninterruptible in the kernel); the test bed refuses to vanish
    while processes of its hosts remain."""
    for attempt in range(1, attempts + 1):
        try:
            testbed.down(bed.id, bed.state_dir, _lock_held=True)
            break
        except testbed.TestbedError as exc:
            if attempt == attempts:
                raise
            progress.info(f"not yet: {exc}; again in {pause_s:.0f}s")
            time.sleep(pause_s)
    left = testbed.status(bed.id)
    progress.info(f"network namespaces left: {len(left['netns'])}, links left: {len(left['links'])}")


def run_story(demo, args):
    p = demo.progress
    p.step("ansible-playbook playbooks/trace.yml -e straggler_agent_scope=netns   (fleet CA + mTLS certificates, agent install, eBPF tracing)")
    result = demo.deploy_agents()
    p.info(_recap(result.output))
    p.info(f"trace.yml done in {result.seconds:.0f}s")

    p.step("Training job: torchrun on each host, one rank each (gloo all-reduce every step); "
           "GPU work through the STAND-IN libcuda (no GPU here)")
    total = args.warmup_s + (0 if args.no_writer else args.straggle_s) + 120
    demo.start_job(seconds=total, with_writer=not args.no_writer, writer_seconds=args.straggle_s + 60)
    demo.wait_for_steps(min_steps=20)
    p.info(f"all 4 ranks stepping; clean warm-up for {args.warmup_s:.0f}s")
    _sleep_with_progress(p, args.warmup_s, demo)
    if not args.no_writer:
        p.step(f"Checkpoint writer on {STRAGGLER_NODE} only (3 zlib threads + fsync, ~100 MB per checkpoint, "
               f"on the same CPU as its trainer) for {args.straggle_s:.0f}s")
        demo.start_writer()
        _sleep_with_progress(p, args.straggle_s, demo)

    p.step("Stop the job; each rank's own step log says: the whole job slowed down, every rank alike")
    demo.stop_job()
    stats = demo.step_stats()
    from straggler.render import table_text
    p.raw(table_text(*stats.table()))
    p.info("which node? nothing in the step times says: the job is synchronous. The agents' stores do:")

    p.step(f'ansible-playbook playbooks/fleet_query.yml -e sql="{FIELD_SQL}"')
    result, _ = demo.fleet_query()
    p.raw(_table_part(result.output))

    p.step("straggler explain --nodes <the 4 agents, port 7433> --ca/--cert/--key <the controller's client certificate>")
    text, report = demo.explain()
    p.raw(_strip_command_line(text.output))
    p.info(f"the SQL behind every number: {demo.logs / 'explain.json'} (and demo-output/explain.md after collect)")

    p.step("ansible-playbook playbooks/collect.yml -e out=demo-output   (the air-gapped path: snapshots over SSH, "
           "merge, explain, Perfetto export)")
    result = demo.collect()
    p.info(_recap(result.output))
    for name in ("cluster.db", "trace.pftrace", "explain.md"):
        path = demo.out / name
        p.info(f"{path}  ({_size(path.stat().st_size)})" if path.exists() else f"{path}: MISSING")
    p.info("open the timeline: https://ui.perfetto.dev → 'Open trace file' → demo-output/trace.pftrace "
           "(one process per node in rank order; the straggler's findings on its 'findings (explain)' track)")
    p.info("ask your own questions: sqlite3 demo-output/cluster.db \"" + FIELD_SQL + "\"")
    if not args.no_writer and report.get("straggler") != STRAGGLER_NODE:
        p.raw(f"\ndemo: the fleet explain named {report.get('straggler')!r}, not {STRAGGLER_NODE}: "
              f"the machine may be too busy for the scenario (see the step times above)")
        return 3
    return 0


def _size(n_bytes):
    return f"{n_bytes / 1e6:.1f} MB" if n_bytes >= 1e6 else f"{n_bytes / 1e3:.1f} kB"


def _strip_command_line(output):
    return output.split("\n", 1)[1] if output.startswith("$ ") else output


def _sleep_with_progress(progress, seconds, demo, every_s=10.0):
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(every_s, left))
        dead = [p for p in demo.job_procs if p.poll() is not None]
        if dead:
            raise DemoError(f"the training job ended early: see {demo.job_dir}/*.log")
        counts = demo.step_counts()
        progress.info(f"[{progress.elapsed():6.1f}s] steps per rank: {', '.join(str(counts[k]) for k in sorted(counts))}")


def _recap(output):
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("PLAY RECAP"):
            return "\n".join(l for l in lines[i:] if l.strip())
    return "\n".join(lines[-8:])


def _table_part(output):
    """The playbook's output from its first table line on (the callback's summary)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("┏", "+", "|", "node ")) or "node" in line and "source" in line:
            return "\n".join(lines[max(0, i - 1):])
    return "\n".join(lines[-40:])


if __name__ == "__main__":
    sys.exit(main())
