"""One rank of a synchronous data-parallel job on the STAND-IN CUDA libraries (no GPU, no torch):

    python -m straggler_lab.demo.syncjob --rank R --world N --root ADDR:PORT --style blocking|enqueue \\
        --standin-dir DIR --seconds S --stop-file F --log CSV [--control FILE] [--cpu C] [--check]
        [--job-dir D] [--max-steps N] [--autogroup-nice N]

Each step, in the main thread: 20 x cuLaunchKernel of 8 blocks of 32 threads (the stand-in spins
20 us on the host per launch and gives each 8-block kernel 300 us of device time: about 6 ms of GPU
work; these are the defaults of STRAGGLER_STANDIN_LAUNCH_US / _KERNEL_US / _KERNEL_BLOCKS, with
_SYNC_US=0, unless the environment sets them), host compute (a busy loop of about 2 ms of CPU time in Python, outside any CUDA
call), cudaStreamSynchronize, then ncclAllReduce of 1024 float32 (its last element carries the
stop vote, below) on a communicator of ncclCommInitRank: the stand-in does a REAL
allreduce over TCP through rank 0 (STRAGGLER_STANDIN_NCCL_ROOT=--root), so one late rank makes
every rank wait. --style blocking: the call waits for the result; enqueue: the collective goes on the stand-in's device queue
and the call returns at once, as real NCCL does on a GPU; a last cudaStreamSynchronize then
ends the step when the collective is done.

Faults, read from --control (re-read when the file changes, at most once per step; the same
file is the stand-in's STRAGGLER_STANDIN_CONTROL), one `key=value` a line:
  host_ms=X     X ms more of host compute per step (busy loop, outside CUDA calls)
  io_mb=X       each step, write X MB into a file of the job dir and fdatasync it (main thread,
                outside CUDA calls, after the synchronize); the file is deleted at the end
  threads=N     N more threads of this process spin (each pinned to --cpu when given) until
                the value goes back to 0: the rank's own threads competing for its core
  gpu_factor=X  read by the stand-in: kernels take X times their device time
  kernels=X     X times the kernels launched per step (more work: a pipeline stage with more layers, a
                longer batch; the stand-in's GPU time grows with the kernels, as a real GPU's does)
  grid=X        the same kernels on X times the blocks each (more work: a longer batch, a longer sequence;
                the stand-in's GPU time grows with the blocks)
  pause_ms=X    every pause_every_s (default 2) seconds, one pause of X ms of host compute in a step
                (busy loop, outside CUDA calls): a full garbage collection
  imbalance=X   at every world-th step, its turn (step % world == rank), X times the kernels: put in every
                rank's file, a different rank does X times the work at each step (uneven batches)

Step log (--log, one line per step, flushed): rank,step,t_end_mono_ns,step_ms,coll_call_ms,coll_done_ms
(t_end_mono_ns: CLOCK_MONOTONIC, time.monotonic_ns(); coll_call_ms: the time inside the
ncclAllReduce call itself; coll_done_ms: from the call until the collective is done — the call, and
with collectives that only enqueue the synchronize after it: the rank's wait for its peers either way). The ranks stop together: every allreduce carries a stop vote (the
stop file, --seconds, --max-steps or a SIGTERM/SIGINT on any rank), so they all log the same
steps and exit 0 (3: an NCCL failure, e.g. a peer gone; 4: a wrong sum with --check).
--check verifies the allreduce's sum every step (exit 4 otherwise).

The process shows the torchrun identity (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and the stand-in settings in its environment (/proc/PID/environ): when they are
not there yet it re-executes itself once with them, so the agent can tell its rank.
This module must not import anything from the agent: it is the workload it observes.
"""
import argparse
import ctypes
import hashlib
import os
import signal
import sys
import threading
import time

LAUNCHES_PER_STEP = 20
LAUNCH_US = 20
KERNEL_US = 300
KERNEL_BLOCKS = 8       # a kernel's grid (blocks of 32 threads): KERNEL_US is its device time
HOST_MS = 2.0
COUNT = 1024            # float32 elements per allreduce; the last one is the stop vote
NCCL_FLOAT32 = 7
NCCL_SUM = 0
PATTERNS = 5            # the data changes every step (5 patterns), so --check checks real sums
PR_SET_NAME = 15
EXEC_MARK = "STRAGGLER_SYNCJOB_EXEC"
CONTROL_KEYS = ("host_ms", "io_mb", "threads", "gpu_factor", "kernels", "grid", "pause_ms", "pause_every_s",
                "imbalance")


