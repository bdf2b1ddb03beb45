"""The step-time model and its rules (straggler.analysis.explain.model) on small hand-made tables:
pure functions, no database. Each rule here was broken once to watch its test fail."""
import pytest

from straggler.analysis.explain import model
from straggler.store import steptime

S = 1_000_000_000
OPTS = model.ModelOptions()


def thread(tid, calls=100, **ns):
    row = dict(tid=tid, comm=f"t{tid}", calls=calls, work_ns=0, sync_ns=0, coll_ns=0, runq_ns=0, runq_work_ns=0,
               runq_sync_ns=0, runq_coll_ns=0, blocked_ns=0, io_ns=0)
    row.update({k: int(v * S) for k, v in ns.items()})
    return row


def rank(node, *threads, wall=1.0, rank_no=None):
    return steptime.rank_time((node, 100), list(threads), int(wall * S), rank_no)


def healthy(node, wait=0.4, **extra):
    """A rank that computes (host 0.3 s of 1 s, sync 0.2) and waits `wait` in its collective."""
    return rank(node, thread(1, sync_ns=0.2, coll_ns=wait, **extra))


def test_components_are_exclusive_and_host_is_the_rest():
    t = thread(1, work_ns=0.1, sync_ns=0.2, coll_ns=0.3, runq_ns=0.15, runq_work_ns=0.05, blocked_ns=0.1, io_ns=0.05)
    c = steptime.thread_components(t, S)
    assert c["work"] == 0.05 * S            # its run-queue wait inside work calls is run queue, not work
    assert c["runq"] == 0.15 * S
    assert sum(c.values()) == S
    assert c["host"] == pytest.approx(0.15 * S, abs=2)


def test_the_calling_thread_is_the_one_with_most_call_time():
    main = thread(7, sync_ns=0.5)
    helper = thread(8, calls=0, runq_ns=0.2)
    assert steptime.calling_thread([helper, main])["tid"] == 7
    assert steptime.calling_thread([thread(9, calls=0)]) is None


def test_waits_behind_its_own_helpers_run_queue_are_its_own_delay():
    rt = rank("n1", thread(1, coll_ns=0.5, sync_ns=0.1), thread(2, calls=0, runq_ns=0.3))
    assert rt.share("runq") == pytest.approx(0.3)
    assert rt.share("coll") == pytest.approx(0.2)
    assert rt.helper_runq_ns == 0.3 * S


@pytest.mark.parametrize("component,cause", [("host_ns", "host"), ("runq_ns", "runq"), ("io_ns", "io")])
def test_the_rank_that_waits_least_is_the_straggler_and_its_grown_part_is_the_excess(component, cause):
    ranks = [healthy("n1"), healthy("n2"), healthy("n3")]
    if component == "host_ns":   # host compute is the rest: it simply waits less
        slow = rank("n4", thread(1, sync_ns=0.2, coll_ns=0.05))
    else:
        slow = rank("n4", thread(1, sync_ns=0.2, coll_ns=0.05, **{component: 0.35}))
    ranks.append(slow)
    verdict = model.find_stragglers(ranks, [], OPTS)
    assert [s["rank"].key[0] for s in verdict.stragglers] == ["n4"]
    ex, total = model.excess(slow, ranks[:3], verdict.wait_def)
    assert total == pytest.approx(0.35)
    assert max(ex, key=ex.get) == cause
    assert ex[cause] == pytest.approx(0.35)


def test_what_the_straggler_always_had_above_the_others_is_not_its_excess():
    """A rank pinned to a busy core always queued 10 points more than the others; now its own I/O
    makes it the straggler: the excess is the I/O, not the run queue it always had."""
    others = [healthy("n1"), healthy("n2"), healthy("n3")]
    slow = rank("n4", thread(1, sync_ns=0.2, coll_ns=0.0, runq_ns=0.15, io_ns=0.25))
    baseline = {o.key: o for o in [healthy("n1"), healthy("n2"), healthy("n3")]}
    baseline[slow.key] = rank("n4", thread(1, sync_ns=0.2, coll_ns=0.3, runq_ns=0.1))
    ex, _ = model.excess(slow, others, "blocking")                  # without the baseline: runq counts
    assert ex["runq"] == pytest.approx(0.15)
    ex, total = model.excess(slow, others, "blocking", baseline)
    assert max(ex, key=ex.get) == "io"
    assert ex["runq"] == pytest.approx(0.05) and ex["io"] == pytest.approx(0.25)
    assert total == pytest.approx(0.4 - 0.1)


