"""Synthetic node databases for tests and benchmarks: a synchronous training job on N nodes,
one database per node as the agent would write it (WAL, schema from store/schema.py).

Scenarios (shapes measured on a 2-core test VM):
- `clean`: every rank steps at ~20 ms; run-queue wait summed over the trainer's four threads is
  ~30 % of wall time on every node (many threads, few cores), nothing else.
- `io_cpu`: from `interference_start` on, one node's trainer shares its core with a checkpoint
  writer (`ckpt-writer`): its threads are preempted by the writer (offcpu state 'preempted',
  other_comm 'ckpt-writer', plus run-queue wait), so its cuLaunchKernel/cuMemAlloc get slow and
  its trainer run-queue share rises to ~70 %; the writer issues 1 MiB block writes. Every other
  rank waits for it: long, blocked ncclAllReduce, run-queue share flat or lower (~20 %). The
  step time grows to 36 ms everywhere (synchronous job).
- `cpu_hog`: the same, but the thief is a pure CPU hog (`cpu-hog`) that does no I/O.

Rows are made by SQL (a per-step template joined with the step numbers, deterministic hash
jitter), so 10M events take tens of seconds, not minutes. `write_nodes` makes one file per node
(for merge), `write_cluster` merges them into one cluster database with the real merge.

This module writes only the files it is asked to create; it must not be imported by the agent.
"""
import argparse
import json
import os
import sqlite3
import tempfile
from dataclasses import dataclass, field

from straggler.store import schema

SCENARIOS = ("clean", "io_cpu", "cpu_hog")

TRAINER_PID = 4242        # the same pid on every node, on purpose: joins must key on node too
WRITER_PID = 5151
HOG_PID = 6161
JBD2_PID = 150
REFERENCE_T0_NS = 1_767_225_600_000_000_000   # 2026-01-01T00:00:00Z: the fleet timeline's start
US = 1000

# Thread layout of the trainer process: (tid offset, comm).
MAIN, COMM_THREAD, AUTOGRAD, HELPER = (0, "pt_main_thread"), (1, "pt_gloo"), (2, "pt_autograd_0"), (3, "python")


@dataclass
class SynthSpec:
    nodes: int = 4
    events: int = 50_000               # approximate total over all nodes
    scenario: str = "io_cpu"
    straggler: int = 2                 # index of the straggling node (0-based)
    interference_start: float = 0.4    # fraction of the steps before the writer/hog starts
    prefix: str = "gpu-node-"
    seed: int = 1
    missing: tuple = ()                # node indices whose database is not written (world_size still counts them)
    offsets_ns: dict = field(default_factory=dict)   # node index -> realtime clock error (node minus reference)
    drift_ppm: dict = field(default_factory=dict)    # node index -> realtime rate error of the node's clock
    clock_pair_every_s: float = 5.0
    record_all: bool = False           # like the agent's default: a call gets an events row only when it was
                                       # slow, went off CPU, or falls in the 1-in-100 sample (aggregates count all)

    def node_name(self, index):
        return f"{self.prefix}{index + 1:02d}"

    def straggler_name(self):
        return None if self.scenario == "clean" else self.node_name(self.straggler)

    def offset_of(self, index):
        return int(self.offsets_ns.get(index, (index * 7_300_000) - 9_000_000))  # a few ms each, by default

    def boot_of(self, index):
        # realtime minus monotonic at boot: nodes booted at different times
        return REFERENCE_T0_NS - (3600 + 977 * index) * 1_000_000_000


