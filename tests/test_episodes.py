"""Straggle episodes in time, on small synthetic series (pure: straggler.analysis.explain.episodes) and
on synthetic stores of a whole job (straggler_lab.series) through explain with its defaults.

What a user would notice: a fault late in a long trace is found, with its start and end; a fault that
comes and goes is ONE episode that says it is intermittent (period, duty), not a flurry and not nothing;
a node slow from its first step gets its real cause; noise alone names nobody.
"""
import random

import pytest

from straggler.analysis import explain
from straggler.analysis.explain import episodes as ep
from straggler_lab import series

S = 1_000_000_000


def noise(n, sigma=0.04, seed=1):
    rng = random.Random(seed)
    return [rng.gauss(0, sigma) for _ in range(n)]


def runs(gaps, **opts):
    return [(r.start, r.end) for r in ep.straggling_runs(gaps, ep.EpisodeOptions(**opts))]


# ---------------------------------------------------------------- the job's wait definition (pure)

def _series_of(per_rank, n=40):
    """A Series of ranks whose every bin is the given thread_time sums (ns of a 1 s bin)."""
    from straggler.analysis.explain import timeline
    from straggler.store.steptime import rank_time
    ranks = {}
    for i, raw in enumerate(per_rank):
        key = (f"gpu-node-{i + 1:02d}", 100 + i)
        row = dict(tid=100 + i, calls=100, **raw)
        ranks[key] = [rank_time(key, [row], S, rank=i, calling_tid=100 + i) for _ in range(n)]
    return timeline.Series(t0_ns=0, bin_ns=S, n_bins=n, clocks={}, ranks=ranks,
                           rank_of={k: i for i, k in enumerate(ranks)}, calling={k: k[1] for k in ranks},
                           interval_ns={k: S for k in ranks})


def test_a_blocking_job_on_busy_cores_is_judged_by_its_collectives_not_by_synchronize():
    """Gloo-like collectives on busy cores: each rank waits in its collective half the time but is runnable
    for most of it (run queue inside the call, which the model counts as run queue), and synchronizes
    with its own device 20 % of the time. The job waits in collectives: one rank with less synchronize
    (more host work, its device done sooner) is no straggler, as judging by synchronize would make it."""
    from straggler.analysis.explain import timeline
    busy = dict(coll_ns=450_000_000, runq_coll_ns=400_000_000, runq_ns=450_000_000, sync_ns=200_000_000)
    lighter = dict(busy, sync_ns=20_000_000)
    s = _series_of([lighter, busy, busy, busy])
    assert timeline.job_wait_def(s) == "blocking"
    best, per_def = timeline.gaps(s)
    assert max(g for g in best[("gpu-node-01", 100)] if g is not None) < 0.05      # no gap under the job's definition
    assert min(g for g in per_def["enqueue"][("gpu-node-01", 100)] if g is not None) > 0.15   # the other would see one


def test_a_job_whose_collectives_only_enqueue_is_judged_by_synchronize():
    from straggler.analysis.explain import timeline
    nccl = dict(coll_ns=5_000_000, sync_ns=600_000_000)
    assert timeline.job_wait_def(_series_of([nccl] * 4)) == "enqueue"


# ---------------------------------------------------------------- the segmentation (pure)

def test_a_step_is_one_episode_from_where_it_starts_to_where_it_ends():
    g = noise(600)
    for b in range(200, 400):
        g[b] += 0.4
    assert runs(g) == [(200, 400)]


def test_a_short_fault_late_in_an_hour_is_found():
    g = noise(3600)
    for b in range(3580, 3592):       # 12 s near the end of an hour
        g[b] += 0.35
    assert runs(g) == [(3580, 3592)]


def test_a_square_wave_is_one_intermittent_episode_with_its_period_and_duty():
    g = noise(600, sigma=0.02)
    for b in range(300, 330):          # 2 bins on, 2 off
        if (b - 300) % 4 < 2:
            g[b] += 0.45
    found = ep.straggling_runs(g)
    assert len(found) == 1, [(r.start, r.end) for r in found]
    run = found[0]
    assert 298 <= run.start <= 300 and 328 <= run.end <= 330
    assert ep.is_intermittent(run) and run.period_bins() == 4 and 0.4 <= run.duty <= 0.6


