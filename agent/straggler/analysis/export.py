"""Export a store or a merged cluster database as a timeline for the Perfetto UI:
`straggler export -d DB -o trace.pftrace` writes Perfetto's native protobuf trace (TrackEvent, built
with the `perfetto` package's streaming trace builder; see pftrace.py); `-o trace.json` or
`--format json` writes Chrome Trace Event JSON for tools that need it.

The same content in both formats:
  - one process per node, named "NODE (rank R)", in rank order then node name (stable across
    exports), with its clock alignment (offset and uncertainty from merge) in its description;
  - per node, tracks for: each traced thread's CUDA/driver/NCCL calls as slices (the op's
    arguments — ret, bytes, grid/block, seq — as arguments); calls that overlap without nesting go
    to extra lanes ("comm tid · lane 2"), so every track nests properly; the thread's off-CPU
    intervals (preempted by …/blocked) and its run-queue waits, each on a track of their own; block
    I/O per issuing process, in lanes;
  - counters per node: calls/s and block I/O bytes/s per second, and per rank the step-time
    components of the step-time model (straggler.store.steptime.rank_time over each thread_time interval: waiting
    for peers, run queue, host compute, synchronize, collectives, CUDA calls, own block I/O,
    blocked), as % of wall time;
  - explain's findings as instant events on the node's "findings" track, at the time the evidence
    begins (Finding.at_ns), with the summary, cause, share and recommendation.
Times are on the fleet timeline: events.ts_aligned when the merge filled it, else the node's
monotonic ts through its clock_pairs (the same segments merge uses) minus its measured offset.

Cuts: --since/--until, --node, and --around-findings S (only S seconds either side of each
finding); what was skipped is counted per reason in the summary.

The writers stream: SQL cursors (ordered by SQLite, which sorts on disk) feed a sink that writes
as it goes; memory depends on the number of tracks, not on the trace length. The output is written
to a temporary file beside it and renamed into place. This module only reads the database.
"""
import bisect
import datetime
import json
import math
import os
import shutil
import sqlite3
import tempfile
import time
import urllib.parse

from ..errors import StragglerError
from ..text import sql_quote
from ..store import steptime
from .merge import Aligner, clock_segments

FORMATS = ("perfetto", "json")
FETCH = 2000
MAX_JOBS = 8
PARALLEL_MIN_EVENTS = 200_000
PART_TIMEOUT_S = 6 * 3600          # a part that takes longer than this is stopped and the export fails
SEPARATOR = ",\n"
# the step-time model's components as counters: (label, components summed), in the order shown
MODEL_COUNTERS = (("waiting for peers %", ("coll", "blocked")), ("run queue %", ("runq",)),
                  ("host compute %", ("host",)), ("synchronize %", ("sync",)), ("collectives %", ("coll",)),
                  ("CUDA calls %", ("work",)), ("own block I/O %", ("io",)), ("blocked %", ("blocked",)))


class ExportError(StragglerError):
    pass


def format_for(out_path, fmt=None):
    """The format to write: the one asked for, else by the output's name (.json: json, else perfetto)."""
    if fmt:
        if fmt not in FORMATS:
            raise ExportError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
        return fmt
    return "json" if str(out_path).lower().endswith(".json") else "perfetto"


def _open_ro(path):
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such database; pass -d a node's store or a merged cluster.db")
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro", uri=True)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        conn.execute("SELECT seq, node, ts, duration, ts_aligned FROM events LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        raise ExportError(f"{path}: not a readable straggler database ({exc})")
    return conn


class _NodeClock:
    """mono ns -> fleet-timeline ns for one node: merge's Aligner (clock pairs minus the node's offset);
    without clock pairs, the raw monotonic time (said in the trace's metadata as its timeline)."""

    def __init__(self, node, pairs, offset_ns):
        self.node = node
        self.aligner = Aligner()
        self.aligner.set_node(node, clock_segments(pairs) if pairs else [], offset_ns or 0)
        self.exact = node in self.aligner.nodes

    def __call__(self, ts):
        return self.aligner(self.node, ts) if self.exact else ts