class _Template:
    """Rows of one step of one node, in µs relative to the step start."""

    def __init__(self):
        self.rows = []
        self.next_group = 1

    def group(self):
        self.next_group += 1
        return self.next_group

    def add(self, kind, thread, source, op, off_us, dur_us, jit_us=0, *, p=1000, grp=0, neg=0,
            state=None, other=None, bytes_=None, dev=None):
        other_pid, other_comm = other if other else (None, None)
        self.rows.append(dict(kind=kind, tid_off=thread[0], comm=thread[1], source=source, op=op,
                              off_ns=int(off_us * US), dur_ns=int(dur_us * US), jit_ns=max(1, int(jit_us * US)),
                              p=p, grp=grp, neg=neg, state=state, other_pid=other_pid, other_comm=other_comm,
                              bytes=bytes_, dev=dev))

    def call(self, thread, source, op, off_us, dur_us, jit_us, **kw):
        self.add("trainer", thread, source, op, off_us, dur_us, jit_us, **kw)

    def runq(self, thread, off_us, dur_us, jit_us, *, preempted_by=None, p=1000, grp=0):
        """Run-queue wait; with preempted_by, the matching offcpu 'preempted' interval too."""
        grp = grp or self.group()   # runq and its offcpu share the jitter, so they cover the same time
        self.add("trainer", thread, "sched", "runq", off_us, dur_us, jit_us, p=p, grp=grp)
        if preempted_by:
            self.add("trainer", thread, "sched", "offcpu", off_us, dur_us, jit_us, p=p, grp=grp,
                     state="preempted", other=preempted_by)

    def blocked(self, thread, off_us, dur_us, jit_us=0):
        self.add("trainer", thread, "sched", "offcpu", off_us, dur_us, jit_us, state="blocked", other=(0, "swapper/0"))

    def slowable_call(self, thread, source, op, off_us, dur_us, jit_us, p, extra_us, extra_jit_us, thief):
        """A call that, with probability p/1000, is preempted by `thief` for extra_us(+jitter)."""
        grp = self.group()
        self.call(thread, source, op, off_us, dur_us, jit_us, p=p, grp=grp, neg=1)
        self.call(thread, source, op, off_us, dur_us + extra_us, extra_jit_us, p=p, grp=grp)
        self.runq(thread, off_us + 10, extra_us, extra_jit_us, preempted_by=thief, p=p, grp=grp)


def _healthy_step(t, period_us):
    """A rank that computes normally; `period_us` longer than 20 ms means it waits in the all-reduce."""
    wait = period_us - 20000
    sibling = (TRAINER_PID, AUTOGRAD[1])
    t.call(MAIN, "driver", "cuMemAlloc", 0, 150, 100)
    for k in range(6):
        t.call(MAIN, "driver", "cuLaunchKernel", 400 + k * 900, 40, 30)
    t.runq(MAIN, 5200, 400, 500, preempted_by=sibling)
    t.call(MAIN, "cuda", "cudaMemcpyAsync", 6000, 30, 20)
    t.call(MAIN, "cuda", "cudaStreamSynchronize", 6500, 6000, 400)
    t.blocked(MAIN, 6520, 5000)
    t.runq(MAIN, 11520, 300, 400)
    t.call(MAIN, "nccl", "ncclAllReduce", 13000, 4500 + wait, 1500)
    t.blocked(MAIN, 13020, 3800 + wait)
    t.runq(MAIN, 16820 + wait, 300, 300)
    t.blocked(COMM_THREAD, 0, 12900 + wait)
    t.runq(COMM_THREAD, 12950 + wait, 1200, 800)
    t.blocked(COMM_THREAD, 15000 + wait, 3000)
    t.runq(COMM_THREAD, 18100 + wait, 700, 600)
    t.runq(AUTOGRAD, 3000, 900, 600)
    t.runq(AUTOGRAD, 9000, 600, 400)
    t.runq(HELPER, 8000, 500, 300)


def _straggler_step(t, thieves):
    """36 ms step of the rank whose core is shared with `thieves` (the threads of one process, as
    sched_switch names them: each its own tid): preempted while launching."""
    t.slowable_call(MAIN, "driver", "cuMemAlloc", 0, 150, 100, 600, 3000, 5000, thieves[0])
    for k in range(6):
        t.slowable_call(MAIN, "driver", "cuLaunchKernel", 8500 + k * 3500, 40, 30, 400, 1000, 2400,
                        thieves[(k + 1) % len(thieves)])
    t.call(MAIN, "cuda", "cudaMemcpyAsync", 29600, 30, 20)
    t.call(MAIN, "cuda", "cudaStreamSynchronize", 29700, 3000, 500)
    t.blocked(MAIN, 29720, 2500)
    t.runq(MAIN, 32230, 200, 200)
    t.call(MAIN, "nccl", "ncclAllReduce", 33300, 400, 300)     # it arrives last: no wait
    t.runq(COMM_THREAD, 0, 6000, 4000, preempted_by=thieves[0])      # its gloo thread is hit hardest
    t.runq(COMM_THREAD, 20000, 5000, 2000, preempted_by=thieves[-1])
    t.runq(AUTOGRAD, 3000, 900, 600)
    t.runq(AUTOGRAD, 9000, 600, 400)
    t.runq(HELPER, 8000, 500, 300)


