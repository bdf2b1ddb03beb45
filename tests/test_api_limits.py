"""The agent's limits under attack, second round: a real `straggler serve` process on loopback with
the project's PKI and real TLS 1.3; every loop and wait is bounded.

What a user (or an attacker with a valid, or stolen, certificate) would notice:
  - memory: a query of huge rows streams row by row and is cut at the byte cap; the agent's peak
    RSS stays within a bound of its baseline instead of holding the answer several times over;
  - revocation: a revoked certificate's open keep-alive connection is closed and gets no more
    answers, while another client's stays served; a CRL that goes missing refuses every client
    with one line (fail closed) until it is back;
  - fair shares: one client holding its share of connections and queries gets 429s with one line,
    and the controller is still answered meanwhile;
  - deadlines and space: a count(*) over a big table (one opcode) is stopped at its deadline by
    the interrupt; a light route over a big table answers 503 at its deadline; a huge sort is
    stopped by the temp-file cap while a small query beside it is answered; aggregates over the
    queries' memory cap are stopped; bad parameters are 400s with one line and no traceback in the
    agent's log;
  - SQLite's defensive mode: which one is in effect, and that it bites;
  - the agent's systemd unit (as the role writes it): a memory ceiling of its own and the OOM
    killer's first choice, so under memory pressure the agent dies, never the training job."""
import http.client
import json
import os
import shutil
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_api_helpers import REPO, HeldQueries, Pki, make_node_db, venv_env, wait_until

from straggler import pki
from straggler.store import sqlite_lib
from straggler.store.query import defensive_mode, open_readonly
from straggler.tls import TLSOptions, client_context, read_crl
from straggler_lab import procs

ADDRESS = "127.0.0.1"
MB = 1 << 20
# 20 rows of 8 MB each, made by SQLite as they are fetched: nothing on disk
HUGE_ROWS_SQL = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20) "
                 "SELECT x, randomblob(8000000) FROM c")
SLOW_QUERY_S = 6.0        # the hog's slow queries' own deadline: the window the controller is answered in (a hang guard)
HUGE_ROW_PART = 16 * MB   # one of those rows as an answer's part: 16 MB of hex
SLOW_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
BIG_SORT_SQL = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 3000000) "
                "SELECT x, randomblob(64) AS b FROM c ORDER BY b")


# ---------------------------------------------------------------- a real `straggler serve`

class Serve:
    """`straggler serve` in a process of its own; its stderr kept in .lines (a thread drains it)."""

    def __init__(self, db, tls: TLSOptions, *args):
        argv = [sys.executable, "-m", "straggler.cli", "serve", "--db", str(db), "--listen", f"{ADDRESS}:0",
                "--ca", tls.ca, "--cert", tls.cert, "--key", tls.key, *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=venv_env(), cwd=REPO)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("straggler serve: https://"):
                    self.port = int(line.split()[2].rsplit(":", 1)[1])
                    ready.set()
            ready.set()

        self._thread = threading.Thread(target=drain, daemon=True)
        self._thread.start()
        if not ready.wait(60) or self.port is None:
            self.stop()
            raise AssertionError("straggler serve did not start:\n" + "\n".join(self.lines))

    def status(self, field):
        """A field of /proc/PID/status in bytes (VmHWM: the peak resident memory so far)."""
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(field)

    def stop(self):
        procs.end(self.proc, wait_s=15, kill_wait_s=15)
        self._thread.join(timeout=5)
        self.proc.stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _connect(port, options, timeout=30):
    return http.client.HTTPSConnection(ADDRESS, port, context=client_context(options), timeout=timeout)


