"""Where to look in a long trace: the minutes its roll-ups (store.rollup) say something changed in,
so that explain reads thread_time at its own interval only there, and a day of a large job costs a
read of its roll-ups plus those minutes, not of every summary (the segmentation, the model and the
findings then run on each stretch as on a short trace: engine.py).

Per node and minute (per rank when the job has fewer than MIN_NODES nodes), a minute is looked at
closer when
  - the node's least-waiting rank waited less in its least-waiting 10 s than the typical node's (the
    others wait more while it straggles, so their least-waiting part lies elsewhere), and its rank with
    the least in its most-waiting 10 s waited less than the typical node's too (a node whose minute only
    partly holds a change of the whole job, its clock's minutes being out of step with the others', has
    a low part, but its most-waiting parts are the others'): each by more than it usually does, by at
    least a third of min_gap and by NOISE_K times its own spread. A 10-s straggle, a fault that comes
    and goes, the start of a long one;
  - or a rank of it waited less than the typical node's over the minute by min_gap (straggling all along);
or when the job's step rate in its slowest 10-s part fell by that third below its typical minute (a
slowdown nobody waits less in: a GPU's own word may say whose, devices.py).
Each such minute is looked at with MARGIN_MINUTES either side (the clean time its episode is measured
against), overlapping ones as one stretch; with the parts of the trace not rolled up (the minute an
agent is writing; the time before a store had roll-ups). A stretch of a job of many nodes reads the
ranks of the nodes that changed in it and a panel of PANEL_NODES others, spread over the job, to measure
them against; of a smaller job, every rank.

Pure but for the queries of plan(); decides nothing about stragglers.
"""
import statistics
from dataclasses import dataclass, field

from ...store import rollup
from . import sql, timeline

CANDIDATE_SHARE = 1 / 3        # of min_gap: a change this large in a 10-s part marks its minute
NOISE_K = 4.0                  # ... and larger than this many times the rank's own minutes vary
MARGIN_MINUTES = 1             # minutes looked at around a marked one
PANEL_NODES = 8                # the other nodes a stretch of a large job measures its changed ones against
FINE_BUDGET = 4                # stretches may read this many series' budgets (timeline.MAX_SERIES_ROWS) in all
COVERED = 0.9                  # a minute counts for a rank when its summaries cover this much of it
COARSE_ROWS = 400_000          # rows (nodes x minutes) one query of the roll-ups answers (more nodes: more queries)
MIN_NODES = 3                  # fewer nodes: each rank is measured against the typical rank, not its node


@dataclass
class Stretch:
    """A stretch of the trace to read at the summaries' own interval: [lo_ns, hi_ns) on the fleet
    timeline, the ranks to read, and why."""
    lo_ns: int
    hi_ns: int
    keys: list
    changed: set = field(default_factory=set)      # the nodes that changed in it
    why: list = field(default_factory=list)        # ("dip" | "gap" | "job-rate" | "not rolled up", minute)


@dataclass
class Plan:
    """The stretches of a long trace, in time order, and what they came from."""
    stretches: list
    callers: object                # timeline.Callers of the whole trace
    clocks: dict
    t0_ns: int
    t1_ns: int
    minutes: int
    bin_ns: int
    wait_def: str
    sql: str
    callers_sql: str
    caller_rows: list = field(default_factory=list)   # sql.ROLLUP_CALLERS' answer
    trace_first: dict = field(default_factory=dict)   # (node, pid) -> its first summary's start (thread_time)
    trace_last: dict = field(default_factory=dict)    # (node, pid) -> its last summary's end (thread_time)
    marked: int = 0                # minutes marked


def available(runner):
    """Whether the store has roll-ups to read (an agent or merge older than them does not)."""
    present = runner.rows(sql.HAS_ROLLUPS)
    if not present or not all(r["present"] for r in present):
        return False
    return any(r["n"] for r in runner.rows(sql.ANY_ROLLUP))