def test_a_slow_gpu_shows_in_synchronize_with_blocking_collectives():
    ranks = [healthy("n1"), healthy("n2"), healthy("n3"), rank("n4", thread(1, sync_ns=0.55, coll_ns=0.05))]
    verdict = model.find_stragglers(ranks, [], OPTS)
    assert verdict.wait_def == "blocking"
    assert verdict.stragglers[0]["rank"].key[0] == "n4"
    ex, _ = model.excess(ranks[3], ranks[:3], "blocking")
    assert max(ex, key=ex.get) == "sync"


def test_enqueue_style_collectives_wait_in_synchronize():
    """NCCL on a GPU: collectives return at once, the waiters wait in the next synchronize."""
    waiter = lambda n: rank(n, thread(1, sync_ns=0.6, coll_ns=0.001))
    slow = rank("n4", thread(1, sync_ns=0.2, coll_ns=0.001))       # its host side took the time
    ranks = [waiter("n1"), waiter("n2"), waiter("n3"), slow]
    verdict = model.find_stragglers(ranks, [], OPTS)
    assert verdict.wait_def == "enqueue"
    assert verdict.stragglers[0]["rank"].key[0] == "n4"


def test_a_machine_wide_load_step_names_no_one():
    loaded = lambda n: rank(n, thread(1, sync_ns=0.2, coll_ns=0.3, runq_ns=0.2))
    verdict = model.find_stragglers([loaded(f"n{i}") for i in range(4)], [], OPTS)
    assert verdict.stragglers == []


def test_a_small_difference_is_noise_not_a_straggler():
    ranks = [healthy("n1", 0.40), healthy("n2", 0.42), healthy("n3", 0.38), healthy("n4", 0.34)]
    verdict = model.find_stragglers(ranks, [], OPTS)
    assert verdict.stragglers == [] and verdict.rejected


def test_it_must_wait_less_in_most_slices_not_in_one_burst():
    ranks = [healthy("n1"), healthy("n2"), healthy("n3"), healthy("n4", 0.05)]
    burst = [[healthy("n1"), healthy("n2"), healthy("n3"), healthy("n4", 0.05 if i == 0 else 0.4)] for i in range(5)]
    steady = [[healthy("n1"), healthy("n2"), healthy("n3"), healthy("n4", 0.05)] for _ in range(5)]
    assert model.find_stragglers(ranks, burst, OPTS).stragglers == []
    assert model.find_stragglers(ranks, steady, OPTS).stragglers[0]["rank"].key[0] == "n4"


def test_two_slow_nodes_are_both_named_the_slower_first():
    ranks = [healthy("n1", 0.5), healthy("n2", 0.5), healthy("n3", 0.2), healthy("n4", 0.02)]
    verdict = model.find_stragglers(ranks, [], OPTS)
    assert [s["rank"].key[0] for s in verdict.stragglers] == ["n4", "n3"]


def test_a_rank_calling_far_more_often_is_not_in_lockstep():
    ranks = [healthy("n1"), healthy("n2"), healthy("n3"),
             rank("n4", thread(1, calls=1000, sync_ns=0.2, coll_ns=0.05))]
    verdict = model.find_stragglers(ranks, [], OPTS)
    assert verdict.stragglers == [] and "lockstep" in verdict.rejected[0][1]


def mix(launches, collectives, **more):
    """Each rank's kernels and collectives as the aggregates count them: n1..n3 alike, n4 as given."""
    out = {(n, 100): dict(launches=20 * 50, collectives=50) for n in ("n1", "n2", "n3")}
    out[("n4", 100)] = dict(launches=launches, collectives=collectives)
    out.update(more)
    return out


