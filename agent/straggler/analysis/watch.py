"""`straggler watch`: name the straggler and its cause while the job runs, seconds after it starts.

Every --interval seconds the watch polls each agent's GET /api/v1/live (the step-time model's
rows since the last poll; mutual TLS, one keep-alive connection per node, one thread per node so
a dead node never holds the others), keeps each node's last --baseline + --window seconds, puts
every node's rows into one in-memory store with the agents' own schema and runs explain on it
(the same code, rules and options as `straggler explain`: no second copy): the same segmentation
into straggle episodes. A straggler is named while an episode on it is still going at the newest
data; its cause is that episode's.

It prints a line only when the verdict changes (Tracker):
  onset         an episode still going, on the same node in CONFIRM_TICKS polls in a row, that began
                after clean time (the job's step time moved): node, rank, cause, the share of its excess
                the cause explains, when it began, whether it comes and goes. A rank that was the slowest
                all along, with no change, is no onset (straggler explain names it)
  cause-change  the same straggler, another cause (CONFIRM_TICKS in a row)
  recovered     (with the job's time lost to the episode, as explain measured it at its last poll)
                its episode ended and no other is going, for CLEAR_TICKS polls in a row, and the
                segmentation closed it: the bins since hold enough healthy evidence that a resumption would
                be a new episode (explain's `may_resume`; a fault that comes and goes, or quiets for a few
                seconds, stays one episode through its off-phases) or HOLD_TICKS polls passed, or the job's
                ranks are gone
  imbalance     the job loses a share of its time (explain's imbalance finding over the time held) to slowest
                ranks no episode names (one that moves from rank to rank, or one rank late at most sync points
                behind collectives that only enqueue): no straggler named (CONFIRM_TICKS)
  balanced      it no longer does (CLEAR_TICKS)
  lost / back   a node stops answering / answers again (the watch goes on with the others)
Each verdict event, and the watch's end, carries `window`: the job's time lost over the time the watch holds
(its last --baseline + --window seconds) at its sync
points, split by what lost it (explain's what-if, from the collective and synchronize calls the agents record), measured
every WHATIF_EVERY_S.
The faces (straggler.cli.watch: text lines for people, JSON lines for machines, --exec hooks; the
Ansible action) render the events; --until-straggler ends the watch with exit status 1 at the first
onset (for CI). This module prints nothing.

Times: every event carries the controller's wall clock (`time`) and monotonic clock (`mono_ns`);
each node's clock offset comes from its /live answers (NTP-style, straggler.clock).
"""
import datetime
import sqlite3
import threading
import time
from dataclasses import dataclass, field

from ..errors import UsageError
from ..text import one_line
from ..fleet.client import ANSWERED
from ..probes.symbols import OP_SOURCE
from ..store.live import AGGREGATE_COLUMNS, NET_FLOW_COLUMNS, NET_SAMPLE_COLUMNS

DEFAULT_INTERVAL_S = 1.0
DEFAULT_WINDOW_S = 8.0       # a rank is judged once it has run this long (plus SETTLE_S) ...
DEFAULT_BASELINE_S = 50.0    # ... and the watch keeps this much history before it (the episodes' clean time)
CONFIRM_TICKS = 2            # an onset or a cause change must hold this many polls in a row
CLEAR_TICKS = 3              # recovered after this many polls in a row without a straggler ...
HOLD_TICKS = 8               # ... once its episode is closed, or after this many however it reads (a rank still a
                             # little the slowest after its fault ended keeps the segmentation's edge open long)
STALE_S = 4.0                # a rank whose newest summary is this much older than its node's newest is gone
MAX_HELD_CALLS = 100_000     # collective calls a node's feed holds at most (the newest)
WHATIF_EVERY_S = 5.0         # the job's time lost over the time held is measured this often (it lines up every
                             # collective call of the window: ten times a verdict's cost)
SETTLE_S = 10.0              # a rank is judged once it has run the window + this long (a job's start is no onset)
EXIT_STRAGGLER = 1
EXIT_NO_AGENT = 3


# ---------------------------------------------------------------- per node

