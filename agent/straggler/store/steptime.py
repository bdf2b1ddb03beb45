"""The step-time model's parts: a rank's wall time split into exclusive components, from the
agent's per-thread summaries (thread_time). Read by explain (which names the straggler), the
API's /metrics (per-rank gauges) and export (counter tracks) alike; pure functions, no SQL, no I/O.

A rank's calling thread (the thread with the most time in CUDA/NCCL calls) spends its wall time in
exclusive components (thread_time, written by the agent; ns over a window):
  work     on CPU inside work calls (launch, alloc, copy)
  sync     inside synchronize calls, not waiting for a CPU (the device's time; with NCCL on a
           GPU, also the wait for peers: collectives only enqueue)
  coll     inside collective calls, not waiting for a CPU (a blocking collective's wait for peers)
  runq     in the run queue: runnable, its CPU held by another task
  io       asleep outside calls while its process's own block I/O was in flight
  blocked  asleep outside calls otherwise (a CPU collective such as gloo waits here; locks)
  host     on CPU outside any traced call (data loading, Python, GC): the rest of the wall time
Its own other threads (a communication thread, for instance) can hold it up too: the time it
waited (coll/blocked) while its helpers sat in the run queue, up to that much, counts as its run
queue wait, not as a wait for peers ("helper_runq").

Waiting for peers is coll + blocked ("blocking"); in the enqueue style (NCCL on a GPU) it hides in
sync too ("enqueue").
"""
from dataclasses import dataclass, field

COMPONENTS = ("work", "sync", "coll", "runq", "io", "blocked", "host")
WAIT_DEFS = {"blocking": ("coll", "blocked"), "enqueue": ("coll", "blocked", "sync")}
# the components inside calls: their thread_time column, less the part of it spent in the run queue
IN_CALLS = {"work": ("work_ns", "runq_work_ns"), "sync": ("sync_ns", "runq_sync_ns"), "coll": ("coll_ns", "runq_coll_ns")}
OUTSIDE = {"runq": "runq_ns", "io": "io_ns", "blocked": "blocked_ns"}
(_WORK, _RUNQ_WORK), (_SYNC, _RUNQ_SYNC), (_COLL, _RUNQ_COLL) = IN_CALLS["work"], IN_CALLS["sync"], IN_CALLS["coll"]
_RUNQ, _IO, _BLOCKED = OUTSIDE["runq"], OUTSIDE["io"], OUTSIDE["blocked"]


@dataclass
class RankTime:
    """One rank's time over one window: shares (0..1) of wall time per component."""
    key: tuple                   # (node, pid)
    rank: object = None
    tid: int = None
    comm: str = None
    wall_ns: int = 0
    calls: int = 0
    ns: dict = field(default_factory=dict)        # component -> ns
    helper_runq_ns: int = 0                       # the part of runq that its own helper threads had
    raw: dict = field(default_factory=dict)       # the calling thread's thread_time sums, as queried

    def share(self, component):
        return self.ns.get(component, 0) / self.wall_ns if self.wall_ns else 0.0

    def wait_share(self, wait_def):
        return sum(self.share(c) for c in WAIT_DEFS[wait_def])


def thread_components(t, wall_ns):
    """Exclusive components (ns) of one thread's thread_time sums over a window of wall_ns."""
    g = t.get
    work = max(0, g(_WORK, 0) - g(_RUNQ_WORK, 0))
    sync = max(0, g(_SYNC, 0) - g(_RUNQ_SYNC, 0))
    coll = max(0, g(_COLL, 0) - g(_RUNQ_COLL, 0))
    runq, io, blocked = g(_RUNQ, 0), g(_IO, 0), g(_BLOCKED, 0)
    host = max(0, wall_ns - (work + sync + coll + runq + io + blocked))
    return dict(work=work, sync=sync, coll=coll, runq=runq, io=io, blocked=blocked, host=host)


def wait_share_sql(wait_def, wall="SUM(interval_ns)", agg="SUM"):
    """The calling thread's wait for its peers under `wait_def`, as a share of its wall time, in SQL over
    thread_time's columns summed by `agg` ('' for one row's) (thread_components' rule, before its
    helpers' run queue is moved out of it: what one thread's rows say alone)."""
    terms = [f"MAX(0, {agg}({IN_CALLS[c][0]}) - {agg}({IN_CALLS[c][1]}))" if c in IN_CALLS else f"{agg}({OUTSIDE[c]})"
             for c in WAIT_DEFS[wait_def]]
    return f"CAST({' + '.join(terms)} AS REAL) / MAX(1, {wall})"


def calling_thread(threads):
    """The thread of a process with the most time in traced calls (None if none made calls)."""
    best = max(threads, key=lambda t: (t.get("work_ns", 0) + t.get("sync_ns", 0) + t.get("coll_ns", 0),
                                       t.get("calls", 0)), default=None)
    if best is None or not best.get("calls"):
        return None
    return best


def rank_time(key, threads, wall_ns, rank=None, calling_tid=None):
    """RankTime of one process from its threads' thread_time sums over a window.

    calling_tid: which thread is the calling thread (chosen over the whole window, so the baseline
    and the recent part describe the same thread); by default the one with the most call time."""
    main = next((t for t in threads if t.get("tid") == calling_tid), None) if calling_tid is not None \
        else calling_thread(threads)
    if main is None or wall_ns <= 0:
        return None
    ns = thread_components(main, wall_ns)
    # the calling thread waits for one helper at a time (its communication thread, say): the most any
    # one helper sat in the run queue, not their sum (many threads queue at once on few cores)
    helper_runq = max((t.get("runq_ns", 0) for t in threads if t is not main), default=0)
    # its waits that its own helpers' run-queue time accounts for are its own delay, not peers'
    waited = ns["coll"] + ns["blocked"]
    moved = min(helper_runq, waited)
    if moved and waited:
        ns["coll"] -= int(moved * ns["coll"] / waited)
        ns["blocked"] = waited - moved - ns["coll"]
        ns["runq"] += moved
    return RankTime(key=key, rank=rank, tid=main.get("tid"), comm=main.get("comm"), wall_ns=wall_ns,
                    calls=main.get("calls", 0), ns=ns, helper_runq_ns=moved, raw=dict(main))
