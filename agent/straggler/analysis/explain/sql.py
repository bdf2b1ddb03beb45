"""The SQL explain runs: every query is per node (GROUP BY node, or rows that carry their node), so the
same text runs on a merged cluster.db (once) or on every node's own store through the fleet client
(once per node, rows combined).
Values computed from earlier answers (each rank's windows, the straggler's pid) are written into
the later queries as literals, so each finding's SQL reproduces its numbers as it stands.
Nothing here decides anything (model.py does), and no decision reads an SQL string."""
from ...probes.symbols import COLLECTIVE_OPS, LAUNCH_OPS, NCCL_DATATYPE_BYTES, NOT_FAILURES, OP_SOURCE, SETUP_OK
from ...store.steptime import wait_share_sql
from ...text import sql_literal as lit, sql_quote as q

THREAD_SUMS = """SUM(tt.calls) AS calls, SUM(tt.work_ns) AS work_ns, SUM(tt.sync_ns) AS sync_ns,
       SUM(tt.coll_ns) AS coll_ns, SUM(tt.runq_ns) AS runq_ns, SUM(tt.runq_work_ns) AS runq_work_ns,
       SUM(tt.runq_sync_ns) AS runq_sync_ns, SUM(tt.runq_coll_ns) AS runq_coll_ns,
       SUM(tt.blocked_ns) AS blocked_ns, SUM(tt.io_ns) AS io_ns, COUNT(*) AS intervals"""


def values_cte(name, columns, rows):
    """A CTE of literal rows."""
    if not rows:
        return f"{name}({', '.join(columns)}) AS (SELECT {', '.join('NULL' for _ in columns)} WHERE 0)"
    values = ",\n    ".join("(" + ", ".join(lit(v) for v in r) + ")" for r in rows)
    return f"{name}({', '.join(columns)}) AS (VALUES\n    {values}\n)"


def cut_clause(cut, column="ts", node_column="node", pid_column=None):
    """' AND ...': only the rows in the span explain judges (span.Cut): on each node, its own bounds on
    its clock (the nodes of a merged cluster.db have monotonic clocks of their own, so one time is a
    different number on each); the lab's monotonic bounds alike on every node; '' without a cut. A row
    is in the span when it starts in it. With pid_column (thread_time), each node's processes are named
    too, so the (node, pid, ts) index reads only the span."""
    if cut is None or not cut.active:
        return ""
    if cut.per_node is None:
        return _bounds(*cut.mono, column)
    terms = []
    for node in sorted(cut.per_node):
        pids = cut.pids.get(node) if pid_column else None
        of = f" AND {pid_column} IN ({', '.join(str(int(p)) for p in pids)})" if pids else ""
        terms.append(f"({node_column} = {q(node)}{of}{_bounds(*cut.bounds(node), column)})")
    return "\n  AND (" + ("\n       OR ".join(terms) or "0") + ")"


RANK_INDEX = """
SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'thread_time_node_pid_ts') AS indexed"""

# Each traced process's first summary's start and last summary's end (the trace's span, --since/--until's
# frame), read through the thread_time(node, pid, ts) index a few entries per process (a skip-scan: each
# node, each of its pids, then its first and last summary), not by reading every summary.
TRACE_SPAN = """
WITH RECURSIVE
  n(node) AS (SELECT MIN(node) FROM thread_time
              UNION ALL
              SELECT (SELECT MIN(node) FROM thread_time WHERE node > n.node) FROM n WHERE n.node IS NOT NULL),
  p(node, pid) AS (SELECT node, (SELECT MIN(pid) FROM thread_time t WHERE t.node = n.node) FROM n
                   WHERE n.node IS NOT NULL
                   UNION ALL
                   SELECT node, (SELECT MIN(pid) FROM thread_time t WHERE t.node = p.node AND t.pid > p.pid) FROM p
                   WHERE p.pid IS NOT NULL)
SELECT node, pid, (SELECT MIN(ts) FROM thread_time t WHERE t.node = p.node AND t.pid = p.pid) AS first_ts,
       (SELECT ts + interval_ns FROM thread_time t WHERE t.node = p.node AND t.pid = p.pid
        ORDER BY ts DESC LIMIT 1) AS last_ts
FROM p
WHERE pid IS NOT NULL
ORDER BY node, pid"""

