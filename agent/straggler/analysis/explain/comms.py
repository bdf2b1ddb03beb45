"""NCCL communicators across the cluster, and the collectives of each: pure functions over rows (no
SQL, no I/O), unit-tested on small tables.

A communicator is a process-local pointer (events.detail.comm): the same value on every call of one
communicator in one process, and meaningless on another node. Its set-up row says which cluster-wide
communicator it is:
  ncclCommInitRank(Config)  the unique id's magic (detail.id): the same on every rank of one communicator
                            (rank 0 makes the id and the job hands it to the others), with nranks and the
                            rank in it;
  ncclCommSplit             the parent's communicator and the color: the ranks of one parent that pass
                            one color make one new communicator.
A communicator whose set-up the agent did not see (made before the agent attached, or by a call it does
not trace, such as ncclCommInitAll) is known only on its own process: it is listed, but its members on
other nodes cannot be matched to it.

Where the peers wait: in a communicator's collectives when they block (gloo, NCCL's host-side waits);
with collectives that only enqueue (NCCL on GPUs) they wait in synchronize instead, and the calls'
times cannot tell which communicator holds them: explain then says so rather than pick one
(where_waited's thresholds).

In a synchronous job the ranks wait for the straggler inside the collectives of the communicators it is
a member of; with several (tensor-, pipeline-, data-parallel groups) the one its peers wait in most is
where it holds the job up, and its members are the ranks it delays first.
"""
import statistics
from dataclasses import dataclass, field

from ...probes.symbols import SETUP_OK   # ncclSuccess, or ncclInProgress from a non-blocking one


@dataclass
class Member:
    node: str
    pid: int
    rank: object = None          # the job's rank (torchrun RANK)
    comm_rank: object = None     # the rank in this communicator (ncclCommInitRank's rank argument)
    address: str = None          # the communicator's pointer in this process
    calls: int = 0               # recorded collective calls on it (recent window)
    dur_ns: int = 0              # their time
    ops: dict = field(default_factory=dict)     # op -> recorded calls

    @property
    def key(self):
        return (self.node, self.pid)


@dataclass
class Communicator:
    cid: str                     # "id 0x…" (init), "id 0x… / color C" (split), or "0x… on NODE pid P" (unseen)
    made_by: str = None          # ncclCommInitRank | ncclCommSplit | None (its set-up was not seen)
    nranks: object = None        # its size, when ncclCommInitRank said it
    members: list = field(default_factory=list)

    @property
    def matched(self):
        return self.made_by is not None

    def member(self, key):
        return next((m for m in self.members if m.key == key), None)

    @property
    def calls(self):
        return sum(m.calls for m in self.members)

    @property
    def dur_ns(self):
        return sum(m.dur_ns for m in self.members)

    def ops(self):
        out = {}
        for m in self.members:
            for op, n in m.ops.items():
                out[op] = out.get(op, 0) + n
        return out


def cluster_ids(setup_rows):
    """{(node, pid, address): (cid, made_by, nranks, comm_rank)} from the set-up rows (sql.comm_setups:
    node, pid, op, ts, ret, communicator, unique_id, nranks, comm_rank, parent, color).

    One pass in time order, so each set-up sees the communicators of its process as they were then: a
    split resolves its parent at once (a split of a split is named after the whole chain), and a later
    set-up at the same address (one destroyed, another made where it was) replaces the earlier one.
    The n-th communicator a process makes with the same name (two splits of one parent with one color,
    as for two groups of the same ranks; two inits with one fixed id, as with NCCL_COMM_ID) is "#n":
    every rank makes its communicators in the same order. A split whose parent was not seen is this
    process's view only (made_by None: its members elsewhere cannot be matched)."""
    rows = sorted(setup_rows, key=lambda r: int(r.get("ts") or 0))
    out, seen = {}, {}
    for r in rows:
        address = r.get("communicator")
        if r.get("ret") not in SETUP_OK + (None,) or not address or address == "0x0":
            continue
        node, pid = r["node"], int(r["pid"])
        if r["op"] == "ncclCommInitRank" and r.get("unique_id"):
            name, made_by, nranks, comm_rank = f"id {r['unique_id']}", "ncclCommInitRank", r.get("nranks"), r.get("comm_rank")
        elif r["op"] == "ncclCommSplit":
            parent = out.get((node, pid, r.get("parent")))
            if parent is None or parent[1] is None:
                out[(node, pid, address)] = (f"{r.get('parent')} / color {r.get('color')} on {node} pid {pid}", None,
                                             None, None)
                continue
            name, made_by, nranks, comm_rank = f"{parent[0]} / color {r.get('color')}", "ncclCommSplit", None, None
        else:
            continue
        n = seen[(node, pid, name)] = seen.get((node, pid, name), 0) + 1
        out[(node, pid, address)] = (name if n == 1 else f"{name} #{n}", made_by, nranks, comm_rank)
    return out


def group(setup_rows, collective_rows, ranks=None):
    """The cluster's communicators with their members' recorded collectives, the busiest first.

    collective_rows: {node, pid, communicator (its address), op, calls, dur_ns}; ranks: {(node, pid): job rank}."""
    ids = cluster_ids(setup_rows)
    ranks = ranks or {}
    comms, members = {}, {}           # cid -> Communicator; (cid, node, pid) -> Member (no scan per row)
    for r in collective_rows:
        address = r.get("communicator")
        if not address:
            continue
        node, pid = r["node"], int(r["pid"])
        cid, made_by, nranks, comm_rank = ids.get((node, pid, address)) or (f"{address} on {node} pid {pid}", None,
                                                                            None, None)
        c = comms.get(cid)
        if c is None:
            c = comms[cid] = Communicator(cid=cid, made_by=made_by, nranks=nranks)
        m = members.get((cid, node, pid))
        if m is None:
            m = members[(cid, node, pid)] = Member(node=node, pid=pid, rank=ranks.get((node, pid)), comm_rank=comm_rank,
                                                   address=address)
            c.members.append(m)
        m.calls += int(r.get("calls") or 0)
        m.dur_ns += int(r.get("dur_ns") or 0)
        m.ops[r["op"]] = m.ops.get(r["op"], 0) + int(r.get("calls") or 0)
    for c in comms.values():
        c.members.sort(key=lambda m: (m.comm_rank if m.comm_rank is not None else 1 << 30,
                                      m.rank if m.rank is not None else 1 << 30, m.node, m.pid))
    return sorted(comms.values(), key=lambda c: (-c.dur_ns, c.cid))


def where_waited(comms, straggler_key, wall_ns, min_share=0.05, min_ratio=2.0):
    """(communicator, the other members' median recorded collective time, the straggler's) for the
    communicator of the straggler's in which its peers spent the most time in collectives -- only when
    that wait is real: at least min_share of the window (wall_ns) and min_ratio times the straggler's own.
    None otherwise (it is in no communicator with peers, or they do not wait inside collective calls)."""
    best = None
    for c in comms:
        mine = c.member(straggler_key)
        others = [m.dur_ns for m in c.members if m.key != straggler_key]
        if mine is None or not others:
            continue
        med = statistics.median(others)
        if med < min_share * wall_ns or med < min_ratio * mine.dur_ns:
            continue
        if best is None or med > best[1]:
            best = (c, med, mine.dur_ns)
    return best