class JobError(RuntimeError):
    """One line: what went wrong in this rank."""


def set_thread_name(name):
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _comm_of(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "gone"


# ---------------------------------------------------------------- the fault control file

def parse_control(text):
    """{key: float} for the keys this job knows; malformed lines are ignored."""
    values = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        if key not in CONTROL_KEYS:
            continue
        try:
            number = float(value.strip())
        except ValueError:
            continue
        if number == number and 0 <= number <= 1e6:  # not NaN, not negative
            values[key] = number
    return values


class Control:
    """The control file, re-read only when its (mtime, size, inode) change; no file = no fault."""

    def __init__(self, path):
        self.path = path
        self.sig = None
        self.values = {}

    def poll(self):
        """True when the values may have changed."""
        if not self.path:
            return False
        try:
            st = os.stat(self.path)
            sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            sig = None
        if sig == self.sig:
            return False
        self.sig = sig
        try:
            with open(self.path) as f:
                self.values = parse_control(f.read()) if sig else {}
        except OSError:
            self.values = {}
        return True

    def get(self, key, default=0.0):
        return self.values.get(key, default)


# ---------------------------------------------------------------- host work

def _spin_loop(n):
    x = 0
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def calibrate(trials=15, n=4000):
    """Loop iterations per millisecond of this CPU (the best of a few trials, in the thread's own
    CPU time, so that other tasks on the core at start-up do not shrink the job's work)."""
    best = None
    for _ in range(trials):
        t0 = time.thread_time_ns()
        _spin_loop(n)
        dt = time.thread_time_ns() - t0
        if dt > 0:
            best = dt if best is None else min(best, dt)
    return n / max((best or 1) / 1e6, 1e-6)


class Spinners:
    """N threads of this process that burn CPU (hashing a large buffer: the GIL is released
    while hashing, so they really compete for the core, as native threads would)."""

    BUF = b"\x5a" * (8 << 20)

    def __init__(self, cpu=None):
        self.cpu = cpu
        self.threads = []   # (thread, stop event)

    def set(self, n):
        n = max(0, int(n))
        while len(self.threads) > n:
            thread, stop = self.threads.pop()
            stop.set()
            thread.join(timeout=5)
        while len(self.threads) < n:
            stop = threading.Event()
            thread = threading.Thread(target=self._spin, args=(stop,), name=f"spin-{len(self.threads)}", daemon=True)
            thread.start()
            self.threads.append((thread, stop))

    def _spin(self, stop):
        set_thread_name("syncjob-spin")
        if self.cpu is not None:
            try:
                os.sched_setaffinity(0, {self.cpu})  # this thread
            except OSError:
                pass
        while not stop.is_set():
            hashlib.sha256(self.BUF).digest()

    def close(self):
        self.set(0)


class SyncIO:
    """io_mb: X MB written into one file of the job dir and fdatasync'ed, every step."""

    def __init__(self, path):
        self.path = path
        self.fd = None
        self.buf = b""

    def set(self, mb):
        size = int(mb * (1 << 20))
        if size <= 0:
            self.close()
            return
        if len(self.buf) != size:
            self.buf = os.urandom(1 << 16) * (size >> 16) + os.urandom(size & 0xFFFF)
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def step(self):
        if self.fd is None:
            return
        view = memoryview(self.buf)
        off = 0
        while off < len(view):
            off += os.pwrite(self.fd, view[off:], off)
        os.fdatasync(self.fd)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.buf = b""


# ---------------------------------------------------------------- the stand-in libraries

class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Gpu:
    """The stand-in libcuda / libcudart / libnccl, through ctypes."""

    def __init__(self, lib_dir):
        self.cuda = ctypes.CDLL(os.path.join(lib_dir, "libcuda.so.1"))
        self.cudart = ctypes.CDLL(os.path.join(lib_dir, "libcudart.so.12"))
        self.nccl = ctypes.CDLL(os.path.join(lib_dir, "libnccl.so.2"))
        c_uint, c_void_p, c_int = ctypes.c_uint, ctypes.c_void_p, ctypes.c_int
        self.cuInit = self.cuda.cuInit
        self.cuInit.argtypes = [c_uint]
        self.cuLaunchKernel = self.cuda.cuLaunchKernel
        self.cuLaunchKernel.argtypes = [c_void_p] + [c_uint] * 7 + [c_void_p, c_void_p, c_void_p]
        self.cudaStreamSynchronize = self.cudart.cudaStreamSynchronize
        self.cudaStreamSynchronize.argtypes = [c_void_p]
        n = self.nccl
        n.ncclGetUniqueId.argtypes = [ctypes.POINTER(NcclUniqueId)]
        n.ncclCommInitRank.argtypes = [ctypes.POINTER(c_void_p), c_int, NcclUniqueId, c_int]
        n.ncclAllReduce.argtypes = [c_void_p, c_void_p, ctypes.c_size_t, c_int, c_int, c_void_p, c_void_p]
        n.ncclCommGetAsyncError.argtypes = [c_void_p, ctypes.POINTER(c_int)]
        n.ncclCommDestroy.argtypes = [c_void_p]
        n.ncclGetErrorString.argtypes = [c_int]
        n.ncclGetErrorString.restype = ctypes.c_char_p
        self.ncclAllReduce = n.ncclAllReduce
        self.kernel = c_void_p(0xF00D)   # a made-up CUfunction: the stand-in does not look at it

    def nccl_error(self, rc):
        return f"{rc} ({self.nccl.ncclGetErrorString(rc).decode()})"

    def comm_init(self, world, rank):
        uid = NcclUniqueId()
        rc = self.nccl.ncclGetUniqueId(ctypes.byref(uid))  # the stand-in meets at STRAGGLER_STANDIN_NCCL_ROOT
        comm = ctypes.c_void_p()
        if rc == 0:
            rc = self.nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
        if rc != 0:
            raise JobError(f"ncclCommInitRank (rank {rank} of {world}) failed: {self.nccl_error(rc)}")
        return comm

    def async_error(self, comm):
        err = ctypes.c_int(0)
        self.nccl.ncclCommGetAsyncError(comm, ctypes.byref(err))
        return err.value


# ---------------------------------------------------------------- the job

def build_arg_parser():
    p = argparse.ArgumentParser(prog="python -m straggler_lab.demo.syncjob", description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True, help="number of ranks")
    p.add_argument("--local-rank", type=int, default=0, help="its rank on its node (LOCAL_RANK; default 0)")
    p.add_argument("--root", required=True, help="ADDR:PORT where rank 0 listens (STRAGGLER_STANDIN_NCCL_ROOT)")
    p.add_argument("--style", choices=["blocking", "enqueue"], default="blocking",
                   help="NCCL style (STRAGGLER_STANDIN_NCCL_MODE), see above")
    p.add_argument("--standin-dir", required=True, help="the stand-in libraries (built here when missing)")
    p.add_argument("--seconds", type=float, default=60.0, help="stop after this long (always bounded)")
    p.add_argument("--stop-file", help="stop (all ranks, at the same step) when this file exists")
    p.add_argument("--log", required=True, help="the step log (CSV)")
    p.add_argument("--control", help="the fault control file (see above)")
    p.add_argument("--cpu", type=int, default=None, help="pin this rank (and its spinning threads) to this CPU")
    p.add_argument("--job-dir", help="where io_mb writes (default: the --log file's directory)")
    p.add_argument("--check", action="store_true", help="verify the allreduce's result every step (exit 4 if wrong)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--autogroup-nice", type=int, default=None,
                   help="when this rank leads a session of its own: the nice value of its scheduling autogroup "
                        "(/proc/self/autogroup), its share of the CPU against other sessions")
    return p


def _exec_with_identity(args, argv):
    """Re-execute once with the torchrun identity and the stand-in settings in the environment
    (what /proc/PID/environ shows to the agent); returns only when they are already there."""
    addr, _, port = args.root.rpartition(":")
    want = {
        "RANK": str(args.rank), "LOCAL_RANK": str(args.local_rank), "WORLD_SIZE": str(args.world),
        "MASTER_ADDR": addr.strip("[]"), "MASTER_PORT": port,
        "STRAGGLER_STANDIN_NCCL_MODE": args.style, "STRAGGLER_STANDIN_NCCL_ROOT": args.root,
    }
    # the stand-in's call durations: these defaults unless the environment sets them
    for key, value in (("STRAGGLER_STANDIN_LAUNCH_US", LAUNCH_US), ("STRAGGLER_STANDIN_KERNEL_US", KERNEL_US),
                       ("STRAGGLER_STANDIN_KERNEL_BLOCKS", KERNEL_BLOCKS), ("STRAGGLER_STANDIN_SYNC_US", 0)):
        want[key] = os.environ.get(key) or str(value)
    if args.control:
        want["STRAGGLER_STANDIN_CONTROL"] = os.path.abspath(args.control)
    else:
        want["STRAGGLER_STANDIN_CONTROL"] = ""
    if all(os.environ.get(k) == v for k, v in want.items()):
        return
    if os.environ.get(EXEC_MARK) == "1":  # exec'ed once already and still not there: set them here
        os.environ.update(want)
        return
    env = dict(os.environ, **want)
    env[EXEC_MARK] = "1"
    agent_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if agent_dir not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = agent_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "straggler_lab.demo.syncjob", *argv], env)


