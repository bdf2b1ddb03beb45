"""A real synchronous job with ONE real fault on one rank, over a running test bed, for the
diagnosis tests: did the agents' data find the straggler?

    from straggler_lab.demo.harness import SyncJobHarness
    h = SyncJobHarness(bed, out_dir)             # bed: a straggler_lab.testbed Testbed (gpu-node-01..04)
    h.start_agents()                             # `straggler trace --scope netns` on every host
    result = h.run_case("host-compute", rank=0)  # -> CaseResult (valid: the fault did slow the job)
    ... the agents' databases: result.agent_dbs[host], times comparable with result.t_fault_ns ...
    h.close()                                    # the job, the fault processes, the agents

The job is straggler_lab.demo.syncjob, one rank per host (rank i on hosts[i]; the faulted rank pinned
to CPU 0, the others not pinned: see cpu_of),
its collectives real (over TCP through rank 0, in the stand-in libnccl), so a slow rank makes
every rank wait. All the hosts share one kernel: CLOCK_MONOTONIC is the same in every
namespace, so the case's times (time.monotonic_ns()) compare directly with the events' `ts`.

Faults (FAULTS), applied to the straggler rank's host for fault_s after a clean warm-up:
  none             nothing (the control case)
  cpu-hog          a process `cpuhog` on the straggler's host: CPU_HOG_THREADS spinning threads
                   pinned to the rank's CPU, at a higher priority than the trainer (nice, of its
                   threads and of its session's autogroup, CPU_HOG_NICE_BELOW_JOB below the job's)
  self-contention  the rank's own process starts SELF_THREADS spinning threads (control file)
  host-compute     HOST_MS more ms of host compute per step (control file)
  gpu-slow         its kernels take GPU_FACTOR x their device time (control file, read by the stand-in)
  io-self          IO_SELF_MB written + fdatasync'ed per step by the rank itself (control file)
  io-other         a process `diskhog` on its host (DISK_HOG_THREADS writers of DISK_HOG_CHUNK_MB,
                   O_DIRECT + fdatasync, on the file system of the job dir) while the rank writes
                   IO_OTHER_MB + fdatasync per step for the whole case, warm-up included
  net-slow         the straggler's host's link throttled both ways (a `tbf` qdisc of link_rate on its
                   eth0 and on the bridge's end of its veth): a link that trained down, a congested
                   uplink — its collectives' bytes really cross it
  net-link         net-slow, and the host's link says it trained down: a STAND-IN sysfs tree per host
                   (standin_links=True; the agents read it by --sysfs-root) shows its eth0 at
                   LINK_DOWN_MBPS of LINK_MBPS while the tbf throttles it for real
  net-slow-all     every host's link throttled alike (link_rate each): a fabric slow everywhere, no node's
  load-all         a `cpuhog` on EVERY host (LOAD_ALL_THREADS thread each, unpinned, at the job's own
                   priority): a machine-wide load step, every node alike
The ranks run at autogroup nice JOB_NICE (each leads a session of its own), like the demo's job,
so that load from outside the test does not drown the case.
The hosts share the machine's 2 cores: the faulted rank is pinned to CPU 0 and the others are not
(in load-all nobody is pinned, so the load is the same for every node),
so when a fault takes CPU 0 (a pinned hog) the scheduler moves them to CPU 1 and it does not also
slow a healthy rank on another "host" (a test-bed artefact a real fleet does not have).
After a case the harness waits (bounded) until every agent has written the case's last interval,
so the stores hold the whole fault window (an agent's writes lag under a disk hog).
Processes in the hosts run in sessions of their own and are stopped by process group; close()
leaves nothing behind. Every wait is bounded.
"""
import argparse
import csv
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_STRAGGLER_BIN = REPO_ROOT / ".venv" / "bin" / "straggler"
BASE_PORT = 29640            # rank 0's port: BASE_PORT + the case number (no reuse within a harness)
STEP_SKIP_S = 2.0            # the first seconds of the warm-up and of the fault window are not counted
JOB_GAP_S = 4.0              # a job starts this long after the last one stopped: the span a case is explained over
                             # starts 2 s before its job, and the last job's final 1-s summaries must not be in it
VALID_SLOWDOWN = 1.3         # a fault case counts only when it slowed the job at least this much
NONE_MAX_SLOWDOWN = 1.15     # ... and the control case only when it did not move more than this

# Every rank leads a session of its own, at this autogroup nice: like the demo's job, so that
# load from outside the test (other sessions at nice 0) does not drown the case.
JOB_NICE = -10

