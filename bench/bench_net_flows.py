"""What the TCP flow probes (bpf/net.c: sock_send_length, sock_recv_length, inet_sock_set_state,
tcp_probe, tcp_retransmit_skb, tcp_cong_state_set, and the entry and exit of the calls a socket's data
moves by, timed) add to a process's send and receive calls, and to a read() that is not a socket's
(every process's), against baselines measured in the same run.

A ping-pong over loopback in one thread of a process of its own: 1 byte one way, 1 byte back, on one
TCP connection, so each round trip is 2 sends and 2 receives, and the kernel handles each segment in
the sender's context (loopback), so the probes' work is in this process's CPU time. Phases:
  untraced            no BPF program loaded
  empty tracepoints   a program of empty handlers on the same tracepoints: the floor, what the
                      kernel charges for running any BPF program there
  agent, no net       the agent's program (straggler.probes.loader.Probes: its tracepoints, no uprobes)
                      without net.c (--no-net-flows): the baseline the net probes add to
  agent, traced       with net.c, the process a target: every call counted
  agent, other        with net.c, the process not a target: what every other process pays
Each phase is the lowest of --repeats runs (CPU time and wall time per round trip); a round runs them
all, with untraced before and after. Reported per send/recv call: the added CPU ns against untraced,
and the net probes' own share (agent with net.c minus agent without), beside the floor. Each phase
also times a read() of one byte of /dev/zero in the same process: what the timed calls' entry and exit
programs add to every process's reads and writes.

Writes bench/results/net_flows.json and prints a table. `--quick`: one round of shorter runs (< 30 s).
Needs root. This file must not be imported by the agent.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler.probes import loader  # noqa: E402

CALLS_PER_ROUND_TRIP = 4
PING_PONG = r"""
import json, os, socket, sys, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
a = socket.create_connection(srv.getsockname())
b, _ = srv.accept()
for s in (a, b):
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
zero = os.open("/dev/zero", os.O_RDONLY)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    kind, n = line.split()
    n = int(n)
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    if kind == "ping":
        for _ in range(n):
            a.send(b"x")
            b.recv(1)
            b.send(b"y")
            a.recv(1)
    else:                                  # "read": a read() that is not a socket's, as any process makes
        for _ in range(n):
            os.read(zero, 1)
    cpu1, wall1 = time.process_time_ns(), time.perf_counter_ns()
    print(json.dumps({"cpu_ns": (cpu1 - cpu0) / n, "wall_ns": (wall1 - wall0) / n}), flush=True)
