"""Synthetic step-time series: a synchronous job's per-thread summaries (thread_time, as the agent
writes them every interval) for N nodes x R ranks, with faults on a schedule — late, intermittent,
from the first step, on one rank of a node or on the whole node — written into one cluster database
(already merged: nodes' clocks aligned) or one store per node. Each node's CLOCK_MONOTONIC is its own
(boot_s), its realtime clock may be off (realtime_error_s, taken out by the merge's offset) or its clock
pairs missing (no_clock_pairs), as on machines of a real cluster. For explain's tests of episodes in
time and for the benchmark over a day of a large job; the lab's, never the product's.

The physics: every step the job waits for its slowest rank. A faulty rank's own work per step grows by
its fault (in the component of its kind: run queue for a CPU hog, host compute, synchronize for a
slow GPU, its own I/O); the others wait (blocked in the collective, or in synchronize with
collectives that only enqueue) until it arrives. Values are per interval, with a little noise.
"""
import json
import os
import random
import sqlite3
from dataclasses import dataclass, field

from straggler.store import rollup, schema

from .synth import REFERENCE_T0_NS

TRAINER_PID = 4000
HOG_PID = 9100
BOOT_S = 7200          # each node's CLOCK_MONOTONIC at the trace start, plus 977 s per node index
KIND_COMPONENT = {"cpu": "runq", "host": "host", "gpu": "sync", "io": "io"}


@dataclass
class Fault:
    node: int                        # node index (0-based)
    start_s: float                   # from the trace start
    end_s: float
    kind: str = "cpu"                # cpu | host | gpu | io
    slow: float = 1.6                # the faulty rank's own work per step takes this many times its normal time
    ranks: tuple = None              # local ranks on that node (None: all of them)
    on_s: float = None               # intermittent: on for on_s, off for off_s, from start_s
    off_s: float = None
    thief: str = "hog"               # cpu: who takes the CPU — "hog" (a process of its own) or "sibling" (another
                                     # rank of the job on the same node)
    device: str = None               # what the faulty ranks' GPUs say meanwhile (SeriesSpec.gpus): "throttle"
                                     # (hw_thermal_slowdown, the SM clock / slow), "link" (PCIe gen 3 x8 of
                                     # 5 x16), "xid" (an Xid 79 at the start), or None

    def active(self, t_s):
        if not (self.start_s <= t_s < self.end_s):
            return False
        if self.on_s is None:
            return True
        return (t_s - self.start_s) % (self.on_s + self.off_s) < self.on_s

    def on_share(self, t0_s, t1_s, step_s=0.05):
        """The share of [t0, t1) the fault is on (sampled every step_s)."""
        n = max(1, int(round((t1_s - t0_s) / step_s)))
        return sum(self.active(t0_s + (i + 0.5) * (t1_s - t0_s) / n) for i in range(n)) / n


@dataclass
class SeriesSpec:
    nodes: int = 4
    ranks_per_node: int = 1
    seconds: float = 600.0
    interval_s: float = 1.0
    step_ms: float = 20.0            # a clean step
    compute_share: float = 0.7       # of a clean step: the rank's own work (the rest it waits for its peers)
    style: str = "blocking"          # blocking: the wait is in the collective; enqueue: in synchronize
    faults: list = field(default_factory=list)
    noise: float = 0.02              # relative noise of each rank's components per interval
    helper_thread: bool = True       # a second thread per rank (a communication thread) with a little run queue
    gpus: bool = False               # also the agent's device tables: a GPU per rank (its local rank), sampled
                                     # every interval (gpus, gpu_samples, gpu_processes, gpu_errors)
    idle_gpus: int = 0               # ... and this many spare GPUs per node that no rank uses: idle, at their
                                     # lowest clock with NVML's gpu_idle event, as real idle GPUs are
    prefix: str = "gpu-node-"
    seed: int = 1
    boot_s: tuple = None             # each node's CLOCK_MONOTONIC at the trace start, s (default: BOOT_S plus 977 s per
                                     # node index): machines booted weeks apart have monotonic clocks far apart
    realtime_error_s: tuple = None   # each node's realtime clock ahead of the true time by this (its clock pairs say
                                     # so); the merge's measured offset (clock_offsets, method 'merge') takes it out
    no_clock_pairs: tuple = ()       # node indexes written without clock pairs (a store of an older agent)

    def node_name(self, index):
        return f"{self.prefix}{index + 1:02d}"


def _faults_of(spec, node, local):
    return [f for f in spec.faults if f.node == node and (f.ranks is None or local in f.ranks)]


