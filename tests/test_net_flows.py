"""The TCP flows of the traced processes (table net_flows: bpf/net.c, probes/net.py), with real eBPF.

One agent run (--interval 1) traces the children of a launcher, as test_agent.py does:
  TestLoopback      a traced server and traced clients over loopback (IPv4, IPv6, and IPv4 clients of
                    a dual-stack server, whose sockets the kernel keeps as IPv4-mapped IPv6): each side's
                    bytes on its own pid and rank, with the peer's address and port, iface 'lo', RTT
                    readings and the open and close; an untraced client of the same server leaves no row.
  TestLossyLink     a traced client in a network namespace sends through a router namespace whose link
                    to the server drops what overflows a small token bucket (tc tbf): its retransmits
                    are counted, its RTT (milliseconds there) is in microseconds, and its iface is the
                    namespace's veth.
Plus the pure parts (route tables, addresses) without BPF, and the agent without the TCP probes
(as on a kernel older than their tracepoints): everything else still loads.
No timed assertions: waits poll the database (bounded) and then assert exact facts.
"""
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from straggler.probes import loader
from straggler.store import schema
from straggler.probes.net import (NetFlows, RouteTable, address_of, parse_local_v4, parse_route_v4, parse_route_v6,
                                  route_iface)
from straggler_lab import procs
from test_agent import AgentRun, Launcher, query, scalar, wait_until

NODE = "net-flows-a"
# sends a 16-byte header (how many bytes to send back) + NBYTES, reads the reply to EOF, holds, closes,
# holds again: the route is read while it lives. The server reads to EOF, replies, closes; it serves
# COUNT connections and exits.
PEER_CODE = r"""
import json, os, socket, sys, time
mode = sys.argv[1]
def serve(host, portfile, count, delay=0.0):
    srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if ":" in host:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind((host, 0))
    srv.listen(16)
    srv.settimeout(120)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.replace(portfile + ".tmp", portfile)
    for _ in range(count):
        conn, _ = srv.accept()
        conn.settimeout(120)
        header = b""
        while len(header) < 16:
            header += conn.recv(16 - len(header))
        while conn.recv(1 << 16):
            pass
        time.sleep(delay)
        conn.sendall(b"r" * int(header))
        conn.close()
if mode == "serve":                                  # serve HOST PORTFILE COUNT
    serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
elif mode == "slowserve":                            # slowserve HOST PORTFILE DELAY_S: one connection, its
    serve(sys.argv[2], sys.argv[3], 1, float(sys.argv[4]))   # reply DELAY_S after its EOF
else:
    def exchange(host, port, nbytes, reply, blocking=False):
        c = socket.create_connection((host, port), timeout=120)
        if blocking:                                 # it waits in recv() itself (with a timeout, Python
            c.settimeout(None)                       # waits in poll() and then receives at once)
        c.sendall(b"%16d" % reply)
        chunk, left = b"s" * 65536, nbytes
        while left:
            left -= c.send(chunk[:left])
        c.shutdown(socket.SHUT_WR)
        got = 0
        while True:
            data = c.recv(1 << 16)
            if not data:
                break
            got += len(data)
        return c, got
    if mode == "ask":                                # ask HOST PORT NBYTES REPLY: send's, on a blocking socket
        host, port, nbytes, reply = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        c, got = exchange(host, port, nbytes, reply, blocking=True)
        print(json.dumps({"pid": os.getpid(), "local_port": c.getsockname()[1], "received": got}), flush=True)
        time.sleep(0.2)
        c.close()
        time.sleep(0.2)
    elif mode == "send":                             # send HOST PORT NBYTES REPLY HOLD_S
        host, port, nbytes, reply = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        hold = float(sys.argv[6])
        c, got = exchange(host, port, nbytes, reply)
        print(json.dumps({"pid": os.getpid(), "local_port": c.getsockname()[1], "received": got}), flush=True)
        time.sleep(hold)
        c.close()
        time.sleep(hold)
    else:                                            # many HOST PORT COUNT: connection i sends 1000 i, gets 100 i back
        host, port, count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        ports = []
        for i in range(1, count + 1):
            c, got = exchange(host, port, 1000 * i, 100 * i)
            ports.append(c.getsockname()[1])
            c.close()                                # freed at once: the next socket may reuse its memory
        print(json.dumps({"pid": os.getpid(), "local_ports": ports}), flush=True)
"""
HEADER = 16
MANY = 20          # connections one after the other (the kernel reuses a closed socket's memory at once)
COLUMNS = ("pid", "rank", "family", "local_addr", "local_port", "peer_addr", "peer_port", "iface", "tx_bytes",
           "rx_bytes", "tx_calls", "rx_calls", "tx_ns", "rx_ns", "retransmits", "recoveries", "rtt_samples", "srtt_us",
           "srtt_max_us", "cwnd_min", "opened", "closed", "errors")