def _query(conn, sql, limit=1000, timeout_s=None):
    body = {"sql": sql, "limit": limit}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    conn.request("POST", "/api/v1/query", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.getheader("Transfer-Encoding"), json.loads(response.read())


def _get(conn, path):
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def _one_line(answer):
    return answer["error"] and "\n" not in answer["error"] and "Traceback" not in answer["error"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    fleet = Pki(tmp_path_factory.mktemp("pki"))
    for name in ("hog", "leaked"):
        pki.issue(str(fleet.dir), name, [], kind="client", roles=["query"])
    return fleet


def _client(certs, name):
    return TLSOptions(ca=str(certs.dir / "ca.crt"), cert=str(certs.dir / f"{name}.crt"),
                      key=str(certs.dir / f"{name}.key"))


@pytest.fixture(scope="module")
def node_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("node") / "node.db"
    make_node_db(db, "gpu-node-01", 0)
    return db


# ---------------------------------------------------------------- memory

def test_huge_rows_stream_and_the_agents_peak_memory_stays_bounded(certs, node_db):
    """20 rows of 8 MB under the default 64 MiB byte cap: before, the agent fetched them in one batch
    and held them raw, as hex and as JSON before looking at the cap (over 1 GB); now one row at a
    time, so the peak grows by a few rows at most. And 20 rows of 1 MB under a 1 MiB cap: none fits
    (2 MB of hex each), the answer says so at once."""
    with Serve(node_db, certs.server(ADDRESS)) as agent:
        conn = _connect(agent.port, certs.client())
        assert _query(conn, "SELECT count(*) FROM events")[0] == 200
        baseline = agent.status("VmHWM")
        code, encoding, answer = _query(conn, HUGE_ROWS_SQL, limit=100)
        peak = agent.status("VmHWM")
        conn.close()
    assert code == 200 and encoding == "chunked", (code, encoding)
    assert answer["truncated"] and answer["truncated_reason"] == "bytes"
    assert 1 <= len(answer["rows"]) <= 4 and len(answer["rows"][0][1]) == 16_000_000
    grown = peak - baseline
    assert grown < 200 * MB, f"the agent's peak RSS grew by {grown / MB:.0f} MB for a 64 MiB answer"
    with Serve(node_db, certs.server(ADDRESS), "--max-answer-bytes", str(MB)) as agent:
        conn = _connect(agent.port, certs.client())
        baseline = agent.status("VmHWM")
        code, encoding, answer = _query(conn, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                                              "LIMIT 20) SELECT x, randomblob(1000000) FROM c", limit=100)
        grown = agent.status("VmHWM") - baseline
        conn.close()
    assert code == 200 and answer["rows"] == [] and answer["truncated_reason"] == "bytes"
    assert grown < 30 * MB, f"the agent's peak RSS grew by {grown / MB:.0f} MB for an empty answer"


def test_values_that_escape_to_six_bytes_a_character_are_counted_as_written(certs, node_db):
    """A value of control characters is six bytes a character as JSON (\\u0001): before, it was counted at
    its length and escaped whole before the cap was looked at (two such queries took an agent from 29 MB
    to 943 MB). Now a row is measured as written before it is kept: 16 M control characters under the
    64 MiB cap do not fit (96 MB as JSON) and cost no more than their value; one of 100 k that fits
    arrives exact."""
    controls = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 4) "
                "SELECT x, replace(hex(zeroblob({n})), '0', char(1)) FROM c")
    with Serve(node_db, certs.server(ADDRESS)) as agent:
        conn = _connect(agent.port, certs.client())
        assert _query(conn, "SELECT count(*) FROM events")[0] == 200
        baseline = agent.status("VmHWM")
        for _ in range(2):
            code, _, answer = _query(conn, controls.format(n=8_000_000), limit=100)
            assert code == 200 and answer["rows"] == [] and answer["truncated_reason"] == "bytes", answer
        grown = agent.status("VmHWM") - baseline
        code, _, small = _query(conn, controls.format(n=50_000), limit=100)
        conn.close()
    assert grown < 110 * MB, f"the agent's peak RSS grew by {grown / MB:.0f} MB for answers of no rows"
    assert code == 200 and [len(r[1]) for r in small["rows"]] == [100_000] * 4
    assert set(small["rows"][0][1]) == {"\x01"}