def test_a_fault_on_every_other_bin_is_one_episode_over_its_whole_span():
    """On one bin, off the next, at twice the threshold: its mean over the span is min_gap itself. The
    trimming of weak ends weighs each side as an episode is (by its on-bins), so the rest of the fault is
    never a weak end of its first bin (it cut the episode down to that one bin, and named nobody)."""
    g = noise(200, sigma=0.01)
    for b in range(100, 130, 2):
        g[b] += 0.30
    found = ep.straggling_runs(g)
    assert len(found) == 1, [(r.start, r.end) for r in found]
    run = found[0]
    assert run.start == 100 and 128 <= run.end <= 130
    assert ep.is_intermittent(run) and run.period_bins() == 2


def test_a_rank_that_always_waits_a_little_less_dates_a_fault_from_where_it_starts():
    """A job's root rank (or one pinned to a busy core) waits 8 points less than the others all along, just
    above the segmentation's per-bin threshold; a fault on it then starts at bin 60. The episode starts at
    60, not at the first bin of that slight lead: a watch would otherwise say the step time moved a
    minute before it did."""
    bias = [0.08 + x for x in noise(60, sigma=0.02, seed=3)]
    for size in (0.7, 0.2):           # a strong fault, and one near the threshold
        fault = [size + x for x in noise(20, sigma=0.03, seed=4)]
        assert runs(bias + fault + bias) == [(60, 80)], size


def test_one_noisy_bin_or_two_make_no_episode():
    g = noise(600)
    g[100] += 0.5
    g[300] += 0.4
    g[301] -= 0.1
    assert runs(g) == []


def test_noise_alone_names_nobody_in_hours_of_bins():
    for seed in range(10):
        assert runs(noise(3600, sigma=0.06, seed=seed)) == [], seed


def test_a_slow_ramp_is_found_once_it_is_material():
    g = noise(600, sigma=0.02)
    for b in range(200, 400):
        g[b] += 0.5 * (b - 200) / 200
    found = runs(g)
    assert len(found) == 1 and 200 < found[0][0] < 260 and found[0][1] == 400


def test_a_rank_slow_from_its_first_bin_is_one_episode_from_the_start():
    g = noise(300)
    g = [x + 0.3 for x in g]
    assert runs(g) == [(0, 300)]


def test_bins_without_data_neither_start_nor_end_an_episode():
    g = noise(200)
    for b in range(50, 150):
        g[b] += 0.4
    for b in range(90, 100):
        g[b] = None                    # a gap in the data inside the episode
    g[10] = None
    assert runs(g) == [(50, 150)]


def pause_gaps(n=120, every=2, gap=0.15, sigma=0.02, seed=3):
    """One rank's gaps: noise, and a pause every `every` bins that leaves its peers `gap` of a bin more."""
    return [g + (gap if (b - 10) % every == 0 and 10 <= b < n - 10 else 0.0) for b, g in enumerate(noise(n, sigma, seed))]


def test_an_episode_ended_at_the_edge_stays_open_until_a_resumption_would_be_a_new_one():
    """A fault that quiets for a few seconds, read while it is quiet (a live watch at the newest data): its
    run ends at the edge, but once the fault resumes the segmentation bridges the quiet bins into the same
    episode — so it may resume, and says so, until the bins after it make a resumption a new episode."""
    fault, quiet, back = [0.5] * 15, [0.0] * 4, [0.5] * 6
    at_the_edge = noise(10) + fault + quiet
    (run,) = ep.straggling_runs(at_the_edge)
    assert run.end == 25                                     # ended at its first quiet bin, read at the edge
    assert ep.may_resume(at_the_edge[run.end:])              # ... but not closed:
    assert runs(at_the_edge + back) == [(10, 35)]            # resumed, it is the same episode
    recovered = noise(10) + fault + [0.0] * 10
    (run,) = ep.straggling_runs(recovered)
    assert not ep.may_resume(recovered[run.end:])            # healthy long enough: closed
    assert len(runs(recovered + back)) == 2                  # and a resumption is a new run
    assert ep.may_resume([None] * 20) and not ep.may_resume([-0.5] * 3)   # no data says nothing; clearly healthy


