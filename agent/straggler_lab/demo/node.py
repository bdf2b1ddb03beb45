"""The demo job's launcher on one host: what a job scheduler's step does on each node.

Runs inside the host (the orchestrator starts it there through the test bed, in a session of
its own), and starts, as its children:
- torchrun for this node's rank (`--nnodes N --node_rank R --nproc_per_node 1`), with
  GLOO_SOCKET_IFNAME set to the host's interface (without it gloo binds to loopback inside
  the namespace and the ranks cannot connect);
- when --writer-trigger is given: the checkpoint writer, once that file appears (the job's
  checkpoint hook kicking in), pinned with --writer-cpu. By default it gets a session (a
  scheduling autogroup) of its own, like a separate service; --writer-session job keeps it in
  the job's session, where it competes with the trainer thread by thread (a much larger hit).

It exits when torchrun exits (stopping the writer first), and on SIGTERM/SIGINT stops its
children (TERM, then KILL after a bounded wait). It kills nothing it did not start.
"""
import argparse
import os
import signal
import subprocess
import sys
import time


def build_arg_parser():
    p = argparse.ArgumentParser(prog="straggler_lab.demo.node", description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True, help="this node's rank (torchrun --node_rank)")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--master-addr", required=True, help="address of the host that runs rank 0")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--ifname", default="eth0", help="GLOO_SOCKET_IFNAME: the host's network interface")
    p.add_argument("--job-dir", required=True, help="step logs (steps-rank<R>.csv) and output go here")
    p.add_argument("--trainer-args", default="", help="more arguments for straggler_lab.demo.trainer (one string)")
    p.add_argument("--stop-file", help="when this file appears, stop the checkpoint writer at once (the trainer "
                                        "stops by itself: it watches the same file)")
    p.add_argument("--writer-trigger", help="start the checkpoint writer when this file exists")
    p.add_argument("--writer-cpu", type=int, default=None)
    p.add_argument("--writer-seconds", type=float, default=60.0)
    p.add_argument("--writer-dir", default="/var/tmp/straggler-ckpt")
    p.add_argument("--autogroup-nice", type=int, default=None,
                   help="nice value of this job's scheduling autogroup (/proc/self/autogroup; the session's share "
                        "of the CPU against other sessions)")
    p.add_argument("--writer-session", choices=["own", "job"], default="own",
                   help="own: the writer in a session (scheduling autogroup) of its own, like a separate service "
                        "(default); job: in the job's session, competing thread by thread with the trainer")
    p.add_argument("--max-seconds", type=float, default=600.0, help="hard limit on this launcher's life")
    return p


def _own_session(autogroup_nice):
    """preexec_fn: a new session (so a new scheduling autogroup), at the job's autogroup nice."""
    def setup():
        os.setsid()
        if autogroup_nice is not None:
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write(str(autogroup_nice))
            except OSError:
                pass
    return setup


def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    python = sys.executable
    bindir = os.path.dirname(python)
    env = dict(os.environ, GLOO_SOCKET_IFNAME=args.ifname, PYTHONUNBUFFERED="1")
    agent_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = agent_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    os.makedirs(args.job_dir, exist_ok=True)
    torchrun = os.path.join(bindir, "torchrun")
    trainer_cmd = [torchrun, f"--nnodes={args.nnodes}", f"--node_rank={args.rank}", "--nproc_per_node=1",
                   f"--master_addr={args.master_addr}", f"--master_port={args.master_port}",
                   "-m", "straggler_lab.demo.trainer", "--log-dir", args.job_dir] + args.trainer_args.split()
    children = []
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        stopping["signal"] = signum
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if args.autogroup_nice is not None:
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(args.autogroup_nice))
        except OSError as exc:
            print(f"[node rank {args.rank}] autogroup nice not set: {exc}", flush=True)
    trainer = subprocess.Popen(trainer_cmd, env=env, stdin=subprocess.DEVNULL)
    children.append(trainer)
    writer = None
    deadline = time.monotonic() + args.max_seconds
    try:
        while trainer.poll() is None and stopping["signal"] is None and time.monotonic() < deadline:
            if writer is None and args.writer_trigger and os.path.exists(args.writer_trigger):
                writer_cmd = [python, "-m", "straggler_lab.demo.ckpt_writer", "--seconds", str(args.writer_seconds),
                              "--dir", args.writer_dir, "--log", os.path.join(args.job_dir, f"ckpt-writer-rank{args.rank}.log")]
                if args.writer_cpu is not None:
                    writer_cmd += ["--cpu", str(args.writer_cpu)]
                writer = subprocess.Popen(writer_cmd, env=env, stdin=subprocess.DEVNULL,
                                          preexec_fn=_own_session(args.autogroup_nice) if args.writer_session == "own" else None)
                children.append(writer)
                print(f"[node rank {args.rank}] checkpoint writer started: pid {writer.pid}", flush=True)
            if writer is not None and writer.poll() is None and args.stop_file and os.path.exists(args.stop_file):
                writer.send_signal(signal.SIGTERM)
            time.sleep(0.1)
    finally:
        why = ("trainer exited" if trainer.poll() is not None else
               f"signal {stopping['signal']}" if stopping["signal"] is not None else "time limit")
        print(f"[node rank {args.rank}] stopping ({why}) at {time.strftime('%H:%M:%S')}", flush=True)
        for child in reversed(children):  # the writer first, then the trainer
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        end = time.monotonic() + 20
        for child in reversed(children):
            try:
                child.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=5)
    return trainer.returncode if trainer.returncode is not None else 1


if __name__ == "__main__":
    sys.exit(main())
