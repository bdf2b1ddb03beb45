"""Straggle episodes in time: where, on a common timeline, one rank waits materially less for its
peers than the others (the straggler waits least: everyone else waits for it), and where that stops.
Pure functions over per-bin series (no SQL, no I/O), so each rule is tested on small synthetic series.

The series: for every rank and every time bin (the agent's summary interval, or coarser on a long
trace), its wait share under the job's wait definition, and the others' median at the same bin.
The evidence of straggling in a bin is `gap = others' median wait - its wait` above half of
min_gap. A two-state segmentation (healthy / straggling) over that evidence, with a cost for each
switch (Viterbi: the least total cost path), finds the episodes: a single noisy bin never makes one,
and a short dip inside an episode does not end it — a fault that comes and goes (on/off periods of a
few bins) stays one episode, described as intermittent by its on and off runs (period, duty).
"""
from dataclasses import dataclass, field
import statistics

MERGE_BINS = 2                 # runs of one node's ranks this close are one episode (and a GPU's runs of
                               # evidence this close one stretch: devices.within)
# evidence per bin is clipped to this (one extreme bin cannot outweigh a switch on its own)
MAX_EVIDENCE = 0.5
# a stretch at an episode's end is compared with the rest from this many bins (a fault's first bins already count)
MIN_SIDE_BINS = 1


@dataclass
class EpisodeOptions:
    min_gap: float = 0.15          # the straggler waits at least this share of wall time less (episode mean)
    switch_cost: float = 0.3       # evidence (share x bins) it takes to enter and to leave the straggling state
    min_bins: int = 3              # an episode spans at least this many bins with data ...
    min_mean_gap: float = None     # ... and its mean gap reaches this (default: min_gap)
    intermittent_min_cycles: int = 2   # off-runs inside an episode before it is called intermittent
    intermittent_max_duty: float = 0.85


@dataclass
class Run:
    """A straggling stretch of one rank: bins [start, end) of the series (end exclusive)."""
    start: int
    end: int
    bins: int = 0                  # bins with data in it
    mean_gap: float = 0.0
    on_runs: list = field(default_factory=list)    # [(start, end)] bins with gap >= half min_gap
    off_runs: list = field(default_factory=list)   # [(start, end)] the others inside it

    @property
    def duty(self):
        on = sum(e - s for s, e in self.on_runs)
        off = sum(e - s for s, e in self.off_runs)
        return on / (on + off) if on + off else 1.0

    @property
    def cycles(self):
        return len(self.off_runs)

    def period_bins(self):
        """The median on+off cycle length, in bins (None when it does not come and go)."""
        if not self.off_runs:
            return None
        starts = [s for s, _ in self.on_runs]
        cycles = [b - a for a, b in zip(starts, starts[1:])]
        return statistics.median(cycles) if cycles else None


def two_state_path(evidence, switch_cost):
    """The least-cost sequence of states (0 healthy, 1 straggling) for per-bin evidence (positive:
    straggling; None: no data, free either way). Being in state 1 at a bin costs max(0, -e), in state
    0 max(0, e); each change of state costs switch_cost. The path starts and ends healthy."""
    n = len(evidence)
    cost = [0.0, switch_cost]            # best cost so far ending in state 0 / 1 (entering 1 costs a switch)
    back = []                            # per bin: for each state, the state at the previous bin
    for e in evidence:
        e = 0.0 if e is None else max(-MAX_EVIDENCE, min(MAX_EVIDENCE, e))
        stay0, from1 = cost[0], cost[1] + switch_cost
        stay1, from0 = cost[1], cost[0] + switch_cost
        prev0 = 0 if stay0 <= from1 else 1
        prev1 = 1 if stay1 <= from0 else 0
        cost = [min(stay0, from1) + max(0.0, e), min(stay1, from0) + max(0.0, -e)]
        back.append((prev0, prev1))
    # end healthy: leaving state 1 at the end costs a switch too
    state = 0 if cost[0] <= cost[1] + switch_cost else 1
    path = [0] * n
    for i in range(n - 1, -1, -1):
        path[i] = state
        state = back[i][state]
    return path


def _runs(flags, lo, hi, base=0):
    """[(start, end)] maximal runs of True in flags[lo:hi], as indexes plus `base`."""
    out, start = [], None
    for i in range(lo, hi):
        if flags[i] and start is None:
            start = i
        elif not flags[i] and start is not None:
            out.append((start + base, i + base))
            start = None
    if start is not None:
        out.append((start + base, hi + base))
    return out


