"""Whose GPU, on a real job: four ranks on the test bed, collectives that only enqueue (NCCL on GPUs: every
rank waits in synchronize alike, the calls cannot tell whose GPU is slow), one stand-in GPU per host read by
each agent through nvidia-ml-py (the stand-in NVML follows its rank's control file: a throttled GPU reports
lower clocks with a reason AND its kernels run slower, as a real one does), Xid lines written into the
kernel log as root. explain with its defaults over the job:
  one GPU throttled      -> that node and rank named, gpu-throttled
  every GPU throttled    -> nobody named, a warning that the fleet's GPUs all say the same
  one GPU with an Xid 79 -> that node named, gpu-errors
  the clean time between -> no episode (nothing named where there was no fault)
and, in a job of its own on hosts that each have a spare GPU no rank uses (it idles at its lowest clock):
  one GPU throttled from before the first step to the last -> that node named, slow all along (no clean
                                                              time to measure the job against), never
                                                              "the job did not slow down"; what it
                                                              cost measured at the synchronize after each
                                                              collective (this job's host waits for its own
                                                              GPU before it enqueues its allreduce)
Each phase checks itself first: one that did not slow the job is left out, with the reason.
"""
import pytest

from straggler.render.report import to_text
from straggler_lab.demo import harness as hz, schedule as sc

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def harness(testbed, tmp_path_factory):
    h = hz.SyncJobHarness(testbed, tmp_path_factory.mktemp("devices"), style="enqueue", gpus=True, spare_gpus=1)
    try:
        h.start_agents(extra_args=h.standin_lib_args())
        yield h
    finally:
        h.close()
    assert h.leftovers() == []


def test_a_slow_gpu_behind_enqueued_collectives_is_named_by_its_own_word(harness, tmp_path):
    phases = [sc.Phase("gpu-throttled", rank=1, start_s=8, end_s=22, size=3),
              sc.Phase("gpu-throttled", host=None, rank=0, start_s=30, end_s=44, size=2, expect_named=False),
              sc.Phase("gpu-errors", rank=3, start_s=52, end_s=None, size=3)]
    alike = [sc.Phase("gpu-throttled", rank=r, start_s=30, end_s=44, size=2, expect_named=False) for r in (1, 2, 3)]
    run = sc.run_schedule(harness, phases + alike, seconds=64, name="devices")
    valid = [p for p in run.phases if p.valid]
    if not valid:
        pytest.skip("invalid case: " + "; ".join(p.reason for p in run.phases))
    report = sc.diagnose(run, tmp_path, "devices", user_xids=True)      # the test's Xid lines are written by root
    text = to_text(report, show_sql=False, width=150) + "\nphases: " + "; ".join(p.reason for p in run.phases)
    for p in valid:
        if not p.expect_named:
            assert sc.episode_of(run, p, report) is None, text
            continue
        node_ok, cause_ok, start_ok = sc.score_phase(run, p, report)
        assert node_ok and cause_ok and start_ok, f"{p.reason}\n{text}"
    if any(p.valid and not p.expect_named for p in run.phases):
        assert any(f.cause == "gpu-throttled" and f.severity == "warning" and "alike" in f.summary
                   for f in report.findings), text
    assert sc.phantom_episodes(run, report) == [], text


def test_a_gpu_throttled_all_along_beside_idle_spare_gpus_is_named_slow_all_along(harness, tmp_path):
    """Tracing starts on a job already slow: rank 2's GPU throttled before its first step and to its last,
    every host with a spare GPU idling at its lowest clock. The job has no clean time (its best rate is the
    slow one), so the GPU is judged against the other GPUs at work: named, slow all along; the idle spares
    are no evidence (as throttled GPUs they would make half the fleet look alike). What it cost is measured
    step by step at the synchronize after each allreduce (the agent records every synchronize), within 15 %
    of what the job's own step logs say, and held by its episode."""
    phases = [sc.Phase("gpu-throttled", rank=2, start_s=0, end_s=None, size=3)]
    run = sc.run_schedule(harness, phases, seconds=30, name="all-along")
    (p,) = run.phases
    if not p.valid:
        pytest.skip(f"invalid case: {p.reason}")
    report = sc.diagnose(run, tmp_path, "all-along")
    text = to_text(report, show_sql=False, width=150) + f"\nphase: {p.reason}"
    node_ok, cause_ok, start_ok = sc.score_phase(run, p, report)
    assert node_ok and cause_ok and start_ok, text
    e = sc.episode_of(run, p, report)
    assert e["all_along"] and e["slowdown"] is None and e["lost_s"] is None, text
    assert not [f for f in report.findings if "did not slow down" in f.summary], text
    assert sc.phantom_episodes(run, report) == [], text
    w = report.whatif
    assert w["measured"] and w["waited_in"] == "synchronize", text
    assert "synchronize after each collective" in text.splitlines()[2], text
    truth_s, _ = sc.lost_truth(run, w["first_ns"] - run.real_minus_mono_ns, w["last_ns"] - run.real_minus_mono_ns)
    assert abs(w["lost_s"] - truth_s) <= 0.15 * truth_s, f"explain {w['lost_s']} s, the job's logs {truth_s:.2f} s\n{text}"
    (part,) = [p for p in w["parts"] if p["node"] == e["node"]]
    assert part["all_along"] and part["lost_s"] >= 0.8 * w["lost_s"], text


