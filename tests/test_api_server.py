"""The agent's HTTPS API (api/server.py) with mutual TLS, the PKI that makes its certificates,
and the status it reports. Real TLS 1.3 over real loopback sockets.

What a user would notice: only clients with a certificate from the fleet CA get an answer;
a plain-HTTP / TLS mix-up gives a clear error instead of a hang; a slow query does not block
/health; a snapshot is a consistent database; requests are bounded."""
import http.client
import json
import os
import socket
import sqlite3
import ssl
import stat
import time

import pytest

from test_api_helpers import HeldQueries, Pki, db_fingerprint, make_node_db, wait_until

from straggler import pki
from straggler.api.limits import MAX_QUERIES_PER_CLIENT
from straggler.api.server import start_background
from straggler.errors import StragglerError
from straggler.fleet.client import fleet_query
from straggler.store.status import collect_status
from straggler.store.schema import SCHEMA_VERSION
from straggler.tls import TLSError, TLSOptions, client_context, server_context

ADDRESS = "127.0.0.1"
SLOW_QUERY_S = 6.0   # a slow query's own deadline: the window in which /health must be answered (a hang guard)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def agent(certs, tmp_path_factory):
    db = tmp_path_factory.mktemp("agent") / "node.db"
    make_node_db(db, "gpu-node-01", 0)
    handle = start_background(str(db), node=None, listen=f"{ADDRESS}:0", tls=certs.server(ADDRESS))
    handle.db = db
    yield handle
    handle.stop()


def _https(certs, handle, options=None, timeout=10):
    context = client_context(options or certs.client())
    return http.client.HTTPSConnection(ADDRESS, handle.port, context=context, timeout=timeout)


def _get_json(conn, path):
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def _post_json(conn, path, body):
    data = json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


# ---------------------------------------------------------------- mutual TLS

def test_client_with_fleet_certificate_gets_answers_over_tls13(certs, agent):
    conn = _https(certs, agent)
    code, answer = _post_json(conn, "/api/v1/query", {"sql": "SELECT op, count(*) FROM events GROUP BY op ORDER BY op",
                                                      "limit": 100})
    assert code == 200
    assert answer["node"] == "gpu-node-01"
    assert answer["rows"] == [["cuLaunchKernel", 1], ["cuMemAlloc", 2], ["ncclAllReduce", 3]]
    assert conn.sock.version() == "TLSv1.3"
    conn.close()


def _raw_tls_attempt(port, context):
    """Handshake and one request; returns the HTTP status line or raises what the client saw."""
    with socket.create_connection((ADDRESS, port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=ADDRESS) as tls:
            tls.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = tls.recv(4096)
            if not data:
                raise ConnectionResetError("closed without an answer")
            return data.split(b"\r\n", 1)[0]


def test_client_without_certificate_is_refused(certs, agent):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(certs.client().ca)
    with pytest.raises((ssl.SSLError, ConnectionError)) as caught:
        _raw_tls_attempt(agent.port, context)
    assert "HTTP/1.1 200" not in str(caught.value)


def test_client_certificate_from_another_ca_is_refused(certs, agent):
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _raw_tls_attempt(agent.port, client_context(certs.intruder()))
    result = fleet_query([f"{ADDRESS}:{agent.port}"], "SELECT 1", certs.intruder(), timeout_s=5, deadline_s=10,
                         clock_samples=0)
    assert result.nodes[0].status == "tls-error"
    assert "certificate" in result.nodes[0].message
    assert result.rows == []


def test_client_offering_only_tls12_is_refused(certs, agent):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(certs.client().ca)
    context.load_cert_chain(certs.client().cert, certs.client().key)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError) as caught:
        _raw_tls_attempt(agent.port, context)
    assert "version" in str(caught.value).lower()


def test_client_refuses_a_server_certificate_that_does_not_name_the_address(certs, agent, tmp_path):
    # the agent's certificate names 127.0.0.1; verifying it as 'gpu-node-99' must fail
    options = certs.client()
    options.server_name = "gpu-node-99"
    result = fleet_query([f"{ADDRESS}:{agent.port}"], "SELECT 1", options, timeout_s=5, deadline_s=10,
                         clock_samples=0)
    assert result.nodes[0].status == "tls-error"
    assert "not trusted" in result.nodes[0].message


def test_server_certificate_can_be_verified_by_node_name(certs, tmp_path):
    pki.issue(str(certs.dir), "gpu-node-07", [ADDRESS], kind="server")   # SANs: IP and DNS:gpu-node-07
    db = tmp_path / "n.db"
    make_node_db(db, "gpu-node-07", 0)
    server = TLSOptions(ca=str(certs.dir / "ca.crt"), cert=str(certs.dir / "gpu-node-07.crt"),
                        key=str(certs.dir / "gpu-node-07.key"))
    with start_background(str(db), listen=f"{ADDRESS}:0", tls=server) as handle:
        options = certs.client()
        options.server_name = "gpu-node-07"
        result = fleet_query([f"{ADDRESS}:{handle.port}"], "SELECT 1 AS one", options, timeout_s=5, clock_samples=0)
    assert result.nodes[0].status == "ok"