def run(args):
    set_thread_name("syncjob")  # the threads started from here on inherit the name
    stop = {"signal": None}
    # SIGTERM/SIGINT: blocked in every thread (the ones started later inherit the mask) and taken
    # by one waiting thread, which says who sent it; the next step's stop vote ends the job
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

    def wait_signal():
        info = signal.sigwaitinfo({signal.SIGTERM, signal.SIGINT})
        stop["sender"] = f"pid {info.si_pid} ({_comm_of(info.si_pid)})"
        stop["signal"] = info.si_signo
    threading.Thread(target=wait_signal, name="signals", daemon=True).start()

    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # before the libraries: the stand-in's device thread inherits it
    if args.autogroup_nice is not None and os.getsid(0) == os.getpid():  # never renice the caller's session
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(args.autogroup_nice))
        except OSError as exc:
            print(f"syncjob rank {args.rank}: autogroup nice not set: {exc}", file=sys.stderr, flush=True)
    from straggler_lab.standin import build_standin  # the stand-in's builder only (no agent code)
    build_standin(args.standin_dir)
    gpu = Gpu(args.standin_dir)
    gpu.cuInit(0)
    iters_per_ms = calibrate()
    job_dir = args.job_dir or os.path.dirname(os.path.abspath(args.log))
    control = Control(args.control)
    spinners = Spinners(args.cpu)
    sync_io = SyncIO(os.path.join(job_dir, f"io-rank{args.rank}.bin"))
    log = open(args.log, "w")
    comm = None
    t_start = time.monotonic()
    try:
        log.write("rank,step,t_end_mono_ns,step_ms,coll_call_ms,coll_done_ms\n")
        log.flush()
        comm = gpu.comm_init(args.world, args.rank)
        print(f"syncjob rank {args.rank}/{args.world} pid {os.getpid()}: {args.style} collectives through "
              f"{args.root}, cpu {args.cpu if args.cpu is not None else 'any'}, {iters_per_ms:.0f} loop iterations/ms "
              f"(STAND-IN CUDA libraries, no GPU)", file=sys.stderr, flush=True)
        floats = ctypes.c_float * COUNT
        send, recv = floats(), floats()
        nbytes = 4 * (COUNT - 1)
        patterns, expected = [], []
        total = args.world * (args.world + 1) // 2
        for k in range(PATTERNS):
            patterns.append(bytes((ctypes.c_float * (COUNT - 1))(*([float((args.rank + 1) * (k + 1))] * (COUNT - 1)))))
            expected.append(bytes((ctypes.c_float * (COUNT - 1))(*([float(total * (k + 1))] * (COUNT - 1)))))
        host_iters = int(HOST_MS * iters_per_ms)
        extra_iters = 0
        base_blocks = int(os.environ.get("STRAGGLER_STANDIN_KERNEL_BLOCKS") or KERNEL_BLOCKS)   # KERNEL_US's grid
        launches, blocks = LAUNCHES_PER_STEP, base_blocks
        pause_iters, pause_every_s, next_pause = 0, 2.0, time.monotonic()
        imbalance = 1.0
        launch, kernel = gpu.cuLaunchKernel, gpu.kernel
        step = 0
        t_step = time.monotonic_ns()
        while True:
            if control.poll():
                extra_iters = int(control.get("host_ms") * iters_per_ms)
                sync_io.set(control.get("io_mb"))
                spinners.set(control.get("threads"))
                launches = max(1, int(round(LAUNCHES_PER_STEP * (control.get("kernels") or 1.0))))
                blocks = max(1, int(round(base_blocks * (control.get("grid") or 1.0))))
                pause_iters = int(control.get("pause_ms") * iters_per_ms)
                pause_every_s = control.get("pause_every_s") or 2.0
                imbalance = control.get("imbalance") or 1.0
            if pause_iters and time.monotonic() >= next_pause:
                _spin_loop(pause_iters)
                next_pause = time.monotonic() + pause_every_s
            turn = imbalance != 1.0 and step % args.world == args.rank
            for _ in range(int(round(launches * imbalance)) if turn else launches):
                launch(kernel, blocks, 1, 1, 32, 1, 1, 0, None, None, None)
            _spin_loop(host_iters + extra_iters)
            gpu.cudaStreamSynchronize(None)
            sync_io.step()
            want_stop = (stop["signal"] is not None or time.monotonic() - t_start >= args.seconds
                         or (args.stop_file and os.path.exists(args.stop_file))
                         or (args.max_steps and step + 1 >= args.max_steps))
            ctypes.memmove(send, patterns[step % PATTERNS], nbytes)
            send[COUNT - 1] = 1.0 if want_stop else 0.0
            c0 = time.monotonic_ns()
            rc = gpu.ncclAllReduce(send, recv, COUNT, NCCL_FLOAT32, NCCL_SUM, comm, None)
            c1 = time.monotonic_ns()
            if args.style == "enqueue":
                gpu.cudaStreamSynchronize(None)
                if rc == 0:
                    rc = gpu.async_error(comm)
            t_end = time.monotonic_ns()
            if rc != 0:
                raise JobError(f"ncclAllReduce failed at step {step + 1}: {gpu.nccl_error(rc)}")
            step += 1
            if args.check and ctypes.string_at(recv, nbytes) != expected[(step - 1) % PATTERNS]:
                print(f"syncjob rank {args.rank}: step {step}: wrong allreduce result: {recv[0]} "
                      f"(want {total * ((step - 1) % PATTERNS + 1)})", file=sys.stderr, flush=True)
                return 4
            log.write(f"{args.rank},{step},{t_end},{(t_end - t_step) / 1e6:.3f},{(c1 - c0) / 1e6:.3f},"
                      f"{(t_end - c0) / 1e6:.3f}\n")
            log.flush()
            t_step = t_end
            if recv[COUNT - 1] > 0:  # some rank voted to stop: everyone stops after this step
                break
        why = (f"signal {stop['signal']} from {stop.get('sender')}" if stop["signal"] is not None else "stop vote")
        print(f"syncjob rank {args.rank}: {step} steps in {time.monotonic() - t_start:.1f}s, stopped ({why})",
              file=sys.stderr, flush=True)
        return 0
    finally:
        spinners.close()
        sync_io.close()
        if comm is not None:
            gpu.nccl.ncclCommDestroy(comm)
        log.close()


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_arg_parser().parse_args(argv)
    if args.world < 1 or not 0 <= args.rank < args.world:
        print(f"syncjob: error: --rank {args.rank} is not in 0..{args.world - 1}", file=sys.stderr)
        return 2
    _exec_with_identity(args, argv)
    try:
        return run(args)
    except JobError as exc:
        print(f"syncjob rank {args.rank}: error: {exc}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