def flow(db, where, params):
    """One connection end's rows summed over the intervals (None: no row), as a dict."""
    rows = query(db, "SELECT pid, rank, family, local_addr, local_port, peer_addr, peer_port, iface, sum(tx_bytes), "
                     "sum(rx_bytes), sum(tx_calls), sum(rx_calls), sum(tx_ns), sum(rx_ns), sum(retransmits), "
                     "sum(recoveries), sum(rtt_samples), "
                     "CAST(round(sum(srtt_us * rtt_samples) * 1.0 / sum(rtt_samples)) AS INTEGER), max(srtt_max_us), "
                     "min(cwnd_min), sum(opened), sum(closed), sum(errors), "
                     "count(DISTINCT pid || ':' || local_port || ':' || coalesce(iface, '')) "
                     f"FROM net_flows WHERE node = ? AND {where}", (NODE, *params))
    row = rows[0]
    if row[0] is None:
        return None
    assert row[-1] == 1, f"one connection end expected, rows say {row[-1]}"
    return dict(zip(COLUMNS, row[:-1]))


def wait_flow(db, where, params, done, timeout=30):
    wait_until(lambda: (lambda f: f is not None and done(f))(flow(db, where, params)), timeout=timeout)
    return flow(db, where, params)


def read_port(path, timeout=30):
    assert wait_until(lambda: Path(path).exists(), timeout=timeout, interval=0.05), f"no port in {path}"
    return int(Path(path).read_text())


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    launcher = Launcher(tmp_path_factory.mktemp("net-launcher"))
    yield launcher
    launcher.close()


@pytest.fixture(scope="module")
def agent(launcher, tmp_path_factory):
    db = tmp_path_factory.mktemp("net-agent") / "trace.db"
    run = AgentRun(db, ["--node", NODE, "--pid", str(launcher.pid), "--interval", "1", "--rescan", "0.5",
                        "--no-gpu"])
    run.wait_ready()
    yield run
    run.stop(signal.SIGKILL)


# ---- over loopback ------------------------------------------------------------------------------------
@pytest.fixture(scope="class")
def loopback(agent, launcher, tmp_path_factory):
    """A traced dual-stack server (RANK=0); traced clients: IPv4 (RANK=1), IPv6 (RANK=2); and an untraced
    IPv4 client (a child of this test process, not of the launcher)."""
    work = tmp_path_factory.mktemp("loopback")
    python = sys.executable
    server = launcher.start([python, "-c", PEER_CODE, "serve", "::", work / "port", 3 + MANY], env={"RANK": "0"})
    port = read_port(work / "port")
    v4 = launcher.start([python, "-c", PEER_CODE, "send", "127.0.0.1", port, 300_000, 70_000, 0.2],
                        env={"RANK": "1"})
    v6 = launcher.start([python, "-c", PEER_CODE, "send", "::1", port, 50_000, 9_000, 0.2], env={"RANK": "2"})
    many = launcher.start([python, "-c", PEER_CODE, "many", "127.0.0.1", port, MANY], env={"RANK": "3"})
    clients = {"v4": v4, "v6": v6, "many": many}
    out = {}
    for name, child in clients.items():
        rc, stdout, err = child.wait()
        assert rc == 0, err
        out[name] = json.loads(stdout)
    untraced = subprocess.run([python, "-c", PEER_CODE, "send", "127.0.0.1", str(port), "1234", "4321", "0"],
                              capture_output=True, text=True, timeout=120)
    assert untraced.returncode == 0, untraced.stderr
    out["untraced"] = json.loads(untraced.stdout)
    rc, _, err = server.wait()
    assert rc == 0, err
    return {"server": server.pid, "port": port, **out}


