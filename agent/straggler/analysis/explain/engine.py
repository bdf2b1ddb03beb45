"""explain's analysis: the options, each rank's window and time, the verdict of the model, and the
findings that make the Report. It reads through a runner (runners.py) and never writes a database;
the decisions are model.py's (pure), the words findings.py's, the SQL sql.py's."""
import time
from dataclasses import asdict, dataclass, field

from ...errors import StragglerError, UsageError
from ...probes.symbols import COLLECTIVE_OPS
from ...store.steptime import rank_time
from . import coarse, devices, episodes, findings, model, network, span, sql, steps, timeline
from .causes import CAUSE_CLASSES
from .report import SEVERITY_ORDER, Report
from .runners import ConnRunner, DbRunner, FleetRunner
from .windows import calling_tids, cut_windows, group_threads

DEFAULT_BASELINE_FRACTION = 0.25      # the fixed cut's baseline when explain finds no episode
SEGMENTED_BINS = 12                  # a series this long has been segmented: the fixed cut names no one
PAUSE_JUDGED = 0.5                    # a rank's pauses: the model's min_gap over their bins, of the gap they left
MAX_EPISODES_JUDGED = 8               # episodes analysed in full (each a few queries); the rest by their series

N_SLICES = 8


@dataclass
class ExplainOptions:
    baseline_fraction: float = None  # a fixed cut: the first part of each rank's window is its own baseline
                                     # (without any fixed cut, explain finds the episodes in time)
    since: object = None             # only the trace from here, on the fleet timeline (the report's, UTC): an
                                     # ISO-8601 time or seconds from the trace's start (durations.parse_time_bound)
    until: object = None             # ... up to here (each node cut at that time through its own clock)
    since_mono_ns: int = None        # the lab's: only intervals from here on EVERY node's CLOCK_MONOTONIC (hosts
    until_mono_ns: int = None        # that share one kernel); a merged store of real machines needs since/until
    recent_from_ns: int = None       # the recent part starts here (instead of baseline_fraction)
    baseline_until_ns: int = None    # the baseline ends here (default: where the recent part starts)
    recent_s: float = None           # the recent part is each rank's last S seconds (instead of baseline_fraction)
    min_gap: float = model.ModelOptions.min_gap
    max_wait_ratio: float = model.ModelOptions.max_wait_ratio
    consistency: float = model.ModelOptions.consistency
    min_cause_share: float = model.ModelOptions.min_cause_share
    min_calls: int = 20              # a process with fewer traced calls in the window is not a rank
    user_xids: bool = False          # also count Xid lines a program wrote into the kernel log (a log relay;
                                     # the stand-in GPUs' tests): by default only the driver's own count
    timeout_s: float = 300.0         # per query

    @classmethod
    def from_kwargs(cls, **opts):
        unknown = set(opts) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"unknown explain option(s): {', '.join(sorted(unknown))}")
        return cls(**{k: v for k, v in opts.items() if v is not None})

    @property
    def fixed_window(self):
        """Whether the user cut the window (--last, a recent part from a time, a baseline fraction):
        then that one window is judged, as given; otherwise explain finds every episode in time."""
        return any(v is not None for v in (self.baseline_fraction, self.recent_from_ns, self.baseline_until_ns,
                                           self.recent_s))

    def episode_options(self):
        return episodes.EpisodeOptions(min_gap=self.min_gap)

    def model_options(self):
        return model.ModelOptions(min_gap=self.min_gap, max_wait_ratio=self.max_wait_ratio,
                                  consistency=self.consistency, min_cause_share=self.min_cause_share)


@dataclass
class Context:
    """What the findings read of one analysis (the runner, the options, each rank's window and time
    over its baseline and recent part, the slices of the recent part, the verdict, the SQL run)."""
    runner: object
    opts: "ExplainOptions"
    mopts: model.ModelOptions
    span_rows: list                      # sql.spans rows of the ranks judged
    windows: list                        # [Window]
    win_of: dict                         # (node, pid) -> Window
    threads_sql: str
    slices_sql: str
    verdict: model.Verdict
    slices: list                         # [[RankTime]] per slice of the recent part, in time order
    slice_index: list                    # the slice number of each entry of `slices`
    slice_ns: int
    recent: dict = field(default_factory=dict)     # (node, pid) -> RankTime over the recent part
    baseline: dict = field(default_factory=dict)   # (node, pid) -> RankTime over its baseline
    ranks: list = field(default_factory=list)      # [RankTime] recent, in (node, rank, pid) order
    mix: dict = field(default_factory=dict)        # (node, pid) -> {"launches", "collectives"} over the recent part,
                                                   # its kernels' size: {"sized", "threads", "threads_sq",
                                                   # "pieces", "piece_mean", "piece_mean_sq"}, and
                                                   # its recorded collectives: {"coll_calls", "coll_bytes"}
    mix_sql: str = None
    sizes_sql: str = None          # the ranks' kernel sizes (sql.launch_sizes)
    coll_sql: str = None           # the ranks' recorded collectives in their recent part (sql.comm_collectives)
    coll_rows: list = field(default_factory=list)  # its rows: per rank, communicator and op
    job_wait_def: str = None       # where the job's ranks wait for each other over its trace (timeline.job_wait_def),
                                   # where known: 'enqueue' or 'blocking'


def explain_connection(conn, source, missing=None, answered=None, **opts):
    """Explain the rows in an open SQLite connection with the store's schema (straggler watch).
    missing: {node: {"node", "status", "message"}} of nodes that did not answer; answered: {node: status}."""
    options = ExplainOptions.from_kwargs(**opts)
    return explain(ConnRunner(conn, missing, answered), options, source)