def straggling_runs(gaps, opts=None):
    """The episodes of one rank: `gaps` per bin (the others' median wait minus its own; None where it
    or the others have no data) -> [Run], each with its mean gap and its on/off structure."""
    opts = opts or EpisodeOptions()
    threshold = opts.min_gap / 2
    min_mean = opts.min_gap if opts.min_mean_gap is None else opts.min_mean_gap
    evidence = [None if g is None else g - threshold for g in gaps]
    path = two_state_path(evidence, opts.switch_cost)
    out = []
    for start, end in _runs(path, 0, len(path)):
        # trim bins without data at both ends
        while start < end and gaps[start] is None:
            start += 1
        while end > start and gaps[end - 1] is None:
            end -= 1
        start, end = trim_weak_ends(gaps, start, end, opts)
        run, judged = stretch(gaps, start, end, opts)
        if run is None or run.bins < opts.min_bins or judged < min_mean:
            continue
        out.append(run)
    return out


def may_resume(after, opts=None):
    """Whether a run that ended where `after` begins (the rank's gaps since: None where no data) would
    take a resumption into itself: the segmentation ends a run at the trace's edge at its first bin below
    the threshold, and bridges an off-stretch later when it costs less than leaving and re-entering the
    straggling state (2 x switch_cost of evidence) and runs this close are one episode anyway
    (MERGE_BINS). So an episode ended at the edge is closed only once the bins after it hold that much
    healthy evidence and more than MERGE_BINS bins (a watch says "recovered" then, not at the first
    quiet bin)."""
    opts = opts or EpisodeOptions()
    threshold = opts.min_gap / 2
    seen = [g for g in after if g is not None]
    healthy = sum(max(0.0, min(MAX_EVIDENCE, threshold - g)) for g in seen)
    return len(seen) <= MERGE_BINS or healthy < 2 * opts.switch_cost


def stretch(gaps, start, end, opts):
    """Bins [start, end) of one rank's gaps as a Run (its mean gap, its on/off structure), and the gap it
    is judged by: a fault that comes and goes by its on-phases (the mean of its on-bins), a steady one by
    its whole span. -> (Run, judged gap), or (None, None) without data."""
    threshold = opts.min_gap / 2
    values = [g for g in gaps[start:end] if g is not None]
    if not values:
        return None, None
    on = [g is not None and g >= threshold for g in gaps[start:end]]
    run = Run(start=start, end=end, bins=len(values), mean_gap=sum(values) / len(values),
              on_runs=_runs(on, 0, len(on), start), off_runs=_runs([not x for x in on], 0, len(on), start))
    on_values = [g for g in values if g >= threshold]
    judged = statistics.mean(on_values) if is_intermittent(run, opts) and on_values else run.mean_gap
    return run, judged


def _best_split(points):
    """The index i (1 <= i < len) splitting `points` [(bin, gap)] into two runs with the least squared
    error about their own means -> (i, left mean, right mean); None for fewer than 2 * MIN_SIDE_BINS."""
    n = len(points)
    if n < 2 * MIN_SIDE_BINS:
        return None
    total = sum(g for _, g in points)
    total_sq = sum(g * g for _, g in points)
    best, left, left_sq = None, 0.0, 0.0
    for i in range(1, n):
        g = points[i - 1][1]
        left, left_sq = left + g, left_sq + g * g
        if i < MIN_SIDE_BINS or n - i < MIN_SIDE_BINS:
            continue
        right, right_sq = total - left, total_sq - left_sq
        sse = (left_sq - left * left / i) + (right_sq - right * right / (n - i))
        if best is None or sse < best[0]:
            best = (sse, i, left / i, right / (n - i))
    return best[1:] if best else None


def trim_weak_ends(gaps, start, end, opts):
    """An episode begins where the rank's straggling does and ends where it stops: a stretch at either end
    of [start, end) that is clearly weaker than the rest (its mean under half the rest's, and its gap
    under min_gap while the rest's is not) is left out. The segmentation enters the straggling state at
    the first bin of a long run of barely positive evidence before a strong fault (a rank that always
    waits a little less: a job's root rank, a pinned core) and would date the fault's start minutes
    early. Each side's gap is weighed as an episode's is (stretch(): a fault that comes and goes by its
    on-phases), so that a fault's own off-bins never make the rest of it look weak. -> (start, end)"""
    for _ in range(4):
        points = [(b, gaps[b]) for b in range(start, end) if gaps[b] is not None]
        split = _best_split(points)
        if split is None:
            break
        i, left_mean, right_mean = split
        left = stretch(gaps, start, points[i - 1][0] + 1, opts)[1]
        right = stretch(gaps, points[i][0], end, opts)[1]
        if left < opts.min_gap and right_mean >= 2 * max(left_mean, 0.0) and right >= opts.min_gap:
            start = points[i][0]
        elif right < opts.min_gap and left_mean >= 2 * max(right_mean, 0.0) and left >= opts.min_gap:
            end = points[i - 1][0] + 1
        else:
            break
    return start, end


def is_intermittent(run, opts=None):
    """A fault that comes and goes: at least `intermittent_min_cycles` off-runs inside the episode, and
    on for at most `intermittent_max_duty` of it."""
    opts = opts or EpisodeOptions()
    return run.cycles >= opts.intermittent_min_cycles and run.duty <= opts.intermittent_max_duty


