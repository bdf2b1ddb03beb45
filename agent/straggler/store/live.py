"""What a live watch polls from one node: the recent rows of the step-time model, small and cheap.

`live_summary(db, since_ns)` answers GET /api/v1/live?since=NS: the thread_time rows (the
step-time model's per-interval summaries, schema 2) that start at or after `since`, the node's
block I/O in the same time summed per second and submitting process (explain's evidence for
io-self / io-other, without shipping one row per request), its links in the same time (the job's TCP
connections per interval and its interfaces' samples, schema 5: explain's evidence of a slow link;
none from an older store), the recorded collective calls and the kernel's counts of every traced call (the
job's sync points, lined up by explain's what-if), the ranked processes, and the lost
events of the intervals that end after `since` (they are written when their longer interval
ends, so a row can come twice: the watch keys them by probe and ts). A watch keeps the rows it
got and asks again from the `ts` after the newest summary it holds.

The tables and columns here are the ones explain reads (analysis/explain/sql.py), so the
controller can put the answers of every node into one in-memory store and run the same explain
on it. Reads only, under a deadline (store.query.reading: SQLite is interrupted at it).
"""
from ..probes.symbols import OP_SOURCE, STEP_OPS
from .query import reading

# per answer: a node traces a few threads per rank; one interval per second, so this is minutes
MAX_THREAD_ROWS = 20_000
MAX_BLOCK_ROWS = 20_000
DEFAULT_LOOKBACK_NS = 120_000_000_000   # without ?since: the last two minutes
DEFAULT_TIMEOUT_S = 5.0
INT64 = (-(1 << 63), (1 << 63) - 1)       # what SQLite's integers hold

THREAD_TIME_COLUMNS = ("node", "ts", "interval_ns", "pid", "tid", "rank", "comm", "calls", "work_ns", "sync_ns",
                       "coll_ns", "runq_ns", "runq_work_ns", "runq_sync_ns", "runq_coll_ns", "blocked_ns", "io_ns",
                       "thieves")
# block I/O per second and process: one row stands for `requests` requests; the second that holds
# `since` is answered whole (a watch replaces the row it had for it: the second may have been filling)
BLOCK_COLUMNS = ("node", "ts", "pid", "comm", "requests", "bytes", "duration")
PROCESS_COLUMNS = ("node", "pid", "ppid", "comm", "rank", "local_rank", "world_size", "first_seen", "last_seen",
                   "exited")
LOST_COLUMNS = ("node", "probe", "ts", "interval_ns", "count")
# the links: what explain's network rules read (analysis/explain/network.py)
NET_FLOW_COLUMNS = ("node", "ts", "interval_ns", "pid", "rank", "family", "local_addr", "local_port", "peer_addr",
                    "peer_port", "iface", "tx_bytes", "rx_bytes", "retransmits", "recoveries", "rtt_samples",
                    "srtt_us", "srtt_max_us")
NET_SAMPLE_COLUMNS = ("node", "ts", "iface", "operstate", "carrier", "speed_mbps", "speed_max_mbps", "carrier_changes",
                      "rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_crc_errors",
                      "rx_missed_errors", "tx_carrier_errors")
MAX_NET_ROWS = 10_000
# the job's sync points (explain's steps.py lines them up: the watch's what-if): each recorded collective
# call, the communicator it was on, and each recorded synchronize call; and the kernel's counts of every
# traced call (is every collective recorded? how many kernels per collective?). Both are read from LATE_NS before `since`: a call is written
# when it returns, an interval's counts when it ends. The calls the watch holds already are left out by their
# seq (?after_seq=: seqs grow in the order rows are written; `seq_high`, the highest the node ever wrote, tells
# a watch that the store was replaced); the counts come again (the watch keys them)
COLLECTIVE_COLUMNS = ("node", "seq", "ts", "duration", "pid", "tid", "rank", "op", "communicator")
STEP_SOURCES = tuple(sorted({OP_SOURCE[op] for op in STEP_OPS}))
AGGREGATE_COLUMNS = ("node", "ts", "interval_ns", "pid", "rank", "source", "op", "count", "sum_ns", "max_ns")
MAX_COLLECTIVE_ROWS = 20_000
MAX_AGGREGATE_ROWS = 20_000
LATE_NS = 5_000_000_000                     # (a call longer than this that returns after the watch's last poll
                                            # is not sent: explain on the store sees it)
MAX_AGGREGATE_INTERVAL_NS = 60_000_000_000  # the longest interval the agent counts calls over (--interval)


def _rows(conn, sql, params):
    return [list(r) for r in conn.execute(sql, params).fetchall()]


def latest_ts(conn):
    row = conn.execute("SELECT MAX(ts + interval_ns) FROM thread_time").fetchone()
    return row[0] if row and row[0] is not None else None


def _query_int(name, text, what):
    """?name= as an int (None when empty); ValueError with a one-line reason otherwise."""
    if text in (None, ""):
        return None
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={str(text)[:40]!r}: {what} (an integer)") from None
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{name}={str(text)[:40]} is out of range: {what} (an integer between {INT64[0]} and "
                         f"{INT64[1]})")
    return value


def check_since(text):
    """?since= as an int (None when empty); ValueError with a one-line reason otherwise."""
    return _query_int("since", text, "give the node's CLOCK_MONOTONIC time in ns")


def check_seq(text):
    """?after_seq= as an int (None when empty); ValueError with a one-line reason otherwise."""
    return _query_int("after_seq", text, "give the highest event seq the watch holds")