def top_cause(report, node):
    """The cause finding (one of CAUSE_CLASSES) that explains the largest share of `node`'s excess, or None."""
    causes = [f for f in report.findings if f.node == node and f.cause in CAUSE_CLASSES]
    return max(causes, key=lambda f: f.share, default=None)


def explain_db(db_path, **opts):
    """Explain one database (a merged cluster.db, or a single node's store). A failure on a bad value
    (a text where a number belongs, in a database changed after its merge) is one line naming it;
    another failure keeps its traceback."""
    options = ExplainOptions.from_kwargs(**opts)
    try:
        return explain(DbRunner(db_path, options.timeout_s), options, f"database {db_path}")
    except (StragglerError, OSError, MemoryError):
        raise
    except Exception:
        from ..merge.errors import show
        from ..merge.values import bad_value_line
        line = bad_value_line(db_path, show)
        if line:
            raise StragglerError(f"{db_path}: {line}; explain cannot read a bad value (merge the node stores again: "
                                 f"merge refuses such values, naming the store that holds one)") from None
        raise


def explain_fleet(nodes, tls, **opts):
    """Explain live, running each query on every node through the fleet client."""
    fleet_query = opts.pop("fleet_query", None)
    deadline_s = opts.pop("deadline_s", None)
    options = ExplainOptions.from_kwargs(**opts)
    if "timeout_s" not in opts:
        options.timeout_s = 30.0
    runner = FleetRunner(nodes, tls, options.timeout_s, deadline_s, fleet_query)
    spec = nodes if isinstance(nodes, str) else ",".join(map(str, nodes))
    return explain(runner, options, f"fleet {spec}")


def explain(runner, opts, source):
    """The analysis over one runner -> Report: the straggle episodes of the trace (or the one window the
    user cut), each judged by the model, with its findings."""
    started = time.monotonic()
    report = Report(source=source, options={k: v for k, v in asdict(opts).items() if v is not None})
    span.check(opts)                   # a bound that does not read fails before anything is asked
    process_ranks = runner.rows(sql.RANKS)
    cut = span.resolve(runner, opts)
    if opts.fixed_window:
        spans_sql = sql.spans(cut)
        span_rows = [r for r in runner.rows(spans_sql) if (r["calls"] or 0) >= opts.min_calls]
        _check_span(cut, span_rows, runner)
        world = _world(process_ranks, span_rows)
        report.missing = _missing(runner, span_rows, world)
        fraction = opts.baseline_fraction if opts.baseline_fraction is not None else DEFAULT_BASELINE_FRACTION
        analysis = analyse(runner, opts, cut_windows(span_rows, opts, fraction, cut), span_rows)
        emit(report, analysis)
        report.nodes = rank_rows(analysis)
    else:
        plan = _long_trace(runner, opts, cut)
        if plan is not None:           # a long trace: its roll-ups say where to look (coarse.py)
            spans_sql = plan.callers_sql
            span_rows = _spans_of_callers(plan.caller_rows, opts.min_calls)
            world = _world(process_ranks, span_rows)
            report.missing = _missing(runner, span_rows, world)
            analysis = _episodes_long(runner, opts, report, plan, span_rows)
        else:
            spans_sql = sql.callers(cut)
            callers = runner.rows(spans_sql)
            span_rows = _spans_of_callers(callers, opts.min_calls)
            _check_span(cut, span_rows, runner)
            world = _world(process_ranks, span_rows)
            report.missing = _missing(runner, span_rows, world)
            analysis = _episodes(runner, opts, report, callers, span_rows, cut)
    if cut.per_node is not None:
        report.span = cut.to_dict()
        findings.unaligned_cut_finding(report, cut, sql.NODE_CLOCKS)
    if not any(f.cause == "communicators" for f in report.findings):     # (the costliest episode's, if any)
        findings.communicator_finding(report, analysis, cut)
    findings.missing_finding(report, analysis, world, spans_sql)
    findings.error_findings(report, runner, cut)
    findings.lost_findings(report, runner.rows(sql.LOST))
    _order(report.findings)
    report.elapsed_s = round(time.monotonic() - started, 3)
    return report


def _world(process_ranks, span_rows):
    """The job's world size: its processes' in the span judged (a store holds every job its agent traced, of
    any size); every traced process's where none of them says."""
    judged = {(r["node"], int(r["pid"])) for r in span_rows}
    mine = [r["world_size"] or 0 for r in process_ranks if (r["node"], int(r["pid"])) in judged]
    return max(mine or [r["world_size"] or 0 for r in process_ranks] or [0])


def _check_span(cut, span_rows, runner):
    """A span with --since/--until that holds no rank's calls is the user's to widen (one line), unless
    nodes did not answer (then the report says which)."""
    if cut.per_node is not None and not span_rows and not runner.missing:
        raise UsageError(cut.empty_message())


def _spans_of_callers(callers, min_calls):
    """sql.spans-like rows (node, pid, rank, first_ts, last_ts, interval_ns, calls) per rank from sql.callers."""
    out = {}
    for r in callers:
        key = (r["node"], int(r["pid"]))
        acc = out.setdefault(key, dict(node=r["node"], pid=int(r["pid"]), rank=r["rank"], first_ts=r["first_ts"],
                                       last_ts=r["last_ts"], interval_ns=r["interval_ns"], calls=0))
        acc["first_ts"], acc["last_ts"] = min(acc["first_ts"], r["first_ts"]), max(acc["last_ts"], r["last_ts"])
        acc["interval_ns"] = max(acc["interval_ns"] or 0, r["interval_ns"] or 0)
        acc["calls"] += r["calls"] or 0
        if acc["rank"] is None:
            acc["rank"] = r["rank"]
    return [v for _, v in sorted(out.items()) if v["calls"] >= min_calls]


