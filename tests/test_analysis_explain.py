"""explain: names the straggler node and the cause on synthetic four-node databases, with numbers
that match their own SQL and independent SQL; a clean run has no straggler; missing nodes are said.

The databases come from straggler.analysis.synth (per-node stores as the agent writes them,
merged with the real merge). Sizes are small: the whole file runs in a few seconds of CPU.
"""
import json
import sqlite3
import xml.etree.ElementTree as ET

import pytest

from straggler import cli
from straggler.analysis import explain, synth

EVENTS = 16_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """scenario name -> (cluster.db path, truth)."""
    base = tmp_path_factory.mktemp("explain")
    out = {}
    for name, spec in {
        "io_cpu": synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=2),
        "cpu_hog": synth.SynthSpec(scenario="cpu_hog", events=EVENTS, straggler=1),
        "clean": synth.SynthSpec(scenario="clean", events=EVENTS),
        "missing_other": synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=2, missing=(3,)),
        "missing_straggler": synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=2, missing=(2,)),
    }.items():
        path = str(base / f"{name}.db")
        out[name] = (path, synth.write_cluster(path, spec))
    return out


def _by_cause(report, cause):
    return [f for f in report.findings if f.cause == cause]


def _rows(db, sql):
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()


def test_io_cpu_case_names_the_node_and_cpu_preemption_by_the_writer_with_block_io(cluster):
    db, truth = cluster["io_cpu"]
    report = explain.explain_db(db)
    assert report.straggler == truth["straggler"] == "gpu-node-03"
    top = report.findings[0]
    assert top.cause == "straggler" and top.node == "gpu-node-03" and top.severity == "critical"
    assert "cuLaunchKernel mean" in top.summary and "median of the others" in top.summary
    assert "run queue" in top.summary
    cpu = _by_cause(report, "cpu-contention")
    assert cpu, report.to_text()
    main_cause = max(cpu, key=lambda f: f.share)
    assert main_cause.node == "gpu-node-03"
    assert "ckpt-writer" in main_cause.summary and "pid 5151" in main_cause.summary
    assert main_cause.share > 0.5
    assert main_cause.numbers["io_bytes"] > 0 and "block I/O" in main_cause.summary
    # sched_switch names the writer's threads one by one: one finding for the process, its threads listed
    assert len([f for f in cpu if "ckpt-writer" in f.summary]) == 1
    assert "threads 5152, 5153, 5154" in main_cause.summary
    assert main_cause.numbers["io_bytes_trace"] >= main_cause.numbers["io_bytes"]
    assert "no such I/O on the other nodes" in main_cause.summary
    assert "ionice" in main_cause.recommendation or "taskset" in main_cause.recommendation
    # the other ranks are told apart as waiters, not causes
    waiters = _by_cause(report, "waiters")
    assert waiters and "gpu-node-01" in waiters[0].summary
    assert not any(f.cause in ("straggler", "cpu-contention") and f.node != "gpu-node-03" for f in report.findings)


def test_every_number_with_a_source_equals_its_own_sql_rerun(cluster):
    db, _ = cluster["io_cpu"]
    report = explain.explain_db(db)
    checked = 0
    for finding in report.findings:
        for name, src in finding.sources.items():
            rows = _rows(db, finding.sql[src["sql"]])
            hits = [r for r in rows if all(r.get(k) == v for k, v in src["match"].items())]
            assert hits, (name, src)
            value = sum(r[src["column"]] for r in hits) if src.get("sum") else hits[0][src["column"]]
            assert value == pytest.approx(finding.numbers[name]), (finding.cause, name)
            checked += 1
    assert checked >= 10


