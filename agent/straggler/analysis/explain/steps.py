"""The job step by step: each rank's collective calls lined up, one sync point at a time, and what the job
lost at each to its slowest rank — what if every rank had taken the median rank's time there?

In a synchronous job every rank of a collective waits in it for the last one to arrive, and they all
leave together: the calls of one collective end at the same moment on every rank (the fleet's one
timeline), and a rank's wait in it is how much earlier than the last one it came. So at each collective
the slowest rank is the one that waited least, and the job lost `median wait - least wait` to it: had
that rank taken the median rank's time, everyone would have left that much sooner. Summed over the
trace, that is the job's time lost to its slowest ranks, whoever they were — a straggler's episodes, a
rank's pauses, and imbalance that moves from rank to rank (uneven batches, a different rank slowest at
each step), which names no node and costs the job all the same.

The agent records every collective call (WHY_COLL) and every outermost synchronize (WHY_SYNC). Calls that
only enqueue (NCCL on GPUs) return at once: there a rank waits for its peers in the first synchronize after
it enqueued a collective (the synchronize waits for the collective, which ends when the last rank's part has
come), so those synchronize calls are the sync points (sync_points), and a rank's wait is from its collective
call to its synchronize's end. That is the hosts' view: a rank whose host came late to its collective is the
slowest there, but a GPU that falls behind while its host runs ahead holds every rank's synchronize alike,
and what it costs is not seen. Pure functions over rows, and `measure`, which reads
them; nothing here names a straggler.
"""
import bisect
import statistics
from dataclasses import dataclass, field

from ...probes.symbols import COLLECTIVE_OPS, STEP_OPS, SYNC_OPS
from . import sql

MAX_ROWS = 400_000             # collective (and synchronize) calls read at most (then: not measured, said so)
MIN_RECORDED = 0.8             # the recorded calls are every call (the kernel's count) within this much
MIN_STEADY = 0.6               # ... and each rank's calls keep their place in the reference rank's order (line_up)
MIN_SHARE_OF_CALLS = 0.1       # a process with fewer collectives than this share of the ranks' median is no rank of
                               # this job's rhythm (one that ended or began at the span's edge): left out
MIN_STEPS = 10                 # sync points lined up at least


@dataclass
class Steps:
    """The job's sync points, lined up: for each, where it ended (fleet ns) and every rank's wait in it."""
    keys: list                                   # [(node, pid)]
    ends: list = field(default_factory=list)     # [fleet ns] per sync point
    waits: list = field(default_factory=list)    # [{key: wait ns}] per sync point
    why_not: str = None                          # why the steps could not be lined up (then no sync points)
    waited_in: str = "collectives"               # where the ranks wait at them: collectives, or synchronize
    sql: dict = field(default_factory=dict)


def line_up(calls):
    """{key: [(end_ns, wait_ns)] in time order} -> (ends, [{key: wait_ns}], deviation per key): each rank's
    calls matched to the reference rank's (the one with the most calls) by their end — less the rank's usual
    offset from it (its clock), within half the median spacing; a call that ended later than that (its rank
    got its CPU back late, on a busy machine) takes the place its neighbours' order gives it (the same shift of
    index as the call before it, or after). Only sync points every rank has are kept. `steady`: the share of
    a rank's calls matched by their end whose shift of index is the one before it — near 1 when they are the
    same collectives (a call missed changes it once), low when they are not (another rhythm)."""
    keys = [k for k in calls if calls[k]]
    if len(keys) < 2:
        return [], [], {}
    ref = max(keys, key=lambda k: (len(calls[k]), k))
    ends = [e for e, _ in calls[ref]]
    spacing = statistics.median([b - a for a, b in zip(ends, ends[1:])]) if len(ends) > 1 else 0
    if spacing <= 0:
        return [], [], {}
    at = [{ref: w} for _, w in calls[ref]]
    steady = {ref: 1.0}
    for k in keys:
        if k == ref:
            continue
        near = []
        for i, (end, _) in enumerate(calls[k]):
            j = bisect.bisect_left(ends, end)
            best = min((x for x in (j - 1, j) if 0 <= x < len(ends)), key=lambda x: abs(ends[x] - end))
            near.append((best - i, end - ends[best]))
        center = statistics.median(d for _, d in near)
        shifts = [shift if abs(d - center) < spacing / 2 else None for shift, d in near]
        known = [x for x in shifts if x is not None]
        steady[k] = sum(a == b for a, b in zip(known, known[1:])) / max(1, len(known) - 1)
        for order in (range(len(shifts)), reversed(range(len(shifts)))):     # each gap from its neighbours
            last = None
            for i in order:
                if shifts[i] is None:
                    shifts[i] = last
                else:
                    last = shifts[i]
        for i, (_, wait) in enumerate(calls[k]):
            j = None if shifts[i] is None else i + shifts[i]
            if j is not None and 0 <= j < len(ends) and k not in at[j]:
                at[j][k] = wait
    full = [i for i, w in enumerate(at) if len(w) == len(keys)]
    return [ends[i] for i in full], [at[i] for i in full], steady


