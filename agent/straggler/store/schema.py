"""The store's schema: the contract that users, explain, merge and export write SQL against.

One SQLite file per node (WAL mode). A merged cluster database has the same tables, with
rows from many nodes and `events.ts_aligned` filled in. Times are nanoseconds; `ts` is the
node's CLOCK_MONOTONIC (what bpf_ktime_get_ns() returns); `ts_aligned` is nanoseconds since
the Unix epoch on the fleet's common timeline. Change this only together with the tests
that read it, and bump SCHEMA_VERSION.

This module must not import anything else from straggler.
"""
import sqlite3

SCHEMA_VERSION = 2   # 2: thread_time (the step-time model's per-thread summaries)

DDL = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT
);

-- One row per traced call or interval. id = 'NODE:SEQ' is unique across agent restarts on a
-- node and across nodes, so databases merge without collisions.
CREATE TABLE IF NOT EXISTS events (
    seq        INTEGER NOT NULL,           -- per-node sequence number, never reused
    node       TEXT    NOT NULL,           -- node name (agent --node, default hostname)
    id         TEXT GENERATED ALWAYS AS (node || ':' || seq) VIRTUAL,
    rank       INTEGER,                    -- torchrun RANK of the process, NULL if unknown
    local_rank INTEGER,                    -- torchrun LOCAL_RANK
    source     TEXT    NOT NULL,           -- cuda | driver | nccl | sched | block
    op         TEXT    NOT NULL,           -- cuLaunchKernel, cudaMalloc, ncclAllReduce, offcpu, runq, block_write, ...
    pid        INTEGER,                    -- process (tgid)
    tid        INTEGER,                    -- thread
    comm       TEXT,                       -- thread name
    ts         INTEGER NOT NULL,           -- start, ns, node CLOCK_MONOTONIC
    duration   INTEGER NOT NULL DEFAULT 0, -- ns
    ret        INTEGER,                    -- return value of a traced call (CUresult / cudaError_t)
    bytes      INTEGER,                    -- alloc/copy size, block I/O size
    grid_x INTEGER, grid_y INTEGER, grid_z INTEGER,     -- launches
    block_x INTEGER, block_y INTEGER, block_z INTEGER,
    state      TEXT,                       -- sched offcpu: 'preempted' (runnable) | 'blocked' (slept)
    other_pid  INTEGER,                    -- sched: the task that ran instead; block: -
    other_comm TEXT,
    cpu        INTEGER,                    -- CPU the interval / request was on
    dev        TEXT,                       -- block device 'major:minor'
    sector     INTEGER,                    -- block: start sector
    detail     TEXT,                       -- JSON for anything else
    ts_aligned INTEGER                     -- ns since epoch on the fleet timeline (filled by merge)
);
CREATE INDEX IF NOT EXISTS events_source_op_ts ON events(source, op, ts);
CREATE INDEX IF NOT EXISTS events_pid_ts ON events(pid, ts);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);

-- Per-interval aggregates of every call, recorded or not (counts never lie).
CREATE TABLE IF NOT EXISTS aggregates (
    node        TEXT    NOT NULL,
    ts          INTEGER NOT NULL,          -- interval start, ns monotonic
    interval_ns INTEGER NOT NULL,
    pid         INTEGER,
    rank        INTEGER,
    source      TEXT    NOT NULL,
    op          TEXT    NOT NULL,
    count       INTEGER NOT NULL,
    sum_ns      INTEGER NOT NULL,
    max_ns      INTEGER NOT NULL,
    hist        TEXT                       -- JSON list: counts per log2(duration ns) bucket
);
CREATE INDEX IF NOT EXISTS aggregates_ts ON aggregates(ts);

-- The step-time model, per interval and traced thread (what explain and a live watch read instead
-- of raw events). Times are ns within the interval. Call time by class comes from the kernel
-- (outermost calls, charged to the interval in which the call returned); off-CPU time is charged to
-- the interval in which the thread got its CPU back.
--   work_ns / sync_ns / coll_ns   wall time inside work / synchronize / collective calls
--   runq_ns                       run-queue wait (runnable, its CPU held by another task), anywhere;
--   runq_work_ns ... runq_coll_ns   the part of it inside work / sync / collective calls
--   blocked_ns                    asleep outside any traced call, not on its own block I/O
--                                 (a CPU collective such as gloo, a lock, a sleep, a page fault)
--   io_ns                         asleep outside calls while its own process had block I/O in flight
--   thieves                       JSON [[kind, pid, comm, ns], ...]: who held the CPU during its
--                                 run-queue waits, top ones (kind: process, own, kernel, outside, idle)
-- On-CPU time outside calls (host compute) is what is left of the thread's wall time.
CREATE TABLE IF NOT EXISTS thread_time (
    node         TEXT    NOT NULL,
    ts           INTEGER NOT NULL,         -- interval start, ns monotonic
    interval_ns  INTEGER NOT NULL,
    pid          INTEGER NOT NULL,
    tid          INTEGER NOT NULL,
    rank         INTEGER,
    comm         TEXT,
    calls        INTEGER NOT NULL DEFAULT 0,
    work_ns      INTEGER NOT NULL DEFAULT 0,
    sync_ns      INTEGER NOT NULL DEFAULT 0,
    coll_ns      INTEGER NOT NULL DEFAULT 0,
    runq_ns      INTEGER NOT NULL DEFAULT 0,
    runq_work_ns INTEGER NOT NULL DEFAULT 0,
    runq_sync_ns INTEGER NOT NULL DEFAULT 0,
    runq_coll_ns INTEGER NOT NULL DEFAULT 0,
    blocked_ns   INTEGER NOT NULL DEFAULT 0,
    io_ns        INTEGER NOT NULL DEFAULT 0,
    thieves      TEXT
);
CREATE INDEX IF NOT EXISTS thread_time_ts ON thread_time(ts);

