"""Ending the processes a test or the lab started itself (by their Popen, never by name): ask, wait a
bounded time, then kill what is left and wait again."""
import signal
import subprocess
import time


def end(procs, sig=signal.SIGTERM, wait_s=15.0, kill_wait_s=10.0):
    """Send `sig` to each of `procs` (subprocess.Popen, or one of them) still running — None sends
    nothing: they were asked to stop some other way — wait up to wait_s for all of them together,
    SIGKILL those left and wait up to kill_wait_s for them. -> their return codes (None: still running,
    which only a process stuck in the kernel leaves)."""
    procs = [procs] if isinstance(procs, subprocess.Popen) else list(procs)
    if sig is not None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(sig)
    _wait_all(procs, wait_s)
    left = [p for p in procs if p.poll() is None]
    for proc in left:
        proc.kill()
    _wait_all(left, kill_wait_s)
    return [p.returncode for p in procs]


def _wait_all(procs, limit_s):
    deadline = time.monotonic() + limit_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
