"""The live watch on the synchronous-job harness (straggler_lab.demo.harness: a real 4-rank job on the
test bed, real agents serving their API with mutual TLS, one real fault on one rank):

- detection latency per cause class: fault onset -> `straggler watch` names the node (and was the
  cause right), and fault end -> recovered; targets: median <= 10 s, every run <= 20 s;
- false alarms: onsets over a clean run (--clean-s, default 600 s) and over a machine-wide load
  step on every node (load-all): target 0;
- cost: the summaries' own CPU (the agent measures it: status's summary_cpu_percent), the CPU of
  a /api/v1/live answer and of a /metrics rendering, and each agent's CPU (its own agent_cost
  rows) over the same clean job, measured twice in
  the same run — with the summaries only every --interval (5 s, as before the watch) and nobody
  polling, then with 1 s summaries, the watch polling /api/v1/live every second and /metrics
  scraped every second — and the difference.

Writes bench/results/watch.json. `--quick`: one run per class, a 60 s clean run, a 30 s cost phase.
Needs root and eBPF (a test bed of its own, id 247, torn down at the end).
"""
import argparse
import http.client
import json
import os
import statistics
import sqlite3
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from straggler import render  # noqa: E402
from straggler.analysis import watch  # noqa: E402
from straggler_lab.demo import harness as hz  # noqa: E402

TESTBED_ID = 247
CLASSES = {"cpu-hog": "cpu-contention", "host-compute": "host-compute", "gpu-slow": "gpu-slow", "io-self": "io-self"}


class Watcher:
    """straggler watch (the core's watch()) in a thread, collecting its events."""

    def __init__(self, nodes, tls):
        self.events, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=lambda: watch.watch(nodes, tls, on_event=self.events.append,
                                                                  stop=self.stop), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)

    def between(self, t0_ns, t1_ns, kind=None):
        return [e for e in self.events if t0_ns <= e["mono_ns"] <= t1_ns and (kind is None or e["event"] == kind)]


def detection(h, nodes, tls, faults, runs, log):
    rows = []
    for run in range(runs):
        for fault in faults:
            with Watcher(nodes, tls) as w:
                case = h.run_case(fault, rank=0, warmup_s=20.0, fault_s=25.0, cooldown_s=20.0)
            onsets = w.between(case.t_start_ns, case.t_end_ns, "onset")
            early = [e for e in onsets if e["mono_ns"] < case.t_fault_ns]
            mine = [e for e in onsets if e["mono_ns"] >= case.t_fault_ns and e["node"] == case.node]
            first = mine[0] if mine else None
            rec = [e for e in w.between(case.t_fault_end_ns, case.t_end_ns, "recovered") if e["node"] == case.node]
            row = dict(run=run, fault=fault, expected=CLASSES[fault], valid=case.valid, slowdown=round(case.slowdown, 2),
                       false_onsets_before=len(early),
                       early=[dict(node=e["node"], cause=e["cause"], at_s=round((e["mono_ns"] - case.t_start_ns) / 1e9, 1),
                                   summary=e.get("summary")) for e in early],
                       named=bool(first),
                       latency_s=round((first["mono_ns"] - case.t_fault_ns) / 1e9, 1) if first else None,
                       cause=first["cause"] if first else None, cause_ok=bool(first and first["cause"] == CLASSES[fault]),
                       step_moved_s=first.get("step_moved_s") if first else None,
                       recovered_after_s=round((rec[0]["mono_ns"] - case.t_fault_end_ns) / 1e9, 1) if rec else None,
                       other_onsets=[(e["node"], e["cause"]) for e in onsets if e not in mine and e not in early],
                       events=[dict(event=e["event"], node=e.get("node"), cause=e.get("cause"),
                                    at_s=round((e["mono_ns"] - case.t_fault_ns) / 1e9, 1), summary=e.get("summary"))
                               for e in w.between(case.t_start_ns, case.t_end_ns) if e["event"] != "start"])
            rows.append(row)
            log(f"run {run} {fault:13s} x{case.slowdown:.2f} valid={case.valid} named={row['named']} "
                f"after={row['latency_s']} s cause={row['cause']} recovered_after={row['recovered_after_s']} s "
                f"false_before={len(early)} others={row['other_onsets']}")
    return rows