def test_a_short_pause_every_few_seconds_is_found_with_its_length_and_period():
    for every, gap in ((2, 0.15), (3, 0.12), (5, 0.3)):
        p = ep.pauses(pause_gaps(every=every, gap=gap))
        assert p is not None, (every, gap)
        expected = range(10, 110, every)
        assert p.period_bins == every and len(expected) - 2 <= len(p.runs) <= len(expected)   # (a pause in noise)
        assert p.length_bins == pytest.approx(gap, abs=0.03) and p.start <= 10 + every and p.end >= expected[-1]


def test_noise_a_steady_straggler_and_a_long_on_off_fault_are_no_pauses():
    assert ep.pauses(noise(600, 0.04, seed=7)) is None                       # heavy noise, no rhythm
    assert ep.pauses([g + (0.3 if b >= 40 else 0) for b, g in enumerate(noise(120, 0.02))]) is None   # steady
    assert ep.pauses(pause_gaps(every=2, gap=0.6)) is None     # 600 ms of every 2 s: a fault that comes and goes
    assert ep.pauses(pause_gaps(every=15, gap=0.3)) is None    # too far apart to be a rhythm of the job's
    few = pause_gaps(every=2, gap=0.15)
    assert ep.pauses([g if b < 17 else 0.0 for b, g in enumerate(few)]) is None     # four pauses only


def test_the_gap_of_each_rank_is_the_others_median_minus_its_own():
    waits = {"a": [0.1, 0.6, None], "b": [0.6, 0.6, 0.5], "c": [0.5, 0.1, 0.5]}
    gaps = ep.gap_series(waits)
    assert gaps["a"][0] == pytest.approx(0.45) and gaps["b"][0] == pytest.approx(-0.3)
    assert gaps["c"][1] == pytest.approx(0.5) and gaps["a"][2] is None and gaps["b"][2] == pytest.approx(0.0)


# ---------------------------------------------------------------- a whole job (synthetic stores), explain's defaults

def explained(tmp_path, faults, **spec):
    path = str(tmp_path / "cluster.db")
    facts = series.write_cluster(path, series.SeriesSpec(faults=faults, **spec))
    return explain.explain_db(path), facts


def cause_of(report, node):
    top = explain.top_cause(report, node)
    return top.cause if top else None


def test_a_late_cpu_hog_in_a_long_job_is_named_with_its_start_and_end(tmp_path):
    report, facts = explained(tmp_path, [series.Fault(node=1, start_s=3560, end_s=3574, kind="cpu", slow=2.5)],
                              seconds=3600)
    assert report.straggler == "gpu-node-02" and cause_of(report, "gpu-node-02") == "cpu-contention"
    e = report.episodes[0]
    assert abs(e["start_ns"] - facts["faults"][0]["start_ns"]) <= 2 * S
    assert abs(e["end_ns"] - facts["faults"][0]["end_ns"]) <= 2 * S
    assert e["intermittent"] is None and e["slowdown"] > 1.5


def test_a_fault_that_comes_and_goes_is_one_intermittent_episode(tmp_path):
    report, facts = explained(tmp_path, [series.Fault(node=2, start_s=300, end_s=330, kind="cpu", slow=2.0,
                                                      on_s=2, off_s=2)], seconds=600)
    assert report.straggler == "gpu-node-03" and len(report.episodes) == 1, report.episodes
    e = report.episodes[0]
    assert e["intermittent"] and e["intermittent"]["period_s"] == pytest.approx(4.0, abs=1.0)
    assert 0.3 <= e["intermittent"]["duty"] <= 0.7
    assert cause_of(report, "gpu-node-03") == "cpu-contention"


