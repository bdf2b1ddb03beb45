"""Helpers shared by test_api*, test_fleet* and test_query* (no tests here): a test CA with
server and client certificates, node databases with different data, peers that misbehave on
purpose (accepts and never answers; drops every TCP connect), and waits on what a server does
(a condition polled under a hang guard; one client's query share held full by slow queries).

No helper judges a speed: a guard here only stops a wait that would otherwise never end.
Everything binds to loopback addresses (127.0.0.x) on ephemeral ports."""
import hashlib
import http.client
import os
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import pki  # noqa: E402
from straggler.store import schema  # noqa: E402
from straggler.tls import TLSOptions  # noqa: E402

AGENT_ADDRESSES = ["127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"]
SKEWED_ADDRESS = "127.0.0.15"
EXTRA_ADDRESSES = ["127.0.0.16", "127.0.0.17", "127.0.0.18", "127.0.0.19"]
OPS = ["cuLaunchKernel", "cuMemAlloc", "ncclAllReduce"]


class Pki:
    """A fleet CA in `directory` with server certs for each address and a client cert; plus an
    unrelated CA with its own client cert (for 'certificate from another CA')."""

    def __init__(self, directory: Path):
        self.dir = directory / "fleet"
        self.other_dir = directory / "other"
        pki.init_ca(str(self.dir))
        pki.init_ca(str(self.other_dir), common_name="some other CA")
        for address in AGENT_ADDRESSES + [SKEWED_ADDRESS] + EXTRA_ADDRESSES + ["127.0.0.1"]:
            pki.issue(str(self.dir), f"agent-{address}", [address], kind="server")
        pki.issue(str(self.dir), "controller", [], kind="client")
        pki.issue(str(self.other_dir), "intruder", [], kind="client")

    def server(self, address) -> TLSOptions:
        return TLSOptions(ca=str(self.dir / "ca.crt"), cert=str(self.dir / f"agent-{address}.crt"),
                          key=str(self.dir / f"agent-{address}.key"))

    def client(self) -> TLSOptions:
        return TLSOptions(ca=str(self.dir / "ca.crt"), cert=str(self.dir / "controller.crt"),
                          key=str(self.dir / "controller.key"))

    def intruder(self) -> TLSOptions:
        """A client certificate signed by another CA (it still trusts the fleet CA for the server)."""
        return TLSOptions(ca=str(self.dir / "ca.crt"), cert=str(self.other_dir / "intruder.crt"),
                          key=str(self.other_dir / "intruder.key"))

    def tls_args(self, options: TLSOptions):
        return ["--ca", options.ca, "--cert", options.cert, "--key", options.key]


def make_node_db(path: Path, node: str, index: int):
    """A WAL database with the store schema and per-node data: node i has (i+1)*k events of op k.
    Returns {op: count} of what it holds."""
    conn = sqlite3.connect(str(path))
    conn.execute("PRAGMA journal_mode=WAL")
    schema.create(conn, node=node)
    expected, seq = {}, 0
    rows = []
    for k, op in enumerate(OPS, start=1):
        count = (index + 1) * k
        expected[op] = count
        for _ in range(count):
            rows.append((seq, node, index, "cuda", op, 4242, 4242, "python", 1_000_000 + seq * 1000, 500 + index))
            seq += 1
    conn.executemany("INSERT INTO events(seq, node, rank, source, op, pid, tid, comm, ts, duration) "
                     "VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    conn.executemany("INSERT INTO clock_pairs VALUES (?,?,?)",
                     [(node, 10**9 * s, 1_767_225_600 * 10**9 + 10**9 * s) for s in range(3)])
    conn.execute("INSERT INTO processes(node, pid, comm, rank, local_rank, world_size, first_seen) "
                 "VALUES (?, 4242, 'python', ?, 0, 4, 0)", (node, index))
    conn.executemany("INSERT INTO probes VALUES (?,?,?,?)",
                     [(node, "uprobe:cuLaunchKernel", "/usr/lib/libcuda.so.1", 1),
                      (node, "tracepoint:sched:sched_switch", None, 1)])
    conn.executemany("INSERT INTO agent_cost VALUES (?,?,?,?,?,?,?)",
                     [(node, 10**9 * s, 10**9, 0.02, 1000, 900, 50 << 20) for s in range(10)])
    conn.executemany("INSERT INTO lost_events VALUES (?,?,?,?,?)",
                     [(node, "cuda", 0, 10**9, 5), (node, "sched", 9 * 10**9, 10**9, 2)])
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('agent_version', 'test')")
    # 10 s of agent run, of which its step-time summaries took 5 ms of CPU, every second
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                     [("agent_started_ns", "0"), ("agent_heartbeat_ns", str(10 * 10**9)),
                      ("agent_summary_cpu_ns", str(5 * 10**6)), ("agent_summary_interval_ns", str(10**9))])
    conn.commit()
    conn.close()
    return expected


