"""The agent's API under hostile and heavy use: a real server (api/server.py) on loopback with the
project's PKI, real TLS 1.3 and real sockets; every loop and wait is bounded.

What a user would notice: a valid client is answered while others hold idle sockets or half-done
handshakes; a client that dribbles its request is cut at the request deadline; a reader too slow
for a big answer gets it whole or sees it cut (never a silently short answer); an answer never
outgrows its cap; every malformed request gets a 4xx with one line and the server goes on serving;
a certificate without the snapshot role cannot take the store, and a revoked one is refused.

No assertion judges a speed: a deadline is shown by what only it produces (the connection closed
with no answer, the server's log line naming it), each wait is bounded by a hang guard far beyond
the deadline, and latency beside a flood is bench/bench_api_flood.py's measure."""
import http.client
import json
import logging
import select
import shutil
import socket
import ssl
import threading
import time

import pytest

from test_api_helpers import Pki, make_node_db, wait_until

from straggler import pki
from straggler.api.server import MAX_PENDING_PER_PEER, start_background
from straggler.fleet.client import fleet_query
from straggler.tls import TLSOptions, client_context

ADDRESS = "127.0.0.1"
REQUEST_TIMEOUT_S = 2.0
SEND_TIMEOUT_S = 1.0
MAX_ANSWER_BYTES = 4 << 20
DEADLINE_GUARD_S = 30.0            # how long a test waits for a 2 s deadline to fire: a hang guard, not a measure
FLOOD_HANDSHAKE_TIMEOUT_S = 600.0   # the flood test's server never drops the flood at its deadline...
FLOOD_GUARD_S = 60.0                # ...within the flood test's guard
# a query whose answer is about 20 MB of JSON: 200k rows of a number and 100 hex characters
BIG_SQL = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 200000) "
           "SELECT x, hex(randomblob(50)) FROM c")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def agent(certs, tmp_path_factory):
    db = tmp_path_factory.mktemp("attacked") / "node.db"
    make_node_db(db, "gpu-node-01", 0)
    handle = start_background(str(db), listen=f"{ADDRESS}:0", tls=certs.server(ADDRESS),
                              request_timeout_s=REQUEST_TIMEOUT_S, send_timeout_s=SEND_TIMEOUT_S,
                              max_answer_bytes=MAX_ANSWER_BYTES, handshake_timeout_s=2.0)
    handle.db = db
    yield handle
    handle.stop()


def _https(certs, handle, options=None, timeout=10):
    return http.client.HTTPSConnection(ADDRESS, handle.port, context=client_context(options or certs.client()),
                                       timeout=timeout)


def _query(certs, handle, sql, limit=100, options=None, timeout=10):
    conn = _https(certs, handle, options, timeout)
    try:
        conn.request("POST", "/api/v1/query", body=json.dumps({"sql": sql, "limit": limit}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _still_serving(certs, handle):
    code, answer = _query(certs, handle, "SELECT count(*) FROM events")
    assert code == 200 and answer["rows"] == [[6]], answer


def _tls_socket(certs, handle):
    raw = socket.create_connection((ADDRESS, handle.port), timeout=10)
    return client_context(certs.client()).wrap_socket(raw, server_hostname=ADDRESS)


def _read_until_closed(sock, limit_s):
    """Everything the server sends until it closes (or limit_s passes): (bytes, closed)."""
    data = b""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, TimeoutError):
            return data, False
        except (ConnectionError, ssl.SSLError):
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


# ---------------------------------------------------------------- before authentication

def _closed_by_server(sock):
    """Whether the server has closed this raw TCP socket (FIN or reset), without waiting; what it
    sent before (an alert) is read and dropped."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
    return False


@pytest.fixture
def flooded(certs, tmp_path):
    """A server whose handshake deadline (10 min) cannot end any connection during a test, and 264
    unauthenticated connections from one address held open against it: 200 TCP connections that
    never say a word, 64 TLS handshakes stalled after part of a ClientHello. Yields (handle, sockets)."""
    db = tmp_path / "node.db"
    make_node_db(db, "gpu-node-01", 0)
    held = []
    with start_background(str(db), listen=f"{ADDRESS}:0", tls=certs.server(ADDRESS),
                          handshake_timeout_s=FLOOD_HANDSHAKE_TIMEOUT_S) as handle:
        try:
            for _ in range(200):
                held.append(socket.create_connection((ADDRESS, handle.port), timeout=5))
            for _ in range(64):
                sock = socket.create_connection((ADDRESS, handle.port), timeout=5)
                sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 16)
                held.append(sock)
            yield handle, held
        finally:
            for sock in held:
                sock.close()


def test_a_valid_client_is_answered_while_idle_sockets_and_half_handshakes_flood_the_port(certs, flooded):
    """None of the flood can be dropped at a deadline during this test, so the valid client is
    answered beside it, not after it: a server that served the flood first would hold the client
    until the flood's handshake deadline, far past the client's own timeout (the hang guard). How
    fast it is answered beside a flood is bench/bench_api_flood.py's measure (p99 against the same
    queries without the flood, in the same run), not this test's."""
    handle, _ = flooded
    code, answer = _query(certs, handle, "SELECT op, count(*) FROM events GROUP BY op ORDER BY op",
                          timeout=FLOOD_GUARD_S)
    assert code == 200 and answer["rows"] == [["cuLaunchKernel", 1], ["cuMemAlloc", 2], ["ncclAllReduce", 3]]