def test_straggler_numbers_match_independent_direct_sql(cluster):
    db, truth = cluster["io_cpu"]
    report = explain.explain_db(db)
    top = report.findings[0]
    node = truth["straggler"]
    # every call is counted in aggregates (events hold only slow, off-CPU and sampled calls, as the agent's)
    mean = _rows(db, "SELECT 1.0 * SUM(sum_ns) / SUM(count) AS m FROM aggregates "
                     f"WHERE node = '{node}' AND op = 'cuLaunchKernel'")[0]["m"]
    assert top.numbers["cuLaunchKernel_mean_ns"] == pytest.approx(mean, rel=1e-6)
    others = sorted(r["m"] for r in _rows(db, "SELECT node, 1.0 * SUM(sum_ns) / SUM(count) AS m FROM aggregates "
                                              f"WHERE op = 'cuLaunchKernel' AND node != '{node}' GROUP BY node"))
    assert top.numbers["cuLaunchKernel_others_median_mean_ns"] == pytest.approx(others[1], rel=1e-6)
    # run-queue share: summed over all trainer threads, recent part of the trace, computed here in Python
    sched = _rows(db, f"SELECT ts, duration, op FROM events WHERE node = '{node}' AND source = 'sched' AND pid = 4242")
    t0 = min(r["ts"] for r in sched)
    t1 = max(r["ts"] + r["duration"] for r in sched)
    tb = t0 + int((t1 - t0) * 0.25)
    recent = sum(r["duration"] for r in sched if r["op"] == "runq" and r["ts"] >= tb)
    assert top.numbers["runq_recent_pct"] == pytest.approx(100.0 * recent / (t1 - tb), abs=0.051)
    # preempted-by-writer time inside the slow calls: interval overlap computed here, from raw rows
    cause = max(_by_cause(report, "cpu-contention"), key=lambda f: f.share)
    slow = _rows(db, cause.sql["slow_calls"])
    assert sum(r["slow_calls"] for r in slow) > 0
    calls = _rows(db, f"SELECT tid, ts, duration, op FROM events WHERE node = '{node}' AND op IN ('cuLaunchKernel', 'cuMemAlloc')")
    offs = _rows(db, f"SELECT tid, ts, duration FROM events WHERE node = '{node}' AND op = 'offcpu' "
                     f"AND state = 'preempted' AND other_comm = 'ckpt-writer'")
    by_tid = {}
    for o in offs:
        by_tid.setdefault(o["tid"], []).append((o["ts"], o["ts"] + o["duration"]))
    thresholds = {}
    for op in ("cuLaunchKernel", "cuMemAlloc"):   # the same rule explain states: above the others' p99 (and 1.5× p50)
        marker = f"op = '{op}' AND duration > "
        sql = cause.sql["slow_calls"]
        thresholds[op] = int(sql[sql.index(marker) + len(marker):].split(")")[0])
    overlap = 0
    for c in calls:
        if c["duration"] <= thresholds[c["op"]]:
            continue
        a, b = c["ts"], c["ts"] + c["duration"]
        overlap += sum(max(0, min(b, e) - max(a, s)) for s, e in by_tid.get(c["tid"], ()))
    assert cause.numbers["preempted_by_process_ns"] == overlap


def test_cpu_hog_case_is_cpu_contention_by_that_process_not_io(cluster):
    db, truth = cluster["cpu_hog"]
    report = explain.explain_db(db)
    assert report.straggler == truth["straggler"] == "gpu-node-02"
    cpu = max(_by_cause(report, "cpu-contention"), key=lambda f: f.share)
    assert "cpu-hog" in cpu.summary and cpu.node == "gpu-node-02"
    assert "block I/O" not in cpu.summary and "io_bytes" not in cpu.numbers
    assert "ionice" not in cpu.recommendation
    assert not [f for f in report.findings if f.cause in ("io-wait", "block-io")]


def test_clean_run_yields_no_straggler_finding(cluster):
    db, _ = cluster["clean"]
    report = explain.explain_db(db)
    assert report.straggler is None
    assert not [f for f in report.findings if f.severity in ("critical", "warning")], report.to_text()
    assert _by_cause(report, "no-straggler")
    assert "straggler: none found" in report.to_text()


def test_a_missing_node_is_stated_with_what_it_leaves_uncertain(cluster):
    db, truth = cluster["missing_other"]
    report = explain.explain_db(db)
    assert report.straggler == "gpu-node-03"
    missing = _by_cause(report, "missing-nodes")
    assert missing and "rank 3" in missing[0].summary and "could be slower" in missing[0].summary
    assert report.missing and report.missing[0]["status"] == "no-data"


def test_when_the_straggler_itself_is_missing_the_waiters_point_at_it(cluster):
    db, truth = cluster["missing_straggler"]
    report = explain.explain_db(db)
    assert report.straggler is None
    waiters = _by_cause(report, "waiters")
    assert waiters and "probably one of the missing nodes" in waiters[0].summary and "rank 2" in waiters[0].summary


