"""Decode the kernel's fixed-size records (bpf/common.h `struct event`) into store rows.

A batch of raw records becomes rows for `events` (in the column order of EVENT_COLUMNS, without
seq/node, which the writer adds), and the per-interval aggregates of the sched and block
events (the calls' aggregates come from the kernel). `rank_of(pid)` supplies the torchrun
rank of a process. This module knows the record layout; it must not talk to BCC or SQLite.
"""
import json
import struct

from . import symbols

RECORD = struct.Struct("<QQQQQIIII6IHHI16s16s")  # bpf/common.h struct event (120 bytes)
EV_CALL, EV_SCHED, EV_BLOCK, EV_PROC = 1, 2, 3, 4
PROC_NEW, PROC_FORK, PROC_EXEC, PROC_EXIT, PROC_SETNS = 1, 2, 3, 4, 5
STATE_BLOCKED, STATE_PREEMPTED, STATE_UNKNOWN = 0, 1, 2
WHY_ALL, WHY_SLOW, WHY_OFFCPU, WHY_SAMPLE = 1, 2, 4, 8
WHY_NAMES = [(WHY_SLOW, "slow"), (WHY_OFFCPU, "offcpu"), (WHY_SAMPLE, "sample")]
NBUCKETS = 40

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
                if variant or why:
                    detail_dict = {}
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
                if op != STATE_UNKNOWN:
                    state = "preempted" if op == STATE_PREEMPTED else "blocked"
                    append((rank, local_rank, "sched", "offcpu", tgid, tid, thread_comm, ts, dur, None, None,
                            None, None, None, None, None, None, state, other_pid, comm_of(comm2), cpu,
                            None, None, None))
                    self._add(self.sched_aggs, (tgid, "offcpu"), dur)
                if a1:
                    append((rank, local_rank, "sched", "runq", tgid, tid, thread_comm, a1, a0, None, None,
                            None, None, None, None, None, None, None, None, None, flags, None, None, None))
                    self._add(self.sched_aggs, (tgid, "runq"), a0)
            elif kind == EV_BLOCK:
                rank, local_rank = rank_of(tgid)
                rwbs = comm_of(comm2)
                op_name = block_op(rwbs)
                append((rank, local_rank, "block", op_name, tgid, tid, comm_of(comm), ts, dur, None, a0,
                        None, None, None, None, None, None, None, None, None, cpu, dev_name(d0), a1,
                        json.dumps({"rwbs": rwbs, "device_ns": a2}, separators=(",", ":"))))
                self._add(self.block_aggs, (tgid, op_name), dur)
            elif kind == EV_PROC:
                notices.append((op, tgid, a0, comm_of(comm), ts))
        return rows, notices