def test_a_hog_one_second_on_one_off_is_named_over_its_span(tmp_path):
    """A fault as fast as the bins (1 s on, 1 s off, the job x1.3 over its span): one intermittent
    episode on its node with its period, not cut down to its first bin."""
    report, facts = explained(tmp_path, [series.Fault(node=1, start_s=100, end_s=130, kind="cpu", slow=1.6,
                                                      on_s=1, off_s=1)], seconds=240)
    assert report.straggler == "gpu-node-02" and len(report.episodes) == 1, report.episodes
    e = report.episodes[0]
    assert abs(e["start_ns"] - facts["faults"][0]["start_ns"]) <= 2 * S and e["duration_s"] >= 26
    assert e["intermittent"] and e["intermittent"]["period_s"] == pytest.approx(2.0, abs=0.5)
    assert cause_of(report, "gpu-node-02") == "cpu-contention"


def test_host_compute_from_the_first_step_is_host_compute(tmp_path):
    report, _ = explained(tmp_path, [series.Fault(node=0, start_s=0, end_s=600, kind="host", slow=1.4)],
                          seconds=600)
    assert report.straggler == "gpu-node-01" and cause_of(report, "gpu-node-01") == "host-compute"
    assert report.episodes[0]["slowdown_estimated"]          # no clean time: estimated from the waiters


def test_a_rank_pausing_150_ms_every_2_s_is_one_episode_of_pauses_with_its_cost(tmp_path):
    """A full garbage collection on one rank: 150 ms of host compute every 2 s, its peers waiting for it
    each time — each pause bin's gap under min_gap, the trace's mean gap half that. One episode on that
    rank, its pauses counted with their length and period, host compute its cause, and the time the job
    lost to them (about a pause's peers' wait each time)."""
    path = str(tmp_path / "cluster.db")
    fault = series.Fault(node=1, kind="host", start_s=100, end_s=400, on_s=0.15, off_s=1.85, slow=3.0)
    series.write_cluster(path, series.SeriesSpec(seconds=600, faults=[fault]))
    report = explain.explain_db(path)
    (e,) = report.episodes
    assert e["node"] == "gpu-node-02" and [r["rank"] for r in e["ranks"]] == [1]
    assert abs(e["start_ns"] - (series.REFERENCE_T0_NS + 100 * S)) <= 2 * S and e["duration_s"] == pytest.approx(300, abs=3)
    assert e["pauses"]["count"] == 150 and e["pauses"]["period_s"] == 2.0
    assert 0.1 <= e["pauses"]["length_s"] <= 0.3
    assert explain.top_cause(report, "gpu-node-02").cause == "host-compute"
    assert 10 <= e["lost_s"] <= 40          # ~150 pauses x their peers' wait (~0.1-0.2 s)
    from straggler.render.report import to_text
    assert "pauses: 150 of ~" in to_text(report, show_sql=False)


def test_two_episodes_lead_with_the_costliest(tmp_path):
    faults = [series.Fault(node=0, start_s=100, end_s=120, kind="gpu", slow=1.5),
              series.Fault(node=3, start_s=400, end_s=500, kind="io", slow=1.8)]
    report, _ = explained(tmp_path, faults, seconds=600)
    assert [e["node"] for e in report.episodes] == ["gpu-node-04", "gpu-node-01"]
    assert report.straggler == "gpu-node-04"
    assert report.episodes[0]["lost_s"] > report.episodes[1]["lost_s"]
    assert [c["cause"] for c in report.episodes[1]["causes"]][:1] == ["gpu-slow"]


def test_an_episodes_causes_read_gravest_first(tmp_path):
    """Two faults at once on one node, checkpoint I/O in the loop and a little more host compute: the
    episode lists io-self (critical, most of the excess) before host-compute (info), as the report's own
    findings are ordered, whatever order the cause classes are examined in."""
    faults = [series.Fault(node=1, start_s=200, end_s=300, kind="host", slow=1.3),
              series.Fault(node=1, start_s=200, end_s=300, kind="io", slow=2.0)]
    report, _ = explained(tmp_path, faults, seconds=600)
    e = report.episodes[0]
    causes = [(f["severity"], f["cause"]) for f in e["findings"] if f["cause"] not in ("straggler", "waiters")]
    assert causes[:2] == [("critical", "io-self"), ("info", "host-compute")], causes