def test_a_rank_doing_more_work_between_the_same_collectives_is_in_lockstep_and_named():
    """It calls CUDA 1.5x as often (more kernels per step), its collectives as often as the others': the
    lockstep test counts the collectives, so it is named — and work_ratio says how much more it does."""
    ranks = [healthy("n1"), healthy("n2"), healthy("n3"),
             rank("n4", thread(1, calls=150, sync_ns=0.45, coll_ns=0.05))]
    verdict = model.find_stragglers(ranks, [], OPTS, mix=mix(30 * 50, 50))
    assert [s["rank"].key[0] for s in verdict.stragglers] == ["n4"], verdict.rejected
    work = model.work_ratio(("n4", 100), [("n1", 100), ("n2", 100), ("n3", 100)], mix(30 * 50, 50))
    assert (work.kernels, work.others_kernels) == (30, 20) and work.ratio == pytest.approx(1.5)
    assert work.threads is None and work.size_ratio == 1.0      # no launch recorded with its grid: count alone


def sized(mix_, key, n, mean, sd):
    """Give a rank of `mix_` n recorded launches of that mean and standard deviation of threads."""
    mix_[key].update(sized=n, threads=mean, threads_sq=sd * sd + mean * mean)
    return mix_


OTHERS = [("n1", 100), ("n2", 100), ("n3", 100)]


def test_the_same_kernels_on_bigger_grids_are_more_work_and_their_size_is_the_ratio():
    """A longer batch: as many kernels per collective as the others, each on 1.5x the threads (every sampled
    launch alike) — 1.5x the work per step, counted from the sizes the launches were recorded with."""
    m = mix(20 * 50, 50)
    for key in OTHERS:
        sized(m, key, 300, 256.0, 0.0)
    work = model.work_ratio(("n4", 100), OTHERS, sized(m, ("n4", 100), 300, 384.0, 0.0))
    assert work.kernels_ratio == pytest.approx(1.0) and work.ratio == pytest.approx(1.5)
    assert (work.threads, work.others_threads, work.sized) == (384.0, 256.0, 300)


def test_kernel_sizes_that_differ_within_their_sampling_or_from_few_launches_are_not_more_work():
    """A mix of small and large kernels (a spread of 4x the mean): 60 sampled launches each put the means 10 %
    apart by chance — no evidence of bigger kernels, so the ratio is the kernel count's alone; and a rank with
    fewer than SIZE_MIN_LAUNCHES sized launches is not sized at all."""
    m = mix(20 * 50, 50)
    for key in OTHERS:
        sized(m, key, 60, 10_000.0, 40_000.0)
    work = model.work_ratio(("n4", 100), OTHERS, sized(m, ("n4", 100), 60, 11_000.0, 40_000.0))
    assert work.ratio == pytest.approx(1.0) and work.threads is None
    m = mix(20 * 50, 50)
    for key in OTHERS:
        sized(m, key, 300, 256.0, 0.0)
    few = sized(m, ("n4", 100), model.SIZE_MIN_LAUNCHES - 1, 512.0, 0.0)
    assert model.work_ratio(("n4", 100), OTHERS, few).ratio == pytest.approx(1.0)


def test_kernel_sizes_read_in_runs_are_judged_by_how_much_their_pieces_differ():
    """explain reads launches in runs (sql.launch_sizes: the first of each piece of the window); with --record-all
    one run may hold a step's small kernels and the next its large ones. 2,048 launches whose 32 pieces' means
    spread 2x apart are far fewer independent draws than 2,048: a 10 % difference is within what the pieces
    say, not bigger kernels; the same difference from pieces that agree is."""
    def with_pieces(m, key, spread):
        sized(m, key, 2048, m_mean[key], 1_000.0)
        mean = m_mean[key]
        m[key].update(pieces=32, piece_mean=mean, piece_mean_sq=mean * mean + (spread * mean) ** 2)
        return m
    for spread, bigger in ((0.5, False), (0.001, True)):
        m = mix(20 * 50, 50)
        m_mean = {k: 10_000.0 for k in OTHERS}
        m_mean[("n4", 100)] = 11_000.0
        for key in OTHERS + [("n4", 100)]:
            with_pieces(m, key, spread)
        work = model.work_ratio(("n4", 100), OTHERS, m)
        assert (work.threads is not None) is bigger, (spread, work)