def _episodes(runner, opts, report, callers, span_rows, cut=None):
    """Find the episodes, judge the costliest in full; the report leads with the one that cost the job
    most. Without any, the whole trace is judged with the fixed cut (a device-wide change, waiters). Then
    the what-if of the whole trace, step by step (_whatif)."""
    series, judged, device = _judge_stretch(runner, opts, callers, span_rows, cut)
    analysis = _episodes_judged(runner, opts, report, span_rows, cut, series, judged, device)
    if series is not None:
        _whatif(runner, report, series, judged)
    return analysis


def _episodes_judged(runner, opts, report, span_rows, cut, series, judged, device):
    if not judged:
        # no episode in time: the fixed cut over the whole trace (a device-wide change, waiters). On a trace
        # too short to segment, a straggler it names is reported as that straggler's episode; on a longer
        # one the segmentation has looked at every stretch of it, and a rank that merely waits a little
        # less over the whole cut (a job's root rank, a fault's first second) is no straggler
        # (judged where the job's ranks wait for each other: with collectives that only enqueue, a window's
        # own choice could compare their time in collectives, which every rank spends none of)
        job_wait_def = timeline.job_wait_def(series) if series is not None else None
        analysis = analyse(runner, opts, cut_windows(span_rows, opts, DEFAULT_BASELINE_FRACTION, cut), span_rows,
                           wait_def=job_wait_def)
        analysis.job_wait_def = job_wait_def
        if series is not None and series.n_bins >= SEGMENTED_BINS and analysis.verdict.stragglers:
            _segmented_rejects(analysis.verdict)
        if not analysis.verdict.stragglers or series is None:
            warnings = device["warnings"] if device else []
            emit(report, analysis, beside=warnings)
            report.nodes = rank_rows(analysis)
            report.findings.extend(warnings)
            return analysis
        j = timeline.judge_window(series, analysis)
        j.series, j.cut = series, cut
        judged.append(j)
    _assemble(report, judged, device["warnings"] if device else [])
    report.timeline = timeline.timeline_dict(series)
    return judged[0].analysis


IMBALANCE_MIN_SHARE = 0.25             # the job lost this share of its time or more to slowest ranks no episode holds
                                       # (less is jitter on busy cores as much as imbalance: a
                                       # clean job on the 2-core test bed loses 15-19 %)


def _whatif(runner, report, series, judged):
    """The job's time lost at its sync points over the series' span (steps.py), split by what lost it: each
    episode (its node's ranks slowest there), and the rest — imbalance that moves between ranks, and jitter.
    Imbalance of IMBALANCE_MIN_SHARE of the job's time or more is a finding of its own: no node's fault,
    the job's."""
    found = steps.measure(runner, series)
    if not found.waits:
        report.whatif = dict(measured=False, why=found.why_not, sql=found.sql)
        return
    held = []
    for j in judged:
        e = j.episode
        label = dict(what="pauses" if e.pauses else "episode", node=e.node, all_along=j.all_along)
        held.append((label, e.node, list(e.keys), e.start_ns, e.end_ns))
    span_ns = found.ends[-1] - found.ends[0] if len(found.ends) > 1 else 0
    w = steps.whatif(found, held, span_ns)
    imb = w.imbalance
    ranks = [dict(node=k[0], pid=k[1], rank=series.rank_of.get(k), sync_points=n) for k, n in imb["slowest"][:4]]
    report.whatif = dict(measured=True, first_ns=found.ends[0], last_ns=found.ends[-1], span_s=round(w.span_s, 1),
                         sync_points=w.sync_points, waited_in=found.waited_in, lost_s=round(w.lost_s, 2),
                         lost_ratio=round(w.lost_ratio, 3), parts=w.parts,
                         imbalance=dict(lost_s=imb["lost_s"], sync_points=imb["sync_points"], slowest=ranks),
                         sql=found.sql)
    if w.span_s and imb["lost_s"] / w.span_s >= IMBALANCE_MIN_SHARE:
        report.findings.append(findings.imbalance_finding(report.whatif, len(series.ranks)))


def _segmented_rejects(verdict):
    verdict.rejected = [(s["rank"], "waits less over the trace as a whole, but in no stretch of it long and "
                                    "clear enough to be a straggle episode") for s in verdict.stragglers]
    verdict.stragglers = []


