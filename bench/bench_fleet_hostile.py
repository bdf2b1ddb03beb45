"""The controller's peak memory when a node answers far more than it was asked, against honest
nodes in the same run. Each condition runs a fresh controller process and reads its peak resident
memory (ru_maxrss, from wait4); the nodes are real: honest `straggler serve` agents (in this
process) and a hostile HTTPS server with mutual TLS (tests/test_fleet_bounded.py, a process of its
own), all on loopback with the project's PKI.

  honest               `straggler fleet query` (text mode) on two honest agents, 1,000 rows asked of
                       each and answered: the baseline
  many rows            the same with one honest agent and a hostile node answering N rows (N = 1,000,000;
                       200,000 with --quick) with a Content-Length
  many rows, chunked   the same answer chunked
  huge value           one row holding one 32 MB value
  huge length          a Content-Length of 1 TB
  many fields          a million fields beside the rows
  live, honest         the watch's poll of one honest agent's /api/v1/live (LiveFeed.get): the live baseline
  live, many rows      the same poll of a hostile node answering 5N summaries
  read whole, honest   reference: the honest 1,000-row answer read whole and decoded (response.read(),
                       json.loads), as a client without caps reads it
  read whole, many rows  the many-rows answer read so: what the caps keep the controller from holding

Writes bench/results/fleet_hostile.json and prints a table: peak RSS of the controller process,
MB above its baseline (honest; live, honest; read whole, honest), the hostile node's status.
`--quick`: N = 200,000. Exits 1 when a hostile node was not refused as oversized.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))
sys.path.insert(0, str(REPO / "tests"))
# the tests' PKI, store and hostile node are imported in main(): a controller process started from
# this file (--child) holds only what a controller holds

MB = 1 << 20
ASKED = 1000
HONEST_SQL = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000) "
              "SELECT 'cuLaunchKernel' AS op, x AS n, 'python' AS comm, 1767225600123456789 AS ts, 0.5 AS w FROM c")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "agent") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _measured(argv):
    """Run argv under this script's --rss wrapper -> (exit code, stdout, stderr, its peak RSS in bytes, seconds)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--rss", "--"] + argv, capture_output=True, text=True,
                          errors="replace", env=_env(), cwd=REPO, timeout=900)
    seconds = time.monotonic() - started
    lines = proc.stderr.rstrip().splitlines()
    measured = json.loads(lines[-1])
    return measured["rc"], proc.stdout, "\n".join(lines[:-1]), measured["maxrss_kb"] * 1024, seconds


def _rss_wrapper(argv):
    """Run argv as a child, wait for it with wait4 and print its exit code and peak RSS on stderr."""
    proc = subprocess.Popen(argv)
    _, status, usage = os.wait4(proc.pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss}), file=sys.stderr)
    return 0


def _fleet_cli(nodes, certs):
    return [sys.executable, "-m", "straggler.cli", "fleet", "query", "--nodes", ",".join(nodes), "--limit",
            str(ASKED), "--clock-samples", "0", "--timeout", "120", "--deadline", "300"] + \
        certs.tls_args(certs.client()) + [HONEST_SQL]


