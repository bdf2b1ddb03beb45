"""The store's schema: the contract that users, explain, merge and export write SQL against.

One SQLite file per node (WAL mode). A merged cluster database has the same tables, with
rows from many nodes and `events.ts_aligned` filled in. Times are nanoseconds; `ts` is the
node's CLOCK_MONOTONIC (what bpf_ktime_get_ns() returns); `ts_aligned` is nanoseconds since
the Unix epoch on the fleet's common timeline. Change this only together with the tests
that read it, and bump SCHEMA_VERSION.

This module must not import anything else from straggler.
"""
import sqlite3

SCHEMA_VERSION = 5   # 2: thread_time (the step-time model's per-thread summaries); 3: gpus, gpu_samples,
                     # gpu_processes, gpu_errors (the devices' own word: NVML and the kernel's Xid errors);
                     # 4: thread_rollup (thread_time per minute, with its spread: explain over long traces);
                     # 5: net_samples, rdma_samples, net_flows (the network: links, RDMA ports, TCP flows)

# thread_time's columns, which thread_rollup sums per minute (ts: a summary's or a minute's start, ns
# monotonic)
SUMMARY_COLUMNS = """    node         TEXT    NOT NULL,
    ts           INTEGER NOT NULL,         -- start, ns monotonic
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
"""

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
{summary_columns}    thieves      TEXT
);
CREATE INDEX IF NOT EXISTS thread_time_ts ON thread_time(ts);
-- one rank's summaries over a time (explain's windows: a few ranks' minutes out of hours of many ranks)
CREATE INDEX IF NOT EXISTS thread_time_node_pid_ts ON thread_time(node, pid, ts);

-- thread_time per thread per minute of the node's clock (ts: the minute's start, a multiple of
-- interval_ns), written by the agent as each minute closes and by merge for the whole trace
-- (straggler.store.rollup): explain reads a long trace here first and thread_time only where it
-- changes. The sums are thread_time's over the minute; the spread is over its 10-s parts:
--   summaries, summary_ns            how many summaries it sums, and their interval
--   first_ts, last_ts                the first one's start, the last one's end
--   wait_lo_*, wait_hi_*             the least and most share of a 10-s part the thread waited in
--                                    collectives and blocked (blocking) or also in synchronize (enqueue)
--   rate_lo                          the fewest calls per second of a 10-s part
CREATE TABLE IF NOT EXISTS thread_rollup (
{summary_columns}    summaries    INTEGER NOT NULL DEFAULT 0,
    summary_ns   INTEGER,
    first_ts     INTEGER,
    last_ts      INTEGER,
    wait_lo_blocking REAL,
    wait_hi_blocking REAL,
    wait_lo_enqueue  REAL,
    wait_hi_enqueue  REAL,
    rate_lo      REAL
);
-- each thread's minutes (explain's callers), each node's minutes (explain's coarse series), by time
-- (retention)
CREATE INDEX IF NOT EXISTS thread_rollup_thread ON thread_rollup(node, pid, tid, ts);
CREATE INDEX IF NOT EXISTS thread_rollup_node_ts ON thread_rollup(node, ts);
CREATE INDEX IF NOT EXISTS thread_rollup_ts ON thread_rollup(ts);

