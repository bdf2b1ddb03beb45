"""An episode seen closer than its bins: each rank's wait for its peers every SUB_NS, from the calls the
agent recorded (a call that waited goes off CPU, and a call that went off CPU always gets a row), so a
fault that comes and goes faster than the summaries can still be told apart from a steady one, with its
period and its duty, and the episode's edges placed to a fraction of a second.

The wait per rank is the time in its recorded collective calls (and, when the ranks wait for each
other in synchronize — collectives that only enqueue —, in its synchronize calls), spread over the
sub-bins each call covers; the gap is the others' median wait minus the straggler's. Pure functions
over rows, and the SQL beside them; decides nothing about who or why.
"""
import statistics

from ...probes.symbols import OP_CLASS
from ...text import sql_quote
from .sql import values_cte

SUB_NS = 100_000_000           # 100 ms
ZOOM_MAX_NS = 120_000_000_000  # an episode is looked at closely over at most its first 2 minutes
MARGIN_NS = 3_000_000_000      # ... and this much before and after it
MAX_ROWS = 300_000
MIN_FLICKER_SUBS = 3           # on/off runs shorter than this (300 ms) are merged into their neighbours
MIN_CYCLES = 3                 # on-runs an intermittent episode shows at least
MIN_OFF_NS = 500_000_000       # ... with off-runs of at least this (median)
MAX_DUTY = 0.85
MAX_CYCLE_SPREAD = 0.5         # cycle lengths' coefficient of variation at most this: a regular pattern


def wait_ops(wait_def):
    """The calls whose time counts as waiting for peers under a wait definition."""
    classes = ("collective",) if wait_def == "blocking" else ("collective", "sync")
    return sorted(op for op, cls in OP_CLASS.items() if cls in classes and not op.startswith(("ncclComm", "ncclGroupS")))


def calls_sql(callers, offsets, t0_ns, t1_ns, wait_def):
    """The recorded waiting calls of each rank's calling thread between fleet times t0 and t1 (a node's
    ts plus its clock offset): node, pid, fleet ts, duration."""
    rows = [(node, pid, tid, offsets.get(node, 0)) for (node, pid), tid in sorted(callers.items())]
    ops = ", ".join(sql_quote(op) for op in wait_ops(wait_def))
    return f"""
WITH {values_cte("rk", ("node", "pid", "tid", "off"), rows)}
SELECT e.node, e.pid, e.ts + rk.off AS fleet_ts, e.duration
FROM rk
JOIN events e ON +e.node = rk.node AND +e.pid = rk.pid AND +e.tid = rk.tid
WHERE e.source IN ('nccl', 'cuda', 'driver') AND e.op IN ({ops})
  AND e.ts >= {int(t0_ns)} - rk.off - 60000000000 AND e.ts < {int(t1_ns)} - rk.off
  AND e.ts + e.duration + rk.off > {int(t0_ns)}
ORDER BY e.node, e.pid, e.ts
LIMIT {MAX_ROWS}"""


def waits_per_sub(rows, t0_ns, n_subs, sub_ns=SUB_NS):
    """{(node, pid): [share of each sub-bin spent in a waiting call]} from calls_sql rows."""
    out = {}
    for r in rows:
        key = (r["node"], int(r["pid"]))
        acc = out.setdefault(key, [0.0] * n_subs)
        start, end = int(r["fleet_ts"]), int(r["fleet_ts"]) + int(r["duration"] or 0)
        first, last = max(0, (start - t0_ns) // sub_ns), min(n_subs - 1, (end - t0_ns) // sub_ns)
        for b in range(int(first), int(last) + 1):
            lo, hi = t0_ns + b * sub_ns, t0_ns + (b + 1) * sub_ns
            overlap = min(hi, end) - max(lo, start)
            if overlap > 0:
                acc[b] += overlap / sub_ns
    return {k: [min(1.0, x) for x in v] for k, v in out.items()}


def fine_gaps(waits, lead):
    """The others' median wait minus the lead rank's, per sub-bin (None without the lead or others)."""
    if lead not in waits:
        return []
    others = [v for k, v in waits.items() if k != lead]
    if not others:
        return []
    return [statistics.median(o[b] for o in others) - waits[lead][b] for b in range(len(waits[lead]))]


def _runs(flags):
    out, start = [], None
    for i, f in enumerate(flags):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(flags)))
    return out


def on_off(gaps, min_gap):
    """[(start, end)] sub-bins where the lead rank straggles: the gap above half its high level (at least
    min_gap / 2), smoothed over three sub-bins, with flickers shorter than MIN_FLICKER_SUBS merged."""
    if not gaps:
        return []
    smooth = [statistics.median(gaps[max(0, i - 1):i + 2]) for i in range(len(gaps))]
    high = sorted(smooth)[int(0.9 * (len(smooth) - 1))]
    threshold = max(min_gap / 2, high / 2)
    flags = [g >= threshold for g in smooth]
    for value in (False, True):        # close short gaps, then drop short blips
        for s, e in _runs([f == value for f in flags]):
            if e - s < MIN_FLICKER_SUBS and s > 0 and e < len(flags):
                for i in range(s, e):
                    flags[i] = not value
    return _runs(flags)


def pattern(on_runs, sub_ns=SUB_NS):
    """{'intermittent': bool, 'period_s', 'duty', 'cycles'} of on-runs (sub-bin indexes)."""
    if len(on_runs) < MIN_CYCLES:
        return dict(intermittent=False, period_s=None, duty=1.0 if on_runs else 0.0, cycles=max(0, len(on_runs) - 1))
    starts = [s for s, _ in on_runs]
    cycles = [b - a for a, b in zip(starts, starts[1:])]
    offs = [b[0] - a[1] for a, b in zip(on_runs, on_runs[1:])]
    span = on_runs[-1][1] - on_runs[0][0]
    duty = sum(e - s for s, e in on_runs) / span if span else 1.0
    mean = statistics.mean(cycles)
    spread = statistics.pstdev(cycles) / mean if mean else 1.0
    intermittent = (statistics.median(offs) * sub_ns >= MIN_OFF_NS and duty <= MAX_DUTY and spread <= MAX_CYCLE_SPREAD)
    return dict(intermittent=intermittent, period_s=round(statistics.median(cycles) * sub_ns / 1e9, 2) if intermittent
                else None, duty=round(duty, 2), cycles=len(cycles))
