"""Decode the kernel's fixed-size records (bpf/common.h `struct event`) into store rows.

A batch of raw records becomes rows for `events` (in the column order of EVENT_COLUMNS, without
seq/node, which the writer adds), the per-interval aggregates of the sched and block events (the
calls' aggregates come from the kernel), and the per-thread part of the step-time model
(ThreadTime: run-queue wait by call class and by who held the CPU, blocked time outside calls
split into "on its own block I/O" and the rest). `rank_of(pid)` supplies the torchrun rank of a
process. This module knows the record layout; it must not talk to BCC or SQLite.
"""
import collections
import json
import struct

from . import symbols

RECORD = struct.Struct("<QQQQQIIII6IHHI16s16s")  # bpf/common.h struct event (120 bytes)
_PREV_COMM = struct.Struct("<4I")                 # sched: the previous task's comm in dims[0..3]
EV_CALL, EV_SCHED, EV_BLOCK, EV_PROC = 1, 2, 3, 4
PROC_NEW, PROC_FORK, PROC_EXEC, PROC_EXIT, PROC_SETNS = 1, 2, 3, 4, 5
STATE_BLOCKED, STATE_PREEMPTED, STATE_UNKNOWN = 0, 1, 2
WHY_ALL, WHY_SLOW, WHY_OFFCPU, WHY_SAMPLE, WHY_ERROR, WHY_SETUP, WHY_COLL, WHY_SYNC = 1, 2, 4, 8, 16, 32, 64, 128
WHY_NAMES = [(WHY_SLOW, "slow"), (WHY_OFFCPU, "offcpu"), (WHY_SAMPLE, "sample"), (WHY_ERROR, "error"),
             (WHY_SETUP, "setup"), (WHY_COLL, "collective"), (WHY_SYNC, "sync")]
NBUCKETS = 40
PREV_VALID, PREV_IN_SCOPE, PREV_TARGET = 1, 2, 4   # bpf/sched.c: what held the CPU before a switch-in
CLASS_NAMES = (None,) + symbols.CALL_CLASSES         # call class id -> name (0: outside any traced call)
# events.detail of sched rows: a handful of constant strings, made once (no json.dumps per event)
_IN_CALL_DETAIL = [None] + [json.dumps({"in_call": c}, separators=(",", ":")) for c in symbols.CALL_CLASSES]
# Who held the CPU while a traced thread waited in the run queue (runq rows: other_pid/other_comm,
# detail "by"; thread_time.thieves):
#   process  another process in the agent's scope (other_pid = its process id)
#   own      the same process (its other threads) or a child of it, e.g. dataloader workers
#   kernel   a kernel thread (kworker, ksoftirqd, ...)
#   outside  a task outside the agent's scope (another container / network namespace): no pid given
#   idle     nobody: the CPU was idle (the wait ended by a migration)
THIEF_KINDS = ("process", "own", "kernel", "outside", "idle")
_BY_DETAIL = {k: json.dumps({"by": k}, separators=(",", ":")) for k in THIEF_KINDS}
_RUNQ_BY_CLASS = ("runq_ns", "runq_work_ns", "runq_sync_ns", "runq_coll_ns")
MAX_THIEVES = 8            # per thread and interval, the top ones by run-queue wait
IO_WINDOW_NS = 30_000_000_000  # own block requests kept this long to match blocked intervals


