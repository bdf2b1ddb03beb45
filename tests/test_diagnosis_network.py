"""Whose link: diagnosis of a slow link on real jobs. The synchronous job of tests/test_diagnosis.py (its
allreduce a real exchange over TCP through rank 0, the stand-in NCCL's hub), one agent per test-bed host
(real eBPF: the TCP tracepoints of bpf/net.c; each host's interfaces from a STAND-IN sysfs tree, as a veth
cannot train down), and a real fault: a host's link throttled both ways with a `tbf` qdisc on its veth,
mid-job (for net-link, its stand-in eth0 says at the same time that it trained down to a tenth). Each case checks itself first
(the throttle slowed the whole job, or it is skipped with the reason).

What a user would notice: every rank waits alike in its collectives behind a slow link, so the calls
cannot say whose it is — its connections' round trips can. The node whose link is slow is named, with
its link, the peer it is slow to and a network cause (never a GPU's or a CPU's); every link slow alike
names nobody (a condition of the fabric) and says so: that case is a row of bench/bench_diagnosis.py
(net-slow-all, both collective styles), its rules in tests/test_network_rules.py.
"""
import json
import subprocess

import pytest

from straggler.analysis import explain
from straggler.render.report import to_text
from straggler_lab import procs
from straggler_lab.demo import harness as hz

pytestmark = pytest.mark.bpf

WARMUP_S = 7.0
FAULT_S = 10.0
WATCH_WARMUP_S = 20.0          # the watch judges a rank once it has run its window and settled: clean time first
WATCH_FAULT_S = 16.0


@pytest.fixture(scope="module")
def harness(testbed, tmp_path_factory):
    out = tmp_path_factory.mktemp("diagnosis-network")
    h = hz.SyncJobHarness(testbed, out, style="blocking", standin_links=True)
    try:
        per_host, h.api_nodes, h.api_client = h.api_args()     # the agents serve their API too (the watch)
        h.start_agents(extra_args=h.standin_lib_args(), per_host_args=per_host)
        yield h
    finally:
        h.close()
    assert h.leftovers() == []
    assert h.throttled == [], "every qdisc the cases put on a link is gone"


def run_valid(harness, fault, rank, tmp_path, warmup_s=WARMUP_S, fault_s=FAULT_S):
    case = harness.run_case(fault, rank=rank, warmup_s=warmup_s, fault_s=fault_s)
    if not case.valid:
        pytest.skip(f"invalid case ({fault}): {case.reason}")
    report = hz.diagnose(case, tmp_path)
    return case, report, to_text(report, show_sql=False, width=160) + f"\ncase: {case.reason}"


def test_a_throttled_link_names_its_node_its_link_and_the_peer_it_is_slow_to_live_and_after(harness, tmp_path):
    """`straggler watch --json` beside the job names it while it runs (the agents' /live carries their
    links); explain over the merged stores afterwards names it with its evidence."""
    client = harness.api_client
    watch_log = tmp_path / "watch.jsonl"
    with open(watch_log, "w") as log:
        proc = subprocess.Popen([harness.straggler_bin, "watch", "--json", "--nodes", ",".join(harness.api_nodes),
                                 "--timeout", "300", "--ca", client.ca, "--cert", client.cert, "--key", client.key],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        case, report, text = run_valid(harness, "net-slow", 2, tmp_path, warmup_s=WATCH_WARMUP_S,
                                       fault_s=WATCH_FAULT_S)
    finally:
        procs.end(proc, wait_s=30)
    events = [json.loads(line) for line in watch_log.read_text().splitlines() if line.startswith("{")]
    onsets = [e for e in events if e["event"] == "onset"]
    said = watch_log.read_text() + "\nexplain afterwards:\n" + text
    assert onsets and onsets[0]["mono_ns"] > case.t_fault_ns, said
    assert (onsets[0]["node"], onsets[0]["cause"]) == ("gpu-node-03", "net-congestion"), said
    assert case.node == "gpu-node-03"
    node_ok, cause_ok = hz.score(case, report)
    assert node_ok and cause_ok, text
    assert {f.node for f in report.findings if f.cause in explain.CAUSE_CLASSES} == {"gpu-node-03"}, text
    (cause,) = [f for f in report.findings if f.cause == "net-congestion"]
    assert cause.numbers["link"] == "eth0" and cause.numbers["peers"] == "gpu-node-01", text
    assert "round trips of" in cause.summary and "to gpu-node-01" in cause.summary, text
    assert "drain" not in cause.recommendation and "GPU" not in cause.summary, text
    assert "net_flows" in cause.sql, "the SQL behind its numbers is given"
    (episode,) = [e for e in report.episodes if e["node"] == "gpu-node-03"]
    assert episode["slowdown"] >= 1.3, text


def test_a_link_that_trained_down_is_net_link_with_its_speed(harness, tmp_path):
    case, report, text = run_valid(harness, "net-link", 3, tmp_path)
    assert case.node == "gpu-node-04"
    node_ok, cause_ok = hz.score(case, report)
    assert node_ok and cause_ok, text
    (cause,) = [f for f in report.findings if f.cause == "net-link"]
    assert cause.node == "gpu-node-04" and cause.numbers["speed_mbps"] == hz.LINK_DOWN_MBPS, text
    assert f"at {hz.LINK_DOWN_MBPS} Mb/s vs {hz.LINK_MBPS} on the other nodes" in cause.summary, text
    assert "cable" in cause.recommendation, text


def test_a_link_slow_from_the_jobs_first_step_is_named_slow_all_along(harness, tmp_path):
    """Tracing a job already slow: gpu-node-02's link throttled before the job's first step and to its last.
    The trace has no clean time to measure the job against: the link is judged against the other nodes'
    links at the same time, named slow all along, its cost not measured. (The case is valid when the job
    ran slower than the same job's clean steps in this module's earlier cases.)"""
    case = harness.run_case("net-slow", rank=1, fault_s=FAULT_S + 8.0, from_start=True)
    if not case.valid:
        pytest.skip(f"invalid case (net-slow from the first step): {case.reason}")
    report = hz.diagnose(case, tmp_path)
    text = to_text(report, show_sql=False, width=160) + f"\ncase: {case.reason}"
    assert report.stragglers == ["gpu-node-02"], text
    (episode,) = report.episodes
    assert episode["all_along"] and episode["slowdown"] is None and episode["lost_s"] is None, text
    (cause,) = [f for f in report.findings if f.cause == "net-congestion"]
    assert cause.node == "gpu-node-02" and cause.numbers["peers"] == "gpu-node-01", text
    assert "slow all along" in next(f.summary for f in report.findings if f.cause == "straggler"), text
