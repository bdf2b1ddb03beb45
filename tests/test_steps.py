"""The job step by step (straggler.analysis.explain.steps): each rank's collective calls lined up by where
they end, and what the job lost at each sync point to its slowest rank — pure functions on small tables,
and explain over synthetic stores whose every collective is recorded, as the agent records them.

What a user would notice: the time the job lost to a straggler's episode is said as that episode's; a
different rank slowest at each step (uneven batches) names no node but is reported as imbalance with the
time it cost; a trace whose collectives were not all recorded says why nothing is measured."""
import pytest

from straggler.analysis.explain import steps

MS = 1_000_000


def test_calls_are_lined_up_by_where_they_end_whatever_each_rank_missed():
    # three ranks, a sync point every 10 ms; rank b's clock 1 ms off, rank c missed its second call
    a = [(10 * MS * i, 1 * MS) for i in range(1, 8)]
    b = [(10 * MS * i + MS, 3 * MS) for i in range(1, 8)]
    c = [(10 * MS * i, 5 * MS) for i in range(1, 8) if i != 2]
    ends, waits, steady = steps.line_up({"a": a, "b": b, "c": c})
    assert len(ends) == 6 and all(w == {"a": MS, "b": 3 * MS, "c": 5 * MS} for w in waits)
    assert steady["b"] == 1.0 and steady["c"] == pytest.approx(4 / 5)     # c's one missed call changes its shift once


def test_calls_of_another_rhythm_do_not_line_up():
    """A rank of another group, whose collectives end anywhere between the reference rank's: its calls do not
    keep a place in the reference rank's order."""
    import random
    rng = random.Random(5)
    a = [(10 * MS * i, MS) for i in range(1, 200)]
    other = sorted((rng.randrange(10 * MS, 2000 * MS), MS) for _ in range(150))
    assert steps.line_up({"a": a, "x": other})[2]["x"] < steps.MIN_STEADY


def test_a_call_that_returned_late_takes_its_place_in_the_order():
    """Rank b got its CPU back 8 ms late after its third call (a busy machine): more than half the spacing
    from where the others' ended; it still belongs to that sync point, by its neighbours' order."""
    a = [(10 * MS * i, 1 * MS) for i in range(1, 8)]
    b = [(10 * MS * i + (8 * MS if i == 3 else 0), 3 * MS) for i in range(1, 8)]
    ends, waits, steady = steps.line_up({"a": a, "b": b})
    assert len(ends) == 7 and all(w == {"a": MS, "b": 3 * MS} for w in waits)
    assert min(steady.values()) >= steps.MIN_STEADY


def test_the_job_loses_the_median_wait_less_the_slowest_ranks_at_each_sync_point():
    assert steps.lost({"a": 9 * MS, "b": 1 * MS, "c": 8 * MS, "d": 9 * MS}) == (8.5 * MS - 1 * MS, "b")
    assert steps.lost({"a": 2 * MS, "b": 2 * MS}) == (0, "a")


def _steps(pattern, n=40):
    """Sync points every 10 ms; pattern(i) -> the slowest rank at i (it waits 1 ms, the others 7 ms) or None."""
    keys = [("n1", 1), ("n2", 2), ("n3", 3), ("n4", 4)]
    out = steps.Steps(keys=keys)
    for i in range(n):
        slow = pattern(i)
        out.ends.append(10 * MS * i)
        out.waits.append({k: (MS if k == slow else 7 * MS) if slow else 7 * MS for k in keys})
    return out


def test_the_lost_time_goes_to_the_episode_that_holds_it_and_the_rest_to_imbalance():
    s = _steps(lambda i: ("n2", 2) if 10 <= i < 20 else [("n1", 1), ("n3", 3), ("n4", 4)][i % 3] if i >= 25 else None)
    episode = (dict(what="episode", node="n2"), "n2", [("n2", 2)], 10 * 10 * MS, 19 * 10 * MS)
    w = steps.whatif(s, [episode], 400 * MS)
    assert w.parts == [dict(what="episode", node="n2", lost_s=pytest.approx(10 * 0.006))]
    assert w.imbalance["lost_s"] == pytest.approx(15 * 0.006) and w.imbalance["sync_points"] == 15
    assert dict(w.imbalance["slowest"]) == {("n1", 1): 5, ("n3", 3): 5, ("n4", 4): 5}
    assert w.lost_s == pytest.approx(25 * 0.006) and w.lost_ratio == pytest.approx(0.15 / 0.4)


