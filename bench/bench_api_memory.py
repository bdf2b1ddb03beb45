"""The agent's peak memory under the memory attacks on its API, against a baseline in the same run:
each condition runs against a fresh `straggler serve` process (the project's PKI, mutual TLS on
loopback), and its peak resident memory (VmHWM) is read before and after the attack.

  baseline          100 small queries and /health: what serving costs without an attack
  huge rows         a query of 20 rows of 8 MB under the default 64 MiB byte cap (streamed, cut)
  stalled readers   4 such queries from two certificates whose readers stop reading
  huge sort         a 3M-row ORDER BY held in memory (temp_store=MEMORY) under the default query memory cap
  connection flood  one certificate opening 200 keep-alive connections (its share is 32)

Writes bench/results/api_memory.json and prints a table (MB of peak RSS above the process's own
baseline, and the answer each attack got). `--quick`: fewer small queries.
"""
import argparse
import http.client
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))
sys.path.insert(0, str(REPO / "tests"))

from test_api_helpers import Pki, make_node_db  # noqa: E402  (tests/: the PKI and store the tests use)
from test_api_limits import BIG_SORT_SQL, HUGE_ROWS_SQL, Serve  # noqa: E402  (the same attacks and process)

from straggler import pki  # noqa: E402
from straggler.tls import TLSOptions, client_context  # noqa: E402

ADDRESS = "127.0.0.1"
MB = 1 << 20


def _client(certs, name):
    return TLSOptions(ca=str(certs.dir / "ca.crt"), cert=str(certs.dir / f"{name}.crt"),
                      key=str(certs.dir / f"{name}.key"))


def _post(port, options, sql, limit=100, timeout=120):
    conn = http.client.HTTPSConnection(ADDRESS, port, context=client_context(options), timeout=timeout)
    try:
        conn.request("POST", "/api/v1/query", body=json.dumps({"sql": sql, "limit": limit, "timeout_s": 30}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
    finally:
        conn.close()
    return response.status, answer


def _summary(code, answer):
    if code != 200:
        return f"{code} {answer.get('kind')}"
    return f"200, {len(answer['rows'])} rows" + (f", truncated ({answer.get('truncated_reason')})"
                                                 if answer.get("truncated") else "")


def baseline(agent, certs, small):
    for _ in range(small):
        _post(agent.port, certs.client(), "SELECT op, count(*) FROM events GROUP BY op")
    return f"{small} small queries answered"


def huge_rows(agent, certs, small):
    return _summary(*_post(agent.port, certs.client(), HUGE_ROWS_SQL))


def stalled_readers(agent, certs, small):
    body = json.dumps({"sql": HUGE_ROWS_SQL, "limit": 100}).encode()
    socks = []
    for name in ("controller", "hog", "controller", "hog"):
        raw = socket.create_connection((ADDRESS, agent.port), timeout=10)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock = client_context(_client(certs, name)).wrap_socket(raw, server_hostname=ADDRESS)
        sock.sendall(b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(sock)
    time.sleep(5)
    for sock in socks:
        sock.close()
    return "4 answers held by readers that stopped reading for 5 s"


def huge_sort(agent, certs, small):
    return _summary(*_post(agent.port, _client(certs, "hog"), BIG_SORT_SQL, limit=10))


def connection_flood(agent, certs, small):
    held, refused = [], 0
    for _ in range(200):
        conn = http.client.HTTPSConnection(ADDRESS, agent.port, context=client_context(_client(certs, "hog")),
                                           timeout=10)
        conn.request("GET", "/api/v1/health")
        response = conn.getresponse()
        response.read()
        if response.status == 200:
            held.append(conn)
        else:
            refused += 1
            conn.close()
    for conn in held:
        conn.close()
    return f"{len(held)} held, {refused} refused (429)"


CONDITIONS = [("baseline", baseline), ("huge rows", huge_rows), ("stalled readers", stalled_readers),
              ("huge sort", huge_sort), ("connection flood", connection_flood)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    small = 20 if args.quick else 100
    results = {"quick": args.quick, "machine": {"cpus": os.cpu_count()}, "conditions": {}}
    with tempfile.TemporaryDirectory(prefix="straggler-bench-memory-") as tmp:
        certs = Pki(Path(tmp))
        pki.issue(str(certs.dir), "hog", [], kind="client", roles=["query"])
        db = Path(tmp) / "node.db"
        make_node_db(db, "gpu-node-01", 0)
        for name, attack in CONDITIONS:
            with Serve(db, certs.server(ADDRESS)) as agent:
                for _ in range(3):   # warm-up: imports, TLS, the first SQLite connections
                    _post(agent.port, certs.client(), "SELECT count(*) FROM events")
                before = agent.status("VmHWM")
                started = time.monotonic()
                outcome = attack(agent, certs, small)
                elapsed = time.monotonic() - started
                after = agent.status("VmHWM")
            results["conditions"][name] = {"peak_rss_before_mb": round(before / MB, 1),
                                           "peak_rss_after_mb": round(after / MB, 1),
                                           "grown_mb": round((after - before) / MB, 1),
                                           "seconds": round(elapsed, 2), "outcome": outcome}
    base = results["conditions"]["baseline"]["grown_mb"]
    for entry in results["conditions"].values():
        entry["over_baseline_mb"] = round(entry["grown_mb"] - base, 1)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "api_memory.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'condition':<18} {'peak MB':>8} {'grown MB':>9} {'over base':>10}  outcome")
    for name, entry in results["conditions"].items():
        print(f"{name:<18} {entry['peak_rss_after_mb']:>8} {entry['grown_mb']:>9} {entry['over_baseline_mb']:>10}  "
              f"{entry['outcome']}")
    print(f"results: {out_dir / 'api_memory.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