def _judge_stretch(runner, opts, callers, span_rows, cut, wait_def=None):
    """One stretch of the trace (all of it, or one a long trace's roll-ups point to: coarse.py) at its
    summaries' interval: its Series, the episodes the model confirms and that slowed the job (each with
    its series, cut and device evidence attached), and what its GPUs said (_device_evidence). wait_def:
    the job's, when its whole trace has told it (a long trace's roll-ups)."""
    series = timeline.build_series(runner, callers, opts, cut)
    if series is not None and wait_def is not None:
        series.wait_def = wait_def
    found = timeline.find_episodes(series, opts.episode_options()) if series else []
    judged = []
    for e in found:
        if not e.pauses:               # (pauses are too short for the zoom's on/off runs: their bins say it)
            timeline.zoom_in(runner, series, e, opts.min_gap)
    for e in found:
        windows = timeline.episode_windows(series, e, found)
        if not windows:
            continue
        # a rank's pauses are judged over their bins with the gap they left (their rhythm, not their size,
        # tells them from noise: episodes.pauses)
        min_gap = min(opts.min_gap, PAUSE_JUDGED * e.mean_gap) if e.pauses else None
        analysis = analyse(runner, opts, windows, span_rows, wait_def=series.wait_def,
                           expected_share=timeline.slice_share(series, e), min_gap=min_gap)
        # the episode's node, and a node whose own episode overlaps it, may be named in it: another rank
        # that merely waits a little less all along (a job's root rank, say) is no straggler of this time
        overlapping = {o.node for o in found if o.start < e.end and o.end > e.start}
        analysis.verdict.stragglers = [s for s in analysis.verdict.stragglers if s["rank"].key[0] in overlapping]
        if not any(s["rank"].key[0] == e.node for s in analysis.verdict.stragglers):
            continue                   # the model over the episode's own time does not confirm it
        j = timeline.judge(series, e, found, analysis)
        if not j.drags_the_job():
            continue                   # the job ran as fast as around it: nobody waited for this rank
        judged.append(j)
        if len(judged) >= MAX_EPISODES_JUDGED:
            break
    slow = timeline.job_slow_runs(series, opts.episode_options()) if series else None   # the whole job slower
    device = _device_evidence(runner, opts, series, found, judged, span_rows, slow) if series else None
    net = _network_evidence(runner, opts, series, found, judged, span_rows, slow) if series else None
    if net:
        device = device or {"warnings": []}
        device["warnings"].extend(net["warnings"])
    for j in judged:
        j.series, j.cut = series, cut
    return series, judged, device


def _assemble(report, judged, warnings):
    """The report of judged episodes (each with its series and cut): the costliest first, each with
    its own findings (where its peers waited for it, in its own time; its GPU's word), the report's
    findings and ranks those of the costliest."""
    judged.sort(key=lambda j: (not j.all_along, -j.lost_s))     # all along: its cost is the whole trace's
    for j in judged:
        if not j.findings:             # (named by its GPU's own word: its findings are made)
            sub = Report(source=report.source)
            emit(sub, j.analysis)
            findings.communicator_finding(sub, j.analysis, j.cut)      # where its peers waited for it
            j.findings = _order(sub.findings)
            for ev, texts in j.gpu_evidence:
                findings.add_device_evidence(j.findings, ev, texts)
            for ev, texts in j.link_evidence:
                findings.add_link_evidence(j.findings, ev, texts)
        report.episodes.append(timeline.episode_dict(j.series, j))
    report.findings.extend(warnings)
    top = judged[0]
    report.findings.extend(top.findings)
    report.nodes = rank_rows(top.analysis)
    report.stragglers = []
    for j in judged:
        for node in j.nodes:
            if node not in report.stragglers:
                report.stragglers.append(node)
    report.straggler = report.stragglers[0]


def _long_trace(runner, opts, cut):
    """A long trace with roll-ups, read whole (no --since/--until): its coarse.Plan, or None (a short
    trace, no roll-ups, or a change all along: the whole trace is read as it is)."""
    if cut.active or not coarse.available(runner):
        return None
    rows = runner.rows(sql.ROLLUP_CALLERS)
    callers = timeline.calling_threads(rows, opts.min_calls)
    if not callers.keys:
        return None
    clocks = timeline.node_clocks(runner, sorted({k[0] for k in callers.keys}))
    timeline.anchor_unaligned(clocks, {n: min(callers.first[k] for k in callers.keys if k[0] == n)
                                       for n in {k[0] for k in callers.keys}})
    if not coarse.too_long(callers, clocks):
        return None
    spans = [r for r in span.trace_spans(runner)[1] if r["first_ts"] is not None and r["last_ts"] is not None]
    if {r["node"] for r in spans} - {k[0] for k in callers.keys}:
        return None                    # a node without roll-ups (an older agent's): the whole trace is read
    trace_first = {(r["node"], int(r["pid"])): int(r["first_ts"]) for r in spans}
    trace_last = {(r["node"], int(r["pid"])): int(r["last_ts"]) for r in spans}
    rolled_to, sums = {}, {}           # sums: each rank's calling thread's time (where the job waits)
    for r in rows:
        key = (r["node"], int(r["pid"]))
        rolled_to[key] = max(rolled_to.get(key, 0), int(r["rolled_to"] or 0))
        if callers.calling.get(key) == int(r["tid"]):
            sums[key] = (r["wall_ns"] or 0, r["sync_ns"] or 0, r["other_ns"] or 0, r["coll_ns"] or 0)
    found = coarse.plan(runner, callers, rolled_to, clocks, opts.min_gap, trace_first, trace_last,
                        timeline.wait_def_of(list(sums.values())))
    if found is not None:
        found.caller_rows = rows
    return found


def _stretch(plan, stretch):
    """A stretch's Cut (its fleet-time bounds on each of its nodes' clocks, its ranks' pids) and its
    timeline.Callers (the whole trace's calling threads, their spans clipped to it)."""
    c = plan.callers
    nodes = sorted({k[0] for k in stretch.keys})
    pids = {}
    for node, pid in stretch.keys:
        pids.setdefault(node, []).append(pid)
    cut = span.Cut(clocks={n: plan.clocks[n] for n in nodes}, pids=pids, trace_start_ns=plan.t0_ns,
                   trace_end_ns=plan.t1_ns, wall=any(k.aligned for k in plan.clocks.values()))
    cut.bound(stretch.lo_ns, stretch.hi_ns)
    first, last = {}, {}
    for key in stretch.keys:
        lo, hi = cut.per_node[key[0]]
        first[key] = max(min(c.first[key], plan.trace_first.get(key, c.first[key])), lo)
        last[key] = min(max(c.last[key], plan.trace_last.get(key, c.last[key])), hi)
    keys = [k for k in stretch.keys if last[k] > first[k]]
    callers = timeline.Callers(keys, c.calling, c.rank_of, c.interval_of, first, last)
    return cut, callers


