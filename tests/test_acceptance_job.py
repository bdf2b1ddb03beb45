"""The demo's workload on its own, without the test bed (fast): the training job runs, steps
in lockstep and logs every step; the checkpoint writer is named ckpt-writer, writes real
files with fsync, and stops promptly. tests/test_acceptance.py runs the whole field case."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(REPO / "agent"), PYTHONUNBUFFERED="1")


def free_port():
    """A TCP port nobody listens on now, from the kernel: a fixed one may be another session's."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_train_in_lockstep_through_the_standin_and_log_every_step(tmp_path):
    pytest.importorskip("torch")
    torchrun = Path(PYTHON).parent / "torchrun"
    log_dir = tmp_path / "steps"
    proc = subprocess.run(
        [str(torchrun), "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
         "-m", "straggler_lab.demo.trainer", "--steps", "30", "--seconds", "240", "--log-dir", str(log_dir),
         "--standin-dir", str(tmp_path / "standin")],   # --seconds: only a bound, never what ends the run
        env=dict(ENV, GLOO_SOCKET_IFNAME="lo"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "(STAND-IN, no GPU)" in proc.stdout
    for rank in (0, 1):
        lines = (log_dir / f"steps-rank{rank}.csv").read_text().splitlines()
        assert lines[0] == "rank,node,step,t_end_unix,step_ms"
        steps = [int(line.split(",")[2]) for line in lines[1:]]
        assert steps == list(range(1, 31)), f"rank {rank} logged steps {steps}"


def test_checkpoint_writer_threads_are_named_and_it_stops_on_sigterm(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    log = tmp_path / "writer.log"
    proc = subprocess.Popen([PYTHON, "-m", "straggler_lab.demo.ckpt_writer", "--mb", "8", "--seconds", "60",
                             "--dir", str(ckpt_dir), "--log", str(log)], env=ENV)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "checkpoint 1:" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, log.read_text() if log.exists() else "writer exited"
            time.sleep(0.2)
        assert "checkpoint 1:" in log.read_text()
        comms = {Path(f"/proc/{proc.pid}/task/{tid}/comm").read_text().strip()
                 for tid in os.listdir(f"/proc/{proc.pid}/task")}
        assert comms == {"ckpt-writer"}
        assert len(os.listdir(f"/proc/{proc.pid}/task")) >= 4  # main + 3 compressing threads
        assert list(ckpt_dir.glob("ckpt-*.bin.z")), "no checkpoint file on disk"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    assert proc.returncode == 0
    assert "ckpt-writer done" in log.read_text()
    assert not list(ckpt_dir.glob("ckpt-*")), "checkpoint files left behind"
