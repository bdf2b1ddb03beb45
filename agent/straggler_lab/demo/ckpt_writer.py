"""The demo's culprit: a checkpoint writer that runs beside the trainer on one node, the way
training scripts save checkpoints (serialise, compress, write, fsync), and slows it down.

What makes it hurt on this machine (measured on a 2-core test VM): zlib compression in
3 threads (zlib releases the GIL, so the three really compete for the CPU), about 100 MB
written per checkpoint with an fsync, in a loop, pinned to the same CPU as that node's
trainer (--cpu). A plain dd loop, or a single compressing thread, barely slows the job.
The compressed chunks are streamed to the file as they come, with an fdatasync every 16 MB,
so the writes are issued by this process throughout the checkpoint (as a streaming
torch.save + periodic flush does), not in one burst at the end.

Every thread names itself "ckpt-writer" (prctl PR_SET_NAME, what the kernel reports as
comm), so the agent's "who ran instead" and "who issued the writes" name it.
The run is bounded: --seconds and/or --checkpoints; SIGTERM/SIGINT end it after the
current write. The files are written under --dir and removed at the end, keeping at most
the last --keep checkpoints meanwhile.

Standard library only; it must not import torch (it stands for any background writer).
"""
import argparse
import concurrent.futures
import ctypes
import os
import signal
import sys
import threading
import time
import zlib

COMM = b"ckpt-writer"
PR_SET_NAME = 15


def set_comm(name=COMM):
    """Set this thread's comm (what ps, /proc/TID/comm and the kernel's tracepoints show)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except OSError:
        pass


def make_weights(total_bytes, seed_block=1 << 20):
    """Bytes that look like float32 weights: random mantissas, a narrow range of exponents
    (compressible a little, like real checkpoints). Built from 1 MiB blocks, each varied."""
    base = bytearray(os.urandom(seed_block))
    # little-endian float32: byte 3 holds the sign and most of the exponent; keep it to
    # two values (small weights of either sign), so zlib finds some redundancy
    base[3::4] = bytes((0x3C if b & 1 else 0xBC) for b in base[3::4])
    blocks = []
    for i in range(max(1, total_bytes // seed_block)):
        block = bytearray(base)
        block[0:4096] = os.urandom(4096)  # no two blocks identical
        blocks.append(bytes(block))
    return blocks


def write_checkpoint(path, blocks, pool, level, should_stop, sync_every=16 << 20, in_flight=6):
    """Compress the blocks in the pool's threads and stream them into `path` as they come,
    with an fdatasync every `sync_every` bytes and an fsync at the end (so the block writes
    are issued by this process all along the checkpoint, not later by the kernel's flusher).
    Returns the bytes written, or None when should_stop() became true meanwhile."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = unsynced = 0
        pending = []
        next_block = 0
        while next_block < len(blocks) or pending:
            while next_block < len(blocks) and len(pending) < in_flight:
                pending.append(pool.submit(zlib.compress, blocks[next_block], level))
                next_block += 1
            chunk = pending.pop(0).result()
            if should_stop():
                for future in pending:
                    future.cancel()
                return None
            n = os.write(fd, chunk)
            written += n
            unsynced += n
            if unsynced >= sync_every:
                os.fdatasync(fd)
                unsynced = 0
        os.fsync(fd)
        return written
    finally:
        os.close(fd)


def build_arg_parser():
    p = argparse.ArgumentParser(prog="straggler_lab.demo.ckpt_writer", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="/var/tmp/straggler-ckpt", help="where checkpoints are written (a real disk)")
    p.add_argument("--mb", type=int, default=100, help="checkpoint size before compression, MiB")
    p.add_argument("--threads", type=int, default=3, help="compressing threads")
    p.add_argument("--level", type=int, default=6, help="zlib level")
    p.add_argument("--cpu", type=int, default=None, help="pin the writer (all threads) to this CPU")
    p.add_argument("--seconds", type=float, default=60.0, help="stop after this long (always bounded)")
    p.add_argument("--checkpoints", type=int, default=0, help="stop after this many checkpoints (0: no limit)")
    p.add_argument("--keep", type=int, default=2, help="checkpoint files kept on disk while running")
    p.add_argument("--log", help="append one line per checkpoint here")
    return p


def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    set_comm()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # threads started later inherit it
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def should_stop():
        return stop["signal"] is not None or time.monotonic() - t_start >= args.seconds

    os.makedirs(args.dir, exist_ok=True)
    log = open(args.log, "a", buffering=1) if args.log else sys.stdout
    t_start = time.monotonic()
    blocks = make_weights(args.mb << 20)
    written_paths = []
    n = 0
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="ckpt-writer",
                                                 initializer=set_comm)
    log.write(f"ckpt-writer pid {os.getpid()} on cpu {args.cpu if args.cpu is not None else 'any'}: "
              f"{args.mb} MiB per checkpoint, {args.threads} zlib threads, fsync, into {args.dir}\n")
    try:
        while not should_stop():
            if args.checkpoints and n >= args.checkpoints:
                break
            t0 = time.monotonic()
            path = os.path.join(args.dir, f"ckpt-{os.getpid()}-{n:04d}.bin.z")
            nbytes = write_checkpoint(path, blocks, pool, args.level, should_stop)
            if nbytes is None:
                os.unlink(path)
                break
            t1 = time.monotonic()
            written_paths.append(path)
            while len(written_paths) > args.keep:
                os.unlink(written_paths.pop(0))
            n += 1
            log.write(f"checkpoint {n}: {args.mb} MiB compressed and written ({nbytes / 1e6:.1f} MB, fsync) in {t1 - t0:.2f}s\n")
            log.flush()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for path in written_paths:
            try:
                os.unlink(path)
            except OSError:
                pass
    log.write(f"ckpt-writer done: {n} checkpoints in {time.monotonic() - t_start:.1f}s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