def _child(kind, address, ca, cert, key):
    """In a controller process of its own: one live poll, or the unbounded read of a query answer."""
    from straggler.tls import TLSOptions, client_context
    tls = TLSOptions(ca=ca, cert=cert, key=key)
    if kind == "live":
        from straggler.fleet.live import LiveFeed
        status, _, _ = LiveFeed(address, tls, timeout_s=120).get()
        print(json.dumps({"status": status.status, "message": status.message}))
        return 0
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=client_context(tls), timeout=120)
    conn.request("POST", "/api/v1/query", body=json.dumps({"sql": HONEST_SQL, "limit": ASKED}),
                 headers={"Content-Type": "application/json"})
    answer = json.loads(conn.getresponse().read())
    print(json.dumps({"status": "accepted", "message": f"{len(answer['rows']):,} rows taken"}))
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--rss"]:
        return _rss_wrapper(argv[2:])
    if argv[:1] == ["--child"]:
        return _child(*argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rows = 200_000 if args.quick else 1_000_000
    from test_api_helpers import AGENT_ADDRESSES, Pki, make_node_db
    from test_fleet_bounded import HostileNode

    from straggler.api.server import start_background
    results = {"quick": args.quick, "hostile_rows": rows, "asked_rows": ASKED,
               "machine": {"cpus": os.cpu_count()}, "conditions": {}}
    with tempfile.TemporaryDirectory(prefix="straggler-bench-hostile-") as tmp:
        certs = Pki(Path(tmp))
        honest = []
        for index, address in enumerate(AGENT_ADDRESSES[:2]):
            db = Path(tmp) / f"honest-{index}.db"
            make_node_db(db, f"gpu-node-{index + 1:02d}", index)
            honest.append(start_background(str(db), listen=f"{address}:0", tls=certs.server(address)))
        nodes = [f"{address}:{h.port}" for address, h in zip(AGENT_ADDRESSES, honest)]
        client = certs.client()
        try:
            def fleet(name, mode):
                if mode is None:
                    code, out, err, rss, seconds = _measured(_fleet_cli(nodes, certs))
                    outcome = "every node answered" if code == 0 else f"exit {code}"
                else:
                    with HostileNode(certs, mode, rows=rows) as hostile:
                        code, out, err, rss, seconds = _measured(_fleet_cli([nodes[0], hostile.address], certs))
                    found = re.search(r"did not answer: (.*)", out)
                    outcome = found.group(1).strip() if found else f"exit {code}: {err[-200:]}"
                results["conditions"][name] = {"peak_rss_mb": round(rss / MB, 1), "seconds": round(seconds, 2),
                                               "exit": code, "outcome": outcome}

            def child(name, kind, mode):
                if mode is None:
                    code, out, err, rss, seconds = _measured([sys.executable, __file__, "--child", kind, nodes[0],
                                                              client.ca, client.cert, client.key])
                else:
                    with HostileNode(certs, mode, rows=rows) as hostile:
                        code, out, err, rss, seconds = _measured([sys.executable, __file__, "--child", kind,
                                                                  hostile.address, client.ca, client.cert, client.key])
                answer = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"status": f"exit {code}",
                                                                                        "message": err[-200:]}
                results["conditions"][name] = {"peak_rss_mb": round(rss / MB, 1), "seconds": round(seconds, 2),
                                               "exit": code, "outcome": f"{answer['status']}: {answer['message']}"}

            fleet("honest", None)
            fleet("many rows", "many-rows")
            fleet("many rows, chunked", "many-rows-chunked")
            fleet("huge value", "huge-value")
            fleet("huge length", "huge-length")
            fleet("many fields", "many-fields")
            child("live, honest", "live", None)
            child("live, many rows", "live", "live-many-rows")
            child("read whole, honest", "unbounded", None)
            child("read whole, many rows", "unbounded", "many-rows")
        finally:
            for handle in honest:
                handle.stop()
    conditions = results["conditions"]
    for name, entry in conditions.items():
        base = conditions["live, honest" if name.startswith("live") else "read whole, honest"
                          if name.startswith("read whole") else "honest"]["peak_rss_mb"]
        entry["over_baseline_mb"] = round(entry["peak_rss_mb"] - base, 1)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "fleet_hostile.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"hostile node: {rows:,} rows where {ASKED:,} were asked")
    print(f"{'condition':<22} {'peak MB':>8} {'over base':>10} {'s':>6}  outcome")
    for name, entry in conditions.items():
        print(f"{name:<22} {entry['peak_rss_mb']:>8} {entry['over_baseline_mb']:>10} {entry['seconds']:>6}  "
              f"{entry['outcome'][:150]}")
    print(f"results: {out_dir / 'fleet_hostile.json'}")
    bounded = [entry for name, entry in conditions.items() if "honest" not in name
               and not name.startswith("read whole")]
    return 0 if all("oversized" in entry["outcome"] for entry in bounded) else 1


if __name__ == "__main__":
    sys.exit(main())