# fault sizes (measured on the 2-core test machine with the four agents tracing: `python -m
# straggler_lab.demo.harness` runs every fault once and prints the slowdowns)
CPU_HOG_THREADS = 2
CPU_HOG_NICE_BELOW_JOB = 10  # cpuhog's nice (threads and autogroup) = job nice - 10: above the trainer
SELF_THREADS = 5
HOST_MS = 16
GPU_FACTOR = 5
MORE_WORK_KERNELS = 1.5      # a schedule's more-work phase: this many times the kernels every step
MORE_WORK_GRID = 1.5         # a schedule's bigger-batch phase: the same kernels on this many times the blocks
PAUSE_MS = 300               # a schedule's pause phase: a pause of host compute this long ...
PAUSE_EVERY_S = 2.0          # ... every this many seconds (a full garbage collection)
IMBALANCE = 3                # a schedule's imbalance phase: a different rank does this many times the work each step
IO_SELF_MB = 16
IO_OTHER_MB = 1
DISK_HOG_THREADS = 4
DISK_HOG_CHUNK_MB = 16
LOAD_ALL_THREADS = 1
NET_RATE_KBIT = 1200         # net-slow: the straggler's link, both ways, this many kbit/s for each peer it talks to
LINK_MBPS = 100000           # net-link: the stand-in's eth0 speed, and what it trains down to
LINK_DOWN_MBPS = 10000
NET_LATENCY = "400ms"        # (about half what the job's collectives need: rank 0, the stand-in's hub, talks to all)

FAULTS = ("none", "cpu-hog", "self-contention", "host-compute", "gpu-slow", "io-self", "io-other", "net-slow",
          "net-link", "net-slow-all", "load-all")
NO_STRAGGLER = ("none", "load-all", "net-slow-all")      # faults that name nobody


class HarnessError(RuntimeError):
    """The harness could not run a case: one line, what and where to look."""


@dataclass
class CaseResult:
    """One case. Times are CLOCK_MONOTONIC ns (the same clock as the agents' events' ts).

    rank/node: the straggler rank and its host (None for NO_STRAGGLER's faults: no straggler).
    step_ms_before / step_ms_during: per rank, the median step time over the warm-up (after its
    first 2 s) and over the fault window (after its first 2 s). slowdown: the job's, the median
    over ranks of during/before. valid: the case did what it is for (reason says why not, or
    states the slowdown)."""
    fault: str
    style: str
    rank: object
    node: object
    t_start_ns: int
    t_fault_ns: int
    t_fault_end_ns: int
    t_end_ns: int
    step_ms_before: dict
    step_ms_during: dict
    slowdown: float
    valid: bool
    reason: str
    agent_dbs: dict = field(default_factory=dict)
    rank_nodes: dict = field(default_factory=dict)   # rank -> host name
    case_dir: str = ""
    steps: dict = field(default_factory=dict)        # rank -> steps logged
    real_minus_mono_ns: int = 0                      # this machine's realtime minus monotonic (the hosts share it)


# the cause class explain should give first for each fault (None: no straggler at all)
EXPECTED_CAUSE = {"none": None, "load-all": None, "cpu-hog": "cpu-contention", "self-contention": "self-contention",
                  "host-compute": "host-compute", "gpu-slow": "gpu-slow", "io-self": "io-self", "io-other": "io-other",
                  "net-slow": "net-congestion", "net-link": "net-link", "net-slow-all": None}
# With collectives that only enqueue (NCCL on GPUs), a slow GPU makes every rank wait in synchronize
# alike: the host cannot tell whose GPU it is, and the right answer is to say so, naming no one.
EXPECTED_CAUSE_ENQUEUE = dict(EXPECTED_CAUSE, **{"gpu-slow": "device-wide"})


def diagnose(case, out_dir):
    """explain over a case with its DEFAULTS — as a user runs it, not told when the fault was: the four
    agents' stores merged (the real merge) into OUT/<name>.db, over the job's span (the agents trace
    every case of the harness; a user asks about the job they ran)."""
    from straggler.analysis import explain
    from straggler.analysis.merge import merge
    from straggler.render.report import to_text
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = Path(case.case_dir).name or case.fault
    db = out_dir / f"{name}.db"
    if db.exists():
        db.unlink()
    merge(sorted(set(case.agent_dbs.values())), str(db))
    margin = 2_000_000_000
    report = explain.explain_db(str(db), since_mono_ns=case.t_start_ns - margin, until_mono_ns=case.t_end_ns + margin)
    (out_dir / f"{name}-explain.txt").write_text(to_text(report, show_sql=False, width=120))
    return report


def fleet_time(case, mono_ns):
    """A case's CLOCK_MONOTONIC time on the fleet timeline explain reports (the hosts' realtime)."""
    return mono_ns + case.real_minus_mono_ns


def score(case, report):
    """(node right, cause right) of a report for a case: the straggler named is the faulted node, alone,
    and its episode's top cause is the fault's class; an episode that overlaps the fault window."""
    from straggler.analysis.explain import top_cause
    expected = (EXPECTED_CAUSE_ENQUEUE if case.style == "enqueue" else EXPECTED_CAUSE)[case.fault]
    if expected is None:
        return report.straggler is None, report.straggler is None
    if expected == "device-wide":
        named_none = report.straggler is None
        return named_none, named_none and any(f.cause == "device-wide" for f in report.findings)
    node_ok = report.stragglers == [case.node]
    if node_ok and report.episodes:
        on, off = fleet_time(case, case.t_fault_ns), fleet_time(case, case.t_fault_end_ns)
        node_ok = any(e["node"] == case.node and e["start_ns"] < off and e["end_ns"] > on for e in report.episodes)
    top = top_cause(report, case.node)
    return node_ok, bool(node_ok and top is not None and top.cause == expected)


