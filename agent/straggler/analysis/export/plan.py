"""What an export writes, decided before a row is written: the nodes in order (rank, then name), each
node's clock onto the fleet timeline (straggler.clock's Aligner: its clock pairs minus its measured
offset; without pairs, its raw monotonic time), the trace start, the cut (--since/--until,
--node, --around-findings) and explain's report for the findings.

Only reads the database (opened read-only); must not write anything.
"""
import bisect
import math
import os
import sqlite3
import urllib.parse

from ...clock import Aligner, clock_segments
from ...durations import parse_time_bound
from ...errors import UsageError
from ...text import sql_quote
from .errors import ExportError


def open_ro(path):
    """The database, read-only, checked to be a straggler database with events."""
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such database; pass -d a node's store or a merged cluster.db")
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro", uri=True)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        conn.execute("SELECT seq, node, ts, duration, ts_aligned FROM events LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        raise ExportError(f"{path}: not a readable straggler database ({exc})")
    return conn


class NodeClock:
    """mono ns -> fleet-timeline ns for one node: clock.Aligner (clock pairs minus the node's offset, as merge);
    without clock pairs, the raw monotonic time (said in the trace's metadata as its timeline)."""

    def __init__(self, node, pairs, offset_ns):
        self.node = node
        self.aligner = Aligner()
        self.aligner.set_node(node, clock_segments(pairs) if pairs else [], offset_ns or 0)
        self.exact = node in self.aligner.nodes

    def __call__(self, ts):
        return self.aligner(self.node, ts) if self.exact else ts


def clock_info(conn, nodes):
    """Per node: its latest measured offset (what merge used) and uncertainty, and its aligners."""
    offsets = {}
    for node, off, unc, method in conn.execute(
            "SELECT node, offset_ns, uncertainty_ns, method FROM clock_offsets ORDER BY measured_at"):
        offsets[node] = dict(offset_ns=off, uncertainty_ns=unc, method=method)
    align = {node: NodeClock(node, conn.execute("SELECT mono_ns, real_ns FROM clock_pairs WHERE node = ?",
                                                (node,)).fetchall(), offsets.get(node, {}).get("offset_ns", 0))
             for node in nodes}
    return offsets, align


class Cut:
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


class Plan:
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
        self.offsets, self.align = clock_info(conn, self.node_pid)
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
        try:
            lo, hi = parse_time_bound(since, start, "--since"), parse_time_bound(until, start, "--until")
        except UsageError as exc:
            raise ExportError(str(exc)) from None
        self.report = None
        if findings or around_findings is not None:
            from ..explain import explain_db
            self.report = explain_db(db_path)
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
            self.cut = Cut(spans, reason)
        elif bounded:
            self.cut = Cut([(lo_b, hi_b)], "outside --since/--until")
        else:
            self.cut = Cut()

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