def test_a_rank_calling_collectives_at_another_rate_is_not_in_lockstep():
    ranks = [healthy("n1"), healthy("n2"), healthy("n3"),
             rank("n4", thread(1, calls=150, sync_ns=0.2, coll_ns=0.05))]
    verdict = model.find_stragglers(ranks, [], OPTS, mix=mix(30 * 50, 75))
    assert verdict.stragglers == [] and "calls collectives ×1.50 as often" in verdict.rejected[0][1]


def test_run_queue_thieves_split_into_own_threads_and_others():
    recent = {("own", 100, "worker"): 3 * S, ("process", 55, "cpuhog"): 1 * S, ("kernel", 9, "kworker/0"): 0}
    baseline = {("own", 100, "worker"): 1 * S}
    growth = model.thief_growth(recent, baseline, 10.0, 10.0)
    assert growth == {("own", 100, "worker"): pytest.approx(0.2 * S), ("process", 55, "cpuhog"): pytest.approx(0.1 * S)}
    own, other = model.split_runq(growth)
    assert own == pytest.approx(2 / 3) and other == pytest.approx(1 / 3)


def test_io_is_another_process_only_when_its_io_dwarfs_the_trainers_and_the_trainers_did_not_grow():
    assert model.classify_io(1 << 20, 1 << 20, 100 << 20, 10, 10) == "io-other"
    assert model.classify_io(50 << 20, 1 << 20, 100 << 20, 10, 10) == "io-self"   # its own I/O grew 50x
    assert model.classify_io(1 << 20, 1 << 20, 1 << 20, 10, 10) == "io-self"


def test_the_cpu_a_rank_spent_copying_its_own_writes_is_its_ios():
    """9 GiB written in 10 s (none in its baseline) took it at least 9/4 s of CPU at 4 GiB/s: 22.5 % of its
    time, host compute to the model, its own I/O's to explain; what it always wrote is no growth."""
    assert model.copy_share(9 << 30, 0, 10, 10, 4 << 30) == pytest.approx(0.225)
    assert model.copy_share(9 << 30, 9 << 30, 10, 10, 4 << 30) == 0.0
    assert model.copy_share(9 << 30, 0, 0, 10, 4 << 30) == 0.0


# ---- NCCL communicators (comms.py)

def _setup(node, op, ts, address, pid=1, ret=0, **kw):
    return dict(node=node, pid=pid, op=op, ts=ts, ret=ret, communicator=address, **kw)


