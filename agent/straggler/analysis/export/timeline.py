"""The export's content, written into a sink (jsonsink.JsonSink or pftrace.PerfettoSink) from SQL
cursors: per node a process; per traced thread its CUDA/driver/NCCL calls as slices (in lanes, so
every track nests), its off-CPU and run-queue intervals, block I/O per issuing process; counters
(calls/s, block I/O bytes/s, per rank the step-time model's components as % of wall time, per GPU its
SM clock, temperature and power, per network interface and RDMA port its throughput, and its errors and
drops or transmit waits); explain's findings as instants where their evidence begins and its
straggle episodes as slices on a track of the straggler node; the metadata.

Memory depends on the number of tracks, not on the trace length. Only reads the database; must
not choose what is exported (plan.py) or how it is encoded (the sinks).
"""
import sqlite3

from ...store import steptime
from ...text import sql_quote

FETCH = 2000
# the step-time model's components as counters: (label, components summed), in the order shown
MODEL_COUNTERS = (("waiting for peers %", ("coll", "blocked")), ("run queue %", ("runq",)),
                  ("host compute %", ("host",)), ("synchronize %", ("sync",)), ("collectives %", ("coll",)),
                  ("CUDA calls %", ("work",)), ("own block I/O %", ("io",)), ("blocked %", ("blocked",)))


class Lanes:
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


def write_tail(plan, sink, findings):
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


def write(conn, plan, sink, findings, nodes=None, whole=True):
    """Everything about `nodes` (default: all) into the sink. whole: this sink is the whole trace, so it
    also gets the findings about no exported node and the metadata (a part of a parallel export does not)."""
    order, node_pid = nodes or plan.order, plan.node_pid
    counts = dict(slices=0, counters=0, instants=0)
    node_list = ",".join(sql_quote(n) for n in order)
    ts_col = "ts_aligned" if plan.has_aligned else "ts"
    where_cut = plan.sql_bounds(order)
    report = plan.report if findings else None
    about = {f.node for f in report.findings} if report else set()     # nodes with a finding of their own
    finding_track, episode_track = {}, {}
    episodes_of = {e["node"] for e in (report.episodes if report else [])}
    for node in order:
        pid = node_pid[node]
        r = plan.rank[node]
        sink.process(pid, f"{node} (rank {r})" if r is not None else node, pid - 1, r, plan.describe_clock(node))
        if node in about:
            finding_track[node] = sink.track(pid, "findings (explain)", first=True)
        if node in episodes_of:
            episode_track[node] = sink.track(pid, "findings (explain): straggle episodes", first=2)

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
                    current, lanes, open_tracks = (node, key), Lanes(), {}
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
    counts["counters"] += _gpu_counters(conn, plan, sink, node_list)
    counts["counters"] += _network_counters(conn, plan, sink, node_list)
    counts["slices"] += _episode_slices(sink, report, episode_track)
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


def _episode_slices(sink, report, tracks):
    """explain's straggle episodes: one slice per episode on a track of its own on the straggler node's
    process, from its start to its end (the fleet timeline), named by its cause. Like the findings, they
    are explain's word about the whole trace: kept whatever the cut."""
    n = 0
    for e in (report.episodes if report else []):
        if e["node"] not in tracks:
            continue
        start, end = int(e["start_ns"]), int(e["end_ns"])
        top = max(e.get("causes") or [], key=lambda c: c["share"], default=None)
        pattern = e.get("intermittent")
        args = (("ranks", ",".join(str(r["rank"]) for r in e.get("ranks", []) if r.get("rank") is not None)),
                ("slowdown", "all along (not measured)" if e["slowdown"] is None else e["slowdown"]),
                ("lost_s", "not measured" if e.get("lost_s") is None else e["lost_s"]), ("cause", top["cause"] if top else "unknown"),
                ("intermittent", f"period {pattern['period_s']} s, on {pattern['duty']:.0%}" if pattern else "no"),
                ("summary", top["summary"] if top else ""))
        sink.slice(tracks[e["node"]], start, max(0, end - start),
                   f"straggler: {top['cause'] if top else 'unknown'}" + (" (intermittent)" if pattern else ""),
                   "episode", args)
        n += 1
    for tr in tracks.values():
        sink.track_done(tr)
    return n


GPU_COUNTERS = (("SM clock", "MHz", "sm_clock_mhz"), ("temperature", "°C", "temperature_c"),
                ("power", "W", "power_mw / 1000.0"))