def test_without_sync_points_nothing_is_measured():
    assert steps.whatif(steps.Steps(keys=[]), [], 0) is None


def _call(op, start_ms, dur_ms, tid=1):
    return dict(op=op, tid=tid, start_ns=int(start_ms * MS), end_ns=int((start_ms + dur_ms) * MS), wait_ns=int(dur_ms * MS))


def test_with_collectives_that_only_enqueue_the_synchronize_after_each_is_the_sync_point():
    """A step: the rank waits for its own kernels (a synchronize after no collective: no sync point), enqueues
    its allreduce (returns at once), then waits in the next synchronize for the collective, that is for its
    peers, from its allreduce call on — with the runtime's and the driver's library traced, the driver's call
    inside it is the same wait."""
    step = lambda t: [_call("cudaStreamSynchronize", t, 2), _call("ncclAllReduce", t + 2.1, 0.01),
                      _call("cudaStreamSynchronize", t + 2.2, 5), _call("cuStreamSynchronize", t + 2.21, 4.98)]
    rows = step(0) + step(10) + [_call("cudaDeviceSynchronize", 20, 1)]
    assert steps.sync_points(rows) == [(int(7.2 * MS), (int(7.2 * MS), int(2.1 * MS))),
                                       (int(17.2 * MS), (int(17.2 * MS), int(12.1 * MS)))]
    assert steps.synchronize_calls(rows) == 5          # (the driver's inside the runtime's: once)
    # a collective enqueued by another thread (the backward pass's), waited for by the main thread's synchronize;
    # the rank's wait runs from its (last) collective call, however late its synchronize began
    assert steps.sync_points([_call("ncclAllReduce", 0, 0.01, tid=2), _call("ncclAllReduce", 0.5, 0.01, tid=2),
                              _call("cudaStreamSynchronize", 1, 3)]) == [(4 * MS, (4 * MS, int(0.5 * MS)))]
    assert steps.sync_points([_call("cudaStreamSynchronize", 1, 3)]) == []


def test_a_trace_whose_steps_cannot_be_lined_up_says_why_the_time_lost_is_not_measured(tmp_path):
    """A store without its collectives and synchronize calls (this synthetic one, or an agent run with
    --no-collective-rows) has none to line up."""
    from straggler.analysis import explain
    from straggler.render.report import to_text
    from straggler_lab import series
    for style in ("blocking", "enqueue"):
        path = str(tmp_path / f"cluster-{style}.db")
        series.write_cluster(path, series.SeriesSpec(seconds=120, style=style))
        report = explain.explain_db(path)
        assert report.whatif["measured"] is False and "no steps to line up" in report.whatif["why"]
        assert to_text(report, show_sql=False).splitlines()[2].startswith("time lost: not measured (")


def test_time_lost_to_one_rank_no_episode_names_is_not_called_imbalance_that_moves():
    """Behind collectives that only enqueue every rank's time shares are alike, so no episode names the rank
    that came last at almost every sync point: the finding says it fell on that rank, not that it moved, and
    recommends looking at its work before its node is drained."""
    from straggler.analysis.explain import findings
    whatif = dict(span_s=24.0, sync_points=600, waited_in="synchronize", sql={"step_calls": "SELECT 1"},
                  imbalance=dict(lost_s=6.8, sync_points=600, slowest=[dict(node="gpu-node-03", rank=2, sync_points=590),
                                                                       dict(node="gpu-node-01", rank=0, sync_points=10)]))
    one = findings.imbalance_finding(whatif, 3)
    assert one.node is None and "one rank" in one.summary and "gpu-node-03 (rank 2) came last at 98%" in one.summary
    assert "moves" not in one.summary and "only enqueue" in one.summary and "its GPU's own word" in one.recommendation
    whatif["imbalance"]["slowest"] = [dict(node=f"gpu-node-0{i + 1}", rank=i, sync_points=200) for i in range(3)]
    moving = findings.imbalance_finding(whatif, 3)
    assert "no rank stands out" in moving.summary and "do not drain" in moving.recommendation
    # two ranks: one of them is always the slowest; it falls on one when it is so at 3 of 4 sync points or more
    whatif["imbalance"]["slowest"] = [dict(node="gpu-node-01", rank=0, sync_points=500),
                                      dict(node="gpu-node-02", rank=1, sync_points=100)]
    assert "one rank" in findings.imbalance_finding(whatif, 2).summary
    whatif["imbalance"]["slowest"] = [dict(node="gpu-node-01", rank=0, sync_points=350),
                                      dict(node="gpu-node-02", rank=1, sync_points=250)]
    assert "moves between ranks" in findings.imbalance_finding(whatif, 2).summary


