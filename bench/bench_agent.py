"""Cost and capacity of the node agent (`straggler trace`), each against a baseline measured in the
same run, on the STAND-IN CUDA library (agent/straggler_lab/standin):

  per-call cost   the workload's CPU time (user + system: the probes run in its context) per
                  cuLaunchKernel call (empty body), and its wall time: untraced; under bpftrace
                  with a bare uprobe + uretprobe measuring the duration (the floor: the trap is what
                  costs); under the agent in its default mode (sampled) and with --record-all.
                  The issue's target: the agent's added cost within 1.5x of bpftrace's.
  sustained rate  events/s the agent writes to its store with --record-all, at rising call rates,
                  and whether any were lost (lost_events); beside plain SQLite bulk inserts of the
                  same rows into the same schema (and into a bare table), measured here too.
  agent CPU       the agent's own CPU (its /proc stat, and what it wrote into agent_cost) while
                  workloads make 10k, 50k and 100k calls/s (achieved rates are reported: uprobes
                  cost a trap per call, so a rate may be out of reach on a small VM).

Writes bench/results/agent.json and prints a table. `--quick` shortens every phase. Needs root.
This file must not be imported by the agent; it drives it as a user would.
"""
import argparse
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import render  # noqa: E402
from straggler.probes.records import EVENT_COLUMNS  # noqa: E402
from straggler_lab.standin import LIBRARIES, build_standin, build_workload  # noqa: E402
from straggler.store import schema  # noqa: E402
from straggler.store.writer import EVENT_INSERT  # noqa: E402

READY = re.compile(r"^straggler: tracing \((\d+) probes\)")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
EMPTY_BODIES = {"STRAGGLER_STANDIN_LAUNCH_US": "0", "STRAGGLER_STANDIN_SYNC_US": "0"}


class Agent:
    """`straggler trace` as a process of its own, waited for until it says it traces (at most 300 s); its
    CPU from /proc, its store read-only. The benches that run an agent use this one."""

    def __init__(self, db, args, env=None, name="bench"):
        self.db = db
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "straggler.cli", "trace", "--db", db, *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=env or {**os.environ, "PYTHONPATH": str(REPO / "agent")})
        self.ready = threading.Event()
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 300
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{self.name}: the agent did not start:\n" + "\n".join(self.lines[-10:]))

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if READY.match(line):
                self.ready.set()

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def query(self, sql, params=()):
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def workload(paths, *args, env=None):
    out = subprocess.run([paths["workload"], "--lib-dir", paths["lib_dir"], *map(str, args)],
                         env={**os.environ, **EMPTY_BODIES, **(env or {})}, capture_output=True, text=True,
                         timeout=900, check=True).stdout
    return json.loads(out)


def per_call_ns(paths, calls, repeats):
    """CPU time (user + system: the probes run in the caller's context) per call, lowest of `repeats`
    runs, and wall time per call likewise. CPU time is what a probe costs; wall time also holds the
    waits for a CPU on a shared machine, so it is reported but not compared."""
    runs = [workload(paths, "--mode", "launch", "--iterations", calls) for _ in range(repeats)]
    return {"cpu": min(r["cpu_ns_per_call"] for r in runs), "wall": min(r["ns_per_call"] for r in runs)}


