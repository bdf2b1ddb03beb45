"""The node agent (`straggler trace`) with real eBPF, against the STAND-IN CUDA libraries.

Two agent runs, each shared by the tests of one class (BCC's compile costs seconds of CPU):
  TestRecordAll       --record-all, the whole host: every call recorded with its duration, node,
                      rank and arguments; a CPU hog shows as preemption; dd's direct writes are
                      attributed to dd; a process started later is traced (its library attached
                      late); a flood overruns the ring buffer and the loss is counted; SIGTERM
                      flushes and exits 0.
  TestSampledNetns    sampled mode (--sample 2) in its own network namespace (--scope netns):
                      aggregates count every call while fewer rows are stored; processes and block
                      I/O outside the namespace are ignored; the database stays under --max-db;
                      SIGKILL leaves a readable database.
No timed assertions: waits poll the database (bounded) and then assert exact facts.
"""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from straggler_lab import procs
from straggler_lab.standin import build_standin, build_workload
from straggler.probes import loader
from straggler.store.schema import SCHEMA_VERSION

pytestmark = pytest.mark.bpf

READY = re.compile(r"^straggler: tracing \((\d+) probes\) node=(\S+) db=(\S+)")
READY_TIMEOUT_S = 300  # BCC compiles for seconds of CPU; the machine is shared
# bodies of known duration (standin.c reads these once)
STANDIN_ENV = {"STRAGGLER_STANDIN_LAUNCH_US": "50", "STRAGGLER_STANDIN_ALLOC_US": "30",
               "STRAGGLER_STANDIN_COPY_US": "20", "STRAGGLER_STANDIN_SYNC_US": "2000",
               "STRAGGLER_STANDIN_NCCL_US": "3000"}
BODY_NS = {"launch": 50_000, "alloc": 30_000, "copy": 20_000, "sync": 2_000_000, "nccl": 3_000_000}
# what the workload's mix mode calls (workload.c): symbol -> (op, source, body, bytes, dims)
MIX = {
    "cuMemAlloc_v2": ("cuMemAlloc", "driver", "alloc", 1048576, None),
    "cuMemcpyHtoD_v2": ("cuMemcpyHtoD", "driver", "copy", 4096, None),
    "cuMemcpyDtoHAsync_v2_ptsz": ("cuMemcpyDtoHAsync", "driver", "copy", 512, None),
    "cuLaunchKernel": ("cuLaunchKernel", "driver", "launch", None, (4, 5, 6, 32, 8, 2)),
    "cuLaunchKernel_ptsz": ("cuLaunchKernel", "driver", "launch", None, (40000, 3, 2, 256, 1, 1)),
    "cuCtxSynchronize": ("cuCtxSynchronize", "driver", "sync", None, None),
    "cuStreamSynchronize": ("cuStreamSynchronize", "driver", "sync", None, None),
    "cuMemFree_v2": ("cuMemFree", "driver", "alloc", None, None),
    "cudaMalloc": ("cudaMalloc", "cuda", "alloc", 2097152, None),
    "cudaMemcpy": ("cudaMemcpy", "cuda", "copy", 8192, None),
    "cudaMemcpyAsync": ("cudaMemcpyAsync", "cuda", "copy", 16384, None),
    "cudaLaunchKernel": ("cudaLaunchKernel", "cuda", "launch", None, (7, 8, 9, 64, 2, 3)),
    "cudaStreamSynchronize": ("cudaStreamSynchronize", "cuda", "sync", None, None),
    "cudaDeviceSynchronize": ("cudaDeviceSynchronize", "cuda", "sync", None, None),
    "cudaFree": ("cudaFree", "cuda", "alloc", None, None),
    "ncclAllReduce": ("ncclAllReduce", "nccl", "nccl", 1000 * 4, None),      # 1000 x float32
    "ncclBroadcast": ("ncclBroadcast", "nccl", "nccl", 100 * 8, None),        # 100 x float64
    "ncclAllGather": ("ncclAllGather", "nccl", "nccl", 50 * 4, None),         # 50 x int32
    "ncclReduceScatter": ("ncclReduceScatter", "nccl", "nccl", 10 * 2, None), # 10 x bfloat16
    "cuMemcpyPeer": ("cuMemcpyPeer", "driver", "copy", 65536, None),
}
CALL_SOURCES = "('cuda', 'driver', 'nccl')"


