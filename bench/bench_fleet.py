"""Fan-out latency of `straggler fleet query` for 4, 16 and 64 agents, against two baselines
measured in the same run:

  parallel     fleet_query over all agents at once (concurrency 32, with the clock exchange)
  sequential   the same client, one agent after another (concurrency 1, no clock exchange)
  naive        what a user would do without this project: `ansible all -m command -a
               "sqlite3 DB 'SQL'"` — run here with Ansible's *local* connection on 4 hosts only
               (no SSH in the loop, so it is a lower bound for the real SSH route; machine.md
               measured 2.9-3.4 s for a one-query module over SSH to 4 hosts)

Agents are real `straggler serve` servers (mutual TLS 1.3, one port and one database each); several
share a process (started by this script with --serve-agents). Everything is on 127.0.0.1, so two
conditions are measured:

  loopback     no network latency, and every agent shares this machine's CPUs with the client
               (on 2 cores a fan-out cannot overlap much: this is the worst case for it)
  rtt N ms     each agent behind a TCP proxy that delays every chunk by N/2 ms each way (no tc netem
               here; default 10 ms: a controller outside the cluster's network, a bastion or another
               zone): where round trips, not this machine's CPU, add up, as they do on a real fleet
               whose agents each have their own CPUs

Writes bench/results/fleet.json and prints a table. `--quick`: fewer rows, 4 and 16 agents, 2 runs.
"""
import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import pki, render  # noqa: E402
from straggler.store import schema  # noqa: E402
from straggler.tls import TLSOptions  # noqa: E402

SQL = ("SELECT op, count(*) AS calls, avg(duration) AS avg_ns, max(duration) AS max_ns "
       "FROM events GROUP BY op ORDER BY op")
OPS = ("cuLaunchKernel", "cuMemAlloc", "cuMemcpy", "ncclAllReduce", "offcpu", "runq")
AGENTS_PER_PROCESS = 8
DEFAULT_RTT_MS = 10.0


def make_db(path, node, rows):
    conn = sqlite3.connect(str(path))
    conn.execute("PRAGMA journal_mode=WAL")
    schema.create(conn, node=node)
    conn.execute("""
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)
        INSERT INTO events(seq, node, rank, source, op, pid, tid, ts, duration)
        SELECT i, ?, 0, 'cuda', CASE i % 6 WHEN 0 THEN 'cuLaunchKernel' WHEN 1 THEN 'cuMemAlloc' WHEN 2 THEN 'cuMemcpy'
                                 WHEN 3 THEN 'ncclAllReduce' WHEN 4 THEN 'offcpu' ELSE 'runq' END,
               4242, 4242 + i % 4, i * 1000, 1000 + (i * 7919) % 50000
        FROM n""", (rows, node))
    conn.commit()
    conn.close()


def serve_agents(spec_path):
    """Child mode: start the agents listed in the spec file, print their ports, serve until stdin closes."""
    from straggler.api.server import start_background
    spec = json.loads(Path(spec_path).read_text())
    tls = TLSOptions(**spec["tls"])
    handles = [start_background(db, node=node, listen="127.0.0.1:0", tls=tls) for node, db in spec["agents"]]
    print(json.dumps([h.port for h in handles]), flush=True)
    sys.stdin.read()   # the parent closes our stdin to stop us
    for handle in handles:
        handle.stop()


def serve_proxy(spec_path):
    """Child mode: one delaying TCP proxy per upstream port; prints the listening ports, runs until stdin closes."""
    import asyncio
    spec = json.loads(Path(spec_path).read_text())
    one_way_s = spec["rtt_ms"] / 2000.0

    async def pipe(reader, writer):
        loop = asyncio.get_running_loop()
        chunks = asyncio.Queue()

        async def receive():
            while True:
                data = await reader.read(65536)
                chunks.put_nowait((loop.time() + one_way_s, data))
                if not data:
                    return

        async def send():
            while True:
                due, data = await chunks.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        try:
            await asyncio.gather(receive(), send())
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def main():
        loop = asyncio.get_running_loop()
        servers, ports = [], []
        for upstream in spec["upstreams"]:
            async def handle(client_reader, client_writer, upstream=upstream):
                try:
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
                except OSError:
                    client_writer.close()
                    return
                await asyncio.gather(pipe(client_reader, up_writer), pipe(up_reader, client_writer))
            server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
            servers.append(server)
            ports.append(server.sockets[0].getsockname()[1])
        print(json.dumps(ports), flush=True)
        await loop.run_in_executor(None, sys.stdin.read)
        for server in servers:
            server.close()

    asyncio.run(main())