LONG_NOBODY_S = 600.0                  # a long trace with no episode: its last minutes are the report's cut


def _episodes_long(runner, opts, report, plan, span_rows):
    """_episodes over a long trace, one stretch of its Plan at a time (coarse.py): every stretch's
    episodes, the report leading with the costliest."""
    judged, warnings, read = [], [], []
    report.whatif = dict(measured=False, why="a long trace, read through its roll-ups: its sync points are lined up "
                                             "only on a trace read whole (--since/--until: a part of it)")
    for stretch in plan.stretches:
        cut, callers = _stretch(plan, stretch)
        if not callers.keys:
            continue
        series, found, device = _judge_stretch(runner, opts, callers, span_rows, cut, plan.wait_def)
        judged.extend(found)
        seen = {(w.node, w.cause, w.numbers.get("gpu")) for w in warnings}
        warnings.extend(w for w in (device["warnings"] if device else [])      # a GPU's word once, not per stretch
                        if (w.node, w.cause, w.numbers.get("gpu")) not in seen)
        if series is not None:
            read.append((stretch, series))
    if not judged:
        # nobody in any stretch the roll-ups pointed to: why no rank is a straggler, over the trace's last
        # minutes (the whole trace has been looked at, so the fixed cut names no one)
        tail = coarse.Stretch(lo_ns=max(plan.t0_ns, plan.t1_ns - int(LONG_NOBODY_S * 1e9)), hi_ns=plan.t1_ns,
                              keys=coarse.ranks_for(plan.callers.keys, set()))
        cut, _ = _stretch(plan, tail)
        keys = set(tail.keys)
        rows = [r for r in span_rows if (r["node"], int(r["pid"])) in keys]
        analysis = analyse(runner, opts, cut_windows(rows, opts, DEFAULT_BASELINE_FRACTION, cut), rows)
        analysis.job_wait_def = plan.wait_def
        _segmented_rejects(analysis.verdict)
        emit(report, analysis, beside=warnings)
        report.nodes = rank_rows(analysis)
        report.findings.extend(warnings)
        report.timeline = timeline.long_timeline_dict(plan, read)     # where it looked, and found nobody
        return analysis
    _assemble(report, judged, warnings)
    report.timeline = timeline.long_timeline_dict(plan, read)
    return judged[0].analysis


def _device_evidence(runner, opts, series, found, judged, span_rows, slow):
    """What the GPUs said (devices.py), where the store has their samples: the judged episodes' GPUs'
    evidence (into each one's `gpu_evidence`); an episode for a GPU that alone says why when the whole job slowed with nobody
    waiting less (collectives that only enqueue) — appended to `judged`; and warnings for a GPU's
    evidence without a slowdown. `slow`: where the whole job ran slower (timeline.job_slow_runs). None
    without device samples."""
    if not devices.has_device_tables(runner):
        return None
    ranks_of = {(r["node"], int(r["pid"])): r for r in runner.rows(devices.PROCESS_RANKS)}
    rows = [dict(r, local_rank=ranks_of.get((r["node"], int(r["pid"])), {}).get("local_rank")) for r in span_rows]
    gpu_of = devices.gpus_of(runner.rows(devices.GPU_OF_PROCESS), rows)
    job = {(k[0], gpu) for k, gpus in gpu_of.items() if k in series.ranks for gpu in gpus}   # the job's GPUs
    out = {"warnings": []}
    named = set()
    for j in judged:                   # the named ranks' GPUs over their own episode
        e = j.episode
        evidence, texts = devices.over(runner, series, e.start, e.end, opts.user_xids, job)
        standing = {ev.key: ev for ev in devices.standing_out(evidence)}
        for s in j.analysis.verdict.stragglers:
            for gpu in gpu_of.get(s["rank"].key, []):
                ev = standing.get((s["rank"].key[0], gpu))
                if ev is not None and ev.key not in named:
                    j.gpu_evidence.append((ev, texts))
                    named.add(ev.key)
    busy = {b for j in judged for b in range(j.episode.start, j.episode.end)}     # named by the waits
    series_texts = {"gpu_samples": devices.device_series_sql(series),
                    "gpu_errors": devices.device_errors_sql(series, opts.user_xids)}
    per_gpu = devices.device_runs(runner.rows(series_texts["gpu_samples"]), runner.rows(series_texts["gpu_errors"]),
                                  job=job)
    def device_named(ev, texts, run, rates, ref):
        """The episode of a GPU named by its own word (`texts`: its SQL) over `run` (rates/ref None: all
        along), its findings placed on its node's clock."""
        keys = sorted(k for k, gpus in gpu_of.items() if k[0] == ev.node and ev.gpu in gpus and k in series.ranks)
        return _named_by_its_word(runner, opts, series, found, span_rows, ev, keys, run, rates, ref,
                                  lambda j, ranks: findings.device_findings(series.sql, texts, j, ev, ranks))

    # a GPU that said so all along: the trace has no clean time to measure the job's slowdown against, so
    # the GPU is judged against the other GPUs at work at the same time (devices.standing_out)
    along = _all_along_runs(series, per_gpu, named)
    if along:
        lo, hi = min(r[0] for r in along.values()), max(r[1] for r in along.values())
        evidence, texts = devices.over(runner, series, lo, hi, opts.user_xids, job)
        standing = {ev.key: ev for ev in devices.standing_out(evidence)}
        for key, (start, end, kind) in sorted(along.items()):
            ev = standing.get(key)
            if ev is None or ev.kind != kind:
                continue
            run = episodes.Run(start=start, end=end, bins=end - start, on_runs=[(start, end)])
            judged.append(device_named(ev, texts, run, None, None))
            named.add(ev.key)
        for kind, keys in devices.alike(evidence).items():
            keys = [ev.key for ev in keys if ev.key in along]
            if keys:
                ev = evidence[keys[0]]
                out["warnings"].append(findings.device_warning(
                    ev, texts, f"all along this trace, as on {len(keys) - 1} other GPU(s) alike: a condition of the "
                               f"fleet, no one GPU's (and no clean time in the trace to measure the job against)"))
                named.update(keys)
    runs, rates, ref = slow
    slow_bins = set()
    for run in runs:                   # the job slowed and nobody waited less: whose GPU says why?
        slow_bins.update(range(run.start, run.end))
        if any(b in busy for b in range(run.start, run.end)):
            continue
        evidence, texts = devices.over_run(runner, series, run, opts.user_xids, job)
        for ev in devices.standing_out(evidence):
            if ev.key in named:
                continue
            own = devices.within([r for r in per_gpu.get(ev.key, []) if r[2] == ev.kind], run)   # where it said it
            if own is None:
                continue
            judged.append(device_named(ev, texts, own, rates, ref))
            named.add(ev.key)
        for kind, keys in devices.alike_runs(per_gpu, run, len(evidence)).items():
            ev = evidence.get(keys[0]) or devices.GpuEvidence(*keys[0], kind=kind, detail="its samples say so")
            ev = ev if ev.kind == kind else devices.GpuEvidence(ev.node, ev.gpu, kind=kind, detail=ev.detail or kind)
            out["warnings"].append(findings.device_warning(
                ev, texts, f"as on {len(keys) - 1} other GPU(s) alike while the job ran ×"
                           f"{1 / max(0.1, 1 - run.mean_gap):.2f} slower: a condition of the fleet, no one GPU's"))
    # the rest: a GPU's own runs of evidence where the job did not slow down (and no episode named it)
    for key, gpu_runs in sorted(per_gpu.items()):
        if key in named:
            continue
        for start, end, kind in gpu_runs:
            if any(b in slow_bins or b in busy for b in range(start, end)):
                continue
            evidence, run_texts = devices.over(runner, series, start, end, opts.user_xids, job)
            ev = evidence.get(key)
            if ev is not None and ev.kind:
                out["warnings"].append(findings.device_warning(ev, run_texts, "while the job did not slow down"))
                break
    return out


