"""The synchronous job on the stand-in (straggler_lab.demo.syncjob).

Fast, without eBPF or the test bed: two ranks on 127.0.0.1 run in lockstep through a REAL
allreduce (the stand-in libnccl over TCP), in both NCCL styles; a fault on one rank slows both
(the job is synchronous); the stand-in's defaults are untouched (no device thread).
The harness on the test bed with the agents (straggler_lab.demo.harness) is exercised by
tests/test_diagnosis.py: every case checks its times, each agent's store of its rank, and leftovers.
"""
import csv
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(REPO / "agent"), PYTHONUNBUFFERED="1")
for _key in list(ENV):
    if _key.startswith("STRAGGLER_STANDIN_") or _key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "STRAGGLER_SYNCJOB_EXEC"):
        del ENV[_key]

# a fault is in effect from the step after the control file changed (each rank polls it once a step,
# the stand-in at each synchronize): the steps before that are left out of "after"
SETTLE_STEPS = 3


def free_port():
    """A TCP port nobody listens on now, from the kernel (no fixed range that another session running
    these tests at the same time could share: its rank 0 would meet ours)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory):
    from straggler_lab.standin import build_standin
    lib_dir = tmp_path_factory.mktemp("standin")
    build_standin(lib_dir)
    return lib_dir


class Job:
    """Two (or N) ranks of syncjob on 127.0.0.1, each with its own control file and log."""

    def __init__(self, tmp_path, standin_dir, style="blocking", world=2, seconds=20, check=True, controls=None):
        self.dir = tmp_path
        self.world = world
        self.stop_file = tmp_path / "STOP"
        self.procs = []
        port = free_port()
        controls = controls or {}
        for r in range(world):
            control = tmp_path / f"control-{r}"
            control.write_text(controls.get(r, ""))
            argv = [PYTHON, "-m", "straggler_lab.demo.syncjob", "--rank", str(r), "--world", str(world),
                    "--root", f"127.0.0.1:{port}", "--style", style, "--standin-dir", str(standin_dir),
                    "--seconds", str(seconds), "--stop-file", str(self.stop_file), "--log", str(self.log(r)),
                    "--control", str(control), "--cpu", str(r % os.cpu_count())]
            if check:
                argv.append("--check")
            self.procs.append(subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               text=True, start_new_session=True))

    def log(self, r):
        return self.dir / f"steps-{r}.csv"

    def control(self, r, text):
        tmp = self.dir / f"control-{r}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / f"control-{r}")

    def rows(self, r):
        try:
            with open(self.log(r), newline="") as f:
                return [row for row in csv.DictReader(f) if row.get("coll_call_ms")]
        except OSError:
            return []

    def rows_after(self, r, t_ns):
        """Rank r's steps that ended after t_ns (CLOCK_MONOTONIC, as the step log's t_end_mono_ns)."""
        return [row for row in self.rows(r) if int(row["t_end_mono_ns"]) > t_ns]

    def wait_steps(self, n, after_ns=None, timeout_s=60):
        """Wait (bounded) until every rank has logged n steps (that ended after after_ns, if given)."""
        def counts():
            return [len(self.rows(r) if after_ns is None else self.rows_after(r, after_ns)) for r in range(self.world)]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if min(counts()) >= n:
                return
            for p in self.procs:
                assert p.poll() is None, f"a rank exited early: {p.communicate()[0][-2000:]}"
            time.sleep(0.1)
        raise AssertionError(f"not {n} steps in {timeout_s}s: {counts()}")

    def stop(self, timeout_s=20):
        self.stop_file.touch()
        outs = []
        for p in self.procs:
            try:
                out, _ = p.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate(timeout=10)
            outs.append(out)
        return outs

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def median_of(rows, key):
    assert rows, f"no steps to take the median {key} of"
    return statistics.median(float(r[key]) for r in rows)


@pytest.mark.parametrize("style", ["blocking", "enqueue"])
def test_two_ranks_step_in_lockstep_and_the_allreduce_sums(tmp_path, standin_dir, style):
    job = Job(tmp_path, standin_dir, style=style)
    try:
        job.wait_steps(60)
        outs = job.stop()
    finally:
        job.kill()
    for r, p in enumerate(job.procs):
        assert p.returncode == 0, outs[r][-2000:]
        assert "STAND-IN" in outs[r]
    steps = [[int(row["step"]) for row in job.rows(r)] for r in range(2)]
    assert steps[0] == steps[1] == list(range(1, len(steps[0]) + 1))  # the same steps, every one
    assert len(steps[0]) >= 60
    # ~6 ms of device time per step (20 kernels x 300 us): the step cannot be shorter
    assert median_of(job.rows(0), "step_ms") >= 5.5
    for r in range(2):
        assert not list(tmp_path.glob(f"io-rank{r}.bin"))


def test_a_one_rank_job_and_a_rank_that_cannot_join(tmp_path, standin_dir):
    """World 1 needs no peer (--max-steps bounds it); a rank whose rank 0 never comes fails to
    join within STRAGGLER_STANDIN_NCCL_TIMEOUT_S and says so (exit 3), it does not hang."""
    port = free_port()
    proc = subprocess.run([PYTHON, "-m", "straggler_lab.demo.syncjob", "--rank", "0", "--world", "1", "--root",
                           f"127.0.0.1:{port}", "--standin-dir", str(standin_dir), "--seconds", "1", "--log",
                           str(tmp_path / "s.csv"), "--check", "--max-steps", "20"],
                          env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(csv.DictReader(open(tmp_path / "s.csv")))) == 20
    env = dict(ENV, STRAGGLER_STANDIN_NCCL_TIMEOUT_S="2")
    proc = subprocess.run([PYTHON, "-m", "straggler_lab.demo.syncjob", "--rank", "1", "--world", "2", "--root",
                           f"127.0.0.1:{free_port()}", "--standin-dir", str(standin_dir), "--seconds", "5", "--log",
                           str(tmp_path / "t.csv")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "could not join rank 0" in proc.stderr and "ncclCommInitRank" in proc.stderr


# each fault adds far more to a step than a busy machine adds to its host part (the device time runs
# beside it): 20 ms of CPU time; 54 ms more of device time (20 kernels x 300 us x 9)
@pytest.mark.parametrize("fault", ["host_ms=20", "gpu_factor=10"])
def test_a_fault_on_one_rank_slows_every_rank(tmp_path, standin_dir, fault):
    job = Job(tmp_path, standin_dir, style="blocking")
    try:
        job.wait_steps(80)
        t_fault = time.monotonic_ns()
        job.control(1, fault + "\n")
        job.wait_steps(SETTLE_STEPS + 40, after_ns=t_fault)   # steps, not seconds: as many on a busy machine
        outs = job.stop()
    finally:
        job.kill()
    for r, p in enumerate(job.procs):
        assert p.returncode == 0, outs[r][-2000:]
    for r in range(2):
        before = median_of([row for row in job.rows(r) if int(row["t_end_mono_ns"]) <= t_fault], "step_ms")
        after = median_of(job.rows_after(r, t_fault)[SETTLE_STEPS:], "step_ms")
        # x3 and more on a quiet machine; this 2-core VM's CPU speed itself varies by up to x1.7
        assert after >= 1.5 * before, f"rank {r}: {before:.1f} -> {after:.1f} ms/step with {fault} on rank 1"
    # the rank without the fault waits for the other one inside the collective (blocking style)
    assert median_of(job.rows_after(0, t_fault)[SETTLE_STEPS:], "coll_call_ms") >= 3.0


@pytest.mark.parametrize("style", ["blocking", "enqueue"])
def test_enqueue_returns_at_once_blocking_waits_in_the_call(tmp_path, standin_dir, style):
    job = Job(tmp_path, standin_dir, style=style, controls={1: "host_ms=20\n"})
    try:
        job.wait_steps(40)
        outs = job.stop()
    finally:
        job.kill()
    for r, p in enumerate(job.procs):
        assert p.returncode == 0, outs[r][-2000:]
    rows = job.rows(0)[5:]
    step = median_of(rows, "step_ms")
    assert step >= 12  # rank 1's 20 ms (of CPU time) of host compute sets the pace of both
    if style == "enqueue":
        # the call returns at once: on a busy machine some calls still wait for the CPU after they wake the
        # stand-in's device thread, so the faster quarter of the calls is what says it (a blocking call
        # waits ~20 ms for rank 1 in every step)
        fast_quarter = statistics.quantiles((float(r["coll_call_ms"]) for r in rows), n=4)[0]
        assert fast_quarter < 0.5, f"enqueue: three quarters of the ncclAllReduce calls took {fast_quarter:.2f} ms or more"
        # ... and the wait for rank 1 is in the synchronize after it: until the collective is done
        done = median_of(rows, "coll_done_ms")
        assert done >= 5, f"enqueue: the allreduce was done {done:.2f} ms after its call while rank 1 is ~20 ms late"
    else:
        call = median_of(rows, "coll_call_ms")
        assert call >= 5, f"blocking: ncclAllReduce took only {call:.2f} ms while rank 1 is ~20 ms late"


def test_sigterm_on_one_rank_stops_both_cleanly_and_faults_are_cleaned_up(tmp_path, standin_dir):
    job = Job(tmp_path, standin_dir, style="enqueue", controls={0: "io_mb=0.5\nthreads=2\n"})
    try:
        job.wait_steps(20)
        pid0 = job.procs[0].pid
        comms = {Path(f"/proc/{pid0}/task/{tid}/comm").read_text().strip() for tid in os.listdir(f"/proc/{pid0}/task")}
        assert {"syncjob", "syncjob-spin", "standin-gpu"} <= comms
        assert (tmp_path / "io-rank0.bin").exists()
        environ = Path(f"/proc/{pid0}/environ").read_bytes().split(b"\0")
        assert b"RANK=0" in environ and b"WORLD_SIZE=2" in environ
        job.procs[1].send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=20)[0] for p in job.procs]
    finally:
        job.kill()
    assert [p.returncode for p in job.procs] == [0, 0], outs
    assert "signal 15" in outs[1]
    assert [row["step"] for row in job.rows(0)] == [row["step"] for row in job.rows(1)]
    assert not (tmp_path / "io-rank0.bin").exists()


STANDIN_DEFAULTS = textwrap.dedent("""
    import ctypes, os, sys, time
    d = sys.argv[1]
    cuda = ctypes.CDLL(os.path.join(d, "libcuda.so.1"))
    rt = ctypes.CDLL(os.path.join(d, "libcudart.so.12"))
    nccl = ctypes.CDLL(os.path.join(d, "libnccl.so.2"))
    cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    nccl.ncclAllReduce.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t, ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 2
    syncs, colls, rcs = [], [], set()
    for _ in range(20):   # the shortest of 20: a call preempted on a busy machine does not count
        for _ in range(10):
            cuda.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
        t0 = time.monotonic_ns(); rt.cudaStreamSynchronize(None); syncs.append(time.monotonic_ns() - t0)
        t0 = time.monotonic_ns(); rcs.add(nccl.ncclAllReduce(None, None, 10, 7, 0, ctypes.c_void_p(0xc033), None))
        colls.append(time.monotonic_ns() - t0)
    print(len(os.listdir("/proc/self/task")), min(syncs) // 1000, min(colls) // 1000, max(rcs))
""")


def test_standin_defaults_unchanged_no_device_thread(standin_dir):
    """Without the new variables: no thread, the same call durations as before (each the shortest of
    20 calls: a sleep of 100 us takes about that when not preempted, and no kernel is waited for)."""
    proc = subprocess.run([PYTHON, "-c", STANDIN_DEFAULTS, str(standin_dir)], env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    threads, sync_us, coll_us, rc = map(int, proc.stdout.split())
    assert threads == 1
    assert 100 <= sync_us < 2000       # STRAGGLER_STANDIN_SYNC_US default 100
    assert 200 <= coll_us < 2000 and rc == 0  # a made-up communicator: the plain 200 us sleep


COLLECTIVES = textwrap.dedent("""
    import ctypes, os, sys
    d, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for n in ("libcuda.so.1", "libcudart.so.12"):
        ctypes.CDLL(os.path.join(d, n))
    nccl = ctypes.CDLL(os.path.join(d, "libnccl.so.2"))
    class Id(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]
    uid = Id(); assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, Id, ctypes.c_int]
    assert nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank) == 0
    n = ctypes.c_int(); nccl.ncclCommCount(comm, ctypes.byref(n)); assert n.value == world
    V = ctypes.c_void_p
    sig7 = [V, V, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, V, V]
    nccl.ncclAllReduce.argtypes = sig7; nccl.ncclReduceScatter.argtypes = sig7; nccl.ncclBroadcast.argtypes = sig7
    nccl.ncclAllGather.argtypes = [V, V, ctypes.c_size_t, ctypes.c_int, V, V]
    I32, F64 = ctypes.c_int32 * 6, ctypes.c_double * 6
    s = I32(*[rank + 1 + i for i in range(6)]); out = I32()
    assert nccl.ncclAllReduce(s, out, 6, 2, 2, comm, None) == 0          # int32 max
    assert list(out) == [world + i for i in range(6)], list(out)
    s = F64(*[float(rank + 1)] * 6); out = F64()
    assert nccl.ncclAllReduce(s, out, 6, 8, 4, comm, None) == 0          # float64 avg
    assert list(out) == [(world + 1) / 2] * 6, list(out)
    s = I32(*[100 * rank + i for i in range(6)]); out = I32()
    assert nccl.ncclBroadcast(s, out, 6, 2, world - 1, comm, None) == 0  # from the last rank
    assert list(out) == [100 * (world - 1) + i for i in range(6)], list(out)
    s = (ctypes.c_int32 * 2)(rank, -rank); out = (ctypes.c_int32 * (2 * world))()
    assert nccl.ncclAllGather(s, out, 2, 2, comm, None) == 0
    assert list(out) == [v for r in range(world) for v in (r, -r)], list(out)
    s = (ctypes.c_float * (2 * world))(*[1.0] * (2 * world)); out = (ctypes.c_float * 2)()
    assert nccl.ncclReduceScatter(s, out, 2, 7, 0, comm, None) == 0
    assert list(out) == [float(world)] * 2, list(out)
    assert nccl.ncclAllReduce(s, out, 2, 6, 0, comm, None) == 4          # float16 is not reduced: invalid argument
    assert nccl.ncclCommDestroy(comm) == 0
    print("ok", rank)