class _Runner:
    """explain's runner over fixed rows: the step calls and the kernel's counts of each op."""
    def __init__(self, calls):
        self.calls = calls

    def rows(self, text):
        if "SUM(a.count)" in text:
            counts = {}
            for c in self.calls:
                key = (c["node"], c["pid"], c["op"])
                counts[key] = counts.get(key, 0) + 1
            return [dict(node=n, pid=p, op=op, calls=v) for (n, p, op), v in counts.items()]
        return sorted(self.calls, key=lambda c: (c["node"], c["pid"], c["start_ns"]))


def _enqueued_job(late_ms, steps_n=40):
    """Three ranks, a step every 20 ms: each enqueues its allreduce at 10 ms into the step (late_ms(rank, i) later
    where its host was late) and waits in the synchronize after it until the collective is done (2 ms after the
    last rank's call). Rank b also has a prefetch thread whose own short synchronize comes between its
    allreduce and its main thread's synchronize every other step; rank c has 3 ms more GPU work after the
    collective (its synchronize ends later)."""
    from types import SimpleNamespace
    calls = []
    for i in range(steps_n):
        t0 = i * 20 * MS
        called = {r: t0 + 10 * MS + int(late_ms(r, i) * MS) for r in "abc"}
        done = max(called.values()) + 2 * MS
        for r in "abc":
            row = dict(node=f"node-{r}", pid=1, tid=1, wait_ns=0)
            calls.append(dict(row, op="ncclAllReduce", start_ns=called[r], end_ns=called[r] + 10_000))
            if r == "b" and i % 2:
                calls.append(dict(row, tid=2, op="cudaStreamSynchronize", start_ns=called[r] + 20_000,
                                  end_ns=called[r] + 50_000))
            sync_start = called[r] + 100_000
            calls.append(dict(row, op="cudaStreamSynchronize", start_ns=sync_start,
                              end_ns=max(sync_start, done) + (3 * MS if r == "c" else 0)))
    keys = {(f"node-{r}", 1): None for r in "abc"}
    series = SimpleNamespace(ranks=keys, wait_def="enqueue", n_bins=1, t0_ns=0, bin_start=lambda b: 10**12,
                             to_node=lambda node, t: t, clocks={f"node-{r}": SimpleNamespace(offset_ns=0) for r in "abc"})
    return _Runner(calls), series


def test_behind_enqueued_collectives_the_job_loses_what_the_last_rank_to_call_its_collective_cost():
    """Where no rank's host is late, nothing is lost — whatever another thread synchronizes in between, and
    however much GPU work a rank has after the collective; where rank a calls its allreduce 3 ms late at
    every step, the job loses 3 ms a step to it."""
    runner, series = _enqueued_job(lambda r, i: 0)
    found = steps.measure(runner, series)
    assert found.why_not is None and found.waited_in == "synchronize" and len(found.waits) >= 35
    assert sum(steps.lost(w)[0] for w in found.waits) == 0
    runner, series = _enqueued_job(lambda r, i: 3 if r == "a" else 0)
    found = steps.measure(runner, series)
    assert [steps.lost(w) for w in found.waits] == [(3 * MS, ("node-a", 1))] * len(found.waits)