def _writer_io(t):
    for off in (1000, 12000, 24000):
        t.add("writer", (1, "ckpt-writer"), "block", "block_write", off, 800, 3000, p=700,
              grp=t.group(), bytes_=1 << 20, dev="254:0")


def _background_io(t):
    t.add("jbd2", (0, "jbd2/vda1-8"), "block", "block_write", 17000, 200, 300, p=30, grp=t.group(),
          bytes_=4096, dev="254:0")


def templates(spec, index):
    """{phase: (period_ns, rows)} for node `index`: phase 0 before the interference, 1 during."""
    out = {}
    for phase in (0, 1):
        t = _Template()
        interfering = phase == 1 and spec.scenario != "clean"
        period_us = 36000 if interfering else 20000
        if interfering and index == spec.straggler:
            thieves = ([(WRITER_PID + 1 + i, "ckpt-writer") for i in range(3)] if spec.scenario == "io_cpu"
                       else [(HOG_PID, "cpu-hog")])       # the writer compresses in 3 threads; the hog has one
            _straggler_step(t, thieves)
            if spec.scenario == "io_cpu":
                _writer_io(t)
        else:
            _healthy_step(t, period_us)
        _background_io(t)
        out[phase] = (period_us * US, t.rows)
    return out


def _hash_sql(a, b, salt):
    """A deterministic 30-bit hash of two SQL integer expressions (SQLite has no random seed)."""
    return (f"((((({a}) * 2654435761 + ({b}) * 40503 + {salt}) & 4294967295) * 1597334677 >> 9) & 1073741823)")


def _expected_rows_per_step(rows, record_all=True):
    total = 0.0
    for r in rows:
        share = min(r["p"], 1000) / 1000.0 if not r["neg"] else (1000 - r["p"]) / 1000.0
        if not record_all and r["source"] in ("cuda", "driver", "nccl"):
            kept = (r["grp"] and not r["neg"] and r["p"] < 1000) or "Synchronize" in r["op"] \
                or (r["op"] == "ncclAllReduce" and r["dur_ns"] > 1_000_000)
            share *= 1.0 if kept else 0.01
        total += share
    return total


def plan_steps(spec):
    per_step = 0.0
    for i in range(spec.nodes):
        if i in spec.missing:
            continue
        tm = templates(spec, i)
        per_step += (spec.interference_start * _expected_rows_per_step(tm[0][1], spec.record_all)
                     + (1 - spec.interference_start) * _expected_rows_per_step(tm[1][1], spec.record_all))
    return max(10, int(spec.events / max(per_step, 1.0)))


def _node_row(spec, index):
    return dict(idx=index, name=spec.node_name(index), rank=index, offset=spec.offset_of(index),
                boot=spec.boot_of(index), ppm=float(spec.drift_ppm.get(index, 0.0)),
                m0=(3600 + 977 * index) * 1_000_000_000 + 5_000_000_000)   # pivot of the drift: 5 s into the trace


def mono_of_reference(node, ref_ns):
    """The node's CLOCK_MONOTONIC at reference time ref_ns (inverse of `real_of_mono`)."""
    real = ref_ns + node["offset"]
    return node["m0"] + int(round((real - node["boot"] - node["m0"]) / (1.0 + node["ppm"] * 1e-6)))


def real_of_mono(node, mono_ns):
    return node["boot"] + mono_ns + int(round((mono_ns - node["m0"]) * node["ppm"] * 1e-6))


