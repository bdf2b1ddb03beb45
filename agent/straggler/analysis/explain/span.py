"""The span explain judges (--since/--until): two times on the fleet's timeline, the one the report
prints (UTC: each node's CLOCK_MONOTONIC plus its clock offset, timeline.node_clocks), each turned into
bounds on every node's own clock, so that one cut falls at the same wall time on every node of a merged
cluster.db whose machines' monotonic clocks differ. A time is written as people write it
(straggler.durations.parse_time_bound, the rule `straggler export` uses: seconds from the trace's
start, or an ISO-8601 time). A node without clock pairs is cut on its own clock, placed as the
timeline places it (its first summary at the earliest aligned node's), and the report says so.

Also the lab's monotonic bounds: one CLOCK_MONOTONIC number for every node (the test bed's hosts share
one kernel), as given.

Reads the clocks and each node's first and last summary through a runner, only when a fleet-time bound
is given; writes no SQL text (sql.py does) and decides nothing about stragglers.
"""
import datetime
from dataclasses import dataclass, field, replace

from ...durations import parse_time_bound, time_bound
from ...errors import UsageError
from . import sql, timeline


@dataclass
class Cut:
    """What explain reads of the trace. per_node is None without a fleet-time bound (every node alike,
    by `mono`, the lab's bounds; both open: the whole trace)."""
    since_ns: int = None           # on the fleet timeline (None: open)
    until_ns: int = None
    per_node: dict = None          # {node: (lo, hi)}: the bounds on each node's own clock (None: open)
    mono: tuple = (None, None)     # the lab's CLOCK_MONOTONIC bounds, the same on every node
    trace_start_ns: int = None     # the whole trace on the fleet timeline: where its first summary starts ...
    trace_end_ns: int = None       # ... and where its last ends
    clocks: dict = field(default_factory=dict)   # {node: timeline.NodeClock}, as the series places each node
    pids: dict = field(default_factory=dict)     # {node: [pid]}: its traced processes (thread_time's index)
    wall: bool = True              # the fleet timeline is UTC (some node has clock pairs)
    span_sql: str = ""             # the SQL of the trace's span

    @property
    def active(self):
        return self.per_node is not None or any(v is not None for v in self.mono)

    @property
    def unaligned(self):
        """The nodes cut on their own clock (no clock pairs)."""
        return sorted(n for n, c in self.clocks.items() if not c.aligned)

    def bounds(self, node):
        """(lo, hi) on `node`'s own clock: its fleet-time bounds and the lab's, whichever is tighter."""
        lo, hi = self.mono
        if self.per_node is not None:
            flo, fhi = self.per_node.get(node, (None, None))
            lo = flo if lo is None else lo if flo is None else max(lo, flo)
            hi = fhi if hi is None else hi if fhi is None else min(hi, fhi)
        return lo, hi

    def bound(self, since_ns, until_ns):
        """This cut from since_ns to until_ns on the fleet timeline (None: open), each of its clocks'
        nodes cut at that time through its own clock. Returns self."""
        self.since_ns, self.until_ns = since_ns, until_ns
        self.per_node = {n: (None if since_ns is None else since_ns - c.offset_ns,
                             None if until_ns is None else until_ns - c.offset_ns) for n, c in self.clocks.items()}
        return self

    def until_only(self):
        """The same cut open at its start (what a job made when it started counts for the span)."""
        per_node = None if self.per_node is None else {n: (None, hi) for n, (_lo, hi) in self.per_node.items()}
        return replace(self, since_ns=None, per_node=per_node, mono=(None, self.mono[1]))

    def fmt(self, ns):
        """A fleet time as people read it: UTC, or seconds from the trace's start without clock pairs."""
        if ns is None:
            return None
        if self.wall:
            return _iso(ns)
        return f"{(ns - self.trace_start_ns) / 1e9:+.3f} s from the trace's start"

    def to_dict(self):
        """The span judged, for the report (JSON-ready): its bounds (fleet ns and UTC), the trace's own
        span, and each node's bounds on its clock."""
        return dict(since_ns=self.since_ns, until_ns=self.until_ns, since=self.fmt(self.since_ns),
                    until=self.fmt(self.until_ns), trace_start=self.fmt(self.trace_start_ns),
                    trace_end=self.fmt(self.trace_end_ns),
                    nodes={n: dict(lo_ns=lo, hi_ns=hi, aligned=self.clocks[n].aligned)
                           for n, (lo, hi) in sorted((self.per_node or {}).items())},
                    unaligned=self.unaligned, sql=self.span_sql.strip())

    def empty_message(self):
        """One line: the span holds nothing to judge, and what the trace does hold."""
        return (f"--since/--until: no rank's calls from {self.fmt(self.since_ns) or 'the trace start'} to "
                f"{self.fmt(self.until_ns) or 'its end'}; the trace runs from {self.fmt(self.trace_start_ns)} to "
                f"{self.fmt(self.trace_end_ns)}: give a span within it")