def _gpu_counters(conn, plan, sink, node_list):
    """Per GPU (the agent's NVML samples): its SM clock, temperature and power, a counter track each."""
    try:
        cur = conn.execute(f"""SELECT node, gpu, ts, {", ".join(expr for _, _, expr in GPU_COUNTERS)}
                               FROM gpu_samples WHERE node IN ({node_list}) ORDER BY node, gpu, ts""")
    except sqlite3.OperationalError:          # a store written before the agent read GPUs
        return 0
    n = 0
    ctracks = {}
    for node, gpu, ts, *values in cur:
        t = plan.align[node](ts)
        if t < plan.start_ns or not plan.cut.keeps(t, t):
            continue
        key = (node, gpu)
        if key not in ctracks:
            ctracks[key] = [sink.counter_track(plan.node_pid[node], f"GPU {gpu} {label}", unit)
                            for label, unit, _ in GPU_COUNTERS]
        pairs = [(tr, v) for tr, v in zip(ctracks[key], values) if v is not None]
        if pairs:
            sink.counters(pairs, t)
            n += len(pairs)
    return n


# (table, what names a link, its label, [(counter, unit, cumulative columns summed, scale, only once one moved)]):
# rates between consecutive samples of the cumulative counters
NET_RATES = (
    ("net_samples", ("iface",), "net {0}",
     (("receive bytes/s", "bytes", ("rx_bytes",), 1, False), ("transmit bytes/s", "bytes", ("tx_bytes",), 1, False),
      ("errors+drops/s", "count", ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_missed_errors"), 1,
       True))),
    # the InfiniBand data counters count 4-byte words; port_xmit_wait counts ticks with data to send and no credit
    ("rdma_samples", ("device", "port"), "rdma {0} port {1}",
     (("receive bytes/s", "bytes", ("port_rcv_data",), 4, False),
      ("transmit bytes/s", "bytes", ("port_xmit_data",), 4, False),
      ("transmit wait ticks/s", "count", ("port_xmit_wait",), 1, False))),
)


def counter_rate(before, after, dt_ns, scale=1):
    """Per second between two readings of cumulative counters (tuples, summed): None when none was read
    in both, or one went backwards (reset: the interface or the driver came back), or no time passed."""
    if dt_ns <= 0:
        return None
    total, read = 0, False
    for a, b in zip(before, after):
        if a is None or b is None:
            continue
        if b < a:
            return None
        total, read = total + b - a, True
    return total * scale * 1e9 / dt_ns if read else None


def _network_counters(conn, plan, sink, node_list):
    """Per network interface (net_samples): receive and transmit throughput, bytes/s, and errors + drops
    per second on a track made once any occurred; per RDMA port (rdma_samples): its throughput and its
    transmit waits per second. A rate describes the interval between two samples: it is placed at the
    first (a counter holds its value until the next point); a counter reset gives no point for that pair."""
    n = 0
    for table, keys, label, rates in NET_RATES:
        columns = [c for *_, cols, _, _ in rates for c in cols]
        try:
            cur = conn.execute(f"""SELECT node, {", ".join(keys)}, ts, {", ".join(columns)} FROM {table}
                                   WHERE node IN ({node_list}) ORDER BY node, {", ".join(keys)}, ts""")
        except sqlite3.OperationalError:      # a store written before the agent sampled the network
            continue
        ctracks, previous = {}, None
        for row in cur:
            node, key, ts, values = row[0], row[1:1 + len(keys)], row[1 + len(keys)], row[2 + len(keys):]
            if previous is None or previous[:2] != (node, key):
                previous = (node, key, ts, values)
                continue
            t0, t1, dt = plan.align[node](previous[2]), plan.align[node](ts), ts - previous[2]
            before, previous = previous[3], (node, key, ts, values)
            t = max(plan.start_ns, t0)            # a pair may begin before the trace
            if t1 < plan.start_ns or not plan.cut.keeps(t, t1):
                continue
            tracks = ctracks.setdefault((node, key), [None] * len(rates))
            pairs, i = [], 0
            for r, (name, unit, cols, scale, when_moved) in enumerate(rates):
                rate = counter_rate(before[i:i + len(cols)], values[i:i + len(cols)], dt, scale)
                i += len(cols)
                if rate is None or (tracks[r] is None and when_moved and rate == 0):
                    continue
                if tracks[r] is None:
                    tracks[r] = sink.counter_track(plan.node_pid[node], f"{label.format(*key)} {name}", unit)
                pairs.append((tracks[r], round(rate) if unit == "bytes" else round(rate, 3)))
            if pairs:
                sink.counters(pairs, t)
                n += len(pairs)
    return n


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