def _child(mode, spec):
    proc = subprocess.Popen([sys.executable, __file__, mode, str(spec)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=str(REPO))
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        proc.wait(timeout=15)
        raise SystemExit(f"{mode} {spec}: the child process did not start")
    return proc, json.loads(line)


def _stop_children(procs):
    for proc in procs:
        try:
            proc.stdin.close()
            proc.wait(timeout=15)
        except (subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.wait(timeout=15)


class Fleet:
    """N agents in ceil(N / 16) processes."""

    def __init__(self, work, count, rows, server_tls):
        self.procs, self.ports = [], []
        agents = []
        for i in range(count):
            node = f"gpu-node-{i + 1:02d}"
            db = work / f"{node}.db"
            if not db.exists():
                make_db(db, node, rows)
            agents.append((node, str(db)))
        self.agents = agents
        try:
            for start in range(0, count, AGENTS_PER_PROCESS):
                spec = work / f"spec-{count}-{start}.json"
                spec.write_text(json.dumps({"tls": server_tls.__dict__,
                                            "agents": agents[start:start + AGENTS_PER_PROCESS]}))
                proc, ports = _child("--serve-agents", spec)
                self.procs.append(proc)
                self.ports.extend(ports)
        except BaseException:
            self.stop()
            raise
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]

    def behind_proxy(self, work, rtt_ms):
        """Addresses of the same agents behind a delaying proxy (one more child process)."""
        spec = work / f"proxy-{len(self.ports)}.json"
        spec.write_text(json.dumps({"rtt_ms": rtt_ms, "upstreams": self.ports}))
        proc, ports = _child("--proxy", spec)
        self.procs.append(proc)
        return [f"127.0.0.1:{p}" for p in ports]

    def stop(self):
        _stop_children(self.procs)


def timed(fn, runs):
    """Median/min/max wall ms over `runs` calls, and this process's CPU ms per call (the client side)."""
    times, cpu = [], []
    for _ in range(runs):
        cpu_before = time.process_time()
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000.0)
        cpu.append((time.process_time() - cpu_before) * 1000.0)
    return {"median_ms": round(statistics.median(times), 1), "min_ms": round(min(times), 1),
            "max_ms": round(max(times), 1), "client_cpu_ms": round(statistics.median(cpu), 1), "runs": runs}


