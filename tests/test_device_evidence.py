"""Whose GPU: explain names a slow GPU by the device's own word (the agent's NVML samples and the
driver's Xid errors), on synthetic stores of a whole job (straggler_lab.series, with its device tables).

What a user would notice: with collectives that only enqueue, every rank waits in synchronize alike when
one GPU is slow — the calls cannot tell whose it is; the GPU that alone reports throttling, a degraded
link or errors is named, with its cause class and a recommendation of that kind. Every GPU alike names
nobody (a fleet condition, said as a warning); a GPU's evidence without any slowdown of the job is a
warning, never a straggler; in the blocking style the evidence is added to gpu-slow.
"""
import pytest

from straggler.analysis import explain
from straggler_lab import series


def explained(tmp_path, faults, style="enqueue", seconds=600):
    path = str(tmp_path / "cluster.db")
    series.write_cluster(path, series.SeriesSpec(seconds=seconds, style=style, gpus=True, faults=faults))
    return explain.explain_db(path)


def gpu_fault(node, device, slow=1.6, start_s=200, end_s=400):
    return series.Fault(node=node, start_s=start_s, end_s=end_s, kind="gpu", slow=slow, device=device)


@pytest.mark.parametrize("device, cause, words", [
    ("throttle", "gpu-throttled", "hw_thermal_slowdown"),
    ("link", "gpu-link", "PCIe at gen 3 x8 of gen 5 x16"),
    ("xid", "gpu-errors", "Xid 79"),
])
def test_the_gpu_that_alone_says_why_is_named_with_its_kind(tmp_path, device, cause, words):
    report = explained(tmp_path, [gpu_fault(2, device)])
    assert report.straggler == "gpu-node-03", report.findings
    top = explain.top_cause(report, "gpu-node-03")
    assert top.cause == cause and words in top.summary
    assert top.recommendation and top.sql["gpu_samples"]                # what to do, and the SQL behind it
    (episode,) = report.episodes
    assert episode["node"] == "gpu-node-03" and [r["rank"] for r in episode["ranks"]] == [2]
    assert abs(episode["start_ns"] - (series.REFERENCE_T0_NS + 200 * 10**9)) <= 3 * 10**9
    assert episode["slowdown"] > 1.2


def test_every_gpu_throttled_alike_names_nobody_and_says_it_is_the_fleet(tmp_path):
    report = explained(tmp_path, [gpu_fault(n, "throttle") for n in range(4)])
    assert report.straggler is None and report.episodes == []
    (warning,) = [f for f in report.findings if f.cause == "gpu-throttled"]
    assert warning.severity == "warning" and "3 other GPU(s) alike" in warning.summary


def test_a_gpus_evidence_without_a_slowdown_is_a_warning_not_a_straggler(tmp_path):
    report = explained(tmp_path, [gpu_fault(3, "throttle", slow=1.0)])
    assert report.straggler is None
    (warning,) = [f for f in report.findings if f.cause == "gpu-throttled"]
    assert warning.severity == "warning" and warning.node == "gpu-node-04"
    assert "did not slow down" in warning.summary


def test_in_the_blocking_style_the_evidence_goes_into_gpu_slow(tmp_path):
    report = explained(tmp_path, [gpu_fault(0, "throttle")], style="blocking")
    top = explain.top_cause(report, "gpu-node-01")
    assert report.straggler == "gpu-node-01" and top.cause == "gpu-slow"
    assert "its GPU 0 says why" in top.summary and top.numbers["gpu_evidence"] == "gpu-throttled"
    assert "cooling" in top.recommendation


def test_a_store_without_device_samples_explains_as_before(tmp_path):
    path = str(tmp_path / "cluster.db")
    series.write_cluster(path, series.SeriesSpec(seconds=600, style="enqueue", gpus=False,
                                                 faults=[gpu_fault(2, "throttle")]))
    report = explain.explain_db(path)
    assert report.straggler is None                     # enqueue: the calls alone cannot tell whose GPU
    assert not [f for f in report.findings if f.cause in ("gpu-throttled", "gpu-link", "gpu-errors")]