def _fill_node(conn, spec, index, steps):
    node = _node_row(spec, index)
    tm = templates(spec, index)
    boundary = int(steps * spec.interference_start) if spec.scenario != "clean" else steps
    (p0, rows0), (p1, rows1) = tm[0], tm[1]
    nslots = max(len(rows0), len(rows1))
    conn.execute("CREATE TEMP TABLE _tmpl (phase, slot, kind, tid_off, comm, source, op, off_ns, dur_ns, jit_ns, "
                 "p, grp, neg, state, other_pid, other_comm, bytes, dev)")
    for phase, rows in ((0, rows0), (1, rows1)):
        conn.executemany(
            "INSERT INTO _tmpl VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(phase, slot, r["kind"], r["tid_off"], r["comm"], r["source"], r["op"], r["off_ns"], r["dur_ns"],
              r["jit_ns"], r["p"], r["grp"], r["neg"], r["state"], r["other_pid"], r["other_comm"], r["bytes"],
              r["dev"]) for slot, r in enumerate(rows)])
    # step s starts at reference time t_ref(s); on this node's monotonic clock at mono(t_ref(s))
    t_ref = f"({REFERENCE_T0_NS} + CASE WHEN s < {boundary} THEN s * {p0} ELSE {boundary} * {p0} + (s - {boundary}) * {p1} END)"
    mono = (f"({node['m0']} + CAST(ROUND(({t_ref} + {node['offset']} - {node['boot']} - {node['m0']}) "
            f"/ (1.0 + {node['ppm']} * 1e-6)) AS INTEGER))")
    key = "CASE WHEN t.grp = 0 THEN t.slot + 100000 ELSE t.grp END"
    act = _hash_sql("st.s", key, spec.seed * 7 + index) + " % 1000"
    jit = _hash_sql("st.s", key, spec.seed * 13 + index * 3 + 1)
    pid = f"CASE t.kind WHEN 'trainer' THEN {TRAINER_PID} WHEN 'writer' THEN {WRITER_PID} ELSE {JBD2_PID} END"
    conn.execute(f"""
        INSERT INTO events (seq, node, rank, local_rank, source, op, pid, tid, comm, ts, duration, ret, bytes,
                            grid_x, grid_y, grid_z, block_x, block_y, block_z, state, other_pid, other_comm, cpu,
                            dev, sector, detail)
        WITH RECURSIVE steps(s) AS (SELECT 0 UNION ALL SELECT s + 1 FROM steps WHERE s < {steps - 1}),
        st AS (SELECT s, CASE WHEN s < {boundary} THEN 0 ELSE 1 END AS phase, {mono} AS t0 FROM steps)
        SELECT st.s * {nslots} + t.slot, '{node['name']}',
               CASE WHEN t.kind = 'trainer' THEN {node['rank']} END,
               CASE WHEN t.kind = 'trainer' THEN 0 END,
               t.source, t.op, {pid}, {pid} + t.tid_off, t.comm,
               st.t0 + t.off_ns, t.dur_ns + ({jit}) % t.jit_ns,
               CASE WHEN t.source IN ('cuda', 'driver', 'nccl') THEN 0 END,
               CASE WHEN t.op = 'cuMemAlloc' THEN 1 << 22 WHEN t.op = 'cudaMemcpyAsync' THEN 1 << 20 ELSE t.bytes END,
               CASE WHEN t.op = 'cuLaunchKernel' THEN 256 END, CASE WHEN t.op = 'cuLaunchKernel' THEN 1 END,
               CASE WHEN t.op = 'cuLaunchKernel' THEN 1 END, CASE WHEN t.op = 'cuLaunchKernel' THEN 128 END,
               CASE WHEN t.op = 'cuLaunchKernel' THEN 1 END, CASE WHEN t.op = 'cuLaunchKernel' THEN 1 END,
               t.state, t.other_pid, t.other_comm, {0 if index == spec.straggler else 1},
               t.dev, CASE WHEN t.source = 'block' THEN ({jit}) * 2048 END,
               CASE WHEN t.source IN ('cuda', 'driver', 'nccl') THEN
                    CASE WHEN t.grp != 0 AND t.neg = 0 AND t.p < 1000 THEN '{{"why": ["slow", "offcpu"]}}'
                         WHEN t.op LIKE '%Synchronize%' OR (t.op = 'ncclAllReduce' AND t.dur_ns > 1000000)
                              THEN '{{"why": ["offcpu"]}}'
                         WHEN ({act}) % 100 = 0 THEN '{{"why": ["sample"]}}' END END
        FROM st JOIN _tmpl t ON t.phase = st.phase
        WHERE t.p >= 1000 OR ((({act}) < t.p) = (t.neg = 0))
    """)
    conn.execute("DROP TABLE _tmpl")
    first_mono = mono_of_reference(node, REFERENCE_T0_NS)
    last_ref = REFERENCE_T0_NS + boundary * p0 + (steps - boundary) * p1
    last_mono = mono_of_reference(node, last_ref)
    return node, first_mono, last_mono, boundary