def test_one_address_holds_at_most_its_share_of_unauthenticated_connections(certs, flooded):
    """Of the 264, the server closes all but its per-address share (the oldest go first), so a flood
    from one address costs the agent at most MAX_PENDING_PER_PEER sockets until their deadline."""
    handle, held = flooded
    assert _query(certs, handle, "SELECT 1", timeout=FLOOD_GUARD_S)[0] == 200   # every flood socket accepted by now
    closed = wait_until(lambda: sum(map(_closed_by_server, held)) >= len(held) - MAX_PENDING_PER_PEER, FLOOD_GUARD_S)
    still_open = [sock for sock in held if not _closed_by_server(sock)]
    assert closed and 0 < len(still_open) <= MAX_PENDING_PER_PEER, \
        f"{len(still_open)} of {len(held)} unauthenticated connections from one address still held by the server"


def test_a_silent_connection_and_a_stalled_handshake_are_closed_at_the_handshake_deadline(certs, agent, caplog):
    """Nothing else closes them: the read below waits far longer than the deadline (2 s here), and a
    server without one would keep both open past it."""
    with caplog.at_level(logging.INFO, logger="straggler.api"):
        with socket.create_connection((ADDRESS, agent.port), timeout=10) as silent, \
                socket.create_connection((ADDRESS, agent.port), timeout=10) as stalled:
            stalled.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 16)
            silent_data, silent_closed = _read_until_closed(silent, DEADLINE_GUARD_S)
            stalled_data, stalled_closed = _read_until_closed(stalled, DEADLINE_GUARD_S)
    assert silent_closed and silent_data == b""
    assert stalled_closed and not stalled_data.startswith(b"HTTP/")
    told = [r.getMessage() for r in caplog.records if "TLS handshake with" in r.getMessage()]
    assert any("no handshake within the time limit" in line for line in told), told


# ---------------------------------------------------------------- requests

def test_a_client_dribbling_its_headers_is_cut_at_the_request_deadline(certs, agent, caplog):
    """One header byte every 0.25 s: each read gets a byte in time, the whole request never comes.
    The server closes the connection without an answer and says it was the request deadline; the
    client would have gone on far past it (the hang guard)."""
    with caplog.at_level(logging.INFO, logger="straggler.api"), _tls_socket(certs, agent) as sock:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        received, closed = b"", False
        give_up = time.monotonic() + DEADLINE_GUARD_S
        while not closed and time.monotonic() < give_up:
            try:
                sock.sendall(b"X")
            except (ConnectionError, ssl.SSLError, OSError):
                closed = True
                break
            data, closed = _read_until_closed(sock, 0.25)
            received += data
    assert closed, f"the server kept a connection that never completed its request for {DEADLINE_GUARD_S:g} s"
    assert received == b"", received[:200]   # cut, not answered (a 4xx would mean a size limit, not the deadline)
    told = [r.getMessage() for r in caplog.records]
    assert any(f"no complete request within {REQUEST_TIMEOUT_S:g} s; connection closed" in line for line in told), told
    _still_serving(certs, agent)


def _dechunk(data):
    """A chunked body's bytes and whether it ended with its last (empty) chunk."""
    body, pos = b"", 0
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            return body, False
        size = int(data[pos:line_end].split(b";")[0], 16)
        if size == 0:
            return body, data[line_end + 2:line_end + 4] == b"\r\n"
        start = line_end + 2
        if len(data) < start + size + 2:
            return body + data[start:start + size], False
        body += data[start:start + size]
        pos = start + size + 2


