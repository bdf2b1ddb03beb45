"""`straggler explain`: name the straggler node of a synchronous training job, and say why.

Every number comes from an SQL query that GROUPs BY node, so the same SQL runs on a merged
cluster.db (one run) or on every node's own store through the fleet client (one run per node,
rows combined); each finding carries the SQL behind its numbers so a user can re-run it.
Values that depend on other nodes (thresholds, medians) are computed here and written into the
later SQL as literals.

1. Which node. Per node and op (cuda/driver/nccl): count, p50, p99, mean. A node is an outlier
   for an op when its mean is more than `k` robust deviations (MAD × 1.4826) above the median of
   the OTHER nodes and at least `min_ratio` times that median (MAD floored at `mad_floor` × the
   median, so identical healthy nodes don't make noise an outlier), and the time it lost over all its
   calls is at least `min_excess_share` of the node's traced span (a handful of slow calls on a busy
   machine is noise: the job loses only what the straggler loses). Only "work" ops count as
   evidence (launches, allocations, copies); slow sync/collective ops (ncclAllReduce,
   cu*Synchronize, *WaitEvent) mark a waiter: in a synchronous job the healthy ranks wait there,
   blocked, for the straggler. The decisive scheduler signal (measured on this machine, see
   /work/shared/notes/demo.md) is the trainer's run-queue wait summed over all its threads, as a
   share of wall time: compared with the other nodes AND with the node's own baseline (the first
   `baseline_fraction` of its trace), never with a fixed threshold (~30 % is normal with many
   threads on few cores). Context-switch counts are not used: they point the wrong way.
2. Why. Over the windows of the straggler's slow calls: off-CPU time split into preempted
   (runnable, CPU taken) vs blocked, who ran instead (other_comm/other_pid), run-queue wait, and
   block I/O in the same windows by issuing process; causes ranked by their share of the
   slowdown (call time above the other nodes' typical time).
3. Report: ranked findings (severity, node, cause, summary, numbers, SQL per number,
   recommendation), missing nodes and what they leave uncertain; a clean run has no straggler.

This module reads only (through store.query.run_query or the fleet client); it must not write
to any database.
"""
import html
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

from ..errors import StragglerError, UsageError

CALL_SOURCES = "('cuda', 'driver', 'nccl')"
# A sync/collective call: the place where a waiter waits. The same rule in SQL and Python.
def wait_op_sql(alias=""):
    return f"({alias}source = 'nccl' OR {alias}op LIKE '%Synchronize%' OR {alias}op LIKE '%WaitEvent%')"
WAITER_RISE = 1.15   # a node waits "longer than in its own baseline" when its wait share rose this much
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def is_wait_op(source, op):
    return source == "nccl" or "Synchronize" in op or "WaitEvent" in op


@dataclass
class ExplainOptions:
    k: float = 3.0                   # robust deviations (MAD x 1.4826) above the others' median
    min_ratio: float = 1.5           # ... and at least this many times the others' median
    mad_floor: float = 0.05          # the MAD is taken as at least this fraction of the median
    baseline_fraction: float = 0.25  # the first part of each node's trace is its own baseline
    min_rise: float = 1.2            # run-queue share must rise this much vs the node's baseline, relative to the others' rise
    min_calls: int = 20              # ops with fewer calls on a node are not compared
    min_excess_share: float = 0.01   # a slow work op must cost at least this share of the node's traced time
    timeout_s: float = 300.0         # per query

    @classmethod
    def from_kwargs(cls, **opts):
        known = {k: v for k, v in opts.items() if k in cls.__dataclass_fields__ and v is not None}
        unknown = set(opts) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"unknown explain option(s): {', '.join(sorted(unknown))}")
        return cls(**known)


@dataclass
class Finding:
    severity: str                    # critical | warning | info
    node: str                        # the node it is about (None for fleet-wide)
    cause: str                       # straggler | cpu-contention | io-wait | blocked | block-io | waiters | missing-nodes | data-loss | no-straggler
    summary: str
    numbers: dict = field(default_factory=dict)     # name -> value
    sql: dict = field(default_factory=dict)         # query name -> SQL text
    sources: dict = field(default_factory=dict)     # number name -> {"sql": query name, "match": {col: value}, "column": col}
    recommendation: str = ""
    share: float = 0.0                              # share of the slowdown it explains (ranking)

    def to_dict(self):
        return asdict(self)


@dataclass
class Report:
    straggler: str = None
    findings: list = field(default_factory=list)
    nodes: list = field(default_factory=list)       # per-node summary rows
    missing: list = field(default_factory=list)     # [{"node", "status", "message"}]
    source: str = ""
    options: dict = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self):
        return dict(straggler=self.straggler, findings=[f.to_dict() for f in self.findings], nodes=self.nodes,
                    missing=self.missing, source=self.source, options=self.options, elapsed_s=self.elapsed_s)

    # ---- for people ----
    def to_text(self, show_sql=True, width=None):
        from .. import render
        out = [f"straggler explain — {self.source}"]
        out.append(f"straggler: {self.straggler}" if self.straggler else "straggler: none found")
        out.append("")
        for i, f in enumerate(self.findings, 1):
            out.append(f"{i}. [{f.severity.upper()}] {f.summary}")
            if f.numbers:
                out.append("   numbers: " + ", ".join(f"{k}={_fmt_number(k, v)}" for k, v in f.numbers.items()))
            if f.recommendation:
                out.append(f"   recommendation: {f.recommendation}")
            if show_sql:
                for name, sql in f.sql.items():
                    out.append(f"   SQL ({name}):")
                    out.extend("     " + line for line in sql.strip().splitlines())
            out.append("")
        if self.nodes:
            cols = ["node", "rank", "calls", "work mean", "wait mean", "runq baseline", "runq recent", "role"]
            rows = [(n["node"], n.get("rank"), n.get("calls"), _fmt_ns(n.get("work_mean_ns")),
                     _fmt_ns(n.get("wait_mean_ns")), _fmt_pct(n.get("runq_baseline_pct")),
                     _fmt_pct(n.get("runq_recent_pct")), n.get("role")) for n in self.nodes]
            out.append(render.table_text(cols, rows, title="per node", width=width))
        for m in self.missing:
            out.append(f"missing: {m['node']} ({m['status']}): {m['message']}")
        return "\n".join(out).rstrip() + "\n"

    def to_markdown(self):
        from .. import render
        out = ["# straggler explain", "", f"Source: {self.source}", "",
               f"**Straggler: {self.straggler}**" if self.straggler else "**No straggler found.**", ""]
        for i, f in enumerate(self.findings, 1):
            out.append(f"## {i}. {f.severity.upper()}: {f.cause} — {f.node or 'fleet'}")
            out.append("")
            out.append(f.summary)
            out.append("")
            if f.numbers:
                out.append(render.to_markdown(["number", "value"], [(k, _fmt_number(k, v)) for k, v in f.numbers.items()]))
            if f.recommendation:
                out.append(f"**Recommendation:** {f.recommendation}")
                out.append("")
            for name, sql in f.sql.items():
                out.append(f"<details><summary>SQL: {name}</summary>")
                out.append("")
                out.append("```sql")
                out.append(sql.strip())
                out.append("```")
                out.append("</details>")
                out.append("")
        if self.nodes:
            out.append("## Per node")
            out.append("")
            out.append(render.to_markdown(
                ["node", "rank", "calls", "work mean", "wait mean", "runq baseline", "runq recent", "role"],
                [(n["node"], n.get("rank"), n.get("calls"), _fmt_ns(n.get("work_mean_ns")), _fmt_ns(n.get("wait_mean_ns")),
                  _fmt_pct(n.get("runq_baseline_pct")), _fmt_pct(n.get("runq_recent_pct")), n.get("role"))
                 for n in self.nodes]))
        if self.missing:
            out.append("## Missing nodes")
            out.append("")
            out.extend(f"- {m['node']} ({m['status']}): {m['message']}" for m in self.missing)
            out.append("")
        return "\n".join(out)

    def to_junit(self):
        """JUnit XML: one test case per node ("is not the straggler") plus "all nodes answered"."""
        cases = []
        by_node = {}
        for f in self.findings:
            by_node.setdefault(f.node, []).append(f)
        for n in self.nodes:
            name = n["node"]
            body = "\n".join(f"[{f.severity}] {f.summary}" for f in by_node.get(name, []))
            if name == self.straggler:
                main = next(f for f in self.findings if f.cause == "straggler")
                cases.append(f'  <testcase classname="straggler.explain" name="{_x(name)} is not the straggler">\n'
                             f'    <failure message="{_x(main.summary)}" type="straggler">{_x(body)}</failure>\n'
                             f'  </testcase>')
            else:
                cases.append(f'  <testcase classname="straggler.explain" name="{_x(name)} is not the straggler">'
                             f'<system-out>{_x(body)}</system-out></testcase>')
        for m in self.missing:
            cases.append(f'  <testcase classname="straggler.explain" name="{_x(m["node"])} answered">\n'
                         f'    <failure message="{_x(m["node"])} {_x(m["status"])}: {_x(m["message"])}" type="missing"/>\n'
                         f'  </testcase>')
        failures = (1 if self.straggler else 0) + len(self.missing)
        return ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f'<testsuite name="straggler explain" tests="{len(cases)}" failures="{failures}" errors="0" '
                f'time="{self.elapsed_s:.3f}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def _x(text):
    return html.escape(str(text), quote=True)


