"""The agent's batched SQLite writer (store/writer.py), without BPF: ids across restarts, schema
refusal, the size and age limits (oldest whole intervals first), and what a SIGKILL leaves."""
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from straggler.errors import StragglerError
from straggler.store import schema
from straggler.store.writer import StoreWriter, parse_size

INTERVAL = 1_000_000_000


def event(ts, op="cuLaunchKernel", pid=42, detail=None):
    """A row in records.EVENT_COLUMNS order."""
    return (None, None, "driver", op, pid, pid, "trainer", ts, 1000, 0, None, 1, 2, 3, 4, 5, 6,
            None, None, None, 0, None, None, detail)


def query(db, sql, params=()):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_ids_are_node_seq_and_continue_across_restarts_even_after_every_row_was_dropped(tmp_path):
    db = str(tmp_path / "s.db")
    for batch in range(3):
        writer = StoreWriter(db, "gpu-node-01")
        writer.start()
        writer.submit_events([event(ts) for ts in range(100)])
        assert writer.flush()
        writer.stop()
        if batch == 1:  # retention may empty the table: ids must still not be reused
            conn = sqlite3.connect(db)
            conn.execute("DELETE FROM events")
            conn.commit()
            conn.close()
    rows = query(db, "SELECT id, seq, node FROM events ORDER BY seq")
    assert [seq for _, seq, _ in rows] == list(range(201, 301))
    assert all(id_ == f"gpu-node-01:{seq}" for id_, seq, _ in rows)
    assert query(db, "PRAGMA journal_mode") == [("wal",)]


def test_a_newer_schema_is_refused_with_a_clear_message(tmp_path):
    db = str(tmp_path / "new.db")
    conn = sqlite3.connect(db)
    schema.create(conn)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(schema.SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    with pytest.raises(StragglerError, match="newer than this straggler understands.*upgrade"):
        StoreWriter(db, "n")


def test_not_a_straggler_database_is_refused(tmp_path):
    db = str(tmp_path / "other.db")
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StragglerError, match="not a straggler database"):
        StoreWriter(db, "n")