def _iso(ns):
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).isoformat(timespec="milliseconds")


def check(opts):
    """Each bound readable (before anything is read): one line naming the option otherwise."""
    for option, value in (("--since", opts.since), ("--until", opts.until)):
        if value is not None:
            time_bound(value, option)


def trace_spans(runner):
    """(the SQL, its rows): each traced process's first summary's start and last one's end, through the
    (node, pid, ts) index where the store has it."""
    indexed = runner.rows(sql.RANK_INDEX)
    span_sql = sql.TRACE_SPAN if indexed and all(r["indexed"] for r in indexed) else sql.TRACE_SPAN_SCAN
    return span_sql, runner.rows(span_sql)


def resolve(runner, opts):
    """The Cut of `opts` (ExplainOptions: since/until on the fleet timeline, since_mono_ns/until_mono_ns
    the lab's): each node's clock and first summary read when a fleet-time bound is given. UsageError
    when since is not before until, or the span holds nothing of the trace."""
    mono = (opts.since_mono_ns, opts.until_mono_ns)
    if opts.since is None and opts.until is None:
        return Cut(mono=mono)
    check(opts)
    span_sql, rows = trace_spans(runner)
    first, last, pids = {}, {}, {}
    for r in rows:
        if r["first_ts"] is None:
            continue
        node = r["node"]
        first[node] = min(first.get(node, r["first_ts"]), int(r["first_ts"]))
        last[node] = max(last.get(node, r["last_ts"]), int(r["last_ts"]))
        pids.setdefault(node, []).append(int(r["pid"]))
    if not first:
        if runner.missing:            # no node answered: the report says who is missing
            return Cut(per_node={}, mono=mono, span_sql=span_sql)
        raise UsageError("--since/--until: the trace holds no summaries of traced calls to cut")
    clocks = timeline.node_clocks(runner, sorted(first))
    timeline.anchor_unaligned(clocks, first)
    cut = Cut(mono=mono, clocks=clocks, pids=pids, wall=any(c.aligned for c in clocks.values()), span_sql=span_sql,
              trace_start_ns=min(first[n] + clocks[n].offset_ns for n in first),
              trace_end_ns=max(last[n] + clocks[n].offset_ns for n in last))
    for option, value in (("--since", opts.since), ("--until", opts.until)):
        if value is not None and not cut.wall and time_bound(value, option)[0] == "wall":
            raise UsageError(f"{option} {value!r}: an ISO-8601 time needs the nodes' clock pairs, and none of "
                             f"{', '.join(sorted(first))} has any; give seconds from the trace's start")
    cut.since_ns = parse_time_bound(opts.since, cut.trace_start_ns, "--since")
    cut.until_ns = parse_time_bound(opts.until, cut.trace_start_ns, "--until")
    if cut.since_ns is not None and cut.until_ns is not None and cut.since_ns >= cut.until_ns:
        raise UsageError(f"--since {opts.since!r} is not before --until {opts.until!r} "
                         f"({cut.fmt(cut.since_ns)} >= {cut.fmt(cut.until_ns)})")
    if (cut.since_ns is not None and cut.since_ns >= cut.trace_end_ns) or \
            (cut.until_ns is not None and cut.until_ns <= cut.trace_start_ns):
        raise UsageError(cut.empty_message())
    return cut.bound(cut.since_ns, cut.until_ns)