def _fmt_ns(ns):
    if ns is None:
        return ""
    ns = float(ns)
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns:.0f} ns"


def _fmt_share(share):
    """A share of the slowdown; above 100 % when the stolen time exceeds the excess over the others' typical time."""
    return f"{share:.0%}" if share <= 1.0 else f"all ({share:.0%})"


def _fmt_pct(p):
    return "" if p is None else f"{p:.0f}%"


def _fmt_bytes(b):
    b = float(b or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024


def _fmt_number(name, value):
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if name.endswith("_ns"):
        return f"{text} ({_fmt_ns(value)})"
    if name.endswith("bytes"):
        return f"{text} ({_fmt_bytes(value)})"
    return text


def _q(text):
    return "'" + str(text).replace("'", "''") + "'"


# ---------------------------------------------------------------- SQL (every query GROUPs BY node)

SQL_INVENTORY = f"""
SELECT node, MIN(rank) AS rank, COUNT(*) AS events,
       SUM(source IN {CALL_SOURCES}) AS calls,
       SUM(source = 'sched') AS sched_events,
       SUM(source = 'block') AS block_events,
       MIN(CASE WHEN source = 'sched' THEN ts END) AS sched_first_ts,
       MAX(CASE WHEN source = 'sched' THEN ts + duration END) AS sched_last_ts,
       MIN(CASE WHEN source IN {CALL_SOURCES} THEN ts END) AS calls_first_ts,
       MAX(CASE WHEN source IN {CALL_SOURCES} THEN ts + duration END) AS calls_last_ts
FROM events
GROUP BY node
ORDER BY node"""

SQL_RANKS = """
SELECT node, MIN(rank) AS rank, MAX(world_size) AS world_size, GROUP_CONCAT(DISTINCT pid) AS pids
FROM processes
WHERE rank IS NOT NULL
GROUP BY node
ORDER BY node"""

SQL_LOST = """
SELECT node, SUM(count) AS lost_events
FROM lost_events
GROUP BY node
HAVING SUM(count) > 0
ORDER BY node"""

SQL_CALL_LATENCY_EVENTS = f"""
WITH c AS (
  SELECT node, source, op, duration,
         ROW_NUMBER() OVER w AS rn,
         COUNT(*) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS n
  FROM events
  WHERE source IN {CALL_SOURCES}
  WINDOW w AS (PARTITION BY node, source, op ORDER BY duration)
)
SELECT node, source, op, MAX(n) AS count,
       MIN(CASE WHEN rn >= (n * 50 + 99) / 100 THEN duration END) AS p50_ns,
       MIN(CASE WHEN rn >= (n * 99 + 99) / 100 THEN duration END) AS p99_ns,
       ROUND(AVG(duration), 1) AS mean_ns,
       SUM(duration) AS total_ns
FROM c
GROUP BY node, source, op
ORDER BY node, source, op"""

# Every call is counted in `aggregates` (the agent records only some calls as events: slow ones,
# those that went off CPU, and a sample), so the distribution comes from there: count and mean are
# exact; p50/p99 are the upper bounds of the log2 histogram buckets they fall in (within 2x).
SQL_CALL_LATENCY = f"""
WITH h AS (
  SELECT a.node, a.source, a.op, CAST(j.key AS INTEGER) AS bucket, SUM(j.value) AS n
  FROM aggregates a, json_each(a.hist) j
  WHERE a.source IN {CALL_SOURCES}
  GROUP BY a.node, a.source, a.op, bucket
),
c AS (
  SELECT node, source, op, bucket,
         SUM(n) OVER (PARTITION BY node, source, op ORDER BY bucket ROWS UNBOUNDED PRECEDING) AS cum,
         SUM(n) OVER (PARTITION BY node, source, op) AS total
  FROM h
),
p AS (
  SELECT node, source, op,
         MIN(CASE WHEN cum * 100 >= total * 50 THEN bucket END) AS p50_bucket,
         MIN(CASE WHEN cum * 100 >= total * 99 THEN bucket END) AS p99_bucket
  FROM c
  GROUP BY node, source, op
),
s AS (
  SELECT node, source, op, SUM(count) AS count, SUM(sum_ns) AS total_ns, MAX(max_ns) AS max_ns
  FROM aggregates
  WHERE source IN {CALL_SOURCES}
  GROUP BY node, source, op
)
SELECT s.node, s.source, s.op, s.count,
       1 << (p.p50_bucket + 1) AS p50_ns,
       1 << (p.p99_bucket + 1) AS p99_ns,
       ROUND(1.0 * s.total_ns / s.count, 1) AS mean_ns,
       s.total_ns, s.max_ns
FROM s JOIN p ON p.node = s.node AND p.source = s.source AND p.op = s.op
WHERE s.count > 0
ORDER BY s.node, s.source, s.op"""

# Which processes and threads of each node make CUDA/NCCL calls (the trainer, its calling threads).
SQL_CALLERS = f"""
SELECT node, GROUP_CONCAT(DISTINCT pid) AS pids, GROUP_CONCAT(DISTINCT tid) AS tids
FROM events
WHERE source IN {CALL_SOURCES}
GROUP BY node
ORDER BY node"""


def _lit(v):
    return "NULL" if v is None else str(int(v)) if isinstance(v, (int, float)) else _q(v)


def _values_cte(name, columns, rows):
    """A CTE of literal rows: the values explain computed from earlier queries, written into the SQL."""
    if not rows:
        return f"{name}({', '.join(columns)}) AS (SELECT {', '.join('NULL' for _ in columns)} WHERE 0)"
    values = ",\n    ".join("(" + ", ".join(_lit(v) for v in r) + ")" for r in rows)
    return f"{name}({', '.join(columns)}) AS (VALUES\n    {values}\n)"


def context_ctes(trainer_pids, windows):
    """trainer(node, pid): the processes that make CUDA/NCCL calls or carry a torchrun rank;
    win(node, t0, tb, t1): each node's job span (its first to last call; else its sched events), split at tb into its own
    baseline [t0, tb) and the recent part [tb, t1]."""
    return (_values_cte("trainer", ("node", "pid"), sorted(trainer_pids)) + ",\n"
            + _values_cte("win", ("node", "t0", "tb", "t1"), sorted(windows)))


def sql_runq_threads(ctes):
    """Run-queue wait of each trainer thread as % of wall time, in the node's baseline and recent
    window. Summed over a node's threads it is the trainer's run-queue share (the demo's signal;
    more than 100 % is possible: several threads wait at once)."""
    return f"""
WITH {ctes}
SELECT e.node, e.tid, MIN(e.comm) AS comm,
       SUM(CASE WHEN e.ts < w.tb THEN e.duration ELSE 0 END) AS runq_baseline_ns,
       SUM(CASE WHEN e.ts >= w.tb THEN e.duration ELSE 0 END) AS runq_recent_ns,
       100.0 * SUM(CASE WHEN e.ts < w.tb THEN e.duration ELSE 0 END) / MAX(w.tb - w.t0, 1) AS runq_baseline_pct,
       100.0 * SUM(CASE WHEN e.ts >= w.tb THEN e.duration ELSE 0 END) / MAX(w.t1 - w.tb, 1) AS runq_recent_pct
FROM events e
CROSS JOIN trainer t ON t.node = e.node AND t.pid = e.pid
CROSS JOIN win w ON w.node = e.node
WHERE e.source = 'sched' AND e.op = 'runq'
GROUP BY e.node, e.tid
ORDER BY e.node, runq_recent_pct DESC"""


def sql_time_split(ctes, calling_tids):
    """Calling threads of the trainer: time in sync/collective calls (baseline and recent window), and in
    the recent window time in work calls, off-CPU blocked vs preempted, as % of wall time (a waiter:
    mostly waiting, blocked; more than in its own baseline)."""
    return f"""
WITH {ctes},
{_values_cte("calltid", ("node", "tid"), sorted(calling_tids))}
SELECT e.node,
       ROUND(100.0 * SUM(CASE WHEN e.ts < w.tb AND e.source IN {CALL_SOURCES} AND {wait_op_sql('e.')} THEN e.duration ELSE 0 END) / MAX(w.tb - w.t0, 1), 1) AS wait_calls_baseline_pct,
       ROUND(100.0 * SUM(CASE WHEN e.ts >= w.tb AND e.source IN {CALL_SOURCES} AND {wait_op_sql('e.')} THEN e.duration ELSE 0 END) / MAX(w.t1 - w.tb, 1), 1) AS wait_calls_pct,
       ROUND(100.0 * SUM(CASE WHEN e.source IN {CALL_SOURCES} AND e.ts >= w.tb AND NOT {wait_op_sql('e.')} THEN e.duration ELSE 0 END) / MAX(w.t1 - w.tb, 1), 1) AS work_calls_pct,
       ROUND(100.0 * SUM(CASE WHEN e.ts >= w.tb AND e.op = 'offcpu' AND e.state = 'blocked' THEN e.duration ELSE 0 END) / MAX(w.t1 - w.tb, 1), 1) AS blocked_pct,
       ROUND(100.0 * SUM(CASE WHEN e.ts >= w.tb AND e.op = 'offcpu' AND e.state = 'preempted' THEN e.duration ELSE 0 END) / MAX(w.t1 - w.tb, 1), 1) AS preempted_pct,
       COUNT(DISTINCT e.tid) AS calling_threads
FROM events e
CROSS JOIN calltid c ON c.node = e.node AND c.tid = e.tid
CROSS JOIN win w ON w.node = e.node
WHERE e.source IN {CALL_SOURCES} OR (e.source = 'sched' AND e.op = 'offcpu')
GROUP BY e.node
ORDER BY e.node"""


SQL_BLOCK_IO = """
SELECT node, comm, pid, COUNT(*) AS requests, SUM(bytes) AS bytes,
       ROUND(AVG(duration), 1) AS mean_latency_ns, SUM(op = 'block_write') AS writes
FROM events
WHERE source = 'block'
GROUP BY node, comm, pid
ORDER BY node, bytes DESC"""


def _slow_cte(node, thresholds):
    """The straggler's slow calls: (op, threshold_ns, typical_ns) -> duration above threshold,
    excess = duration minus the other nodes' typical (median p50) duration."""
    conds = " OR ".join(f"(source = {_q(s)} AND op = {_q(op)} AND duration > {int(thr)})"
                        for (s, op), (thr, typ) in sorted(thresholds.items()))
    typical = " ".join(f"WHEN {_q(op)} THEN {int(typ)}" for (s, op), (thr, typ) in sorted(thresholds.items()))
    return f"""slow AS (
  SELECT node, tid, op, ts AS t0, ts + duration AS t1, duration,
         duration - CASE op {typical} ELSE 0 END AS excess_ns
  FROM events
  WHERE +node = {_q(node)} AND source IN {CALL_SOURCES} AND ({conds})
)"""


def sql_slow_calls(node, thresholds):
    return f"""
WITH {_slow_cte(node, thresholds)}
SELECT node, op, COUNT(*) AS slow_calls, SUM(duration) AS slow_call_ns, SUM(excess_ns) AS slowdown_ns
FROM slow
GROUP BY node, op
ORDER BY node, slowdown_ns DESC"""


def sql_offcpu_in_slow(node, thresholds, max_interval_ns, op="offcpu"):
    """Off-CPU (or run-queue) time of the calling thread inside its slow calls, by state and by who ran instead."""
    extra = ", o.state, o.other_comm, o.other_pid" if op == "offcpu" else ""
    return f"""
WITH {_slow_cte(node, thresholds)}
SELECT s.node{extra}, COUNT(*) AS intervals,
       SUM(MIN(o.ts + o.duration, s.t1) - MAX(o.ts, s.t0)) AS overlap_ns
FROM slow s
CROSS JOIN events o ON o.source = 'sched' AND o.op = {_q(op)} AND +o.node = s.node AND +o.tid = s.tid
             AND o.ts >= s.t0 - {int(max_interval_ns)} AND o.ts < s.t1 AND o.ts + o.duration > s.t0
GROUP BY s.node{extra}
ORDER BY overlap_ns DESC"""


def sql_io_in_slow(node, thresholds, max_interval_ns):
    """Block I/O (any process on the node) in flight during the slow calls, each request once."""
    return f"""
WITH {_slow_cte(node, thresholds)}
SELECT b.node, b.comm, b.pid, COUNT(*) AS requests, SUM(b.bytes) AS bytes,
       ROUND(AVG(b.duration), 1) AS mean_latency_ns
FROM events b
WHERE b.rowid IN (
  SELECT x.rowid FROM slow s
  CROSS JOIN events x ON x.source = 'block' AND x.op IN ('block_read', 'block_write', 'block_other')
              AND +x.node = s.node AND x.ts >= s.t0 - {int(max_interval_ns)} AND x.ts < s.t1 AND x.ts + x.duration > s.t0)
GROUP BY b.node, b.comm, b.pid
ORDER BY bytes DESC"""


def sql_max_interval(node):
    return f"""
SELECT node, MAX(CASE WHEN source = 'sched' THEN duration END) AS max_sched_ns,
       MAX(CASE WHEN source = 'block' THEN duration END) AS max_block_ns
FROM events
WHERE node = {_q(node)} AND source IN ('sched', 'block')
GROUP BY node"""


def sql_offcpu_window(node, ctes):
    """No slow calls to look at (no CUDA/NCCL events): off-CPU time of the trainer in the recent window."""
    return f"""
WITH {ctes}
SELECT e.node, e.state, e.other_comm, e.other_pid, COUNT(*) AS intervals, SUM(e.duration) AS overlap_ns
FROM events e
CROSS JOIN trainer t ON t.node = e.node AND t.pid = e.pid
CROSS JOIN win w ON w.node = e.node
WHERE e.source = 'sched' AND e.op = 'offcpu' AND e.ts >= w.tb AND e.node = {_q(node)}
GROUP BY e.node, e.state, e.other_comm, e.other_pid
ORDER BY overlap_ns DESC"""


# ---------------------------------------------------------------- runners

class _DbRunner:
    def __init__(self, db_path, timeout_s):
        from ..store.query import run_query
        self._run_query = run_query
        self.db_path = db_path
        self.timeout_s = timeout_s
        self.missing = {}

    def rows(self, sql):
        result = self._run_query(self.db_path, sql, limit=200000, timeout_s=self.timeout_s)
        return [dict(zip(result.columns, r)) for r in result.rows]


class _FleetRunner:
    def __init__(self, nodes, tls, timeout_s, deadline_s=None, fleet_query=None):
        if fleet_query is None:
            from ..fleet.client import fleet_query          # the fleet client (another part); lazily
        self._fleet_query = fleet_query
        self.nodes, self.tls = nodes, tls
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s or max(15.0, timeout_s + 5.0)
        self.missing = {}
        self.answered = {}

    def rows(self, sql):
        result = self._fleet_query(self.nodes, sql, self.tls, limit=200000, timeout_s=self.timeout_s,
                                   deadline_s=self.deadline_s, clock_samples=0)   # explain needs no offsets
        for st in result.nodes:
            name = st.node or st.address
            if st.status in ("ok", "empty"):
                self.answered[name] = st.status
                continue
            self.missing.setdefault(name, dict(node=name, status=st.status, message=st.message or st.status,
                                               address=st.address))
        columns = list(result.columns)
        out = []
        for r in result.rows:
            row = {}
            for c, v in zip(columns, r):
                row[c] = v          # a column named twice (the client's node and ours): the later wins; equal anyway
            out.append(row)
        return out


# ---------------------------------------------------------------- statistics

def robust_outlier(value, others, opts):
    """Is `value` far above `others`? -> dict(outlier, median, mad, score, ratio)."""
    med = statistics.median(others)
    mad = statistics.median([abs(x - med) for x in others])
    scale = max(1.4826 * mad, opts.mad_floor * abs(med), 1e-9)
    score = (value - med) / scale
    ratio = value / med if med > 0 else float("inf")
    enough = len(others) >= 2
    return dict(outlier=bool(enough and score > opts.k and ratio >= opts.min_ratio), median=med, mad=mad,
                score=round(score, 2), ratio=round(ratio, 2), compared_with=len(others))


# ---------------------------------------------------------------- the analysis

def explain_db(db_path, **opts):
    """Explain one database (a merged cluster.db, or a single node's store)."""
    options = ExplainOptions.from_kwargs(**opts)
    return _explain(_DbRunner(db_path, options.timeout_s), options, f"database {db_path}")


def explain_fleet(nodes, tls, **opts):
    """Explain live, running each query on every node through the fleet client."""
    fleet_query = opts.pop("fleet_query", None)
    deadline_s = opts.pop("deadline_s", None)
    options = ExplainOptions.from_kwargs(**opts)
    if "timeout_s" not in opts:
        options.timeout_s = 30.0
    runner = _FleetRunner(nodes, tls, options.timeout_s, deadline_s, fleet_query)
    spec = nodes if isinstance(nodes, str) else ",".join(map(str, nodes))
    return _explain(runner, options, f"fleet {spec}")


def _explain(runner, opts, source):
    started = time.monotonic()
    report = Report(source=source, options=asdict(opts))
    findings = report.findings

    inventory = runner.rows(SQL_INVENTORY)
    ranks = {r["node"]: r for r in runner.rows(SQL_RANKS)}
    latency_sql = SQL_CALL_LATENCY
    latency = runner.rows(latency_sql)
    if not latency:                     # no aggregates (an older or hand-made store): from the events
        latency_sql = SQL_CALL_LATENCY_EVENTS
        latency = runner.rows(latency_sql)
    callers = runner.rows(SQL_CALLERS)
    # the trainer's processes and calling threads, and each node's windows, as literals for the next queries
    trainer_pids, calling_tids, windows = set(), set(), []
    for r in callers:
        trainer_pids.update((r["node"], int(p)) for p in str(r["pids"] or "").split(",") if p)
        calling_tids.update((r["node"], int(t)) for t in str(r["tids"] or "").split(",") if t)
    for r in ranks.values():
        trainer_pids.update((r["node"], int(p)) for p in str(r["pids"] or "").split(",") if p)
    for r in inventory:
        if r["sched_first_ts"] is not None:
            # The job's span on that node: from its first to its last CUDA/NCCL call when it made any
            # (scheduler events of its threads before the job computes, or after it stopped, would
            # dilute the shares), else the traced scheduler span.
            t0, t1 = int(r["sched_first_ts"]), int(r["sched_last_ts"])
            if r.get("calls_first_ts") is not None and r.get("calls_last_ts") is not None \
                    and int(r["calls_last_ts"]) > int(r["calls_first_ts"]):
                t0, t1 = int(r["calls_first_ts"]), int(r["calls_last_ts"])
            windows.append((r["node"], t0, t0 + int((t1 - t0) * opts.baseline_fraction), t1))
    spans = {w[0]: max(w[3] - w[1], 1) for w in windows}
    ctes = context_ctes(trainer_pids, windows)
    threads_sql = runq_sql = sql_runq_threads(ctes)
    runq_threads = runner.rows(threads_sql)
    runq = {}                       # per node: the sums over its trainer threads
    for r in runq_threads:
        acc = runq.setdefault(r["node"], dict(node=r["node"], runq_baseline_pct=0.0, runq_recent_pct=0.0, threads=0))
        acc["runq_baseline_pct"] += r["runq_baseline_pct"] or 0.0
        acc["runq_recent_pct"] += r["runq_recent_pct"] or 0.0
        acc["threads"] += 1
    split_sql = sql_time_split(ctes, calling_tids)
    split = {r["node"]: r for r in runner.rows(split_sql)}
    lost = runner.rows(SQL_LOST)

    nodes = [r["node"] for r in inventory if (r["calls"] or 0) + (r["sched_events"] or 0) > 0]
    rank_of = {n: (ranks.get(n) or {}).get("rank") for n in nodes}
    for r in inventory:
        if rank_of.get(r["node"]) is None and r.get("rank") is not None:
            rank_of[r["node"]] = r["rank"]

    # ---- which nodes are missing (world size vs data; fleet: unreachable / no data)
    missing = dict(runner.missing)
    world = max([r["world_size"] or 0 for r in ranks.values()] or [0])
    for r in inventory:
        if r["node"] not in nodes:
            missing.setdefault(r["node"], dict(node=r["node"], status="no-data",
                                               message="no CUDA/NCCL or scheduler events in its store"))
    if isinstance(runner, _FleetRunner):
        for name, status in runner.answered.items():
            if name not in nodes and name not in missing and all(name != r["node"] for r in inventory):
                missing[name] = dict(node=name, status="no-data", message="answered, but its store holds no events")
    present_ranks = {rank_of[n] for n in nodes if rank_of.get(n) is not None}
    absent_ranks = sorted(set(range(world)) - present_ranks) if world else []
    if absent_ranks and not missing:     # a merged database: nothing else says who is missing
        for rk in absent_ranks:
            missing[f"rank {rk}"] = dict(node=f"rank {rk}", status="no-data", rank=rk,
                                         message=f"world_size is {world} but no node with rank {rk} has data")
    report.missing = list(missing.values())

    # ---- per node/op latency, outliers among work ops
    by_op = {}
    for r in latency:
        if r["node"] in nodes:
            by_op.setdefault((r["source"], r["op"]), {})[r["node"]] = r
    op_outliers = {}      # node -> [(ratio, source, op, stats)]
    wait_outliers = {}
    op_stats = {}
    for (src, op), per_node in by_op.items():
        eligible = {n: r for n, r in per_node.items() if (r["count"] or 0) >= opts.min_calls}
        if len(eligible) < 2:
            continue
        for n, r in eligible.items():
            others = [o["mean_ns"] for m, o in eligible.items() if m != n]
            st = robust_outlier(r["mean_ns"], others, opts)
            st.update(node_mean_ns=r["mean_ns"], node_p50_ns=r["p50_ns"], node_p99_ns=r["p99_ns"], count=r["count"],
                      others_p50_median_ns=statistics.median([o["p50_ns"] for m, o in eligible.items() if m != n]),
                      others_p99_median_ns=statistics.median([o["p99_ns"] for m, o in eligible.items() if m != n]))
            # Material? The time this op lost against the others' median, over all its calls, as a
            # share of the node's traced span: a few slow calls on a busy machine are noise, not a
            # straggler (the job loses what the straggler loses, so it has to be a visible share).
            excess_ns = max(r["mean_ns"] - st["median"], 0) * (r["count"] or 0)
            st["excess_ns"] = int(excess_ns)
            if n in spans:
                st["excess_share"] = round(excess_ns / spans[n], 4)
                if st["outlier"] and st["excess_share"] < opts.min_excess_share:
                    st["outlier"], st["immaterial"] = False, True
            op_stats[(n, src, op)] = st
            if st["outlier"]:
                (wait_outliers if is_wait_op(src, op) else op_outliers).setdefault(n, []).append((st["ratio"], src, op, st))

    # ---- run-queue share: vs the others, and vs the node's own baseline
    runq_signal = {}
    runq_nodes = [n for n in nodes if n in runq]
    for n in runq_nodes:
        r = runq[n]
        others = [runq[m]["runq_recent_pct"] for m in runq_nodes if m != n]
        if not others:
            continue
        st = robust_outlier(r["runq_recent_pct"], others, opts)
        base = r["runq_baseline_pct"] or 0.0
        st["rise"] = round(r["runq_recent_pct"] / base, 2) if base > 0 else float("inf")
        runq_signal[n] = st
    # Rose against its own baseline, beyond what the other nodes' shares did over the same time: a
    # change of load on the whole machine (or fleet) moves every node's share; the straggler's
    # rises against theirs. (On one node alone, its own rise is all there is.)
    for n, st in runq_signal.items():
        other_rises = [runq_signal[m]["rise"] for m in runq_signal if m != n
                       and runq_signal[m]["rise"] not in (None, float("inf"))]
        fleet_rise = statistics.median(other_rises) if other_rises else 1.0
        st["rise_vs_others"] = round(st["rise"] / fleet_rise, 2) if fleet_rise > 0 else st["rise"]
        st["rose"] = st["rise_vs_others"] >= opts.min_rise

    # ---- pick the straggler: work-call outlier and/or run-queue outlier that rose vs its own baseline
    candidates = []
    for n in nodes:
        lat = sorted(op_outliers.get(n, []), key=lambda t: -t[0])
        rq = runq_signal.get(n)
        rq_hit = bool(rq and rq["outlier"] and rq["rose"])
        if lat or rq_hit:
            score = max([t[0] for t in lat] + ([rq["ratio"]] if rq_hit else []))
            candidates.append((score, n, lat, rq_hit))
    candidates.sort(key=lambda c: -c[0])
    straggler = candidates[0][1] if candidates else None
    report.straggler = straggler

    # ---- per node summary (work/wait means are call-weighted over ops)
    for n in nodes:
        rows = [r for r in latency if r["node"] == n]
        work = [r for r in rows if not is_wait_op(r["source"], r["op"])]
        wait = [r for r in rows if is_wait_op(r["source"], r["op"])]
        role = "straggler" if n == straggler else ""
        report.nodes.append(dict(
            node=n, rank=rank_of.get(n), calls=sum(r["count"] for r in rows),
            work_mean_ns=(sum(r["total_ns"] for r in work) / max(1, sum(r["count"] for r in work))) if work else None,
            wait_mean_ns=(sum(r["total_ns"] for r in wait) / max(1, sum(r["count"] for r in wait))) if wait else None,
            runq_baseline_pct=(runq.get(n) or {}).get("runq_baseline_pct"),
            runq_recent_pct=(runq.get(n) or {}).get("runq_recent_pct"),
            wait_calls_pct=(split.get(n) or {}).get("wait_calls_pct"),
            blocked_pct=(split.get(n) or {}).get("blocked_pct"), role=role))

    if straggler:
        _straggler_findings(runner, report, opts, straggler, candidates[0], op_stats, by_op, runq, runq_sql,
                            runq_threads, threads_sql, runq_signal, split, split_sql, rank_of, nodes, ctes, latency_sql)
        for score, n, lat, rq_hit in candidates[1:]:
            findings.append(Finding(
                severity="warning", node=n, cause="outlier",
                summary=f"{n} is also an outlier ({_describe_signals(lat, rq_hit, runq.get(n), runq_signal.get(n))}), "
                        f"less than {straggler}",
                numbers={"score": score}, sql={"call_latency": latency_sql.strip(), "runq_threads": runq_sql.strip()},
                recommendation="look at this node next: a second slow node, or collateral damage of the first"))
    else:
        _no_straggler_findings(report, opts, nodes, runq, runq_sql, wait_outliers, split, split_sql, missing,
                               latency_sql)

    # ---- missing nodes and lost events
    if report.missing:
        names = ", ".join(f"{m['node']} ({m['status']})" for m in report.missing)
        seen = len(nodes)
        uncertain = [f"the comparison used {seen} node{'s' if seen != 1 else ''}"]
        if straggler:
            uncertain.append(f"a node among the missing could be slower than {straggler}, and the medians lack its data")
        else:
            uncertain.append("a straggler among the missing nodes cannot be seen from here")
        if seen < 3:
            uncertain.append("with fewer than 3 nodes no robust outlier can be named")
        findings.append(Finding(
            severity="warning", node=None, cause="missing-nodes",
            summary=f"{len(report.missing)} node(s) missing: {names}"
                    + (f" (ranks without data: {', '.join(map(str, absent_ranks))})"
                       if absent_ranks and any("rank" not in m for m in report.missing) else "")
                    + "; " + "; ".join(uncertain),
            numbers={"nodes_with_data": seen, "missing": len(report.missing), "world_size": world or None},
            sql={"inventory": SQL_INVENTORY.strip(), "ranks": SQL_RANKS.strip()},
            recommendation="bring the missing agents up (straggler status on each; the fleet playbook) and re-run explain"))
    for r in lost:
        findings.append(Finding(
            severity="warning", node=r["node"], cause="data-loss",
            summary=f"{r['node']} lost {r['lost_events']} events (BPF buffer overruns): its numbers are lower bounds",
            numbers={"lost_events": r["lost_events"]}, sql={"lost_events": SQL_LOST.strip()},
            sources={"lost_events": dict(sql="lost_events", match={"node": r["node"]}, column="lost_events")},
            recommendation="raise the agent's buffer size or trace fewer calls"))

    findings.sort(key=lambda f: (f.cause != "straggler", SEVERITY_ORDER.get(f.severity, 9), -f.share))
    report.elapsed_s = round(time.monotonic() - started, 3)
    return report


def _describe_signals(lat, rq_hit, rq_row, rq_st):
    parts = [f"{op} mean {st['ratio']}× the others' median" for _, _, op, st in lat[:2]]
    if rq_hit and rq_row:
        parts.append(f"run-queue wait {rq_row['runq_recent_pct']:.0f}% of wall time vs {rq_st['median']:.0f}% on the others")
    return "; ".join(parts) or "no signal"


def _straggler_findings(runner, report, opts, s, candidate, op_stats, by_op, runq, runq_sql, runq_threads,
                        threads_sql, runq_signal, split, split_sql, rank_of, nodes, ctes, latency_sql):
    findings = report.findings
    _, _, lat, rq_hit = candidate
    rank = rank_of.get(s)
    who = f"{s} (rank {rank})" if rank is not None else s
    numbers, sources, phrases = {}, {}, []
    for ratio, src, op, st in lat:
        key = f"{op}_mean_ns"
        numbers[key] = st["node_mean_ns"]
        sources[key] = dict(sql="call_latency", match={"node": s, "source": src, "op": op}, column="mean_ns")
        numbers[f"{op}_others_median_mean_ns"] = st["median"]
        numbers[f"{op}_ratio"] = st["ratio"]
        numbers[f"{op}_p99_ns"] = st["node_p99_ns"]
        sources[f"{op}_p99_ns"] = dict(sql="call_latency", match={"node": s, "source": src, "op": op}, column="p99_ns")
        p99_word = "p99 ≤" if "json_each" in latency_sql else "p99"     # a log2 bucket's upper bound
        phrases.append(f"{op} mean {_fmt_ns(st['node_mean_ns'])} on {s} vs {_fmt_ns(st['median'])} median of the "
                       f"others, {st['ratio']:.1f}× ({p99_word} {_fmt_ns(st['node_p99_ns'])})")
    rq = runq.get(s)
    if rq:
        st = runq_signal.get(s, {})
        numbers.update(runq_recent_pct=rq["runq_recent_pct"], runq_baseline_pct=rq["runq_baseline_pct"],
                       runq_others_median_pct=st.get("median"))
        for key in ("runq_recent_pct", "runq_baseline_pct"):
            sources[key] = dict(sql="runq_threads", match={"node": s}, column=key, sum=True)
        top = next((t for t in runq_threads if t["node"] == s), None)
        thread = (f"; its thread {top['comm']} (tid {top['tid']}) {top['runq_baseline_pct']:.0f}% → "
                  f"{top['runq_recent_pct']:.0f}%") if top else ""
        phrases.append(f"its trainer waited in the run queue {rq['runq_recent_pct']:.0f}% of wall time (summed over "
                       f"{rq['threads']} threads) vs {rq['runq_baseline_pct']:.0f}% in its own baseline and "
                       f"{st.get('median', 0):.0f}% median on the others{thread}")
    best_ratio = max([t[0] for t in lat] + ([runq_signal[s]["ratio"]] if rq_hit else [0]))
    findings.append(Finding(
        severity="critical" if best_ratio >= 2 else "warning", node=s, cause="straggler",
        summary=f"{who} is the straggler: " + "; ".join(phrases),
        numbers=numbers, sources=sources,
        sql={"call_latency": latency_sql.strip(), "runq_threads": threads_sql.strip()},
        recommendation="see the cause findings below", share=1.0))

    # ---- the waiters
    waiters = [n for n in nodes if n != s and split.get(n)]
    if waiters:
        parts = []
        wnumbers, wsources = {}, {}
        for n in waiters:
            sp = split[n]
            parts.append(f"{n} {sp['wait_calls_pct']:.0f}% in sync/collective calls, blocked {sp['blocked_pct']:.0f}%, "
                         f"preempted {sp['preempted_pct']:.0f}%")
            for col in ("wait_calls_pct", "blocked_pct", "preempted_pct"):
                wnumbers[f"{n}.{col}"] = sp[col]
                wsources[f"{n}.{col}"] = dict(sql="time_split", match={"node": n}, column=col)
        if split.get(s):
            sp = split[s]
            wnumbers[f"{s}.wait_calls_pct"] = sp["wait_calls_pct"]
            wsources[f"{s}.wait_calls_pct"] = dict(sql="time_split", match={"node": s}, column="wait_calls_pct")
            parts.append(f"vs {s} itself {sp['wait_calls_pct']:.0f}% (it arrives last)")
        findings.append(Finding(
            severity="info", node=None, cause="waiters",
            summary="the other ranks are waiters, not causes: in the recent window their calling threads spend their "
                    "time in sync/collective calls, asleep (blocked), not losing CPU — " + "; ".join(parts),
            numbers=wnumbers, sources=wsources, sql={"time_split": split_sql.strip()},
            recommendation=f"nothing to fix on them: they wait for {s}"))

    # ---- why: windows of the straggler's slow calls
    thresholds = {}
    ops = [(src, op) for _, src, op, _ in lat] or [
        k for k in by_op if not is_wait_op(*k) and s in by_op[k] and len(by_op[k]) >= 2]
    for src, op in ops:
        st = op_stats.get((s, src, op))
        if not st:
            continue
        thr = max(st["others_p99_median_ns"], opts.min_ratio * st["others_p50_median_ns"])
        thresholds[(src, op)] = (thr, st["others_p50_median_ns"])
    node_io = runner.rows(SQL_BLOCK_IO)
    mx = (runner.rows(sql_max_interval(s)) or [{}])[0]
    max_sched = int(mx.get("max_sched_ns") or 0)
    max_block = int(mx.get("max_block_ns") or 0)
    slow_rows, slowdown = [], 0
    if thresholds:
        slow_sql = sql_slow_calls(s, thresholds)
        slow_rows = runner.rows(slow_sql)
        slowdown = sum(r["slowdown_ns"] or 0 for r in slow_rows)
    if slowdown > 0:
        offcpu_sql = sql_offcpu_in_slow(s, thresholds, max_sched)
        runq_in_sql = sql_offcpu_in_slow(s, thresholds, max_sched, op="runq")
        io_sql = sql_io_in_slow(s, thresholds, max_block)
        offcpu = runner.rows(offcpu_sql)
        runq_in = runner.rows(runq_in_sql)
        io = runner.rows(io_sql)
        base_sql = {"slow_calls": slow_sql.strip()}
        window_desc = (f"{sum(r['slow_calls'] for r in slow_rows)} slow calls on {s} "
                       f"({', '.join(r['op'] for r in slow_rows)}; slower than the other nodes' p99), "
                       f"{_fmt_ns(slowdown)} above the others' typical time")
        _cause_findings(report, s, offcpu, runq_in, io, slowdown, window_desc,
                        dict(base_sql, offcpu_in_slow_calls=offcpu_sql.strip()), runq_in_sql, io_sql, slow_sql,
                        node_io, SQL_BLOCK_IO)
    else:
        win_sql = sql_offcpu_window(s, ctes)
        offcpu = runner.rows(win_sql)
        total = sum(r["overlap_ns"] or 0 for r in offcpu)
        _cause_findings(report, s, offcpu, [], [], total, f"the recent window of {s}'s trainer (no slow calls to "
                        f"look at)", {"offcpu_recent": win_sql.strip()}, None, None, None, node_io, SQL_BLOCK_IO)


def _recommend_cpu(comm, pid, does_io):
    base = (f"move {comm} (pid {pid}) off the trainer's cores: `taskset -pc <other cores> {pid}` (or pin the "
            f"trainer and its threads to cores of their own with a cpuset), and lower its priority "
            f"(`renice +19 -p {pid}`)")
    if does_io:
        return base + (f"; it is a writer: make the checkpoint write asynchronous / throttled, or run it with "
                       f"`ionice -c3` on another core")
    return base + "; or stop it while training"


def _cause_findings(report, s, offcpu, runq_in, io, slowdown, window_desc, sql, runq_in_sql, io_sql, slow_sql,
                    node_io=(), node_io_sql=None):
    """Rank the causes inside the slow calls' windows by their share of the slowdown.

    Who ran instead is grouped by command name: sched_switch reports the thread switched in, so a
    writer with three threads shows three other_pids; block I/O reports the submitting process.
    """
    findings = report.findings
    offcpu_key = "offcpu_in_slow_calls" if "offcpu_in_slow_calls" in sql else "offcpu_recent"
    io_by_comm, io_by_proc = {}, {}
    for r in io:
        io_by_proc[(r["comm"], r["pid"])] = r
        acc = io_by_comm.setdefault(r["comm"], dict(requests=0, bytes=0, latency_sum=0.0, pids=[]))
        acc["requests"] += r["requests"] or 0
        acc["bytes"] += r["bytes"] or 0
        acc["latency_sum"] += (r["mean_latency_ns"] or 0) * (r["requests"] or 0)
        acc["pids"].append(r["pid"])
    node_io_by_comm = {}
    for r in node_io:
        if r["node"] == s:
            acc = node_io_by_comm.setdefault(r["comm"], dict(requests=0, bytes=0, pids=[]))
            acc["requests"] += r["requests"] or 0
            acc["bytes"] += r["bytes"] or 0
            acc["pids"].append(r["pid"])
    others_io = {}
    for r in node_io:
        if r["node"] != s:
            others_io.setdefault(r["comm"], {}).setdefault(r["node"], 0)
            others_io[r["comm"]][r["node"]] += r["bytes"] or 0
    io_bytes_total = sum(r["bytes"] or 0 for r in io)
    blocked = sum(r["overlap_ns"] or 0 for r in offcpu if r["state"] != "preempted")
    preempted = sum(r["overlap_ns"] or 0 for r in offcpu if r["state"] == "preempted")
    runq_total = sum(r["overlap_ns"] or 0 for r in runq_in)
    # who ran instead, grouped by command (its threads' other_pids listed)
    thieves = {}
    for r in offcpu:
        if r["state"] != "preempted":
            continue
        t = thieves.setdefault(r["other_comm"], dict(overlap_ns=0, intervals=0, tids=[]))
        t["overlap_ns"] += r["overlap_ns"] or 0
        t["intervals"] += r["intervals"] or 0
        t["tids"].append(r["other_pid"])
    for comm, t in sorted(thieves.items(), key=lambda kv: -kv[1]["overlap_ns"]):
        share = t["overlap_ns"] / slowdown if slowdown else 0.0
        if share < 0.05:
            continue
        win_io = io_by_comm.get(comm)
        all_io = node_io_by_comm.get(comm)
        pids = (win_io or all_io or {}).get("pids") or []
        pid = pids[0] if pids else t["tids"][0]
        threads = sorted({x for x in t["tids"] if x is not None})
        who = (f"{comm} (pid {pid}" + (f", threads {', '.join(map(str, threads))})" if threads and threads != [pid]
                                       else ")"))
        numbers = {"slowdown_ns": slowdown, "preempted_by_process_ns": t["overlap_ns"], "share_of_slowdown": round(share, 3),
                   "share_of_stolen_time": round(t["overlap_ns"] / preempted, 3) if preempted else None,
                   "preempted_total_ns": preempted, "blocked_total_ns": blocked, "runq_in_slow_calls_ns": runq_total,
                   "other_pids": ",".join(map(str, threads))}
        sources = {"preempted_by_process_ns": dict(sql=offcpu_key,
                                                   match={"node": s, "state": "preempted", "other_comm": comm},
                                                   column="overlap_ns", sum=True)}
        if "slow_calls" in sql:
            sources["slowdown_ns"] = dict(sql="slow_calls", match={"node": s}, column="slowdown_ns", sum=True)
        stolen_text = f", {t['overlap_ns'] / preempted:.0%} of the CPU time taken from it" if preempted else ""
        text = (f"CPU contention on {s}: its trainer was preempted by {who} for {_fmt_ns(t['overlap_ns'])} "
                f"in {t['intervals']} intervals during {window_desc}: {_fmt_share(share)} of the slowdown"
                f"{stolen_text}; run-queue wait in those calls {_fmt_ns(runq_total)}")
        f_sql = dict(sql)
        if runq_in_sql:
            f_sql["runq_in_slow_calls"] = runq_in_sql.strip()
        if win_io:
            numbers.update(io_bytes=win_io["bytes"], io_requests=win_io["requests"],
                           io_mean_latency_ns=round(win_io["latency_sum"] / max(1, win_io["requests"]), 1))
            sources["io_bytes"] = dict(sql="io_in_slow_calls", match={"node": s, "comm": comm}, column="bytes", sum=True)
            text += (f"; the same process issued {win_io['requests']} block I/O requests "
                     f"({_fmt_bytes(win_io['bytes'])}, mean latency {_fmt_ns(numbers['io_mean_latency_ns'])}) "
                     f"in those windows")
            f_sql["io_in_slow_calls"] = io_sql.strip()
        if all_io and all_io["bytes"]:
            others = others_io.get(comm, {})
            numbers.update(io_bytes_trace=all_io["bytes"], io_requests_trace=all_io["requests"])
            sources["io_bytes_trace"] = dict(sql="block_io", match={"node": s, "comm": comm}, column="bytes", sum=True)
            text += (f"; over the whole trace it wrote/read {_fmt_bytes(all_io['bytes'])} in {all_io['requests']} "
                     f"block I/O requests on {s}"
                     + (f" (on the other nodes: {', '.join(f'{n} {_fmt_bytes(b)}' for n, b in sorted(others.items()))})"
                        if others else " (no such I/O on the other nodes)"))
            f_sql["block_io"] = node_io_sql.strip()
        findings.append(Finding(
            severity="critical" if share >= 0.5 else "warning" if share >= 0.2 else "info", node=s,
            cause="cpu-contention", summary=text, numbers=numbers, sources=sources, sql=f_sql,
            recommendation=_recommend_cpu(comm, pid, bool(win_io or (all_io and all_io["bytes"]))),
            share=round(share, 3)))
    if slowdown and blocked / slowdown >= 0.05:
        share = blocked / slowdown
        own_io = io_bytes_total > 0
        findings.append(Finding(
            severity="critical" if share >= 0.5 else "warning" if share >= 0.2 else "info", node=s,
            cause="io-wait" if own_io else "blocked",
            summary=(f"{s}'s trainer was blocked (asleep) for {_fmt_ns(blocked)} inside its slow calls: {_fmt_share(share)} of "
                     f"the slowdown" + (f", with {_fmt_bytes(io_bytes_total)} of block I/O in flight" if own_io else
                                        " with no block I/O in flight (a lock, a sleep, or a page fault)")),
            numbers={"blocked_ns": blocked, "share_of_slowdown": round(share, 3), "slowdown_ns": slowdown},
            sources={"blocked_ns": dict(sql=offcpu_key, match={"node": s, "state": "blocked"},
                                        column="overlap_ns", sum=True)},
            sql=dict(sql), share=round(share, 3),
            recommendation=("move checkpoint/data I/O out of the training thread (async writer), `ionice -c3` "
                            "the writers" if own_io else "profile the trainer's blocking (py-spy dump, offcputime)")))
    # block I/O in the windows by processes that did not also take the CPU: contention on the device
    for (comm, pid), r in sorted(io_by_proc.items(), key=lambda kv: -(kv[1]["bytes"] or 0)):
        if comm in thieves or not io_bytes_total or (r["bytes"] or 0) < 0.2 * io_bytes_total:
            continue
        if (r["bytes"] or 0) < (1 << 20):
            continue
        findings.append(Finding(
            severity="warning", node=s, cause="block-io",
            summary=(f"block I/O by {comm} (pid {pid}) on {s} during its slow calls: {r['requests']} requests, "
                     f"{_fmt_bytes(r['bytes'])}, mean latency {_fmt_ns(r['mean_latency_ns'])}"),
            numbers={"io_bytes": r["bytes"], "io_requests": r["requests"], "io_mean_latency_ns": r["mean_latency_ns"]},
            sources={"io_bytes": dict(sql="io_in_slow_calls", match={"node": s, "comm": comm, "pid": pid}, column="bytes")},
            sql={"io_in_slow_calls": io_sql.strip(), "slow_calls": slow_sql.strip()},
            recommendation=f"`ionice -c3 -p {pid}`, or move its writes to another disk or off the training window",
            share=0.0))


def _no_straggler_findings(report, opts, nodes, runq, runq_sql, wait_outliers, split, split_sql, missing,
                               latency_sql):
    findings = report.findings
    numbers = {f"{n}.runq_recent_pct": runq[n]["runq_recent_pct"] for n in nodes if n in runq}
    sources = {f"{n}.runq_recent_pct": dict(sql="runq_threads", match={"node": n}, column="runq_recent_pct", sum=True)
               for n in nodes if n in runq}
    waiting = [n for n in nodes if (split.get(n) or {}).get("wait_calls_pct") is not None
               and split[n]["wait_calls_pct"] >= WAITER_RISE * (split[n]["wait_calls_baseline_pct"] or 0)
               and split[n]["wait_calls_pct"] > 0]
    if missing and nodes and len(waiting) == len(nodes):
        findings.append(Finding(
            severity="warning", node=None, cause="waiters",
            summary=(f"no straggler among the {len(nodes)} nodes with data, but all of them now wait longer in "
                     f"sync/collective calls than in their own baseline ("
                     + ", ".join(f"{n} {split[n]['wait_calls_baseline_pct']:.0f}% → {split[n]['wait_calls_pct']:.0f}%"
                                 for n in nodes)
                     + f"): the straggler is probably one of the missing nodes "
                     f"({', '.join(m['node'] for m in missing.values())})"),
            numbers={f"{n}.{col}": split[n][col] for n in nodes for col in ("wait_calls_baseline_pct", "wait_calls_pct")},
            sources={f"{n}.{col}": dict(sql="time_split", match={"node": n}, column=col)
                     for n in nodes for col in ("wait_calls_baseline_pct", "wait_calls_pct")},
            sql={"time_split": split_sql.strip()},
            recommendation="bring the missing agents up and re-run explain"))
    findings.append(Finding(
        severity="info", node=None, cause="no-straggler",
        summary=(f"no straggler: on {len(nodes)} node(s) no work call is more than k={opts.k:g} robust deviations and "
                 f"{opts.min_ratio:g}× above the other nodes' median, and no trainer's run-queue share stands out and "
                 f"rose against its own baseline"),
        numbers=numbers, sources=sources, sql={"call_latency": latency_sql.strip(), "runq_threads": runq_sql.strip()},
        recommendation=""))


# ---------------------------------------------------------------- CLI

def add_arguments(parser):
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("-d", "--db", help="a database: a merged cluster.db, or one node's store")
    where.add_argument("--nodes", help="live: the fleet's agents, host:port,… or a file with one per line")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown to FILE")
    parser.add_argument("--junit", metavar="FILE", help="also write the report as JUnit XML to FILE (for CI)")
    parser.add_argument("--k", type=float, default=ExplainOptions.k,
                        help="an outlier is more than K robust deviations (MAD x 1.4826) above the other nodes' median "
                             f"(default {ExplainOptions.k:g})")
    parser.add_argument("--min-ratio", type=float, default=ExplainOptions.min_ratio,
                        help=f"... and at least this many times that median (default {ExplainOptions.min_ratio:g})")
    parser.add_argument("--min-excess-share", type=float, default=ExplainOptions.min_excess_share,
                        help="... and its slow calls together cost at least this share of the node's traced time "
                             f"(default {ExplainOptions.min_excess_share:g})")
    parser.add_argument("--baseline-fraction", type=float, default=ExplainOptions.baseline_fraction,
                        help="the first part of each node's trace that is its own baseline "
                             f"(default {ExplainOptions.baseline_fraction:g})")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per query (default 300 local, 30 fleet)")
    parser.add_argument("--no-sql", action="store_true", help="text output without the SQL of each finding")
    parser.add_argument("--fail-on-straggler", action="store_true", help="exit 1 when a straggler is found")
    from ..tls import add_tls_arguments
    add_tls_arguments(parser)


def run(args):
    opts = dict(k=args.k, min_ratio=args.min_ratio, baseline_fraction=args.baseline_fraction,
                min_excess_share=args.min_excess_share)
    if args.timeout:
        opts["timeout_s"] = args.timeout
    if args.db:
        import os
        if not os.path.exists(args.db):
            raise StragglerError(f"{args.db}: no such database; pass -d a store or a merged cluster.db")
        report = explain_db(args.db, **opts)
    else:
        from ..tls import TLSOptions
        from ..fleet.client import parse_nodes
        report = explain_fleet(parse_nodes(args.nodes), TLSOptions.from_args(args), **opts)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(report.to_markdown())
    if args.junit:
        with open(args.junit, "w") as fh:
            fh.write(report.to_junit())
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(report.to_text(show_sql=not args.no_sql))
    return 1 if (args.fail_on_straggler and report.straggler) else 0
