"""Fault processes for the synchronous-job harness (straggler_lab.demo.harness): a CPU hog and a
disk hog, each a process of its own, named by what it does (prctl PR_SET_NAME: that is the
comm that ps, /proc/PID/comm and the kernel's tracepoints show, and what the agent names as
"who ran instead" / "who wrote"):

    python -m straggler_lab.demo.hogs cpu  [--threads 2] [--cpu C] [--nice -10] [--rr] [--seconds S]
                                            [--on-s X --off-s Y]
    python -m straggler_lab.demo.hogs disk --dir DIR [--threads 4] [--chunk-mb 4] [--file-mb 64] [--seconds S]

cpu (comm "cpuhog"): N threads that burn CPU (hashing a large buffer: the GIL is released
while hashing, so they really run at once), pinned to --cpu when given; --nice lowers the
nice value of its threads and, when it leads a session of its own, of that session's
scheduling autogroup (/proc/self/autogroup: with autogroups on, a plain nice only counts
against its own session); --rr makes its threads
SCHED_RR priority 1 instead (real-time: they take the core from every normal task); with --on-s and
--off-s it burns for X seconds, sleeps for Y, and again (a fault that comes and goes), from its start.
disk (comm "diskhog"): --threads writers, each writing --chunk-mb with O_DIRECT at rolling
offsets of its own --file-mb file under --dir, with an fdatasync after each write, in a loop;
the files are removed at the end.

Both run until SIGTERM/SIGINT or --seconds (always bounded). Standard library only.
"""
import argparse
import ctypes
import hashlib
import mmap
import os
import signal
import sys
import threading
import time

PR_SET_NAME = 15


def set_comm(name):
    """This thread's comm (threads started later inherit it)."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stop_event(seconds):
    stop = threading.Event()

    def on_signal(_signum, _frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = time.monotonic() + seconds
    return stop, deadline


def run_cpu(args):
    set_comm("cpuhog")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.rr:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    elif args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        if os.getsid(0) == os.getpid():  # only a session of its own: never renice the caller's
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write(str(args.nice))
            except OSError:
                pass
    stop, deadline = _stop_event(args.seconds)
    buf = b"\xa5" * (4 << 20)

    started = time.monotonic()
    cycle = (args.on_s or 0) + (args.off_s or 0)

    def spin():
        while not stop.is_set():
            if cycle and args.on_s:
                into = (time.monotonic() - started) % cycle
                if into >= args.on_s:              # the off part: sleep to the next on part
                    stop.wait(cycle - into)
                    continue
            hashlib.sha256(buf).digest()
    threads = [threading.Thread(target=spin, daemon=True) for _ in range(max(1, args.threads))]
    for thread in threads:
        thread.start()
    print(f"cpuhog pid {os.getpid()}: {len(threads)} threads on cpu {args.cpu if args.cpu is not None else 'any'}, "
          f"{'SCHED_RR 1' if args.rr else f'nice {args.nice}'}", flush=True)
    while not stop.is_set() and time.monotonic() < deadline:
        stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    return 0


def run_disk(args):
    set_comm("diskhog")
    stop, deadline = _stop_event(args.seconds)
    os.makedirs(args.dir, exist_ok=True)
    chunk = max(1, int(args.chunk_mb)) << 20
    file_size = max(chunk, (int(args.file_mb) << 20) // chunk * chunk)
    paths = [os.path.join(args.dir, f"diskhog-{os.getpid()}-{i}.bin") for i in range(max(1, args.threads))]
    counts = [0] * len(paths)
    errors = []

    def writer(i):
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
        buf.write(os.urandom(1 << 16) * (chunk >> 16))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | getattr(os, "O_DIRECT", 0)
        try:
            fd = os.open(paths[i], flags, 0o644)
        except OSError:  # a file system without O_DIRECT: buffered writes + fdatasync still load the disk
            fd = os.open(paths[i], flags & ~getattr(os, "O_DIRECT", 0), 0o644)
        try:
            offset = 0
            while not stop.is_set() and time.monotonic() < deadline:
                os.pwrite(fd, buf, offset)
                os.fdatasync(fd)
                counts[i] += 1
                offset = (offset + chunk) % file_size
        except OSError as exc:
            errors.append(str(exc))
            stop.set()
        finally:
            os.close(fd)

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(len(paths))]
    t0 = time.monotonic()
    for thread in threads:
        thread.start()
    print(f"diskhog pid {os.getpid()}: {len(threads)} threads, {chunk >> 20} MiB O_DIRECT writes + fdatasync "
          f"into {args.dir}", flush=True)
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass
    dt = time.monotonic() - t0
    print(f"diskhog: {sum(counts)} writes, {sum(counts) * chunk / 1e6 / max(dt, 1e-9):.0f} MB/s over {dt:.1f}s"
          + (f"; errors: {errors[0]}" if errors else ""), flush=True)
    return 1 if errors else 0


def build_arg_parser():
    p = argparse.ArgumentParser(prog="python -m straggler_lab.demo.hogs", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="kind", required=True)
    cpu = sub.add_parser("cpu", help="cpuhog: threads that burn CPU")
    cpu.add_argument("--threads", type=int, default=2)
    cpu.add_argument("--cpu", type=int, default=None, help="pin every thread to this CPU")
    cpu.add_argument("--nice", type=int, default=0, help="nice value (threads and the session's autogroup)")
    cpu.add_argument("--rr", action="store_true", help="SCHED_RR priority 1 instead of a nice value")
    cpu.add_argument("--seconds", type=float, default=60.0)
    cpu.add_argument("--on-s", type=float, default=None, help="burn for this long, then sleep --off-s, and again")
    cpu.add_argument("--off-s", type=float, default=0.0)
    disk = sub.add_parser("disk", help="diskhog: O_DIRECT writes + fdatasync in a loop")
    disk.add_argument("--dir", required=True, help="where its file goes (the file system to load)")
    disk.add_argument("--threads", type=int, default=4, help="writers, each with its own file")
    disk.add_argument("--chunk-mb", type=int, default=4)
    disk.add_argument("--file-mb", type=int, default=64)
    disk.add_argument("--seconds", type=float, default=60.0)
    return p


def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    return run_cpu(args) if args.kind == "cpu" else run_disk(args)


if __name__ == "__main__":
    sys.exit(main())