-- (monotonic, realtime) pairs read back to back, so any ts converts to wall-clock time.
CREATE TABLE IF NOT EXISTS clock_pairs (
    node    TEXT    NOT NULL,
    mono_ns INTEGER NOT NULL,
    real_ns INTEGER NOT NULL
);

-- Offsets measured by the fleet client / clock_facts: node realtime minus reference realtime.
CREATE TABLE IF NOT EXISTS clock_offsets (
    node           TEXT    NOT NULL,
    offset_ns      INTEGER NOT NULL,
    uncertainty_ns INTEGER NOT NULL,
    measured_at    INTEGER NOT NULL,       -- reference realtime ns
    method         TEXT                    -- 'https', 'ssh', ...
);

CREATE TABLE IF NOT EXISTS processes (
    node        TEXT    NOT NULL,
    pid         INTEGER NOT NULL,
    ppid        INTEGER,
    comm        TEXT,
    cmdline     TEXT,
    rank        INTEGER,
    local_rank  INTEGER,
    world_size  INTEGER,
    master_addr TEXT,
    master_port INTEGER,
    first_seen  INTEGER,                   -- ns monotonic
    last_seen   INTEGER,
    exited      INTEGER,
    PRIMARY KEY (node, pid, first_seen)
);

-- BPF buffer overruns: counted per probe and interval, never silent.
CREATE TABLE IF NOT EXISTS lost_events (
    node        TEXT    NOT NULL,
    probe       TEXT    NOT NULL,
    ts          INTEGER NOT NULL,
    interval_ns INTEGER NOT NULL,
    count       INTEGER NOT NULL
);

-- The agent's own cost.
CREATE TABLE IF NOT EXISTS agent_cost (
    node            TEXT    NOT NULL,
    ts              INTEGER NOT NULL,
    interval_ns     INTEGER NOT NULL,
    cpu_seconds     REAL    NOT NULL,      -- user+sys CPU the agent used in the interval
    probe_hits      INTEGER NOT NULL,      -- probe hits in the interval
    events_written  INTEGER NOT NULL,
    rss_bytes       INTEGER
);

-- Probes attached (what /health and `straggler status` report).
CREATE TABLE IF NOT EXISTS probes (
    node        TEXT NOT NULL,
    name        TEXT NOT NULL,             -- e.g. 'uprobe:cuLaunchKernel', 'tracepoint:sched:sched_switch'
    library     TEXT,                      -- path of the traced library, NULL for tracepoints
    attached_at INTEGER,                   -- ns monotonic
    PRIMARY KEY (node, name, library)
);
"""

# Views for the common questions (read-only convenience; users may write the SQL themselves).
VIEWS = """
CREATE VIEW IF NOT EXISTS calls AS
    SELECT * FROM events WHERE source IN ('cuda', 'driver', 'nccl');
CREATE VIEW IF NOT EXISTS offcpu AS
    SELECT * FROM events WHERE source = 'sched' AND op = 'offcpu';
CREATE VIEW IF NOT EXISTS block_io AS
    SELECT * FROM events WHERE source = 'block';
"""


class SchemaError(Exception):
    """The database's schema is one this version cannot read (newer, or not ours)."""


def create(conn: sqlite3.Connection, node: str = None) -> None:
    """Create (or complete) the schema in an open read-write connection."""
    conn.executescript(DDL + VIEWS)
    cur = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
    row = cur.fetchone()
    if row is None:
        conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    elif str(row[0]).isdigit() and int(row[0]) < SCHEMA_VERSION:
        # every change so far only added tables (created above): the store is now this version
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    if node is not None:
        conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('node', ?)", (node,))
    conn.commit()


def version_of(conn: sqlite3.Connection):
    """The schema version recorded in a database, or None if it has no straggler schema."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError:
        return None
    return int(row[0]) if row else None


def check_version(conn: sqlite3.Connection, path: str = "database") -> int:
    """Raise SchemaError unless the database has a schema this version can read."""
    version = version_of(conn)
    if version is None:
        raise SchemaError(f"{path}: not a straggler database (no schema_version in table meta)")
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: schema version {version} is newer than this straggler understands "
            f"({SCHEMA_VERSION}); upgrade straggler")
    return version