# ---- helpers ------------------------------------------------------------------------------------
class AgentRun:
    """`straggler trace` as a subprocess; ready when it prints its ready line on stderr."""

    def __init__(self, db, args, prefix=()):
        self.db = str(db)
        cmd = [*prefix, sys.executable, "-m", "straggler.cli", "trace", "--db", self.db, *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.stderr_lines = []
        self.ready = threading.Event()
        self.probe_count = None
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))
            match = READY.match(line)
            if match:
                self.probe_count = int(match.group(1))
                self.ready.set()

    def wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None:
                time.sleep(0.2)
                pytest.fail(f"the agent exited with {self.proc.returncode} before it was ready:\n"
                            + "\n".join(self.stderr_lines[-20:]))
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                pytest.fail(f"the agent was not ready within {READY_TIMEOUT_S} s:\n" + "\n".join(self.stderr_lines[-20:]))

    def stop(self, sig=signal.SIGTERM, timeout=90):
        procs.end(self.proc, sig=sig, wait_s=timeout)
        return self.proc.returncode


LAUNCHER_CODE = r"""
import json, subprocess, sys, threading
def reap(proc, done):
    rc = proc.wait()
    with open(done + ".tmp", "w") as f:
        f.write(str(rc))
    import os
    os.replace(done + ".tmp", done)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    proc = subprocess.Popen(req["argv"], env=req["env"], stdin=subprocess.DEVNULL,
                            stdout=open(req["out"], "w"), stderr=open(req["err"], "w"))
    print(json.dumps({"pid": proc.pid}), flush=True)
    threading.Thread(target=reap, args=(proc, req["done"]), daemon=True).start()
"""


class Launcher:
    """A process that exists before the agent (traced with --pid) and starts the workloads as its
    children: they are traced because the kernel follows the forks of a target, and processes of
    other people on this shared machine are not."""

    def __init__(self, work_dir, prefix=()):
        self.work_dir = Path(work_dir)
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", LAUNCHER_CODE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        # running: so a prefix like `unshare --net` has made its namespace by now
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        self.count = 0

    @property
    def pid(self):
        return self.proc.pid

    def start(self, argv, env=None):
        self.count += 1
        base = self.work_dir / f"child-{self.count}"
        req = {"argv": [str(a) for a in argv], "env": {**os.environ, **(env or {})}, "out": f"{base}.out",
               "err": f"{base}.err", "done": f"{base}.rc"}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        return Child(pid, base)

    def close(self):
        self.proc.stdin.close()
        procs.end(self.proc, sig=None, wait_s=30)           # it ends when its stdin does


class Child:
    def __init__(self, pid, base):
        self.pid, self.base = pid, Path(base)

    def wait(self, timeout=180):
        """(returncode, stdout, stderr) once the child has exited (bounded)."""
        done = Path(f"{self.base}.rc")
        deadline = time.monotonic() + timeout
        while not done.exists():
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                pytest.fail(f"child {self.pid} did not finish within {timeout} s")
            time.sleep(0.05)
        return (int(done.read_text()), Path(f"{self.base}.out").read_text(), Path(f"{self.base}.err").read_text())

    def workload_summary(self, timeout=180):
        rc, out, err = self.wait(timeout)
        assert rc == 0, err
        return json.loads(out)


def query(db, sql, params=()):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def scalar(db, sql, params=()):
    return query(db, sql, params)[0][0]


def wait_until(condition, timeout=90, interval=0.25):
    """Poll condition() until it is truthy or the time is up; returns its last value."""
    deadline = time.monotonic() + timeout
    value = condition()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = condition()
    return value