def test_readers_that_stall_hold_at_most_the_servers_answer_memory(certs, node_db):
    """Four readers (two clients, two queries each) ask for huge rows and stop reading: each answer
    holds at most its next part, and all of them together at most --max-inflight-bytes; the health
    answer says how much was held at the peak."""
    cap = 40 * MB
    with Serve(node_db, certs.server(ADDRESS), "--max-inflight-bytes", str(cap)) as agent:
        baseline = agent.status("VmHWM")
        socks = []
        body = json.dumps({"sql": HUGE_ROWS_SQL, "limit": 100}).encode()
        for name in ("controller", "hog", "controller", "hog"):
            raw = socket.create_connection((ADDRESS, agent.port), timeout=10)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock = client_context(_client(certs, name)).wrap_socket(raw, server_hostname=ADDRESS)
            sock.sendall(b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            socks.append(sock)
        last = {}

        def cap_reached():   # the answers' parts held reach the cap: a further part would not fit
            conn = _connect(agent.port, certs.client())
            try:
                last["health"] = _get(conn, "/api/v1/health")
            finally:
                conn.close()
            code, health = last["health"]
            return code == 200 and health["api"]["answer_memory"]["used"] + HUGE_ROW_PART > cap

        reached = wait_until(cap_reached, 60, interval_s=0.1)   # a hang guard: the parts come in about a second
        code, health = last["health"]
        grown = agent.status("VmHWM") - baseline
        for sock in socks:
            sock.close()
    assert code == 200
    assert reached, f"the stalled readers' answers never held the cap's worth: {health['api']['answer_memory']}"
    memory = health["api"]["answer_memory"]
    assert memory["capacity"] == cap and memory["peak"] <= cap + 17 * MB, memory   # a row's last bytes may pass it
    assert grown < cap + 150 * MB, f"peak RSS grew by {grown / MB:.0f} MB with {cap / MB:.0f} MB of answers allowed"


# ---------------------------------------------------------------- revocation

def test_a_revoked_certificates_open_connection_is_closed_and_the_others_stay_served(certs, node_db, tmp_path):
    for suffix in (".crt", ".key"):   # the thief's copy (revoke moves the CA's copy aside)
        shutil.copy2(certs.dir / f"leaked{suffix}", tmp_path / f"leaked{suffix}")
    leaked = TLSOptions(ca=str(certs.dir / "ca.crt"), cert=str(tmp_path / "leaked.crt"),
                        key=str(tmp_path / "leaked.key"))
    with Serve(node_db, certs.server(ADDRESS)) as agent:
        thief = _connect(agent.port, leaked)
        owner = _connect(agent.port, certs.client())
        assert _query(thief, "SELECT 1")[0] == 200 and _query(owner, "SELECT 1")[0] == 200
        pki.revoke(str(certs.dir), names=["leaked"])

        def thief_closed():
            try:
                thief.sock.settimeout(0.05)
                return thief.sock.recv(1) == b""
            except (socket.timeout, TimeoutError):
                return False
            except (ssl.SSLError, ConnectionError):
                return True

        # the agent looks at its TLS files once a second; an idle connection would be closed anyway
        # at the request deadline (10 s): the agent's log line below says which closed it, so the
        # wait is only a hang guard
        closed = wait_until(thief_closed, 30, interval_s=0.1)
        assert closed, "the revoked certificate's keep-alive connection stayed open"
        assert _query(owner, "SELECT count(*) FROM events")[2]["rows"] == [[6]]   # the same open connection
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            _query(_connect(agent.port, leaked), "SELECT 1")
        thief.close()
        owner.close()
    # the revocation closed it, not the request deadline: the thief's is the one open connection of a revoked certificate
    assert any("revoked" in line and "closing the connection" in line for line in agent.lines), agent.lines


def test_a_request_on_an_open_connection_is_checked_against_the_crl(certs, node_db, tmp_path, monkeypatch):
    """Every request is checked against the CRL, not only the handshake: with the server's own look
    for a new CRL (which closes revoked connections) turned off, the revoked client's next request
    on its open connection gets a 403 with one line instead of an answer. (In process: the look's
    interval is a module constant.)"""
    from straggler.api import server
    monkeypatch.setattr(server, "REVOCATION_CHECK_S", 3600.0)
    pki.issue(str(certs.dir), "laptop", [], kind="client", roles=["query"])
    for suffix in (".crt", ".key"):
        shutil.copy2(certs.dir / f"laptop{suffix}", tmp_path / f"laptop{suffix}")
    laptop = TLSOptions(ca=str(certs.dir / "ca.crt"), cert=str(tmp_path / "laptop.crt"),
                        key=str(tmp_path / "laptop.key"))
    with server.start_background(str(node_db), listen=f"{ADDRESS}:0", tls=certs.server(ADDRESS)) as agent:
        conn = _connect(agent.port, laptop)
        assert _query(conn, "SELECT 1")[0] == 200
        pki.revoke(str(certs.dir), names=["laptop"])
        assert read_crl(str(certs.dir / "crl.pem")).revoked
        code, answer = 200, None
        for _ in range(30):   # the CRL file is looked at once a second
            time.sleep(0.1)
            code, _, answer = _query(conn, "SELECT 1")
            if code != 200:
                break
        conn.close()
    assert code == 403 and answer["kind"] == "revoked" and _one_line(answer) and "revoked" in answer["error"], answer


def test_a_crl_that_goes_missing_fails_closed_with_one_line_until_it_is_back(tmp_path, node_db):
    fleet = Pki(tmp_path / "pki")
    crl = fleet.dir / "crl.pem"
    saved = crl.read_bytes()
    with Serve(node_db, fleet.server(ADDRESS)) as agent:
        assert _query(_connect(agent.port, fleet.client()), "SELECT 1")[0] == 200
        crl.unlink()
        refused = None
        for _ in range(50):
            time.sleep(0.1)
            code, _, answer = _query(_connect(agent.port, fleet.client()), "SELECT 1")
            if code != 200:
                refused = (code, answer)
                break
        assert refused is not None, "every client was still served without the CRL"
        assert refused[0] == 503 and refused[1]["kind"] == "crl" and _one_line(refused[1])
        assert "crl.pem" in refused[1]["error"] and "missing" in refused[1]["error"]
        (fleet.dir / ".crl.tmp").write_bytes(saved)
        os.replace(fleet.dir / ".crl.tmp", crl)
        served = False
        for _ in range(50):
            time.sleep(0.1)
            if _query(_connect(agent.port, fleet.client()), "SELECT 1")[0] == 200:
                served = True
                break
        assert served, "the clients were not served again once the CRL was back"
    told = [line for line in agent.lines if "fail closed" in line]
    assert len(told) == 1 and "missing" in told[0], agent.lines


def test_the_crl_near_its_expiry_is_reported_loudly_by_health_and_status(tmp_path, monkeypatch, node_db):
    monkeypatch.setattr(pki, "CRL_DAYS", 20)       # a CRL with 20 days left
    fleet = Pki(tmp_path / "pki")
    with Serve(node_db, fleet.server(ADDRESS)) as agent:
        code, health = _get(_connect(agent.port, fleet.client()), "/api/v1/health")
    assert code == 200 and health["crl"]["state"] == "expiring" and 19 <= health["crl"]["days_left"] <= 20
    assert "EXPIRES" in health["crl"]["message"] and "straggler pki crl" in health["crl"]["message"]
    assert any("the CRL" in line and "EXPIRES" in line for line in agent.lines), agent.lines
    out = subprocess.run([sys.executable, "-m", "straggler.cli", "status", "--db", str(node_db),
                          "--crl", str(fleet.dir / "crl.pem")], capture_output=True, text=True, timeout=60,
                         env=venv_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "WARNING" in out.stderr and "EXPIRES" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "EXPIRES" in out.stdout


# ---------------------------------------------------------------- fair shares

def test_one_client_holding_its_share_gets_429s_and_the_controller_is_still_answered(certs, node_db):
    hog = _client(certs, "hog")
    with Serve(node_db, certs.server(ADDRESS), "--max-connections", "24", "--max-connections-per-client", "4",
               "--max-queries-per-client", "2") as agent:
        held, refused = [], []
        for _ in range(30):   # more connections than the whole server takes
            conn = _connect(agent.port, hog)
            code, _, answer = _query(conn, "SELECT 1")
            (held if code == 200 else refused).append((conn, code, answer))
        assert len(held) == 4, [c for _, c, _ in held + refused]
        assert all(code == 429 and answer["kind"] == "too-many-connections" and _one_line(answer)
                   for _, code, answer in refused)
        last = {}

        def probe():   # the hog's third connection: a short query, told 429 while its share is full
            code, _, answer = _query(held[2][0], "SELECT 1")
            last["third"] = (code, answer)
            return code, answer

        def slow(conn):
            code, _, answer = _query(conn, SLOW_SQL, timeout_s=SLOW_QUERY_S)
            return code, answer

        hog_queries = HeldQueries(slow, [held[0][0], held[1][0]])
        full = wait_until(lambda: hog_queries.share_full(probe), SLOW_QUERY_S)
        third = last.get("third", (None, {}))
        controller = _connect(agent.port, certs.client())
        answered = _query(controller, "SELECT count(*) FROM events")
        health = _get(controller, "/api/v1/health")
        hog_still_running = hog_queries.share_full(probe)
        ended = hog_queries.join()
        for conn, _, _ in held + refused:
            conn.close()
        controller.close()
    code, third = third
    assert full and code == 429 and third["kind"] == "too-many-requests" and _one_line(third), third
    assert answered[0] == 200 and answered[2]["rows"] == [[6]]
    assert health[0] == 200
    assert hog_still_running, "the controller was answered only after the hog's queries ended"
    assert ended, "the hog's slow queries did not end at their own deadline"
    outcomes = [hog_queries.outcomes[i] for i in range(2)]
    assert [code for code, _ in outcomes] == [400, 400] and outcomes[0][1]["kind"] == "timeout", outcomes


def test_a_connection_past_its_lifetime_is_closed_by_the_next_answer(certs, node_db):
    with Serve(node_db, certs.server(ADDRESS), "--max-connection-seconds", "1") as agent:
        conn = _connect(agent.port, certs.client())
        conn.request("GET", "/api/v1/health")
        first = conn.getresponse()
        first.read()
        time.sleep(1.2)
        conn.request("GET", "/api/v1/health")
        second = conn.getresponse()
        second.read()
        conn.close()
    assert first.status == second.status == 200
    assert first.getheader("Connection") is None and second.getheader("Connection") == "close"


# ---------------------------------------------------------------- deadlines and parameters

@pytest.fixture(scope="module")
def big_db(tmp_path_factory):
    """About 240 MB: 60k rows of 3900 bytes (one page each), and 2M rows of lost events."""
    db = tmp_path_factory.mktemp("big") / "big.db"
    make_node_db(db, "gpu-node-09", 0)
    conn = sqlite3.connect(str(db))
    conn.execute("CREATE TABLE padding(x)")
    conn.execute("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 60000) "
                 "INSERT INTO padding SELECT zeroblob(3900) FROM r")
    conn.execute("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 2000000) "
                 "INSERT INTO lost_events SELECT 'gpu-node-09', 'cuda', i * 1000, 1000, 1 FROM r")
    conn.commit()
    conn.close()
    return db


def test_a_count_over_a_big_table_is_stopped_inside_its_one_opcode(certs, big_db):
    """count(*) is one VDBE opcode: a progress handler is never called while it runs, so before, the
    query answered long after its deadline; the watchdog's interrupt stops it."""
    with Serve(big_db, certs.server(ADDRESS)) as agent:
        conn = _connect(agent.port, certs.client())
        code, _, answer = _query(conn, "SELECT count(*) FROM padding", timeout_s=0.01)
        checked = _query(conn, "PRAGMA integrity_check", timeout_s=0.01)
        at_once = _query(conn, "SELECT count(*) FROM padding", timeout_s=0)   # past before SQLite starts
        after = _query(conn, "SELECT count(*) FROM events")
        conn.close()
    assert code == 400 and answer["kind"] == "timeout" and _one_line(answer), answer
    assert checked[0] == 400 and checked[2]["kind"] == "timeout"
    assert at_once[0] == 400 and at_once[2]["kind"] == "timeout"
    assert after[0] == 200 and after[2]["rows"] == [[6]]


def test_a_light_route_over_a_big_store_answers_503_at_its_deadline(certs, big_db):
    with Serve(big_db, certs.server(ADDRESS), "--light-timeout", "0.05") as agent:
        conn = _connect(agent.port, certs.client())
        code, answer = _get(conn, "/api/v1/health")
        query = _query(conn, "SELECT count(*) FROM events")
        conn.close()
    assert code == 503 and answer["kind"] == "timeout" and _one_line(answer), answer
    assert "time limit" in answer["error"]
    assert query[0] == 200


def test_a_huge_sort_is_stopped_by_the_temp_cap_and_a_small_query_beside_it_is_answered(certs, node_db):
    """A 3M-row ORDER BY spills about 240 MB of temporary files: over --max-query-temp 32 MiB it is
    stopped with one line (before, its spill had no bound), while small queries beside it are
    answered and the agent's memory stays small (the sort spills to files, not to memory)."""
    with Serve(node_db, certs.server(ADDRESS), "--max-query-temp", str(32 * MB)) as agent:
        baseline = agent.status("VmHWM")
        outcome = {}

        def sort():
            outcome["sort"] = _query(_connect(agent.port, _client(certs, "hog")), BIG_SORT_SQL, limit=10, timeout_s=25)

        thread = threading.Thread(target=sort)
        thread.start()
        small = []
        for _ in range(20):   # small queries while the sort grows
            small.append(_query(_connect(agent.port, certs.client()), "SELECT count(*) FROM events")[0])
            if not thread.is_alive():
                break
            time.sleep(0.1)
        thread.join(timeout=60)
        grown = agent.status("VmHWM") - baseline
    code, _, answer = outcome["sort"]
    assert code == 400 and answer["kind"] == "temp" and _one_line(answer), answer
    assert "temporary data" in answer["error"]
    assert small and set(small) == {200}
    assert grown < 60 * MB, f"peak RSS grew by {grown / MB:.0f} MB for a sort that spills to files"


def test_queries_over_the_memory_cap_are_stopped_with_one_line(certs, node_db):
    """Two aggregates of 30 MB each (within the length limit one by one) held at once: over
    --max-query-memory 32 MiB the query is stopped, and the next one is answered."""
    sql = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 30) "
           "SELECT length(group_concat(hex(randomblob(500000)))), length(group_concat(hex(randomblob(500000)))) "
           "FROM c")
    with Serve(node_db, certs.server(ADDRESS), "--max-query-memory", str(32 * MB)) as agent:
        conn = _connect(agent.port, certs.client())
        code, _, answer = _query(conn, sql, timeout_s=25)
        after = _query(conn, "SELECT count(*) FROM events")
        conn.close()
    assert code == 400 and answer["kind"] == "memory" and _one_line(answer), answer
    assert after[0] == 200