def test_max_db_keeps_file_and_wal_under_the_limit_by_dropping_the_oldest_whole_intervals(tmp_path):
    db = str(tmp_path / "bounded.db")
    limit = 2 << 20
    writer = StoreWriter(db, "n", interval_ns=INTERVAL, max_db_bytes=limit)
    writer.start()
    per_interval, intervals = 2000, 60
    largest = 0
    for interval in range(intervals):
        start = (interval + 10) * INTERVAL
        writer.submit_events([event(start + i * 1000, detail='{"why":["sample"]}') for i in range(per_interval)])
        writer.submit("aggregates", [("n", start, INTERVAL, 42, None, "driver", "cuLaunchKernel", 100, 1, 1, "[1]")])
        assert writer.flush()
        largest = max(largest, writer.file_bytes())
    writer.stop()
    assert largest <= limit
    total_bytes = os.path.getsize(db) + (os.path.getsize(db + "-wal") if os.path.exists(db + "-wal") else 0)
    assert total_bytes <= limit
    kept = query(db, "SELECT ts / ? AS interval, count(*) FROM events GROUP BY interval ORDER BY interval", (INTERVAL,))
    # the newest interval is there, old ones are gone, and what is left is whole intervals
    assert kept[-1][0] == intervals - 1 + 10
    assert kept[0][0] > 10
    assert all(count == per_interval for _, count in kept)
    aggregate_intervals = [ts // INTERVAL for (ts,) in query(db, "SELECT ts FROM aggregates ORDER BY ts")]
    assert aggregate_intervals == [interval for interval, _ in kept]
    assert query(db, "PRAGMA integrity_check") == [("ok",)]


def test_max_age_drops_older_intervals(tmp_path):
    db = str(tmp_path / "aged.db")
    writer = StoreWriter(db, "n", interval_ns=INTERVAL, max_age_ns=30 * INTERVAL)
    writer.start()
    now = time.monotonic_ns()
    writer.submit_events([event(now - 120 * INTERVAL), event(now - 60 * INTERVAL), event(now)])
    writer.submit("clock_pairs", [("n", now - 100 * INTERVAL, 1), ("n", now, 2)])
    assert writer.flush()
    writer.stop()
    assert query(db, "SELECT ts FROM events") == [(now,)]
    assert query(db, "SELECT mono_ns FROM clock_pairs") == [(now,)]


WRITER_LOOP = textwrap.dedent("""
    import sys
    from straggler.store.writer import StoreWriter
    writer = StoreWriter(sys.argv[1], "n", interval_ns=10**9)
    writer.start()
    batch = 0
    while True:
        writer.submit_events([(None, None, "driver", "cuLaunchKernel", 1, 1, "t", batch * 1000 + i, 5, 0, None,
                               None, None, None, None, None, None, None, None, None, 0, None, None, None)
                              for i in range(1000)])
        batch += 1
        writer.flush()
        print(batch * 1000, flush=True)
""")


def test_sigkill_leaves_a_readable_database_with_every_flushed_batch(tmp_path):
    db = str(tmp_path / "killed.db")
    proc = subprocess.Popen([sys.executable, "-c", WRITER_LOOP, db], stdout=subprocess.PIPE, text=True)
    confirmed = 0
    try:
        while confirmed < 20_000:
            line = proc.stdout.readline()
            assert line, "the writer loop died"
            confirmed = int(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert query(db, "PRAGMA integrity_check") == [("ok",)]
    stored = query(db, "SELECT count(*), count(DISTINCT seq) FROM events")[0]
    assert stored[0] == stored[1] >= confirmed  # every confirmed batch is there, whole


@pytest.mark.parametrize("text,expected", [("1048576", 1 << 20), ("500M", 500 << 20), ("2G", 2 << 30),
                                           ("1.5k", 1536), ("64MiB", 64 << 20), ("0", 0)])
def test_sizes_are_read_with_suffixes(text, expected):
    assert parse_size(text) == expected


def test_a_nonsense_size_is_an_error():
    with pytest.raises(StragglerError):
        parse_size("lots")


def thread_row(ts, coll_ns, calls=100, pid=42, tid=42):
    """A thread_time row (writer.TABLE_INSERTS order): a 1-s summary of the calling thread."""
    return ("n", ts, INTERVAL, pid, tid, 0, "trainer", calls, 100_000_000, 0, coll_ns, 0, 0, 0, 0, 0, 0, None)


def test_each_minute_is_rolled_up_as_it_closes_with_its_spread_and_across_a_restart(tmp_path):
    """thread_rollup (what explain reads a long trace by): a minute's sums are its summaries', its spread
    the least and most its 10-s parts waited; the minute still being written is not rolled up, and an
    agent that restarts rolls up from where the last one stopped."""
    db = str(tmp_path / "s.db")
    minute = 60 * INTERVAL
    base = 10 * minute                           # minute 10 of the node's clock
    now = lambda: base + 3600 * INTERVAL          # noqa: E731 (this boot's clock, whatever the machine's)
    writer = StoreWriter(db, "n", clock=now)
    writer.start()
    for s in range(90):                          # 90 s: minute 10 whole, half of minute 11
        # waits 30 % of each second, but only 5 % in seconds 20-29 of the first minute (a 10-s straggle)
        writer.submit("thread_time", [thread_row(base + s * INTERVAL, 50_000_000 if 20 <= s < 30 else 300_000_000)])
        writer.roll_up(base + (s + 1) * INTERVAL)
    assert writer.flush()
    writer.stop()
    rows = query(db, "SELECT ts, summaries, calls, coll_ns, wait_lo_blocking, wait_hi_blocking, first_ts, last_ts "
                     "FROM thread_rollup ORDER BY ts")
    assert len(rows) == 1, rows                  # minute 11 is still being written
    ts, summaries, calls, coll, lo, hi, first, last = rows[0]
    assert ts == base and summaries == 60 and calls == 6000 and coll == 50 * 300_000_000 + 10 * 50_000_000
    assert lo == pytest.approx(0.05) and hi == pytest.approx(0.30)
    assert (first, last) == (base, base + minute)
    writer = StoreWriter(db, "n", clock=now)     # restarted two minutes later, in minute 13
    writer.start()
    for s in range(210, 245):
        writer.submit("thread_time", [thread_row(base + s * INTERVAL, 300_000_000)])
        writer.roll_up(base + (s + 1) * INTERVAL)
    assert writer.flush()
    writer.stop()
    rows = query(db, "SELECT ts, summaries, wait_lo_blocking FROM thread_rollup ORDER BY ts")
    assert rows == [(base, 60, pytest.approx(0.05)), (base + minute, 30, pytest.approx(0.30)),
                    (base + 3 * minute, 30, pytest.approx(0.30))]


def test_after_a_reboot_the_rollups_start_again_from_the_new_clock(tmp_path):
    """A store kept across a reboot holds a roll-up end ahead of the new boot's monotonic clock: the
    agent rolls up from its own minute again instead of waiting for the clock to pass the old one."""
    db = str(tmp_path / "s.db")
    minute = 60 * INTERVAL
    writer = StoreWriter(db, "n", clock=lambda: 10_000 * minute)
    writer.start()
    for s in range(0, 125):                      # the old boot: minutes 5000 and 5001 rolled up
        writer.submit("thread_time", [thread_row(5000 * minute + s * INTERVAL, 300_000_000)])
        writer.roll_up(5000 * minute + (s + 1) * INTERVAL)
    assert writer.flush()
    writer.stop()
    writer = StoreWriter(db, "n", clock=lambda: 3 * minute)      # rebooted: the clock is at minute 3
    writer.start()
    for s in range(125):
        writer.submit("thread_time", [thread_row(minute + s * INTERVAL, 300_000_000)])
        writer.roll_up(minute + (s + 1) * INTERVAL)
    assert writer.flush()
    writer.stop()
    assert [r[0] // minute for r in query(db, "SELECT ts FROM thread_rollup ORDER BY ts")] == [1, 2, 5000, 5001]