def naive_ansible(work, agents, runs):
    """`ansible all -m command -a "sqlite3 DB 'SQL'"` with the local connection, one host per agent database."""
    ansible = shutil.which("ansible", path=str(REPO / ".venv" / "bin")) or shutil.which("ansible")
    sqlite_cli = shutil.which("sqlite3")
    if not ansible or not sqlite_cli:
        return None, "ansible or the sqlite3 CLI is missing"
    inventory = work / "naive-inventory.ini"
    inventory.write_text("[nodes]\n" + "".join(
        f"{node} ansible_connection=local straggler_db={db} ansible_python_interpreter={sys.executable}\n"
        for node, db in agents))
    config = work / "naive-ansible.cfg"
    config.write_text("[defaults]\nhost_key_checking = False\nforks = 32\nlocalhost_warning = False\n"
                      "interpreter_python = auto_silent\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(config), ANSIBLE_LOCAL_TEMP=str(work / "ansible-tmp"),
               ANSIBLE_HOME=str(work / "ansible-home"))
    argv = [ansible, "nodes", "-i", str(inventory), "-m", "command", "-a",
            f"{sqlite_cli} -readonly {{{{ straggler_db }}}} \"{SQL}\""]
    check = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(work), timeout=300)
    if check.returncode != 0:
        return None, f"ansible failed: {(check.stdout + check.stderr).strip().splitlines()[-1:]}"
    return timed(lambda: subprocess.run(argv, capture_output=True, env=env, cwd=str(work), timeout=300, check=True),
                 runs), "local connection, forks=32"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 and 16 agents, fewer rows and runs")
    parser.add_argument("--rtt-ms", type=float, default=DEFAULT_RTT_MS,
                        help=f"round trip added by the delaying proxy in the second condition (default {DEFAULT_RTT_MS:g})")
    parser.add_argument("--serve-agents", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--proxy", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "fleet.json"))
    args = parser.parse_args(argv)
    if args.serve_agents:
        return serve_agents(args.serve_agents)
    if args.proxy:
        return serve_proxy(args.proxy)

    from straggler.fleet.client import fleet_query
    sizes = (4, 16) if args.quick else (4, 16, 64)
    rows = 5_000 if args.quick else 20_000
    runs = 2 if args.quick else 5
    load_at_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="straggler-bench-fleet-"))
    results = []
    try:
        pki_dir = str(work / "pki")
        pki.init_ca(pki_dir)
        pki.issue(pki_dir, "agent", ["127.0.0.1"], kind="server")
        pki.issue(pki_dir, "controller", [], kind="client")
        server_tls = TLSOptions(ca=f"{pki_dir}/ca.crt", cert=f"{pki_dir}/agent.crt", key=f"{pki_dir}/agent.key")
        client_tls = TLSOptions(ca=f"{pki_dir}/ca.crt", cert=f"{pki_dir}/controller.crt", key=f"{pki_dir}/controller.key")
        for count in sizes:
            fleet = Fleet(work, count, rows, server_tls)
            try:
                conditions = [("loopback", 0.0, fleet.addresses),
                              (f"rtt {args.rtt_ms:g} ms", args.rtt_ms, fleet.behind_proxy(work, args.rtt_ms))]
                for condition, rtt_ms, addresses in conditions:
                    def parallel(clock_samples=5):
                        result = fleet_query(addresses, SQL, client_tls, timeout_s=30, deadline_s=120,
                                             concurrency=32, clock_samples=clock_samples)
                        if result.exit_code != 0:
                            raise SystemExit(f"parallel run: not every agent answered: "
                                             f"{[(n.address, n.status, n.message) for n in result.failed][:3]}")
                        return result

                    def sequential():
                        result = fleet_query(addresses, SQL, client_tls, timeout_s=30, deadline_s=600,
                                             concurrency=1, clock_samples=0)
                        if result.exit_code != 0:
                            raise SystemExit("sequential run: not every agent answered")

                    parallel()   # warm-up: page cache, first imports
                    entry = {"agents": count, "condition": condition, "rtt_ms": rtt_ms, "rows_per_agent": rows,
                             "parallel": timed(parallel, runs),
                             "parallel_no_clock": timed(lambda: parallel(0), runs),
                             "sequential": timed(sequential, runs)}
                    if count == 4 and rtt_ms == 0:
                        entry["naive_ansible"], entry["naive_note"] = naive_ansible(work, fleet.agents, runs)
                    else:
                        entry["naive_ansible"], entry["naive_note"] = None, "measured for 4 hosts on loopback only"
                    entry["speedup_vs_sequential"] = round(entry["sequential"]["median_ms"] /
                                                           entry["parallel"]["median_ms"], 2)
                    if entry["naive_ansible"]:
                        entry["speedup_vs_naive"] = round(entry["naive_ansible"]["median_ms"] /
                                                          entry["parallel"]["median_ms"], 2)
                    results.append(entry)
                    print(f"  {count} agents, {condition}: parallel {entry['parallel']['median_ms']:.0f} ms, "
                          f"sequential {entry['sequential']['median_ms']:.0f} ms", file=sys.stderr, flush=True)
            finally:
                fleet.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    document = {
        "bench": "fleet", "quick": args.quick, "sql": SQL,
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": load_at_start, "loadavg_at_end": os.getloadavg()},
        "method": "median wall time of fleet_query over real mTLS agents on 127.0.0.1 "
                  f"({AGENTS_PER_PROCESS} agents per server process); baselines measured in the same run",
        "results": results,
        "notes": [
            "loopback: every agent and the client share this machine's CPUs (2 cores, shared with other work: "
            "see loadavg), so the fan-out has little to overlap; each request costs a few ms of CPU on each side, "
            "mostly the TLS 1.3 handshake with client certificate",
            "rtt: the delaying proxy adds the given round trip to every exchange (TCP connect, TLS handshake, "
            "request); one query costs about 3 round trips, the clock exchange about 2 + clock_samples",
            "parallel includes the clock-offset exchange (5 samples per node on a second connection); "
            "'parallel_no_clock' is the same call with clock_samples=0",
            "naive: `ansible nodes -m command -a \"sqlite3 -readonly DB 'SQL'\"` with the local connection "
            "on 4 hosts only (no SSH: a lower bound for the real route)",
        ],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")

    def ms(entry, key):
        value = entry.get(key)
        return "-" if not value else f"{value['median_ms']:.0f}"
    table = [[e["agents"], e["condition"], ms(e, "parallel"), ms(e, "parallel_no_clock"), ms(e, "sequential"), ms(e, "naive_ansible"),
              f"{e['speedup_vs_sequential']:.1f}x", f"{e['speedup_vs_naive']:.1f}x" if "speedup_vs_naive" in e else "-"]
             for e in results]
    render.print_table(["agents", "network", "parallel ms", "parallel, no clock ms", "sequential ms", "naive ansible ms",
                        "vs sequential", "vs naive"], table,
                       title=f"fleet query fan-out (median of {runs} runs, {rows} rows per agent)")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