"""


class PingPong:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", PING_PONG], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def run(self, round_trips, repeats, kind="ping"):
        """(CPU ns, wall ns) per round trip (per read() of /dev/zero: kind "read"): the lowest of `repeats` runs."""
        runs = []
        for _ in range(repeats):
            self.proc.stdin.write(f"{kind} {round_trips}\n")
            self.proc.stdin.flush()
            runs.append(json.loads(self.proc.stdout.readline()))
        return min(r["cpu_ns"] for r in runs), min(r["wall_ns"] for r in runs)

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def net_hits(probes):
    return probes.hit_totals()[loader.HIT_NAMES.index("net")]


def empty_program():
    from bcc import BPF
    return BPF(text="\n".join(f"TRACEPOINT_PROBE({tp.split(':')[0]}, {tp.split(':')[1]}) {{ return 0; }}"
                               for tp in loader.NET_TRACEPOINTS))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of shorter runs (under 30 s)")
    parser.add_argument("--rounds", type=int, help="rounds of every phase (default 3; --quick 1)")
    parser.add_argument("--round-trips", type=int, help="round trips per run (default 50000; --quick 20000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per phase, the lowest kept (default 3)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "net_flows.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_net_flows: needs root (it loads BPF programs)")
    loader.check_environment()
    missing = loader.missing_tracepoints(loader.NET_TRACEPOINTS)
    if missing:
        raise SystemExit(f"bench_net_flows: this kernel lacks {', '.join(missing)}")
    rounds = args.rounds or (1 if args.quick else 3)
    trips = args.round_trips or (20000 if args.quick else 50000)
    names = ("untraced", "empty tracepoints", "agent, no net", "agent, traced", "agent, other")
    phases = {name: [] for name in names}
    reads = {name: [] for name in names}               # the same phases, a read() of /dev/zero each time
    hits_per_call, compile_s = [], []
    ping = PingPong()
    started = time.monotonic()
    try:
        ping.run(trips // 4, 1)                              # warm up
        for _ in range(rounds):
            phases["untraced"].append(ping.run(trips, args.repeats))
            reads["untraced"].append(ping.run(trips, args.repeats, "read"))
            empty = empty_program()
            try:
                phases["empty tracepoints"].append(ping.run(trips, args.repeats))
                reads["empty tracepoints"].append(ping.run(trips, args.repeats, "read"))
            finally:
                empty.cleanup()
            probes = loader.Probes(call_ringbuf_kib=64, sys_ringbuf_kib=64, net_flows=False)
            try:
                probes.attach_tracepoints()
                probes.set_config()
                probes.add_target(ping.proc.pid)
                phases["agent, no net"].append(ping.run(trips, args.repeats))
                reads["agent, no net"].append(ping.run(trips, args.repeats, "read"))
            finally:
                probes.close()
            probes = loader.Probes(call_ringbuf_kib=64, sys_ringbuf_kib=64, net_flows=True)
            try:
                compile_s.append(probes.compile_seconds)
                assert probes.net_state == "on", probes.net_reason
                probes.attach_tracepoints()
                probes.set_config()
                probes.add_target(ping.proc.pid)
                before = net_hits(probes)
                phases["agent, traced"].append(ping.run(trips, args.repeats))
                calls = trips * args.repeats * CALLS_PER_ROUND_TRIP
                hits_per_call.append((net_hits(probes) - before) / calls)
                flows = probes.read_net_flows(0)
                counted = sum(f.tx_calls + f.rx_calls for f in flows)
                assert counted == calls, f"{counted} of {calls} calls counted"
                assert all(f.tx_ns > 0 and f.rx_ns > 0 for f in flows), "every call timed"
                reads["agent, traced"].append(ping.run(trips, args.repeats, "read"))
                del probes.targets[ctypes.c_uint32(ping.proc.pid)]
                phases["agent, other"].append(ping.run(trips, args.repeats))
                reads["agent, other"].append(ping.run(trips, args.repeats, "read"))
            finally:
                probes.close()
            phases["untraced"].append(ping.run(trips, args.repeats))
            reads["untraced"].append(ping.run(trips, args.repeats, "read"))
    finally:
        ping.close()
    best = {name: (min(c for c, _ in runs), min(w for _, w in runs)) for name, runs in phases.items()}
    per_call = lambda a, b, i: round((best[a][i] - best[b][i]) / CALLS_PER_ROUND_TRIP)
    best_read = {name: min(c for c, _ in runs) for name, runs in reads.items()}
    per_read = lambda a, b: round(best_read[a] - best_read[b])
    results = {"quick": args.quick, "machine": os.uname().release, "cpus": os.cpu_count(), "rounds": rounds,
               "round_trips": trips, "repeats": args.repeats, "calls_per_round_trip": CALLS_PER_ROUND_TRIP,
               "compile_seconds": round(max(compile_s), 2), "net_hits_per_call": round(max(hits_per_call), 3),
               "phases": {name: {"cpu_ns_per_round_trip": round(best[name][0]),
                                 "wall_ns_per_round_trip": round(best[name][1]),
                                 "added_cpu_ns_per_call": per_call(name, "untraced", 0),
                                 "added_wall_ns_per_call": per_call(name, "untraced", 1),
                                 "runs_cpu_ns": [round(c) for c, _ in phases[name]]} for name in names},
               "floor_cpu_ns_per_call": per_call("empty tracepoints", "untraced", 0),
               "net_cpu_ns_per_call_traced": per_call("agent, traced", "agent, no net", 0),
               "net_cpu_ns_per_call_other": per_call("agent, other", "agent, no net", 0),
               # a read() that is not a socket's: the timed calls' entry and exit programs (bpf/net.c)
               "read_cpu_ns": {name: round(best_read[name]) for name in names},
               "read_floor_cpu_ns": per_read("empty tracepoints", "untraced"),
               "net_cpu_ns_per_read_traced": per_read("agent, traced", "agent, no net"),
               "net_cpu_ns_per_read_other": per_read("agent, other", "agent, no net")}
    results["seconds"] = round(time.monotonic() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'phase':<18} {'CPU ns/round trip':>18} {'added CPU ns/call':>18} {'wall ns/round trip':>19} "
          f"{'added wall ns/call':>19}")
    for name, r in results["phases"].items():
        print(f"{name:<18} {r['cpu_ns_per_round_trip']:>18} {r['added_cpu_ns_per_call']:>18} "
              f"{r['wall_ns_per_round_trip']:>19} {r['added_wall_ns_per_call']:>19}")
    print(f"the net probes add {results['net_cpu_ns_per_call_traced']} ns of CPU per send/recv call of a traced "
          f"process and {results['net_cpu_ns_per_call_other']} ns to any other process's "
          f"({results['net_hits_per_call']} probe hits per call; empty programs on the same tracepoints: "
          f"{results['floor_cpu_ns_per_call']} ns); to a read() that is not a socket's "
          f"{results['net_cpu_ns_per_read_traced']} ns in a traced process and {results['net_cpu_ns_per_read_other']} "
          f"ns in any other (empty programs: {results['read_floor_cpu_ns']} ns); {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