def db_fingerprint(path: Path):
    """sha256 of the database file and its WAL (what a write would change) plus table row counts."""
    digest = hashlib.sha256()
    for suffix in ("", "-wal"):
        p = Path(str(path) + suffix)
        if p.exists():
            digest.update(p.read_bytes())
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        counts = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        user_version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()
    return digest.hexdigest(), counts, user_version


class SilentPeer:
    """Accepts TCP connections and never reads or answers (a hung agent)."""

    def __init__(self, address="127.0.0.1"):
        self.sock = socket.socket()
        self.sock.bind((address, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.held = []
        self.port = self.sock.getsockname()[1]
        self.address = f"{address}:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except (socket.timeout, OSError):
                continue

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        for conn in self.held:
            conn.close()
        self.sock.close()


class DroppingPeer:
    """An address:port where TCP connects get no answer at all (SYNs dropped), like a host that is
    down behind a firewall: a listener with a backlog of 0, filled by one connection never accepted."""

    def __init__(self, address="127.0.0.1"):
        self.sock = socket.socket()
        self.sock.bind((address, 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.address = f"{address}:{self.port}"
        self.filler = socket.create_connection((address, self.port), timeout=2)

    def close(self):
        self.filler.close()
        self.sock.close()


def free_port(address="127.0.0.1"):
    """A port nothing listens on (bound, then released): connecting there is refused."""
    s = socket.socket()
    s.bind((address, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def venv_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "agent") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def wait_until(condition, guard_s, interval_s=0.05):
    """Poll condition() until it is true or guard_s passes; its last value. guard_s is a hang guard
    (far beyond what the awaited thing takes), never the thing tested."""
    end = time.monotonic() + guard_s
    value = condition()
    while not value and time.monotonic() < end:
        time.sleep(interval_s)
        value = condition()
    return value


def is_over_share(code, answer):
    """The 429 a client gets when its share of a pool is taken (api/limits.ClientShares)."""
    return code == 429 and isinstance(answer, dict) and answer.get("kind") == "too-many-requests"


class HeldQueries:
    """Slow queries of one client, one per connection, each in a thread, all at once: with as many
    as the client's query share, its next query is told 429 until they end (their own timeout_s).
    That 429 is how a test sees, without a clock, that they are running: ask `share_full(probe)`
    before and after what must happen while they run. A slow query told 429 (a probe held the
    share for a moment) is sent again. `ask(conn) -> (status, answer)` sends the slow query;
    .outcomes[i] is its last (status, answer) once .join() returned."""

    def __init__(self, ask, connections):
        self.ask = ask
        self.outcomes = {}
        self.threads = [threading.Thread(target=self._run, args=(i, conn), daemon=True)
                        for i, conn in enumerate(connections)]
        for thread in self.threads:
            thread.start()

    def _run(self, index, conn):
        for _ in range(200):   # bounded: a probe holds the share for one short query at a time
            outcome = self.ask(conn)
            if not is_over_share(*outcome):
                break
            time.sleep(0.05)
        self.outcomes[index] = outcome

    @staticmethod
    def share_full(probe):
        """probe() -> (status, answer) of a short query of the same client: True when it was told 429
        (False when it could not ask: its connection closed, say at the request deadline)."""
        try:
            return is_over_share(*probe())
        except (OSError, http.client.HTTPException):
            return False

    def join(self, guard_s=60):
        for thread in self.threads:
            thread.join(timeout=guard_s)
        return not any(thread.is_alive() for thread in self.threads)