def gap_series(waits):
    """Per rank, per bin: the others' median wait minus its own. `waits`: {rank key: [wait or None per
    bin]} (all lists of one length) -> {rank key: [gap or None]}; None where the rank has no data or
    fewer than one other rank has."""
    keys = list(waits)
    n = len(next(iter(waits.values()))) if waits else 0
    out = {k: [None] * n for k in keys}
    for b in range(n):
        present = [(k, waits[k][b]) for k in keys if waits[k][b] is not None]
        if len(present) < 2:
            continue
        ordered = sorted(present, key=lambda kw: kw[1])
        values = [w for _, w in ordered]
        for i, (k, w) in enumerate(ordered):
            out[k][b] = _median_without(values, i) - w
    return out


def _median_without(values, i):
    """The median of sorted `values` without the one at index i (len(values) >= 2)."""
    m = len(values) - 1

    def at(j):
        return values[j] if j < i else values[j + 1]
    if m % 2:
        return at(m // 2)
    return (at(m // 2 - 1) + at(m // 2)) / 2


# Pauses: one rank stopping for a moment every few seconds (a full garbage collection, a logging flush, a
# data-loader stall) — too short for a bin to hold a straggle episode's gap, too regular to be noise.
PAUSE_MIN_GAP = 0.08           # a pause costs its peers at least this share of a bin (80 ms of 1 s)
PAUSE_NOISE = 4.0              # ... and stands this many times the rank's own spread above its usual gap
PAUSE_MAX_BINS = 2             # a pause spans at most this many bins (a longer stop is a straggle episode)
PAUSE_MIN_COUNT = 5            # at least this many pauses ...
PAUSE_MAX_PERIOD_BINS = 10     # ... one every this many bins at most (1 to 5 s on 1 s bins: the usual rhythms)
PAUSE_MAX_SPREAD = 0.6         # ... their spacing's coefficient of variation at most this (a rhythm, not noise)
PAUSE_MAX_LENGTH = 0.45        # ... each at most this share of a bin (a longer stop every few bins is a fault that
                               # comes and goes, told by its on and off runs)


@dataclass
class Pauses:
    """A rank's pauses: bins [start, end) from its first to its last, each pause's bins, and its size."""
    start: int
    end: int
    runs: list                     # [(start, end)] the bins of each pause
    length_bins: float             # the median pause, in bins (its peers' extra wait: the gap it left)
    period_bins: float             # the median spacing of their starts
    mean_gap: float                # the mean gap of the pause bins

    def as_run(self, gaps):
        on = list(self.runs)
        off = [(a[1], b[0]) for a, b in zip(on, on[1:]) if b[0] > a[1]]
        values = [gaps[b] for s, e in on for b in range(s, e) if gaps[b] is not None]
        return Run(start=self.start, end=self.end, bins=sum(e - s for s, e in on), mean_gap=statistics.mean(values),
                   on_runs=on, off_runs=off)


def _quantile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def pauses(gaps):
    """One rank's pauses in its gap series (gap_series; None where it has no data) -> Pauses, or None. A
    pause bin stands PAUSE_NOISE times the rank's spread above its usual gap (both from its lower bins: up
    to half of them may hold a pause) and by PAUSE_MIN_GAP at least; pauses are runs of such bins of at most
    PAUSE_MAX_BINS, at least PAUSE_MIN_COUNT of them, about as far apart each time."""
    values = sorted(g for g in gaps if g is not None)
    if len(values) < 2 * PAUSE_MIN_COUNT:
        return None
    base = _quantile(values, 0.25)
    low = [v for v in values if v <= _quantile(values, 0.45)]
    spread = 1.4826 * statistics.median(abs(v - statistics.median(low)) for v in low)
    threshold = base + max(PAUSE_MIN_GAP, PAUSE_NOISE * spread)
    runs = _runs([g is not None and g >= threshold for g in gaps], 0, len(gaps))
    if not runs or any(e - s > PAUSE_MAX_BINS for s, e in runs) or len(runs) < PAUSE_MIN_COUNT:
        return None
    starts = [s for s, _ in runs]
    spacing = [b - a for a, b in zip(starts, starts[1:])]
    period = statistics.median(spacing)
    if period > PAUSE_MAX_PERIOD_BINS or period < 1.5 or \
            statistics.pstdev(spacing) > PAUSE_MAX_SPREAD * statistics.mean(spacing):
        return None
    lengths = [sum(gaps[b] - base for b in range(s, e)) for s, e in runs]
    if statistics.median(lengths) > PAUSE_MAX_LENGTH:
        return None
    pause_values = [gaps[b] for s, e in runs for b in range(s, e)]
    return Pauses(start=runs[0][0], end=runs[-1][1], runs=runs, length_bins=statistics.median(lengths),
                  period_bins=period, mean_gap=statistics.mean(pause_values))