def lost(waits):
    """What the job lost at one sync point ({key: wait ns}) to its slowest rank: the median wait less the
    least (had that rank taken the median rank's time, everyone would have left that much sooner) ->
    (lost ns, the slowest rank's key)."""
    slowest = min(waits, key=waits.get)
    return max(0, statistics.median(waits.values()) - waits[slowest]), slowest


def _outermost(rows):
    """The rows (in time order) less each synchronize inside another on its thread: the driver's call inside
    the runtime's, with both libraries traced, is the same wait."""
    outer_end = {}
    for r in rows:
        if r["op"] in SYNC_OPS:
            tid, start = r.get("tid"), int(r["start_ns"])
            if start < outer_end.get(tid, start):
                continue
            outer_end[tid] = int(r["end_ns"])
        yield r


def synchronize_calls(rows):
    """How many synchronize calls the rows hold, one inside another counted once (the agent records the
    outermost: are they all recorded?)."""
    return sum(1 for r in _outermost(rows) if r["op"] in SYNC_OPS)


def sync_points(rows):
    """One rank's sync points with collectives that only enqueue: from its collective and synchronize calls
    in time order (dicts: op, tid, start_ns, end_ns), the first synchronize that began after it enqueued a
    collective -> [(its end, (its end, the start of the rank's last collective call before it))], in the
    order they end. A synchronize inside another is counted once (_outermost); one that follows no
    collective (a rank waiting for its own kernels) is no sync point. The rank's wait there (measure) runs
    from that collective call to the synchronize's end."""
    out, enqueued_at = [], None
    for r in _outermost(rows):
        if r["op"] not in SYNC_OPS:
            enqueued_at = int(r["start_ns"])
        elif enqueued_at is not None:
            out.append((int(r["end_ns"]), (int(r["end_ns"]), enqueued_at)))
            enqueued_at = None
    return sorted(out)