def too_long(callers, clocks):
    """Whether reading the whole trace at its summaries' interval would pass the series' budget (then
    timeline.choose_bin would widen its bins)."""
    if not callers.keys:
        return False
    t0 = min(callers.first[k] + clocks[k[0]].offset_ns for k in callers.keys)
    t1 = max(callers.last[k] + clocks[k[0]].offset_ns for k in callers.keys)
    interval = max(callers.interval_of[k] for k in callers.keys)
    return timeline.choose_bin(interval, t1 - t0, len(callers.keys)) > interval


def _median(values):
    return statistics.median(values) if values else None


def plan(runner, callers, rolled_to, clocks, min_gap, trace_first, trace_last, wait_def):
    """The Plan of a long trace from its roll-ups, or None when the stretches would not fit FINE_BUDGET
    (a change all along, or roll-ups that start long after the trace: the whole trace is then read at
    wider bins, as without roll-ups). callers: timeline.Callers from sql.ROLLUP_CALLERS; rolled_to:
    {(node, pid): where its roll-ups end}; trace_first, trace_last: {(node, pid): its first summary's
    start, its last one's end} from thread_time; wait_def: the job's."""
    keys, R = callers.keys, rollup.ROLLUP_NS
    off = {n: c.offset_ns for n, c in clocks.items()}
    t0 = min(min(callers.first[k], trace_first.get(k, callers.first[k])) + off[k[0]] for k in keys) // R * R
    t1 = max(max(callers.last[k], trace_last.get(k, 0)) + off[k[0]] for k in keys)
    n = max(1, -(-(t1 - t0) // R))
    nodes = sorted({k[0] for k in keys})
    by_rank = len(nodes) < MIN_NODES                # too few nodes to tell one from the typical: each rank
    texts, per = [], {}                            # unit (a node, or a rank) -> {minute: row}
    step = max(1, COARSE_ROWS // n)                # nodes per query
    for i in range(0, len(nodes), step):
        chunk = set(nodes[i:i + step])
        texts.append(sql.rollup_units({k: callers.calling[k] for k in keys if k[0] in chunk}, wait_def, by_rank))
        for r in runner.rows(texts[-1]):
            unit = (r["node"], int(r["pid"])) if by_rank else r["node"]
            b = (int(r["ts"]) // R * R + R // 2 + off.get(r["node"], 0) - t0) // R
            if 0 <= b < n:
                per.setdefault(unit, {})[b] = r
    # each unit's minutes that its ranks there cover
    lo_of, hi_of, mean_of = {}, {}, {}
    by_bin_lo, by_bin_hi, by_bin_mean, by_bin_rate = ([[] for _ in range(n)] for _ in range(4))
    for unit, bins in per.items():
        lo_of[unit], hi_of[unit], mean_of[unit] = los, his, means = {}, {}, {}
        for b, r in bins.items():
            lo, hi, mean = r["lo"], r["hi"], r["wait"]
            if (r["wall_ns"] or 0) < COVERED * R * (r["ranks"] or 1) or lo is None or hi is None or mean is None:
                continue
            los[b], his[b], means[b] = lo, hi, mean
            by_bin_lo[b].append(lo)
            by_bin_hi[b].append(hi)
            by_bin_mean[b].append(mean)
            if r["rate_lo"] is not None:
                by_bin_rate[b].append(r["rate_lo"])
    lo_med = [_median(v) for v in by_bin_lo]
    hi_med = [_median(v) for v in by_bin_hi]
    mean_med = [_median(v) for v in by_bin_mean]
    rate_med = [_median(v) for v in by_bin_rate]
    floor = min_gap * CANDIDATE_SHARE
    marked = {}                                    # bin -> (nodes changed, why)
    for unit in per:
        # how much less than the typical node (rank) its least-waiting rank waited in its least-waiting
        # 10 s (the others wait more while it straggles, so their least-waiting part lies outside it), and
        # its rank with the least in its most-waiting 10 s (a node whose minute only partly holds a change
        # of the whole job has a low part, but its ranks' most-waiting parts are the others')
        low = _rises({b: lo_med[b] - v for b, v in lo_of[unit].items()}, floor)
        high = _rises({b: hi_med[b] - v for b, v in hi_of[unit].items()}, floor)
        means = mean_of[unit]
        for b in lo_of[unit]:
            why = "dip" if b in low and b in high else "gap" if mean_med[b] - means[b] >= min_gap else None
            if why:
                entry = marked.setdefault(b, (set(), []))
                entry[0].add(unit[0] if by_rank else unit)
                entry[1].append(why)
    rates = {b: r for b, r in enumerate(rate_med) if r}
    if rates:                          # the job's step rate fell: its drop rises (floor: that share of its rate)
        for b in _rises({b: -r for b, r in rates.items()}, floor * statistics.median(rates.values())):
            marked.setdefault(b, (set(), []))[1].append("job-rate")
    spans = [(max(0, b - MARGIN_MINUTES), min(n, b + MARGIN_MINUTES + 1), b) for b in sorted(marked)]
    # the parts not rolled up, per rank: before its roll-ups start (a store older than them), and from
    # where they end to its last summary (the minute an agent is writing)
    for key in keys:
        first, rolled, last = trace_first.get(key), rolled_to.get(key), trace_last.get(key)
        if first is not None and first < callers.first[key] - R:
            spans.append((0, min(n, (callers.first[key] + off[key[0]] - t0) // R + MARGIN_MINUTES + 1), None))
        if rolled is not None and last is not None and last > rolled:
            lo = (rolled + off[key[0]] - t0) // R
            spans.append((max(0, lo - MARGIN_MINUTES), n, None))
    merged = []
    for lo, hi, b in sorted(spans, key=lambda s: s[0]):
        if merged and lo <= merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], hi), last[2] + [b])
        else:
            merged.append((lo, hi, [b]))
    interval = max(callers.interval_of[k] for k in keys)
    per_rank_budget = timeline.MAX_SERIES_ROWS // timeline.HELPERS_PER_RANK
    stretches, cost = [], 0
    for lo, hi, minutes in merged:
        changed = set().union(*(marked[b][0] for b in minutes if b is not None)) if minutes else set()
        why = [(w, b) for b in minutes if b is not None for w in marked[b][1]] + \
              [("not rolled up", None) for b in minutes if b is None]
        bins = (hi - lo) * R // interval
        ranks = ranks_for(keys, changed)
        cost += bins * len(ranks)
        stretches.append(Stretch(lo_ns=t0 + lo * R, hi_ns=min(t1, t0 + hi * R), keys=ranks, changed=changed, why=why))
    if cost > FINE_BUDGET * per_rank_budget:
        return None
    return Plan(stretches=stretches, callers=callers, clocks=clocks, t0_ns=t0, t1_ns=t1, minutes=n, bin_ns=R,
                wait_def=wait_def, sql="\n".join(texts), callers_sql=sql.ROLLUP_CALLERS, trace_first=trace_first,
                trace_last=trace_last, marked=len(marked))


def _rises(values, floor):
    """The bins where values ({bin: value}) exceed their median by floor and by NOISE_K times their
    spread (a robust one: 1.4826 x the median absolute deviation)."""
    if len(values) < 3:
        return set()
    level = statistics.median(values.values())
    spread = 1.4826 * statistics.median(abs(v - level) for v in values.values())
    threshold = max(floor, NOISE_K * spread)
    return {b for b, v in values.items() if v - level >= threshold}


def ranks_for(keys, changed):
    """Every rank of a job of few nodes (PANEL_NODES besides the changed ones), else the ranks of the
    changed nodes and of PANEL_NODES others spread evenly over the job (all their ranks: a node-wide
    cause shows on all of them)."""
    nodes = sorted({k[0] for k in keys})
    if len(nodes) <= PANEL_NODES + len(changed):
        return list(keys)
    others = [nd for nd in nodes if nd not in changed]
    step = max(1, len(others) // PANEL_NODES)
    panel = set(others[::step][:PANEL_NODES]) | set(changed)
    return [k for k in keys if k[0] in panel]