def false_alarms(h, nodes, tls, fault, seconds, log):
    with Watcher(nodes, tls) as w:
        case = h.run_case(fault, rank=0, warmup_s=15.0, fault_s=seconds)
    onsets = w.between(case.t_start_ns, case.t_end_ns, "onset")
    log(f"{fault}: {seconds:g} s, x{case.slowdown:.2f}, onsets {len(onsets)}: {[(e['node'], e['cause']) for e in onsets]}")
    return dict(fault=fault, seconds=seconds, slowdown=round(case.slowdown, 2),
                onsets=[dict(node=e["node"], cause=e["cause"], at_s=round((e["mono_ns"] - case.t_start_ns) / 1e9, 1),
                             wait_pct=e.get("wait_pct"), others_wait_pct=e.get("others_wait_pct"),
                             step_moved_s=e.get("step_moved_s"), summary=e.get("summary")) for e in onsets])


def agent_cpu(h, t0_ns, t1_ns):
    """{host: agent CPU percent of one core} from each agent's agent_cost rows within [t0, t1]."""
    out = {}
    for host, db in h.agent_dbs.items():
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            cpu, span = conn.execute("SELECT SUM(cpu_seconds), SUM(interval_ns) FROM agent_cost WHERE ts >= ? AND "
                                     "ts + interval_ns <= ?", (t0_ns, t1_ns)).fetchone()
        finally:
            conn.close()
        out[host] = round(100.0 * cpu / (span / 1e9), 3) if span else None
    return out


def scrape_metrics(nodes, tls, stop):
    from straggler.tls import client_context
    context = client_context(tls)
    while not stop.is_set():
        for node in nodes:
            host, port = node.rsplit(":", 1)
            try:
                conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=5)
                conn.request("GET", "/metrics")
                conn.getresponse().read()
                conn.close()
            except OSError:
                pass
        stop.wait(1.0)