def test_a_clean_job_has_no_episode(tmp_path):
    report, _ = explained(tmp_path, [], seconds=900, noise=0.05)
    assert report.straggler is None and report.episodes == []


# ---------------------------------------------------------------- ranks per node (eight ranks on a GPU node)

def test_one_slow_gpu_of_eight_names_that_rank_on_that_node(tmp_path):
    report, _ = explained(tmp_path, [series.Fault(node=2, ranks=(3,), start_s=60, end_s=240, kind="gpu", slow=1.5)],
                          seconds=300, ranks_per_node=8)
    assert report.stragglers == ["gpu-node-03"]
    assert [r["rank"] for r in report.episodes[0]["ranks"]] == [19]
    top = report.findings[0]
    assert top.cause == "straggler" and "1 of its 8 ranks (19)" in top.summary
    assert cause_of(report, "gpu-node-03") == "gpu-slow"


def test_cpu_contention_on_a_whole_node_names_the_node_and_all_its_ranks(tmp_path):
    report, _ = explained(tmp_path, [series.Fault(node=1, start_s=60, end_s=240, kind="cpu", slow=1.6)],
                          seconds=300, ranks_per_node=8)
    assert report.stragglers == ["gpu-node-02"]
    assert sorted(r["rank"] for r in report.episodes[0]["ranks"]) == list(range(8, 16))
    assert "all 8 of its ranks (8-15)" in report.findings[0].summary
    assert cause_of(report, "gpu-node-02") == "cpu-contention"


def test_two_faulty_nodes_with_several_ranks_each_are_both_named(tmp_path):
    faults = [series.Fault(node=0, ranks=(0, 1, 2, 3), start_s=60, end_s=240, kind="host", slow=1.6),
              series.Fault(node=3, ranks=(4, 5), start_s=60, end_s=240, kind="host", slow=1.6)]
    report, _ = explained(tmp_path, faults, seconds=300, ranks_per_node=8)
    assert set(report.stragglers) == {"gpu-node-01", "gpu-node-04"}, report.stragglers
    named = {(r["node"], r["rank"]) for e in report.episodes for r in e["ranks"]}
    assert named == {("gpu-node-01", r) for r in range(4)} | {("gpu-node-04", r) for r in (28, 29)}


def test_a_sibling_rank_taking_the_cpu_is_self_contention_not_an_intruder(tmp_path):
    report, _ = explained(tmp_path, [series.Fault(node=1, ranks=(0,), start_s=60, end_s=240, kind="cpu", slow=1.8,
                                                  thief="sibling")], seconds=300, ranks_per_node=2)
    assert report.straggler == "gpu-node-02" and cause_of(report, "gpu-node-02") == "self-contention"
    finding = explain.top_cause(report, "gpu-node-02")
    assert "another rank of this job on the node" in finding.summary and "taskset" not in finding.recommendation


def test_a_fault_faster_than_the_bins_is_confirmed_over_its_on_time_only():
    """An intermittent episode whose period the bins cannot follow is judged over its whole span, on and
    off alike: the model's consistency test (the straggler waits less in most slices) then asks for its
    duty's share of them, as the segmentation judges it by its on-phases. One slow enough for the bins
    is judged over its on-bins (all of them straggling), and a steady one over its span: both ask for all."""
    from straggler.analysis.explain import timeline
    series = timeline.Series(t0_ns=0, bin_ns=10**9, n_bins=30, clocks={}, ranks={}, rank_of={}, calling={},
                             interval_ns={})
    key = ("gpu-node-02", 42)

    def episode(on_runs, off_runs, intermittent, duty, period_bins):
        run = ep.Run(start=5, end=19, bins=14, mean_gap=0.3, on_runs=on_runs, off_runs=off_runs)
        return timeline.Episode(node=key[0], keys=[key], start=5, end=19, runs={key: run}, lead=key,
                                intermittent=intermittent, duty=duty, period_bins=period_bins)
    fast = episode([(b, b + 1) for b in range(5, 19, 2)], [(b, b + 1) for b in range(6, 19, 2)], True, 0.45, 2.0)
    assert timeline.slice_share(series, fast) == 0.45
    slow = episode([(5, 8), (11, 14), (17, 19)], [(8, 11), (14, 17)], True, 0.5, 6.0)
    assert timeline.slice_share(series, slow) == 1.0
    steady = episode([(5, 19)], [], False, 1.0, None)
    assert timeline.slice_share(series, steady) == 1.0