def bpftrace_floor(paths, calls, repeats):
    lib = os.path.join(paths["lib_dir"], "libcuda.so.1")
    program = (f"uprobe:{lib}:cuLaunchKernel {{ @start[tid] = nsecs; }} "
               f"uretprobe:{lib}:cuLaunchKernel /@start[tid]/ {{ @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }}")
    proc = subprocess.Popen(["bpftrace", "-e", program], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for _ in range(20):  # bpftrace may warn first (e.g. about RLIMIT_MEMLOCK, harmless on 6.x)
            line = proc.stdout.readline()
            seen.append(line.strip())
            if not line or "Attaching" in line:
                break
        if "Attaching" not in seen[-1]:
            raise SystemExit("bench_agent: bpftrace did not attach: " + " | ".join(seen))
        # attached when a probe fires: wait until a short run is slower than untraced by far
        time.sleep(1.0)
        return per_call_ns(paths, calls, repeats)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def paced_run(paths, rate, seconds, processes=1):
    """`processes` workloads at rate/processes calls/s each for `seconds`; returns (pids, calls, elapsed)."""
    procs = [subprocess.Popen([paths["workload"], "--lib-dir", paths["lib_dir"], "--mode", "launch",
                               "--seconds", str(seconds), "--rate", str(rate / processes)],
                              env={**os.environ, **EMPTY_BODIES}, stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]
    summaries = [json.loads(p.communicate(timeout=seconds + 600)[0]) for p in procs]
    return ([s["pid"] for s in summaries], sum(s["total_calls"] for s in summaries),
            max(s["elapsed_ns"] for s in summaries) / 1e9)


def wait_for_rows(agent, pids, expected, timeout=60):
    marks = ",".join("?" * len(pids))
    deadline = time.monotonic() + timeout
    while True:
        rows = agent.query(f"SELECT count(*) FROM events WHERE op = 'cuLaunchKernel' AND pid IN ({marks})", pids)[0][0]
        lost = agent.query("SELECT coalesce(sum(count), 0) FROM lost_events WHERE probe IN "
                           "('uretprobe:cuda_calls', 'writer:queue')")[0][0]
        if rows + lost >= expected or time.monotonic() > deadline:
            return rows, lost
        time.sleep(0.5)


def sqlite_baseline(rows_total):
    """Plain executemany of agent-shaped rows, batches of 10k: the schema with its indexes, and a bare table."""
    row = (None, None, "driver", "cuLaunchKernel", 4242, 4242, "trainer", 0, 15000, 0, None, 4, 5, 6, 32, 8, 2,
           None, None, None, 1, None, None, None)
    assert len(row) == len(EVENT_COLUMNS)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("schema", "bare"):
            conn = sqlite3.connect(os.path.join(tmp, f"{name}.db"), isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            if name == "schema":
                schema.create(conn, "bench")
                sql = EVENT_INSERT
            else:
                conn.execute("CREATE TABLE events (" + ", ".join(["seq", "node", *EVENT_COLUMNS]) + ")")
                sql = "INSERT INTO events VALUES (" + ", ".join(["?"] * (len(EVENT_COLUMNS) + 2)) + ")"
            started = time.perf_counter()
            seq = 0
            while seq < rows_total:
                batch = [(seq + i, "bench", *row[:7], seq + i, *row[8:]) for i in range(10000)]
                conn.execute("BEGIN")
                conn.executemany(sql, batch)
                conn.execute("COMMIT")
                seq += len(batch)
            results[name] = seq / (time.perf_counter() - started)
            conn.close()
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (about a minute or two)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "agent.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_agent: needs root (eBPF); skipped", file=sys.stderr)
        return 0
    calls = 50_000 if args.quick else 300_000
    repeats = 2 if args.quick else 3
    phase_s = 2 if args.quick else 6
    results = {"quick": args.quick, "machine": os.uname().release, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="straggler-bench-") as work:
        paths = {"lib_dir": work, "workload": build_workload(work)}
        build_standin(work)
        libs = [arg for name in LIBRARIES for arg in ("--cuda-lib", os.path.join(work, name))]

        untraced = per_call_ns(paths, calls * 10, repeats)
        floor = bpftrace_floor(paths, calls, repeats)
        results["per_call_ns"] = {"untraced": untraced, "bpftrace_uprobe_uretprobe": floor}

        # default mode: per-call cost and the agent's CPU at rising rates
        agent = Agent(os.path.join(work, "default.db"), ["--node", "bench", "--interval", "1", *libs])
        try:
            results["per_call_ns"]["agent_default"] = per_call_ns(paths, calls, repeats)
            cpu_rows = []
            for rate, processes in ((10_000, 1), (50_000, 2), (100_000, 2)):
                before_cpu, before_t = agent.cpu_seconds(), time.monotonic()
                pids, made, elapsed = paced_run(paths, rate, phase_s, processes)
                cpu = agent.cpu_seconds() - before_cpu
                wall = time.monotonic() - before_t
                cpu_rows.append({"target_calls_per_s": rate, "achieved_calls_per_s": made / elapsed,
                                 "agent_cpu_percent_of_one_core": 100 * cpu / wall})
            time.sleep(2.5)  # let the last intervals land in agent_cost
            reported = agent.query("SELECT sum(cpu_seconds), sum(interval_ns) / 1e9 FROM agent_cost")[0]
            results["agent_cpu"] = cpu_rows
            results["agent_cost_table"] = {"cpu_seconds": reported[0], "seconds": reported[1]}
        finally:
            agent.stop()

        # --record-all: per-call cost with a row per call, and the sustained loss-free write rate
        agent = Agent(os.path.join(work, "all.db"), ["--node", "bench", "--interval", "1", "--record-all", *libs])
        try:
            results["per_call_ns"]["agent_record_all"] = per_call_ns(paths, calls // 2, repeats)
            sustained = []
            for rate in (5_000, 10_000, 20_000, 40_000, 80_000):
                lost_before = agent.query("SELECT coalesce(sum(count), 0) FROM lost_events")[0][0]
                cpu_before = agent.cpu_seconds()
                pids, made, elapsed = paced_run(paths, rate, phase_s, 1 if rate <= 40_000 else 2)
                rows, lost_after = wait_for_rows(agent, pids, made + lost_before)
                cpu = agent.cpu_seconds() - cpu_before
                sustained.append({"target_calls_per_s": rate, "achieved_calls_per_s": made / elapsed,
                                  "rows_per_s": rows / elapsed, "lost": lost_after - lost_before,
                                  "agent_cpu_us_per_row": 1e6 * cpu / rows if rows else None})
            results["sustained"] = sustained
        finally:
            agent.stop()

        results["sqlite_rows_per_s"] = sqlite_baseline(200_000 if args.quick else 1_000_000)

    per = {name: value["cpu"] for name, value in results["per_call_ns"].items()}
    wall = {name: value["wall"] for name, value in results["per_call_ns"].items()}
    bpf_added = per["bpftrace_uprobe_uretprobe"] - per["untraced"]
    agent_added = per["agent_default"] - per["untraced"]
    results["added_cost_ratio_vs_bpftrace"] = agent_added / bpf_added if bpf_added > 0 else None
    clean = [s for s in results["sustained"] if s["lost"] == 0]
    results["max_loss_free_rows_per_s"] = max((s["rows_per_s"] for s in clean), default=0)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")

    def cost_row(label, name):
        added = per[name] - per["untraced"]
        ratio = f"{added / bpf_added:.2f}x" if bpf_added > 0 and name != "untraced" else ""
        return [f"per call CPU: {label}", f"{per[name]:,.0f} ns (wall {wall[name]:,.0f})",
                f"+{added:,.0f} ns" if name != "untraced" else "", ratio]

    table = [cost_row("untraced", "untraced"),
             cost_row("bpftrace uprobe+uretprobe (floor)", "bpftrace_uprobe_uretprobe"),
             cost_row("agent, default (sampled)", "agent_default"),
             cost_row("agent, --record-all", "agent_record_all")]
    for s in results["sustained"]:
        per_row = f", agent {s['agent_cpu_us_per_row']:.1f} µs CPU/row" if s["agent_cpu_us_per_row"] else ""
        table.append([f"--record-all at {s['target_calls_per_s']:,} calls/s", f"{s['rows_per_s']:,.0f} rows/s",
                      f"achieved {s['achieved_calls_per_s']:,.0f}/s{per_row}", f"lost {s['lost']:,}"])
    table.append(["SQLite executemany, same schema (baseline)", f"{results['sqlite_rows_per_s']['schema']:,.0f} rows/s",
                  "", ""])
    table.append(["SQLite executemany, bare table (baseline)", f"{results['sqlite_rows_per_s']['bare']:,.0f} rows/s",
                  "", ""])
    for c in results["agent_cpu"]:
        table.append([f"agent CPU at {c['target_calls_per_s']:,} calls/s (default mode)",
                      f"{c['agent_cpu_percent_of_one_core']:.1f} % of a core",
                      f"achieved {c['achieved_calls_per_s']:,.0f}/s", ""])
    print(render.table_text(["measurement", "value", "vs baseline", "ratio / loss"], table,
                            title="straggler agent (stand-in CUDA library, this machine)"))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
