"""What reading the devices costs the node agent: its CPU on an idle node with device sampling on
(`--gpu-interval`, NVML and the kernel log) and off (`--no-gpu`), both measured in the same run.

The GPUs are the STAND-IN NVML's (agent/straggler_lab/standin/nvml.c: libnvidia-ml.so.1 found by
LD_LIBRARY_PATH), 8 of them with 18 NVLinks each (an 8-GPU H100 node's shape), so the agent makes the
same calls per sample as on such a node; what differs from a real driver is the time inside each call
(the stand-in's is a few µs of C; nvidia-ml-py's Python and ctypes around it are the same). The agent
traces only an idle process of its own (--pid), so the rest of the machine does not count.

Per phase: the agent's CPU (user + system, from /proc/PID/stat) over a window that starts once it is
ready, as % of one core; with devices on also the device thread's own CPU (meta devices_cpu_ns: the
direct measure, free of the rest of the agent's noise) and the samples it wrote. Phases alternate
off, on, off, on, ... (--rounds). The goal: the difference on - off at most 1 % of a core.

Writes bench/results/devices.json and prints a table. `--quick`: one round of 15 s phases (default:
two rounds of 60 s). Needs root.
This file must not be imported by the agent; it drives it as a user would.
"""
import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from bench.bench_agent import Agent  # noqa: E402
from straggler_lab.standin import build_standin_nvml, write_nvml_config  # noqa: E402

GPUS = 8
NVLINKS = 18
GOAL_PERCENT = 1.0


def phase(name, work, idle_pid, seconds, devices, nvml_dir, config):
    db = str(work / f"{name}.db")
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent")}
    args = ["--node", f"bench-{name}", "--pid", str(idle_pid), "--scope", "netns", "--interval", "5"]
    if devices:
        env.update(LD_LIBRARY_PATH=nvml_dir, STRAGGLER_STANDIN_NVML_CONFIG=config)
    else:
        args.append("--no-gpu")
    agent = Agent(db, args, env, name="bench_devices")
    try:
        time.sleep(2)                              # past the start-up's last writes
        cpu0, t0 = agent.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = agent.cpu_seconds(), time.monotonic()
    finally:
        agent.stop()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        samples = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    finally:
        conn.close()
    started, stopped = int(meta.get("agent_started_ns", 0)), int(meta.get("agent_stopped_ns", 0))
    out = {"agent_cpu_percent": round(100 * (cpu1 - cpu0) / (t1 - t0), 3), "seconds": round(t1 - t0, 1),
           "devices_state": meta.get("devices_state"), "gpu_samples": samples}
    if devices and stopped > started:
        out["device_thread_cpu_percent"] = round(100 * int(meta.get("devices_cpu_ns", 0)) / (stopped - started), 3)
        out["gpu_samples_per_s"] = round(samples / ((stopped - started) / 1e9), 2)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="15 s phases instead of 60")
    parser.add_argument("--rounds", type=int, help="off/on pairs (default 2; --quick 1)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "devices.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_devices: needs root (the agent loads BPF programs, reads /dev/kmsg)")
    seconds = 15 if args.quick else 60
    rounds = args.rounds or (1 if args.quick else 2)
    with tempfile.TemporaryDirectory(prefix="bench-devices-") as tmp:
        work = Path(tmp)
        nvml_dir = os.path.dirname(build_standin_nvml(work / "libs"))
        config = write_nvml_config(work / "gpus.conf", [
            dict(index=i, uuid=f"GPU-00000000-0000-4000-8000-{i:012x}", pci=f"0000:{0x18 + 0x10 * i:02x}:00.0",
                 control=str(work / f"rank{i}.ctl"), nvlinks=NVLINKS) for i in range(GPUS)])
        idle = subprocess.Popen(["sleep", str(rounds * (2 * seconds + 400))])
        try:
            results = {"quick": args.quick, "machine": os.uname().release, "cpus": os.cpu_count(), "gpus": GPUS,
                       "nvlinks_per_gpu": NVLINKS, "gpu_interval_s": 1, "phase_seconds": seconds, "rounds": rounds,
                       "phases": []}
            for n in range(rounds):
                for name, devices in (("off", False), ("on", True)):
                    results["phases"].append(dict(phase(f"{name}{n}", work, idle.pid, seconds, devices, nvml_dir,
                                                        config), devices=name))
        finally:
            idle.kill()
            idle.wait()
    for name in ("off", "on"):
        runs = [p for p in results["phases"] if p["devices"] == name]
        results[name] = {"agent_cpu_percent": round(sum(p["agent_cpu_percent"] for p in runs) / len(runs), 3)}
        if name == "on":
            for key in ("device_thread_cpu_percent", "gpu_samples_per_s"):
                results[name][key] = round(sum(p.get(key, 0) for p in runs) / len(runs), 3)
    results["added_cpu_percent"] = round(results["on"]["agent_cpu_percent"] - results["off"]["agent_cpu_percent"], 3)
    results["goal_percent"] = GOAL_PERCENT
    # the device thread's own CPU is the cost; the agent's total (on - off) also carries its noise
    results["within_goal"] = max(results["added_cpu_percent"], results["on"]["device_thread_cpu_percent"]) <= GOAL_PERCENT
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'phase':<10} {'agent CPU % of a core':>18} {'device thread %':>16} {'gpu_samples/s':>14}")
    for r in results["phases"] + [dict(results["off"], devices="off, mean"), dict(results["on"], devices="on, mean")]:
        print(f"{r['devices']:<10} {r['agent_cpu_percent']:>18.3f} {r.get('device_thread_cpu_percent', '-'):>16} "
              f"{r.get('gpu_samples_per_s', '-'):>14}")
    print(f"devices on add {results['added_cpu_percent']:.3f} % of a core (goal <= {GOAL_PERCENT} %): "
          f"{'met' if results['within_goal'] else 'NOT met'}; {args.out}")
    return 0 if results["within_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