def cost(bed, out, seconds, log):
    results = {}
    for label, summary_s, live in (("summaries every 5 s, nobody polling", 5, False),
                                   ("1 s summaries + watch polling + /metrics scraped every second", 1, True)):
        h = hz.SyncJobHarness(bed, out / f"cost-{summary_s}", style="blocking")
        try:
            per_host, nodes, tls = h.api_args()
            h.start_agents(extra_args=["--interval", "5", "--summary-interval", str(summary_s)], per_host_args=per_host)
            stop = threading.Event()
            threads = []
            if live:
                threads.append(threading.Thread(target=lambda: watch.watch(nodes, tls, stop=stop), daemon=True))
                threads.append(threading.Thread(target=scrape_metrics, args=(nodes, tls, stop), daemon=True))
            for t in threads:
                t.start()
            try:
                case = h.run_case("none", rank=0, warmup_s=5.0, fault_s=seconds)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=30)
            per_agent = agent_cpu(h, case.t_fault_ns, case.t_fault_end_ns)
        finally:
            h.close()
        from straggler.store.status import collect_status
        summaries = {host: collect_status(db).get("summary_cpu_percent") for host, db in h.agent_dbs.items()}
        values = [v for v in per_agent.values() if v is not None]
        results[label] = dict(per_agent_cpu_pct=per_agent, mean_cpu_pct=round(statistics.mean(values), 3) if values else None,
                              summary_cpu_pct=summaries)
        log(f"cost: {label}: {per_agent}")
    a, b = (results[k]["mean_cpu_pct"] for k in results)
    results["added_cpu_pct_of_a_core"] = round(b - a, 3) if a is not None and b is not None else None
    # the readers' part, measured directly on a real agent's store: CPU per /api/v1/live answer and
    # per /metrics rendering (one of each per second per watcher / scraper)
    from straggler.api import metrics
    from straggler.store.live import live_summary
    db = sorted(h.agent_dbs.values())[0]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    (newest,) = conn.execute("SELECT MAX(ts) FROM thread_time").fetchone()
    # as the watch asks: the summaries since its last, the collective calls after the newest it holds
    (held,) = conn.execute("SELECT MAX(seq) FROM events WHERE source = 'nccl' AND ts < ?",
                           (newest - 1_000_000_000,)).fetchone()
    conn.close()
    for name, fn in (("live_answer_ms_cpu", lambda: live_summary(db, newest - 2_000_000_000, after_seq=held)),
                     ("metrics_render_ms_cpu", lambda: metrics.render(db, "n", at_ns=newest))):
        t0 = time.process_time()
        for _ in range(50):
            fn()
        results[name] = round((time.process_time() - t0) / 50 * 1000, 3)
    log(f"cost: per second: a /live answer {results['live_answer_ms_cpu']} ms CPU, a /metrics rendering "
        f"{results['metrics_render_ms_cpu']} ms CPU")
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.bench_watch", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run per class, a 60 s clean run, a 30 s cost phase")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--faults", default=",".join(CLASSES))
    ap.add_argument("--clean-s", type=float, default=600.0)
    ap.add_argument("--cost-s", type=float, default=60.0)
    ap.add_argument("--skip", default="", help="parts to skip: detection,clean,load,cost")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_watch: needs root (test bed, eBPF): skipped", file=sys.stderr)
        return 0
    runs = 1 if args.quick else args.runs
    clean_s = 60.0 if args.quick else args.clean_s
    cost_s = 30.0 if args.quick else args.cost_s
    skip = set(filter(None, args.skip.split(",")))
    faults = [f for f in args.faults.split(",") if f]
    from straggler_lab import testbed
    lock = testbed.TestbedLock(TESTBED_ID)
    if not lock.try_acquire():
        print(f"bench_watch: test bed {TESTBED_ID} is in use (pid {lock.holder()})", file=sys.stderr)
        return 1
    out = Path(f"/tmp/straggler-bench-watch-{os.getpid()}")
    started = time.monotonic()
    results = dict(quick=args.quick, runs=runs, machine=dict(cpus=os.cpu_count()),
                   defaults=dict(interval_s=watch.DEFAULT_INTERVAL_S, window_s=watch.DEFAULT_WINDOW_S,
                                 baseline_s=watch.DEFAULT_BASELINE_S, confirm=watch.CONFIRM_TICKS, clear=watch.CLEAR_TICKS,
                                 hold=watch.HOLD_TICKS))

    def log(text):
        print(text, flush=True)

    bed = None
    try:
        bed = testbed.up(hosts=4, dead=0, testbed_id=TESTBED_ID, _lock_held=True)
        if skip != {"detection", "clean", "load"}:
            h = hz.SyncJobHarness(bed, out / "watch", style="blocking")
            try:
                per_host, nodes, tls = h.api_args()
                h.start_agents(per_host_args=per_host)
                if "detection" not in skip:
                    results["detection"] = detection(h, nodes, tls, faults, runs, log)
                if "clean" not in skip:
                    results["clean"] = false_alarms(h, nodes, tls, "none", clean_s, log)
                if "load" not in skip:
                    results["load_all"] = false_alarms(h, nodes, tls, "load-all", 30.0, log)
            finally:
                h.close()
        if "cost" not in skip:
            results["cost"] = cost(bed, out, cost_s, log)
    finally:
        if bed is not None:
            testbed.down(bed.id, bed.state_dir, _lock_held=True)
        lock.release()
    results["seconds"] = round(time.monotonic() - started, 1)
    table = []
    for fault in faults:
        mine = [r for r in results.get("detection", []) if r["fault"] == fault and r["valid"]]
        lat = [r["latency_s"] for r in mine if r["latency_s"] is not None]
        table.append((fault, CLASSES[fault], f"{len(mine)}", f"{sum(r['named'] for r in mine)}/{len(mine)}",
                      f"{sum(r['cause_ok'] for r in mine)}/{len(mine)}",
                      f"{statistics.median(lat):.1f}" if lat else "-", f"{max(lat):.1f}" if lat else "-",
                      ",".join(str(r["recovered_after_s"]) for r in mine)))
    results["summary"] = [dict(zip(("fault", "class", "valid", "named", "cause_right", "median_s", "max_s",
                                    "recovered_after_s"), row)) for row in table]
    res_dir = REPO / "bench" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "watch.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    if table:
        print(render.table_text(["fault", "class", "valid", "named", "cause right", "median s", "max s", "recovered after s"],
                                table, title="watch: fault onset -> straggler named (valid runs)"))
    for key in ("clean", "load_all"):
        if key in results:
            print(f"false alarms, {key}: {len(results[key]['onsets'])} over {results[key]['seconds']:g} s")
    if "cost" in results:
        print(f"agent CPU added by the live summaries and their readers: {results['cost']['added_cpu_pct_of_a_core']}% "
              f"of a core")
    print(f"results: {res_dir / 'watch.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
