"""Acceptance: the field case end to end, as `make demo` runs it, on the shared test bed.

One real four-rank gloo job across gpu-node-01..04 (traced by agents that trace.yml deployed
over SSH, eBPF, mutual TLS), in three phases that share the test bed and the job:
1. the clean warm-up, no checkpoint writer: explain over the fleet names no straggler;
2. the checkpoint writer on gpu-node-01: fleet_query.yml returns the four nodes with ranks 0-3,
   explain names gpu-node-01 with CPU preemption by the writer (plus its block I/O) as the top
   cause and no healthy node, collect.yml gives a cluster.db with four nodes and a trace.pftrace
   (Perfetto's native format, read back with its protos) with four processes in rank order, one
   slice per traced call and explain's findings on the nodes they are about;
3. one host dead: the playbooks and explain address gpu-node-01..03 plus the dead host: three
   nodes' results, the dead host reported, nothing crashes.
Budget: about 5 minutes on an idle machine of this kind (the scenario is shorter than the demo).
The assertions are what a user would read in the demo's output; none is about timing.
"""
import json
import sqlite3
import subprocess
import sys
import time

import pytest

from pftrace_replay import Replay  # tests/pftrace_replay.py
from straggler_lab import procs
from straggler_lab.demo.run import FIELD_SQL, RANKS_SQL, STRAGGLER_NODE, Demo, Progress

pytestmark = pytest.mark.bpf

WARMUP_S = 16.0      # clean steps traced before the writer starts (explain: the first quarter is the baseline)
STRAGGLE_S = 30.0    # steps with the writer, then the job stops and the queries run
PHASE_MIN_STEPS = 50  # and at least this many steps in each phase: a busy machine makes fewer per second


def run_phase(demo, seconds):
    """Let the job run for `seconds` and for at least PHASE_MIN_STEPS more steps on every rank
    (bounded: Demo.wait_for_steps fails with the ranks' logs when they do not come)."""
    start = min(demo.step_counts().values())
    time.sleep(seconds)
    demo.wait_for_steps(min_steps=start + PHASE_MIN_STEPS, timeout_s=180)