BAD_PARAMETERS = [
    ("/api/v1/live?since=100000000000000000000", "out of range"),
    ("/api/v1/live?since=-100000000000000000000", "out of range"),
    ("/api/v1/live?since=yesterday", "an integer"),
    ("/api/v1/live?since=1e9", "an integer"),
]


def test_bad_parameters_are_400s_with_one_line_and_no_traceback(certs, node_db):
    with Serve(node_db, certs.server(ADDRESS)) as agent:
        conn = _connect(agent.port, certs.client())
        answers = {path: _get(conn, path) for path, _ in BAD_PARAMETERS}
        numbers = {}
        for field, value in (("limit", 10 ** 30), ("timeout_s", 1e300)):
            conn.request("POST", "/api/v1/query", body=json.dumps({"sql": "SELECT 1", field: value}))
            response = conn.getresponse()
            numbers[field] = (response.status, json.loads(response.read()))
        conn.close()
    for path, words in BAD_PARAMETERS:
        code, answer = answers[path]
        assert code == 400 and _one_line(answer) and words in answer["error"], (path, answer)
    assert {field: code for field, (code, _) in numbers.items()} == {"limit": 200, "timeout_s": 200}
    assert not [line for line in agent.lines if "Traceback" in line or "ERROR" in line], agent.lines


