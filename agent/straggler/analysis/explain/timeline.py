"""The trace on one timeline: every rank's step-time model per time bin, its wait for its peers against
the others' at the same bin, and the straggle episodes that come out of it (episodes.py segments), each
with the windows (its time, and each rank's clean time around it) that explain then judges.

Times: every node's CLOCK_MONOTONIC maps to the fleet timeline by its clock pairs (realtime minus
monotonic, averaged) less the offset a merge measured for it; a node without clock pairs keeps its
own clock, started with the others (its episode times are then approximate, and said so).
Reads through a runner; decides nothing about causes (the model does, per episode).
"""
import statistics
from dataclasses import dataclass, field

from ...store.steptime import WAIT_DEFS, rank_time
from . import episodes as ep, sql, zoom
from .causes import CAUSE_CLASSES
from .windows import Window

MAX_SERIES_ROWS = 400_000      # rows the series query may return: bins grow on a long trace of many ranks
HELPERS_PER_RANK = 4           # the series rows per rank and bin it budgets for (its calling thread and helpers)
NEIGHBOURHOOD_S = 600.0        # a rank's clean time judged against an episode lies within this of it
MIN_SLOWDOWN = 1.05            # an episode's job step time over the clean time around it, at least
MIN_CLEAN_BINS = 3             # clean time around an episode its slowdown and its causes are measured against
WAIT_DEF_BINS = 300             # bins per rank that say where the job waits (job_wait_def)
BIN_CYCLE = 4                  # an intermittent fault's on-bins are judged apart when its period is this many bins


@dataclass
class NodeClock:
    node: str
    offset_ns: int = 0             # fleet time = node monotonic + offset_ns
    aligned: bool = True           # False: no clock pairs, its own clock


@dataclass
class Series:
    """Per rank, per bin: its RankTime (None: no data), on bins of bin_ns from t0_ns (fleet time)."""
    t0_ns: int
    bin_ns: int
    n_bins: int
    clocks: dict                   # node -> NodeClock
    ranks: dict                    # (node, pid) -> [RankTime or None] per bin
    rank_of: dict                  # (node, pid) -> rank
    calling: dict                  # (node, pid) -> calling thread id
    interval_ns: dict              # (node, pid) -> its summary interval
    phase_ns: dict = field(default_factory=dict)   # (node, pid) -> where its summaries start, modulo the interval
    sql: str = ""
    usable_bins: dict = field(default_factory=dict)   # (node, pid) -> its usable bins (usable(), computed once)
    until_ns: int = None           # --until on the fleet timeline: what the GPUs said after it is not read
    wait_def: str = None           # where the job's ranks wait for each other (job_wait_def, computed once)

    def to_fleet(self, node, mono_ns):
        return int(mono_ns) + self.clocks[node].offset_ns

    def to_node(self, node, fleet_ns):
        return int(fleet_ns) - self.clocks[node].offset_ns

    def bin_start(self, b):
        return self.t0_ns + b * self.bin_ns

    def snap(self, key, fleet_ns):
        """A fleet time as the nearest boundary of the rank's own summaries on its node's clock (a window
        then holds whole summaries, as the bins do: each summary is in the bin of its midpoint)."""
        iv, phase = self.interval_ns[key], self.phase_ns.get(key, 0)
        mono = self.to_node(key[0], fleet_ns)
        return phase + round((mono - phase) / iv) * iv


@dataclass
class Episode:
    """A straggle episode: a node (and the ranks of it that straggle) over bins [start, end)."""
    node: str
    keys: list                     # [(node, pid)] its straggling ranks
    start: int
    end: int
    runs: dict = field(default_factory=dict)     # key -> episodes.Run
    mean_gap: float = 0.0
    intermittent: bool = False
    duty: float = 1.0
    period_bins: float = None
    cycles: int = 0
    reaches_end: bool = False      # still going where the trace ends
    lead: tuple = None             # the rank that straggles most in it
    wait_def: str = "blocking"     # the wait definition that separates it
    start_ns: int = None           # on the fleet timeline (the bins' edges, or finer: zoom_in)
    end_ns: int = None
    zoom_sql: str = None
    pauses: dict = None            # a rank's pauses (episodes.pauses): {"count", "length_s", "period_s"}
    may_resume: bool = False       # ended at the trace's edge so lately that a resumption would still be
                                   # this episode (episodes.may_resume): not closed yet