def _scalar(db_path, query):
    """One value from an agent's live store, read-only (raises sqlite3.Error)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1.0)
    try:
        return conn.execute(query).fetchone()[0]
    finally:
        conn.close()


def cpu_of(r, faulted_rank):
    """The CPU rank r is pinned to: the faulted rank to CPU 0, the others nowhere (the scheduler moves
    them off a busy CPU 0, as ranks on other machines would not share it). None: not pinned. In
    load-all nobody is pinned: every node alike. (In none, rank 0 stays pinned as in the fault cases:
    with nobody pinned the scheduler sometimes pairs two ranks on one core and they straggle.)"""
    return 0 if r == faulted_rank else None


def judge(fault, slowdown):
    """(valid, reason) of a case from its job-wide slowdown."""
    if slowdown != slowdown:  # NaN: no steps to compare
        return False, "no steps to compare (the job logged nothing in the warm-up or in the fault window)"
    text = f"x{slowdown:.2f}"
    if fault == "none":
        if slowdown < NONE_MAX_SLOWDOWN:
            return True, f"the job stayed steady: {text}"
        return False, f"the job slowed down without a fault: {text} (the machine is busy?)"
    if fault == "load-all":
        return True, f"machine-wide load: the job went {text}"
    if fault == "net-slow-all" and slowdown >= VALID_SLOWDOWN:
        return True, f"every link slow alike: the job went {text}"
    if slowdown >= VALID_SLOWDOWN:
        return True, f"the fault slowed the job: {text}"
    return False, f"the fault did not slow the job: {text}"


def read_steps(path):
    """[(t_end_mono_ns, step_ms), ...] of a syncjob step log (empty if missing)."""
    rows = []
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    rows.append((int(row["t_end_mono_ns"]), float(row["step_ms"])))
                except (KeyError, TypeError, ValueError):
                    continue  # a line being written
    except OSError:
        pass
    return rows


def step_stats(rows, t_start_ns, t_fault_ns, t_fault_end_ns, skip_s=STEP_SKIP_S):
    """(median step ms before, median during) from one rank's rows; NaN where no step falls in."""
    skip = int(skip_s * 1e9)
    before = [ms for t, ms in rows if t_start_ns + skip < t <= t_fault_ns]
    during = [ms for t, ms in rows if t_fault_ns + skip < t <= t_fault_end_ns]
    nan = float("nan")
    return (statistics.median(before) if before else nan, statistics.median(during) if during else nan)


def _write_atomic(path, text):
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class _Proc:
    """A process we started in a host, in a session (process group) of its own."""

    def __init__(self, kind, host, popen, log_path):
        self.kind, self.host, self.popen, self.log_path = kind, host, popen, log_path
        self.pgid = popen.pid  # start_new_session: it leads its own group

    def alive(self):
        return self.popen.poll() is None

    def signal(self, sig):
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self, lines=3):
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])


def stop_procs(procs, grace_s, sig=signal.SIGTERM, kill_wait_s=15.0):
    """Signal each group, wait (bounded) for all of them, SIGKILL what is left, wait again."""
    def signal_and_wait(group, signum, wait_s, only_alive):
        for proc in group:
            if proc.alive() or not only_alive:   # SIGKILL also goes to groups whose leader is gone
                proc.signal(signum)
        deadline = time.monotonic() + wait_s
        for proc in group:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return deadline

    signal_and_wait(procs, sig, grace_s, only_alive=True)
    left = [p for p in procs if p.alive() or _group_alive(p.pgid)]
    deadline = signal_and_wait(left, signal.SIGKILL, kill_wait_s, only_alive=False)
    while time.monotonic() < deadline and any(_group_alive(p.pgid) for p in left):
        time.sleep(0.1)
    return [p for p in procs if p.alive() or _group_alive(p.pgid)]


