"""Export a store or a merged cluster database as a Perfetto timeline:
`straggler export --format perfetto -d DB -o trace.json`.

Chrome Trace Event JSON ({"traceEvents": [...], "displayTimeUnit": "ms"}), which the Perfetto UI
opens. One process per node, named "NODE (rank R)", ordered by rank then node
(process_sort_index). Tracks (threads in the JSON) per node:
  - each traced thread's CUDA/driver/NCCL calls as complete ("X") slices; calls that overlap
    without nesting go to extra lanes ("comm tid · lane 2"), so every track is well nested;
  - the thread's off-CPU intervals (preempted by …/blocked) and its run-queue waits, each on a
    track of their own;
  - block I/O per issuing process, in lanes (requests overlap);
  - counters ("C"): calls/s and block I/O bytes/s per node;
  - explain's findings as instant events ("i") on the node they are about.
Times are on the fleet timeline: events.ts_aligned when the merge filled it, else the node's
monotonic ts through its clock_pairs (the same segments merge uses) minus its measured offset.
JSON `ts` values are microseconds since the trace start (ns precision, exact decimals); the
start in ns since the epoch is in otherData.trace_start_ns.

The writer streams: it iterates SQL cursors (ordered by SQLite, which sorts on disk) and writes
each event as it goes; memory depends on the number of tracks, not on the trace length.
This module only reads the database (read-only connection).
"""
import datetime
import json
import os
import sqlite3
import tempfile
import time
import urllib.parse

from ..errors import StragglerError
from .merge import Aligner, clock_segments

CALL_SOURCES = ("cuda", "driver", "nccl")
FETCH = 2000
SEPARATOR = ",\n"