""")


@pytest.mark.parametrize("mode", ["blocking", "enqueue"])
def test_standin_collectives_move_real_data(tmp_path, standin_dir, mode):
    env = dict(ENV, STRAGGLER_STANDIN_NCCL_ROOT=f"127.0.0.1:{free_port()}", STRAGGLER_STANDIN_NCCL_MODE=mode,
               STRAGGLER_STANDIN_NCCL_TIMEOUT_S="20")
    if mode == "enqueue":  # enqueued: the result is there once the device is drained
        script = COLLECTIVES.replace("== 0          #", "== 0 and rt.cudaDeviceSynchronize() == 0 #")
        script = script.replace("assert nccl.ncclBroadcast(s, out, 6, 2, world - 1, comm, None) == 0",
                                "assert nccl.ncclBroadcast(s, out, 6, 2, world - 1, comm, None) == 0 and rt.cudaDeviceSynchronize() == 0")
        script = script.replace("assert nccl.ncclAllGather(s, out, 2, 2, comm, None) == 0",
                                "assert nccl.ncclAllGather(s, out, 2, 2, comm, None) == 0 and rt.cudaDeviceSynchronize() == 0")
        script = script.replace("assert nccl.ncclReduceScatter(s, out, 2, 7, 0, comm, None) == 0",
                                "assert nccl.ncclReduceScatter(s, out, 2, 7, 0, comm, None) == 0 and rt.cudaDeviceSynchronize() == 0")
        script = script.replace('for n in ("libcuda.so.1", "libcudart.so.12"):\n    ctypes.CDLL(os.path.join(d, n))',
                                'ctypes.CDLL(os.path.join(d, "libcuda.so.1")); rt = ctypes.CDLL(os.path.join(d, "libcudart.so.12"))')
    else:
        script = COLLECTIVES
    procs = [subprocess.Popen([PYTHON, "-c", script, str(standin_dir), str(r), "3"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(3)]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert [o.split()[-2:] for o in outs] == [["ok", str(r)] for r in range(3)]


# ---------------------------------------------------------------- the harness on the test bed


def _step_logs(case_dir, waits_ms, step_ms=20.0, seconds=20):
    """steps-rank{r}.csv as the job writes them: a step every step_ms, rank r waiting waits_ms[r] of it."""
    for r, wait in enumerate(waits_ms):
        with open(case_dir / f"steps-rank{r}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_end_mono_ns", "step_ms", "coll_done_ms"])
            for i in range(int(seconds * 1000 / step_ms)):
                w.writerow([int((i + 1) * step_ms * 1e6), step_ms, wait])


@pytest.mark.parametrize("waits, clean", [([6.0, 6.2, 5.9, 6.1], True),      # nobody held back
                                          ([6.0, 2.6, 6.1, 5.9], False)])    # rank 1: others wait 3.4 ms more
def test_a_job_without_faults_checks_that_it_ran_clean(tmp_path, waits, clean):
    """A clean job of the harness checks itself as a fault does (straggler_lab.demo.schedule.clean_check):
    a rank the others waited for all along (x1.2 here, over CLEAN_MAX) makes it no clean job, so naming
    that rank is no phantom."""
    from straggler_lab.demo import schedule as sc
    _step_logs(tmp_path, waits)
    run = sc.ScheduleRun(phases=[], style="blocking", t_start_ns=0, t_end_ns=int(21e9), clean_step_ms=20.0,
                         agent_dbs={}, rank_nodes={r: f"h{r}" for r in range(len(waits))}, case_dir=str(tmp_path),
                         real_minus_mono_ns=0)
    ok, why = sc.clean_check(run)
    assert ok is clean, why
    assert ("rank 1" in why) is (not clean), why