def block_device_dir(tmp_path):
    """A directory on a real block device (dd's direct writes must reach the disk)."""
    for candidate in (tmp_path, Path("/var/tmp"), Path(__file__).resolve().parent):
        if os.major(os.stat(candidate).st_dev) != 0:
            return Path(candidate)
    pytest.skip("no directory on a block device (all tmpfs/overlay)")


def lost_calls(db):
    return scalar(db, "SELECT coalesce(sum(count), 0) FROM lost_events WHERE probe IN "
                      "('uretprobe:cuda_calls', 'writer:queue')")


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    lib_dir = tmp_path_factory.mktemp("standin")
    libcuda = build_standin(lib_dir)
    return {"lib_dir": str(lib_dir), "libcuda": libcuda, "workload": build_workload(lib_dir)}


# ---- run A: record everything, targets = the children of one launcher ---------------------------
NODE_A = "agent-test-a"


def standin_libs(standin):
    """--cuda-lib for each stand-in library (a user names the ones the job will load)."""
    args = []
    for name in ("libcuda.so.1", "libcudart.so.12", "libnccl.so.2"):
        args += ["--cuda-lib", os.path.join(standin["lib_dir"], name)]
    return args


@pytest.fixture(scope="class")
def launcher(tmp_path_factory):
    launcher = Launcher(tmp_path_factory.mktemp("launcher"))
    yield launcher
    launcher.close()


@pytest.fixture(scope="class")
def agent(standin, launcher, tmp_path_factory):
    db = tmp_path_factory.mktemp("agent-a") / "trace.db"
    run = AgentRun(db, ["--node", NODE_A, "--record-all", "--pid", str(launcher.pid), "--interval", "1",
                        "--rescan", "0.5", "--ringbuf-kb", "256", *standin_libs(standin)])
    run.wait_ready()
    yield run
    run.stop(signal.SIGKILL)


def start_child_workload(launcher, standin, *args, env=None, prefix=(), lib_dir=None):
    argv = [*prefix, standin["workload"], "--lib-dir", lib_dir or standin["lib_dir"], *args]
    return launcher.start(argv, env=dict(STANDIN_ENV, **(env or {})))