class SyncJobHarness:
    """The synchronous job, its faults and the agents on a running test bed `bed`.

    out_dir: everything goes there (it must be visible from the hosts: under /tmp, not /var/tmp):
    standin/ (the stand-in libraries, built once), agents/<host>.db and .log, cases/<name>/
    (step logs steps-rank<R>.csv, control files, each process's log)."""

    def __init__(self, bed, out_dir, hosts=None, style="blocking", straggler_bin=DEFAULT_STRAGGLER_BIN,
                 job_nice=JOB_NICE, gpus=False, spare_gpus=0, standin_links=False):
        if style not in ("blocking", "enqueue"):
            raise ValueError(f"style must be blocking or enqueue, not {style!r}")
        self.bed = bed
        self.out = Path(out_dir).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.hosts = list(hosts or sorted(bed.hosts))
        self.style = style
        self.straggler_bin = str(straggler_bin)
        self.job_nice = job_nice
        self.agents = {}        # host -> _Proc
        self.agent_dbs = {}     # host -> db path
        self.job = []           # _Proc of the ranks of the running case
        self.fault_procs = []   # _Proc of the running case's cpuhog/diskhog
        self.throttled = []     # (netns or None, device): tbf qdiscs of the running case (net-slow)
        self.last_job_end_ns = None  # when the last job's ranks were stopped (new_case: JOB_GAP_S after it)
        self.clean_step_ms = {}  # rank -> its median step (ms) in the clean time of the latest case that had some
        self.trained_down = []  # hosts whose stand-in eth0 says it trained down (net-link)
        self.links = {}         # host -> its stand-in sysfs tree (standin_links: net-link)
        if standin_links:
            from straggler_lab.standin.netsysfs import NetSysfs
            for host in self.hosts:
                self.links[host] = NetSysfs(self.out / "sysfs" / host)
                self.links[host].add_interface("eth0", speed_mbps=LINK_MBPS)
        self.n_cases = 0
        self.standin_dir = self.out / "standin"
        self._built = False
        self.gpus = gpus        # stand-in GPUs the agents read (NVML stand-in): one per host, its rank's control file
        self.spare_gpus = spare_gpus    # ... and this many more per host that no rank uses (they idle)

    # ---------------------------------------------------------------- helpers
    def _env(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT / "agent") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        for key in list(env):  # the ranks set their own identity and stand-in settings
            if key.startswith("STRAGGLER_STANDIN_") or key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "STRAGGLER_SYNCJOB_EXEC"):
                del env[key]
        return env

    def _popen(self, kind, host, argv, log_path, env=None):
        log = open(log_path, "w")
        try:
            popen = self.bed.popen(host, [str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, cwd=str(REPO_ROOT),
                                   env=dict(self._env(), **(env or {})))
        finally:
            log.close()
        return _Proc(kind, host, popen, log_path)

    def _build(self):
        if not self._built:
            from straggler_lab.standin import build_standin
            build_standin(self.standin_dir)  # once here, not by four ranks at the same time
            self._built = True

    def standin_lib_args(self):
        """The agents' --cuda-lib for each stand-in library (built first): attached from the agents' start, as
        a node's installed libraries are, so every agent is ready before any job (one on a host without a rank
        included) and each job's ncclCommInitRank is traced."""
        from straggler_lab.standin import LIBRARIES
        self._build()
        return [a for lib in LIBRARIES for a in ("--cuda-lib", self.standin_dir / lib)]

    # ---------------------------------------------------------------- agents
    def control_path(self, rank, case_dir):
        """A rank's control file: stable across cases with stand-in GPUs (each host's GPU follows its rank's
        file from the agents' start), else one per case."""
        if self.gpus:
            (self.out / "controls").mkdir(exist_ok=True)
            return self.out / "controls" / f"rank{rank}"
        return case_dir / f"control-rank{rank}"

    def gpu_bus(self, host):
        """The PCI bus id ('dddd:bb:dd') of a host's stand-in GPU: one bus per host, so an Xid line every
        agent reads (one kernel log) names one host's GPU."""
        return f"0000:{0x10 + self.hosts.index(host):02x}:00"

    def _gpu_env(self, host):
        """The environment that makes a host's agent read its stand-in GPU through nvidia-ml-py."""
        from straggler_lab.standin import build_standin_nvml, write_nvml_config
        library = build_standin_nvml(self.standin_dir)
        rank = self.hosts.index(host)
        config = self.out / "nvml" / f"{host}.conf"
        config.parent.mkdir(exist_ok=True)
        control = self.control_path(rank, None)
        if not control.exists():
            _write_atomic(control, "")
        spares = []
        for i in range(1, 1 + self.spare_gpus):     # a spare GPU: a control file of its own that no rank reads
            spare = self.out / "controls" / f"spare{i}-{host}"
            if not spare.exists():
                _write_atomic(spare, "")
            spares.append(dict(index=i, uuid=f"GPU-standin-{host}-spare{i}", pci=f"0000:{0x30 + 8 * i + self.hosts.index(host):02x}:00.0",
                               control=str(spare)))
        write_nvml_config(str(config), [dict(index=0, uuid=f"GPU-standin-{host}", pci=f"{self.gpu_bus(host)}.0",
                                             control=str(control))] + spares)
        return {"LD_LIBRARY_PATH": os.path.dirname(library), "STRAGGLER_STANDIN_NVML_CONFIG": str(config)}

    def job_env(self, host):
        """What a rank of the job on `host` needs in its environment: with stand-in GPUs, the host's stand-in
        NVML config, so that loading the stand-in libcuda records it as its GPU's user (a GPU no process
        uses idles, as a real one does)."""
        return {"STRAGGLER_STANDIN_NVML_CONFIG": str(self.out / "nvml" / f"{host}.conf")} if self.gpus else {}

    def start_agents(self, extra_args=(), ready_timeout_s=120.0, per_host_args=None):
        """`straggler trace --scope netns --interval 1 --db OUT/agents/<host>.db --node <host>` on
        every host (root), stderr into OUT/agents/<host>.log; returns when every one printed its
        ready line ("straggler: tracing"), bounded. per_host_args: {host: [more arguments]} (its
        --listen address and certificate, say)."""
        agents_dir = self.out / "agents"
        agents_dir.mkdir(exist_ok=True)
        for host in self.hosts:
            if host in self.agents and self.agents[host].alive():
                continue
            db = agents_dir / f"{host}.db"
            argv = [self.straggler_bin, "trace", "--scope", "netns", "--interval", "1", "--db", db, "--node", host,
                    *extra_args, *((per_host_args or {}).get(host) or ())]
            if host in self.links:
                argv += ["--sysfs-root", self.links[host].root]
            env = self._gpu_env(host) if self.gpus else None
            self.agents[host] = self._popen("agent", host, argv, agents_dir / f"{host}.log", env=env)
            self.agent_dbs[host] = str(db)
        deadline = time.monotonic() + ready_timeout_s
        waiting = set(self.hosts)
        while waiting:
            for host in sorted(waiting):
                agent = self.agents[host]
                try:
                    text = Path(agent.log_path).read_text(errors="replace")
                except OSError:
                    text = ""
                if "straggler: tracing" in text:
                    waiting.discard(host)
                elif not agent.alive():
                    raise HarnessError(f"the agent on {host} exited ({agent.popen.returncode}) before tracing: "
                                       f"{agent.tail()} (see {agent.log_path})")
            if waiting and time.monotonic() > deadline:
                raise HarnessError(f"agents on {', '.join(sorted(waiting))} not tracing after {ready_timeout_s:.0f}s: "
                                   f"see {agents_dir}/*.log")
            if waiting:
                time.sleep(0.5)
        return dict(self.agent_dbs)

    def api_args(self, port=7433):
        """A fleet CA under OUT/pki with a server certificate per host (its address in the SAN) and a
        controller certificate; returns ({host: trace arguments to serve the API there with mutual
        TLS}, ["address:port", ...] in host order, the controller's TLSOptions)."""
        from straggler import pki
        from straggler.tls import TLSOptions
        ca = self.out / "pki"
        pki.init_ca(str(ca))
        per_host, nodes = {}, []
        for host in self.hosts:
            address = self.bed.hosts[host]
            pki.issue(str(ca), f"agent-{host}", [address], kind="server")
            per_host[host] = ["--listen", f"{address}:{port}", "--ca", str(ca / "ca.crt"),
                              "--cert", str(ca / f"agent-{host}.crt"), "--key", str(ca / f"agent-{host}.key")]
            nodes.append(f"{address}:{port}")
        pki.issue(str(ca), "controller", [], kind="client")
        client = TLSOptions(ca=str(ca / "ca.crt"), cert=str(ca / "controller.crt"), key=str(ca / "controller.key"))
        return per_host, nodes, client

    def stop_agents(self, grace_s=60.0):
        """SIGTERM (they flush and detach their probes: that can take 10+ s), then SIGKILL."""
        procs = list(self.agents.values())
        self.agents = {}
        left = stop_procs(procs, grace_s, kill_wait_s=30.0)
        if left:
            raise HarnessError(f"agents on {', '.join(p.host for p in left)} survived SIGKILL "
                               f"(pids {', '.join(str(p.pgid) for p in left)})")

    def _agents_see_uprobes(self):
        for host in self.agents:
            try:
                count = _scalar(self.agent_dbs[host], "SELECT count(*) FROM probes WHERE name LIKE 'uprobe%'")
            except sqlite3.Error:
                return False
            if not count:
                return False
        return True

    # ---------------------------------------------------------------- a case
    def new_case(self, name):
        """A case's directory (its name: `{n}` is the case's number) with no STOP file in it: the libraries
        built, the count of cases up by one -> (case_dir, stop_file)."""
        self._build()
        if self.last_job_end_ns is not None:   # the last job's final summaries out of this one's span first
            time.sleep(max(0.0, (self.last_job_end_ns + int(JOB_GAP_S * 1e9) - time.monotonic_ns()) / 1e9))
        self.n_cases += 1
        case_dir = self.out / "cases" / name.format(n=self.n_cases)
        case_dir.mkdir(parents=True, exist_ok=True)
        stop_file = case_dir / "STOP"
        if stop_file.exists():
            stop_file.unlink()
        return case_dir, stop_file

    def run_case(self, fault, rank=0, warmup_s=8.0, fault_s=12.0, name=None, ready_timeout_s=120.0, cooldown_s=0.0,
                 from_start=False):
        """Run the job with `fault` on rank `rank` (see FAULTS); returns a CaseResult. cooldown_s:
        the job runs on clean for so long after the fault is removed (a live watch's recovery).
        from_start: the fault is there before the job's first step, to its last (tracing starts on a job
        already slow; no warm-up): its steps are compared with the clean steps of this harness's earlier
        cases (an earlier case must have run; its step_ms_before are `clean_step_ms`)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
        if not 0 <= rank < len(self.hosts):
            raise ValueError(f"rank {rank} is not in 0..{len(self.hosts) - 1}")
        case_dir, stop_file = self.new_case(name or f"{{n:02d}}-{fault}-{self.style}-rank{rank}")
        world = len(self.hosts)
        controls = {r: self.control_path(r, case_dir) for r in range(world)}
        base = {r: "" for r in range(world)}
        if fault == "io-other":
            base[rank] = f"io_mb={IO_OTHER_MB}\n"
        for r, path in controls.items():
            _write_atomic(path, base[r])
        port = BASE_PORT + self.n_cases
        root = f"{self.bed.hosts[self.hosts[0]]}:{port}"
        limit_s = warmup_s + fault_s + ready_timeout_s + 60
        if from_start and not self.clean_step_ms:
            raise HarnessError("a fault from the start needs a clean case before it (its steps are the measure)")
        try:
            if from_start:
                self._apply(fault, rank, controls, base, case_dir, fault_s + ready_timeout_s)
            for r, host in enumerate(self.hosts):
                argv = [sys.executable, "-m", "straggler_lab.demo.syncjob", "--rank", r, "--world", world, "--root", root,
                        "--style", self.style, "--standin-dir", self.standin_dir, "--seconds", limit_s,
                        "--stop-file", stop_file, "--log", case_dir / f"steps-rank{r}.csv",
                        "--control", controls[r], "--job-dir", case_dir]
                cpu = cpu_of(r, rank if fault != "load-all" else None)
                if cpu is not None:
                    argv += ["--cpu", cpu]
                if self.job_nice is not None:
                    argv += ["--autogroup-nice", self.job_nice]
                self.job.append(self._popen("rank", host, argv, case_dir / f"rank{r}.log", env=self.job_env(host)))
            self._wait_ready(case_dir, ready_timeout_s)
            t_start = time.monotonic_ns()
            real_minus_mono = time.time_ns() - time.monotonic_ns()
            if not from_start:
                self._sleep(warmup_s, case_dir)
            t_fault = time.monotonic_ns()
            try:
                if not from_start:
                    self._apply(fault, rank, controls, base, case_dir, fault_s)
                self._sleep(fault_s, case_dir)
            finally:
                t_fault_end = time.monotonic_ns()
                self._remove(controls, base)
            if cooldown_s > 0:
                self._sleep(cooldown_s, case_dir)
            self._stop_job(stop_file)
            t_end = time.monotonic_ns()
            self._wait_agents_wrote(t_fault_end)
        finally:
            self._remove(controls, base)
            self._stop_job(stop_file)
        before, during, steps = {}, {}, {}
        for r in range(world):
            rows = read_steps(case_dir / f"steps-rank{r}.csv")
            steps[r] = len(rows)
            before[r], during[r] = step_stats(rows, t_start, t_fault, t_fault_end)
            if from_start:
                before[r] = self.clean_step_ms.get(r, float("nan"))
            elif before[r] == before[r]:
                self.clean_step_ms[r] = before[r]
        ratios = [during[r] / before[r] for r in range(world) if before[r] == before[r] and during[r] == during[r]
                  and before[r] > 0]
        slowdown = statistics.median(ratios) if len(ratios) == world else float("nan")
        valid, reason = judge(fault, slowdown)
        straggler = fault not in NO_STRAGGLER
        return CaseResult(fault=fault, style=self.style, rank=rank if straggler else None,
                          node=self.hosts[rank] if straggler else None, t_start_ns=t_start, t_fault_ns=t_fault,
                          t_fault_end_ns=t_fault_end, t_end_ns=t_end, step_ms_before=before, step_ms_during=during,
                          slowdown=slowdown, valid=valid, reason=reason, agent_dbs=dict(self.agent_dbs),
                          rank_nodes=dict(enumerate(self.hosts)), case_dir=str(case_dir), steps=steps,
                          real_minus_mono_ns=real_minus_mono)

    def _apply(self, fault, rank, controls, base, case_dir, fault_s):
        host = self.hosts[rank]
        hogs = [sys.executable, "-m", "straggler_lab.demo.hogs"]
        bound = fault_s + 60  # the hogs stop by themselves too
        job_nice = self.job_nice or 0
        if fault == "cpu-hog":
            argv = hogs + ["cpu", "--threads", CPU_HOG_THREADS, "--cpu", cpu_of(rank, rank),
                           "--nice", max(-20, job_nice - CPU_HOG_NICE_BELOW_JOB), "--seconds", bound]
            self.fault_procs.append(self._popen("cpuhog", host, argv, case_dir / f"cpuhog-{host}.log"))
        elif fault == "load-all":
            for h in self.hosts:  # unpinned, at the job's own priority
                argv = hogs + ["cpu", "--threads", LOAD_ALL_THREADS, "--nice", job_nice, "--seconds", bound]
                self.fault_procs.append(self._popen("cpuhog", h, argv, case_dir / f"cpuhog-{h}.log"))
        elif fault == "io-other":
            argv = hogs + ["disk", "--dir", case_dir, "--threads", DISK_HOG_THREADS, "--chunk-mb", DISK_HOG_CHUNK_MB,
                           "--seconds", bound]
            self.fault_procs.append(self._popen("diskhog", host, argv, case_dir / f"diskhog-{host}.log"))
        elif fault in ("net-slow", "net-link"):
            if fault == "net-link":
                if host not in self.links:
                    raise HarnessError("net-link needs the stand-in links (SyncJobHarness(standin_links=True))")
                self.links[host].set_speed("eth0", LINK_DOWN_MBPS)
                self.trained_down.append(host)
            self.throttle_link(host, self.link_rate(rank))
        elif fault == "net-slow-all":
            for r, h in enumerate(self.hosts):
                self.throttle_link(h, self.link_rate(r))
        elif fault != "none":
            line = {"self-contention": f"threads={SELF_THREADS}", "host-compute": f"host_ms={HOST_MS}",
                    "gpu-slow": f"gpu_factor={GPU_FACTOR}", "io-self": f"io_mb={IO_SELF_MB}"}[fault]
            _write_atomic(controls[rank], base[rank] + line + "\n")

    def link_ends(self, host):
        """[(netns or None, device)]: the host's eth0 (its egress) and the bridge's end of its veth (its
        ingress), found by the veth's peer index."""
        netns = self.bed.netns[host]
        shown = subprocess.run(["ip", "-n", netns, "-o", "link", "show", "eth0"], capture_output=True, text=True,
                               timeout=10, check=True).stdout
        peer = shown.split(":", 2)[1].strip().partition("@if")[2]
        for line in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10,
                                   check=True).stdout.splitlines():
            index, name = line.split(":", 2)[:2]
            if index.strip() == peer:
                return [(netns, "eth0"), (None, name.strip().partition("@")[0])]
        raise HarnessError(f"{host}: the bridge's end of its veth (ifindex {peer}) was not found")

    def link_rate(self, rank):
        """net-slow's rate for a rank's link: NET_RATE_KBIT per peer it talks to (the stand-in NCCL reduces
        through rank 0: it talks to every other rank, each of them to rank 0 alone)."""
        return f"{NET_RATE_KBIT * (len(self.hosts) - 1 if rank == 0 else 1)}kbit"

    def throttle_link(self, host, rate, latency=NET_LATENCY):
        """A tbf qdisc of `rate` on both ends of the host's link (removed by unthrottle_links)."""
        for netns, dev in self.link_ends(host):
            argv = ["tc"] + (["-n", netns] if netns else []) + ["qdisc", "replace", "dev", dev, "root", "tbf",
                                                                "rate", rate, "burst", "4kb", "latency", latency]
            subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True)
            self.throttled.append((netns, dev))

    def unthrottle_links(self):
        while self.trained_down:
            self.links[self.trained_down.pop()].set_speed("eth0", LINK_MBPS)
        while self.throttled:
            netns, dev = self.throttled.pop()
            subprocess.run(["tc"] + (["-n", netns] if netns else []) + ["qdisc", "del", "dev", dev, "root"],
                           capture_output=True, text=True, timeout=10)

    def _remove(self, controls, base):
        self.unthrottle_links()
        if self.fault_procs:
            stop_procs(self.fault_procs, grace_s=10.0)
            self.fault_procs = []
        for r, path in controls.items():
            try:
                if path.read_text() != base[r]:
                    _write_atomic(path, base[r])
            except OSError:
                pass

    def _wait_agents_wrote(self, t_ns, timeout_s=60.0):
        """Until every agent's store has an interval that ends after t_ns (bounded; no error: a lagging
        agent's store is reported by explain as missing that part)."""
        deadline = time.monotonic() + timeout_s
        pending = set(self.agents)
        while pending and time.monotonic() < deadline:
            for host in list(pending):
                try:  # agent_cost: one row every interval, whatever was traced in it
                    last = _scalar(self.agent_dbs[host], "SELECT MAX(ts + interval_ns) FROM agent_cost")
                except sqlite3.Error:
                    continue
                if last is not None and last >= t_ns:
                    pending.discard(host)
            if pending:
                time.sleep(0.5)

    def _check_job(self, case_dir):
        dead = [p for p in self.job if not p.alive()]
        if dead:
            raise HarnessError(f"rank(s) on {', '.join(p.host for p in dead)} exited early: "
                               + "; ".join(f"{p.host}: {p.tail()}" for p in dead) + f" (see {case_dir})")

    def _wait_ready(self, case_dir, timeout_s):
        """Every rank logged steps and every agent's store lists uprobes (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_job(case_dir)
            counts = [len(read_steps(case_dir / f"steps-rank{r}.csv")) for r in range(len(self.hosts))]
            if min(counts) >= 5 and self._agents_see_uprobes():
                return
            if time.monotonic() > deadline:
                raise HarnessError(f"the job was not ready after {timeout_s:.0f}s: steps per rank {counts}, agents "
                                   f"with uprobes: {self._agents_see_uprobes()} (see {case_dir}, {self.out / 'agents'})")
            time.sleep(0.5)

    def _sleep(self, seconds, case_dir):
        end = time.monotonic() + seconds
        while True:
            self._check_job(case_dir)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.5, left))

    def _stop_job(self, stop_file, timeout_s=20.0):
        """The stop file first (the ranks stop together at their next step), then TERM/KILL."""
        if not self.job:
            return
        try:
            stop_file.touch()
        except OSError:
            pass
        deadline = time.monotonic() + timeout_s
        for proc in self.job:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        stop_procs(self.job, grace_s=5.0)
        self.job = []
        self.last_job_end_ns = time.monotonic_ns()

    # ---------------------------------------------------------------- the end
    def close(self):
        """Stop the job, the fault processes and the agents (idempotent)."""
        try:
            self.unthrottle_links()
            if self.job:
                stop_procs(self.job, grace_s=5.0)
                self.job = []
            if self.fault_procs:
                stop_procs(self.fault_procs, grace_s=5.0)
                self.fault_procs = []
        finally:
            if self.agents:
                self.stop_agents()

    def leftovers(self):
        """Pids of live processes whose command line names this harness's out_dir (none after close())."""
        mark = str(self.out).encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if mark in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------- the CLI: every fault once