def test_communicators_are_matched_across_nodes_by_id_and_by_parent_and_color():
    from straggler.analysis.explain import comms
    rows = [_setup("a", "ncclCommInitRank", 1, "0xa0", unique_id="0x11", nranks=2, comm_rank=0),
            _setup("b", "ncclCommInitRank", 1, "0xb0", unique_id="0x11", nranks=2, comm_rank=1),
            _setup("a", "ncclCommSplit", 2, "0xa1", parent="0xa0", color=3),
            _setup("b", "ncclCommSplit", 2, "0xb1", parent="0xb0", color=3),
            _setup("a", "ncclCommSplit", 3, "0xa2", parent="0xa1", color=0),      # a split of a split
            _setup("b", "ncclCommInitRank", 4, "0xb9", ret=1, unique_id="0x22", nranks=2, comm_rank=1),   # failed: ignored
            _setup("b", "ncclCommSplit", 5, "0xb5", parent="0xdead", color=1)]    # its parent's set-up unseen
    ids = comms.cluster_ids(rows)
    assert ids[("a", 1, "0xa0")] == ("id 0x11", "ncclCommInitRank", 2, 0)
    assert ids[("b", 1, "0xb0")] == ("id 0x11", "ncclCommInitRank", 2, 1)
    assert ids[("a", 1, "0xa1")][0] == ids[("b", 1, "0xb1")][0] == "id 0x11 / color 3"
    assert ids[("a", 1, "0xa2")][0] == "id 0x11 / color 3 / color 0"
    assert ("b", 1, "0xb9") not in ids
    assert ids[("b", 1, "0xb5")][0] == "0xdead / color 1 on b pid 1"
    assert ids[("b", 1, "0xb5")][1] is None                     # so: not matched across nodes
    # a pointer reused for a later communicator (the first destroyed) is the later one, whatever made it
    again = comms.cluster_ids(rows + [_setup("a", "ncclCommInitRank", 9, "0xa0", unique_id="0x33", nranks=4, comm_rank=2),
                                      _setup("a", "ncclCommInitRank", 10, "0xa1", unique_id="0x44", nranks=2, comm_rank=0)])
    assert again[("a", 1, "0xa0")] == ("id 0x33", "ncclCommInitRank", 4, 2)
    assert again[("a", 1, "0xa1")][0] == "id 0x44"             # the split made there at ts 2 is gone
    assert again[("a", 1, "0xa2")][0] == "id 0x11 / color 3 / color 0"     # resolved when it was made


def test_same_named_communicators_are_told_apart_in_the_order_each_rank_made_them():
    from straggler.analysis.explain import comms
    rows = []
    for n in "ab":
        rows += [_setup(n, "ncclCommInitRank", 1, f"0x{n}0", unique_id="0x11", nranks=2, comm_rank=int(n == "b")),
                 # two groups of the same ranks: one parent, one color (torch colors by the ranks' list)
                 _setup(n, "ncclCommSplit", 2, f"0x{n}1", parent=f"0x{n}0", color=5),
                 _setup(n, "ncclCommSplit", 3, f"0x{n}2", parent=f"0x{n}0", color=5, ret=7),   # non-blocking
                 # NCCL_COMM_ID: every init gets the same fixed magic
                 _setup(n, "ncclCommInitRank", 4, f"0x{n}3", unique_id="0x11", nranks=2, comm_rank=int(n == "b"))]
    ids = comms.cluster_ids(rows)
    for n in "ab":
        assert [ids[(n, 1, f"0x{n}{i}")][0] for i in range(4)] == ["id 0x11", "id 0x11 / color 5",
                                                                   "id 0x11 / color 5 #2", "id 0x11 #2"]
    colls = [dict(node=n, pid=1, communicator=f"0x{n}{i}", op="ncclAllReduce", calls=1, dur_ns=100 * (i + 1))
             for n in "ab" for i in range(4)]
    found = comms.group(rows, colls)
    assert len(found) == 4 and all(len(c.members) == 2 for c in found)
    for c in found:                                              # each member's number is its own pointer's
        assert len({m.dur_ns for m in c.members}) == 1