def live_summary(db_path, since_ns=None, timeout_s=DEFAULT_TIMEOUT_S, after_seq=None):
    """{"columns": {table: [...]}, "thread_time": rows, "block": rows, "processes": rows, "lost": rows,
    "latest_ns": end of the newest interval or None, "truncated": bool}.

    since_ns: node CLOCK_MONOTONIC ns; intervals that START at or after it (a watch passes the
    `ts` after the last one it holds). None: the last DEFAULT_LOOKBACK_NS. ValueError for a since_ns
    out of SQLite's range; QueryTimeout past timeout_s. after_seq: the collective calls written after that
    event seq only (the highest the watch holds: each call comes once), of those from LATE_NS before since_ns."""
    if since_ns is not None:
        since_ns = check_since(since_ns)
    if after_seq is not None:
        after_seq = check_seq(after_seq)
    with reading(db_path, timeout_s, "the live summary") as conn:
        newest = latest_ts(conn)
        if since_ns is None:
            since_ns = (newest - DEFAULT_LOOKBACK_NS) if newest is not None else 0
        threads = _rows(conn, f"SELECT {', '.join(THREAD_TIME_COLUMNS)} FROM thread_time WHERE ts >= ? "
                              f"ORDER BY ts, pid, tid LIMIT ?", (since_ns, MAX_THREAD_ROWS + 1))
        truncated = len(threads) > MAX_THREAD_ROWS
        threads = threads[:MAX_THREAD_ROWS]
        block = _rows(conn, """
            SELECT node, ts / 1000000000 * 1000000000 AS sec, pid, MIN(comm), COUNT(*), SUM(bytes), SUM(duration)
            FROM events
            WHERE source = 'block' AND ts >= ?
            GROUP BY node, sec, pid
            ORDER BY sec, pid
            LIMIT ?""", (since_ns // 1_000_000_000 * 1_000_000_000, MAX_BLOCK_ROWS))
        processes = _rows(conn, f"SELECT {', '.join(PROCESS_COLUMNS)} FROM processes WHERE rank IS NOT NULL "
                                f"AND (exited IS NULL OR exited >= ?) ORDER BY pid LIMIT 1000", (since_ns,))
        lost = _rows(conn, f"SELECT {', '.join(LOST_COLUMNS)} FROM lost_events WHERE ts + interval_ns >= ? "
                           f"ORDER BY ts LIMIT 1000", (since_ns,))
        late = max(INT64[0], since_ns - LATE_NS)
        # in seq order, so that an answer cut at its cap is the part the next one continues from; the first
        # answer (no after_seq) the newest ones
        colls = _rows(conn, f"""
            SELECT node, seq, ts, duration, pid, tid, rank, op, json_extract(detail, '$.comm') AS communicator
            FROM events
            WHERE source IN ({', '.join('?' * len(STEP_SOURCES))}) AND op IN ({', '.join('?' * len(STEP_OPS))})
              AND ts >= ? AND seq > ?
            ORDER BY seq {'DESC' if after_seq is None else ''}
            LIMIT ?""", (*STEP_SOURCES, *STEP_OPS, late, INT64[0] if after_seq is None else after_seq,
                         MAX_COLLECTIVE_ROWS + 1))
        calls_truncated = len(colls) > MAX_COLLECTIVE_ROWS
        truncated = truncated or calls_truncated
        colls = colls[:MAX_COLLECTIVE_ROWS]
        if after_seq is None:
            colls.reverse()
        # the counts of an interval are written when it ends: every interval that ends after `late`
        aggs = _rows(conn, f"SELECT {', '.join(AGGREGATE_COLUMNS)} FROM aggregates WHERE ts >= ? AND ts + interval_ns >= ? "
                           f"AND source IN ('cuda', 'driver', 'nccl') ORDER BY ts LIMIT ?",
                     (max(INT64[0], late - MAX_AGGREGATE_INTERVAL_NS), late, MAX_AGGREGATE_ROWS + 1))
        truncated = truncated or len(aggs) > MAX_AGGREGATE_ROWS
        aggs = aggs[:MAX_AGGREGATE_ROWS]
        seq_high = conn.execute("SELECT value FROM meta WHERE key = 'seq_high'").fetchone()
        flows = samples = []
        if _has_tables(conn, "net_flows", "net_samples"):
            flows = _rows(conn, f"SELECT {', '.join(NET_FLOW_COLUMNS)} FROM net_flows WHERE ts >= ? ORDER BY ts "
                                f"LIMIT ?", (since_ns, MAX_NET_ROWS))
            samples = _rows(conn, f"SELECT {', '.join(NET_SAMPLE_COLUMNS)} FROM net_samples WHERE ts >= ? "
                                  f"AND iface != 'lo' ORDER BY ts LIMIT ?", (since_ns, MAX_NET_ROWS))
    return {"columns": {"thread_time": list(THREAD_TIME_COLUMNS), "block": list(BLOCK_COLUMNS),
                        "processes": list(PROCESS_COLUMNS), "lost": list(LOST_COLUMNS),
                        "net_flows": list(NET_FLOW_COLUMNS), "net_samples": list(NET_SAMPLE_COLUMNS),
                        "collectives": list(COLLECTIVE_COLUMNS), "aggregates": list(AGGREGATE_COLUMNS)},
            "thread_time": threads, "block": block, "processes": processes, "lost": lost, "net_flows": flows,
            "net_samples": samples, "collectives": colls, "aggregates": aggs, "since_ns": since_ns, "latest_ns": newest,
            "seq_high": _int_or_none(seq_high[0] if seq_high else None), "truncated": truncated,
            "calls_truncated": calls_truncated}


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _has_tables(conn, *names):
    found = {r[0] for r in conn.execute(
        f"SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ({', '.join('?' * len(names))})", names)}
    return found == set(names)