def build_arg_parser():
    p = argparse.ArgumentParser(prog="python -m straggler_lab.demo.harness",
                                description="Bring up a test bed, start the agents, run each fault once, print the "
                                            "slowdowns, tear everything down.")
    p.add_argument("--testbed-id", type=int, default=245, help="test bed id (default 245)")
    p.add_argument("--out", default="/tmp/straggler-harness", help="output directory (under /tmp)")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, default all")
    p.add_argument("--style", choices=["blocking", "enqueue"], default="blocking")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--warmup-s", type=float, default=8.0)
    p.add_argument("--fault-s", type=float, default=12.0)
    p.add_argument("--no-agents", action="store_true", help="the job and faults only")
    p.add_argument("--job-nice", type=int, default=JOB_NICE, help=f"the ranks' autogroup nice (default {JOB_NICE})")
    p.add_argument("--repeat", type=int, default=1, help="run the list of faults this many times")
    p.add_argument("--cooldown-s", type=float, default=0.0, help="the job runs on clean this long after each fault")
    p.add_argument("--watch", action="store_true",
                   help="the agents serve their API (mutual TLS) and `straggler watch` runs beside the job, its "
                        "lines printed as they come (with a cool-down of 20 s unless --cooldown-s says otherwise)")
    return p


def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    for f in faults:
        if f not in FAULTS:
            print(f"harness: unknown fault {f!r}: {', '.join(FAULTS)}", file=sys.stderr)
            return 2
    from straggler_lab import testbed
    lock = testbed.TestbedLock(args.testbed_id)
    if not lock.try_acquire():
        print(f"harness: test bed id {args.testbed_id} is in use (pid {lock.holder()})", file=sys.stderr)
        return 2

    def on_term(_signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    bed = harness = None
    watchers = []
    rc = 0
    try:
        bed = testbed.up(hosts=4, dead=0, testbed_id=args.testbed_id, _lock_held=True)
        harness = SyncJobHarness(bed, args.out, style=args.style, job_nice=args.job_nice)
        per_host, nodes, client = (harness.api_args() if args.watch else (None, None, None))
        if not args.no_agents:
            t0 = time.monotonic()
            harness.start_agents(per_host_args=per_host)
            print(f"agents tracing after {time.monotonic() - t0:.0f}s", flush=True)
        if args.watch:
            watcher = subprocess.Popen([harness.straggler_bin, "watch", "--nodes", ",".join(nodes), "--ca", client.ca,
                                        "--cert", client.cert, "--key", client.key], start_new_session=True)
            watchers.append(watcher)
        cooldown = args.cooldown_s or (20.0 if args.watch else 0.0)
        for fault in faults * max(1, args.repeat):
            t0 = time.monotonic()
            r = harness.run_case(fault, rank=args.rank, warmup_s=args.warmup_s, fault_s=args.fault_s,
                                 cooldown_s=cooldown)
            per_rank = " ".join(f"r{k}:{r.step_ms_before[k]:.1f}->{r.step_ms_during[k]:.1f}" for k in sorted(r.step_ms_before))
            print(f"{fault:16s} {args.style:8s} slowdown x{r.slowdown:.2f} valid={r.valid} ({r.reason}) "
                  f"[{per_rank}] {time.monotonic() - t0:.0f}s", flush=True)
            if args.watch:
                def wall(t_ns):
                    return time.strftime("%H:%M:%S", time.localtime(time.time() - (time.monotonic_ns() - t_ns) / 1e9))
                print(f"{fault} on {r.node or 'no node'}: from {wall(r.t_fault_ns)} to {wall(r.t_fault_end_ns)}; "
                      f"the job ran on until {wall(r.t_end_ns)}", flush=True)
            rc = rc or (0 if r.valid else 1)
    except KeyboardInterrupt:
        rc = 130
    except HarnessError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for watcher in watchers:
                watcher.terminate()
                try:
                    watcher.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    watcher.kill()
                    watcher.wait()
            if harness is not None:
                harness.close()
        finally:
            if bed is not None:
                for attempt in range(6):
                    try:
                        testbed.down(bed.id, bed.state_dir, _lock_held=True)
                        break
                    except testbed.TestbedError as exc:
                        print(f"harness: test bed not down yet: {exc}", file=sys.stderr)
                        time.sleep(10)
            lock.release()
    return rc


if __name__ == "__main__":
    sys.exit(main())