def rows_of_interval(spec, rng, t_s, node, local, rank, slowest):
    """thread_time rows (dicts) of one rank's threads over [t_s, t_s + interval): `slowest` is the job's
    step time factor over the interval (the slowest rank's)."""
    iv = spec.interval_s
    mine = 1.0
    component_extra = {}
    thief = ["process", HOG_PID + node, "cpu-hog"]
    for f in _faults_of(spec, node, local):
        if f.kind == "cpu" and f.thief == "sibling":
            other = node * spec.ranks_per_node + (local + 1) % spec.ranks_per_node
            thief = ["process", TRAINER_PID + other, "python"]
        share = f.on_share(t_s, t_s + iv)
        if share > 0:
            extra = (f.slow - 1.0) * share
            mine += extra
            component_extra[KIND_COMPONENT[f.kind]] = component_extra.get(KIND_COMPONENT[f.kind], 0.0) + extra
    compute = spec.compute_share * spec.step_ms / 1000            # a rank's own clean work per step (s)
    comm = spec.step_ms / 1000 - compute                          # the collective's own time, every rank's
    step = compute * max(slowest, mine) + comm                    # the job waits for its slowest rank
    steps = iv / step
    wait = step - compute * mine                                  # it waits for the slowest (and the transfer)
    jitter = lambda x: max(0.0, x * (1 + rng.gauss(0, spec.noise)))  # noqa: E731
    per = dict(work=0.15 * compute, sync=0.35 * compute, host=0.5 * compute, runq=0.0, io=0.0)
    for comp, extra in component_extra.items():
        per[comp] = per.get(comp, 0.0) + extra * compute
    if spec.style == "blocking":
        coll, blocked, sync_wait = 0.6 * wait, 0.4 * wait, 0.0
    else:
        coll, blocked, sync_wait = 0.02 * wait, 0.0, 0.98 * wait
    ns = lambda s: int(jitter(s) * steps * 1e9)  # noqa: E731
    runq = ns(per["runq"])
    main = dict(tid=TRAINER_PID + 100 * rank, comm="pt_main_thread", calls=int(steps * 12),
                work_ns=ns(per["work"]), sync_ns=ns(per["sync"] + sync_wait), coll_ns=ns(coll),
                runq_ns=runq, runq_work_ns=runq // 2, runq_sync_ns=0, runq_coll_ns=0,
                blocked_ns=ns(blocked), io_ns=ns(per["io"]),
                thieves=json.dumps([thief + [runq]]) if runq else None)
    rows = [main]
    if spec.helper_thread:
        rows.append(dict(tid=TRAINER_PID + 100 * rank + 1, comm="pt_nccl_comm", calls=0, work_ns=0, sync_ns=0,
                         coll_ns=0, runq_ns=int(jitter(0.002) * iv * 1e9), runq_work_ns=0, runq_sync_ns=0,
                         runq_coll_ns=0, blocked_ns=int(0.9 * iv * 1e9), io_ns=0, thieves=None))
    return rows


COLUMNS = ("node", "ts", "interval_ns", "pid", "tid", "rank", "comm", "calls", "work_ns", "sync_ns", "coll_ns",
           "runq_ns", "runq_work_ns", "runq_sync_ns", "runq_coll_ns", "blocked_ns", "io_ns", "thieves")


def _boot_mono_ns(index):
    return (BOOT_S + 977 * index) * 1_000_000_000


def _mono0(spec, index):
    """Node `index`'s CLOCK_MONOTONIC at the trace start (ns)."""
    if spec.boot_s is not None:
        return int(spec.boot_s[index] * 1e9)
    return _boot_mono_ns(index)


def _realtime_error_ns(spec, index):
    return int(spec.realtime_error_s[index] * 1e9) if spec.realtime_error_s is not None else 0


def generate(spec):
    """Yield (node index, [thread_time row tuples]) per interval, in time order."""
    rng = random.Random(spec.seed)
    iv = spec.interval_s
    n_iv = int(spec.seconds / iv)
    world = spec.nodes * spec.ranks_per_node
    for i in range(n_iv):
        t_s = i * iv
        slowest = 1.0
        for f in spec.faults:
            share = f.on_share(t_s, t_s + iv)
            slowest = max(slowest, 1.0 + (f.slow - 1.0) * share)
        for node in range(spec.nodes):
            ts = _mono0(spec, node) + int(t_s * 1e9)
            out = []
            for local in range(spec.ranks_per_node):
                rank = node * spec.ranks_per_node + local
                pid = TRAINER_PID + rank
                for r in rows_of_interval(spec, rng, t_s, node, local, rank, slowest):
                    out.append((spec.node_name(node), ts, int(iv * 1e9), pid, r["tid"], rank, r["comm"], r["calls"],
                                r["work_ns"], r["sync_ns"], r["coll_ns"], r["runq_ns"], r["runq_work_ns"],
                                r["runq_sync_ns"], r["runq_coll_ns"], r["blocked_ns"], r["io_ns"], r["thieves"]))
            yield node, out
    del world