def test_collectives_grouped_and_where_the_peers_wait():
    from straggler.analysis.explain import comms
    setups = [_setup(n, "ncclCommInitRank", 1, f"0x{n}0", unique_id="0x11", nranks=3, comm_rank=i) for i, n in enumerate("abc")]
    setups += [_setup(n, "ncclCommSplit", 2, f"0x{n}1", parent=f"0x{n}0", color=int(n == "c")) for n in "abc"]
    colls = [dict(node=n, pid=1, communicator=f"0x{n}0", op="ncclAllReduce", calls=10, dur_ns=ns)
             for n, ns in (("a", 100), ("b", 900), ("c", 950))]
    colls += [dict(node=n, pid=1, communicator=f"0x{n}1", op="ncclBroadcast", calls=5, dur_ns=ns)
              for n, ns in (("a", 50), ("b", 2000), ("c", 10))]
    colls += [dict(node="c", pid=1, communicator="0xc9", op="ncclSend", calls=1, dur_ns=5)]     # set-up unseen
    found = comms.group(setups, colls, ranks={("a", 1): 0, ("b", 1): 1, ("c", 1): 2})
    by = {c.cid: c for c in found}
    assert set(by) == {"id 0x11", "id 0x11 / color 0", "id 0x11 / color 1", "0xc9 on c pid 1"}
    assert [m.node for m in by["id 0x11"].members] == ["a", "b", "c"] and by["id 0x11"].nranks == 3
    assert [m.node for m in by["id 0x11 / color 0"].members] == ["a", "b"]
    assert not by["0xc9 on c pid 1"].matched and by["id 0x11"].matched
    assert found[0].cid == "id 0x11 / color 0"                  # the busiest first
    c, others, mine = comms.where_waited(found, ("a", 1), wall_ns=10_000)
    assert (c.cid, others, mine) == ("id 0x11 / color 0", 2000, 50)   # b waited 2000 in the pair, 925 in the world
    assert comms.where_waited(found, ("z", 1), wall_ns=10_000) is None
    # a wait that is no real part of the window (collectives that only enqueue) names no communicator
    assert comms.where_waited(found, ("a", 1), wall_ns=10_000_000) is None
    # nor one the straggler itself spends as long in (c: 950 in the world, its peers 500)
    assert comms.where_waited(found, ("c", 1), wall_ns=10_000) is None


def test_behind_enqueued_collectives_the_one_rank_with_more_work_is_pointed_at_and_nobody_drained():
    """Every rank waits alike in synchronize (collectives that only enqueue: nobody can be named), and n4
    launches 1.5x the kernels per collective: the device-wide warning says that rank's GPU, doing more work, is
    likely the one the others wait for, and sends the operator to its work before the GPUs — never to drain
    it. Ranks doing more work on two nodes, or a rank calling its collectives at another rate (another rhythm
    or communicator group: its kernels per collective are no measure against the others'), point at nobody."""
    from types import SimpleNamespace
    from straggler.analysis.explain import findings
    grown = [(n, 0.40, 0.62) for n in ("n1", "n2", "n3", "n4")]
    ranks = [healthy("n1"), healthy("n2"), healthy("n3"), healthy("n4")]
    ctx = SimpleNamespace(ranks=ranks, mix=mix(30 * 50, 50), mopts=OPTS, mix_sql="SELECT 2", sizes_sql="SELECT 3")
    heavier = findings._heavier(ctx)
    assert heavier.who == "n4 (pid 100)" and heavier.work.ratio == pytest.approx(1.5)
    wide = findings.device_wide_warning(grown, "SELECT 1", heavier=heavier)
    assert "n4 (pid 100) launches ×1.50 the work" in wide.summary and "not a slower GPU" in wide.summary
    assert wide.recommendation.startswith("first see whether n4 (pid 100) does more work")
    assert "do not drain" in wide.recommendation and wide.numbers["heavier_rank"] == "n4 (pid 100)"
    assert wide.numbers["launches_per_collective"] == 30 and wide.numbers["work_ratio"] == 1.5
    assert wide.node is None and wide.sql["call_mix"] == "SELECT 2"
    both = mix(30 * 50, 50)
    both[("n3", 100)] = dict(launches=30 * 50, collectives=50)
    assert findings._heavier(SimpleNamespace(ranks=ranks, mix=both, mopts=OPTS, mix_sql="", sizes_sql="")) is None
    apart = mix(30 * 25, 25)                # n4: the same kernels per step, but half the collectives
    assert findings._heavier(SimpleNamespace(ranks=ranks, mix=apart, mopts=OPTS, mix_sql="", sizes_sql="")) is None
    plain = findings.device_wide_warning(grown, "SELECT 1", heavier=None)
    assert "launches" not in plain.summary and plain.recommendation.startswith("compare the GPUs directly")