# The same, for a store without that index (an agent older than it): every summary read once.
TRACE_SPAN_SCAN = """
SELECT node, pid, MIN(ts) AS first_ts, MAX(ts + interval_ns) AS last_ts
FROM thread_time
GROUP BY node, pid
ORDER BY node, pid"""


def spans(cut=None):
    """Each process that made traced calls: its rank and the span of intervals with calls."""
    return f"""
SELECT node, pid, MIN(rank) AS rank, MIN(ts) AS first_ts, MAX(ts + interval_ns) AS last_ts,
       MAX(interval_ns) AS interval_ns, SUM(calls) AS calls
FROM thread_time
WHERE calls > 0{cut_clause(cut, pid_column="pid")}
GROUP BY node, pid
ORDER BY node, pid"""


def callers(cut=None):
    """Each thread that made traced calls, per rank (node, pid): its calls and time in them (the calling
    thread is the one with the most), the span of its summaries and their interval."""
    return f"""
SELECT node, pid, tid, MIN(rank) AS rank, SUM(calls) AS calls, SUM(work_ns + sync_ns + coll_ns) AS call_ns,
       MIN(ts) AS first_ts, MAX(ts + interval_ns) AS last_ts, MAX(interval_ns) AS interval_ns
FROM thread_time
WHERE calls > 0{cut_clause(cut, pid_column="pid")}
GROUP BY node, pid, tid
ORDER BY node, pid, tid"""


# realtime minus monotonic averaged from its smallest value (an average of the whole ~1.8e18 is a double's,
# off by up to 256 ns, which puts a trace that starts on a second one second early)
NODE_CLOCKS = """
SELECT p.node, b.low + CAST(AVG(p.real_ns - p.mono_ns - b.low) AS INTEGER) AS real_minus_mono, COUNT(*) AS pairs,
       (SELECT o.offset_ns FROM clock_offsets o WHERE o.node = p.node AND o.method = 'merge'
        ORDER BY o.measured_at DESC LIMIT 1) AS merge_offset_ns
FROM clock_pairs p
JOIN (SELECT node, MIN(real_ns - mono_ns) AS low FROM clock_pairs GROUP BY node) b ON b.node = p.node
GROUP BY p.node
ORDER BY p.node"""


def series(keys, offsets, t0_ns, bin_ns, cut=None):
    """Every thread of each rank's process, summed per time bin of bin_ns on the fleet timeline (a node's
    ts plus its clock offset, from t0_ns): a summary belongs to the bin that holds its midpoint."""
    nodes = sorted({node for node, _ in keys})
    off = "CASE tt.node " + " ".join(f"WHEN {q(n)} THEN {int(offsets.get(n, 0))}" for n in nodes) + " END"
    ranks = ", ".join(f"({q(node)}, {int(pid)})" for node, pid in sorted(keys))
    return f"""
SELECT tt.node, tt.pid, tt.tid, (tt.ts + tt.interval_ns / 2 + {off} - {int(t0_ns)}) / {int(bin_ns)} AS bin,
       MIN(tt.comm) AS comm,
       {THREAD_SUMS}, SUM(tt.interval_ns) AS wall_ns
FROM thread_time tt
WHERE (tt.node, tt.pid) IN (VALUES {ranks})
  AND tt.ts + tt.interval_ns / 2 + {off} >= {int(t0_ns)}{cut_clause(cut, "tt.ts", "tt.node", "tt.pid")}
GROUP BY tt.node, tt.pid, tt.tid, bin
ORDER BY tt.node, tt.pid, bin"""