def _side_tables(conn, spec, nodes, merged=True):
    for node in nodes:
        name = spec.node_name(node)
        mono0 = _mono0(spec, node)
        real0 = REFERENCE_T0_NS + _realtime_error_ns(spec, node)
        pairs = [(name, mono0 + int(s * 1e9), real0 + int(s * 1e9)) for s in range(0, int(spec.seconds) + 1, 60)]
        if node not in spec.no_clock_pairs:
            conn.executemany("INSERT INTO clock_pairs(node, mono_ns, real_ns) VALUES (?, ?, ?)", pairs)
        if spec.realtime_error_s is not None and merged:
            conn.execute("INSERT INTO clock_offsets(node, offset_ns, uncertainty_ns, measured_at, method) "
                         "VALUES (?, ?, ?, ?, 'merge')", (name, _realtime_error_ns(spec, node), 100_000,
                                                          REFERENCE_T0_NS + int(spec.seconds * 1e9)))
        for local in range(spec.ranks_per_node):
            rank = node * spec.ranks_per_node + local
            conn.execute("INSERT OR REPLACE INTO processes(node, pid, ppid, comm, rank, local_rank, world_size, "
                         "first_seen, last_seen, exited) VALUES (?,?,?,?,?,?,?,?,?,?)",
                         (name, TRAINER_PID + rank, 1, "python", rank, local, spec.nodes * spec.ranks_per_node,
                          mono0, mono0 + int(spec.seconds * 1e9), None))


SM_MAX_MHZ = 1980
HW_THERMAL_SLOWDOWN = 0x40
GPU_IDLE = 0x1                   # NVML's gpu_idle clock event
IDLE_MHZ = 210                   # an idle GPU's SM clock