# ---------------------------------------------------------------- SQLite's defensive mode

def test_which_defensive_mode_is_in_effect_and_that_it_bites(tmp_path, caplog):
    """On this machine's Python (< 3.12 here) defensive mode comes through ctypes; where it cannot,
    the fallback is one warning. Either way the test says which, and checks the behaviour: in
    defensive mode `PRAGMA journal_mode=OFF` (which could corrupt a database) is ignored."""
    db = tmp_path / "plain.db"
    conn = sqlite3.connect(str(db))
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.close()
    on, how = defensive_mode()
    reader = open_readonly(str(db))
    reader.execute("PRAGMA journal_mode=OFF")
    mode = reader.execute("PRAGMA journal_mode").fetchone()[0]
    reader.close()
    plain = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    plain.execute("PRAGMA journal_mode=OFF")
    unprotected = plain.execute("PRAGMA journal_mode").fetchone()[0]
    plain.close()
    assert unprotected == "off"                       # what a connection without defensive mode allows
    if sys.version_info >= (3, 12):
        assert on and "setconfig" in how
    else:
        assert on and how == "sqlite3_db_config through ctypes (auto-extension)", how
    assert mode == "delete", "open_readonly's connection let journal_mode=OFF through: defensive mode is off"
    assert sqlite_lib.memory_used() > 0              # the memory cap can be enforced here