def _ppid_of(pid):
    """The parent pid of a process from /proc (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class ThreadTime:
    """The per-thread, per-interval part of the step-time model that sched/block records give.

    For each traced thread: run-queue wait (runnable, CPU held by another task), split by the call
    class it was in (outside calls, work, sync, collective); blocked time outside any traced call,
    split into the part that overlaps block I/O its own process had in flight (io_ns) and the rest
    (blocked_ns: a CPU collective such as gloo, locks, sleeps); and who held the CPU during its
    run-queue waits, as (kind, pid, comm) -> ns. Time inside calls comes from the kernel
    (bpf/cuda.c thread_calls). take() returns and resets what accumulated since the last call."""

    def __init__(self):
        self.threads = {}                 # (tgid, tid) -> dict of ns + "thieves" + "comm"
        self.io = collections.defaultdict(collections.deque)   # tgid -> deque of (start, end) of its block requests
        self._kind_cache = {}             # (prev_tgid, comm) -> (is_kernel, ppid)

    def _thread(self, tgid, tid, comm):
        t = self.threads.get((tgid, tid))
        if t is None:
            t = self.threads[(tgid, tid)] = dict(runq_ns=0, runq_work_ns=0, runq_sync_ns=0, runq_coll_ns=0,
                                                 blocked_ns=0, io_ns=0, thieves={}, comm=comm)
        else:
            t["comm"] = comm
        return t

    def add_block(self, tgid, start, end):
        q = self.io[tgid]
        q.append((start, end))
        while q and (len(q) > 512 or q[0][1] < end - IO_WINDOW_NS):
            q.popleft()

    def _own_io_overlap(self, tgid, start, end):
        q = self.io.get(tgid)
        if not q:
            return 0
        spans = sorted((max(a, start), min(b, end)) for a, b in q if a < end and b > start)
        total, cur_a, cur_b = 0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    total += cur_b - cur_a
                cur_a, cur_b = a, b
            elif b > cur_b:
                cur_b = b
        if cur_b is not None:
            total += cur_b - cur_a
        return total

    def thief_kind(self, tgid, prev_tgid, prev_comm, flags):
        if not flags & PREV_VALID:
            return "idle"
        if prev_tgid == tgid:
            return "own"
        key = (prev_tgid, prev_comm)
        info = self._kind_cache.get(key)
        if info is None:
            ppid = _ppid_of(prev_tgid)
            info = (prev_tgid == 2 or ppid == 2 or (ppid == 0 and prev_tgid != 1), ppid)
            if len(self._kind_cache) > 16384:
                self._kind_cache.clear()
            self._kind_cache[key] = info
        if info[0]:
            return "kernel"          # kernel threads are in no namespace's scope: kernel work, not "outside"
        if not flags & PREV_IN_SCOPE:
            return "outside"
        if info[1] == tgid:
            return "own"
        return "process"

    def add_sched(self, tgid, tid, comm, state, ts, dur, runq_ns, in_call, kind, prev_pid, prev_comm):
        t = self._thread(tgid, tid, comm)
        if runq_ns:
            t[_RUNQ_BY_CLASS[0]] += runq_ns
            if in_call:
                t[_RUNQ_BY_CLASS[in_call]] += runq_ns
            key = (kind, prev_pid if kind in ("process", "own", "kernel") else None,
                   prev_comm if kind != "idle" else None)
            t["thieves"][key] = t["thieves"].get(key, 0) + runq_ns
        if state == STATE_BLOCKED and not in_call:
            sleep = max(0, dur - (runq_ns or 0))
            if sleep:
                io = min(sleep, self._own_io_overlap(tgid, ts, ts + sleep))
                t["io_ns"] += io
                t["blocked_ns"] += sleep - io

    def take(self):
        """{(tgid, tid): {...}} since the last take; thieves as [[kind, pid, comm, ns], ...] (top ones)."""
        out = self.threads
        self.threads = {}
        for t in out.values():
            ranked = sorted(t["thieves"].items(), key=lambda kv: -kv[1])[:MAX_THIEVES]
            t["thieves"] = [[k, pid, c, ns] for (k, pid, c), ns in ranked]
        return out

# events columns the decoder fills (the writer prepends seq, node)
EVENT_COLUMNS = ("rank", "local_rank", "source", "op", "pid", "tid", "comm", "ts", "duration", "ret", "bytes",
                 "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "state", "other_pid",
                 "other_comm", "cpu", "dev", "sector", "detail")


def log2_bucket(ns: int) -> int:
    """The histogram bucket of a duration, as the kernel computes it: floor(log2(ns)), capped."""
    return min(max(int(ns).bit_length() - 1, 0), NBUCKETS - 1)


def trim_hist(hist):
    """Histogram as stored: the list without trailing zero buckets."""
    end = len(hist)
    while end and not hist[end - 1]:
        end -= 1
    return list(hist[:end])


def dev_name(dev: int) -> str:
    """Kernel dev_t (major << 20 | minor) as 'major:minor'."""
    return f"{dev >> 20}:{dev & 0xfffff}"


def block_op(rwbs: str) -> str:
    if "W" in rwbs:
        return "block_write"
    if "R" in rwbs:
        return "block_read"
    return "block_other"


class Decoder:
    """Turns raw records into event rows, process notices and user-space aggregates."""

    def __init__(self, rank_of):
        self.rank_of = rank_of            # pid -> (rank, local_rank) or (None, None)
        self._comm_cache = {}
        self.sched_aggs = {}              # (pid, op) -> [count, sum, max, hist]
        self.block_aggs = {}
        self.thread_time = ThreadTime()
        self._symbol_info = [(s.source, s.op, s.arg_kind, None if s.name == s.op else s.name)
                             for s in symbols.SYMBOLS]

    def _comm(self, raw: bytes) -> str:
        comm = self._comm_cache.get(raw)
        if comm is None:
            comm = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            if len(self._comm_cache) > 65536:
                self._comm_cache.clear()
            self._comm_cache[raw] = comm
        return comm

    @staticmethod
    def _add(aggs, key, ns):
        agg = aggs.get(key)
        if agg is None:
            agg = aggs[key] = [0, 0, 0, [0] * NBUCKETS]
        agg[0] += 1
        agg[1] += ns
        if ns > agg[2]:
            agg[2] = ns
        agg[3][log2_bucket(ns)] += 1

    def take_aggregates(self):
        """{(pid, source, op): (count, sum, max, hist)} of sched/block since the last call."""
        out = {}
        for (pid, op), agg in self.sched_aggs.items():
            out[(pid, "sched", op)] = tuple(agg)
        for (pid, op), agg in self.block_aggs.items():
            out[(pid, "block", op)] = tuple(agg)
        self.sched_aggs, self.block_aggs = {}, {}
        return out

    def decode(self, raw_records, record_all=False):
        """(event rows, process notices [(what, tgid, parent, comm, ts)])."""
        rows, notices = [], []
        append = rows.append
        rank_of, comm_of, info = self.rank_of, self._comm, self._symbol_info
        for (ts, dur, a0, a1, a2, tgid, tid, other_pid, cpu, d0, d1, d2, d3, d4, d5, kind, op, flags,
             comm, comm2) in RECORD.iter_unpack(b"".join(raw_records)):
            if kind == EV_CALL:
                source, op_name, arg_kind, variant = info[op]
                rank, local_rank = rank_of(tgid)
                detail = None
                why = [name for bit, name in WHY_NAMES if flags & bit] if not flags & WHY_ALL else None
                nccl = arg_kind in symbols.ARG_NCCL_KINDS
                if variant or why or nccl:
                    detail_dict = symbols.nccl_detail(arg_kind, (d0, d1, d2, d3, d4, d5)) if nccl else {}
                    if variant:
                        detail_dict["symbol"] = variant
                    if why:
                        detail_dict["why"] = why
                    detail = json.dumps(detail_dict, separators=(",", ":"))
                ret = a1 & 0xffffffff
                if ret >= 0x80000000:
                    ret -= 0x100000000
                has_dims = arg_kind in symbols.ARG_HAS_DIMS
                append((rank, local_rank, source, op_name, tgid, tid, comm_of(comm), ts, dur, ret,
                        a0 if arg_kind in symbols.ARG_HAS_BYTES else None,
                        d0 if has_dims else None, d1 if has_dims else None, d2 if has_dims else None,
                        d3 if has_dims else None, d4 if has_dims else None, d5 if has_dims else None,
                        None, None, None, cpu, None, None, detail))
            elif kind == EV_SCHED:
                rank, local_rank = rank_of(tgid)
                thread_comm = comm_of(comm)
                in_call = d4 if d4 < len(CLASS_NAMES) else 0
                prev_flags, prev_tgid = a2 >> 32, a2 & 0xffffffff
                prev_comm = comm_of(_PREV_COMM.pack(d0, d1, d2, d3)) if prev_flags & PREV_VALID else None
                by = self.thread_time.thief_kind(tgid, prev_tgid, prev_comm, prev_flags) if a1 else None
                if op != STATE_UNKNOWN:
                    state = "preempted" if op == STATE_PREEMPTED else "blocked"
                    append((rank, local_rank, "sched", "offcpu", tgid, tid, thread_comm, ts, dur, None, None,
                            None, None, None, None, None, None, state, other_pid, comm_of(comm2), cpu,
                            None, None, _IN_CALL_DETAIL[in_call]))
                    self._add(self.sched_aggs, (tgid, "offcpu"), dur)
                if a1:
                    shown = by in ("process", "own", "kernel")
                    append((rank, local_rank, "sched", "runq", tgid, tid, thread_comm, a1, a0, None, None,
                            None, None, None, None, None, None, None, prev_tgid if shown else None,
                            prev_comm, flags, None, None, _BY_DETAIL[by]))
                    self._add(self.sched_aggs, (tgid, "runq"), a0)
                self.thread_time.add_sched(tgid, tid, thread_comm, op, ts, dur, a0 if a1 else 0, in_call, by,
                                           prev_tgid, prev_comm)
            elif kind == EV_BLOCK:
                rank, local_rank = rank_of(tgid)
                rwbs = comm_of(comm2)
                op_name = block_op(rwbs)
                append((rank, local_rank, "block", op_name, tgid, tid, comm_of(comm), ts, dur, None, a0,
                        None, None, None, None, None, None, None, None, None, cpu, dev_name(d0), a1,
                        json.dumps({"rwbs": rwbs, "device_ns": a2}, separators=(",", ":"))))
                self._add(self.block_aggs, (tgid, op_name), dur)
                self.thread_time.add_block(tgid, ts, ts + dur)
            elif kind == EV_PROC:
                notices.append((op, tgid, a0, comm_of(comm), ts))
        return rows, notices