def test_a_gpus_word_is_read_in_the_stretch_where_it_said_it():
    """A job-slow run can bridge two slowdowns a few seconds apart; the GPU throttled in the first (and,
    like every GPU, in the second) is named over its first stretch of evidence only. Runs of evidence a
    bin or two apart are one stretch; an Xid holds to the slow run's end."""
    from straggler.analysis.explain import devices, episodes as ep
    slow = ep.Run(start=9, end=46, bins=37, mean_gap=0.3)
    two = devices.within([(10, 24, "gpu-throttled"), (32, 46, "gpu-throttled")], slow)
    assert (two.start, two.end) == (10, 24)
    flicker = devices.within([(10, 14, "gpu-throttled"), (16, 20, "gpu-throttled"), (21, 24, "gpu-throttled")], slow)
    assert (flicker.start, flicker.end) == (10, 24)
    xid = devices.within([(12, 13, "gpu-errors"), (30, 31, "gpu-throttled")], slow)
    assert (xid.start, xid.end) == (12, 46)
    assert devices.within([(50, 55, "gpu-throttled")], slow) is None


def test_an_idle_spare_gpu_is_no_evidence_and_the_throttled_one_at_work_is_named(tmp_path):
    """Each node has a spare GPU that idles at its lowest clock (NVML's gpu_idle, no slowdown reason):
    it is neither throttled nor the measure of the others, so the one throttled GPU at work still stands
    out among the GPUs at work (counted with the idle ones, half the GPUs looked 'throttled' alike)."""
    path = str(tmp_path / "cluster.db")
    series.write_cluster(path, series.SeriesSpec(seconds=600, style="enqueue", gpus=True, idle_gpus=1,
                                                 faults=[gpu_fault(2, "throttle")]))
    report = explain.explain_db(path)
    assert report.straggler == "gpu-node-03", report.findings
    assert explain.top_cause(report, "gpu-node-03").cause == "gpu-throttled"
    assert not [f for f in report.findings if f.node != "gpu-node-03" and f.cause == "gpu-throttled"]


def test_a_gpu_throttled_all_along_is_named_against_the_other_gpus_at_work(tmp_path):
    """A GPU throttled before tracing began and to its end: the job has no clean time to be measured
    against (the trace's best rate is the slow one), so the GPU is judged against the other GPUs at work at
    the same time — named, its cost said to be unmeasured, never 'the job did not slow down'."""
    report = explained(tmp_path, [gpu_fault(2, "throttle", start_s=0, end_s=600)])
    assert report.straggler == "gpu-node-03", report.findings
    top = explain.top_cause(report, "gpu-node-03")
    assert top.cause == "gpu-throttled" and "hw_thermal_slowdown" in top.summary
    (episode,) = report.episodes
    assert episode["all_along"] and episode["slowdown"] is None and episode["lost_s"] is None
    assert [r["rank"] for r in episode["ranks"]] == [2]
    lead = next(f for f in report.findings if f.cause == "straggler")
    assert "slow all along: no clean time in this trace" in lead.summary
    assert not [f for f in report.findings if "did not slow down" in f.summary]
    from straggler.render.report import to_text
    assert "all along" in to_text(report, show_sql=False) and "not measured" in to_text(report, show_sql=False)


def test_every_gpu_throttled_all_along_names_nobody_and_says_so(tmp_path):
    report = explained(tmp_path, [gpu_fault(n, "throttle", start_s=0, end_s=600) for n in range(4)])
    assert report.straggler is None and report.episodes == []
    (warning,) = [f for f in report.findings if f.cause == "gpu-throttled"]
    assert warning.severity == "warning" and "all along this trace, as on 3 other GPU(s) alike" in warning.summary