# ---------------------------------------------------------------- the agent's unit: it dies, never the trainer

UNIT_PLAY = """\
- hosts: localhost
  gather_facts: false
  vars:
    straggler_agent_node: n1
    __straggler_agent_argv: [/opt/straggler/venv/bin/straggler, trace]
    straggler_agent_environment: {}
    straggler_agent_db: /var/lib/straggler/straggler.db
  tasks:
    - name: The role's defaults
      ansible.builtin.include_vars: {file: "%(repo)s/roles/straggler_agent/defaults/main.yml"}
    - name: The unit as the role writes it
      ansible.builtin.template:
        src: "%(repo)s/roles/straggler_agent/templates/straggler-agent.service.j2"
        dest: "%(dest)s"
        mode: "0644"
"""


def _render_unit(tmp_path, *extra):
    play = tmp_path / "unit.yml"
    dest = tmp_path / "straggler-agent.service"
    play.write_text(UNIT_PLAY % {"repo": REPO, "dest": dest})
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                          "-e", f"ansible_python_interpreter={sys.executable}", *extra, str(play)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO, stdin=subprocess.DEVNULL)
    return out, dest


def test_the_agents_unit_caps_its_memory_and_is_the_oom_killers_first_choice(tmp_path):
    out, unit = _render_unit(tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    lines = unit.read_text().splitlines()
    assert "MemoryMax=2G" in lines and "OOMScoreAdjust=1000" in lines
    if shutil.which("systemd-analyze"):
        checked = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        problems = [line for line in checked.stderr.splitlines() if "is not executable" not in line]
        assert not problems, problems   # systemd takes both settings (the agent's binary is not on this machine)
    out, unit = _render_unit(tmp_path, "-e", "straggler_agent_memory_max=512M")
    assert out.returncode == 0 and "MemoryMax=512M" in unit.read_text().splitlines()
    unit.unlink()
    out, unit = _render_unit(tmp_path, "-e", "straggler_agent_memory_max='2 GB'")
    assert out.returncode != 0 and not unit.exists()
    assert "straggler_agent_memory_max \"2 GB\": give bytes" in out.stdout + out.stderr


def test_a_row_of_many_small_escaped_strings_is_measured_before_it_is_made():
    """Strings under a slice each, 1,500 of them of control characters: 150 MB as JSON under a 64 MiB budget.
    Before, each was escaped before the row was known not to fit (64 MB made, then refused); now what may be
    made before the check is bounded, and a row that fits is still exact."""
    import tracemalloc
    from straggler.api.answer import encode_row, json_size
    row = ["\x01" * 16383] * 1500
    tracemalloc.start()
    try:
        refused = encode_row(row, budget=64 * MB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused is None and peak < 2 * MB, f"peak {peak:,} bytes for a row refused"
    fits = ["x\x01😀" * 300] * 400
    made = b"".join(encode_row(fits, budget=64 * MB))
    assert json.loads(made) == fits and len(made) == 1 + len(fits) + sum(map(json_size, fits))
