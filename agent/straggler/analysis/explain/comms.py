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
A communicator whose set-up the agent did not see (it attached after the job had made it) is known only
on its own process: it is listed, but its members on other nodes cannot be matched to it.

In a synchronous job the ranks wait for the straggler inside the collectives of the communicators it is
a member of; with several (tensor-, pipeline-, data-parallel groups) the one its peers wait in most is
where it holds the job up, and its members are the ranks it delays first.
"""
from dataclasses import dataclass, field


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
    node, pid, op, ts, ret, communicator, id, nranks, comm_rank, parent, color; successful ones only). A process's later set-up of the same address (a communicator destroyed
    and another made where it was) replaces the earlier one. Splits are resolved through their parent,
    so a split of a split is named after the whole chain."""
    rows = sorted(setup_rows, key=lambda r: (int(r.get("ts") or 0)))
    out, splits = {}, []
    for r in rows:
        d = r
        address = d.get("communicator")
        if (r.get("ret") not in (0, None)) or not address or address == "0x0":
            continue
        key = (r["node"], int(r["pid"]), address)
        if r["op"] == "ncclCommInitRank" and d.get("id"):
            out[key] = (f"id {d['id']}", "ncclCommInitRank", d.get("nranks"), d.get("comm_rank"))
        elif r["op"] == "ncclCommSplit":
            splits.append((key, d))
    for _ in range(8):                  # a split of a split: resolve in rounds (bounded)
        left = []
        for key, d in splits:
            parent = out.get((key[0], key[1], d.get("parent")))
            if parent is None:
                left.append((key, d))
                continue
            out[key] = (f"{parent[0]} / color {d.get('color')}", "ncclCommSplit", None, None)
        if len(left) == len(splits):
            break
        splits = left
    for key, d in splits:               # the parent's set-up was not seen: this process's view only
        out[key] = (f"{d.get('parent')} / color {d.get('color')} on {key[0]} pid {key[1]}", "ncclCommSplit", None, None)
    return out


def group(setup_rows, collective_rows, ranks=None):
    """The cluster's communicators with their members' recorded collectives, the busiest first.

    collective_rows: {node, pid, communicator (its address), op, calls, dur_ns}; ranks: {(node, pid): job rank}."""
    ids = cluster_ids(setup_rows)
    ranks = ranks or {}
    comms = {}
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
        m = c.member((node, pid))
        if m is None:
            m = Member(node=node, pid=pid, rank=ranks.get((node, pid)), comm_rank=comm_rank, address=address)
            c.members.append(m)
        m.calls += int(r.get("calls") or 0)
        m.dur_ns += int(r.get("dur_ns") or 0)
        m.ops[r["op"]] = m.ops.get(r["op"], 0) + int(r.get("calls") or 0)
    for c in comms.values():
        c.members.sort(key=lambda m: (m.comm_rank if m.comm_rank is not None else 1 << 30,
                                      m.rank if m.rank is not None else 1 << 30, m.node, m.pid))
    return sorted(comms.values(), key=lambda c: (-c.dur_ns, c.cid))


def where_waited(comms, straggler_key):
    """(communicator, the other members' median recorded time, the straggler's) for the communicator of
    the straggler in which its peers spent the most time in collectives; None if it is in none with peers."""
    best = None
    for c in comms:
        mine = c.member(straggler_key)
        others = sorted(m.dur_ns for m in c.members if m.key != straggler_key)
        if mine is None or not others:
            continue
        med = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
        if best is None or med > best[1]:
            best = (c, med, mine.dur_ns)
    return best