def _wait_for_reset(sock, guard_s):
    """Without reading anything: whether the peer reset (or hung up) the connection within guard_s."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLERR | select.POLLHUP)
    return bool(poller.poll(guard_s * 1000))


def test_a_reader_too_slow_for_a_big_answer_sees_it_cut_short_of_its_end_never_silently(certs, tmp_path, caplog):
    """A reader in time gets the 20 MB answer whole; one that stops reading after its head is reset
    by the server (the stall lasts until then, bounded by a hang guard) and holds a chunked body
    without its last chunk: cut, never silently short."""
    db = tmp_path / "node.db"
    make_node_db(db, "gpu-node-02", 1)
    # a 20 MB answer must be taken at 2 MB/s (plus 1 s): 11 s, far more than a reader in time needs
    with caplog.at_level(logging.INFO, logger="straggler.api"), \
            start_background(str(db), listen=f"{ADDRESS}:0", tls=certs.server(ADDRESS), send_timeout_s=1.0,
                             min_send_rate=2 << 20) as handle:
        result = fleet_query([f"{ADDRESS}:{handle.port}"], BIG_SQL, certs.client(), limit=200000, timeout_s=30,
                             deadline_s=40, clock_samples=0)
        assert result.nodes[0].status == "ok" and result.nodes[0].row_count == 200000   # a reader in time: whole
        with _tls_socket(certs, handle) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            body = json.dumps({"sql": BIG_SQL, "limit": 200000}).encode()
            sock.sendall(b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            received, _ = _read_until_closed(sock, 0.5)
            while b"\r\n\r\n" not in received and len(received) < 65536:
                more, closed = _read_until_closed(sock, 0.5)
                received += more
                if closed or not more:
                    break
            reset = _wait_for_reset(sock, 6 * DEADLINE_GUARD_S)   # a reader that stalls until the server gives up
            rest, closed = _read_until_closed(sock, DEADLINE_GUARD_S)
            received += rest
        code, answer = _query(certs, handle, "SELECT count(*) FROM events")   # and it goes on serving
        assert code == 200 and answer["rows"] == [[12]], answer
    head, _, got = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    assert b"transfer-encoding: chunked" in head.lower()   # a big answer streams: no length, chunks
    body, complete = _dechunk(got)
    assert reset and closed and body and not complete, (reset, closed, len(body), complete)
    assert any("answer not taken within its deadline" in r.getMessage() for r in caplog.records)


def test_a_reader_cut_short_is_reported_as_truncated_by_the_fleet_client():
    """A peer that announces 1000 bytes and closes after 10, or streams a chunked answer and closes
    before its last chunk: the fleet client says truncated, not a certificate problem; one that
    stalls in the middle says timeout (it stalls until the client has given up, not for a while)."""
    def serve(listener, stall, gave_up):
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            conn.recv(65536)
            if stall == "chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                             b'\r\nb\r\n{"node":"x"\r\n')
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                         b'{"node":"x"')
            if stall:
                gave_up.wait(30)

    statuses = {}
    for stall in (False, True, "chunked"):
        listener = socket.create_server((ADDRESS, 0))
        listener.settimeout(10)
        gave_up = threading.Event()
        thread = threading.Thread(target=serve, args=(listener, stall, gave_up), daemon=True)
        thread.start()
        try:
            result = fleet_query([f"{ADDRESS}:{listener.getsockname()[1]}"], "SELECT 1", TLSOptions(no_tls=True),
                                 timeout_s=1.5, deadline_s=10, clock_samples=0)
        finally:
            gave_up.set()
            thread.join(timeout=10)
            listener.close()
        statuses[stall] = (result.nodes[0].status, result.nodes[0].message)
    assert statuses[False][0] == "truncated" and "answer" in statuses[False][1], statuses
    assert statuses["chunked"][0] == "truncated" and "answer" in statuses["chunked"][1], statuses
    assert statuses[True][0] == "timeout", statuses


def test_answers_are_capped_in_bytes_and_a_huge_value_is_refused_with_one_line(certs, agent):
    code, answer = _query(certs, agent, BIG_SQL, limit=200000)
    assert code == 200 and answer["truncated"] is True and answer["truncated_reason"] == "bytes"
    assert 0 < len(answer["rows"]) < 200000
    assert len(json.dumps(answer["rows"], separators=(",", ":"))) <= MAX_ANSWER_BYTES
    code, answer = _query(certs, agent, "SELECT hex(zeroblob(50000000))")
    assert code == 400 and answer["kind"] == "sql-error"
    assert "too big" in answer["error"] and "\n" not in answer["error"]
    result = fleet_query([f"{ADDRESS}:{agent.port}"], BIG_SQL, certs.client(), limit=200000, timeout_s=20,
                         deadline_s=30, clock_samples=0)
    assert result.nodes[0].status == "ok" and result.nodes[0].truncated
    assert "size cap" in result.nodes[0].message
    _still_serving(certs, agent)


def _raw_request(certs, agent, data):
    with _tls_socket(certs, agent) as sock:
        sock.sendall(data)
        received, _ = _read_until_closed(sock, 5.0)
    head, _, body = received.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


def _post(body, extra=b""):
    return (b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)


MALFORMED = {
    "limit Infinity": (_post(b'{"sql": "SELECT 1", "limit": Infinity}'), "400"),
    "timeout NaN": (_post(b'{"sql": "SELECT 1", "timeout_s": NaN}'), "400"),
    "limit 1e999": (_post(b'{"sql": "SELECT 1", "limit": 1e999}'), "400"),
    "limit as text": (_post(b'{"sql": "SELECT 1", "limit": "ten"}'), "400"),
    "limit true": (_post(b'{"sql": "SELECT 1", "limit": true}'), "400"),
    "negative limit": (_post(b'{"sql": "SELECT 1", "limit": -5}'), "400"),
    "nested JSON": (_post(b'{"sql": "SELECT 1", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"), "400"),
    "not UTF-8": (_post(b'{"sql": "\xff\xfe"}'), "400"),
    "duplicate Content-Length": (_post(b'{"sql": "SELECT 1"}', extra=b"Content-Length: 3\r\n"), "400"),
    "chunked body": (b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n0\r\n\r\n", "411"),
    "garbage request line": (b"HELLO\r\n\r\n", "400"),
    "HTTP/2.0": (b"GET /api/v1/health HTTP/2.0\r\nHost: x\r\n\r\n", "505"),
    "headers over 16 KB": (b"GET /api/v1/health HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", "431"),
    "too many headers": (b"GET /api/v1/health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
                         + b"\r\n", "431"),
    "body shorter than its length": (b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                                     b"Connection: close\r\n\r\n{}", None),   # waits: cut at the deadline
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_request_gets_a_4xx_with_one_line_and_the_server_goes_on(certs, agent, case):
    data, expected = MALFORMED[case]
    status, body = _raw_request(certs, agent, data)
    if expected is None:
        assert status == "" or status.startswith("HTTP/1.1 4"), status
    else:
        assert status.startswith(f"HTTP/1.1 {expected}"), (status, body[:200])
        answer = json.loads(body)
        assert answer["error"] and "\n" not in answer["error"] and "Traceback" not in answer["error"]
    _still_serving(certs, agent)


# ---------------------------------------------------------------- authorization

def _client(certs, name):
    return TLSOptions(ca=str(certs.dir / "ca.crt"), cert=str(certs.dir / f"{name}.crt"),
                      key=str(certs.dir / f"{name}.key"))


def test_a_certificate_without_the_snapshot_role_gets_403_on_snapshot_and_still_queries(certs, agent):
    pki.issue(str(certs.dir), "dashboard", [], kind="client", roles=["query"])
    reader = _client(certs, "dashboard")
    conn = _https(certs, agent, reader)
    try:
        conn.request("GET", "/api/v1/snapshot")
        response = conn.getresponse()
        answer = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 403 and answer["kind"] == "forbidden" and "snapshot" in answer["error"]
    code, answer = _query(certs, agent, "SELECT count(*) FROM events", options=reader)
    assert code == 200 and answer["rows"] == [[6]]
    conn = _https(certs, agent)   # the controller's certificate has both roles
    try:
        conn.request("GET", "/api/v1/snapshot")
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    assert response.status == 200 and data.startswith(b"SQLite format 3\x00")


def test_a_revoked_certificate_is_refused_at_the_handshake_without_restarting_the_agent(certs, agent, tmp_path):
    pki.issue(str(certs.dir), "leaked", [], kind="client")
    for suffix in (".crt", ".key"):   # the thief's copy (revoke moves the CA's copy aside)
        shutil.copy2(certs.dir / f"leaked{suffix}", tmp_path / f"leaked{suffix}")
    leaked = TLSOptions(ca=str(certs.dir / "ca.crt"), cert=str(tmp_path / "leaked.crt"), key=str(tmp_path / "leaked.key"))
    code, _ = _query(certs, agent, "SELECT 1", options=leaked)
    assert code == 200
    pki.revoke(str(certs.dir), names=["leaked"])
    refused = None
    for _ in range(30):   # the agent re-reads the CRL at most once a second
        time.sleep(0.2)
        try:
            _query(certs, agent, "SELECT 1", options=leaked)
        except (ssl.SSLError, ConnectionError) as exc:
            refused = exc
            break
    assert refused is not None and "revoked" in str(refused).lower(), refused
    result = fleet_query([f"{ADDRESS}:{agent.port}"], "SELECT 1", leaked, timeout_s=5, deadline_s=10, clock_samples=0)
    assert result.nodes[0].status == "tls-error" and "revoked" in result.nodes[0].message
    _still_serving(certs, agent)
