"""The agent's single, batched SQLite writer, and the store's retention (--max-db, --max-age).

One thread owns the read-write connection. Other threads hand it rows (`submit_events`,
`submit`), which it writes in batches, one transaction each (WAL, synchronous=NORMAL): a
SIGKILL of the agent loses at most the batch being built and leaves a readable database.
Event ids are NODE:SEQ with seq continuing from the highest ever used on this node (kept in
meta 'seq_high' too, so retention deleting every row never leads to a reused id).

Retention drops the OLDEST data first, by whole intervals (multiples of the agent's interval
on the monotonic clock), from every per-interval table, until the database is back under its
budget; the file shrinks by incremental vacuum when needed.

This module must not import BCC or the probes: it only knows rows and the schema.
"""
import os
import sqlite3
import threading
import time
from collections import deque

from ..errors import StragglerError
from . import rollup, schema

EVENT_INSERT = (
    "INSERT INTO events(seq, node, rank, local_rank, source, op, pid, tid, comm, ts, duration, ret, bytes, "
    "grid_x, grid_y, grid_z, block_x, block_y, block_z, state, other_pid, other_comm, cpu, dev, sector, detail) "
    "VALUES (" + ", ".join(["?"] * 26) + ")")
TABLE_INSERTS = {
    "aggregates": "INSERT INTO aggregates(node, ts, interval_ns, pid, rank, source, op, count, sum_ns, max_ns, hist) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "thread_time": "INSERT INTO thread_time(node, ts, interval_ns, pid, tid, rank, comm, calls, work_ns, sync_ns, "
                   "coll_ns, runq_ns, runq_work_ns, runq_sync_ns, runq_coll_ns, blocked_ns, io_ns, thieves) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "clock_pairs": "INSERT INTO clock_pairs(node, mono_ns, real_ns) VALUES (?, ?, ?)",
    "lost_events": "INSERT INTO lost_events(node, probe, ts, interval_ns, count) VALUES (?, ?, ?, ?, ?)",
    "agent_cost": "INSERT INTO agent_cost(node, ts, interval_ns, cpu_seconds, probe_hits, events_written, rss_bytes) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?)",
    "processes": "INSERT OR REPLACE INTO processes(node, pid, ppid, comm, cmdline, rank, local_rank, world_size, "
                 "master_addr, master_port, first_seen, last_seen, exited) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "probes": "INSERT OR REPLACE INTO probes(node, name, library, attached_at) VALUES (?, ?, ?, ?)",
    # the devices (straggler.devices): GPU_SAMPLE_COLUMNS is the order of a gpu_samples row
    "gpus": "INSERT OR REPLACE INTO gpus(node, gpu, uuid, name, pci_bus_id, minor, ts, last_seen) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    "gpu_samples": "INSERT INTO gpu_samples(" + ", ".join(schema.GPU_SAMPLE_COLUMNS) + ") VALUES ("
                   + ", ".join(["?"] * len(schema.GPU_SAMPLE_COLUMNS)) + ")",
    "gpu_processes": "INSERT OR REPLACE INTO gpu_processes(node, pid, gpu, uuid, rank, how, mem_used_bytes, first_seen, "
                     "last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "gpu_errors": "INSERT INTO gpu_errors(node, ts, gpu, pci_bus_id, uuid, xid, meaning, pid, process, gpu_instance, "
                  "compute_instance, origin, kmsg_seq, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    # the network (straggler.network and the net probe): the schema's *_COLUMNS are the orders
    **{table: f"INSERT INTO {table}(" + ", ".join(columns) + ") VALUES (" + ", ".join(["?"] * len(columns)) + ")"
       for table, columns in (("net_samples", schema.NET_SAMPLE_COLUMNS), ("rdma_samples", schema.RDMA_SAMPLE_COLUMNS),
                              ("net_flows", schema.NET_FLOW_COLUMNS))},
}
# tables cut by retention, with their time column
RETAINED = (("events", "ts"), ("aggregates", "ts"), ("thread_time", "ts"), ("thread_rollup", "ts"), ("lost_events", "ts"),
            ("agent_cost", "ts"),
            ("clock_pairs", "mono_ns"), ("gpu_samples", "ts"), ("gpu_errors", "ts"), ("net_samples", "ts"),
            ("rdma_samples", "ts"), ("net_flows", "ts"))
MIN_MAX_DB = 1 << 20


def parse_size(text) -> int:
    """'500M', '2G', '1048576' -> bytes."""
    text = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    for suffix, factor in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if text.endswith(suffix):
            text, scale = text[:-1], factor
            break
    try:
        return int(float(text) * scale)
    except ValueError:
        raise StragglerError(f"cannot read size {text!r}: give bytes, or a number with K, M or G") from None


def open_store(db_path, node):
    """Open (create) the database read-write with the agent's settings; checks the schema version."""
    parent = os.path.dirname(os.path.abspath(db_path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise StragglerError(f"cannot create {parent} for the database ({exc.strerror}): run as root or pass --db PATH") from None
    try:
        conn = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None, timeout=10)
        conn.execute("PRAGMA busy_timeout = 10000")
        fresh = conn.execute("PRAGMA page_count").fetchone()[0] == 0
        if fresh:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # must precede the first table
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StragglerError(f"{db_path}: cannot switch to WAL mode (got {mode}): is it on a network filesystem?")
        conn.execute("PRAGMA synchronous = NORMAL")
        if not fresh:
            has_tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
            if has_tables:
                try:
                    schema.check_version(conn, db_path)
                except schema.SchemaError as exc:
                    raise StragglerError(f"{exc}") from None
        schema.create(conn, node)  # autocommit mode (isolation_level=None): its commit() is a no-op
    except sqlite3.DatabaseError as exc:
        raise StragglerError(f"{db_path}: cannot open the database ({exc}): check the path, or move a damaged file away") from None
    return conn


class StoreWriter:
    """Batches rows from any thread into one writer thread; enforces --max-db / --max-age."""

    def __init__(self, db_path, node, interval_ns=5_000_000_000, max_db_bytes=None, max_age_ns=None,
                 flush_interval_s=0.5, max_queued_events=200_000, clock=time.monotonic_ns):
        self.db_path, self.node = db_path, node
        self.interval_ns = int(interval_ns)
        self.max_db_bytes = max_db_bytes
        self.max_age_ns = max_age_ns
        self.flush_interval_s = flush_interval_s
        self.max_queued_events = max_queued_events
        if max_db_bytes is not None and max_db_bytes < MIN_MAX_DB:
            raise StragglerError(f"--max-db {max_db_bytes} is too small: give at least 1M")
        # the WAL counts against --max-db: keep it to a slice of the budget
        self.wal_budget = None if not max_db_bytes else max(128 << 10, min(max_db_bytes // 8, 64 << 20))
        self.batch_rows = 20000 if not self.wal_budget else max(200, min(20000, self.wal_budget // 512))
        self.conn = open_store(db_path, node)
        if self.wal_budget:
            page_size = self.conn.execute("PRAGMA page_size").fetchone()[0]
            self.conn.execute(f"PRAGMA wal_autocheckpoint = {max(16, self.wal_budget // page_size // 2)}")
            self.conn.execute(f"PRAGMA journal_size_limit = {self.wal_budget}")
        self.next_seq = self._first_free_seq()
        # where the last roll-up ended (None: from the minute the agent starts in; so too after a reboot,
        # when the stored one is ahead of this boot's clock)
        self.rolled_until = rollup.rolled_until(self.conn)
        if self.rolled_until is not None and self.rolled_until > clock():
            self.rolled_until = None
        self._queue = deque()
        self._queued_events = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = None
        self.events_written = 0
        self.dropped_events = 0     # rows refused because the writer fell too far behind
        self.rows_deleted = 0       # rows removed by retention
        self.error = None

    def _first_free_seq(self):
        row = self.conn.execute("SELECT seq FROM events WHERE node = ? ORDER BY rowid DESC LIMIT 1", (self.node,)).fetchone()
        last = row[0] if row else 0
        max_row = self.conn.execute("SELECT max(seq) FROM events WHERE node = ?", (self.node,)).fetchone() if last == 0 else (last,)
        meta = self.conn.execute("SELECT value FROM meta WHERE key = 'seq_high'").fetchone()
        return max(last, max_row[0] or 0, int(meta[0]) if meta else 0) + 1

    # ---- producer side (any thread) -----------------------------------------------------
    def submit_events(self, rows):
        """Queue event rows (EVENT_COLUMNS order, without seq/node). Returns how many were dropped."""
        if not rows:
            return 0
        with self._cond:
            if self._queued_events + len(rows) > self.max_queued_events:
                self.dropped_events += len(rows)
                return len(rows)
            self._queue.append(("events", rows))
            self._queued_events += len(rows)
            if self._queued_events >= self.batch_rows:
                self._cond.notify()
        return 0

    def submit(self, table, rows):
        """Queue rows for a table of TABLE_INSERTS (aggregates, thread_time, ..., gpu_samples: node first)."""
        if rows:
            with self._cond:
                self._queue.append((table, rows))

    def roll_up(self, upto_ns):
        """Roll up thread_time's minutes that closed before upto_ns (store.rollup), after the rows
        queued so far."""
        with self._cond:
            self._queue.append(("rollup", int(upto_ns)))

    def set_meta(self, key, value):
        with self._cond:
            self._queue.append(("meta", [(key, str(value))]))

    def clear_probes(self):
        with self._cond:
            self._queue.append(("clear_probes", None))

    def flush(self, timeout=10.0):
        """Wait until everything queued so far is committed (bounded)."""
        done = threading.Event()
        with self._cond:
            self._queue.append(("barrier", done))
            self._cond.notify()
        return done.wait(timeout)

    # ---- the writer thread ---------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._run, name="straggler-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout=30.0):
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread:
            self._thread.join(timeout)
        try:
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self.conn.close()

    def _run(self):
        while True:
            with self._cond:
                if not self._queue and not self._stopping:
                    self._cond.wait(self.flush_interval_s)
                items = list(self._queue)
                self._queue.clear()
                self._queued_events = 0
                stopping = self._stopping
            if items:
                try:
                    self._write(items)
                except Exception as exc:  # keep the agent alive; report once
                    if self.error is None:
                        self.error = f"writing to {self.db_path} failed: {exc}"
                    for kind, payload in items:
                        if kind == "barrier":
                            payload.set()
            if stopping:
                return
            if not items:
                continue
            # let rows accumulate into a batch (unless enough are waiting already)
            with self._cond:
                if self._queued_events < self.batch_rows and not self._stopping:
                    self._cond.wait(self.flush_interval_s)

    def _write(self, items):
        conn = self.conn
        barriers = []
        node = self.node
        pending_events = []
        rolled = self.rolled_until
        for kind, payload in items:
            if kind == "events":
                pending_events.extend(payload)
        # events in chunks, each its own transaction (bounded WAL growth)
        index = 0
        while index < len(pending_events) or index == 0:
            chunk = pending_events[index:index + self.batch_rows]
            index += self.batch_rows
            conn.execute("BEGIN")
            if chunk:
                first = self.next_seq
                conn.executemany(EVENT_INSERT, [(first + i, node) + row for i, row in enumerate(chunk)])
                self.next_seq = first + len(chunk)
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('seq_high', ?)", (str(self.next_seq - 1),))
            if index >= len(pending_events):
                for kind, payload in items:
                    if kind in TABLE_INSERTS:
                        conn.executemany(TABLE_INSERTS[kind], payload)
                    elif kind == "meta":
                        conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", payload)
                    elif kind == "rollup":
                        if payload // rollup.ROLLUP_NS * rollup.ROLLUP_NS > (rolled or 0):
                            rolled = rollup.roll(conn, node, payload, rolled)
                    elif kind == "clear_probes":
                        conn.execute("DELETE FROM probes WHERE node = ?", (node,))
                    elif kind == "barrier":
                        barriers.append(payload)
            conn.execute("COMMIT")
            self.rolled_until = rolled         # (only once what it rolled is committed)
            self.events_written += len(chunk)
            self._enforce_limits()
            if not chunk:
                break
        for barrier in barriers:
            barrier.set()

    # ---- retention ----------------------------------------------------------------------
    def _pragma(self, name):
        return self.conn.execute(f"PRAGMA {name}").fetchone()[0]

    def used_bytes(self):
        return (self._pragma("page_count") - self._pragma("freelist_count")) * self._pragma("page_size")

    def file_bytes(self):
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(self.db_path + suffix)
            except OSError:
                pass
        return total

    def _delete_before(self, cutoff):
        """Delete everything older than cutoff, in transactions of at most batch_rows events each
        (a checkpoint after each), so the WAL stays within its slice of --max-db."""
        deleted = 0
        for _ in range(1_000_000):
            self.conn.execute("BEGIN")
            chunk = self.conn.execute("DELETE FROM events WHERE rowid IN (SELECT rowid FROM events WHERE ts < ? "
                                      "LIMIT ?)", (cutoff, self.batch_rows)).rowcount
            deleted += chunk
            last = chunk < self.batch_rows
            if last:
                for table, column in RETAINED:
                    if table != "events":
                        deleted += self.conn.execute(f"DELETE FROM {table} WHERE {column} < ?", (cutoff,)).rowcount
            self.conn.execute("COMMIT")
            if self.wal_budget:
                self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            if last:
                break
        self.rows_deleted += deleted
        return deleted

    def _oldest_ts(self):
        oldest = None
        for table in ("events", "aggregates"):
            value = self.conn.execute(f"SELECT min(ts) FROM {table}").fetchone()[0]
            if value is not None and (oldest is None or value < oldest):
                oldest = value
        return oldest

    def _enforce_limits(self):
        if self.max_age_ns:
            now = time.monotonic_ns()
            cutoff = (now - self.max_age_ns) // self.interval_ns * self.interval_ns
            oldest = self._oldest_ts()
            if oldest is not None and oldest < cutoff:
                self._delete_before(cutoff)
        if not self.max_db_bytes:
            return
        main_budget = self.max_db_bytes - 2 * self.wal_budget  # the WAL may lag a checkpoint behind
        high, low = int(main_budget * 0.85), int(main_budget * 0.65)
        if self.used_bytes() > high:
            for _ in range(100000):
                oldest = self._oldest_ts()
                if oldest is None:
                    break
                # the oldest whole interval goes, whatever it holds
                self._delete_before((oldest // self.interval_ns + 1) * self.interval_ns)
                if self.used_bytes() <= low:
                    break
        page_size = self._pragma("page_size")
        if self._pragma("page_count") * page_size > main_budget:
            free_pages = self._pragma("freelist_count")
            if free_pages:
                self.conn.execute(f"PRAGMA incremental_vacuum({free_pages})").fetchall()
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