@dataclass
class NodeFeed:
    """What the watch holds of one node: its recent rows and its state."""
    address: str
    node: str = None
    status: str = "pending"
    message: str = ""
    since_ns: int = None             # the next poll asks for intervals from here (node clock)
    node_mono_ns: int = None         # the node's monotonic clock at its last answer
    polled_mono_ns: int = None       # the controller's monotonic clock then
    samples: list = field(default_factory=list)   # clock samples (t_send, node_real, t_recv), newest last
    pairs: list = field(default_factory=list)     # the node's (monotonic, realtime) pairs of its answers, newest last
    offset_ns: int = None
    uncertainty_ns: int = None
    thread_time: dict = field(default_factory=dict)   # (ts, pid, tid) -> row
    block: dict = field(default_factory=dict)         # (ts, pid) -> row
    processes: dict = field(default_factory=dict)     # pid -> row
    lost: dict = field(default_factory=dict)          # (probe, ts) -> row
    net_flows: dict = field(default_factory=dict)     # (ts, pid, local address and port, peer's) -> row
    net_samples: dict = field(default_factory=dict)   # (ts, iface) -> row
    collectives: dict = field(default_factory=dict)   # seq -> row, in the order they came (seq order)
    after_seq: int = None                             # the highest seq of them: the next poll asks for the calls after
    calls_from_ns: int = None                         # the calls are complete from here on (an answer cut at its cap)
    aggregates: dict = field(default_factory=dict)    # (ts, pid, source, op) -> row (an interval's counts, twice)
    columns: dict = None

    def apply(self, status, answer, sample, horizon_ns):
        self.status, self.message = status.status, status.message or status.status
        if answer is None:
            return
        self.node = answer.get("node") or self.node or status.node
        self.columns = answer["columns"]
        self.node_mono_ns = answer.get("monotonic_ns")
        if answer.get("monotonic_ns") is not None and answer.get("realtime_ns") is not None:
            self.pairs = (self.pairs + [(int(answer["monotonic_ns"]), int(answer["realtime_ns"]))])[-16:]
        self.polled_mono_ns = time.monotonic_ns()
        cols = self.columns
        for r in answer.get("thread_time") or []:
            d = dict(zip(cols["thread_time"], r))
            self.thread_time[(d["ts"], d["pid"], d["tid"])] = r
            nxt = d["ts"] + 1
            self.since_ns = nxt if self.since_ns is None else max(self.since_ns, nxt)
        for r in answer.get("block") or []:
            d = dict(zip(cols["block"], r))
            self.block[(d["ts"], d["pid"])] = r       # a second still filling is asked again: replaced
        for r in answer.get("processes") or []:
            self.processes[dict(zip(cols["processes"], r))["pid"]] = r
        for r in answer.get("lost") or []:
            d = dict(zip(cols["lost"], r))
            self.lost[(d["probe"], d["ts"])] = r      # an interval's row can come twice
        for r in answer.get("net_flows") or []:
            d = dict(zip(cols["net_flows"], r))
            self.net_flows[(d["ts"], d.get("pid"), d.get("local_addr"), d.get("local_port"), d.get("peer_addr"),
                            d.get("peer_port"))] = r
        for r in answer.get("net_samples") or []:
            d = dict(zip(cols["net_samples"], r))
            self.net_samples[(d["ts"], d.get("iface"))] = r
        high = answer.get("seq_high")
        if self.after_seq is not None and type(high) is int and high < self.after_seq:
            self.collectives, self.after_seq = {}, None      # a new store: its seqs begin again
        calls = answer.get("collectives") or []
        first = self.after_seq is None
        for r in calls:
            seq = dict(zip(cols["collectives"], r))["seq"]
            self.collectives[seq] = r
            self.after_seq = seq if self.after_seq is None else max(self.after_seq, seq)
        if calls and answer.get("calls_truncated") is True:
            # cut at its cap: a first answer holds the newest calls, a later one the oldest of a backlog the
            # next ones may not reach (they ask from a little before `since`): the calls are complete from here
            at = cols["collectives"].index("ts")
            self.calls_from_ns = min(r[at] for r in calls) if first else max(r[at] for r in calls)
        if not cols.get("collectives"):
            self.collectives, self.after_seq = {}, None      # an older agent now: it sends none
        for r in answer.get("aggregates") or []:
            d = dict(zip(cols["aggregates"], r))
            self.aggregates[(d["ts"], d.get("pid"), d.get("source"), d.get("op"))] = r
        if self.since_ns is None and answer.get("latest_ns") is not None:
            self.since_ns = int(answer["latest_ns"])
        if sample is not None:
            from ..clock import estimate_offset
            self.samples = (self.samples + [sample])[-16:]
            try:
                self.offset_ns, self.uncertainty_ns = estimate_offset(self.samples)
            except ValueError:
                pass
        self._trim(horizon_ns)

    def _trim(self, horizon_ns):
        newest = max((k[0] for k in self.thread_time), default=None)
        if newest is None:
            return
        cut = newest - horizon_ns
        self.thread_time = {k: v for k, v in self.thread_time.items() if k[0] >= cut}
        self.block = {k: v for k, v in self.block.items() if k[0] >= cut}
        self.lost = {k: v for k, v in self.lost.items() if k[1] >= cut}
        self.net_flows = {k: v for k, v in self.net_flows.items() if k[0] >= cut}
        self.net_samples = {k: v for k, v in self.net_samples.items() if k[0] >= cut}
        self.aggregates = {k: v for k, v in self.aggregates.items() if k[0] >= cut}
        if self.collectives:
            # held in the order they came (seq order: nearly time order), the oldest first: dropped from the front
            at = self.columns["collectives"].index("ts")
            while self.collectives:
                oldest = next(iter(self.collectives))
                if self.collectives[oldest][at] >= cut and len(self.collectives) <= MAX_HELD_CALLS:
                    break
                del self.collectives[oldest]
        exited = self.columns["processes"].index("exited")
        self.processes = {pid: r for pid, r in self.processes.items() if r[exited] is None or r[exited] >= cut}

    def current_rows(self, min_span_ns=0):
        """thread_time rows of the ranks still running (newest summary within STALE_S of the node's
        clock, less the summaries' own lag) that have run at least min_span_ns (their rows span that much)."""
        if not self.thread_time:
            return []
        # the node's clock now (its last answer, plus the time since), else its newest summary: the
        # rows of a job that ended are not judged (not even right after the watch starts)
        newest = max(k[0] for k in self.thread_time)
        if self.node_mono_ns is not None and self.polled_mono_ns is not None:
            at = self.columns["thread_time"].index("interval_ns")
            lag = 2 * max(r[at] for r in self.thread_time.values())   # a summary is written after its interval
            newest = max(newest, self.node_mono_ns + (time.monotonic_ns() - self.polled_mono_ns) - lag)
        first_of, last_of = {}, {}
        for (ts, pid, _tid) in self.thread_time:
            last_of[pid] = max(last_of.get(pid, ts), ts)
            first_of[pid] = min(first_of.get(pid, ts), ts)
        live = {pid for pid, ts in last_of.items()
                if ts >= newest - int(STALE_S * 1e9) and ts - first_of[pid] >= min_span_ns}
        return [r for k, r in sorted(self.thread_time.items()) if k[1] in live]