@pytest.mark.bpf
class TestLoopback:
    def test_each_side_shows_its_own_bytes_peer_and_rank(self, agent, loopback):
        port, v4 = loopback["port"], loopback["v4"]
        client = wait_flow(agent.db, "pid = ? AND local_port = ?", (v4["pid"], v4["local_port"]),
                           lambda f: f["rx_bytes"] >= 70_000 and f["closed"])
        assert v4["received"] == 70_000
        assert {k: client[k] for k in ("rank", "family", "local_addr", "peer_addr", "peer_port", "iface", "tx_bytes",
                                       "rx_bytes", "opened", "closed", "errors")} == \
            {"rank": 1, "family": 4, "local_addr": "127.0.0.1", "peer_addr": "127.0.0.1", "peer_port": port,
             "iface": "lo", "tx_bytes": HEADER + 300_000, "rx_bytes": 70_000, "opened": 1, "closed": 1, "errors": 0}
        assert client["tx_calls"] >= 2 and client["rx_calls"] >= 1
        # the server's end of the same connection: the mirror image, on the server's pid; its socket is an
        # IPv6 one holding an IPv4-mapped address, shown as the IPv4 address
        server = wait_flow(agent.db, "pid = ? AND peer_port = ?", (loopback["server"], v4["local_port"]),
                           lambda f: f["tx_bytes"] >= 70_000 and f["closed"])
        assert {k: server[k] for k in ("rank", "family", "local_addr", "local_port", "peer_addr", "iface", "tx_bytes",
                                       "rx_bytes", "opened", "closed", "errors")} == \
            {"rank": 0, "family": 4, "local_addr": "127.0.0.1", "local_port": port, "peer_addr": "127.0.0.1",
             "iface": "lo", "tx_bytes": 70_000, "rx_bytes": HEADER + 300_000, "opened": 1, "closed": 1, "errors": 0}

    def test_ipv6_connection_is_family_6(self, agent, loopback):
        v6 = loopback["v6"]
        client = wait_flow(agent.db, "pid = ? AND local_port = ?", (v6["pid"], v6["local_port"]),
                           lambda f: f["rx_bytes"] >= 9_000)
        assert (client["family"], client["local_addr"], client["peer_addr"], client["peer_port"], client["iface"],
                client["tx_bytes"], client["rx_bytes"], client["rank"]) == \
            (6, "::1", "::1", loopback["port"], "lo", HEADER + 50_000, 9_000, 2)

    def test_rtt_readings_are_kept_in_microseconds(self, agent, loopback):
        v4 = loopback["v4"]
        client = wait_flow(agent.db, "pid = ? AND local_port = ?", (v4["pid"], v4["local_port"]),
                           lambda f: f["closed"])
        # 300 kB acked over loopback (a few large segments): readings of tens to thousands of microseconds
        assert client["rtt_samples"] >= 1
        assert 0 < client["srtt_us"] <= client["srtt_max_us"] < 1_000_000
        assert client["cwnd_min"] >= 1

    def test_connections_one_after_another_are_kept_apart(self, agent, loopback):
        """A socket closed and a new one opened at once often share their kernel memory (the key the
        probes see): each connection still has its own row, with its own bytes and ports."""
        many, port = loopback["many"], loopback["port"]
        assert len(set(many["local_ports"])) == MANY
        last = many["local_ports"][-1]
        wait_flow(agent.db, "pid = ? AND local_port = ?", (many["pid"], last), lambda f: f["closed"])
        wait_flow(agent.db, "pid = ? AND peer_port = ?", (loopback["server"], last), lambda f: f["closed"])
        for i, local_port in enumerate(many["local_ports"], 1):
            client = flow(agent.db, "pid = ? AND local_port = ?", (many["pid"], local_port))
            server = flow(agent.db, "pid = ? AND peer_port = ?", (loopback["server"], local_port))
            assert client is not None and server is not None, f"connection {i} (port {local_port}) has no rows"
            assert (client["tx_bytes"], client["rx_bytes"], client["peer_port"], client["opened"], client["closed"],
                    client["rank"]) == (HEADER + 1000 * i, 100 * i, port, 1, 1, 3), i
            assert (server["rx_bytes"], server["tx_bytes"], server["local_port"], server["opened"], server["closed"]) \
                == (HEADER + 1000 * i, 100 * i, port, 1, 1), i
        assert scalar(agent.db, "SELECT count(DISTINCT local_port) FROM net_flows WHERE pid = ?",
                      (many["pid"],)) == MANY

    def test_an_untraced_process_leaves_no_row(self, agent, loopback):
        untraced = loopback["untraced"]
        # the traced server's end of it is there (so the interval was written) ...
        server = wait_flow(agent.db, "pid = ? AND peer_port = ?", (loopback["server"], untraced["local_port"]),
                           lambda f: f["rx_bytes"] >= HEADER + 1234)
        assert (server["rx_bytes"], server["tx_bytes"]) == (HEADER + 1234, 4321)
        # ... the untraced client's end is not, under any pid
        assert scalar(agent.db, "SELECT count(*) FROM net_flows WHERE pid = ? OR local_port = ?",
                      (untraced["pid"], untraced["local_port"])) == 0

    def test_state_and_probes_are_recorded(self, agent):
        assert scalar(agent.db, "SELECT value FROM meta WHERE key = 'net_probe_state'") == "traced"
        names = {row[0] for row in query(agent.db, "SELECT name FROM probes WHERE library IS NULL")}
        assert {f"tracepoint:{tp}" for tp in loader.NET_TRACEPOINTS} <= names