-- The GPUs NVIDIA's management library (NVML) shows on the node, one row per GPU (index and UUID).
-- Only written when the agent reads the devices (see meta devices_state); docs/devices.md.
CREATE TABLE IF NOT EXISTS gpus (
    node        TEXT    NOT NULL,
    gpu         INTEGER NOT NULL,          -- NVML index (nvidia-smi's), what the other gpu_* tables name
    uuid        TEXT    NOT NULL,          -- 'GPU-8b2f...': stable across reboots and index changes
    name        TEXT,                      -- product name, e.g. 'NVIDIA H100 80GB HBM3'
    pci_bus_id  TEXT,                      -- 'dddd:bb:dd.f', lower case (Xid lines name 'dddd:bb:dd')
    minor       INTEGER,                   -- the N of its device file /dev/nvidiaN
    ts          INTEGER NOT NULL,          -- first seen, ns monotonic
    last_seen   INTEGER,                   -- ns monotonic
    PRIMARY KEY (node, gpu, uuid)
);

-- One row per GPU per sampling interval (trace --gpu-interval, default 1 s). A value the device does
-- not report (NVML_ERROR_NOT_SUPPORTED) is NULL. Counters marked 'cumulative' count since the driver
-- loaded (or the GPU was reset): take differences between rows for a rate.
CREATE TABLE IF NOT EXISTS gpu_samples (
    node              TEXT    NOT NULL,
    ts                INTEGER NOT NULL,    -- when read, ns monotonic
    gpu               INTEGER NOT NULL,    -- NVML index (gpus.gpu)
    sm_clock_mhz      INTEGER,             -- SM clock now, MHz
    sm_clock_max_mhz  INTEGER,             -- its maximum, MHz
    mem_clock_mhz     INTEGER,             -- memory clock now, MHz
    mem_clock_max_mhz INTEGER,             -- its maximum, MHz
    clock_events      INTEGER,             -- why the clocks are held down: NVML's clock-event (throttle) bitmask
    clock_event_names TEXT,                -- the same, named: 'hw_thermal_slowdown,sw_power_cap' ('' when none)
    temperature_c     INTEGER,             -- GPU die, degrees C
    power_mw          INTEGER,             -- power draw, milliwatts
    power_limit_mw    INTEGER,             -- the enforced power limit, milliwatts
    util_gpu_pct      INTEGER,             -- % of NVML's last sample period a kernel ran
    util_mem_pct      INTEGER,             -- % of it device memory was read or written
    mem_used_bytes    INTEGER,             -- device memory in use, bytes
    mem_total_bytes   INTEGER,             -- device memory, bytes
    pcie_gen          INTEGER,             -- PCIe link generation now
    pcie_gen_max      INTEGER,             -- the most this GPU and slot can do
    pcie_width        INTEGER,             -- PCIe lanes now (x16 = 16)
    pcie_width_max    INTEGER,             -- the most lanes possible
    pcie_tx_kb_s      INTEGER,             -- PCIe transmit throughput, KB/s (NVML: over 20 ms)
    pcie_rx_kb_s      INTEGER,             -- PCIe receive throughput, KB/s
    nvlink_links      INTEGER,             -- NVLinks up (NULL: no NVLink)
    nvlink_replay_errors   INTEGER,        -- cumulative, summed over links: data-link transmit replays
    nvlink_recovery_errors INTEGER,        -- cumulative, summed over links: link recoveries
    nvlink_crc_errors      INTEGER,        -- cumulative, summed over links: receive CRC errors (flit + data)
    ecc_corrected     INTEGER,             -- cumulative (volatile): corrected ECC errors
    ecc_uncorrected   INTEGER,             -- cumulative (volatile): uncorrected ECC errors
    remapped_rows_corrected   INTEGER,     -- memory rows remapped for corrected errors
    remapped_rows_uncorrected INTEGER,     -- memory rows remapped for uncorrected errors
    remap_pending     INTEGER,             -- 1: a remap waits for the GPU's reset
    remap_failure     INTEGER,             -- 1: a remap failed (the GPU needs service)
    read_error        TEXT                 -- NVML's error for values it failed to read (e.g. 'GPU is lost'), else NULL
);
CREATE INDEX IF NOT EXISTS gpu_samples_ts ON gpu_samples(ts);
CREATE INDEX IF NOT EXISTS gpu_samples_node_gpu_ts ON gpu_samples(node, gpu, ts);

-- Which process uses which GPU: NVML's running compute processes ('nvml') and the /dev/nvidiaN
-- files a traced process holds open ('fd'). Join with processes on (node, pid) for its command line.
CREATE TABLE IF NOT EXISTS gpu_processes (
    node        TEXT    NOT NULL,
    pid         INTEGER NOT NULL,
    gpu         INTEGER NOT NULL,          -- NVML index ('fd' without NVML: the N of /dev/nvidiaN)
    uuid        TEXT,                      -- gpus.uuid, when NVML is read
    rank        INTEGER,                   -- torchrun RANK of the process, NULL if unknown
    how         TEXT    NOT NULL,          -- 'nvml' | 'fd'
    mem_used_bytes INTEGER,                -- 'nvml': device memory the process holds, bytes
    first_seen  INTEGER NOT NULL,          -- ns monotonic
    last_seen   INTEGER,                   -- ns monotonic
    PRIMARY KEY (node, pid, gpu, how, first_seen)
);

-- The NVIDIA driver's Xid errors, read from the kernel log (/dev/kmsg) from the agent's start on:
--   NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
CREATE TABLE IF NOT EXISTS gpu_errors (
    node        TEXT    NOT NULL,
    ts          INTEGER NOT NULL,          -- ns monotonic (the kernel log's time stamp, us since boot)
    gpu         INTEGER,                   -- NVML index of the GPU at that bus id, NULL if unknown
    pci_bus_id  TEXT    NOT NULL,          -- 'dddd:bb:dd' as the line gives it, lower case
    uuid        TEXT,                      -- gpus.uuid, or the driver's 'GPU at PCI:...' line
    xid         INTEGER NOT NULL,          -- the Xid code
    meaning     TEXT,                      -- what the code means (docs/devices.md), NULL for a rare code
    pid         INTEGER,                   -- the process the driver names (pid=), NULL when '<unknown>'
    process     TEXT,                      -- its name (name=)
    gpu_instance     INTEGER,              -- MIG: GPU-I, else NULL
    compute_instance INTEGER,              -- MIG: GPU-CI, else NULL
    origin      TEXT    NOT NULL,          -- 'kernel' (the driver) | 'user' (written to /dev/kmsg by a program)
    kmsg_seq    INTEGER,                   -- the kernel log's sequence number
    message     TEXT    NOT NULL           -- the line as logged
);
CREATE INDEX IF NOT EXISTS gpu_errors_ts ON gpu_errors(ts);
-- a GPU's last Xid (/metrics: DCGM_FI_DEV_XID_ERRORS) without reading the others'
CREATE INDEX IF NOT EXISTS gpu_errors_node_gpu_ts ON gpu_errors(node, gpu, ts);

-- The node's network interfaces (/sys/class/net/IFACE), one row per interface per sampling interval
-- (trace --net-interval, default 1 s). Counters marked 'cumulative' count since the interface came up
-- (or the driver loaded): take differences between rows for a rate. A value the interface does not
-- report (a virtual interface has no speed) is NULL.
CREATE TABLE IF NOT EXISTS net_samples (
    node             TEXT    NOT NULL,
    ts               INTEGER NOT NULL,     -- when read, ns monotonic
    iface            TEXT    NOT NULL,     -- interface name, e.g. 'ens1f0', 'ib0', 'eth0'
    operstate        TEXT,                 -- 'up', 'down', 'lowerlayerdown', 'dormant', 'unknown', ...
    carrier          INTEGER,              -- 1: the link is up (carrier), 0: down
    speed_mbps       INTEGER,              -- negotiated speed now, Mb/s
    speed_max_mbps   INTEGER,              -- the most the interface's link modes allow, Mb/s (ethtool), when known
    duplex           TEXT,                 -- 'full' | 'half'
    mtu              INTEGER,
    carrier_changes  INTEGER,              -- cumulative: link up and down transitions
    rx_bytes         INTEGER,              -- cumulative
    tx_bytes         INTEGER,              -- cumulative
    rx_packets       INTEGER,              -- cumulative
    tx_packets       INTEGER,              -- cumulative
    rx_errors        INTEGER,              -- cumulative: receive errors of any kind
    tx_errors        INTEGER,              -- cumulative
    rx_dropped       INTEGER,              -- cumulative: received, then dropped (no buffer, filtered)
    tx_dropped       INTEGER,              -- cumulative
    rx_crc_errors    INTEGER,              -- cumulative: frames with a bad checksum (a bad cable or optic)
    rx_missed_errors INTEGER,              -- cumulative: frames the NIC had no room for
    tx_carrier_errors INTEGER              -- cumulative: transmit failures for lost carrier
);
CREATE INDEX IF NOT EXISTS net_samples_ts ON net_samples(ts);
CREATE INDEX IF NOT EXISTS net_samples_node_iface_ts ON net_samples(node, iface, ts);

-- RDMA ports (/sys/class/infiniband/DEVICE/ports/PORT), sampled with the interfaces. The port's
-- traffic itself bypasses the kernel and is not traced: these counters are what the agent sees of it.
-- Counter names are the InfiniBand PortCounters' (as sysfs spells them); 'cumulative' as above.
CREATE TABLE IF NOT EXISTS rdma_samples (
    node                TEXT    NOT NULL,
    ts                  INTEGER NOT NULL,  -- when read, ns monotonic
    device              TEXT    NOT NULL,  -- e.g. 'mlx5_0'
    port                INTEGER NOT NULL,  -- port number, from 1
    netdev              TEXT,              -- the network interface on this port, when the driver says
    state               TEXT,              -- 'ACTIVE', 'DOWN', 'INIT', 'ARMED'
    phys_state          TEXT,              -- 'LinkUp', 'Polling', 'Disabled', ...
    rate_gbps           REAL,              -- the port's rate now, Gb/s
    link_layer          TEXT,              -- 'InfiniBand' | 'Ethernet' (RoCE)
    port_xmit_data      INTEGER,           -- cumulative, in 4-byte words (the InfiniBand unit)
    port_rcv_data       INTEGER,           -- cumulative, in 4-byte words
    port_xmit_packets   INTEGER,           -- cumulative
    port_rcv_packets    INTEGER,           -- cumulative
    port_xmit_wait      INTEGER,           -- cumulative: ticks the port had data to send and no credit (congestion)
    port_xmit_discards  INTEGER,           -- cumulative
    port_rcv_errors     INTEGER,           -- cumulative
    port_rcv_remote_physical_errors INTEGER, -- cumulative
    symbol_error        INTEGER,           -- cumulative: bad symbols on the wire (a bad cable or optic)
    link_error_recovery INTEGER,           -- cumulative: the link retrained
    link_downed         INTEGER,           -- cumulative: the link went down
    local_link_integrity_errors INTEGER,   -- cumulative
    excessive_buffer_overrun_errors INTEGER -- cumulative
);
CREATE INDEX IF NOT EXISTS rdma_samples_ts ON rdma_samples(ts);
CREATE INDEX IF NOT EXISTS rdma_samples_node_device_port_ts ON rdma_samples(node, device, port, ts);

-- The TCP traffic of the traced processes, per interval (trace --interval) and connection, from
-- tracepoints only (sock:sock_send_length, sock:sock_recv_length, tcp:tcp_probe,
-- tcp:tcp_retransmit_skb, sock:inet_sock_set_state). A connection with nothing in an interval has
-- no row for it.
CREATE TABLE IF NOT EXISTS net_flows (
    node          TEXT    NOT NULL,
    ts            INTEGER NOT NULL,        -- the interval's start, ns monotonic
    interval_ns   INTEGER NOT NULL,
    pid           INTEGER,                 -- the process that sent or received on it (tgid)
    rank          INTEGER,                 -- its torchrun RANK, NULL if unknown
    family        INTEGER,                 -- 4 | 6
    local_addr    TEXT,                    -- '10.0.0.11'
    local_port    INTEGER,
    peer_addr     TEXT,                    -- the other end, '10.0.0.12'
    peer_port     INTEGER,
    iface         TEXT,                    -- the interface the route to the peer leaves by, when known
    tx_bytes      INTEGER NOT NULL DEFAULT 0,  -- bytes the process handed to the socket
    rx_bytes      INTEGER NOT NULL DEFAULT 0,  -- bytes it read from it
    tx_calls      INTEGER NOT NULL DEFAULT 0,
    rx_calls      INTEGER NOT NULL DEFAULT 0,
    tx_ns         INTEGER NOT NULL DEFAULT 0,  -- time in the calls that sent data (entry to data moved), ns
    rx_ns         INTEGER NOT NULL DEFAULT 0,  -- time in the calls that received data: waiting for it included
    retransmits   INTEGER NOT NULL DEFAULT 0,  -- packets the kernel sent again (one may hold several segments)
    recoveries    INTEGER NOT NULL DEFAULT 0,  -- entries into CWR, Recovery or Loss: reactions to a loss or congestion
    rtt_samples   INTEGER NOT NULL DEFAULT 0,  -- tcp_probe readings in the interval
    srtt_us       INTEGER,                 -- smoothed round-trip time, mean over the readings, us
    srtt_max_us   INTEGER,                 -- its highest reading, us
    cwnd_min      INTEGER,                 -- the congestion window's lowest reading, segments
    opened        INTEGER NOT NULL DEFAULT 0,  -- the connection became ESTABLISHED
    closed        INTEGER NOT NULL DEFAULT 0,  -- it closed (or was reset)
    errors        INTEGER NOT NULL DEFAULT 0   -- send or receive calls that failed
);
CREATE INDEX IF NOT EXISTS net_flows_ts ON net_flows(ts);
CREATE INDEX IF NOT EXISTS net_flows_node_ts ON net_flows(node, ts);

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
""".replace("{summary_columns}", SUMMARY_COLUMNS)

# The columns of a gpu_samples row, in the order the agent's device sampler writes them.
GPU_SAMPLE_COLUMNS = (
    "node", "ts", "gpu", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz", "clock_events",
    "clock_event_names", "temperature_c", "power_mw", "power_limit_mw", "util_gpu_pct", "util_mem_pct",
    "mem_used_bytes", "mem_total_bytes", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "pcie_tx_kb_s",
    "pcie_rx_kb_s", "nvlink_links", "nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors",
    "ecc_corrected", "ecc_uncorrected", "remapped_rows_corrected", "remapped_rows_uncorrected", "remap_pending",
    "remap_failure", "read_error")

# The columns of a net_samples, rdma_samples and net_flows row, in the order the agent writes them.
NET_SAMPLE_COLUMNS = (
    "node", "ts", "iface", "operstate", "carrier", "speed_mbps", "speed_max_mbps", "duplex", "mtu", "carrier_changes",
    "rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped",
    "rx_crc_errors", "rx_missed_errors", "tx_carrier_errors")
RDMA_SAMPLE_COLUMNS = (
    "node", "ts", "device", "port", "netdev", "state", "phys_state", "rate_gbps", "link_layer", "port_xmit_data",
    "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait", "port_xmit_discards", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "symbol_error", "link_error_recovery", "link_downed",
    "local_link_integrity_errors", "excessive_buffer_overrun_errors")
NET_FLOW_COLUMNS = (
    "node", "ts", "interval_ns", "pid", "rank", "family", "local_addr", "local_port", "peer_addr", "peer_port", "iface",
    "tx_bytes", "rx_bytes", "tx_calls", "rx_calls", "tx_ns", "rx_ns", "retransmits", "recoveries", "rtt_samples",
    "srtt_us", "srtt_max_us", "cwnd_min", "opened", "closed", "errors")

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
