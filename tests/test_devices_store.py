"""The store's device tables (schema 3): gpus, gpu_samples, gpu_processes, gpu_errors. A version-2 store
(an agent before them) still opens and gets them; the writer writes them; retention cuts the sampled ones
by time like every other per-interval table. No BPF, no GPU."""
import re
import sqlite3

from straggler.store import schema
from straggler.store.writer import StoreWriter, open_store

INTERVAL = 1_000_000_000
DEVICE_TABLES = ("gpus", "gpu_samples", "gpu_processes", "gpu_errors")


def query(db, sql, params=()):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def version_2_store(path):
    """A store as schema 2 wrote it: today's tables less the device ones, schema_version 2, one row."""
    ddl = re.sub(r"CREATE TABLE IF NOT EXISTS gpu\w*\s*\(.*?\n\);\n", "", schema.DDL, flags=re.S)
    ddl = re.sub(r"CREATE INDEX IF NOT EXISTS gpu\w* ON [^;]*;\n", "", ddl)
    assert "EXISTS gpu" not in ddl and "TABLE IF NOT EXISTS thread_time" in ddl
    conn = sqlite3.connect(path)
    conn.executescript(ddl)
    conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '2'), ('node', 'old-node')")
    conn.execute("INSERT INTO thread_time(node, ts, interval_ns, pid, tid, calls) VALUES ('old-node', 5, 1, 7, 7, 3)")
    conn.commit()
    conn.close()


def sample_row(node, ts, gpu, sm_clock):
    row = dict.fromkeys(schema.GPU_SAMPLE_COLUMNS)
    row.update(node=node, ts=ts, gpu=gpu, sm_clock_mhz=sm_clock, sm_clock_max_mhz=1980,
               clock_events=0x40, clock_event_names="hw_thermal_slowdown")
    return tuple(row[c] for c in schema.GPU_SAMPLE_COLUMNS)


def test_the_schema_has_the_device_tables_with_node_and_time():
    conn = sqlite3.connect(":memory:")
    schema.create(conn)
    assert schema.SCHEMA_VERSION >= 3
    for table in DEVICE_TABLES:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        assert "node" in columns and "gpu" in columns, table
        assert "ts" in columns or "first_seen" in columns, table
    assert tuple(r[1] for r in conn.execute("PRAGMA table_info(gpu_samples)")) == schema.GPU_SAMPLE_COLUMNS


def test_a_version_2_store_opens_keeps_its_rows_and_gets_the_device_tables_and_rollups(tmp_path):
    db = str(tmp_path / "old.db")
    version_2_store(db)
    conn = open_store(db, "old-node")
    conn.close()
    tables = {r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert set(DEVICE_TABLES) | {"thread_rollup"} <= tables
    assert query(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(schema.SCHEMA_VERSION),)]
    assert query(db, "SELECT node, calls FROM thread_time") == [("old-node", 3)]


def test_the_writer_writes_the_device_tables(tmp_path):
    db = str(tmp_path / "s.db")
    writer = StoreWriter(db, "n1")
    writer.start()
    writer.submit("gpus", [("n1", 0, "GPU-a", "Stand-in", "0000:c1:00.0", 0, 10, 10)])
    writer.submit("gpus", [("n1", 0, "GPU-a", "Stand-in", "0000:c1:00.0", 0, 10, 99)])   # last_seen moves on
    writer.submit("gpu_samples", [sample_row("n1", 100, 0, 990)])
    writer.submit("gpu_processes", [("n1", 4242, 0, "GPU-a", 3, "nvml", 1 << 30, 50, 50)])
    writer.submit("gpu_processes", [("n1", 4242, 0, "GPU-a", 3, "nvml", 1 << 30, 50, 80)])
    writer.submit("gpu_errors", [("n1", 120, 0, "0000:c1:00", "GPU-a", 79, "GPU has fallen off the bus", 4242,
                                  "python", None, None, "user", 17, "NVRM: Xid (PCI:0000:c1:00): 79, ...")])
    assert writer.flush()
    writer.stop()
    assert query(db, "SELECT gpu, uuid, last_seen FROM gpus") == [(0, "GPU-a", 99)]
    assert query(db, "SELECT gpu, sm_clock_mhz, clock_event_names FROM gpu_samples") == [(0, 990, "hw_thermal_slowdown")]
    assert query(db, "SELECT pid, gpu, rank, how, first_seen, last_seen FROM gpu_processes") == [
        (4242, 0, 3, "nvml", 50, 80)]
    assert query(db, "SELECT gpu, xid, pid, origin FROM gpu_errors") == [(0, 79, 4242, "user")]


def test_retention_cuts_gpu_samples_and_errors_by_whole_intervals(tmp_path):
    db = str(tmp_path / "s.db")
    writer = StoreWriter(db, "n1", interval_ns=INTERVAL, max_age_ns=10 * INTERVAL)
    import time
    now = time.monotonic_ns()
    old, recent = now - 60 * INTERVAL, now - INTERVAL
    writer.start()
    writer.submit("gpu_samples", [sample_row("n1", old, 0, 1980), sample_row("n1", recent, 0, 1980)])
    writer.submit("gpu_errors", [("n1", ts, 0, "0000:c1:00", None, 79, None, None, None, None, None, "kernel", 1, "x")
                                 for ts in (old, recent)])
    # retention runs after a write with events in it (the agent always has some)
    writer.submit("aggregates", [("n1", old, INTERVAL, 1, None, "driver", "cuLaunchKernel", 1, 1, 1, None)])
    assert writer.flush()
    writer.stop()
    assert query(db, "SELECT ts FROM gpu_samples") == [(recent,)]
    assert query(db, "SELECT ts FROM gpu_errors") == [(recent,)]


# ---- straggler status: are the devices read, how many GPUs -----------------------------------------
def status_of(db, meta, xids=0):
    from straggler.cli.status import status_rows
    from straggler.store.status import collect_status
    conn = open_store(db, "n1")
    conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", list(meta.items()))
    conn.executemany("INSERT INTO gpu_errors(node, ts, pci_bus_id, xid, origin, message) VALUES ('n1', ?, "
                     "'0000:c1:00', 79, 'kernel', 'x')", [(i,) for i in range(xids)])
    conn.close()
    status = collect_status(db)
    return status["devices"], dict(status_rows(status))["GPUs"]


def test_status_says_how_many_gpus_are_read_and_the_xid_errors(tmp_path):
    devices, line = status_of(str(tmp_path / "s.db"), {"devices_state": "read", "devices_gpus": "4",
                                                       "devices_interval_ns": "1000000000", "devices_driver": "550.54",
                                                       "xid_state": "read"}, xids=2)
    assert (devices["read"], devices["gpus"], devices["xid_read"], devices["xid_errors"]) == (True, 4, True, 2)
    assert line == "4 read through NVML every 1 s (driver 550.54); Xid errors from the kernel log: 2"


def test_status_says_why_no_gpu_is_read(tmp_path):
    why = "the nvidia-ml-py package (pynvml) is not installed: pip install nvidia-ml-py"
    devices, line = status_of(str(tmp_path / "s.db"), {"devices_state": "not read", "devices_reason": why,
                                                       "xid_state": "read"})
    assert devices["read"] is False and line == f"not read: {why}"
    _, old = status_of(str(tmp_path / "old.db"), {})       # an agent before the devices: nothing claimed
    assert old == "-"