class ExportError(StragglerError):
    pass


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
    without clock pairs, the raw monotonic time (said in otherData.timeline)."""

    def __init__(self, node, pairs, offset_ns):
        self.node = node
        self.aligner = Aligner()
        self.aligner.set_node(node, clock_segments(pairs) if pairs else [], offset_ns or 0)
        self.exact = node in self.aligner.nodes

    def __call__(self, ts):
        return self.aligner(self.node, ts) if self.exact else ts


def _aligners(conn, nodes):
    offsets = {}
    for node, off in conn.execute("SELECT node, offset_ns FROM clock_offsets ORDER BY measured_at"):
        offsets[node] = off
    return {node: _NodeClock(node, conn.execute("SELECT mono_ns, real_ns FROM clock_pairs WHERE node = ?",
                                                (node,)).fetchall(), offsets.get(node, 0))
            for node in nodes}


def _us(ns):
    """ns (int) -> exact decimal µs text."""
    if ns < 0:
        return "-" + _us(-ns)
    whole, frac = divmod(int(ns), 1000)
    return f"{whole}.{frac:03d}"


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


class _Writer:
    """Streams trace events as JSON."""

    def __init__(self, fh):
        self.fh = fh
        self.count = 0
        self._enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        self._names = {}          # slice names repeat (op names, "preempted by X"): encode each once
        fh.write('{"traceEvents":[\n')

    def event(self, obj, raw_ts=None, raw_dur=None):
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        if raw_ts is not None:   # exact decimal µs: splice in the numbers json would round
            text = text[:-1] + f',"ts":{raw_ts}' + (f',"dur":{raw_dur}' if raw_dur is not None else "") + "}"
        self.fh.write((",\n" if self.count else "") + text)
        self.count += 1

    def slice(self, name, cat, pid, tid, ts_text, dur_text, args):
        """A complete ("X") event, formatted directly: the hot path of the export."""
        encoded = self._names.get(name)
        if encoded is None:
            encoded = self._enc(name)
            if len(self._names) < 10_000:      # bounded: memory must not grow with the trace
                self._names[name] = encoded
        self.fh.write(f'{SEPARATOR if self.count else ""}{{"ph":"X","name":{encoded},"cat":"{cat}","pid":{pid},'
                      f'"tid":{tid},"ts":{ts_text},"dur":{dur_text},"args":{self._enc(args)}}}')
        self.count += 1

    def close(self, other):
        self.fh.write('\n],"displayTimeUnit":"ms","otherData":' + json.dumps(other, default=str) + "}\n")


class _Tracks:
    """Synthetic, globally unique tids for the tracks of each node, with lanes for overlaps."""

    def __init__(self, writer):
        self.writer = writer
        self.next_tid = 1
        self.ids = {}
        self.sort = 0

    def tid(self, pid, key, name):
        tid = self.ids.get((pid, key))
        if tid is None:
            tid = self.ids[(pid, key)] = self.next_tid
            self.next_tid += 1
            self.sort += 1
            self.writer.event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            self.writer.event({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                               "args": {"sort_index": self.sort}})
        return tid


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


def export_perfetto(db_path, out_path, since=None, until=None, nodes=None, findings=True):
    """Write db_path's events as Chrome Trace Event JSON to out_path (atomically). Returns a summary."""
    started = time.monotonic()
    conn = _open_ro(db_path)
    try:
        inv = conn.execute("SELECT node, MIN(rank), MIN(ts) FROM events GROUP BY node").fetchall()
        if nodes:
            wanted = set(nodes)
            unknown = wanted - {r[0] for r in inv}
            if unknown:
                raise ExportError(f"--node {', '.join(sorted(unknown))}: not in {db_path} "
                                  f"(it has {', '.join(sorted(r[0] for r in inv)) or 'no events'})")
            inv = [r for r in inv if r[0] in wanted]
        if not inv:
            raise ExportError(f"{db_path}: no events to export")
        proc_rank = dict(conn.execute("SELECT node, MIN(rank) FROM processes WHERE rank IS NOT NULL GROUP BY node"))
        order = sorted(inv, key=lambda r: (proc_rank.get(r[0], r[1]) if proc_rank.get(r[0], r[1]) is not None
                                           else 1 << 30, r[0]))
        node_pid = {r[0]: i + 1 for i, r in enumerate(order)}
        align = _aligners(conn, node_pid)
        has_aligned = conn.execute("SELECT 1 FROM events WHERE ts_aligned IS NOT NULL LIMIT 1").fetchone() is not None
        start_ns = min(align[n](t0) for n, _, t0 in inv)
        if has_aligned:
            row = conn.execute("SELECT MIN(ts_aligned) FROM events").fetchone()
            start_ns = min(start_ns, row[0])
        lo = parse_time_bound(since, start_ns)
        hi = parse_time_bound(until, start_ns)
        out_dir = os.path.dirname(os.path.abspath(out_path))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out_path)}.", suffix=".tmp", dir=out_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                summary = _write(conn, fh, order, node_pid, proc_rank, align, has_aligned, start_ns, lo, hi,
                                 db_path if findings else None)
            os.replace(tmp, out_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        conn.close()
    summary.update(output=out_path, elapsed_s=round(time.monotonic() - started, 3))
    return summary


def _write(conn, fh, order, node_pid, proc_rank, align, has_aligned, start_ns, lo, hi, findings_db):
    w = _Writer(fh)
    tracks = _Tracks(w)
    for i, (node, rank, _) in enumerate(order):
        pid = node_pid[node]
        r = proc_rank.get(node, rank)
        w.event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                 "args": {"name": f"{node} (rank {r})" if r is not None else node}})
        w.event({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": i}})
        if r is not None:
            w.event({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": f"rank {r}"}})
    node_list = ",".join("'" + n.replace("'", "''") + "'" for n in node_pid)
    counts = dict(slices=0, counters=0, instants=0, dropped_outside=0)

    def t_of(node, ts, ts_al):
        return ts_al if (has_aligned and ts_al is not None) else align[node](ts)

    def emit_slices(sql, key_fn, name_fn, label_fn, args_fn, cat):
        cur = conn.execute(sql)
        lanes, current, batch = None, None, None
        while True:
            batch = None                     # let the previous batch go before fetching the next
            batch = cur.fetchmany(FETCH)
            if not batch:
                break
            for row in batch:
                node = row[0]
                key = key_fn(row)
                if (node, key) != current:
                    current, lanes = (node, key), _Lanes()
                t = t_of(node, row[1], row[2])
                dur = max(0, int(row[3] or 0))
                if (lo is not None and t + dur < lo) or (hi is not None and t > hi):
                    counts["dropped_outside"] += 1
                    continue
                lane = lanes.place(t, t + dur)
                pid = node_pid[node]
                label = label_fn(row)
                tid = tracks.tid(pid, (key, lane), label if lane == 0 else f"{label} · lane {lane + 1}")
                w.slice(name_fn(row), cat, pid, tid, _us(t - start_ns), _us(dur), args_fn(row))
                counts["slices"] += 1

    # calls, per (node, thread), ordered so that lanes are assigned in one pass
    emit_slices(f"""SELECT node, ts, ts_aligned, duration, tid, comm, source, op, ret, bytes, seq, grid_x, block_x
                    FROM events WHERE source IN ('cuda', 'driver', 'nccl') AND node IN ({node_list})
                    ORDER BY node, tid, {'ts_aligned' if has_aligned else 'ts'}, duration DESC""",
                key_fn=lambda r: ("calls", r[4]), name_fn=lambda r: r[7],
                label_fn=lambda r: f"{r[5]} {r[4]}",
                args_fn=lambda r: {k: v for k, v in (("source", r[6]), ("ret", r[8]), ("bytes", r[9]), ("seq", r[10]),
                                                     ("grid_x", r[11]), ("block_x", r[12])) if v is not None},
                cat="call")
    # off-CPU and run-queue intervals, per (node, thread, kind)
    emit_slices(f"""SELECT node, ts, ts_aligned, duration, tid, comm, op, state, other_comm, other_pid, cpu, seq
                    FROM events WHERE source = 'sched' AND op IN ('offcpu', 'runq') AND node IN ({node_list})
                    ORDER BY node, tid, op, {'ts_aligned' if has_aligned else 'ts'}, duration DESC""",
                key_fn=lambda r: (r[6], r[4]),
                name_fn=lambda r: ("run queue" if r[6] == "runq" else
                                   f"preempted by {r[8]}" if r[7] == "preempted" else "blocked"),
                label_fn=lambda r: f"{r[5]} {r[4]} {'off-CPU' if r[6] == 'offcpu' else 'run queue'}",
                args_fn=lambda r: {k: v for k, v in (("state", r[7]), ("other_comm", r[8]), ("other_pid", r[9]),
                                                     ("cpu", r[10]), ("seq", r[11])) if v is not None},
                cat="sched")
    # block I/O, per (node, issuing process)
    emit_slices(f"""SELECT node, ts, ts_aligned, duration, pid, comm, op, bytes, dev, sector, seq
                    FROM events WHERE source = 'block' AND node IN ({node_list})
                    ORDER BY node, pid, {'ts_aligned' if has_aligned else 'ts'}, duration DESC""",
                key_fn=lambda r: ("block", r[4]), name_fn=lambda r: r[6],
                label_fn=lambda r: f"block I/O {r[5]} {r[4]}",
                args_fn=lambda r: {k: v for k, v in (("bytes", r[7]), ("dev", r[8]), ("sector", r[9]), ("seq", r[10]))
                                   if v is not None},
                cat="block")
    # counters: calls/s and block bytes/s per node, per second of the node's monotonic clock
    cur = conn.execute(f"""SELECT node, ts / 1000000000 AS sec, SUM(source IN ('cuda', 'driver', 'nccl')) AS calls,
                                  SUM(CASE WHEN source = 'block' THEN COALESCE(bytes, 0) ELSE 0 END) AS io_bytes
                           FROM events WHERE node IN ({node_list}) AND source IN ('cuda', 'driver', 'nccl', 'block')
                           GROUP BY node, sec ORDER BY node, sec""")
    for node, sec, calls, io_bytes in cur:
        t = max(start_ns, align[node](sec * 1_000_000_000))    # the first second may begin before the trace
        if (lo is not None and t < lo - 1_000_000_000) or (hi is not None and t > hi):
            continue
        pid = node_pid[node]
        w.event({"ph": "C", "name": "calls/s", "pid": pid, "tid": 0, "args": {"calls": calls}}, raw_ts=_us(t - start_ns))
        w.event({"ph": "C", "name": "block I/O bytes/s", "pid": pid, "tid": 0, "args": {"bytes": io_bytes}},
                raw_ts=_us(t - start_ns))
        counts["counters"] += 2
    report = None
    if findings_db:
        from .explain import explain_db
        report = explain_db(findings_db)
        for f in report.findings:
            args = {"severity": f.severity, "cause": f.cause, "summary": f.summary,
                    "recommendation": f.recommendation}
            if f.node in node_pid:
                row = conn.execute(f"""SELECT ts, ts_aligned FROM events WHERE +node = ? AND source IN {CALL_SOURCES}
                                       ORDER BY duration DESC LIMIT 1""", (f.node,)).fetchone()
                t = t_of(f.node, row[0], row[1]) if row else start_ns
                pid = node_pid[f.node]
                w.event({"ph": "i", "s": "p", "name": f"{f.severity}: {f.cause}", "cat": "explain", "pid": pid,
                         "tid": tracks.tid(pid, "explain", "explain findings"), "args": args}, raw_ts=_us(t - start_ns))
            else:
                w.event({"ph": "i", "s": "g", "name": f"{f.severity}: {f.cause}", "cat": "explain", "pid": 0,
                         "tid": 0, "args": args}, raw_ts=_us(0))
            counts["instants"] += 1
    other = dict(generator="straggler export", trace_start_ns=start_ns,
                 timeline="ts_aligned" if has_aligned else "clock_pairs" if all(a.exact for a in align.values())
                 else "monotonic (no clock pairs for some nodes)",
                 nodes={n: p for n, p in node_pid.items()}, straggler=report.straggler if report else None)
    w.close(other)
    return dict(events=w.count, nodes=list(node_pid), trace_start_ns=start_ns, **counts,
                straggler=report.straggler if report else None)


# ---- CLI ----

def add_arguments(parser):
    parser.add_argument("--format", choices=["perfetto"], default="perfetto",
                        help="perfetto: Chrome Trace Event JSON that ui.perfetto.dev opens")
    parser.add_argument("-d", "--db", required=True, help="a node's store or a merged cluster.db")
    parser.add_argument("-o", "--output", required=True, help="the JSON file to write (replaced atomically)")
    parser.add_argument("--since", help="start: seconds from the trace start (e.g. 30) or an ISO-8601 time")
    parser.add_argument("--until", help="end: seconds from the trace start or an ISO-8601 time")
    parser.add_argument("--node", action="append", default=[], help="only this node (repeatable)")
    parser.add_argument("--no-findings", action="store_true", help="do not run explain for instant events")


def run(args):
    summary = export_perfetto(args.db, args.output, since=args.since, until=args.until, nodes=args.node or None,
                              findings=not args.no_findings)
    print(f"wrote {summary['events']} trace events ({summary['slices']} slices, {summary['counters']} counter samples, "
          f"{summary['instants']} findings) for {len(summary['nodes'])} node(s) to {summary['output']} "
          f"in {summary['elapsed_s']} s; open it in https://ui.perfetto.dev")
    return 0