def _gpu_tables(conn, spec):
    """The device tables a GPU node's agent writes, for spec.gpus: each rank's GPU sampled every interval,
    saying what Fault.device says while its fault is on."""
    samples, errors = [], []
    for node in range(spec.nodes):
        name, mono0 = spec.node_name(node), _mono0(spec, node)
        for local in range(spec.ranks_per_node):
            rank = node * spec.ranks_per_node + local
            bus = f"0000:{0x18 + local:02x}:00"
            conn.execute("INSERT INTO gpus(node, gpu, uuid, name, pci_bus_id, minor, ts, last_seen) "
                         "VALUES (?,?,?,?,?,?,?,?)", (name, local, f"GPU-synth-{node:02d}-{local}", "Synthetic GPU",
                                                      f"{bus}.0", local, mono0, mono0 + int(spec.seconds * 1e9)))
            conn.execute("INSERT INTO gpu_processes(node, pid, gpu, uuid, rank, how, mem_used_bytes, first_seen, "
                         "last_seen) VALUES (?,?,?,?,?,?,?,?,?)", (name, TRAINER_PID + rank, local,
                                                                   f"GPU-synth-{node:02d}-{local}", rank, "nvml",
                                                                   2 << 30, mono0, mono0 + int(spec.seconds * 1e9)))
            mine = [f for f in _faults_of(spec, node, local) if f.device]
            for f in mine:
                if f.device == "xid":
                    errors.append((name, mono0 + int(f.start_s * 1e9), local, bus, f"GPU-synth-{node:02d}-{local}", 79,
                                   "GPU has fallen off the bus: it no longer answers on PCIe", None, None, "kernel",
                                   f"NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                                   f"the bus."))
            for i in range(int(spec.seconds / spec.interval_s)):
                t_s = i * spec.interval_s
                on = [f for f in mine if f.active(t_s)]
                throttle = any(f.device == "throttle" for f in on)
                link = any(f.device == "link" for f in on)
                clock = int(SM_MAX_MHZ / max((f.slow for f in on if f.device == "throttle"), default=1.0))
                samples.append((name, mono0 + int(t_s * 1e9), local, clock, SM_MAX_MHZ, 2619, 2619,
                                HW_THERMAL_SLOWDOWN if throttle else 0, "hw_thermal_slowdown" if throttle else "",
                                90 if throttle else 55, 400000, 700000, 97, 40, 30 << 30, 80 << 30,
                                3 if link else 5, 5, 8 if link else 16, 16))
        for spare in range(spec.ranks_per_node, spec.ranks_per_node + spec.idle_gpus):
            bus = f"0000:{0x18 + spare:02x}:00"
            conn.execute("INSERT INTO gpus(node, gpu, uuid, name, pci_bus_id, minor, ts, last_seen) "
                         "VALUES (?,?,?,?,?,?,?,?)", (name, spare, f"GPU-synth-{node:02d}-{spare}", "Synthetic GPU",
                                                      f"{bus}.0", spare, mono0, mono0 + int(spec.seconds * 1e9)))
            for i in range(int(spec.seconds / spec.interval_s)):
                samples.append((name, mono0 + int(i * spec.interval_s * 1e9), spare, IDLE_MHZ, SM_MAX_MHZ, 405, 2619,
                                GPU_IDLE, "gpu_idle", 35, 60000, 700000, 0, 0, 1 << 29, 80 << 30, 1, 5, 16, 16))
    conn.executemany("INSERT INTO gpu_samples(node, ts, gpu, sm_clock_mhz, sm_clock_max_mhz, mem_clock_mhz, "
                     "mem_clock_max_mhz, clock_events, clock_event_names, temperature_c, power_mw, power_limit_mw, "
                     "util_gpu_pct, util_mem_pct, mem_used_bytes, mem_total_bytes, pcie_gen, pcie_gen_max, pcie_width, "
                     "pcie_width_max) VALUES (" + ", ".join("?" * 20) + ")", samples)
    conn.executemany("INSERT INTO gpu_errors(node, ts, gpu, pci_bus_id, uuid, xid, meaning, pid, process, origin, "
                     "message) VALUES (?,?,?,?,?,?,?,?,?,?,?)", errors)


def write_cluster(path, spec, rollups=True):
    """One cluster database (every node, clocks already aligned: each node's pairs map its monotonic
    clock to the same timeline) at `path`, with its roll-ups as merge makes them (rollups=False: as
    a store older than them); returns its facts (nodes, the faults' true windows)."""
    if os.path.exists(path):
        os.unlink(path)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        schema.create(conn)
        conn.execute("DROP INDEX IF EXISTS thread_time_ts")
        placeholders = ", ".join("?" * len(COLUMNS))
        insert = f"INSERT INTO thread_time({', '.join(COLUMNS)}) VALUES ({placeholders})"
        batch = []
        with conn:
            for _node, rows in generate(spec):
                batch.extend(rows)
                if len(batch) >= 50_000:
                    conn.executemany(insert, batch)
                    batch.clear()
            if batch:
                conn.executemany(insert, batch)
            _side_tables(conn, spec, range(spec.nodes))
            if spec.gpus:
                _gpu_tables(conn, spec)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('synthetic', 'series')")
        schema.create(conn)       # the index again, after the bulk load
        if rollups:
            with conn:
                rollup.rebuild(conn)      # as merge does
    finally:
        conn.close()
    return facts(spec)


def facts(spec):
    return dict(nodes=[spec.node_name(i) for i in range(spec.nodes)],
                faults=[dict(node=spec.node_name(f.node), ranks=f.ranks, kind=f.kind,
                             start_ns=REFERENCE_T0_NS + int(f.start_s * 1e9), end_ns=REFERENCE_T0_NS + int(f.end_s * 1e9),
                             intermittent=f.on_s is not None) for f in spec.faults],
                t0_ns=REFERENCE_T0_NS)


def write_nodes(out_dir, spec):
    """One store per node in `out_dir` (NODE.db, as each node's agent writes it: its own clock pairs, no
    merge's offsets; no device tables), for explain live on the fleet; returns its facts, with "files"
    ([{"node", "path"}])."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {i: os.path.join(out_dir, f"{spec.node_name(i)}.db") for i in range(spec.nodes)}
    conns = {}
    try:
        for i, path in paths.items():
            if os.path.exists(path):
                os.unlink(path)
            conns[i] = sqlite3.connect(path)
            schema.create(conns[i], node=spec.node_name(i))
        insert = f"INSERT INTO thread_time({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        for node, rows in generate(spec):
            conns[node].executemany(insert, rows)
        for i, conn in conns.items():
            _side_tables(conn, spec, [i], merged=False)
            rollup.rebuild(conn)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('synthetic', 'series')")
            conn.commit()
    finally:
        for conn in conns.values():
            conn.close()
    return dict(facts(spec), files=[dict(node=spec.node_name(i), path=p) for i, p in paths.items()])

