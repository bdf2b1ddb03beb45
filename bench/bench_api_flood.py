"""The agent's API under an idle-connection flood: latency of valid mutual-TLS queries with and
without 200 idle TCP connections and 64 stalled TLS handshakes held open against the same port,
measured in the same run, against the same server (api/server.py on loopback, the project's PKI).

Baseline: the same queries with no flood, before and after it (interleaved rounds). A query is a
fresh connection (handshake + POST /api/v1/query), as the fleet client makes them.

Writes bench/results/api_flood.json and prints a table (p50/p99/max in ms per condition).
`--quick`: fewer queries.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))
sys.path.insert(0, str(REPO / "tests"))

from test_api_helpers import Pki, make_node_db  # noqa: E402  (tests/: the same PKI and store the tests use)

from straggler.api.server import start_background  # noqa: E402
from straggler.tls import client_context  # noqa: E402

ADDRESS = "127.0.0.1"
IDLE = 200
STALLED = 64
SQL = "SELECT op, count(*) FROM events GROUP BY op ORDER BY op"


def _one_query(port, context):
    started = time.perf_counter()
    conn = http.client.HTTPSConnection(ADDRESS, port, context=context, timeout=30)
    try:
        conn.request("POST", "/api/v1/query", body=json.dumps({"sql": SQL, "limit": 100}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
    finally:
        conn.close()
    return (time.perf_counter() - started) * 1000.0


def _flood(port):
    held = []
    for _ in range(IDLE):
        held.append(socket.create_connection((ADDRESS, port), timeout=5))
    for _ in range(STALLED):
        sock = socket.create_connection((ADDRESS, port), timeout=5)
        sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 16)
        held.append(sock)
    return held


def _stats(samples):
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 2), "p99_ms": round(p99, 2),
            "max_ms": round(ordered[-1], 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--queries", type=int, default=None, help="queries per round (default 100, quick 20)")
    args = parser.parse_args(argv)
    per_round = args.queries or (20 if args.quick else 100)
    rounds = 2 if args.quick else 4
    samples = {"no flood": [], "flood": []}
    with tempfile.TemporaryDirectory(prefix="straggler-bench-flood-") as tmp:
        certs = Pki(Path(tmp))
        db = Path(tmp) / "node.db"
        make_node_db(db, "gpu-node-01", 0)
        context = client_context(certs.client())
        with start_background(str(db), listen=f"{ADDRESS}:0", tls=certs.server(ADDRESS)) as handle:
            for _ in range(3):   # warm-up
                _one_query(handle.port, context)
            for _ in range(rounds):   # interleaved: the baseline sees the same machine state
                samples["no flood"] += [_one_query(handle.port, context) for _ in range(per_round)]
                held = _flood(handle.port)
                try:
                    time.sleep(0.2)
                    samples["flood"] += [_one_query(handle.port, context) for _ in range(per_round)]
                finally:
                    for sock in held:
                        sock.close()
                time.sleep(0.5)
    results = {"quick": args.quick, "machine": {"cpus": os.cpu_count()}, "idle_connections": IDLE,
               "stalled_handshakes": STALLED, "conditions": {k: _stats(v) for k, v in samples.items()}}
    base, flood = results["conditions"]["no flood"], results["conditions"]["flood"]
    results["p99_ratio"] = round(flood["p99_ms"] / base["p99_ms"], 2) if base["p99_ms"] else None
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "api_flood.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'condition':<12} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, entry in results["conditions"].items():
        print(f"{name:<12} {entry['n']:>5} {entry['p50_ms']:>8} {entry['p99_ms']:>8} {entry['max_ms']:>8}")
    print(f"flood: {IDLE} idle TCP connections + {STALLED} stalled TLS handshakes; p99 ratio {results['p99_ratio']}")
    print(f"results: {out_dir / 'api_flood.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