def node_clocks(runner, nodes):
    """{node: NodeClock} for `nodes`, from clock_pairs and the offsets a merge stored."""
    rows = {r["node"]: r for r in runner.rows(sql.NODE_CLOCKS)}
    out = {}
    for node in nodes:
        r = rows.get(node)
        if r is None or r["real_minus_mono"] is None:
            out[node] = NodeClock(node, 0, aligned=False)
        else:
            out[node] = NodeClock(node, int(r["real_minus_mono"]) - int(r["merge_offset_ns"] or 0))
    return out


def anchor_unaligned(clocks, first_of):
    """A node without clock pairs started with the others: its offset puts its first summary
    (first_of: {node: its first ts}) at the earliest aligned node's (at 0 when no node has pairs)."""
    aligned_starts = [first_of[n] + c.offset_ns for n, c in clocks.items() if c.aligned and n in first_of]
    anchor = min(aligned_starts) if aligned_starts else 0
    for node, c in clocks.items():
        if not c.aligned and node in first_of:
            c.offset_ns = anchor - first_of[node]
    return clocks


def choose_bin(interval_ns, span_ns, n_ranks):
    """The bin: the summary interval, or a whole multiple of it so that the series stays within
    MAX_SERIES_ROWS on a long trace of many ranks."""
    interval_ns = max(1, int(interval_ns))
    bins = max(1, span_ns // interval_ns)
    rows = bins * max(1, n_ranks) * HELPERS_PER_RANK
    factor = max(1, -(-rows // MAX_SERIES_ROWS))
    return interval_ns * factor


@dataclass
class Callers:
    """What sql.callers says of each rank (node, pid): its calling thread (the thread with the most time
    in calls), its rank, summary interval, first summary's start and last one's end; keys: the ranks
    with at least min_calls calls, sorted."""
    keys: list
    calling: dict
    rank_of: dict
    interval_of: dict
    first: dict
    last: dict


def calling_threads(callers, min_calls):
    """sql.callers rows (node, pid, tid, rank, calls, call_ns, first_ts, last_ts, interval_ns) -> Callers."""
    calling, rank_of, interval_of, first, last, totals = {}, {}, {}, {}, {}, {}
    for r in callers:
        key = (r["node"], int(r["pid"]))
        best = calling.get(key)
        if best is None or (r["call_ns"] or 0, r["calls"] or 0) > best[1:]:
            calling[key] = (int(r["tid"]), r["call_ns"] or 0, r["calls"] or 0)
        rank_of.setdefault(key, r["rank"])
        interval_of[key] = max(interval_of.get(key, 0), int(r["interval_ns"] or 1))
        first[key] = min(first.get(key, r["first_ts"]), r["first_ts"])
        last[key] = max(last.get(key, r["last_ts"]), r["last_ts"])
        totals[key] = totals.get(key, 0) + (r["calls"] or 0)
    keys = sorted(k for k in calling if totals.get(k, 0) >= min_calls)
    return Callers(keys, {k: v[0] for k, v in calling.items()}, rank_of, interval_of, first, last)


def build_series(runner, callers, opts, cut=None):
    """The per-bin series of every rank in `callers` (sql.callers rows, or Callers) -> Series, or None.
    cut (span.Cut): the span judged; with fleet-time bounds, its clocks place each node (a node without
    clock pairs by the whole trace, as the bounds were translated, not by the span's first summary)."""
    c = callers if isinstance(callers, Callers) else calling_threads(callers, opts.min_calls)
    keys, rank_of, interval_of, first, last = c.keys, c.rank_of, c.interval_of, c.first, c.last
    calling = {k: (c.calling[k],) for k in keys}
    if len(keys) < 1:
        return None
    nodes = sorted({k[0] for k in keys})
    if cut is not None and all(n in cut.clocks for n in nodes):
        clocks = {n: NodeClock(n, cut.clocks[n].offset_ns, cut.clocks[n].aligned) for n in nodes}
    else:
        clocks = node_clocks(runner, nodes)
        first_of = {}
        for k in keys:
            first_of[k[0]] = min(first_of.get(k[0], first[k]), first[k])
        anchor_unaligned(clocks, first_of)
    t0 = min(first[k] + clocks[k[0]].offset_ns for k in keys)
    t1 = max(last[k] + clocks[k[0]].offset_ns for k in keys)
    interval = max(interval_of[k] for k in keys)
    bin_ns = choose_bin(interval, t1 - t0, len(keys))
    t0 = t0 // interval * interval
    n_bins = max(1, -(-(t1 - t0) // bin_ns))
    text = sql.series(keys, {n: c.offset_ns for n, c in clocks.items()}, t0, bin_ns, cut)
    per = {}
    for r in runner.rows(text):
        key = (r["node"], int(r["pid"]))
        per.setdefault(key, {}).setdefault(int(r["bin"]), []).append(r)
    ranks = {}
    for key in keys:
        series = [None] * n_bins
        tid = calling[key][0]
        for b, threads in per.get(key, {}).items():
            if not 0 <= b < n_bins:
                continue
            main = next((t for t in threads if t["tid"] == tid), None)
            if main is None or not main["wall_ns"]:
                continue
            series[b] = rank_time(key, threads, int(main["wall_ns"]), rank_of.get(key), tid)
        ranks[key] = series
    return Series(t0_ns=t0, bin_ns=bin_ns, n_bins=n_bins, clocks=clocks, ranks=ranks, rank_of=rank_of,
                  calling={k: calling[k][0] for k in keys}, interval_ns=interval_of,
                  phase_ns={k: first[k] % interval_of[k] for k in keys}, sql=text,
                  until_ns=cut.until_ns if cut is not None else None)


FULL_BIN = 0.9                 # a bin counts for a rank when its summaries cover this much of it


def covered(series, key, b):
    """Whether rank `key` has data over (nearly) all of bin b."""
    rt = series.ranks[key][b]
    return rt is not None and rt.wall_ns >= FULL_BIN * series.bin_ns


def usable(series, key):
    """The bins of rank `key` that count: covered, less its first and last (a job's start and end, and
    a summary cut short, are no straggling and no baseline). Computed once per rank."""
    found = series.usable_bins.get(key)
    if found is None:
        floor = FULL_BIN * series.bin_ns
        have = [b for b, rt in enumerate(series.ranks[key]) if rt is not None and rt.wall_ns >= floor]
        if len(have) >= 5:
            have = have[1:-1]
        found = series.usable_bins[key] = frozenset(have)
    return found


def job_wait_def(series):
    """Where this job's ranks wait for each other, from its whole trace: 'enqueue' when its typical rank
    spends more of its time in synchronize than in collectives and blocked (collectives that only enqueue,
    NCCL on GPUs: the wait shows in the next synchronize), else 'blocking' (gloo, blocking collectives:
    synchronize is then each rank's wait for its own device, and a rank with more host work waits less
    there — no sign that the others wait for it). One definition for the whole job: a per-bin choice of
    the one that separates a rank more would find gaps in noise."""
    if series.wait_def is not None:
        return series.wait_def
    # the time inside the calls as the agent measured it (run-queue wait inside them included: on busy
    # cores a rank that waits in a collective is often runnable, and the model counts that as run queue)
    # (each rank's time over at most WAIT_DEF_BINS of its bins, spread over its trace: a day of 1 s bins
    # says no more about where a job waits than a few hundred of them)
    sums = []
    for key, rts in series.ranks.items():
        ok = sorted(usable(series, key))
        picked = [rts[b] for b in ok[::max(1, len(ok) // WAIT_DEF_BINS)]]
        sums.append((sum(rt.wall_ns for rt in picked), sum(rt.raw.get("sync_ns", 0) for rt in picked),
                     sum(rt.raw.get("coll_ns", 0) + rt.raw.get("blocked_ns", 0) for rt in picked),
                     sum(rt.raw.get("coll_ns", 0) for rt in picked)))
    series.wait_def = wait_def_of(sums)
    return series.wait_def


ENQUEUE_MAX_COLL = 0.05        # collectives that only enqueue return at once: the typical rank is in them at most
                               # this share of its time (blocking ones hold it while it waits for its peers)


def wait_def_of(sums):
    """job_wait_def's rule over [(wall_ns, sync_ns, coll_ns + blocked_ns, coll_ns)] per rank: 'enqueue' when
    the typical rank spends more of its time in synchronize than in collectives and blocked, and its
    collective calls themselves are short (ENQUEUE_MAX_COLL). A job whose steps are mostly GPU work waits
    longer for its own device than for its peers: with collectives that block, that is no enqueue style."""
    sync = [s / wall for wall, s, _, _ in sums if wall]
    other = [o / wall for wall, _, o, _ in sums if wall]
    coll = [c / wall for wall, _, _, c in sums if wall]
    if sync and statistics.median(sync) > statistics.median(other) and statistics.median(coll) < ENQUEUE_MAX_COLL:
        return "enqueue"
    return "blocking"


def gaps(series):
    """Per rank, per bin: how much less than the others' median it waits, over its usable bins, under the
    job's wait definition (job_wait_def) -> ({rank: [gap]}, {wait_def: {rank: [gap]}}: both definitions',
    for the record)."""
    usable_of = {key: usable(series, key) for key in series.ranks}
    per_def = {}
    for wait_def in WAIT_DEFS:
        parts = WAIT_DEFS[wait_def]
        waits = {}
        for key, rts in series.ranks.items():
            ok = usable_of[key]
            waits[key] = [sum(rt.ns.get(c, 0) for c in parts) / rt.wall_ns if b in ok else None
                          for b, rt in enumerate(rts)]
        per_def[wait_def] = ep.gap_series(waits)
    return per_def[job_wait_def(series)], per_def


def find_episodes(series, eopts):
    """The straggle episodes of the trace, per node (its ranks' runs that overlap are one episode),
    in time order."""
    by_node = {}
    best, per_def = gaps(series)
    for key, g in best.items():
        for run in ep.straggling_runs(g, eopts):
            by_node.setdefault(key[0], []).append((key, run))
    out = []
    for node, runs in by_node.items():
        runs.sort(key=lambda kr: kr[1].start)
        group = []
        for key, run in runs:
            if group and run.start > max(r.end for _, r in group) + ep.MERGE_BINS:
                out.append(_episode(node, group, series, per_def))
                group = []
            group.append((key, run))
        if group:
            out.append(_episode(node, group, series, per_def))
    out.extend(_pause_episodes(series, best, out))
    for e in out:
        e.may_resume = not e.reaches_end and any(ep.may_resume(best[k][e.end:], eopts) for k in e.keys if k in best)
    out.sort(key=lambda e: e.start)
    return out


def _pause_episodes(series, best, found):
    """A rank's pauses (episodes.pauses): an episode found whose lead rank's bins are pauses becomes their
    episode; elsewhere (outside the episodes found: too short for the segmentation) each rank's pauses are an
    episode of their own — its on-bins the pauses, with their count, length and period. -> the new episodes
    (the ones found are changed in place)."""
    out = []
    for i, e in enumerate(found):
        g = best.get(e.lead)
        if g is not None and e.intermittent:
            p = ep.pauses([x if e.start <= b < e.end else None for b, x in enumerate(g)])
            if p is not None:
                found[i] = _as_pauses(series, e.lead, p, g)
    for key, g in sorted(best.items()):
        mine = [e for e in found if e.node == key[0]]
        masked = [None if any(e.start - ep.MERGE_BINS <= b < e.end + ep.MERGE_BINS for e in mine) else x
                  for b, x in enumerate(g)]
        p = ep.pauses(masked)
        if p is not None:
            out.append(_as_pauses(series, key, p, masked))
    return out


def _as_pauses(series, key, p, gaps):
    run = p.as_run(gaps)
    bin_s = series.bin_ns / 1e9
    e = Episode(node=key[0], keys=[key], start=run.start, end=run.end, runs={key: run}, mean_gap=p.mean_gap,
                intermittent=True, duty=run.duty, period_bins=p.period_bins, cycles=len(p.runs), lead=key)
    last = max(usable(series, key), default=series.n_bins - 1)
    e.reaches_end = e.end > last
    e.wait_def = job_wait_def(series)
    e.start_ns, e.end_ns = series.bin_start(e.start), series.bin_start(e.end)
    e.pauses = dict(count=len(p.runs), length_s=round(p.length_bins * bin_s, 3), period_s=round(p.period_bins * bin_s, 1))
    return e


def _episode(node, group, series, per_def):
    runs = {}
    for key, run in group:          # one rank twice in a group: keep its longer run
        if key not in runs or run.bins > runs[key].bins:
            runs[key] = run
    lead = max(runs.values(), key=lambda r: r.mean_gap * r.bins)
    e = Episode(node=node, keys=sorted(runs), start=min(r.start for r in runs.values()),
                end=max(r.end for r in runs.values()), runs=runs,
                mean_gap=statistics.mean(r.mean_gap for r in runs.values()))
    e.intermittent = ep.is_intermittent(lead)
    e.duty, e.cycles = lead.duty, lead.cycles
    e.period_bins = lead.period_bins() if e.intermittent else None
    last = max((max(u) for u in (usable(series, k) for k in runs) if u), default=series.n_bins - 1)
    e.reaches_end = e.end > last           # it runs to its ranks' newest bin that counts (their last is left out)
    e.lead = max(runs, key=lambda k: runs[k].mean_gap * runs[k].bins)

    e.wait_def = job_wait_def(series)
    e.start_ns, e.end_ns = series.bin_start(e.start), series.bin_start(e.end)
    return e


def zoom_in(runner, series, e, min_gap):
    """Look at episode `e` sub-second by sub-second (zoom.py): whether it comes and goes (its period and
    duty, replacing what its bins suggested) and where it starts and ends, to a fraction of a second.
    Left as it was when the agent recorded too few of the ranks' waiting calls."""
    lo = e.start_ns - zoom.MARGIN_NS
    hi = min(e.end_ns, e.start_ns + zoom.ZOOM_MAX_NS) + zoom.MARGIN_NS
    n_subs = max(1, (hi - lo) // zoom.SUB_NS)
    offsets = {n: c.offset_ns for n, c in series.clocks.items()}
    text = zoom.calls_sql(series.calling, offsets, lo, hi, e.wait_def)
    waits = zoom.waits_per_sub(runner.rows(text), lo, n_subs)
    fine = zoom.fine_gaps(waits, e.lead)
    on_runs = zoom.on_off(fine, min_gap)
    e.zoom_sql = text
    if not on_runs or len(waits) < 2:
        return e
    p = zoom.pattern(on_runs)
    e.intermittent = p["intermittent"]
    e.duty, e.cycles = p["duty"], p["cycles"]
    e.period_bins = p["period_s"] * 1e9 / series.bin_ns if p["period_s"] else None
    first = lo + on_runs[0][0] * zoom.SUB_NS
    last = lo + on_runs[-1][1] * zoom.SUB_NS
    if e.start_ns <= first < e.end_ns:             # leading noise that only looked like straggling
        e.start_ns = first
        e.start = max(e.start, (first - series.t0_ns) // series.bin_ns)
    if e.end_ns - e.start_ns <= zoom.ZOOM_MAX_NS and e.start_ns < last <= e.end_ns:
        e.end_ns = last
        e.end = min(e.end, -(-(last - series.t0_ns) // series.bin_ns))
    return e


def _segments(bins, series, key):
    """Sorted bin indexes -> ((lo, hi), ...) on the rank's node clock, snapped to its summaries,
    adjacent bins joined."""
    out = []
    for b in bins:
        lo, hi = series.snap(key, series.bin_start(b)), series.snap(key, series.bin_start(b + 1))
        if hi <= lo:
            continue
        if out and out[-1][1] >= lo:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _recent_and_off(series, episode):
    """The bins an episode is judged over, and its off-bins: a fault that comes and goes slowly enough
    for the bins to see it (its period at least BIN_CYCLE bins) is judged over its on-bins against its
    off-bins too; otherwise over its whole span."""
    lead = episode.runs[episode.lead] if episode.lead in episode.runs else \
        max(episode.runs.values(), key=lambda r: r.mean_gap * r.bins)
    if episode.intermittent and episode.period_bins and (episode.period_bins >= BIN_CYCLE or episode.pauses) \
            and lead.off_runs:
        on = sorted(b for s, e in lead.on_runs for b in range(s, e) if episode.start <= b < episode.end)
        off = {b for s, e in lead.off_runs for b in range(s, e)}
        if on:
            return on, off
    return list(range(episode.start, episode.end)), set()


def slice_share(series, episode):
    """The share of an episode's judged time in which its straggler is expected to wait less: its duty
    when it comes and goes faster than the bins follow (then judged over its whole span, on and off
    alike), else 1. The model's consistency test (lower in most slices) asks for that share of it."""
    _, off_bins = _recent_and_off(series, episode)
    if episode.intermittent and not off_bins and episode.duty:
        return episode.duty
    return 1.0


def episode_windows(series, episode, all_episodes):
    """Each rank's Window for one episode: the recent part is the episode's bins (the on-bins of its lead
    rank when the fault comes and goes); the baseline is the rank's clean bins around it (no episode of
    any node, data of its own), within NEIGHBOURHOOD_S, plus the off-bins of an intermittent one; fewer
    than MIN_CLEAN_BINS of them are no baseline (a fault from the first step leaves only the job's start-up
    bins before it), and its causes are then what it has above the other ranks at the same time."""
    recent_bins, off_bins = _recent_and_off(series, episode)
    busy = set()
    for other in all_episodes:
        busy.update(range(other.start, other.end))
    reach = max(1, int(NEIGHBOURHOOD_S * 1e9 // series.bin_ns))
    lo_b, hi_b = max(0, episode.start - reach), min(series.n_bins, episode.end + reach)
    windows = []
    for key, rts in series.ranks.items():
        node, pid = key
        ok = usable(series, key)
        mine = [b for b in recent_bins if b in ok]
        if not mine:
            continue
        recent = set(recent_bins)
        clean = [b for b in range(lo_b, hi_b) if b in ok and (b not in busy or b in off_bins) and b not in recent]
        if len(clean) < MIN_CLEAN_BINS:
            clean = []
        windows.append(Window(node, pid, _segments(clean, series, key), _segments(mine, series, key)))
    return windows


def step_rate(series, bins):
    """The job's step rate over `bins`: the median over ranks of their calling thread's calls per second."""
    rates = []
    for rts in series.ranks.values():
        calls = sum(rts[b].calls for b in bins if rts[b] is not None)
        wall = sum(rts[b].wall_ns for b in bins if rts[b] is not None)
        if wall:
            rates.append(calls / (wall / 1e9))
    return statistics.median(rates) if rates else None


@dataclass
class Judged:
    """An episode the model confirmed over its own time: who, how much it cost the job, and its findings."""
    episode: Episode
    analysis: object               # the engine's Context over the episode's windows
    nodes: list                    # the straggler nodes the model named (the episode's first)
    recent_bins: list
    slowdown: float = None         # the job's step time during the episode over before/after it
    slowdown_estimated: bool = False   # no clean time around it: from the waiters' wait instead
    lost_s: float = 0.0            # the job's time lost to it
    findings: list = field(default_factory=list)
    series: object = None          # the Series it was found in (a long trace's: its stretch's)
    cut: object = None             # the span.Cut of that series
    gpu_evidence: list = field(default_factory=list)    # [(devices.GpuEvidence, its SQL)]: its ranks' GPUs that say why
    link_evidence: list = field(default_factory=list)   # [(network.LinkEvidence, its SQL)]: its node's links that do
    all_along: bool = False        # there all along (a GPU's own word over the whole trace): the job has no
                                   # clean time to be measured against, so slowdown and lost_s are not measured

    def drags_the_job(self):
        """Whether the job was slower for it: a rank everyone waits for costs the job its gap (at min_gap,
        x1.18). Measured against the clean time around it, a slowdown under MIN_SLOWDOWN says the job ran
        as fast as without it — a short shuffle of who waits least (as when every GPU slows at once), not a
        straggler. Estimated from the waits alone (no clean time), it is taken as it is."""
        return self.slowdown_estimated or self.slowdown is None or self.slowdown >= MIN_SLOWDOWN


def judge(series, episode, all_episodes, analysis):
    """The Judged episode: the model's named nodes, and the job's slowdown over the episode against the
    clean time around it (its step rate), or — with no clean time (slow from the first step) — estimated
    from how much longer the others wait than the straggler (a step of T_old + gap*T_new)."""
    named = []
    for s in analysis.verdict.stragglers:
        node = s["rank"].key[0]
        if node not in named:
            named.append(node)
    named.sort(key=lambda n: n != episode.node)
    recent_bins, off_bins = _recent_and_off(series, episode)
    busy = set()
    for other in all_episodes:
        busy.update(range(other.start, other.end))
    reach = max(1, int(NEIGHBOURHOOD_S * 1e9 // series.bin_ns))
    job_usable = set().union(*(usable(series, k) for k in series.ranks))
    clean = [b for b in range(max(0, episode.start - reach), min(series.n_bins, episode.end + reach))
             if b not in busy and b in job_usable]
    clean += [b for b in sorted(off_bins) if b in job_usable]
    j = Judged(episode=episode, analysis=analysis, nodes=named, recent_bins=recent_bins)
    during = step_rate(series, [b for b in recent_bins if b in job_usable])
    before = step_rate(series, clean) if len(clean) >= MIN_CLEAN_BINS else None
    if during and before:
        j.slowdown = max(1.0, before / during)
    else:
        gap = min(0.9, max(0.0, episode.mean_gap))
        j.slowdown, j.slowdown_estimated = 1.0 / (1.0 - gap), True
    j.lost_s = len(recent_bins) * series.bin_ns / 1e9 * (1.0 - 1.0 / j.slowdown)
    return j


def judge_window(series, analysis):
    """A fixed window's straggler as an episode (its recent part, on the fleet timeline): the fallback
    when the segmentation finds none on a trace too short for it."""
    lead = analysis.verdict.stragglers[0]["rank"]
    w = analysis.win_of[lead.key]
    start = max(0, (series.to_fleet(lead.key[0], w.tb) - series.t0_ns) // series.bin_ns)
    end = min(series.n_bins, max(start + 1, -(-(series.to_fleet(lead.key[0], w.t1) - series.t0_ns) // series.bin_ns)))
    keys = [s["rank"].key for s in analysis.verdict.stragglers if s["rank"].key[0] == lead.key[0]]
    gap = analysis.verdict.stragglers[0]["gap"]
    run = ep.Run(start=start, end=end, bins=end - start, mean_gap=gap, on_runs=[(start, end)])
    last = max((max(u) for u in (usable(series, k) for k in keys) if u), default=series.n_bins - 1)
    e = Episode(node=lead.key[0], keys=keys, start=start, end=end, runs={k: run for k in keys}, mean_gap=gap,
                reaches_end=end > last, lead=lead.key, start_ns=series.bin_start(start), end_ns=series.bin_start(end))
    return judge(series, e, [e], analysis)


def judge_device(series, run, ev, keys, rates, ref, judged_analysis=None, eopts=None):
    """An episode named by a GPU's own word over a job-slow run (job_slow_runs): its node, the
    ranks on that GPU, and the job's slowdown there against its best rate."""
    e = Episode(node=ev.node, keys=list(keys), start=run.start, end=run.end, runs={k: run for k in keys},
                mean_gap=run.mean_gap, lead=keys[0] if keys else None, start_ns=series.bin_start(run.start),
                end_ns=series.bin_start(run.end))
    last = max((max(u) for u in (usable(series, k) for k in series.ranks) if u), default=series.n_bins - 1)
    e.reaches_end = e.end > last
    if not e.reaches_end and ref:
        e.may_resume = ep.may_resume([None if r is None else 1.0 - r / ref for r in rates[run.end:]], eopts)
    j = Judged(episode=e, analysis=judged_analysis, nodes=[ev.node], recent_bins=list(range(run.start, run.end)))
    if ref is None:                    # all along: no clean time to measure the job against (not measured)
        j.all_along, j.slowdown, j.lost_s = True, None, 0.0
        return j
    during = [r for r in rates[run.start:run.end] if r]
    j.slowdown = max(1.0, ref / statistics.median(during)) if during and ref else 1.0
    j.lost_s = len(j.recent_bins) * series.bin_ns / 1e9 * (1.0 - 1.0 / j.slowdown)
    return j


def _iso(ns):
    import datetime
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).isoformat(timespec="milliseconds")


def episode_dict(series, j):
    """An episode as the report holds it (JSON-ready): who, when (fleet time, ns and ISO 8601 UTC), how
    much it cost the job, whether it comes and goes, its causes and findings."""
    e = j.episode
    start_ns = e.start_ns if e.start_ns is not None else series.bin_start(e.start)
    end_ns = e.end_ns if e.end_ns is not None else series.bin_start(e.end)
    ranks = [dict(node=k[0], pid=k[1], rank=series.rank_of.get(k)) for k in e.keys]
    causes = [dict(node=f.node, cause=f.cause, share=f.share, summary=f.summary) for f in j.findings
              if f.cause in CAUSE_CLASSES]
    intermittent = None
    if e.intermittent:
        intermittent = dict(period_s=round(e.period_bins * series.bin_ns / 1e9, 1) if e.period_bins else None,
                            duty=round(e.duty, 2), cycles=e.cycles)
    sql_used = {"series": series.sql.strip(), **({"zoom": e.zoom_sql.strip()} if e.zoom_sql else {})}
    return dict(node=e.node, nodes=j.nodes, ranks=ranks, start_ns=start_ns, end_ns=end_ns, start=_iso(start_ns),
                end=_iso(end_ns), duration_s=round((end_ns - start_ns) / 1e9, 1),
                slowdown=None if j.slowdown is None else round(j.slowdown, 2),
                slowdown_estimated=j.slowdown_estimated, lost_s=None if j.all_along else round(j.lost_s, 1),
                all_along=j.all_along,
                intermittent=intermittent, pauses=e.pauses, ongoing=e.reaches_end,
                may_resume=e.may_resume, mean_gap=round(e.mean_gap, 3),
                clock_aligned=all(series.clocks[n].aligned for n in j.nodes),
                causes=causes, findings=[f.to_dict() for f in j.findings], sql=sql_used)


def timeline_dict(series):
    end = series.bin_start(series.n_bins)
    return dict(start_ns=series.t0_ns, end_ns=end, start=_iso(series.t0_ns), end=_iso(end),
                bin_s=series.bin_ns / 1e9, ranks=len(series.ranks), wait=job_wait_def(series),
                unaligned=[n for n, c in sorted(series.clocks.items()) if not c.aligned], sql=series.sql.strip())


def long_timeline_dict(plan, read):
    """The timeline of a long trace read through its roll-ups (coarse.Plan): the whole trace, the
    minutes the roll-ups marked, and each stretch read at the summaries' interval ([(Stretch, Series)])."""
    end = plan.t1_ns
    first = read[0][1] if read else None
    return dict(start_ns=plan.t0_ns, end_ns=end, start=_iso(plan.t0_ns), end=_iso(end),
                bin_s=first.bin_ns / 1e9 if first else None, ranks=len(plan.callers.keys), wait=plan.wait_def,
                unaligned=[n for n, c in sorted(plan.clocks.items()) if not c.aligned], sql=plan.sql.strip(),
                rollup=dict(bin_s=plan.bin_ns / 1e9, bins=plan.minutes, marked=plan.marked,
                            callers_sql=plan.callers_sql.strip(),
                            stretches=[dict(start=_iso(st.lo_ns), end=_iso(st.hi_ns), ranks=len(s.ranks),
                                            why=sorted({w for w, _ in st.why}),
                                            changed=sorted(st.changed), bin_s=s.bin_ns / 1e9, sql=s.sql.strip())
                                       for st, s in read]))


def job_rate(series):
    """The job's step rate per bin (whoever waits: devices.py reads a GPU's word where it drops): the median over ranks of their calling thread's calls per second
    (None where fewer than two ranks have a usable bin)."""
    ok = {k: usable(series, k) for k in series.ranks}
    out = []
    for b in range(series.n_bins):
        rates = [rts[b].calls / (rts[b].wall_ns / 1e9) for k, rts in series.ranks.items()
                 if b in ok[k] and rts[b].wall_ns]
        out.append(statistics.median(rates) if len(rates) >= 2 else None)
    return out


def job_slow_runs(series, eopts):
    """Where the whole job ran slower than it does at its best (its step rate below the trace's upper
    quartile by min_gap or more), whoever waits: [episodes.Run] with mean_gap = the rate's drop."""
    rates = job_rate(series)
    known = sorted(r for r in rates if r is not None)
    if len(known) < 4:
        return [], rates, None
    ref = known[int(0.75 * (len(known) - 1))]
    drops = [None if r is None else 1.0 - r / ref for r in rates]
    return ep.straggling_runs(drops, eopts), rates, ref