def _fill_side_tables(conn, spec, node, first_mono, last_mono):
    name, index = node["name"], node["idx"]
    every = int(spec.clock_pair_every_s * 1e9)
    pairs, m = [], first_mono - 1_000_000_000
    while m <= last_mono + every:
        pairs.append((name, m, real_of_mono(node, m)))
        m += every
    conn.executemany("INSERT INTO clock_pairs (node, mono_ns, real_ns) VALUES (?,?,?)", pairs)
    procs = [(name, TRAINER_PID, 4000, "python", "python train.py --epochs 1", index, 0, spec.nodes,
              "10.213.1.11", 29500, first_mono - 2_000_000_000, None, None),
             (name, JBD2_PID, 2, "jbd2/vda1-8", "", None, None, None, None, None, first_mono, None, None)]
    if index == spec.straggler and spec.scenario == "io_cpu":
        procs.append((name, WRITER_PID, 4000, "ckpt-writer", "python ckpt_writer.py --threads 3", None, None,
                      None, None, None, first_mono, None, None))
    if index == spec.straggler and spec.scenario == "cpu_hog":
        procs.append((name, HOG_PID, 1, "cpu-hog", "cpu-hog --threads 1", None, None, None, None, None,
                      first_mono, None, None))
    conn.executemany("INSERT INTO processes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", procs)
    probes = ["tracepoint:sched:sched_switch", "tracepoint:sched:sched_wakeup", "tracepoint:block:block_rq_issue",
              "tracepoint:block:block_rq_complete"]
    conn.executemany("INSERT INTO probes VALUES (?,?,?,?)", [(name, p, None, first_mono - 10**9) for p in probes])
    conn.executemany("INSERT INTO probes VALUES (?,?,?,?)",
                     [(name, f"uprobe:{fn}", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", first_mono - 10**9)
                      for fn in ("cuLaunchKernel", "cuMemAlloc")])
    cost, t = [], first_mono
    while t < last_mono:
        cost.append((name, t, 10**10, 0.04, 2500, 2400, 48 << 20))
        t += 10**10
    conn.executemany("INSERT INTO agent_cost VALUES (?,?,?,?,?,?,?)", cost)
    # per-second aggregates of every call, with log2 histograms
    buckets = conn.execute("""
        SELECT ts / 1000000000 * 1000000000, pid, rank, source, op, CAST(log2(MAX(duration, 1)) AS INTEGER) AS b,
               COUNT(*), SUM(duration), MAX(duration)
        FROM events WHERE node = ? AND source IN ('cuda', 'driver', 'nccl')
        GROUP BY 1, 2, 3, 4, 5, 6""", (name,)).fetchall()
    agg = {}
    for t0, pid, rank, source, op, b, n, s, mx in buckets:
        a = agg.setdefault((t0, pid, rank, source, op), [0, 0, 0, [0] * 40])
        a[0] += n
        a[1] += s
        a[2] = max(a[2], mx)
        a[3][min(b, 39)] += n
    conn.executemany("INSERT INTO aggregates VALUES (?,?,?,?,?,?,?,?,?,?,?)", [
        (name, k[0], 10**9, k[1], k[2], k[3], k[4], v[0], v[1], v[2], json.dumps(v[3][:max(i for i, c in enumerate(v[3]) if c) + 1]))
        for k, v in agg.items()])
    for key, value in (("agent_version", "0.1.0-synth"), ("hostname", name), ("synthetic", "1"),
                       ("scenario", spec.scenario)):
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


EVENT_INDEXES = ("events_source_op_ts", "events_pid_ts", "events_ts")
INTERVAL_NS = 1_000_000_000


def _expected(r):
    """Expected share of steps in which a template row happens, and its mean duration (ns)."""
    share = min(r["p"], 1000) / 1000.0 if not r["neg"] else (1000 - r["p"]) / 1000.0
    return share, r["dur_ns"] + r["jit_ns"] / 2.0


def thread_time_per_step(rows):
    """{(kind, tid_off, comm): thread_time columns per step} from a step template, as the agent would
    sum them: call time by class (outermost calls), run-queue wait (by the class of the call it
    happened in, and by who held the CPU), blocked time outside calls."""
    from straggler.probes.symbols import OP_CLASS
    out = {}
    calls_of = {}
    for r in rows:
        if r["source"] in ("cuda", "driver", "nccl"):
            calls_of.setdefault((r["kind"], r["tid_off"]), []).append(r)
    preemptor = {r["grp"]: (r["other_pid"], r["other_comm"]) for r in rows
                 if r["op"] == "offcpu" and r["state"] == "preempted" and r["grp"]}

    def in_call(r):
        for c in calls_of.get((r["kind"], r["tid_off"]), []):
            if c["neg"]:
                continue
            if c["off_ns"] <= r["off_ns"] < c["off_ns"] + c["dur_ns"] + c["jit_ns"]:
                return OP_CLASS[c["op"]]
        return None

    for r in rows:
        key = (r["kind"], r["tid_off"], r["comm"])
        t = out.setdefault(key, dict(calls=0.0, work_ns=0.0, sync_ns=0.0, coll_ns=0.0, runq_ns=0.0, runq_work_ns=0.0,
                                     runq_sync_ns=0.0, runq_coll_ns=0.0, blocked_ns=0.0, io_ns=0.0, thieves={}))
        share, dur = _expected(r)
        if r["source"] in ("cuda", "driver", "nccl"):
            cls = {"work": "work_ns", "sync": "sync_ns", "collective": "coll_ns"}[OP_CLASS[r["op"]]]
            t["calls"] += share
            t[cls] += share * dur
        elif r["op"] == "runq":
            cls = in_call(r)
            t["runq_ns"] += share * dur
            if cls:
                t[{"work": "runq_work_ns", "sync": "runq_sync_ns", "collective": "runq_coll_ns"}[cls]] += share * dur
            pid, comm = preemptor.get(r["grp"], (None, None)) if r["grp"] else (None, None)
            kind = "idle" if pid is None else "own" if pid == TRAINER_PID else "process"
            who = (kind, pid, comm)
            t["thieves"][who] = t["thieves"].get(who, 0.0) + share * dur
        elif r["op"] == "offcpu" and r["state"] == "blocked" and not in_call(r):
            t["blocked_ns"] += share * dur
    return out


def _fill_thread_time(conn, spec, index, node, boundary, steps, first_mono):
    """thread_time rows per second, as the agent writes them, from the step templates (expected values)."""
    tm = templates(spec, index)
    (p0, rows0), (p1, rows1) = tm[0], tm[1]
    per_step = {0: thread_time_per_step(rows0), 1: thread_time_per_step(rows1)}
    t_boundary = first_mono + boundary * p0
    t_end = t_boundary + (steps - boundary) * p1
    out = []
    t = first_mono // INTERVAL_NS * INTERVAL_NS
    while t < t_end:
        phase = 0 if t + INTERVAL_NS // 2 < t_boundary else 1
        period = p0 if phase == 0 else p1
        lo, hi = max(t, first_mono), min(t + INTERVAL_NS, t_end)
        n = max(0.0, (hi - lo) / period)
        for (kind, tid_off, comm), v in per_step[phase].items():
            if kind != "trainer":
                continue
            thieves = sorted(((k, p, c, int(ns * n)) for (k, p, c), ns in v["thieves"].items()), key=lambda x: -x[3])
            out.append((node["name"], t, INTERVAL_NS, TRAINER_PID, TRAINER_PID + tid_off, node["rank"], comm,
                        int(v["calls"] * n), int(v["work_ns"] * n), int(v["sync_ns"] * n), int(v["coll_ns"] * n),
                        int(v["runq_ns"] * n), int(v["runq_work_ns"] * n), int(v["runq_sync_ns"] * n),
                        int(v["runq_coll_ns"] * n), int(v["blocked_ns"] * n), int(v["io_ns"] * n),
                        json.dumps([list(x) for x in thieves]) if thieves else None))
        t += INTERVAL_NS
    conn.executemany("INSERT INTO thread_time (node, ts, interval_ns, pid, tid, rank, comm, calls, work_ns, sync_ns, "
                     "coll_ns, runq_ns, runq_work_ns, runq_sync_ns, runq_coll_ns, blocked_ns, io_ns, thieves) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", out)


def write_node(path, spec, index, steps=None):
    """Write node `index`'s database at `path` (replaced if present); returns facts about it."""
    steps = steps or plan_steps(spec)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        schema.create(conn, node=spec.node_name(index))
        for name in EVENT_INDEXES:          # bulk load first, index after: several times faster
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        with conn:
            node, first_mono, last_mono, boundary = _fill_node(conn, spec, index, steps)
            _fill_side_tables(conn, spec, node, first_mono, last_mono)
            _fill_thread_time(conn, spec, index, node, boundary, steps, first_mono)
            if not spec.record_all:    # the aggregates counted every call; keep the rows the agent would
                conn.execute("DELETE FROM events WHERE source IN ('cuda', 'driver', 'nccl') AND detail IS NULL")
        schema.create(conn)                 # re-creates the indexes (IF NOT EXISTS)
        n_events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        conn.close()
    return dict(path=path, node=node["name"], events=n_events, steps=steps, boundary_step=boundary,
                offset_ns=node["offset"], first_mono=first_mono, last_mono=last_mono)


def write_nodes(out_dir, spec):
    """One database per node (skipping spec.missing) in out_dir; returns the truth about the run."""
    os.makedirs(out_dir, exist_ok=True)
    steps = plan_steps(spec)
    files = []
    for i in range(spec.nodes):
        if i in spec.missing:
            continue
        files.append(write_node(os.path.join(out_dir, f"{spec.node_name(i)}.db"), spec, i, steps))
    return truth(spec, files, steps)


def truth(spec, files, steps):
    return dict(scenario=spec.scenario, straggler=spec.straggler_name(), steps=steps,
                thief_comm={"io_cpu": "ckpt-writer", "cpu_hog": "cpu-hog"}.get(spec.scenario),
                thief_pid={"io_cpu": WRITER_PID, "cpu_hog": HOG_PID}.get(spec.scenario),
                nodes=[spec.node_name(i) for i in range(spec.nodes)],
                missing=[spec.node_name(i) for i in spec.missing],
                offsets={spec.node_name(i): (spec.offset_of(i), 50_000) for i in range(spec.nodes)},
                files=files, events=sum(f["events"] for f in files))


def write_cluster(path, spec, work_dir=None):
    """Per-node databases merged (with the true clock offsets) into one cluster database at path."""
    from straggler.analysis.merge import merge
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        facts = write_nodes(tmp, spec)
        summary = merge([f["path"] for f in facts["files"]], path, offsets=facts["offsets"])
    facts["files"] = []
    facts["merge"] = summary
    return facts


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m straggler_lab.synth",
                                 description="write synthetic straggler databases (per node, or merged)")
    ap.add_argument("--scenario", choices=SCENARIOS, default="io_cpu")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--straggler", type=int, default=2, help="index of the straggling node (0-based)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True, help="a .db file (merged cluster) or a directory (one file per node)")
    args = ap.parse_args(argv)
    spec = SynthSpec(nodes=args.nodes, events=args.events, scenario=args.scenario, straggler=args.straggler,
                     seed=args.seed)
    facts = write_cluster(args.output, spec) if args.output.endswith(".db") else write_nodes(args.output, spec)
    print(json.dumps({k: v for k, v in facts.items() if k != "files"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def shift_to_now(paths, ahead_s=60.0):
    """Shift synthetic stores' times onto this machine's CLOCK_MONOTONIC: each store's newest summary
    ends ahead_s seconds from one same moment, now (> 0: a job running now, as a live watch sees one;
    < 0: a job that ended -ahead_s seconds ago). Every store is placed from the clock read once: read
    again for each one, after the previous one's rows were rewritten (a large store takes a good part
    of a second), the nodes would land that much apart, their bins cut differently from run to run.
    The rows do not change otherwise. A test that serves synthetic stores to the watch must place them
    with this: their generated times are arbitrary, and this machine's clock may be anywhere (it
    counts from boot). `paths`: one store's path, or a list of the job's."""
    import time
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    now_ns = time.monotonic_ns()
    for path in paths:
        conn = sqlite3.connect(path)
        try:
            (end,) = conn.execute("SELECT MAX(ts + interval_ns) FROM thread_time").fetchone()
        finally:
            conn.close()
        _shift(path, now_ns + int(ahead_s * 1e9) - end)


def _shift(path, delta):
    conn = sqlite3.connect(path)
    try:
        for table, columns in (("thread_time", ("ts",)), ("events", ("ts",)), ("lost_events", ("ts",)),
                               ("agent_cost", ("ts",)), ("processes", ("first_seen", "last_seen")),
                               ("clock_pairs", ("mono_ns",))):
            conn.execute(f"UPDATE {table} SET " + ", ".join(f"{c} = {c} + {delta}" for c in columns))
        conn.commit()
    finally:
        conn.close()