@pytest.fixture(scope="module")
def field_case(testbed, tmp_path_factory):
    """Run the scenario once; yield what each phase produced (the tests below only read it)."""
    out = tmp_path_factory.mktemp("acceptance")  # under /tmp: the hosts see it too
    progress = Progress(stream=sys.stderr, log_path=out / "acceptance.log")
    live = sorted(testbed.hosts)
    assert live[0] == STRAGGLER_NODE and len(live) == 4
    dead = sorted(testbed.dead)[0]
    demo = Demo(testbed, out, progress, hosts=live)
    seen = {"out": out, "live": live, "dead": dead, "dead_address": testbed.dead[dead]}
    try:
        progress.step("trace.yml on the four live hosts")
        demo.deploy_agents()
        progress.step("the job, clean warm-up")
        demo.start_job(seconds=WARMUP_S + STRAGGLE_S + 150, with_writer=True, writer_seconds=STRAGGLE_S + 120)
        demo.wait_for_steps(min_steps=20)
        run_phase(demo, WARMUP_S)
        progress.step("explain, no writer yet")
        seen["clean_text"], seen["clean"] = demo.explain(name="explain-clean")
        progress.step("checkpoint writer on gpu-node-01")
        demo.start_writer()
        run_phase(demo, STRAGGLE_S)
        demo.stop_job()
        seen["steps"] = demo.step_stats()
        progress.step("fleet_query.yml")
        seen["field_query"] = demo.fleet_query(FIELD_SQL)
        seen["ranks_query"] = demo.fleet_query(RANKS_SQL, name="fleet-ranks")
        progress.step("explain with the writer")
        seen["straggler_text"], seen["straggler"] = demo.explain()
        progress.step("one host dead")  # right after: the same trace, three live hosts and the dead one
        partial = live[:3] + [dead]
        seen["dead_query"] = demo.fleet_query(FIELD_SQL, limit=partial, name="fleet-dead", ok_codes=(0, 2, 4))
        seen["dead_text"], seen["dead_explain"] = demo.explain(nodes=partial, name="explain-dead")
        progress.step("collect.yml")
        seen["collect"] = demo.collect()
        yield seen
    finally:
        demo.stop_job()
        try:  # leave the shared test bed's hosts as we found them for the tests after us: agents stopped,
            # their files gone (directly: trace.yml straggler_agent_state=absent is tested by test_playbooks, and costs 40 s)
            stopping = [testbed.popen(name, ["sh", "-c", "[ -x /opt/straggler/bin/straggler-agentctl ] && "
                                                          "/usr/bin/python3 /opt/straggler/bin/straggler-agentctl stop; "
                                                          "rm -rf /opt/straggler/* /etc/straggler/* /var/lib/straggler/* "
                                                          "/var/log/straggler/* /run/straggler/*"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        for name in live]     # the four hosts at once
            procs.end(stopping, sig=None, wait_s=90)
        finally:
            progress.close()


def test_without_the_writer_no_straggler_is_named(field_case):
    report = field_case["clean"]
    assert report["straggler"] is None, field_case["clean_text"].output
    causes = [f["cause"] for f in report["findings"]]
    assert "straggler" not in causes and "cpu-contention" not in causes, field_case["clean_text"].output


def test_the_straggler_is_gpu_node_01(field_case):
    report = field_case["straggler"]
    assert report["straggler"] == STRAGGLER_NODE, field_case["straggler_text"].output


def test_the_top_cause_is_cpu_contention_by_the_checkpoint_writer_named_as_a_writer(field_case):
    report = field_case["straggler"]
    text = field_case["straggler_text"].output
    causes = [f for f in report["findings"] if f["node"] == STRAGGLER_NODE and f["cause"] != "straggler"]
    assert causes, text
    top = max(causes, key=lambda f: f.get("share") or 0)
    assert top["cause"] == "cpu-contention", text
    # who held the CPU is named by its process, the writer first and called a writer (it issued block
    # I/O); never the trainer's own threads, nor another rank's trainer (outside this agent's namespace)
    who = top["summary"].split("who held it", 1)[1].split(":", 1)[1]
    assert who.strip().startswith("ckpt-writer (pid"), text
    assert "a writer:" in who.split(";")[0], text
    for part in who.split(";"):     # another rank's trainer threads may run on this shared machine: never with a pid
        if "gloo" in part or "pt_main_thread" in part:
            assert "outside this agent's scope" in part and "(pid" not in part, text


def test_healthy_nodes_are_not_named(field_case):
    report = field_case["straggler"]
    named = {f["node"] for f in report["findings"]
             if f["cause"] not in ("waiters", "missing-nodes", "data-loss", "no-straggler", "device-wide")}
    assert named == {STRAGGLER_NODE}, field_case["straggler_text"].output


def test_every_rank_slowed_down_while_the_writer_ran(field_case):
    stats = field_case["steps"]
    assert [r[0] for r in stats.rows] == [0, 1, 2, 3]
    # a synchronous job: the ranks' step times move together (the step log is not timing-asserted further)
    ratios = [r[4] for r in stats.rows]
    assert max(ratios) - min(ratios) < 0.2, stats.rows


def test_the_fleet_query_returns_four_nodes_with_ranks_0_to_3(field_case):
    _, field = field_case["field_query"]
    nodes = {row[field["columns"].index("node")] for row in field["rows"]}
    assert nodes == set(field_case["live"])
    sources = {row[field["columns"].index("source")] for row in field["rows"]}
    assert {"driver", "sched"} <= sources
    _, ranks = field_case["ranks_query"]
    by_node = {row[ranks["columns"].index("node")]: str(row[ranks["columns"].index("ranks")]) for row in ranks["rows"]}
    assert by_node == {name: str(i) for i, name in enumerate(field_case["live"])}


def test_collect_gives_a_cluster_db_with_four_nodes_and_a_trace_with_four_processes(field_case):
    out = field_case["out"]
    with sqlite3.connect(f"file:{out / 'cluster.db'}?mode=ro", uri=True) as db:
        nodes = {n for (n,) in db.execute("SELECT DISTINCT node FROM events")}
        calls = db.execute("SELECT COUNT(*) FROM events WHERE source IN ('cuda', 'driver', 'nccl')").fetchone()[0]
    assert nodes == set(field_case["live"])
    trace = Replay(str(out / "trace.pftrace"))
    assert [d.process.process_name for d in trace.processes()] == [f"{n} (rank {i})" for i, n in enumerate(field_case["live"])]
    assert trace.unclosed == 0 and not trace.backwards and not trace.misnested
    assert sum(1 for s in trace.slices if s["cat"] and s["cat"][0] in ("cuda", "driver", "nccl")) == calls > 0
    report = json.loads((out / "explain.json").read_text())
    about = [i for i in trace.instants if "node" in i["args"]]
    assert all(trace.node_of(i["track"]) == i["args"]["node"] for i in about)
    named = [i["args"]["node"] for i in about if i["args"]["cause"] == "straggler"]
    assert sorted(named) == sorted(report["stragglers"]), report["stragglers"]


def test_with_one_host_dead_three_nodes_answer_and_the_dead_host_is_reported(field_case):
    dead = field_case["dead"]
    result, table = field_case["dead_query"]
    nodes = {row[table["columns"].index("node")] for row in table["rows"]}
    assert nodes == set(field_case["live"][:3]), result.output
    assert dead in table["missing"], result.output
    report = field_case["dead_explain"]
    text = field_case["dead_text"].output
    assert any(field_case["dead_address"] in json.dumps(m) or dead in json.dumps(m) for m in report["missing"]), text
    assert {n["node"] for n in report["nodes"]} == set(field_case["live"][:3]), text