@pytest.mark.bpf
def test_a_receive_that_waits_for_its_peer_counts_the_wait(agent, launcher, tmp_path):
    """A traced client sends its request, then waits in a blocking recv() while the server takes DELAY_S to answer:
    the client's receive time (rx_ns) holds that wait, its send time does not, and neither is more than
    the time the exchange took as the client saw it."""
    delay_s = 0.4
    python = sys.executable
    server = launcher.start([python, "-c", PEER_CODE, "slowserve", "127.0.0.1", tmp_path / "port", delay_s],
                            env={"RANK": "0"})
    port = read_port(tmp_path / "port")
    started = time.monotonic()
    client = launcher.start([python, "-c", PEER_CODE, "ask", "127.0.0.1", port, 1000, 5000], env={"RANK": "1"})
    rc, stdout, err = client.wait()
    lived_s = time.monotonic() - started
    assert rc == 0, err
    local_port = json.loads(stdout)["local_port"]
    assert server.wait()[0] == 0
    mine = wait_flow(agent.db, "pid = ? AND local_port = ?", (client.pid, local_port),
                     lambda f: f["rx_bytes"] >= 5000 and f["closed"])
    assert delay_s * 0.9e9 <= mine["rx_ns"] <= lived_s * 1e9, mine
    assert mine["tx_ns"] < mine["rx_ns"] / 2, mine
    # the server's end: it received the header at once, and sent without waiting
    theirs = wait_flow(agent.db, "pid = ? AND peer_port = ?", (server.pid, local_port), lambda f: f["tx_bytes"] >= 5000)
    assert theirs["rx_ns"] < delay_s * 1e9 and theirs["tx_ns"] < delay_s * 1e9, theirs


# ---- through a lossy link ------------------------------------------------------------------------------
def ip(*args):
    subprocess.run(["ip", *map(str, args)], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="class")