def test_a_few_clean_bins_before_an_episode_are_no_baseline():
    """A fault from the first step leaves only the job's start-up bins before its episode: a baseline of
    them (already faulty, or not yet steady) would hide its cause, so fewer than MIN_CLEAN_BINS clean bins
    are no baseline, and the causes are judged against the other ranks at the same time. Five clean bins
    before it are its baseline."""
    from straggler.analysis.explain import timeline
    keys = [("gpu-node-01", 11), ("gpu-node-02", 12)]
    n = 30
    series = timeline.Series(t0_ns=0, bin_ns=10**9, n_bins=n, clocks={k[0]: timeline.NodeClock(k[0]) for k in keys},
                             ranks={k: [None] * n for k in keys}, rank_of={k: i for i, k in enumerate(keys)},
                             calling={}, interval_ns={k: 10**9 for k in keys},
                             usable_bins={k: frozenset(range(1, n - 1)) for k in keys})

    def windows(start, end):
        run = ep.Run(start=start, end=end, bins=end - start, mean_gap=0.3, on_runs=[(start, end)])
        e = timeline.Episode(node=keys[0][0], keys=[keys[0]], start=start, end=end, runs={keys[0]: run},
                             lead=keys[0])
        return {w.node: w for w in timeline.episode_windows(series, e, [e])}
    early = windows(3, n)             # bins 1 and 2 are clean, and nothing after it
    assert all(w.baseline == () for w in early.values()), early
    assert early["gpu-node-01"].recent == ((3 * 10**9, (n - 1) * 10**9),)     # its last bin is the job's end
    later = windows(6, n)             # bins 1 to 5
    assert later["gpu-node-01"].baseline == ((10**9, 6 * 10**9),)


def test_an_episode_the_job_did_not_slow_down_for_is_no_straggler():
    """A short shuffle of who waits least (every GPU slowing at once, say) can make a segment of one rank
    waiting less while the job runs as fast as around it: measured against that clean time, a slowdown
    under MIN_SLOWDOWN is no straggle episode. Without clean time, the estimate from the waits stands."""
    from straggler.analysis.explain import timeline
    e = timeline.Episode(node="gpu-node-02", keys=[], start=5, end=10)

    def judged(slowdown, estimated=False):
        return timeline.Judged(episode=e, analysis=None, nodes=[], recent_bins=[], slowdown=slowdown,
                               slowdown_estimated=estimated)
    assert not judged(1.0).drags_the_job() and not judged(1.03).drags_the_job()
    assert judged(timeline.MIN_SLOWDOWN).drags_the_job() and judged(1.5).drags_the_job()
    assert judged(1.0, estimated=True).drags_the_job()


# ---------------------------------------------------------------- a long trace: read through its roll-ups

LONG = dict(nodes=8, ranks_per_node=4, seconds=7200)      # 32 ranks x 2 h: too long to read whole at 1 s