def test_missing_tls_files_give_one_line_errors(certs, tmp_path):
    with pytest.raises(TLSError) as caught:
        server_context(TLSOptions(ca=str(tmp_path / "nope.crt"), cert=certs.client().cert, key=certs.client().key))
    assert "does not exist" in str(caught.value) and "\n" not in str(caught.value)
    mismatched = TLSOptions(ca=certs.client().ca, cert=certs.client().cert, key=certs.intruder().key)
    with pytest.raises(TLSError) as caught:
        client_context(mismatched)
    assert "belong together" in str(caught.value)


# ---------------------------------------------------------------- plain HTTP

def test_no_tls_server_binds_loopback_only(tmp_path):
    db = tmp_path / "n.db"
    make_node_db(db, "gpu-node-02", 0)
    with start_background(str(db), listen="0.0.0.0:0", tls=TLSOptions(no_tls=True)) as handle:
        assert handle.host == "127.0.0.1"
    with pytest.raises(StragglerError) as caught:
        start_background(str(db), listen="192.0.2.123:0", tls=TLSOptions(no_tls=True))
    assert "--no-tls-any-address" in str(caught.value)


def test_plain_and_tls_mixups_give_clear_errors_not_hangs(certs, agent, tmp_path):
    db = tmp_path / "plain.db"
    make_node_db(db, "gpu-node-03", 0)
    with start_background(str(db), listen=f"{ADDRESS}:0", tls=TLSOptions(no_tls=True)) as plain:
        # TLS client -> plain server
        tls_to_plain = fleet_query([f"{ADDRESS}:{plain.port}"], "SELECT 1", certs.client(), timeout_s=20,
                                   deadline_s=30, clock_samples=0)
        # plain client -> TLS server
        plain_to_tls = fleet_query([f"{ADDRESS}:{agent.port}"], "SELECT 1", TLSOptions(no_tls=True), timeout_s=20,
                                   deadline_s=30, clock_samples=0)
        # plain client -> plain server works
        plain_ok = fleet_query([f"{ADDRESS}:{plain.port}"], "SELECT 1 AS one", TLSOptions(no_tls=True),
                               clock_samples=0)
    assert tls_to_plain.nodes[0].status == "tls-error"
    assert "plain HTTP" in tls_to_plain.nodes[0].message and "--no-tls" in tls_to_plain.nodes[0].message
    assert plain_to_tls.nodes[0].status == "tls-error"
    assert "HTTPS" in plain_to_tls.nodes[0].message
    assert plain_ok.nodes[0].status == "ok" and plain_ok.rows == [["gpu-node-03", 1]]


# ---------------------------------------------------------------- routes

def test_rejected_sql_gets_400_with_the_reason_and_the_database_is_unchanged(certs, agent):
    before = db_fingerprint(agent.db)
    conn = _https(certs, agent)
    for sql in ("DELETE FROM events", "ATTACH '/tmp/x.db' AS x", "PRAGMA user_version = 9", "SELECT 1; SELECT 2"):
        code, answer = _post_json(conn, "/api/v1/query", {"sql": sql})
        assert code == 400, sql
        assert answer["kind"] == "rejected" and answer["error"], sql
    conn.close()
    assert db_fingerprint(agent.db) == before


def test_slow_query_does_not_block_health(certs, agent):
    """Slow queries fill the client's query share (its next query is told 429 while they run, which
    is how the test knows they run, without a clock): /health is answered, and the 429 again after
    it shows they were still running then. They end at their own deadline."""
    slow_sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    slow_conns = [_https(certs, agent, timeout=60) for _ in range(MAX_QUERIES_PER_CLIENT)]
    probe_conn = _https(certs, agent, timeout=60)

    def probe():
        return _post_json(probe_conn, "/api/v1/query", {"sql": "SELECT 1"})

    slow = HeldQueries(lambda conn: _post_json(conn, "/api/v1/query", {"sql": slow_sql, "timeout_s": SLOW_QUERY_S}),
                       slow_conns)
    try:
        running = wait_until(lambda: slow.share_full(probe), SLOW_QUERY_S)
        conn = _https(certs, agent)
        code, health = _get_json(conn, "/api/v1/health")
        conn.close()
        still_running = slow.share_full(probe)
        ended = slow.join()
    finally:
        for c in slow_conns + [probe_conn]:
            c.close()
    assert running, "the slow queries never filled the client's share"
    assert code == 200 and health["node"] == "gpu-node-01"
    assert still_running, "/health was answered only after the slow queries ended"
    assert ended and [slow.outcomes[i][0] for i in range(len(slow_conns))] == [400] * len(slow_conns), slow.outcomes
    assert {answer["kind"] for _, answer in slow.outcomes.values()} == {"timeout"}, slow.outcomes