def _named_by_its_word(runner, opts, series, found, span_rows, ev, keys, run, rates, ref, make_findings):
    """The episode of a unit named by its own word (a GPU's, a node's links): `ev` over `run` (rates/ref
    None: all along) with its node's ranks `keys`, its findings (make_findings(judged, ranks)) placed on
    its node's clock."""
    j = timeline.judge_device(series, run, ev, keys, rates, ref, eopts=opts.episode_options())
    j.analysis = analyse(runner, opts, timeline.episode_windows(series, j.episode, found), span_rows)
    j.findings = make_findings(j, [series.rank_of.get(k) for k in keys if series.rank_of.get(k) is not None])
    for f in j.findings:
        f.at_ns = series.to_node(ev.node, j.episode.start_ns)
        f.window_ns = [f.at_ns, series.to_node(ev.node, j.episode.end_ns)]
    return j


def _network_evidence(runner, opts, series, found, judged, span_rows, slow):
    """What the nodes' links said (network.py), where the stores have network samples: an episode for a
    node whose link alone says why when the whole job slowed with nobody waiting less (every rank waits
    alike in its collectives behind a slow link) and no GPU said why — appended to `judged`; a named
    straggler's link evidence attached to its episode; warnings for link evidence on every node alike
    (the fabric's), between two nodes that cannot be told apart, or without a slowdown. `slow` as for
    _device_evidence. None without network samples."""
    if not network.has_net_tables(runner):
        return None
    out = {"warnings": []}
    named = set()
    for j in judged:                   # the named ranks' nodes over their own episode: their link's word too
        e = j.episode
        if not j.analysis or not j.analysis.verdict.stragglers:
            continue
        evidence, _, texts = network.over(runner, series, e.start, e.end)
        standing = {ev.key: ev for ev in network.standing_out(evidence)}
        for node in sorted({s["rank"].key[0] for s in j.analysis.verdict.stragglers}):
            if node in standing and node not in named:
                j.link_evidence.append((standing[node], texts))
                named.add(node)
    busy = {b for j in judged for b in range(j.episode.start, j.episode.end)}     # named already
    # a link slow all along: the trace has no clean time to measure the job's slowdown against, so the
    # node's links are judged against the other nodes' at the same time, in each third of the trace
    along = _net_all_along(runner, series, busy)
    if along is not None:
        ev, texts, run = along
        keys = sorted(k for k in series.ranks if k[0] == ev.node)
        judged.append(_named_by_its_word(runner, opts, series, found, span_rows, ev, keys, run, None, None,
                                         lambda j, ranks: findings.link_findings(series.sql, texts, j, ev, ranks)))
        named.add(ev.node)
        busy.update(range(run.start, run.end))
    runs, rates, ref = slow
    for run in runs:                   # the job slowed, nobody waited less, no GPU said why: whose link?
        if any(b in busy for b in range(run.start, run.end)):
            continue
        evidence, ambiguous, texts = network.over(runner, series, run.start, run.end)
        why = f"while the job ran ×{1 / max(0.1, 1 - run.mean_gap):.2f} slower"
        for ev in network.standing_out(evidence):
            if ev.node in named:
                continue
            keys = sorted(k for k in series.ranks if k[0] == ev.node)
            judged.append(_named_by_its_word(runner, opts, series, found, span_rows, ev, keys, run, rates, ref,
                                             lambda j, ranks, ev=ev: findings.link_findings(series.sql, texts, j, ev,
                                                                                            ranks)))
            named.add(ev.node)
        for evs in network.alike(evidence).values():
            out["warnings"].append(findings.link_warning(
                evs[0], texts, f"as on {len(evs) - 1} other node(s) alike {why}: a condition of the fabric, no one "
                               f"node's", fabric=True))
        if ambiguous:
            pairs = "; ".join(" and ".join(p) for p in ambiguous)
            ev = network.LinkEvidence(node=ambiguous[0][0], kind="net-congestion",
                                      detail=f"slow round trips between {pairs}, whose ends cannot be told apart")
            out["warnings"].append(findings.link_warning(ev, texts, why, node=None, fabric=True))
    if not runs and not busy and series.n_bins >= 2:   # no slowdown, nobody named: a link's evidence warns
        evidence, _, texts = network.over(runner, series, 0, series.n_bins)
        for ev in network.standing_out(evidence):
            if ev.node not in named:
                out["warnings"].append(findings.link_warning(ev, texts, "while the job did not slow down"))
    return out