def _clock_info(conn, nodes):
    """Per node: its latest measured offset (what merge used) and uncertainty, and its aligners."""
    offsets = {}
    for node, off, unc, method in conn.execute(
            "SELECT node, offset_ns, uncertainty_ns, method FROM clock_offsets ORDER BY measured_at"):
        offsets[node] = dict(offset_ns=off, uncertainty_ns=unc, method=method)
    align = {node: _NodeClock(node, conn.execute("SELECT mono_ns, real_ns FROM clock_pairs WHERE node = ?",
                                                 (node,)).fetchall(), offsets.get(node, {}).get("offset_ns", 0))
             for node in nodes}
    return offsets, align


def parse_time_bound(value, trace_start_ns):
    """--since/--until: seconds from the trace start ('30', '30s', '1.5'), or an ISO-8601 time."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return trace_start_ns + int(float(value) * 1e9)
    text = str(value).strip()
    try:
        return trace_start_ns + int(float(text.rstrip("s")) * 1e9)
    except ValueError:
        pass
    try:
        dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ExportError(f"time bound {value!r}: expected seconds from the trace start (e.g. 30) or ISO-8601")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return int(dt.timestamp() * 1e9)


class _Cut:
    """The parts of the timeline that are kept: sorted, disjoint [lo, hi] intervals (None: all)."""

    def __init__(self, intervals=None, reason=None):
        self.reason = reason
        if intervals is None:
            self.los = None
            return
        merged = []
        for lo, hi in sorted(intervals):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.los = [m[0] for m in merged]
        self.his = [m[1] for m in merged]

    @property
    def everything(self):
        return self.los is None

    def keeps(self, start, end):
        """Does [start, end] touch a kept interval?"""
        if self.los is None:
            return True
        i = bisect.bisect_right(self.los, end) - 1
        return i >= 0 and self.his[i] >= start

    def span(self):
        return (self.los[0], self.his[-1]) if self.los else (None, None)


class _Lanes:
    """Greedy lane assignment for slices sorted by (start, -duration): a slice stays on a lane when it
    starts after the lane's open slices end or nests inside the innermost one."""

    def __init__(self):
        self.stacks = []

    def place(self, start, end):
        for i, stack in enumerate(self.stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                return i
        self.stacks.append([end])
        return len(self.stacks) - 1


# ---------------------------------------------------------------- the Chrome JSON sink

def _us(ns):
    """ns (int) -> exact decimal µs text."""
    if ns < 0:
        return "-" + _us(-ns)
    whole, frac = divmod(int(ns), 1000)
    return f"{whole}.{frac:03d}"


class JsonSink:
    """Chrome Trace Event JSON ({"traceEvents": [...], "displayTimeUnit": "ms"}): `ts` in exact decimal
    µs since the trace start (the start in ns since the epoch is in otherData.trace_start_ns)."""

    def __init__(self, fh, start_ns):
        self.fh = fh
        self.start = start_ns
        self.count = 0
        self._enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        self._names = {}          # slice names repeat (op names, "preempted by X"): encode each once
        self.next_tid = 1
        self.sort = 0
        fh.write('{"traceEvents":[\n')

    def _event(self, obj, ts=None):
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        if ts is not None:   # exact decimal µs: splice in the number json would round
            text = text[:-1] + f',"ts":{_us(ts - self.start)}' + "}"
        self.fh.write((SEPARATOR if self.count else "") + text)
        self.count += 1

    def process(self, pid, name, sort_index, rank, description):
        self._event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        self._event({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}})
        labels = [f"rank {rank}"] if rank is not None else []
        if description:
            labels.append(description)
        if labels:
            self._event({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": ", ".join(labels)}})

    def track(self, pid, name, lane=None, first=False):
        """A thread-like track; lane N > 0 of a laned track is named "name · lane N+1"; first: before the others."""
        tid = self.next_tid
        self.next_tid += 1
        self.sort += 1
        if lane:
            name = f"{name} · lane {lane + 1}"
        self._event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self._event({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                     "args": {"sort_index": -1 if first else self.sort}})
        return (pid, tid)

    def counter_track(self, pid, name, unit):
        return (pid, name)

    def slice(self, track, t, dur, name, cat, args):
        """A complete ("X") event, formatted directly: the hot path of the export."""
        encoded = self._names.get(name)
        if encoded is None:
            encoded = self._enc(name)
            if len(self._names) < 10_000:      # bounded: memory must not grow with the trace
                self._names[name] = encoded
        self.fh.write(f'{SEPARATOR if self.count else ""}{{"ph":"X","name":{encoded},"cat":"{cat}","pid":{track[0]},'
                      f'"tid":{track[1]},"ts":{_us(t - self.start)},"dur":{_us(dur)},"args":{self._enc(dict(args))}}}')
        self.count += 1

    def track_done(self, track):
        pass

    def counters(self, tracks_values, t):
        """Counter samples at t: [(track, value)]; one "C" event per counter name."""
        for (pid, name), value in tracks_values:
            self._event({"ph": "C", "name": name, "pid": pid, "tid": 0, "args": {"value": value}}, ts=t)

    def instant(self, track, t, name, cat, args):
        if track is None:
            self._event({"ph": "i", "s": "g", "name": name, "cat": cat, "pid": 0, "tid": 0, "args": dict(args)}, ts=t)
        else:
            self._event({"ph": "i", "s": "t", "name": name, "cat": cat, "pid": track[0], "tid": track[1],
                         "args": dict(args)}, ts=t)

    def close(self, meta):
        self.fh.write('\n],"displayTimeUnit":"ms","otherData":' + json.dumps(meta, default=str) + "}\n")

    @property
    def records(self):
        return self.count


# ---------------------------------------------------------------- the export

class _Plan:
    """What is exported: nodes in order, their clocks, the trace start, the cut, explain's report."""

    def __init__(self, conn, db_path, since, until, nodes, findings, around_findings):
        inv = conn.execute("SELECT node, MIN(rank), MIN(ts), COUNT(*) FROM events GROUP BY node").fetchall()
        self.skipped = {}
        if nodes:
            wanted = set(nodes)
            unknown = wanted - {r[0] for r in inv}
            if unknown:
                raise ExportError(f"--node {', '.join(sorted(unknown))}: not in {db_path} "
                                  f"(it has {', '.join(sorted(r[0] for r in inv)) or 'no events'})")
            other = sum(r[3] for r in inv if r[0] not in wanted)
            if other:
                self.skipped["other nodes (--node)"] = other
            inv = [r for r in inv if r[0] in wanted]
        if not inv:
            raise ExportError(f"{db_path}: no events to export")
        self.proc_rank = dict(conn.execute(
            "SELECT node, MIN(rank) FROM processes WHERE rank IS NOT NULL GROUP BY node"))

        def rank_of(r):
            rk = self.proc_rank.get(r[0], r[1])
            return rk if rk is not None else 1 << 30

        self.order = [r[0] for r in sorted(inv, key=lambda r: (rank_of(r), r[0]))]
        self.first_ts = {r[0]: r[2] for r in inv}
        self.rank = {r[0]: self.proc_rank.get(r[0], r[1]) for r in inv}
        self.node_pid = {n: i + 1 for i, n in enumerate(self.order)}
        self.offsets, self.align = _clock_info(conn, self.node_pid)
        self.events = sum(r[3] for r in inv)
        self.has_aligned = conn.execute("SELECT 1 FROM events WHERE ts_aligned IS NOT NULL LIMIT 1").fetchone() is not None
        start = min(self.align[n](t0) for n, _, t0, _ in inv)
        if self.has_aligned:
            row = conn.execute("SELECT MIN(ts_aligned) FROM events").fetchone()
            start = min(start, row[0])
        self.start_ns = start
        self.timeline = ("ts_aligned" if self.has_aligned else "clock_pairs"
                         if all(a.exact for a in self.align.values()) else "monotonic (no clock pairs for some nodes)")
        self.realtime = not self.timeline.startswith("monotonic")
        self.report = None
        if findings or around_findings is not None:
            from .explain import explain_db
            self.report = explain_db(db_path)
        lo, hi = parse_time_bound(since, start), parse_time_bound(until, start)
        bounded = lo is not None or hi is not None
        lo_b = lo if lo is not None else -(1 << 62)
        hi_b = hi if hi is not None else 1 << 62
        if around_findings is not None:
            try:
                s = float(around_findings)
            except (TypeError, ValueError):
                s = float("nan")
            if not (s > 0 and math.isfinite(s)):
                raise ExportError(f"--around-findings {around_findings}: expected a positive number of seconds")
            times = [t for _, t in self.finding_times()]
            if not times:
                raise ExportError(f"--around-findings: explain found nothing with a time in {db_path} to cut around "
                                  f"(straggler: {self.report.straggler}); export without it, or cut with --since/--until")
            half = int(s * 1e9)
            spans = [(max(lo_b, t - half), min(hi_b, t + half)) for t in times]
            spans = [sp for sp in spans if sp[0] <= sp[1]]
            if not spans:
                raise ExportError(f"--around-findings {s:g}: no finding lies within --since/--until")
            reason = (f"more than {s:g} s from a finding" + (" or outside --since/--until" if bounded else ""))
            self.cut = _Cut(spans, reason)
        elif bounded:
            self.cut = _Cut([(lo_b, hi_b)], "outside --since/--until")
        else:
            self.cut = _Cut()

    def t(self, node, ts, ts_aligned):
        return ts_aligned if (self.has_aligned and ts_aligned is not None) else self.align[node](ts)

    def finding_times(self):
        """(finding, aligned ns) for the findings about an exported node that say when they begin."""
        if self.report is None:
            return []
        return [(f, self.align[f.node](f.at_ns)) for f in self.report.findings
                if f.node in self.node_pid and f.at_ns is not None]

    def skip(self, n):
        if n:
            self.skipped[self.cut.reason] = self.skipped.get(self.cut.reason, 0) + n

    def sql_bounds(self, nodes):
        """A coarse SQL pre-filter for the cut: per node, the monotonic range that can touch it (±1 s)."""
        if self.cut.everything:
            return ""
        lo, hi = self.cut.span()
        parts = []
        for node in nodes:
            t0 = self.first_ts[node]
            base = self.align[node](t0) - t0              # aligned = mono + base, within the clocks' drift
            parts.append(f"(node = {sql_quote(node)} AND ts + duration >= {int(lo - base - 1_000_000_000)} "
                         f"AND ts <= {int(hi - base + 1_000_000_000)})")
        return " AND (" + " OR ".join(parts) + ")"

    def clocks_meta(self):
        out = {}
        for node in self.order:
            off = self.offsets.get(node)
            out[node] = dict(offset_ns=off["offset_ns"] if off else None,
                             uncertainty_ns=off["uncertainty_ns"] if off else None,
                             method=off["method"] if off else None, clock_pairs=self.align[node].exact)
        return out

    def describe_clock(self, node):
        off = self.offsets.get(node)
        if not self.align[node].exact:
            return "clock: monotonic (no clock pairs: not aligned with the other nodes)"
        if not off:
            return "clock: its own realtime (no offset measured)"
        return (f"clock: offset {off['offset_ns'] / 1e6:+.3f} ms ± {off['uncertainty_ns'] / 1e6:.3f} ms "
                f"({off['method'] or 'measured'}), subtracted")


def export_perfetto(db_path, out_path, since=None, until=None, nodes=None, findings=True, fmt=None,
                    around_findings=None, compress=True, jobs=None):
    """Write db_path as a timeline to out_path (atomically): Perfetto's protobuf trace, or Chrome JSON
    (fmt 'json', or an output named *.json). Returns a summary dict.

    jobs: processes writing the protobuf trace, each a share of the nodes (default: one per node up to
    the CPUs and MAX_JOBS, when the trace has at least PARALLEL_MIN_EVENTS events; 1: in this process)."""
    started = time.monotonic()
    fmt = format_for(out_path, fmt)
    if fmt == "perfetto":
        from . import pftrace       # needs the perfetto package: fail before anything is written
        pftrace.require()
    conn = _open_ro(db_path)
    try:
        plan = _Plan(conn, db_path, since, until, nodes, findings, around_findings)
        out_dir = os.path.dirname(os.path.abspath(out_path))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out_path)}.", suffix=".tmp", dir=out_dir)
        try:
            if fmt == "json":
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    summary = _write(conn, plan, JsonSink(fh, plan.start_ns), findings)
            else:
                jobs = _jobs(plan, jobs)
                with os.fdopen(fd, "wb") as fh:
                    if jobs > 1:
                        summary = _write_parallel(db_path, plan, fh, tmp, findings, compress, jobs)
                    else:
                        summary = _write(conn, plan, pftrace.PerfettoSink(fh, plan.start_ns, compress=compress,
                                                                           realtime=plan.realtime), findings)
                summary["jobs"] = jobs
            os.replace(tmp, out_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        conn.close()
    summary.update(output=out_path, format=fmt, bytes=os.path.getsize(out_path),
                   elapsed_s=round(time.monotonic() - started, 3))
    return summary


def _jobs(plan, jobs):
    import multiprocessing
    if multiprocessing.current_process().daemon:
        return 1                 # a daemonic process (an Ansible worker, say) may not start processes
    if jobs is not None:
        if int(jobs) < 1:
            raise ExportError(f"--jobs {jobs}: expected 1 or more")
        return min(int(jobs), len(plan.order))
    if plan.events < PARALLEL_MIN_EVENTS:
        return 1
    return max(1, min(len(plan.order), os.cpu_count() or 1, MAX_JOBS))


def _part(db_path, plan, findings, compress, nodes, path, sequence, uuid_base):
    """One worker of a parallel export: its nodes into its own part file (its own packet sequence and
    uuid range); its counts as JSON beside it. Runs in a forked child."""
    from . import pftrace
    result = {}
    try:
        plan.skipped = {}                    # only what this part skips (the parent has the rest)
        conn = _open_ro(db_path)
        try:
            with open(path, "wb") as fh:
                sink = pftrace.PerfettoSink(fh, plan.start_ns, compress=compress, sequence=sequence,
                                            uuid_base=uuid_base, head=False)
                result = _write(conn, plan, sink, findings, nodes=nodes, whole=False)
        finally:
            conn.close()
    except BaseException as exc:             # the parent reports it in one line
        result = dict(error=f"{type(exc).__name__}: {exc}")
    with open(path + ".json", "w") as fh:
        json.dump(result, fh)


def _write_parallel(db_path, plan, fh, tmp, findings, compress, jobs):
    """The protobuf trace written by `jobs` forked processes, each a share of the nodes into a part
    file; the parts are appended in order between the head (root descriptor, clock snapshot) and the
    tail (findings about no exported node, metadata). A part that fails fails the export."""
    import multiprocessing
    from . import pftrace
    groups = [plan.order[k::jobs] for k in range(jobs)]
    parts = [f"{tmp}.part{k}" for k in range(jobs)]
    head = pftrace.PerfettoSink(fh, plan.start_ns, compress=compress, realtime=plan.realtime)
    head.flush()
    ctx = multiprocessing.get_context("fork")
    procs = []
    try:
        for k, (group, path) in enumerate(zip(groups, parts)):
            proc = ctx.Process(target=_part, args=(db_path, plan, findings, compress, group, path, k + 2,
                                                   (k + 1) << 32), daemon=True)
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + PART_TIMEOUT_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                raise ExportError(f"export: a worker ran past {PART_TIMEOUT_S} s; stopped")
        totals = dict(slices=0, counters=0, instants=0, events=0)
        for proc, path in zip(procs, parts):
            try:
                with open(path + ".json") as rf:
                    result = json.load(rf)
            except (OSError, ValueError):
                result = dict(error=f"worker exited with status {proc.exitcode} and no result")
            if "error" in result:
                raise ExportError(f"export: a worker failed: {result['error']}")
            for key in totals:
                totals[key] += result.get(key, 0)
            for why, n in result.get("skipped", {}).items():
                plan.skipped[why] = plan.skipped.get(why, 0) + n
        head.flush()
        for path in parts:
            with open(path, "rb") as part:
                shutil.copyfileobj(part, fh, 1 << 20)
        # the tail: findings about no exported node, then the metadata
        tail = _write_tail(plan, head, findings)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for path in parts:
            for leftover in (path, path + ".json"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    totals["instants"] += tail
    return dict(events=totals["events"] + head.records, nodes=list(plan.order), trace_start_ns=plan.start_ns,
                slices=totals["slices"], counters=totals["counters"], instants=totals["instants"],
                skipped=dict(plan.skipped), straggler=plan.report.straggler if (plan.report and findings) else None)


def _write_tail(plan, sink, findings):
    """The findings about no exported node (global instants) and the metadata, for a parallel export."""
    report = plan.report if findings else None
    n = 0
    for f in (report.findings if report else []):
        if f.node not in plan.node_pid:
            sink.instant(None, *_finding_instant(plan, f))
            n += 1
    sink.close(_meta(plan, report))
    return n


def _finding_instant(plan, f):
    """(time, name, category, arguments) of a finding's instant event: on an exported node, where its
    evidence begins (Finding.at_ns); otherwise at the trace's start."""
    args = [(k, v) for k, v in (("severity", f.severity), ("cause", f.cause), ("summary", f.summary),
                                ("share", round(f.share, 3) if f.share else None),
                                ("recommendation", f.recommendation or None), ("node", f.node)) if v is not None]
    t = plan.start_ns
    if f.node in plan.node_pid:
        if f.at_ns is not None:
            t = plan.align[f.node](f.at_ns)
        if f.window_ns:
            args.append(("window_s", round((f.window_ns[1] - f.window_ns[0]) / 1e9, 3)))
    name = f"{f.severity}: {f.cause}" + (f" ({f.node})" if f.cause == "straggler" else "")
    return t, name, "explain", args


def _meta(plan, report):
    return dict(generator="straggler export", trace_start_ns=plan.start_ns, timeline=plan.timeline,
                nodes=dict(plan.node_pid), clocks=plan.clocks_meta(),
                straggler=report.straggler if report else None,
                cut=None if plan.cut.everything else dict(reason=plan.cut.reason,
                                                          spans_ns=[[a, b] for a, b in zip(plan.cut.los, plan.cut.his)]),
                skipped=plan.skipped)


def _write(conn, plan, sink, findings, nodes=None, whole=True):
    """Everything about `nodes` (default: all) into the sink. whole: this sink is the whole trace, so it
    also gets the findings about no exported node and the metadata (a part of a parallel export does not)."""
    order, node_pid = nodes or plan.order, plan.node_pid
    counts = dict(slices=0, counters=0, instants=0)
    node_list = ",".join(sql_quote(n) for n in order)
    ts_col = "ts_aligned" if plan.has_aligned else "ts"
    where_cut = plan.sql_bounds(order)
    report = plan.report if findings else None
    about = {f.node for f in report.findings} if report else set()     # nodes with a finding of their own
    finding_track = {}
    for node in order:
        pid = node_pid[node]
        r = plan.rank[node]
        sink.process(pid, f"{node} (rank {r})" if r is not None else node, pid - 1, r, plan.describe_clock(node))
        if node in about:
            finding_track[node] = sink.track(pid, "findings (explain)", first=True)

    tracks = {}

    def emit_slices(sql, key_fn, name_fn, label_fn, args_fn, cat):
        cur = conn.execute(sql)
        current, lanes, open_tracks = None, None, {}
        has_aligned, align, keeps = plan.has_aligned, plan.align, None if plan.cut.everything else plan.cut.keeps
        slice_ = sink.slice
        while True:
            batch = None                     # let the previous batch go before fetching the next
            batch = cur.fetchmany(FETCH)
            if not batch:
                break
            for row in batch:
                node = row[0]
                key = key_fn(row)
                if (node, key) != current:
                    for tr in open_tracks:
                        sink.track_done(tr)
                    current, lanes, open_tracks = (node, key), _Lanes(), {}
                t = row[2] if has_aligned and row[2] is not None else align[node](row[1])
                dur = row[3] if row[3] and row[3] > 0 else 0
                if keeps is not None and not keeps(t, t + dur):
                    continue
                lane = lanes.place(t, t + dur)
                pid = node_pid[node]
                tr = tracks.get((pid, key, lane))
                if tr is None:
                    tr = tracks[(pid, key, lane)] = sink.track(pid, label_fn(row), lane=lane)
                open_tracks[tr] = True
                slice_(tr, t, dur, name_fn(row), cat(row), args_fn(row))
                counts["slices"] += 1
        for tr in open_tracks:
            sink.track_done(tr)
        cur.close()

    def nonnull(pairs):
        return tuple((k, v) for k, v in pairs if v is not None)

    # calls, per (node, thread), ordered so that lanes are assigned in one pass
    emit_slices(f"""SELECT node, ts, ts_aligned, duration, tid, comm, source, op, ret, bytes, seq, grid_x, block_x
                    FROM events WHERE source IN ('cuda', 'driver', 'nccl') AND node IN ({node_list}){where_cut}
                    ORDER BY node, tid, {ts_col}, duration DESC""",
                key_fn=lambda r: ("calls", r[4]), name_fn=lambda r: r[7],
                label_fn=lambda r: f"{r[5]} {r[4]}",
                args_fn=lambda r: nonnull((("ret", r[8]), ("bytes", r[9]), ("seq", r[10]),
                                           ("grid_x", r[11]), ("block_x", r[12]))),
                cat=lambda r: r[6])
    # off-CPU and run-queue intervals, per (node, thread, kind)
    emit_slices(f"""SELECT node, ts, ts_aligned, duration, tid, comm, op, state, other_comm, other_pid, cpu, seq
                    FROM events WHERE source = 'sched' AND op IN ('offcpu', 'runq') AND node IN ({node_list}){where_cut}
                    ORDER BY node, tid, op, {ts_col}, duration DESC""",
                key_fn=lambda r: (r[6], r[4]),
                name_fn=lambda r: ("run queue" if r[6] == "runq" else
                                   f"preempted by {r[8]}" if r[7] == "preempted" else "blocked"),
                label_fn=lambda r: f"{r[5]} {r[4]} {'off-CPU' if r[6] == 'offcpu' else 'run queue'}",
                # the name says the state and who ran instead; the arguments add its pid, the CPU, the row
                args_fn=lambda r: nonnull((("other_pid", r[9] if r[7] == "preempted" else None),
                                           ("cpu", r[10]), ("seq", r[11]))),
                cat=lambda r: "sched")
    # block I/O, per (node, issuing process)
    emit_slices(f"""SELECT node, ts, ts_aligned, duration, pid, comm, op, bytes, dev, sector, seq
                    FROM events WHERE source = 'block' AND node IN ({node_list}){where_cut}
                    ORDER BY node, pid, {ts_col}, duration DESC""",
                key_fn=lambda r: ("block", r[4]), name_fn=lambda r: r[6],
                label_fn=lambda r: f"block I/O {r[5]} {r[4]}",
                args_fn=lambda r: nonnull((("bytes", r[7]), ("dev", r[8]), ("sector", r[9]), ("seq", r[10]))),
                cat=lambda r: "block")
    if not plan.cut.everything:       # what the cut left out, in SQL's pre-filter or here
        total = conn.execute(f"""SELECT COUNT(*) FROM events WHERE node IN ({node_list})
                                 AND (source IN ('cuda', 'driver', 'nccl', 'block')
                                      OR (source = 'sched' AND op IN ('offcpu', 'runq')))""").fetchone()[0]
        plan.skip(total - counts["slices"])
    counts["counters"] += _activity_counters(conn, plan, sink, node_list)
    counts["counters"] += _model_counters(conn, plan, sink, node_list)
    # explain's findings: instants at the time their evidence begins, on the node's findings track
    if report:
        for f in report.findings:
            if f.node in finding_track:
                sink.instant(finding_track[f.node], *_finding_instant(plan, f))
            elif whole and f.node not in node_pid:
                sink.instant(None, *_finding_instant(plan, f))
            else:
                continue
            counts["instants"] += 1
    if not whole:
        sink.close(None)
        return dict(counts, events=sink.records, skipped=dict(plan.skipped))
    meta = _meta(plan, report)
    sink.close(meta)
    return dict(events=sink.records, nodes=list(order), trace_start_ns=plan.start_ns, **counts,
                skipped=dict(plan.skipped), straggler=report.straggler if report else None)


def _activity_counters(conn, plan, sink, node_list):
    """calls/s and block I/O bytes/s per node, per second of the node's monotonic clock."""
    n = 0
    ctracks = {}
    cur = conn.execute(f"""SELECT node, ts / 1000000000 AS sec, SUM(source IN ('cuda', 'driver', 'nccl')) AS calls,
                                  SUM(CASE WHEN source = 'block' THEN COALESCE(bytes, 0) ELSE 0 END) AS io_bytes
                           FROM events WHERE node IN ({node_list}) AND source IN ('cuda', 'driver', 'nccl', 'block')
                           GROUP BY node, sec ORDER BY node, sec""")
    for node, sec, calls, io_bytes in cur:
        t = max(plan.start_ns, plan.align[node](sec * 1_000_000_000))   # the first second may begin before the trace
        if not plan.cut.keeps(t, t + 1_000_000_000):
            continue
        pid = plan.node_pid[node]
        if node not in ctracks:
            ctracks[node] = (sink.counter_track(pid, "calls/s", "count"), sink.counter_track(pid, "block I/O bytes/s", "bytes"))
        sink.counters([(ctracks[node][0], calls), (ctracks[node][1], io_bytes)], t)
        n += 2
    return n


def _model_counters(conn, plan, sink, node_list):
    """Per rank (a process with traced calls), per thread_time interval: the step-time components of
    the step-time model (steptime.rank_time of its threads, with the calling thread chosen over the whole
    export, as explain does over a window) as % of the interval's wall time."""
    calling, rank_of = {}, {}
    for node, pid, tid, rank, call_ns, calls in conn.execute(
            f"""SELECT node, pid, tid, MAX(rank), SUM(work_ns + sync_ns + coll_ns), SUM(calls) FROM thread_time
                WHERE node IN ({node_list}) GROUP BY node, pid, tid"""):
        key = (node, pid)
        if rank is not None:
            rank_of[key] = rank
        if calls and (key not in calling or (call_ns, calls) > calling[key][1:]):
            calling[key] = (tid, call_ns, calls)
    keys = {k for k in calling if k in rank_of} or set(calling)
    if not keys:
        return 0
    n = 0
    ctracks = {}
    cur = conn.execute(f"""SELECT node, pid, ts, interval_ns, tid, comm, calls, work_ns, sync_ns, coll_ns, runq_ns,
                                  runq_work_ns, runq_sync_ns, runq_coll_ns, blocked_ns, io_ns
                           FROM thread_time WHERE node IN ({node_list}) ORDER BY node, pid, ts""")
    cols = [d[0] for d in cur.description]
    group, group_key = [], None

    def flush():
        nonlocal n
        node, pid, ts, interval = group_key
        key = (node, pid)
        rt = steptime.rank_time(key, group, interval, rank_of.get(key), calling[key][0])
        if rt is None:
            return
        t = max(plan.start_ns, plan.align[node](ts))    # an interval may begin before the first event
        if not plan.cut.keeps(t, t + interval):
            return
        if key not in ctracks:
            who = f"rank {rank_of[key]}" if key in rank_of else f"pid {pid}"
            ctracks[key] = [sink.counter_track(plan.node_pid[node], f"{who} {label}", "%") for label, _ in MODEL_COUNTERS]
        sink.counters([(tr, round(100 * sum(rt.share(c) for c in comps), 2))
                       for tr, (_, comps) in zip(ctracks[key], MODEL_COUNTERS)], t)
        n += len(MODEL_COUNTERS)

    for row in cur:
        if (row[0], row[1]) not in keys:
            continue
        k = (row[0], row[1], row[2], row[3])
        if k != group_key and group:
            flush()
            group = []
        group_key = k
        group.append(dict(zip(cols, row)))
    if group:
        flush()
    return n


# ---- CLI ----

def add_arguments(parser):
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="perfetto: Perfetto's native protobuf trace (.pftrace); json: Chrome Trace Event JSON "
                             "(default: json when -o ends in .json, else perfetto)")
    parser.add_argument("-d", "--db", required=True, help="a node's store or a merged cluster.db")
    parser.add_argument("-o", "--output", required=True, help="the trace file to write (replaced atomically)")
    parser.add_argument("--since", help="start: seconds from the trace start (e.g. 30) or an ISO-8601 time")
    parser.add_argument("--until", help="end: seconds from the trace start or an ISO-8601 time")
    parser.add_argument("--node", action="append", default=[], help="only this node (repeatable)")
    parser.add_argument("--nodes", help="only these nodes, comma-separated")
    parser.add_argument("--around-findings", type=float, metavar="S",
                        help="only S seconds either side of each of explain's findings")
    parser.add_argument("--no-findings", action="store_true", help="do not run explain for instant events")
    parser.add_argument("--jobs", type=int, help="processes writing the .pftrace, each a share of the nodes "
                                                 f"(default: up to one per node, CPU and {MAX_JOBS}, for "
                                                 f"{PARALLEL_MIN_EVENTS:,} events or more)")


def run(args):
    nodes = list(args.node) + [n.strip() for n in (args.nodes or "").split(",") if n.strip()]
    summary = export_perfetto(args.db, args.output, since=args.since, until=args.until, nodes=nodes or None,
                              findings=not args.no_findings, fmt=args.format, around_findings=args.around_findings,
                              jobs=args.jobs)
    skipped = "; ".join(f"skipped {n} events: {why}" for why, n in summary["skipped"].items())
    print(f"wrote {summary['slices']} slices, {summary['counters']} counter samples and {summary['instants']} findings "
          f"for {len(summary['nodes'])} node(s) to {summary['output']} ({summary['format']}, "
          f"{summary['bytes'] / 1e6:.1f} MB) in {summary['elapsed_s']} s" + (f"; {skipped}" if skipped else ""))
    print(f"open it at https://ui.perfetto.dev → Open trace file → {summary['output']}")
    return 0