def test_health_reports_the_agent_from_its_tables(certs, agent):
    conn = _https(certs, agent)
    code, health = _get_json(conn, "/api/v1/health")
    conn.close()
    assert code == 200
    assert health["ranks"] == [0]
    assert health["schema_version"] == SCHEMA_VERSION
    assert health["agent_version"] == "test"
    assert health["probes_attached"] == 2
    assert health["events_per_s"] == pytest.approx(900.0)
    assert health["probe_hits_per_s"] == pytest.approx(1000.0)
    assert health["agent_cpu_percent"] == pytest.approx(2.0)
    assert health["summary_interval_s"] == 1.0 and health["summary_cpu_percent"] == pytest.approx(0.05)
    assert health["lost_events_total"] == 7
    assert health["db_size_bytes"] >= os.path.getsize(agent.db)


def test_clock_route_reads_realtime_and_stored_pairs(certs, agent):
    conn = _https(certs, agent)
    before = time.time_ns()
    code, clock = _get_json(conn, "/api/v1/clock")
    after = time.time_ns()
    conn.close()
    assert code == 200
    assert before <= clock["realtime_ns"] <= after
    assert abs(clock["monotonic_ns"] - time.monotonic_ns()) < 60 * 10**9
    assert clock["pairs"] == [[s * 10**9, 1_767_225_600 * 10**9 + s * 10**9] for s in range(3)]


def test_snapshot_route_streams_a_consistent_database(certs, agent, tmp_path):
    conn = _https(certs, agent)
    conn.request("GET", "/api/v1/snapshot")
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "application/vnd.sqlite3"
    copy = tmp_path / "snap.db"
    copy.write_bytes(response.read())
    conn.close()
    db = sqlite3.connect(str(copy))
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 6
    assert db.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()[0] == "gpu-node-01"


def test_oversized_and_malformed_requests_are_refused(certs, agent):
    conn = _https(certs, agent)
    conn.putrequest("POST", "/api/v1/query")
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    response.read()
    conn.close()
    conn = _https(certs, agent)
    conn.request("POST", "/api/v1/query", body=b"{not json", headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 400 and "JSON" in json.loads(response.read())["error"]
    code, answer = _get_json(conn, "/api/v1/nothing")
    assert code == 404
    conn.close()


# ---------------------------------------------------------------- pki and status

def test_pki_is_idempotent_and_keeps_keys_private(tmp_path):
    directory = str(tmp_path / "ca")
    first = pki.init_ca(directory)
    again = pki.init_ca(directory)
    assert first["changed"] and not again["changed"]
    assert stat.S_IMODE(os.stat(os.path.join(directory, "ca.key")).st_mode) == 0o600
    issued = pki.issue(directory, "gpu-node-01", ["10.213.7.11"])
    same = pki.issue(directory, "gpu-node-01", ["10.213.7.11"])
    other_san = pki.issue(directory, "gpu-node-01", ["10.213.7.11", "10.213.7.99"])
    assert issued["changed"] and not same["changed"] and other_san["changed"]
    assert "IP:10.213.7.99" in other_san["sans"] and "DNS:gpu-node-01" in other_san["sans"]
    assert stat.S_IMODE(os.stat(os.path.join(directory, "gpu-node-01.key")).st_mode) == 0o600
    client = pki.issue(directory, "controller", [], kind="client")
    assert client["changed"] and client["kind"] == "client"
    # a new CA: the old certificate is no longer signed by it and gets reissued
    pki.init_ca(directory, force=True)
    assert pki.issue(directory, "gpu-node-01", ["10.213.7.11", "10.213.7.99"])["changed"]


def test_pki_cli_reports_changed_in_json(tmp_path):
    import subprocess
    import sys
    from test_api_helpers import REPO, venv_env
    base = [sys.executable, "-m", "straggler.cli", "pki"]
    directory = str(tmp_path / "p")
    runs = []
    for argv in (["init", "--dir", directory, "--json"], ["issue", "--dir", directory, "--name", "n1",
                                                          "--san", "127.0.0.1", "--json"],
                 ["issue", "--dir", directory, "--name", "n1", "--san", "127.0.0.1", "--json"]):
        out = subprocess.run(base + argv, capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout)["changed"])
    assert runs == [True, True, False]


def test_status_of_a_database_without_agent_tables_is_a_clear_error(tmp_path):
    plain = tmp_path / "other.db"
    sqlite3.connect(str(plain)).execute("CREATE TABLE t(x)").connection.commit()
    with pytest.raises(StragglerError) as caught:
        collect_status(str(plain))
    assert "not a straggler database" in str(caught.value)
