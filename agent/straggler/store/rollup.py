"""thread_rollup: thread_time per thread per minute, with its spread over the minute's 10-s parts
(schema.py describes the columns). A long trace is read there first: a day of 1-s summaries of a
512-rank job is 44 million rows, its roll-ups 60 times fewer, and the spread keeps what a minute's
mean would hide (a 10-s straggle in it, a fault that comes and goes).

The agent rolls each minute as it closes (roll); merge and the lab's generator roll a whole store
(rebuild). One INSERT ... SELECT over thread_time's time index; no Python row loop. A minute is its
start on the node's own clock, a multiple of ROLLUP_NS; a summary belongs to the minute it starts in.
rebuild's cost follows the rows, not the time they span: each statement rolls a stretch of
BATCH_ROWS summaries (more only when one REBUILD_NS window holds more), so a sparse trace (a summary
every ten minutes for a year) takes as few statements as a dense one of as many rows.
"""
from .steptime import wait_share_sql

ROLLUP_NS = 60_000_000_000
PART_NS = 10_000_000_000
REBUILD_NS = 10 * ROLLUP_NS     # rebuild()'s stretches start and end on multiples of this: at least one each
BATCH_ROWS = 250_000            # thread_time rows one rebuild() statement rolls (bounds its sort), unless one
                                # REBUILD_NS window holds more
META_KEY = "rollup_until"        # the agent's store: thread_time before this ts (ns) is rolled up

SUMS = ("calls", "work_ns", "sync_ns", "coll_ns", "runq_ns", "runq_work_ns", "runq_sync_ns", "runq_coll_ns",
        "blocked_ns", "io_ns")
COLUMNS = ("node", "ts", "interval_ns", "pid", "tid", "rank", "comm") + SUMS + (
    "summaries", "summary_ns", "first_ts", "last_ts", "wait_lo_blocking", "wait_hi_blocking", "wait_lo_enqueue",
    "wait_hi_enqueue", "rate_lo")


def roll_sql(where="1", ordered=False):
    """INSERT the roll-ups of the thread_time rows matching `where` (whole minutes of them). ordered:
    insert them REBUILD_NS window by window (rebuild's order, whatever the stretch `where` spans)."""
    part_sums = ", ".join(f"SUM({c}) AS {c}" for c in SUMS)
    minute_sums = ", ".join(f"SUM({c})" for c in SUMS)
    return f"""
INSERT INTO thread_rollup({', '.join(COLUMNS)})
SELECT node, minute * {ROLLUP_NS}, {ROLLUP_NS}, pid, tid, MIN(rank), MIN(comm), {minute_sums},
       SUM(n), MAX(summary_ns), MIN(first_ts), MAX(last_ts), MIN(wb), MAX(wb), MIN(we), MAX(we), MIN(rate)
FROM (SELECT node, pid, tid, ts / {ROLLUP_NS} AS minute, ts / {PART_NS} AS part, MIN(rank) AS rank,
             MIN(comm) AS comm, {part_sums}, COUNT(*) AS n, MAX(interval_ns) AS summary_ns,
             MIN(ts) AS first_ts, MAX(ts + interval_ns) AS last_ts,
             {wait_share_sql("blocking")} AS wb, {wait_share_sql("enqueue")} AS we,
             SUM(calls) * 1e9 / MAX(1, SUM(interval_ns)) AS rate
      FROM thread_time
      WHERE {where}
      GROUP BY node, pid, tid, part)
GROUP BY node, pid, tid, minute""" + (f"\nORDER BY minute / {REBUILD_NS // ROLLUP_NS}, node, pid, tid, minute"
                                     if ordered else "")


def roll(conn, node, upto_ns, since_ns=None):
    """Roll up `node`'s whole minutes from since_ns (a minute's start; None: the minute before upto's)
    to the one holding upto_ns (not included: it is still being written). Returns where the next roll
    starts. Runs in the caller's transaction."""
    end = int(upto_ns) // ROLLUP_NS * ROLLUP_NS
    start = end - ROLLUP_NS if since_ns is None else int(since_ns) // ROLLUP_NS * ROLLUP_NS
    if end <= start:
        return start
    conn.execute(roll_sql(f"ts >= {start} AND ts < {end} AND +node = ?"), (node,))   # by the ts index
    conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (META_KEY, str(end)))
    return end


def rolled_until(conn):
    """Where the agent's last roll ended (meta rollup_until), or None."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
    return int(row[0]) if row and str(row[0]).isdigit() else None


def rebuild(conn):
    """Every roll-up afresh from all of thread_time (a merged or generated store: complete, so every
    minute is rolled, the last one as far as it goes), one stretch of the nodes' clocks at a time by
    the ts index: BATCH_ROWS rows each (a bounded sort), cut on REBUILD_NS boundaries (so a minute is
    never split), at least one REBUILD_NS window each, skipping the empty time between nodes booted
    weeks apart. O(rows) statements' work, however sparse the rows: where the stretch ends is found
    by stepping BATCH_ROWS entries of the index, not by trying one window after another. The roll-ups
    are inserted window by window in (node, pid, tid, minute) order within each, whatever the
    stretches. Runs in the caller's transaction."""
    conn.execute("DELETE FROM thread_rollup")
    conn.execute("DELETE FROM meta WHERE key = ?", (META_KEY,))
    at = conn.execute("SELECT MIN(ts) FROM thread_time").fetchone()[0]
    while at is not None:
        start = int(at) // REBUILD_NS * REBUILD_NS
        beyond = conn.execute("SELECT ts FROM thread_time WHERE ts >= ? ORDER BY ts LIMIT 1 OFFSET ?",
                              (start, BATCH_ROWS)).fetchone()
        if beyond is None:                         # the rest: fewer than BATCH_ROWS rows
            conn.execute(roll_sql(f"ts >= {start}", ordered=True))
            return
        end = max(start + REBUILD_NS, int(beyond[0]) // REBUILD_NS * REBUILD_NS)
        conn.execute(roll_sql(f"ts >= {start} AND ts < {end}", ordered=True))
        at = conn.execute("SELECT MIN(ts) FROM thread_time WHERE ts >= ?", (end,)).fetchone()[0]
