"""Each rank's window of time: the span of its summaries, cut into its own baseline and the recent
part explain judges; and the inputs the model takes from the threads' sums (the calling thread)."""
from dataclasses import dataclass

from ...store.steptime import calling_thread


@dataclass(frozen=True, order=True)
class Window:
    """One rank's window on its node's CLOCK_MONOTONIC (ns): its own baseline and the recent part
    judged, each a tuple of disjoint segments ((lo, hi), ...) in time order. A fixed cut has one
    segment each ([t0, te) and [tb, t1); what lies between, a fault settling in, belongs to neither);
    an episode's recent part may be several (the on-phases of a fault that comes and goes)."""
    node: str
    pid: int
    baseline: tuple = ()
    recent: tuple = ()

    @classmethod
    def cut(cls, node, pid, t0, te, tb, t1):
        return cls(node, int(pid), ((int(t0), int(te)),) if te > t0 else (), ((int(tb), int(t1)),))

    @property
    def key(self):
        return (self.node, self.pid)

    @property
    def baseline_ns(self):
        return sum(hi - lo for lo, hi in self.baseline)

    @property
    def recent_ns(self):
        return sum(hi - lo for lo, hi in self.recent)

    @property
    def tb(self):
        """Where the recent part begins."""
        return self.recent[0][0] if self.recent else None

    @property
    def t1(self):
        """Where the recent part ends."""
        return self.recent[-1][1] if self.recent else None


def cut_windows(span_rows, opts, baseline_fraction, cut=None):
    """The fixed cut, a Window per rank: its span of intervals with calls, less the partial first and last
    interval, within the span judged (cut: span.Cut, each node's bounds on its clock), split into its own
    baseline [t0, te) and the recent part [tb, t1): from opts.recent_from_ns, or its last opts.recent_s, or
    after the first baseline_fraction of its span."""
    out = []
    for r in span_rows:
        step = int(r["interval_ns"] or 1)
        t0, t1 = int(r["first_ts"]), int(r["last_ts"])
        if t1 - t0 >= 4 * step:
            t0, t1 = t0 + step, t1 - step
        lo, hi = cut.bounds(r["node"]) if cut is not None else (None, None)
        if lo is not None:
            t0 = max(t0, int(lo))
        if hi is not None:
            t1 = min(t1, int(hi))
        if t1 <= t0:
            continue
        if opts.recent_from_ns is not None:
            tb = min(max(int(opts.recent_from_ns), t0), t1)
        elif opts.recent_s is not None:
            tb = max(t0, t1 - int(opts.recent_s * 1e9) // step * step)
        else:
            tb = t0 + int((t1 - t0) * baseline_fraction) // step * step
        te = tb if opts.baseline_until_ns is None else max(min(int(opts.baseline_until_ns), tb) // step * step, t0)
        out.append(Window.cut(r["node"], int(r["pid"]), t0, te, tb, t1))
    return out


def group_threads(rows):
    """{(node, pid): {part: [thread dicts]}}."""
    out = {}
    for r in rows:
        out.setdefault((r["node"], int(r["pid"])), {}).setdefault(r.get("part", "recent"), []).append(r)
    return out


def calling_tids(grouped):
    """The calling thread of each rank, chosen over its whole window."""
    out = {}
    for key, parts in grouped.items():
        merged = {}
        for rows in parts.values():
            for r in rows:
                acc = merged.setdefault(r["tid"], dict(tid=r["tid"], calls=0, work_ns=0, sync_ns=0, coll_ns=0))
                for c in ("calls", "work_ns", "sync_ns", "coll_ns"):
                    acc[c] += r.get(c) or 0
        main = calling_thread(list(merged.values()))
        if main is not None:
            out[key] = main["tid"]
    return out