@pytest.fixture(scope="class")
def mix(agent, launcher, standin, tmp_path_factory):
    """One workload run: 10 iterations of every traced function, as RANK=3 of 4."""
    log = tmp_path_factory.mktemp("mix") / "calls.log"
    summary = start_child_workload(launcher, standin, "--mode", "mix", "--iterations", "10", "--rate", "400",
                                   "--log", log, "--hold-ms", "500",
                                   env={"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}).workload_summary()
    pid = summary["pid"]
    wait_until(lambda: scalar(agent.db, f"SELECT count(*) FROM events WHERE pid = ? AND source IN {CALL_SOURCES}",
                              (pid,)) >= summary["total_calls"])
    rows = query(agent.db, "SELECT id, seq, node, rank, local_rank, source, op, tid, comm, ts, duration, ret, bytes, "
                           "grid_x, grid_y, grid_z, block_x, block_y, block_z, detail "
                           f"FROM events WHERE pid = ? AND source IN {CALL_SOURCES} ORDER BY ts", (pid,))
    calls = []
    for line in log.read_text().splitlines():
        symbol, before, after = line.split()
        calls.append((symbol, int(before), int(after)))
    return {"summary": summary, "rows": rows, "log": calls}


class TestRecordAll:
    NODE = NODE_A

    @staticmethod
    def _symbol(row):
        detail = json.loads(row[19]) if row[19] else {}
        return detail.get("symbol", row[6])

    def test_every_call_of_a_child_is_recorded_once_with_node_and_rank(self, agent, mix, launcher):
        rows, summary = mix["rows"], mix["summary"]
        assert len(rows) == summary["total_calls"] == 200
        counted = {}
        for row in rows:
            counted[self._symbol(row)] = counted.get(self._symbol(row), 0) + 1
        assert counted == summary["calls"]
        for row in rows:
            id_, seq, node, rank, local_rank = row[:5]
            assert (node, rank, local_rank) == (self.NODE, 3, 1)
            assert id_ == f"{self.NODE}:{seq}"
            assert row[8] == "straggler-stand"  # comm (15 characters)
            assert row[11] == 0  # CUDA_SUCCESS
        assert len({row[1] for row in rows}) == len(rows)
        procs = lambda: query(agent.db, "SELECT rank, local_rank, world_size, ppid FROM processes WHERE pid = ?",
                              (summary["pid"],))
        wait_until(lambda: procs())  # the processes table is written at the end of each interval
        assert procs()[0] == (3, 1, 4, launcher.pid)

    def test_durations_and_start_times_match_the_calls(self, mix):
        by_symbol_rows, by_symbol_log = {}, {}
        for row in mix["rows"]:
            by_symbol_rows.setdefault(self._symbol(row), []).append(row)
        for symbol, before, after in mix["log"]:
            by_symbol_log.setdefault(symbol, []).append((before, after))
        assert set(by_symbol_rows) == set(MIX)
        for symbol, rows in by_symbol_rows.items():
            op, source, body, _, _ = MIX[symbol]
            assert len(rows) == len(by_symbol_log[symbol]) == 10, symbol
            for row, (before, after) in zip(rows, sorted(by_symbol_log[symbol])):
                ts, duration = row[9], row[10]
                assert (row[5], row[6]) == (source, op)
                # the probe runs inside the caller's clock readings, and the body takes at least its time
                assert before <= ts and ts + duration <= after, (symbol, before, ts, duration, after)
                assert duration >= BODY_NS[body], (symbol, duration)

    def test_bytes_and_launch_dimensions_are_kept(self, mix):
        for row in mix["rows"]:
            symbol = self._symbol(row)
            _, _, _, nbytes, dims = MIX[symbol]
            assert row[12] == nbytes, symbol
            assert tuple(row[13:19]) == (dims or (None,) * 6), symbol
            if symbol != row[6]:
                assert json.loads(row[19])["symbol"] == symbol

    def test_first_calls_after_an_exec_carry_the_new_rank(self, agent, launcher, standin):
        """A trainer is often exec'd by a wrapper that the agent already tracks, whose environment had
        another RANK, or none (a shell that sets it, then execs). Its first calls, made at once, must carry
        the rank it has after the exec, not the wrapper's."""
        script = ('sleep 0.6; exec env RANK=5 LOCAL_RANK=2 WORLD_SIZE=8 "$0" --lib-dir "$1" --mode mix '
                  '--iterations 3 --rate 1000')
        child = launcher.start(["env", "RANK=9", "LOCAL_RANK=7", "sh", "-c", script, standin["workload"],
                                standin["lib_dir"]], env=STANDIN_ENV)
        summary = child.workload_summary()
        pid = summary["pid"]
        assert pid == child.pid        # exec'd in place: one process, first the wrapper, then the workload
        wait_until(lambda: scalar(agent.db, f"SELECT count(*) FROM events WHERE pid = ? AND source IN {CALL_SOURCES}",
                                  (pid,)) >= summary["total_calls"])
        ranks = query(agent.db, f"SELECT rank, local_rank, count(*) FROM events WHERE pid = ? AND source IN {CALL_SOURCES} "
                                "GROUP BY rank, local_rank", (pid,))
        assert ranks == [(5, 2, summary["total_calls"])]

    def test_cpu_hog_preempts_the_workload_and_is_named(self, agent, launcher, standin):
        # both round-robin real-time on one CPU: they take turns every RR slice whatever else the
        # shared machine runs (the RT throttle leaves the other tasks 5%), so the hog is what
        # takes the CPU from the workload, and it does so while the workload is runnable
        cpu = max(os.sched_getaffinity(0))
        rr = ("taskset", "-c", str(cpu), "chrt", "--rr", "1")
        hog = subprocess.Popen(
            [*rr, sys.executable, "-c",
             "import ctypes, time\nctypes.CDLL(None).prctl(15, b'straggler-hog', 0, 0, 0)\n"
             "end = time.monotonic() + 60\nwhile time.monotonic() < end: pass"])
        try:
            hog_comm = Path(f"/proc/{hog.pid}/comm")
            assert wait_until(lambda: hog_comm.exists() and hog_comm.read_text().strip() == "straggler-hog", timeout=60)
            summary = start_child_workload(launcher, standin, "--mode", "launch", "--seconds", "3", "--hold-ms", "300",
                                    env={"STRAGGLER_STANDIN_LAUNCH_US": "300"},
                                    prefix=rr).workload_summary()
        finally:
            hog.kill()
            hog.wait(10)
        pid = summary["pid"]
        preempted_by_hog = wait_until(lambda: scalar(
            agent.db, "SELECT count(*) FROM offcpu WHERE pid = ? AND state = 'preempted' AND other_comm = 'straggler-hog' "
                      "AND other_pid = ?", (pid, hog.pid)))
        assert preempted_by_hog > 0
        # while it spins between its first and last call the workload never sleeps: it was runnable
        # whenever it was off the CPU
        first, last = query(agent.db, "SELECT min(ts), max(ts) FROM events WHERE pid = ? AND op = 'cuLaunchKernel'",
                            (pid,))[0]
        states = dict(query(agent.db, "SELECT state, count(*) FROM offcpu WHERE pid = ? AND ts > ? AND ts < ? "
                                      "GROUP BY state", (pid, first, last)))
        assert states.get("preempted", 0) >= 0.9 * sum(states.values()), states
        runq = query(agent.db, "SELECT count(*), min(duration), sum(duration) FROM events WHERE source = 'sched' "
                               "AND op = 'runq' AND pid = ?", (pid,))[0]
        assert runq[0] > 0 and runq[1] >= 0 and runq[2] > 0
        assert wait_until(lambda: scalar(agent.db, "SELECT sum(count) FROM aggregates WHERE source = 'sched' "
                                                   "AND op = 'runq' AND pid = ?", (pid,)))
        # preempted on the hog's CPU, by the hog
        assert query(agent.db, "SELECT DISTINCT cpu FROM offcpu WHERE pid = ? AND other_comm = 'straggler-hog'",
                     (pid,)) == [(cpu,)]

    def test_direct_writes_are_attributed_to_dd(self, agent, launcher, tmp_path):
        target = block_device_dir(tmp_path) / f"straggler-dd-{os.getpid()}.bin"
        try:
            dd = launcher.start(["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=8", "oflag=direct"])
            rc, _, err = dd.wait()
            assert rc == 0, err
            st_dev = os.stat(target).st_dev
        finally:
            target.unlink(missing_ok=True)
        writes = lambda: query(agent.db, "SELECT comm, coalesce(sum(bytes), 0), count(*), min(duration), "
                                         "group_concat(DISTINCT dev) FROM block_io WHERE op = 'block_write' AND pid = ?",
                               (dd.pid,))[0]
        wait_until(lambda: writes()[1] >= 8 << 20)
        comm, total_bytes, count, min_duration, devs = writes()
        assert (comm, total_bytes) == ("dd", 8 << 20)
        assert count >= 8 and min_duration > 0
        assert devs == f"{os.major(st_dev)}:{os.minor(st_dev)}"

    def test_library_loaded_after_the_start_is_attached(self, agent, launcher, standin, tmp_path):
        # a second copy of the stand-in (another file): unknown to the agent until a process maps it
        late_dir = tmp_path / "late-standin"
        build_standin(late_dir)
        go = tmp_path / "go"
        child = start_child_workload(launcher, standin, "--mode", "mix", "--iterations", "3", "--wait-file", go,
                              "--hold-ms", "300", lib_dir=str(late_dir))
        try:
            attached = wait_until(lambda: scalar(agent.db, "SELECT count(DISTINCT library) FROM probes "
                                                           "WHERE library LIKE ?", (f"{late_dir}/%",)) == 3)
            assert attached, agent.stderr_lines[-5:]
        finally:
            go.touch()
        summary = child.workload_summary()
        count = lambda: scalar(agent.db, f"SELECT count(*) FROM events WHERE pid = ? AND source IN {CALL_SOURCES}",
                               (summary["pid"],))
        wait_until(lambda: count() >= 60)
        assert count() == 60
        assert any("attached" in line and str(late_dir) in line for line in agent.stderr_lines)

    def test_flood_overruns_the_ring_buffer_and_every_lost_call_is_counted(self, agent, launcher, standin):
        assert lost_calls(agent.db) == 0  # nothing lost before the flood: the tests above saw complete data
        calls = 20_000  # 120 bytes each: far more than the 256 KB ring holds
        # the agent stalls (as it would when starved of CPU) while the flood runs: the ring overruns
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            summary = start_child_workload(launcher, standin, "--mode", "launch", "--iterations", str(calls),
                                           env={"STRAGGLER_STANDIN_LAUNCH_US": "0"}).workload_summary()
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        pid = summary["pid"]
        rows = lambda: scalar(agent.db, "SELECT count(*) FROM events WHERE pid = ? AND op = 'cuLaunchKernel'", (pid,))
        counted = lambda: scalar(agent.db, "SELECT coalesce(sum(count), 0) FROM aggregates WHERE pid = ? "
                                           "AND op = 'cuLaunchKernel'", (pid,))
        wait_until(lambda: rows() + lost_calls(agent.db) >= calls and counted() >= calls)
        assert lost_calls(agent.db) > 0
        assert rows() + lost_calls(agent.db) == calls
        assert counted() == calls

    def test_sigterm_flushes_and_exits_zero(self, agent):
        assert agent.stop(signal.SIGTERM) == 0
        assert scalar(agent.db, "SELECT value FROM meta WHERE key = 'agent_state'") == "stopped"
        assert scalar(agent.db, "PRAGMA integrity_check") == "ok"
        tracepoints = scalar(agent.db, "SELECT count(*) FROM probes WHERE library IS NULL")
        at_start = dict(query(agent.db, "SELECT substr(name, 1, instr(name, ':')), count(*) FROM probes "
                                        "WHERE library IS NOT NULL AND library NOT LIKE ? GROUP BY 1",
                              ("%/late-standin/%",)))
        net_traced = scalar(agent.db, "SELECT value FROM meta WHERE key = 'net_probe_state'") == "traced"
        assert tracepoints == 13 + (len(loader.NET_TRACEPOINTS) if net_traced else 0)   # + the TCP flows' (net_flows)
        assert at_start["uprobe:"] == at_start["uretprobe:"] >= 40  # every stand-in symbol, entry and return
        assert agent.probe_count == tracepoints + at_start["uprobe:"] + at_start["uretprobe:"]


# ---- run B: sampled, only the agent's own network namespace ---------------------------------------
NODE_B = "agent-test-b"
MAX_DB_B = 2 << 20


@pytest.fixture(scope="class")
def launcher_b(tmp_path_factory):
    """A launcher in a new network namespace, started before the agent (like sshd on a test-bed
    host): what it starts is in that namespace from its first instruction."""
    launcher = Launcher(tmp_path_factory.mktemp("launcher-b"), prefix=("unshare", "--net", "--"))
    yield launcher
    launcher.close()


@pytest.fixture(scope="class")
def agent_b(standin, launcher_b, tmp_path_factory):
    """The agent in the launcher's namespace with --scope netns, default targeting (every process
    that maps a CUDA library), 1 call in 2 sampled, --max-db 2M."""
    db = tmp_path_factory.mktemp("agent-b") / "trace.db"
    run = AgentRun(db, ["--node", NODE_B, "--scope", "netns", "--sample", "2", "--interval", "1", "--rescan", "0.5",
                        "--max-db", str(MAX_DB_B), *standin_libs(standin)],
                   prefix=("nsenter", f"--net=/proc/{launcher_b.pid}/ns/net", "--"))
    run.wait_ready()
    yield run
    run.stop(signal.SIGKILL)


def outside_workload(standin, *args, env=None):
    """A workload in the machine's own network namespace (out of the agent's scope)."""
    return subprocess.Popen([standin["workload"], "--lib-dir", standin["lib_dir"], *map(str, args)],
                            env={**os.environ, **STANDIN_ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


SCOPE_CALLS = 5000


@pytest.fixture(scope="class")
def inside_and_outside(agent_b, launcher_b, standin, tmp_path_factory):
    """The same flood inside the agent's namespace and outside it, started together once the
    agent has adopted the inside one (so it had every chance to see the other)."""
    go = tmp_path_factory.mktemp("scope") / "go"
    flood = ("--mode", "launch", "--iterations", SCOPE_CALLS, "--wait-file", go, "--hold-ms", "300")
    env = {"STRAGGLER_STANDIN_LAUNCH_US": "0"}
    inside = start_child_workload(launcher_b, standin, *map(str, flood), env=env)
    outside = outside_workload(standin, *flood, env=env)
    try:
        adopted = wait_until(lambda: scalar(agent_b.db, "SELECT count(*) FROM processes WHERE pid = ?",
                                            (inside.pid,)))
        assert adopted, agent_b.stderr_lines[-5:]
    finally:
        go.touch()
    out, err = outside.communicate(timeout=180)
    assert outside.returncode == 0, err
    return inside.workload_summary(), json.loads(out)


class TestSampledNetns:
    CALLS = SCOPE_CALLS

    def test_every_call_is_counted_while_only_a_sample_gets_rows(self, agent_b, inside_and_outside):
        inside, _ = inside_and_outside
        counted = lambda: scalar(agent_b.db, "SELECT coalesce(sum(count), 0) FROM aggregates WHERE pid = ? "
                                             "AND op = 'cuLaunchKernel'", (inside["pid"],))
        wait_until(lambda: counted() >= self.CALLS)
        assert counted() == self.CALLS
        rows = query(agent_b.db, "SELECT count(*), min(node), max(node) FROM events "
                                 "WHERE pid = ? AND op = 'cuLaunchKernel'", (inside["pid"],))[0]
        assert 0 < rows[0] < self.CALLS * 3 // 4
        assert rows[1] == rows[2] == NODE_B
        # each row says why it was kept
        reasons = query(agent_b.db, "SELECT DISTINCT detail FROM events WHERE pid = ? AND op = 'cuLaunchKernel'",
                        (inside["pid"],))
        assert reasons and all(json.loads(detail)["why"] for (detail,) in reasons)

    @pytest.mark.parametrize("mode,env,reason", [
        ("sync", {"STRAGGLER_STANDIN_SYNC_US": "1000"}, "offcpu"),     # sleeps: its thread leaves the CPU
        ("launch", {"STRAGGLER_STANDIN_LAUNCH_US": "12000"}, "slow"),  # spins longer than --slow-floor-us
    ])
    def test_slow_calls_and_calls_that_left_the_cpu_always_get_rows(self, agent_b, launcher_b, standin, mode, env,
                                                                       reason):
        calls = 40
        summary = start_child_workload(launcher_b, standin, "--mode", mode, "--iterations", str(calls),
                                       "--hold-ms", "300", env=env).workload_summary()
        rows = lambda: query(agent_b.db, "SELECT detail FROM events WHERE pid = ? AND source = 'driver'",
                             (summary["pid"],))
        wait_until(lambda: len(rows()) >= calls)
        assert len(rows()) == calls  # not 1 in 2
        assert all(reason in json.loads(detail)["why"] for (detail,) in rows())
        if mode == "sync":             # every synchronize has a row of its own (where ranks wait behind NCCL)
            assert all("sync" in json.loads(detail)["why"] for (detail,) in rows())

    def test_a_process_outside_the_namespace_is_not_traced(self, agent_b, inside_and_outside):
        _, outside = inside_and_outside
        for table in ("events", "aggregates", "processes"):
            assert scalar(agent_b.db, f"SELECT count(*) FROM {table} WHERE pid = ?", (outside["pid"],)) == 0, table

    def test_block_io_is_recorded_only_inside_the_namespace(self, agent_b, launcher_b, tmp_path):
        directory = block_device_dir(tmp_path)
        inside_file, outside_file = directory / f"straggler-in-{os.getpid()}.bin", directory / f"straggler-out-{os.getpid()}.bin"
        try:
            inside = launcher_b.start(["dd", "if=/dev/zero", f"of={inside_file}", "bs=1M", "count=4", "oflag=direct"])
            outside = subprocess.run(["dd", "if=/dev/zero", f"of={outside_file}", "bs=1M", "count=4", "oflag=direct"],
                                     capture_output=True, text=True, timeout=120)
            assert outside.returncode == 0, outside.stderr
            rc, _, err = inside.wait()
            assert rc == 0, err
        finally:
            inside_file.unlink(missing_ok=True)
            outside_file.unlink(missing_ok=True)
        written = lambda comm_pid: scalar(agent_b.db, "SELECT coalesce(sum(bytes), 0) FROM block_io WHERE pid = ? "
                                                      "AND op = 'block_write'", (comm_pid,))
        wait_until(lambda: written(inside.pid) >= 4 << 20)
        assert written(inside.pid) == 4 << 20
        assert scalar(agent_b.db, "SELECT count(*) FROM block_io WHERE comm = 'dd' AND pid != ?", (inside.pid,)) == 0

    def test_database_stays_under_max_db(self, agent_b, launcher_b, standin):
        calls = 80_000
        # paced over ~3 s, so the flood spans several of the agent's 1 s intervals: retention drops its
        # oldest whole intervals (rows and aggregates) while the newest are still being written
        flood = start_child_workload(launcher_b, standin, "--mode", "launch", "--iterations", str(calls),
                                     "--rate", "27000", "--hold-ms", "300", env={"STRAGGLER_STANDIN_LAUNCH_US": "0"})
        largest = 0
        done = Path(f"{flood.base}.rc")
        deadline = time.monotonic() + 300
        while not done.exists() and time.monotonic() < deadline:
            largest = max(largest, sum(os.path.getsize(agent_b.db + suffix) for suffix in ("", "-wal")
                                       if os.path.exists(agent_b.db + suffix)))
            time.sleep(0.05)
        flood.workload_summary()
        counted = lambda: scalar(agent_b.db, "SELECT coalesce(sum(count), 0) FROM aggregates WHERE pid = ?", (flood.pid,))
        wait_until(lambda: counted() > 0 and scalar(agent_b.db, "SELECT count(*) FROM events WHERE pid = ?",
                                                    (flood.pid,)) > 0)
        assert largest <= MAX_DB_B
        # the flood did not fit: its oldest whole intervals went, rows and aggregates alike
        assert counted() < calls
        assert scalar(agent_b.db, "SELECT count(*) FROM events WHERE pid = ?", (flood.pid,)) < calls // 2 * 0.9

    def test_sigkill_leaves_a_readable_database(self, agent_b, launcher_b, standin):
        # rows of its own, the newest (this agent runs at its --max-db after the flood above: its oldest
        # intervals, whatever they held, are dropped as new ones come)
        work = start_child_workload(launcher_b, standin, "--mode", "sync", "--iterations", "40", "--hold-ms", "300",
                                    env={"STRAGGLER_STANDIN_SYNC_US": "1000"}).workload_summary()
        mine = lambda: scalar(agent_b.db, "SELECT count(*) FROM events WHERE pid = ?", (work["pid"],))
        wait_until(lambda: mine() > 0)
        written = mine()
        assert agent_b.stop(signal.SIGKILL) == -signal.SIGKILL
        assert scalar(agent_b.db, "PRAGMA integrity_check") == "ok"
        assert scalar(agent_b.db, "SELECT value FROM meta WHERE key = 'schema_version'") == str(SCHEMA_VERSION)
        assert mine() >= written > 0