def refuse_shared_names(feeds, refused):
    """Feeds whose agents answered as one node (fleet.combine's identity rule): each is refused
    (wrong-node, one line) and its rows are left out of the verdict, for the rest of the watch
    (`refused`: address -> the message, kept between polls; which of them is the node cannot be told)."""
    from ..fleet.combine import shared_name_message, shared_names
    claims = [(feed.address, feed.node) for feed in feeds if feed.node]
    for node, addresses in shared_names(claims).items():
        for address in addresses:
            refused.setdefault(address, shared_name_message(node, addresses))
    for feed in feeds:
        if feed.address in refused:
            feed.status, feed.message = "wrong-node", refused[feed.address]


def build_store(feeds, min_span_ns=0, calls=False):
    """One in-memory store with the agents' schema, holding every answering node's recent rows (of
    the ranks that have run min_span_ns); a feed refused for its identity holds none. calls: with the
    recorded collective calls and the kernel's counts of the calls (the what-if's; the verdicts are made
    without them, as they always were, at a tenth of the cost)."""
    from ..store import schema
    conn = sqlite3.connect(":memory:")
    schema.create(conn)
    for feed in feeds:
        if feed.columns is None or feed.node is None or feed.status == "wrong-node":
            continue
        cols = feed.columns
        rows = feed.current_rows(min_span_ns)
        if rows:
            names = cols["thread_time"]
            at = names.index("node")
            conn.executemany(f"INSERT INTO thread_time({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                             [list(r[:at]) + [feed.node] + list(r[at + 1:]) for r in rows])
        ev = []
        for r in feed.block.values():
            d = dict(zip(cols["block"], r))
            n = max(1, int(d["requests"] or 1))
            ev.append((feed.node, d["ts"], d["pid"], d["comm"], int(d["bytes"] or 0), int((d["duration"] or 0) / n)))
        for seq, e in enumerate(ev):
            conn.execute("INSERT INTO events(seq, node, source, op, ts, pid, comm, bytes, duration) "
                         "VALUES (?, ?, 'block', 'block_io', ?, ?, ?, ?, ?)", (seq,) + e)
        # the node's clock: its pairs and its offset from this machine, so explain puts every node on
        # this machine's timeline (as a merge does with the offsets it measured)
        conn.executemany("INSERT INTO clock_pairs(node, mono_ns, real_ns) VALUES (?, ?, ?)",
                         [(feed.node, m, r) for m, r in feed.pairs])
        if feed.offset_ns is not None:
            conn.execute("INSERT INTO clock_offsets(node, offset_ns, uncertainty_ns, measured_at, method) "
                         "VALUES (?, ?, ?, ?, 'merge')", (feed.node, feed.offset_ns, feed.uncertainty_ns or 0,
                                                          time.time_ns()))
        pcols = cols["processes"]
        for r in feed.processes.values():
            d = dict(zip(pcols, r))
            conn.execute("INSERT OR REPLACE INTO processes(node, pid, ppid, comm, rank, local_rank, world_size, "
                         "first_seen, last_seen, exited) VALUES (?,?,?,?,?,?,?,?,?,?)",
                         (feed.node, d["pid"], d["ppid"], d["comm"], d["rank"], d["local_rank"], d["world_size"],
                          d["first_seen"], d["last_seen"], d["exited"]))
        for table, known in (("net_flows", NET_FLOW_COLUMNS), ("net_samples", NET_SAMPLE_COLUMNS)):
            names = cols.get(table)                      # the links (an older agent sends none): the columns
            rows = list(getattr(feed, table).values())   # this version knows that the node sent, by name
            if not rows or not names:
                continue
            use = [c for c in known[1:] if c in names]
            if not use:
                continue
            conn.executemany(f"INSERT INTO {table}(node, {', '.join(use)}) VALUES ({', '.join('?' * (len(use) + 1))})",
                             [[feed.node] + [d.get(c) for c in use] for d in (dict(zip(names, r)) for r in rows)])
        # the job's sync points (its collective calls, each on its communicator, and its synchronize calls: where
        # the ranks wait when collectives only enqueue) and the kernel's counts of
        # its calls (an older agent sends neither: then the what-if says why it was not measured)
        # (where an answer was cut, the counts too begin where the calls are complete: explain compares them)
        complete = feed.calls_from_ns if feed.calls_from_ns is not None else -(1 << 63)
        names = cols.get("collectives")
        if calls and names and feed.collectives:
            rows = [d for d in (dict(zip(names, r)) for r in feed.collectives.values())
                    if isinstance(d.get("op"), str) and d["op"] in OP_SOURCE and d["ts"] >= complete]
            conn.executemany("INSERT INTO events(seq, node, source, op, ts, duration, pid, tid, rank, detail) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, json_object('comm', ?))",
                             [(d["seq"], feed.node, OP_SOURCE[d["op"]], d["op"], d["ts"], d.get("duration") or 0,
                               d.get("pid"), d.get("tid"), d.get("rank"), d.get("communicator")) for d in rows])
        names = cols.get("aggregates")
        if calls and names and feed.aggregates:
            use = [c for c in AGGREGATE_COLUMNS[1:] if c in names]
            if {"ts", "interval_ns", "source", "op", "count", "sum_ns", "max_ns"} <= set(use):
                conn.executemany(f"INSERT INTO aggregates(node, {', '.join(use)}) VALUES ({', '.join('?' * (len(use) + 1))})",
                                 [[feed.node] + [d.get(c) for c in use]
                                  for d in (dict(zip(names, r)) for r in feed.aggregates.values())
                                  if all(d.get(c) is not None for c in ("source", "op", "count", "sum_ns", "max_ns"))
                                  and d["ts"] >= complete])
        lcols = cols["lost"]
        conn.executemany("INSERT INTO lost_events(node, probe, ts, interval_ns, count) VALUES (?,?,?,?,?)",
                         [(feed.node,) + tuple(dict(zip(lcols, r))[c] for c in ("probe", "ts", "interval_ns", "count"))
                          for r in feed.lost.values()])
    conn.commit()
    return conn


# ---------------------------------------------------------------- the verdict over time

@dataclass
class LiveVerdict:
    """What one poll of the watch concluded (explain over the feeds' rows), for the Tracker."""
    straggler: str = None
    rank: object = None
    pid: int = None
    cause: str = None
    share: float = None
    summary: str = ""
    wait_pct: float = None
    others_wait_pct: float = None
    step_moved_s: float = None       # seconds since its episode began (None: no clean time before it)
    intermittent: dict = None        # its episode comes and goes: period_s, duty, cycles
    episode_start: str = None        # ISO 8601, UTC, on the fleet timeline
    lost_s: float = None             # the job's time lost to its episode so far (explain's: its slowdown over
    slowdown: float = None           # its bins), None when not measured (all along)
    ranks: int = 0
    whatif: dict = None              # the job's time lost over the time the watch holds at its sync points, by what
                                     # lost it (explain's what-if; not measured, and why, where it could not be)
    imbalance: str = None            # explain's imbalance finding over that time (its summary), if any
    may_resume: frozenset = frozenset()   # nodes whose episode ended so lately it may still resume
    report: object = None


@dataclass
class Snapshot:
    """The feeds' rows at one poll, in a store of their own (taken under the feeds' lock; judged after it)."""
    conn: object
    missing: dict
    answered: dict


def snapshot(feeds, window_s, calls=False):
    """The feeds' rows now (build_store) and who answered. calls: with the collective calls and the calls'
    counts too, for the what-if (WHATIF_EVERY_S)."""
    missing = {f.node or f.address: dict(node=f.node or f.address, status=f.status, message=f.message,
                                         address=f.address)
               for f in feeds if f.status not in ANSWERED}
    answered = {f.node: f.status for f in feeds if f.node and f.status in ANSWERED}
    return Snapshot(build_store(feeds, int((window_s + SETTLE_S) * 1e9), calls=calls), missing, answered)


def judge(snap, min_gap=None):
    """Run explain over a snapshot (its episodes in time) -> LiveVerdict: the straggler of the episode still
    going at the newest data, if any. Closes the snapshot's store."""
    from . import explain
    try:
        opts = dict(min_calls=10, timeout_s=10.0)
        if min_gap is not None:
            opts["min_gap"] = min_gap
        report = explain.explain_connection(snap.conn, "live watch", missing=snap.missing, answered=snap.answered,
                                            **opts)
        return verdict_of(report)
    finally:
        snap.conn.close()


def measure_window(snap, min_gap=None):
    """The what-if over a snapshot with the calls -> (window_lost dict, the imbalance finding's summary or None);
    a failure is a what-if not measured, and why (the verdicts go on without it)."""
    try:
        measured = judge(snap, min_gap=min_gap)
    except Exception as exc:       # (a node's odd rows must not stop the watch)
        return {"measured": False, "why": f"the calls could not be read: {one_line(exc)}"}, None
    return measured.whatif, measured.imbalance


def verdict_of(report):
    """The LiveVerdict of an explain report: its costliest episode still going at the newest data."""
    v = LiveVerdict(report=report, ranks=len(report.nodes), whatif=window_lost(report.whatif),
                    imbalance=next((f.summary for f in report.findings if f.cause == "imbalance"), None),
                    may_resume=frozenset(e["node"] for e in report.episodes if e.get("may_resume")))
    going = [e for e in report.episodes if e.get("ongoing")]
    if not going:
        return v
    e = max(going, key=lambda x: (x.get("lost_s") is None, x.get("lost_s") or 0.0))     # all along: unmeasured, first
    v.straggler = e["node"]
    lead = next((f for f in e["findings"] if f["cause"] == "straggler"), None)
    ranks = [r for r in e["ranks"] if r.get("node") == e["node"]]
    if ranks:
        v.rank, v.pid = ranks[0].get("rank"), ranks[0].get("pid")
    if lead:
        v.wait_pct = lead["numbers"].get("wait_pct")
        v.others_wait_pct = lead["numbers"].get("others_median_wait_pct")
    top = max(e.get("causes") or [], key=lambda c: c["share"], default=None)
    if top is not None:
        v.cause, v.share, v.summary = top["cause"], round(top["share"], 3), top["summary"]
    else:
        v.cause, v.summary = "unknown", "no cause class explains its excess"
    span = report.timeline or {}
    bin_ns = int((span.get("bin_s") or 1) * 1e9)
    if span.get("start_ns") is not None and e["start_ns"] - span["start_ns"] >= 3 * bin_ns:
        v.step_moved_s = max(0.0, (span["end_ns"] - e["start_ns"]) / 1e9)   # it began after clean time
    v.intermittent, v.episode_start = e.get("intermittent"), e.get("start")
    v.lost_s, v.slowdown = e.get("lost_s"), e.get("slowdown")
    return v


def window_lost(whatif):
    """explain's what-if as the watch's events and metrics carry it (its SQL left out), or None."""
    if not whatif:
        return None
    return {k: v for k, v in whatif.items() if k != "sql"}


class Tracker:
    """Verdicts in, events out: only when something changes (see the module docstring)."""

    def __init__(self, confirm=CONFIRM_TICKS, clear=CLEAR_TICKS, require_moved=True, hold=HOLD_TICKS):
        self.confirm, self.clear, self.require_moved, self.hold = confirm, clear, require_moved, max(hold, clear)
        self.current = None        # the Verdict of the straggler being reported (None: healthy)
        self.onset_mono_ns = None
        self._candidate, self._candidate_n = None, 0     # the name named in the last polls, how many in a row
        self._cause_candidate, self._cause_n = None, 0
        self._clear_n = 0
        self.node_state = {}       # address -> "ok" | "lost"
        self.imbalanced_mono_ns = None     # since when the job loses its time to imbalance (None: it does not)
        self._imb_n, self._bal_n = 0, 0
        self.last = None           # the last poll's verdict

    def imbalance(self, v, now_mono_ns=None):
        """The job's own loss, no node's: explain's imbalance finding over the time held (the slowest rank moving
        from rank to rank), in CONFIRM_TICKS measures in a row (one every WHATIF_EVERY_S) -> an "imbalance"
        event; gone for CLEAR_TICKS -> "balanced". A measure that could not be made changes nothing."""
        now = now_mono_ns or time.monotonic_ns()
        if not (v.whatif or {}).get("measured"):
            return []
        if v.imbalance:
            self._imb_n, self._bal_n = self._imb_n + 1, 0
        else:
            self._imb_n, self._bal_n = 0, self._bal_n + 1
        if self.imbalanced_mono_ns is None and self._imb_n >= self.confirm:
            self.imbalanced_mono_ns = now
            imb = v.whatif.get("imbalance") or {}
            return [dict(event="imbalance", summary=v.imbalance, lost_s=imb.get("lost_s"), span_s=v.whatif.get("span_s"),
                         slowest=imb.get("slowest"), window=v.whatif)]
        if self.imbalanced_mono_ns is not None and self._bal_n >= self.clear:
            lasted = round((now - self.imbalanced_mono_ns) / 1e9, 1)
            self.imbalanced_mono_ns = None
            return [dict(event="balanced", lasted_s=lasted, window=v.whatif)]
        return []

    def nodes(self, feeds):
        out = []
        for f in feeds:
            up = f.status in ANSWERED
            before = self.node_state.get(f.address)
            if not up and before != "lost":
                self.node_state[f.address] = "lost"
                out.append(dict(event="lost", node=f.node or f.address, address=f.address, status=f.status,
                                message=f.message))
            elif up and before == "lost":
                self.node_state[f.address] = "ok"
                out.append(dict(event="back", node=f.node or f.address, address=f.address))
            elif up:
                self.node_state[f.address] = "ok"
        return out

    def verdict(self, v, now_mono_ns=None):
        now = now_mono_ns or time.monotonic_ns()
        self.last = v
        events = []
        name = v.straggler
        if name is not None and name == self._candidate:
            self._candidate_n += 1
        else:
            self._candidate, self._candidate_n = name, 1 if name is not None else 0
        if self.current is None:
            if name is not None and self._candidate_n >= self.confirm and self._moved(v):
                self._start(v, now)
                events.append(_finding_event("onset", v))
            return events
        if name == self.current.straggler:
            self._clear_n = 0
            if v.cause == self.current.cause:
                self._cause_candidate, self._cause_n = None, 0
                self.current = v
                return events
            self._cause_n = self._cause_n + 1 if v.cause == self._cause_candidate else 1
            self._cause_candidate = v.cause
            if self._cause_n >= self.confirm:
                previous = self.current.cause
                self.current, self._cause_candidate, self._cause_n = v, None, 0
                events.append(dict(_finding_event("cause-change", v), previous_cause=previous))
            return events
        self._clear_n += 1
        switch = name is not None and self._candidate_n >= self.confirm and self._moved(v)
        closed = self.current.straggler not in v.may_resume or self._clear_n >= self.hold
        if (self._clear_n >= self.clear and closed) or switch:
            events.append(self._recovered(now, "another rank is the straggler now" if switch
                                          else "its straggle episode ended"))
            self.current = None
            if switch:
                self._start(v, now)
                events.append(_finding_event("onset", v))
        return events

    def _moved(self, v):
        """An onset is a change: its episode began after clean time (the job's step time moved), not
        only one rank be the slowest — a rank that always was is explain's to name."""
        return not self.require_moved or v.step_moved_s is not None

    def _start(self, v, now):
        self.current, self.onset_mono_ns = v, now
        self._cause_candidate, self._cause_n, self._clear_n = None, 0, 0

    def _recovered(self, now, reason):
        return dict(event="recovered", node=self.current.straggler, rank=self.current.rank, cause=self.current.cause,
                    lasted_s=round((now - self.onset_mono_ns) / 1e9, 1), lost_s=self.current.lost_s, reason=reason,
                    window=self.last.whatif if self.last is not None else None)


def _finding_event(kind, v):
    return dict(event=kind, node=v.straggler, rank=v.rank, pid=v.pid, cause=v.cause, share=v.share,
                wait_pct=v.wait_pct, others_wait_pct=v.others_wait_pct, step_moved_s=(
                    None if v.step_moved_s is None else round(v.step_moved_s, 1)), summary=v.summary,
                intermittent=v.intermittent, episode_start=v.episode_start, lost_s=v.lost_s, slowdown=v.slowdown,
                window=v.whatif)


# ---------------------------------------------------------------- the loop

class _Poller(threading.Thread):
    """Polls one feed every interval (its own thread: a slow or dead node delays nobody)."""

    def __init__(self, feed, live, interval_s, horizon_ns, lock, stop):
        super().__init__(name=f"straggler-watch-{feed.address}", daemon=True)
        self.feed, self.live, self.interval_s = feed, live, interval_s
        self.horizon_ns, self.lock, self.stop = horizon_ns, lock, stop
        self.polls = 0

    def run(self):
        while not self.stop.is_set():
            started = time.monotonic()
            status, answer, sample = self.live.get(self.feed.since_ns, self.feed.after_seq)
            with self.lock:
                try:
                    self.feed.apply(status, answer, sample, self.horizon_ns)
                except Exception as exc:    # (the live feed checks what the watch keys on): never stop polling
                    self.feed.status, self.feed.message = "sql-error", f"{self.feed.address}: {one_line(exc)}"
                self.polls += 1
            self.stop.wait(max(0.05, self.interval_s - (time.monotonic() - started)))
        self.live.close()


def watch(nodes, tls, interval_s=DEFAULT_INTERVAL_S, window_s=DEFAULT_WINDOW_S, baseline_s=DEFAULT_BASELINE_S,
          timeout_s=None, until_straggler=False, on_event=None, on_tick=None, stop=None, min_gap=None,
          request_timeout_s=None):
    """Watch the fleet until timeout_s (None: until `stop` is set or a signal), calling
    on_event(event dict) for every change. Returns (exit status, the events)."""
    from ..fleet.client import LiveFeed, parse_nodes
    if interval_s <= 0 or window_s <= 0 or baseline_s < 0:
        raise UsageError("--interval and --window must be > 0 seconds, --baseline >= 0")
    if window_s < 3 * interval_s:
        raise UsageError(f"--window {window_s:g} s holds fewer than 3 polls of --interval {interval_s:g} s")
    addresses = parse_nodes(nodes)
    stop = stop or threading.Event()
    lock = threading.Lock()
    horizon_ns = int((window_s + baseline_s + 2 * interval_s) * 1e9)
    request_timeout_s = request_timeout_s or max(2.0, 3 * interval_s)
    feeds = [NodeFeed(address=a) for a in addresses]
    tracker = Tracker()
    identity_refused = {}      # address -> why its answers are refused (refuse_shared_names)
    events = []
    started = time.monotonic()

    def emit(event):
        event = dict(event, time=datetime.datetime.now().astimezone().isoformat(timespec="milliseconds"),
                     mono_ns=time.monotonic_ns(), watch_s=round(time.monotonic() - started, 1))
        events.append(event)
        if on_event:
            on_event(event)

    from ..tls import client_context
    context = None if tls.no_tls else client_context(tls)
    pollers = [_Poller(f, LiveFeed(f.address, tls, request_timeout_s, context=context), interval_s, horizon_ns,
                       lock, stop) for f in feeds]
    emit(dict(event="start", nodes=addresses, interval_s=interval_s, window_s=window_s, baseline_s=baseline_s))
    for p in pollers:
        p.start()
    code = 0
    ever_answered = False
    try:
        next_tick = time.monotonic() + interval_s
        next_whatif, window = 0.0, (None, None)
        while not stop.is_set():
            if timeout_s is not None and time.monotonic() - started >= timeout_s:
                break
            stop.wait(max(0.0, next_tick - time.monotonic()))
            next_tick += interval_s
            if stop.is_set():
                break
            with lock:
                if any(p.polls == 0 for p in pollers) and time.monotonic() - started < request_timeout_s + interval_s:
                    continue   # the first answers are still coming
                refuse_shared_names(feeds, identity_refused)
                for e in tracker.nodes(feeds):
                    emit(e)
                ever_answered = ever_answered or any(f.status in ANSWERED for f in feeds)
                snap = snapshot(feeds, window_s)
                fresh = time.monotonic() >= next_whatif
                if fresh:
                    next_whatif = time.monotonic() + WHATIF_EVERY_S
                    try:
                        with_calls = snapshot(feeds, window_s, calls=True)
                    except Exception as exc:       # (a node's odd rows must not stop the watch)
                        with_calls, window = None, ({"measured": False, "why": f"the calls could not be read: "
                                                                              f"{one_line(exc)}"}, None)
            verdict = judge(snap, min_gap=min_gap)          # (the pollers go on meanwhile)
            if fresh and with_calls is not None:
                window = measure_window(with_calls, min_gap=min_gap)
            verdict.whatif, verdict.imbalance = window
            if on_tick:
                on_tick(verdict, feeds)
            for e in tracker.verdict(verdict) + (tracker.imbalance(verdict) if fresh else []):
                emit(e)
                if e["event"] == "onset" and until_straggler:
                    code = EXIT_STRAGGLER
                    stop.set()
    finally:
        stop.set()
        for p in pollers:
            p.join(timeout=request_timeout_s + 1)
    if code == 0 and not ever_answered:
        code = EXIT_NO_AGENT
    emit(dict(event="end", exit=code, straggler=tracker.current.straggler if tracker.current else None,
              window=tracker.last.whatif if tracker.last is not None else None,
              reason="straggler" if code == EXIT_STRAGGLER else "no agent answered" if code == EXIT_NO_AGENT
              else "stopped"))
    return code, events