def measure(runner, series):
    """The Steps of the series' ranks over its span, or Steps with why_not."""
    keys = sorted(series.ranks)
    enqueue = series.wait_def == "enqueue"
    out = Steps(keys=keys, waited_in="synchronize" if enqueue else "collectives")
    ops = STEP_OPS if enqueue else COLLECTIVE_OPS
    end = series.bin_start(series.n_bins)
    ranges = [(node, pid, series.to_node(node, series.t0_ns), series.to_node(node, end), series.clocks[node].offset_ns)
              for node, pid in keys]
    out.sql = {"step_calls": sql.step_calls(ranges, ops, MAX_ROWS + 1).strip(),
               "step_counts": sql.step_counts(ranges, ops).strip()}
    rows = runner.rows(out.sql["step_calls"])
    if len(rows) > MAX_ROWS:
        out.why_not = f"more than {MAX_ROWS:,} collective and synchronize calls in the span: not lined up in one read"
        return out
    counted, syncs_counted = {}, {}
    for r in runner.rows(out.sql["step_counts"]):
        key, n = (r["node"], int(r["pid"])), int(r["calls"] or 0)
        if r["op"] in SYNC_OPS:        # (the runtime's synchronize calls the driver's: the most-called one)
            syncs_counted[key] = max(syncs_counted.get(key, 0), n)
        else:
            counted[key] = counted.get(key, 0) + n
    by_key = {}
    for r in rows:
        by_key.setdefault((r["node"], int(r["pid"])), []).append(r)
    calls = {}
    usual = statistics.median([counted.get(k, 0) for k in keys]) if keys else 0
    keys = [k for k in keys if counted.get(k, 0) >= max(MIN_STEPS, MIN_SHARE_OF_CALLS * usual)]
    out.keys = keys
    if len(keys) < 2:
        out.why_not = f"fewer than two ranks called {MIN_STEPS} collectives or more in the span: no steps to line up"
        return out
    for key in keys:
        mine = by_key.get(key, [])
        colls = [r for r in mine if r["op"] not in SYNC_OPS]
        syncs = synchronize_calls(mine) if enqueue else 0
        if len(colls) < MIN_RECORDED * counted[key] or syncs < MIN_RECORDED * syncs_counted.get(key, 0):
            what, n, of = (("collective", len(colls), counted[key]) if len(colls) < MIN_RECORDED * counted[key]
                           else ("synchronize", syncs, syncs_counted[key]))
            out.why_not = (f"{key[0]} (pid {key[1]}): {n:,} of its {of:,} {what} calls recorded (an agent that does "
                           f"not record every one: an older version, or --no-collective-rows)")
            return out
        if enqueue:
            calls[key] = sync_points(mine)
            if len(calls[key]) < MIN_STEPS:
                out.why_not = (f"{key[0]} (pid {key[1]}): {len(calls[key])} synchronize calls after its collectives: "
                               f"a rank that waits for them in no traced synchronize has no sync points to line up")
                return out
        else:
            main = statistics.mode(r["communicator"] for r in colls)      # the communicator it calls most
            calls[key] = sorted((int(r["end_ns"]), int(r["wait_ns"])) for r in colls if r["communicator"] == main)
    out.ends, out.waits, steady = line_up(calls)
    if enqueue:
        # each rank's wait: from its collective call to its synchronize's end, as a blocking call's would be,
        # but never from before the collective was done: a synchronize that ended before most ranks' (another
        # thread's, between its collective and its own) ends where theirs did (their median)
        out.waits = [{k: max(end, done) - called for k, (end, called) in w.items()}
                     for w in out.waits for done in [statistics.median(end for end, _ in w.values())]]
    off = [k for k, share in steady.items() if share < MIN_STEADY]
    if off or len(out.waits) < MIN_STEPS:
        out.why_not = ("the ranks' " + ("synchronize calls after their collectives" if enqueue else "collectives")
                       + " do not line up"
                       + (f" ({off[0][0]}: {steady[off[0]]:.0%} of its calls keep their place in the others' order: "
                          f"ranks in different groups, or clocks that drift)" if off else ""))
        out.ends, out.waits = [], []
    return out


@dataclass
class WhatIf:
    """The job's time lost at its sync points, split by what lost it."""
    span_s: float
    sync_points: int
    lost_s: float
    parts: list            # [dict(what, node, ranks, lost_s)]: each episode, and the rest (imbalance and jitter)
    imbalance: dict        # the rest: lost_s, share of the span, the ranks it fell on most ({rank key: sync points})

    @property
    def lost_ratio(self):
        return self.lost_s / self.span_s if self.span_s else 0.0


def whatif(steps, episodes, span_ns):
    """The what-if of the whole span: each sync point's loss (lost) given to the episode of its slowest rank's
    node that holds it (episodes: [(label dict, node, [keys], start_ns, end_ns)]), the rest to imbalance and
    jitter (who was slowest there, counted). -> WhatIf, or None without sync points."""
    if not steps.waits:
        return None
    parts = [dict(e, lost_ns=0) for e, *_ in episodes]
    rest_ns, rest_by = 0, {}
    for end, waits in zip(steps.ends, steps.waits):
        ns, slowest = lost(waits)
        owner = next((i for i, (_, node, keys, lo, hi) in enumerate(episodes)
                      if lo <= end <= hi and slowest in keys), None)
        if owner is None:
            rest_ns += ns
            if ns > 0:                 # (all alike: nobody was slowest)
                rest_by[slowest] = rest_by.get(slowest, 0) + 1
        else:
            parts[owner]["lost_ns"] += ns
    total = sum(p["lost_ns"] for p in parts) + rest_ns
    for p in parts:
        p["lost_s"] = round(p.pop("lost_ns") / 1e9, 2)
    imbalance = dict(lost_s=round(rest_ns / 1e9, 2), sync_points=sum(rest_by.values()),
                     slowest=sorted(((k, n) for k, n in rest_by.items()), key=lambda kn: -kn[1]))
    return WhatIf(span_s=span_ns / 1e9, sync_points=len(steps.waits), lost_s=total / 1e9, parts=parts,
                  imbalance=imbalance)