@pytest.mark.slow
def test_a_long_trace_is_read_through_its_rollups_and_keeps_one_second_episodes(tmp_path):
    """Two hours of 32 ranks: read whole at its summaries' interval it would pass the series' budget (its
    bins would widen); its roll-ups say which minutes changed, and those are read at 1 s. A 14-s hog in
    the trace's last minutes and a hog 1 s on / 1 s off in its middle are each named on their node, to
    the second, the second one intermittent; without roll-ups (an older store) the same trace is read
    at wider bins."""
    faults = [series.Fault(node=6, start_s=6900, end_s=6914, kind="cpu", slow=2.5),
              series.Fault(node=2, start_s=3000, end_s=3030, kind="cpu", slow=1.6, on_s=1, off_s=1)]
    report, facts = explained(tmp_path, faults, **LONG)
    assert report.timeline["bin_s"] == 1.0 and report.timeline["rollup"]["stretches"], report.timeline
    by_node = {e["node"]: e for e in report.episodes}
    assert set(by_node) == {"gpu-node-07", "gpu-node-03"}, report.episodes
    late, blinking = by_node["gpu-node-07"], by_node["gpu-node-03"]
    assert abs(late["start_ns"] - facts["faults"][0]["start_ns"]) <= 2 * S
    assert abs(late["end_ns"] - facts["faults"][0]["end_ns"]) <= 2 * S
    assert abs(blinking["start_ns"] - facts["faults"][1]["start_ns"]) <= 2 * S and blinking["intermittent"]
    assert cause_of(report, "gpu-node-07") == "cpu-contention"
    assert [c["cause"] for c in blinking["causes"]][:1] == ["cpu-contention"]
    older = str(tmp_path / "older.db")
    series.write_cluster(older, series.SeriesSpec(faults=faults, **LONG), rollups=False)
    report = explain.explain_db(older)
    assert report.timeline["bin_s"] > 1.0 and "rollup" not in report.timeline, report.timeline


@pytest.mark.slow
def test_a_long_trace_of_one_node_is_read_rank_by_rank_to_its_last_minute(tmp_path):
    """One node of 16 ranks for two hours (a single 16-GPU host's store): with no other node to measure
    it against, each rank is measured against the typical rank; a slow GPU on one rank in the trace's
    last minute is named, that rank alone, to the second."""
    fault = series.Fault(node=0, ranks=(5,), start_s=7165, end_s=7185, kind="gpu", slow=2.0)
    report, facts = explained(tmp_path, [fault], nodes=1, ranks_per_node=16, seconds=7200)
    assert report.timeline["rollup"]["stretches"] and report.timeline["bin_s"] == 1.0, report.timeline
    assert [e["node"] for e in report.episodes] == ["gpu-node-01"], report.episodes
    e = report.episodes[0]
    assert [r["rank"] for r in e["ranks"]] == [5], e["ranks"]
    assert abs(e["start_ns"] - facts["faults"][0]["start_ns"]) <= 2 * S


@pytest.mark.slow
def test_a_long_clean_trace_names_nobody(tmp_path):
    """Two hours of 32 ranks with noise and no fault: no minute the roll-ups point to holds an episode,
    and the report names nobody."""
    report, _ = explained(tmp_path, [], noise=0.05, **LONG)
    assert report.straggler is None and not report.episodes, report.episodes
    rolled = report.timeline["rollup"]                       # it looked through the roll-ups, every minute
    assert rolled["bins"] >= 120 and rolled["marked"] == 0 and rolled["stretches"] == [], rolled


@pytest.mark.slow
def test_the_time_before_a_store_had_rollups_is_read_too(tmp_path):
    """An agent upgraded half an hour into the trace rolled up only what came after: the half hour
    before is read at 1 s as it is (a fault in it named), the rest through the roll-ups."""
    import sqlite3
    path = str(tmp_path / "cluster.db")
    facts = series.write_cluster(path, series.SeriesSpec(
        faults=[series.Fault(node=4, start_s=600, end_s=615, kind="cpu", slow=2.5)], **LONG))
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM thread_rollup WHERE last_ts <= (SELECT MIN(ts) FROM thread_rollup r "
                     "WHERE r.node = thread_rollup.node) + 1800000000000")
    conn.close()
    report = explain.explain_db(path)
    first = report.timeline["rollup"]["stretches"][0]
    assert first["start"] == report.timeline["start"] and "not rolled up" in first["why"], first
    assert [e["node"] for e in report.episodes] == ["gpu-node-05"], report.episodes
    assert abs(report.episodes[0]["start_ns"] - facts["faults"][0]["start_ns"]) <= 2 * S