def lossy_link(tmp_path_factory):
    """Namespaces A -- R -- B (veth pairs): A 10.251.1.2 (default via R), B 10.251.2.2; R forwards, and
    its link to B is a 4 Mbit/s token bucket (tc tbf) with room for two packets: a burst overflows it
    and the overflow is dropped, so TCP from A to B loses segments and sends them again."""
    tag = f"{os.getpid() % 100000}"
    names = {"a": f"sfa{tag}", "r": f"sfr{tag}", "b": f"sfb{tag}"}
    made = []
    try:
        for ns in names.values():
            ip("netns", "add", ns)
            made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", names["a"], "link", "add", "vA", "type", "veth", "peer", "name", "vRa", "netns", names["r"])
        ip("-n", names["r"], "link", "add", "vRb", "type", "veth", "peer", "name", "vB", "netns", names["b"])
        for ns, dev, addr in ((names["a"], "vA", "10.251.1.2/24"), (names["r"], "vRa", "10.251.1.1/24"),
                              (names["r"], "vRb", "10.251.2.1/24"), (names["b"], "vB", "10.251.2.2/24")):
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
        ip("-n", names["a"], "route", "add", "default", "via", "10.251.1.1")
        ip("-n", names["b"], "route", "add", "default", "via", "10.251.2.1")
        subprocess.run(["ip", "netns", "exec", names["r"], "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True,
                       timeout=30)
        subprocess.run(["tc", "-n", names["r"], "qdisc", "add", "dev", "vRb", "root", "tbf", "rate", "4mbit",
                        "burst", "1600", "limit", "3000"], check=True, timeout=30)
        yield {**names, "a_addr": "10.251.1.2", "b_addr": "10.251.2.2", "a_dev": "vA"}
    finally:
        for ns in made:       # deleting a namespace deletes its veths and their qdiscs
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture(scope="class")
def lossy_transfer(agent, launcher, lossy_link, tmp_path_factory):
    """A traced client in A sends 150 kB to an untraced server in B."""
    work = tmp_path_factory.mktemp("lossy")
    server = subprocess.Popen(["ip", "netns", "exec", lossy_link["b"], sys.executable, "-c", PEER_CODE, "serve",
                               lossy_link["b_addr"], work / "port", "1"], stdin=subprocess.DEVNULL)
    try:
        port = read_port(work / "port")
        client = launcher.start(["ip", "netns", "exec", lossy_link["a"], sys.executable, "-c", PEER_CODE, "send",
                                 lossy_link["b_addr"], port, 150_000, 100, 1.5], env={"RANK": "7"})
        rc, out, err = client.wait(timeout=120)
        assert rc == 0, err
        assert server.wait(timeout=60) == 0
    finally:
        procs.end(server, wait_s=5)
    return {"port": port, **json.loads(out)}


@pytest.mark.bpf
class TestLossyLink:
    def test_retransmits_rtt_and_iface_of_a_lossy_path(self, agent, lossy_link, lossy_transfer):
        sent = wait_flow(agent.db, "pid = ? AND local_port = ?", (lossy_transfer["pid"], lossy_transfer["local_port"]),
                         lambda f: f["tx_bytes"] >= HEADER + 150_000 and f["closed"])
        assert {k: sent[k] for k in ("rank", "family", "local_addr", "peer_addr", "peer_port", "iface", "tx_bytes",
                                     "rx_bytes", "opened", "closed", "errors")} == \
            {"rank": 7, "family": 4, "local_addr": lossy_link["a_addr"], "peer_addr": lossy_link["b_addr"],
             "peer_port": lossy_transfer["port"], "iface": lossy_link["a_dev"], "tx_bytes": HEADER + 150_000,
             "rx_bytes": 100, "opened": 1, "closed": 1, "errors": 0}
        # sent again: one per retransmitted packet, which may hold several segments (segmentation offload),
        # so at most what namespace A's own counter of segments says (A runs nothing else)
        assert 0 < sent["retransmits"] <= namespace_retransmits(lossy_link["a"])
        # and the kernel reacted to those losses: the connection went into loss recovery (or a timeout's
        # loss state) at least once, and at most once per packet sent again
        assert 1 <= sent["recoveries"] <= sent["retransmits"]
        # a full segment takes 3 ms to cross 4 Mbit/s, and waits behind another: milliseconds, in microseconds
        assert 2_000 <= sent["srtt_us"] <= sent["srtt_max_us"] < 5_000_000


def namespace_retransmits(ns):
    """TcpRetransSegs of a network namespace (its /proc/net/snmp), from a process inside it."""
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    tcp = [line.split() for line in out.splitlines() if line.startswith("Tcp:")]
    return int(dict(zip(tcp[0], tcp[1]))["RetransSegs"])


# ---- without the TCP probes ------------------------------------------------------------------------------
@pytest.mark.bpf
@pytest.mark.filterwarnings("ignore::DeprecationWarning:bcc")     # BCC's own, about map names as str
def test_without_the_tcp_tracepoints_everything_else_loads(monkeypatch):
    """A kernel older than sock_send_length (Linux 6.3): net.c is left out, the rest compiles, attaches and
    counts, and the reason is kept."""
    real = loader.missing_tracepoints
    monkeypatch.setattr(loader, "missing_tracepoints",
                        lambda tps: ["sock:sock_send_length"] if "sock:sock_send_length" in tps else real(tps))
    probes = loader.Probes(call_ringbuf_kib=64, sys_ringbuf_kib=64)
    try:
        assert probes.net_state == "absent"
        assert "sock:sock_send_length" in probes.net_reason and "6.3" in probes.net_reason
        probes.attach_tracepoints()
        names = [name for name, _lib in probes.attached]
        assert names == [f"tracepoint:{tp}" for tp in loader.TRACEPOINTS if tp not in loader.NET_TRACEPOINTS]
        probes.set_config()
        assert probes.read_net_flows(0) == []
        before = probes.hit_totals()[loader.HIT_NAMES.index("sched")]
        time.sleep(0.2)
        assert probes.hit_totals()[loader.HIT_NAMES.index("sched")] > before   # sched_switch still fires
    finally:
        probes.close()


# ---- the pure parts --------------------------------------------------------------------------------------
ROUTE_V4 = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0102000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth1\t00000000\t0101000A\t0003\t0\t0\t50\t00000000\t0\t0\t0
ib0\t0000100A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
ib1\t0001100A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
dead\t0002100A\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""
ROUTE_V6 = """\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
fd000000000000000000000000000000 30 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     ib0
fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000003 00000000 80200001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
"""
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 10.16.1.7
        /32 host LOCAL
     |-- 10.16.0.0
        /16 link UNICAST
"""


@pytest.mark.parametrize("address, iface", [
    ("10.16.1.9", "ib1"),        # /24 beats /16
    ("10.16.9.9", "ib0"),
    ("10.16.2.5", "ib0"),        # its /24 is down: the /16
    ("192.0.2.1", "eth1"),       # the default of the lowest metric
])
def test_ipv4_route_is_the_longest_prefix_then_lowest_metric(address, iface):
    assert route_iface(parse_route_v4(ROUTE_V4), ipaddress.ip_address(address)) == iface


@pytest.mark.parametrize("address, iface", [
    ("fd00::5", "eth0"),         # /64 beats /48
    ("fd00:0:0:1::5", "ib0"),
    ("fd00::2", "lo"),           # an own address (the local table) is reached through lo
    ("2001:db8::1", None),       # only the unreachable default: no interface
])
def test_ipv6_route_is_the_longest_prefix_and_skips_reject_routes(address, iface):
    assert route_iface(parse_route_v6(ROUTE_V6), ipaddress.ip_address(address)) == iface


def test_addresses_are_text_and_ipv4_mapped_ones_are_ipv4():
    assert str(address_of(loader.AF_INET, bytes([10, 0, 0, 12]))) == "10.0.0.12"
    mapped = address_of(loader.AF_INET6, bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 12]))
    assert (str(mapped), mapped.version) == ("10.0.0.12", 4)
    assert str(address_of(loader.AF_INET6, ipaddress.IPv6Address("fd00::7").packed)) == "fd00::7"
    assert address_of(0, b"") is None


def test_rows_carry_route_rank_and_rtt_in_microseconds(tmp_path):
    proc = tmp_path / "proc"
    (proc / "42" / "net").mkdir(parents=True)
    (proc / "42" / "ns").mkdir()
    (proc / "42" / "ns" / "net").write_text("")
    (proc / "42" / "net" / "route").write_text(ROUTE_V4)
    (proc / "42" / "net" / "ipv6_route").write_text(ROUTE_V6)
    (proc / "42" / "net" / "fib_trie").write_text(FIB_TRIE)
    clock = [0.0]
    flows = NetFlows("n1", {42: 3}.get, RouteTable(str(proc), clock=lambda: clock[0]))
    counters = [loader.NetCounters(sk=1, tgid=42, family=loader.AF_INET, local_addr=bytes([10, 16, 1, 7]),
                                   local_port=40000, peer_addr=bytes([10, 16, 1, 9]), peer_port=29500, tx_bytes=10,
                                   tx_calls=1, rtt_samples=4, srtt_sum_us=1000, srtt_max_us=400, cwnd_min=10),
                loader.NetCounters(sk=2, tgid=42, family=loader.AF_INET, local_addr=bytes([10, 16, 1, 7]),
                                   local_port=40001, peer_addr=bytes([10, 16, 1, 7]), peer_port=29501, rx_bytes=5,
                                   rx_calls=1),
                loader.NetCounters(sk=3, tgid=42, family=0, local_addr=b"", local_port=0, peer_addr=b"", peer_port=0,
                                   errors=1)]
    rows = [dict(zip(schema.NET_FLOW_COLUMNS, row)) for row in flows.rows(5, 1000, counters)]
    assert [(r["local_port"], r["peer_addr"], r["iface"], r["srtt_us"], r["srtt_max_us"], r["cwnd_min"], r["rank"])
            for r in rows] == [(None, None, None, None, None, None, 3),      # addresses never learnt
                               (40000, "10.16.1.9", "ib1", 250, 400, 10, 3),
                               (40001, "10.16.1.7", "lo", None, None, None, 3)]   # its own address: lo
    # the tables are re-read only after ROUTE_REFRESH_S
    (proc / "42" / "net" / "route").write_text(ROUTE_V4.replace("ib1", "ib9"))
    assert flows.rows(6, 1000, counters[:1])[0][10] == "ib1"
    clock[0] = 11.0
    assert flows.rows(7, 1000, counters[:1])[0][10] == "ib9"


def test_own_addresses_come_from_the_fib_trie():
    assert parse_local_v4(FIB_TRIE) == {ipaddress.IPv4Address("10.16.1.7")}


def test_hit_and_lost_indexes_and_families_agree_with_the_c_side():
    text = "\n".join((loader.bpf_source_dir() / name).read_text() for name in ("common.h", "net.c"))
    c = {name: int(value) for name, value in re.findall(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(\d+)\b", text, re.M)}
    assert (c["HIT_NET"], c["NHITS"]) == (loader.HIT_NAMES.index("net"), len(loader.HIT_NAMES))
    assert (c["LOST_NET"], c["NLOST"]) == (loader.LOST_PROBES.index("net_flows:map_full"), len(loader.LOST_PROBES))
    assert (c["NET_AF_INET"], c["NET_AF_INET6"]) == (loader.AF_INET, loader.AF_INET6)
    # the calls net.c times are the ones the loader checks the kernel for
    assert tuple(re.findall(r"^NET_TIMED_CALL\((\w+)\)", text, re.M)) == loader.NET_TIMED_CALLS


def test_no_net_flows_option_turns_the_probes_off():
    import argparse
    from straggler.cli import trace
    parser = argparse.ArgumentParser()
    trace.add_arguments(parser)
    assert trace.agent_options(parser.parse_args([])).net_flows is True
    assert trace.agent_options(parser.parse_args(["--no-net-flows"])).net_flows is False