def test_the_ranks_of_one_node_doing_more_work_are_pointed_at_together():
    """A pipeline stage over the two ranks of one node: both launch 1.5x the kernels per collective."""
    from types import SimpleNamespace
    from straggler.analysis.explain import findings
    ranks = [rank(n, thread(1, sync_ns=0.2, coll_ns=0.4), rank_no=i) for i, n in enumerate(("n1", "n2", "n3"))]
    ranks += [steptime.rank_time(("n3", 101), [thread(1, sync_ns=0.2, coll_ns=0.4)], int(S), 3)]
    m = {(n, 100): dict(launches=20 * 50, collectives=50) for n in ("n1", "n2")}
    m[("n3", 100)] = m[("n3", 101)] = dict(launches=30 * 50, collectives=50)
    heavier = findings._heavier(SimpleNamespace(ranks=ranks, mix=m, mopts=OPTS, mix_sql="SELECT 2", sizes_sql=""))
    assert heavier.who == "n3 (rank 2, rank 3)" and not heavier.one
    assert "n3 (rank 2, rank 3) launch up to ×1.50 the work" in findings.heavier_warning(heavier).summary


def test_nobody_named_behind_enqueued_collectives_still_points_at_the_rank_with_more_work():
    """A job whose ranks all wait in synchronize (collectives that only enqueue) from its first step, no
    baseline to show it grew: nobody is named, and a warning (no node) says n4 launches 1.5x the work per
    collective — the rank to look at, its work and not its GPU. The same ranks waiting in their collectives
    (blocking: a rank with more work would have been named if it held the others back) get no such warning."""
    from types import SimpleNamespace
    from straggler.analysis.explain import findings
    from straggler.analysis.explain.report import Report

    def ctx_of(wait_def, **waits):
        ranks = [rank(n, thread(1, **waits)) for n in ("n1", "n2", "n3", "n4")]
        return SimpleNamespace(ranks=ranks, mix=mix(30 * 50, 50), mopts=OPTS, baseline={}, threads_sql="SELECT 1",
                               mix_sql="SELECT 2", sizes_sql="SELECT 3", verdict=model.Verdict(),
                               job_wait_def=wait_def)

    report = Report()
    findings.no_straggler_findings(report, ctx_of("enqueue", sync_ns=0.8, coll_ns=0.01))
    (warning,) = [f for f in report.findings if f.severity == "warning"]
    assert warning.cause == "more-work" and warning.node is None and report.straggler is None
    assert warning.summary.startswith("nobody can be named") and "n4 (pid 100) launches ×1.50 the work" in warning.summary
    assert "do not drain" in warning.recommendation and warning.sql == {"call_mix": "SELECT 2"}
    report = Report()
    findings.no_straggler_findings(report, ctx_of("blocking", sync_ns=0.1, coll_ns=0.6))
    assert not [f for f in report.findings if f.severity == "warning"], report.findings


def test_a_slower_gpu_says_the_same_work_only_where_its_kernels_were_counted_and_sized():
    """gpu-slow's word on the work: 'the same work' only when its kernels were counted and their sizes
    compared; kernels counted but not sized leave bigger kernels open; less work is said as such; kernels not
    counted at all leave more work open."""
    from types import SimpleNamespace
    from straggler.analysis.explain import findings
    ranks = [healthy("n1"), healthy("n2"), healthy("n3"), healthy("n4")]
    ctx = SimpleNamespace(ranks=ranks, mix=mix(20 * 50, 50), mopts=OPTS)
    others = ranks[:3]
    assert "cannot be told from a slower GPU" in findings._same_work_text(ctx, ranks[3], others, None)
    unsized = findings._same_work_text(ctx, ranks[3], others, model.Work(20, 20))
    assert "sizes not compared" in unsized and unsized.endswith("slower — unless its kernels are bigger")
    same = findings._same_work_text(ctx, ranks[3], others, model.Work(20, 20, sized=300))
    assert "of the same size as far as 300" in same and same.endswith("the same work (×1.00), slower")
    less = findings._same_work_text(ctx, ranks[3], others, model.Work(20, 20, threads=128, others_threads=256, sized=300))
    assert less.endswith("less work (×0.50), and still slower")