NET_ALONG_PARTS = 3                    # a link slow all along stands out in each of this many parts of the trace


def _net_all_along(runner, series, busy):
    """(LinkEvidence, its SQL, the run of the job's bins) of the one node whose links stand out with the
    same kind in each of NET_ALONG_PARTS parts of the trace, where no episode is named yet; else None."""
    job_bins = sorted(set().union(*(timeline.usable(series, k) for k in series.ranks))) if series.ranks else []
    if len(job_bins) < 2 * NET_ALONG_PARTS or sum(1 for b in job_bins if b in busy) > len(job_bins) / 2:
        return None
    size = len(job_bins) / NET_ALONG_PARTS
    kinds, last = None, None
    for part in range(NET_ALONG_PARTS):
        lo, hi = job_bins[int(part * size)], job_bins[min(len(job_bins) - 1, int((part + 1) * size) - 1)] + 1
        evidence, _, texts = network.over(runner, series, lo, hi)
        standing = {ev.node: ev.kind for ev in network.standing_out(evidence)}
        kinds = standing if kinds is None else {n: k for n, k in kinds.items() if standing.get(n) == k}
        if not kinds:
            return None
    if len(kinds) != 1:
        return None
    start, end = job_bins[0], job_bins[-1] + 1
    evidence, _, texts = network.over(runner, series, start, end)
    ev = evidence.get(next(iter(kinds)))
    if ev is None or ev.kind != kinds[ev.node]:
        return None
    return ev, texts, episodes.Run(start=start, end=end, bins=end - start, on_runs=[(start, end)])


ALL_ALONG_SHARE = 0.8                  # a GPU's evidence over this share of the job's bins: there all along


def _all_along_runs(series, per_gpu, named):
    """{(node, gpu): (start, end, kind)}: a GPU's run of evidence (devices.device_runs) that covers at least
    ALL_ALONG_SHARE of the bins in which the job ran — a GPU slow before tracing began, or for most of the
    trace, where the job has no clean time of its own to be measured against."""
    job_bins = sorted(set().union(*(timeline.usable(series, k) for k in series.ranks))) if series.ranks else []
    if len(job_bins) < 4:
        return {}
    out = {}
    for key, gpu_runs in per_gpu.items():
        if key in named:
            continue
        for start, end, kind in gpu_runs:
            inside = sum(1 for b in job_bins if start <= b < end)
            if inside >= ALL_ALONG_SHARE * len(job_bins):
                out[key] = (start, end, kind)
                break
    return out