def win_cte(windows):
    """win(node, pid, part, lo, hi, tb): each rank's window as segments [lo, hi) of its node's clock, part
    'baseline' (its own clean time) or 'recent' (the time judged), and tb, where its recent part begins
    (slices count from there). Segments of one rank do not overlap."""
    rows = [(w.node, w.pid, part, lo, hi, w.tb) for w in sorted(windows)
            for part, segments in (("baseline", w.baseline), ("recent", w.recent)) for lo, hi in segments]
    return values_cte("win", ("node", "pid", "part", "lo", "hi", "tb"), rows)


def _hull_filter(windows, alias, parts=("baseline", "recent")):
    """A coarse time filter the ts index can use: per node, the hull of its windows' segments (the
    join on win assigns each row to its part exactly)."""
    hull = {}
    for w in windows:
        for part in parts:
            for lo, hi in getattr(w, part):
                a, b = hull.get(w.node, (lo, hi))
                hull[w.node] = (min(a, lo), max(b, hi))
    terms = [f"({alias}.ts >= {int(lo)} AND {alias}.ts < {int(hi)})" for _, (lo, hi) in sorted(hull.items())]
    return "(" + " OR ".join(terms) + ")" if terms else "0"


def threads(windows):
    """Every thread of each rank's process: thread_time summed over its baseline and recent part."""
    return f"""
WITH {win_cte(windows)}
SELECT tt.node, tt.pid, tt.tid, MIN(tt.comm) AS comm, w.part AS part,
       {THREAD_SUMS}
FROM win w
JOIN thread_time tt ON tt.node = w.node AND tt.pid = w.pid AND tt.ts >= w.lo AND tt.ts < w.hi
WHERE {_hull_filter(windows, "tt")}
GROUP BY tt.node, tt.pid, tt.tid, w.part
ORDER BY tt.node, tt.pid, tt.tid, w.part"""


def call_mix(windows):
    """What each rank did in its baseline and recent part, counted by the kernel's aggregates (every call,
    recorded or not): kernels launched and collectives called (a step's collectives are the same on every
    rank of a job in lockstep; the kernels between them are its work)."""
    launches = ", ".join(q(op) for op in LAUNCH_OPS)
    colls = ", ".join(q(op) for op in COLLECTIVE_OPS)
    return f"""
WITH {win_cte(windows)}
SELECT a.node, a.pid, w.part AS part,
       SUM(CASE WHEN a.op IN ({launches}) THEN a.count ELSE 0 END) AS launches,
       SUM(CASE WHEN a.op IN ({colls}) THEN a.count ELSE 0 END) AS collectives
FROM win w
JOIN aggregates a ON a.node = w.node AND a.pid = w.pid AND a.ts >= w.lo AND a.ts < w.hi
WHERE a.source IN ('cuda', 'driver', 'nccl') AND {_hull_filter(windows, "a")}
GROUP BY a.node, a.pid, w.part
ORDER BY a.node, a.pid, w.part"""


SIZE_PIECES = 32            # a rank's kernels are sized from its recent part cut in this many pieces,
SIZE_PER_PIECE = 64         # from the first this many recorded launches of each in time (2,048 at most)