def test_cli_json_markdown_junit_and_fail_on_straggler(cluster, tmp_path, capsys):
    db, _ = cluster["io_cpu"]
    md, xml = tmp_path / "r.md", tmp_path / "r.xml"
    code = cli.main(["explain", "-d", db, "--json", "--fail-on-straggler", "--markdown", str(md), "--junit", str(xml)])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["straggler"] == "gpu-node-03"
    assert out["findings"][0]["sql"]["call_latency"].lstrip().startswith("WITH")
    assert "gpu-node-03" in md.read_text() and "```sql" in md.read_text()
    suite = ET.parse(xml).getroot()
    failed = [tc.get("name") for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert failed == ["gpu-node-03 is not the straggler"]
    clean_db, _ = cluster["clean"]
    assert cli.main(["explain", "-d", clean_db, "--fail-on-straggler", "--no-sql"]) == 0
    assert "no straggler" in capsys.readouterr().out
    assert cli.main(["explain", "-d", str(tmp_path / "nope.db")]) == 2
    assert "no such database" in capsys.readouterr().err


def test_without_aggregates_the_distribution_comes_from_the_events(cluster, tmp_path):
    import shutil
    db = str(tmp_path / "noagg.db")
    shutil.copy(cluster["cpu_hog"][0], db)
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM aggregates")
    conn.commit()
    conn.close()
    report = explain.explain_db(db)
    assert report.straggler == "gpu-node-02"
    assert "ROW_NUMBER()" in report.findings[0].sql["call_latency"]


def test_k_is_tunable_a_huge_k_finds_no_latency_outlier(cluster):
    db, _ = cluster["io_cpu"]
    report = explain.explain_db(db, k=1e9, min_ratio=1e9)
    assert report.straggler is None


def test_fleet_mode_runs_the_same_sql_on_every_node_and_states_the_unreachable(tmp_path):
    """explain_fleet with a fleet_query stand-in that runs each SQL on per-node stores (the real
    client is another part's); one node does not answer."""
    from types import SimpleNamespace
    from straggler.store.query import run_query
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="io_cpu", events=EVENTS, nodes=5, straggler=1))
    stores = {f["node"]: f["path"] for f in facts["files"]}
    seen_sql = []

    def fake_fleet_query(nodes, sql, tls, limit=10000, timeout_s=5.0, deadline_s=15.0, **kw):
        seen_sql.append(sql)
        columns, rows, statuses = None, [], []
        for address in nodes:
            name = address.split(":")[0]
            if name == "gpu-node-05":
                statuses.append(SimpleNamespace(address=address, node=None, status="unreachable",
                                                message="connection timed out"))
                continue
            res = run_query(stores[name], sql, limit=limit, timeout_s=timeout_s)
            columns = ["node"] + res.columns      # the client's own node column first
            rows += [[name] + r for r in res.rows]
            statuses.append(SimpleNamespace(address=address, node=name, status="ok" if res.rows else "empty", message=""))
        return SimpleNamespace(columns=columns or [], rows=rows, nodes=statuses, offsets={})

    report = explain.explain_fleet([f"gpu-node-0{i}:7433" for i in range(1, 6)], tls=None,
                                   fleet_query=fake_fleet_query)
    assert report.straggler == "gpu-node-02"
    assert any("ckpt-writer" in f.summary for f in _by_cause(report, "cpu-contention"))
    missing = _by_cause(report, "missing-nodes")
    assert missing and "gpu-node-05:7433 (unreachable)" in missing[0].summary
    assert all("GROUP BY" in sql and "node" in sql for sql in seen_sql)


def test_fleet_mode_through_the_real_client_and_agents_api(tmp_path):
    """Four real `straggler serve` servers (plain HTTP on loopback, in this process), a fifth address
    with nothing listening: explain_fleet names the straggler and says which node did not answer."""
    import socket
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="io_cpu", events=EVENTS, straggler=3))
    tls = TLSOptions(no_tls=True)
    handles = [start_background(f["path"], node=f["node"], listen="127.0.0.1:0", tls=tls) for f in facts["files"]]
    with socket.socket() as s:                     # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    try:
        nodes = [f"127.0.0.1:{h.port}" for h in handles] + [f"127.0.0.1:{dead}"]
        report = explain.explain_fleet(nodes, tls)
    finally:
        for h in handles:
            h.stop()
    assert report.straggler == "gpu-node-04", report.to_text()
    assert any("ckpt-writer" in f.summary for f in _by_cause(report, "cpu-contention"))
    missing = _by_cause(report, "missing-nodes")
    assert missing and f"127.0.0.1:{dead}" in missing[0].summary