def analyse(runner, opts, windows, span_rows, wait_def=None, expected_share=1.0, min_gap=None):
    """One window per rank -> the model's inputs (each rank's time over its baseline and recent part, the
    slices of the recent part) and its verdict, as a Context for the findings. wait_def: the job's wait
    definition, when its whole trace has told it (timeline.job_wait_def). expected_share: the share of
    the recent part in which a straggler waits less (an intermittent episode's duty: timeline.slice_share);
    the consistency test asks for its share of that."""
    mopts = opts.model_options()
    mopts.wait_def = wait_def
    if min_gap is not None:
        mopts.min_gap = min_gap
    mopts.consistency *= expected_share
    rank_of = {(r["node"], int(r["pid"])): r["rank"] for r in span_rows}
    interval_of = {(r["node"], int(r["pid"])): int(r["interval_ns"] or 1) for r in span_rows}
    threads_sql = sql.threads(windows)
    grouped = group_threads(runner.rows(threads_sql)) if windows else {}
    calling = calling_tids(grouped)
    win_of = {w.key: w for w in windows}
    recent, baseline = {}, {}
    for key, parts in grouped.items():
        if key not in calling:
            continue
        w = win_of[key]
        rt = rank_time(key, parts.get("recent", []), w.recent_ns, rank_of.get(key), calling[key])
        if rt is not None:
            recent[key] = rt
        bt = rank_time(key, parts.get("baseline", []), w.baseline_ns, rank_of.get(key), calling[key])
        if bt is not None:
            baseline[key] = bt

    # slices of the recent part (the consistency test)
    slice_rows, slices_sql, slice_ns = [], None, None
    if recent:
        longest = max(win_of[k].t1 - win_of[k].tb for k in recent)
        step = max(interval_of.get(k, 1) for k in recent)
        slice_ns = max(step, (longest // N_SLICES) // step * step)
        slices_sql = sql.slices([w for w in windows if w.key in recent], slice_ns)
        slice_rows = runner.rows(slices_sql)
    per_slice = {}
    for r in slice_rows:
        per_slice.setdefault(int(r["slice"]), {}).setdefault((r["node"], int(r["pid"])), []).append(r)
    slices, slice_index = [], []
    for index, by_rank in sorted(per_slice.items()):
        ranks_here = []
        for key, rows in by_rank.items():
            if key not in calling:
                continue
            main = next((x for x in rows if x["tid"] == calling[key]), None)
            if main is None:
                continue
            wall = int(main["intervals"]) * interval_of.get(key, 1)
            rt = rank_time(key, rows, wall, rank_of.get(key), calling[key])
            if rt is not None:
                ranks_here.append(rt)
        if len(ranks_here) >= 2:
            slices.append(ranks_here)
            slice_index.append(index)

    ranks = sorted(recent.values(), key=lambda r: (r.key[0], r.rank if r.rank is not None else -1, r.key[1]))
    mix_sql = sql.call_mix(windows) if windows else None
    sizes_sql = sql.launch_sizes(windows) if windows else None
    # the recorded collectives, read once: the bytes they carry here, and their communicators in the findings
    coll_windows = [w for w in windows if w.key in recent]
    coll_sql = sql.comm_collectives(coll_windows, COLLECTIVE_OPS) if coll_windows else None
    coll_rows = runner.rows(coll_sql) if coll_sql else []
    mix = {}
    for r in (runner.rows(mix_sql) if mix_sql else []):
        if r["part"] == "recent":
            mix[(r["node"], int(r["pid"]))] = dict(launches=int(r["launches"] or 0), collectives=int(r["collectives"] or 0))
    for r in (runner.rows(sizes_sql) if sizes_sql and mix else []):
        if (r["node"], int(r["pid"])) in mix:
            mix[(r["node"], int(r["pid"]))].update(sized=int(r["sized"]), threads=r["threads"], threads_sq=r["threads_sq"],
                                                   pieces=r["pieces"], piece_mean=r["piece_mean"],
                                                   piece_mean_sq=r["piece_mean_sq"])
    for r in coll_rows:
        m = mix.get((r["node"], int(r["pid"])))
        if m is not None and r["sized_calls"]:
            m["coll_calls"] = m.get("coll_calls", 0) + int(r["sized_calls"])
            m["coll_bytes"] = m.get("coll_bytes", 0) + (r["bytes"] or 0)
    verdict = model.find_stragglers(ranks, slices, mopts, mix=mix)
    return Context(runner=runner, opts=opts, mopts=mopts, span_rows=span_rows, windows=windows, win_of=win_of,
                   threads_sql=threads_sql, slices_sql=slices_sql, verdict=verdict, slices=slices,
                   slice_index=slice_index, slice_ns=slice_ns, recent=recent, baseline=baseline, ranks=ranks,
                   mix=mix, mix_sql=mix_sql, sizes_sql=sizes_sql, coll_sql=coll_sql, coll_rows=coll_rows)


def _order(found):
    """Findings in the order they are read: the straggler findings first, in their rank order (a stable
    sort keeps it), then by severity and share. Sorts in place; returns the list."""
    found.sort(key=lambda f: (f.cause != "straggler", SEVERITY_ORDER.get(f.severity, 9), -f.share))
    return found


def emit(report, ctx, beside=()):
    """The findings of one analysis: the straggler(s) with their causes and the waiters, or why no rank
    is one (beside: the trace's warnings that the no-straggler findings read, not added here);
    report.straggler(s) from its verdict."""
    verdict = ctx.verdict
    report.stragglers = []
    for s in verdict.stragglers:
        if s["rank"].key[0] not in report.stragglers:
            report.stragglers.append(s["rank"].key[0])
    report.straggler = report.stragglers[0] if report.stragglers else None
    if verdict.stragglers:
        for i, group in enumerate(model.by_node(verdict.stragglers)):
            findings.straggler_findings(report, ctx, group, first=(i == 0))
        findings.waiter_finding(report, ctx)
    else:
        findings.no_straggler_findings(report, ctx, beside)


def rank_rows(ctx):
    """The per-rank rows of the report (the recent part of one analysis)."""
    named = {s["rank"].key for s in ctx.verdict.stragglers}
    out = []
    for r in ctx.ranks:
        out.append(dict(
            node=r.key[0], pid=r.key[1], rank=r.rank, thread=f"{r.comm} ({r.tid})",
            wait_pct=round(100 * r.wait_share(ctx.verdict.wait_def), 1), host_pct=round(100 * r.share("host"), 1),
            runq_pct=round(100 * r.share("runq"), 1), sync_pct=round(100 * r.share("sync"), 1),
            io_pct=round(100 * r.share("io"), 1), coll_pct=round(100 * r.share("coll"), 1),
            blocked_pct=round(100 * r.share("blocked"), 1), work_pct=round(100 * r.share("work"), 1),
            role="straggler" if r.key in named else ""))
    return out


def _missing(runner, span_rows, world):
    """Nodes that did not answer or hold no rank's calls, and ranks of the job no node holds."""
    nodes = sorted({r["node"] for r in span_rows})
    missing = dict(runner.missing)
    present = {r["rank"] for r in span_rows if r["rank"] is not None}
    for name in runner.answered:
        if name not in nodes and name not in missing:
            missing[name] = dict(node=name, status="no-data", message="answered, but traced no rank's calls")
    absent = sorted(set(range(world)) - present) if world else []
    if absent and not missing:
        for rk in absent:
            missing[f"rank {rk}"] = dict(node=f"rank {rk}", status="no-data", rank=rk,
                                         message=f"world_size is {world} but no node with rank {rk} has data")
    return list(missing.values())