def _pieces(windows, parts):
    """Each rank's recent part cut in at most `parts` pieces of about equal time, each within one segment:
    every segment gets one at least while there are no more segments than pieces (an on-phase of a fault
    that comes and goes is sampled, however short), the rest by their length; with more segments than
    pieces, pieces are spread over the part's time. (node, pid, lo, hi) rows."""
    rows = []
    for w in sorted(windows):
        segments = [(lo, hi) for lo, hi in w.recent if hi > lo]
        total = sum(hi - lo for lo, hi in segments)
        if not segments:
            continue
        if len(segments) <= parts:
            counts = [max(1, round(parts * (hi - lo) / total)) for lo, hi in segments]
            while sum(counts) > parts:
                i = max(range(len(counts)), key=lambda k: counts[k])
                counts[i] -= 1
            for (lo, hi), n in zip(segments, counts):
                step = -(-(hi - lo) // n)
                rows += [(w.node, w.pid, a, min(hi, a + step)) for a in range(lo, hi, step)]
            continue
        step = max(1, -(-total // parts))
        at, i, done = 0, 0, 0        # the next piece's start, in time into the part; its segment; time before it
        while at < total and i < len(segments):
            lo, hi = segments[i]
            if at >= done + (hi - lo):
                done += hi - lo
                i += 1
                continue
            start = lo + (at - done)
            rows.append((w.node, w.pid, start, min(hi, start + step)))
            at += step
    return rows


def launch_sizes(windows):
    """The size of each rank's kernels in its recent part, from a bounded sample of its recorded launches (the
    agent records 1 in --sample, and the slow ones; a kernel's size does not make its launch call slow): the
    first SIZE_PER_PIECE launches in time of each of SIZE_PIECES pieces of its time, whatever their API, so a
    long trace costs no more than a short one; how many of
    them carry their dimensions, the mean and mean square of their threads (grid x block, as the launch
    arguments give them), and, over the pieces that have some, how many and the mean and mean square of each
    piece's mean (launches in a row are no independent draws: a piece may hold one part of a step). A rank
    with a longer batch launches the same kernels on bigger grids."""
    threads = ("(CAST(e.grid_x AS REAL) * IFNULL(e.grid_y, 1) * IFNULL(e.grid_z, 1) * e.block_x * IFNULL(e.block_y, 1)"
               " * IFNULL(e.block_z, 1))")
    # each launch API's first ones in time along the (source, op, ts) index, then the first of them all
    per_op = "\n        UNION ALL\n".join(f"""        SELECT * FROM (
          SELECT e.ts, CASE WHEN e.grid_x > 0 AND e.block_x > 0 THEN {threads} END AS t
          FROM events e
          WHERE e.source = {q(OP_SOURCE[op])} AND e.op = {q(op)} AND e.ts >= p.lo AND e.ts < p.hi
            AND +e.node = p.node AND +e.pid = p.pid
          ORDER BY e.ts
          LIMIT {SIZE_PER_PIECE})""" for op in LAUNCH_OPS)
    n, total, squares = (f"json_extract(part, '$[{i}]')" for i in range(3))
    return f"""
WITH {values_cte("piece", ("node", "pid", "lo", "hi"), _pieces(windows, SIZE_PIECES))},
sample AS MATERIALIZED (
  SELECT p.node, p.pid, (
    SELECT json_array(COUNT(t), SUM(t), SUM(t * t)) FROM (
      SELECT t FROM (
{per_op})
      ORDER BY ts
      LIMIT {SIZE_PER_PIECE})) AS part
  FROM piece p)
SELECT node, pid, SUM({n}) AS sized, SUM({total}) / SUM({n}) AS threads, SUM({squares}) / SUM({n}) AS threads_sq,
       COUNT(NULLIF({n}, 0)) AS pieces, AVG(CAST({total} AS REAL) / NULLIF({n}, 0)) AS piece_mean,
       AVG(CAST({total} AS REAL) / NULLIF({n}, 0) * {total} / NULLIF({n}, 0)) AS piece_mean_sq
FROM sample
GROUP BY node, pid
HAVING SUM({n}) > 0
ORDER BY node, pid"""


def slices(windows, slice_ns):
    """The recent part cut into slices of slice_ns from where it begins: thread_time summed per thread
    and slice."""
    return f"""
WITH {win_cte(windows)}
SELECT tt.node, tt.pid, tt.tid, (tt.ts - w.tb) / {int(slice_ns)} AS slice,
       {THREAD_SUMS}
FROM win w
JOIN thread_time tt ON tt.node = w.node AND tt.pid = w.pid AND tt.ts >= w.lo AND tt.ts < w.hi
WHERE w.part = 'recent' AND {_hull_filter(windows, "tt", ("recent",))}
GROUP BY tt.node, tt.pid, tt.tid, slice
ORDER BY tt.node, tt.pid, slice"""


def thieves(windows, node, pid):
    """Who held the CPU of one rank's threads while they waited in the run queue, by part."""
    mine = [w for w in windows if w.node == node and w.pid == int(pid)]
    return f"""
WITH {win_cte(mine)}
SELECT tt.node, tt.pid, w.part AS part,
       json_extract(j.value, '$[0]') AS kind, json_extract(j.value, '$[1]') AS thief_pid,
       json_extract(j.value, '$[2]') AS thief_comm, SUM(json_extract(j.value, '$[3]')) AS runq_ns,
       COUNT(DISTINCT tt.tid) AS threads
FROM win w
JOIN thread_time tt ON tt.node = w.node AND tt.pid = w.pid AND tt.ts >= w.lo AND tt.ts < w.hi, json_each(tt.thieves) j
WHERE tt.node = {q(node)} AND tt.pid = {int(pid)} AND tt.thieves IS NOT NULL AND {_hull_filter(mine, "tt")}
GROUP BY tt.node, tt.pid, part, kind, thief_pid, thief_comm
ORDER BY part, runq_ns DESC"""


def block_io(windows, node, pid):
    """Block I/O on one rank's node in its window, by submitting process and part."""
    mine = [w for w in windows if w.node == node and w.pid == int(pid)]
    return f"""
WITH {win_cte(mine)}
SELECT e.node, e.pid, e.comm, w.part AS part,
       COUNT(*) AS requests, SUM(e.bytes) AS bytes, ROUND(AVG(e.duration), 1) AS mean_latency_ns,
       e.pid = w.pid AS own
FROM win w
JOIN events e ON +e.node = w.node AND e.ts >= w.lo AND e.ts < w.hi
WHERE +e.node = {q(node)} AND e.source = 'block' AND {_hull_filter(mine, "e")}
GROUP BY e.node, e.pid, e.comm, part
ORDER BY part, bytes DESC"""


RANKS = """
SELECT node, pid, MIN(rank) AS rank, MAX(world_size) AS world_size
FROM processes
WHERE rank IS NOT NULL
GROUP BY node, pid
ORDER BY node, pid"""

INVENTORY = """
SELECT node, COUNT(*) AS events, SUM(source IN ('cuda', 'driver', 'nccl')) AS calls,
       SUM(source = 'sched') AS sched_events
FROM events
GROUP BY node
ORDER BY node"""

def _bounds(since_ns, until_ns, column="ts"):
    out = ""
    if since_ns is not None:
        out += f" AND {column} >= {int(since_ns)}"
    if until_ns is not None:
        out += f" AND {column} < {int(until_ns)}"
    return out


def _not_failures():
    """The non-zero codes that are no failure (probes.symbols.NOT_FAILURES), as a WHERE clause part."""
    return "".join(f"\n  AND NOT (source = {q(source)} AND ret IN ({', '.join(str(int(c)) for c in codes)}))"
                   for source, codes in sorted(NOT_FAILURES.items()))


def call_errors(cut=None):
    """Traced calls that returned an error, per node, op and code (the agent records every one; NCCL's
    ncclInProgress, 7, from a non-blocking communicator, is not one)."""
    return f"""
SELECT node, source, op, ret, COUNT(*) AS failed, MIN(ts) AS first_ts, MAX(ts + duration) AS last_ts
FROM events
WHERE source IN ('cuda', 'driver', 'nccl') AND ret IS NOT NULL AND ret != 0{_not_failures()}{cut_clause(cut)}
GROUP BY node, source, op, ret
ORDER BY node, failed DESC, op, ret"""


def call_counts(cut=None):
    """Every traced call per node, recorded or not (the kernel's aggregates count them all)."""
    return f"""
SELECT node, SUM(count) AS calls
FROM aggregates
WHERE source IN ('cuda', 'driver', 'nccl'){cut_clause(cut)}
GROUP BY node
ORDER BY node"""


LOST = """
SELECT node, SUM(count) AS lost_events
FROM lost_events
GROUP BY node
HAVING SUM(count) > 0
ORDER BY node"""


def comm_setups(cut=None):
    """NCCL communicators made (ncclCommInitRank*, ncclCommSplit: the agent records each; ret 0, or 7,
    ncclInProgress, from a non-blocking one): per node and process, in time order, the communicator's
    pointer there and what names it across the cluster (the unique id's magic, or the parent and color).
    Not cut at --since (pass cut.until_only()): a job makes its communicators when it starts. (No alias may take a column's name,
    "id" or "comm": SQLite resolves GROUP BY and ORDER BY names to the table's columns first.)"""
    return f"""
SELECT node, pid, rank, op, ts, ret,
       json_extract(detail, '$.comm') AS communicator, json_extract(detail, '$.id') AS unique_id,
       json_extract(detail, '$.nranks') AS nranks, json_extract(detail, '$.rank') AS comm_rank,
       json_extract(detail, '$.parent') AS parent, json_extract(detail, '$.color') AS color
FROM events
WHERE source = 'nccl' AND op IN ('ncclCommInitRank', 'ncclCommSplit') AND ret IN ({', '.join(map(str, SETUP_OK))})
  AND json_extract(detail, '$.comm') != '0x0'{cut_clause(cut)}
ORDER BY node, pid, ts"""


# Calls of a few ops among all of a rank's events: a unary + on the join's node and pid (`+e.node`) keeps
# SQLite off the node and pid indexes, which hold every event of the rank (and, where ranks share a pid
# across nodes, of every rank), so that it finds them by (source, op, ts) at once. On bench_analysis's
# 1M-event cluster.db step_calls took 0.28 s instead of 1.17 s over the whole span and 0.011 s instead of
# 0.045 s over a tenth of it; explain as a whole 0.81 s instead of 2.05 s. (block_io, comm_collectives,
# step_calls, zoom.calls_sql; their pid and tid are the integers values_cte writes: + drops the column's
# type affinity, so a text '42' would match nothing.)


def comm_collectives(windows, ops):
    """Each rank's recorded NCCL collective calls in its recent part (the agent records every one), per
    communicator (its pointer in that process) and op: how many, and their time; and how many of them are of a
    datatype of known size (sized_calls) and the bytes those carried (count x that size). (Not "comm": that is
    events' column of the thread's name, which GROUP BY would take over an alias.)"""
    size = ("CASE json_extract(e.detail, '$.datatype') "
            + " ".join(f"WHEN {lit(name)} THEN {n}" for name, n in NCCL_DATATYPE_BYTES.items()) + " END")
    return f"""
WITH {win_cte(windows)}
SELECT e.node, e.pid, json_extract(e.detail, '$.comm') AS communicator, e.op, COUNT(*) AS calls,
       SUM(e.duration) AS dur_ns, COUNT({size}) AS sized_calls, SUM(json_extract(e.detail, '$.count') * {size}) AS bytes
FROM win w
JOIN events e ON +e.node = w.node AND +e.pid = w.pid AND e.ts >= w.lo AND e.ts < w.hi
WHERE w.part = 'recent' AND e.source = 'nccl' AND e.op IN ({', '.join(q(o) for o in ops)})
  AND {_hull_filter(windows, "e", ("recent",))}
GROUP BY e.node, e.pid, communicator, e.op
ORDER BY e.node, e.pid, communicator, e.op"""


def step_calls(ranges, ops, limit):
    """Every call of `ops` (collectives; and synchronize calls, where the ranks wait when collectives only
    enqueue) of each rank over its range [(node, pid, lo, hi, offset)] (its node's clock; the agent records
    each one: WHY_COLL, WHY_SYNC), in order: where it began and ended on the fleet timeline, how long the rank
    waited in it, its thread and its communicator; at most `limit` rows."""
    sources = sorted({OP_SOURCE[o] for o in ops})
    return f"""
WITH {values_cte("rk", ("node", "pid", "lo", "hi", "off"), sorted(ranges))}
SELECT e.node, e.pid, e.tid, e.op, e.ts + rk.off AS start_ns, e.ts + e.duration + rk.off AS end_ns,
       e.duration AS wait_ns, json_extract(e.detail, '$.comm') AS communicator
FROM rk JOIN events e ON +e.pid = rk.pid AND e.ts >= rk.lo AND e.ts < rk.hi AND +e.node = rk.node
WHERE e.source IN ({', '.join(q(s) for s in sources)}) AND e.op IN ({', '.join(q(o) for o in ops)})
ORDER BY e.node, e.pid, e.ts
LIMIT {int(limit)}"""


def step_counts(ranges, ops):
    """How many calls of each op each rank made over the same ranges, counted by the kernel (aggregates): is
    every one recorded?"""
    sources = sorted({OP_SOURCE[o] for o in ops})
    return f"""
WITH {values_cte("rk", ("node", "pid", "lo", "hi", "off"), sorted(ranges))}
SELECT a.node, a.pid, a.op, SUM(a.count) AS calls
FROM rk JOIN aggregates a ON a.node = rk.node AND a.pid = rk.pid AND a.ts >= rk.lo AND a.ts < rk.hi
WHERE a.source IN ({', '.join(q(s) for s in sources)}) AND a.op IN ({', '.join(q(o) for o in ops)})
GROUP BY a.node, a.pid, a.op
ORDER BY a.node, a.pid, a.op"""


# ---- a long trace: its roll-ups first (store.rollup; coarse.py) ---------------------------------------
HAS_ROLLUPS = "SELECT COUNT(*) AS present FROM pragma_table_list WHERE name = 'thread_rollup'"

ANY_ROLLUP = "SELECT node, COUNT(*) AS n FROM (SELECT node FROM thread_rollup LIMIT 1) GROUP BY node"

# sql.callers from the roll-ups (first_ts/last_ts: of the summaries rolled up; rolled_to: where they end;
# the time that says where the job waits, timeline.wait_def_of)
ROLLUP_CALLERS = """
SELECT node, pid, tid, MIN(rank) AS rank, SUM(calls) AS calls, SUM(work_ns + sync_ns + coll_ns) AS call_ns,
       MIN(first_ts) AS first_ts, MAX(last_ts) AS last_ts, MAX(summary_ns) AS interval_ns,
       MAX(ts + interval_ns) AS rolled_to, SUM(summaries * summary_ns) AS wall_ns, SUM(sync_ns) AS sync_ns,
       SUM(coll_ns + blocked_ns) AS other_ns, SUM(coll_ns) AS coll_ns
FROM thread_rollup
GROUP BY node, pid, tid
HAVING SUM(calls) > 0
ORDER BY node, pid, tid"""


def rollup_units(calling, wait_def, by_rank=False):
    """Each node's ranks' calling threads ({(node, pid): tid}) per minute of its clock (per rank with
    by_rank): how many ranks and their wall time, and under the job's wait definition (steptime's rule)
    the least wait share of a rank over the minute, the least of a rank's 10-s parts and the least of a
    rank's most-waiting part, and the ranks' mean of their fewest calls per second in a part. Streams
    off the (node, ts) index (by rank: (node, pid, tid, ts))."""
    threads = ", ".join(f"({q(node)}, {int(pid)}, {int(tid)})" for (node, pid), tid in sorted(calling.items()))
    wall = "summaries * summary_ns"
    unit = "node, pid" if by_rank else "node, MIN(pid) AS pid"
    group = "node, pid, tid, ts" if by_rank else "node, ts"
    return f"""
SELECT {unit}, ts, COUNT(*) AS ranks, SUM({wall}) AS wall_ns,
       MIN({wait_share_sql(wait_def, wall, "")}) AS wait, MIN(wait_lo_{wait_def}) AS lo,
       MIN(wait_hi_{wait_def}) AS hi, AVG(rate_lo) AS rate_lo
FROM thread_rollup
WHERE (node, pid, tid) IN (VALUES {threads or "(NULL, NULL, NULL)"})
GROUP BY {group}
ORDER BY {group}"""
