"""The rules that name the straggler and its causes: pure functions over rows (dicts), no SQL,
no I/O, so each rule is unit-tested on small tables.

The physics of a synchronous job: every rank waits for the slowest one at every collective, so
the straggler is the rank that WAITS LEAST for its peers, and the cause is the part of its own step
time that is larger than the other ranks' (and grew against its own baseline). A rank's time is
split into components by straggler.store.steptime (RankTime).

Waiting for peers is coll + blocked; in the enqueue style (NCCL on a GPU) it hides in sync, so
the definition that separates the ranks more is used (`choose_wait`). Cause classes map the
straggler's excess components: runq -> cpu-contention / self-contention (by who held the CPU),
host -> host-compute, sync -> gpu-slow, work -> cuda-calls, io -> io-self / io-other; what no
component explains is `unknown`. A rank that launches more kernels per collective than the others, or
bigger ones (their grids, from the recorded launches), does more work per step (a pipeline stage with
more layers, a longer batch): the part of its sync and work excess that work accounts for is
`more-work` (work_ratio), the rest stays gpu-slow/cuda-calls.
"""
import statistics
from dataclasses import dataclass, field

from ...store.steptime import COMPONENTS, WAIT_DEFS

# which class an excess component is evidence of: causes.COMPONENT_CAUSE (runq and io split further by the evidence)
OWN_KINDS = ("own", "sibling")  # thieves that are the job itself: the trainer (or its children), or another
                                # rank of the same job on the node (explain marks those "sibling")


@dataclass
class ModelOptions:
    min_gap: float = 0.15        # the straggler waits at least this share of wall time less than the others' median
    max_wait_ratio: float = 0.8  # ... and at most this fraction of the others' median wait (every rank also waits
                                 # for the collective's own transfer: a small fault leaves the straggler a share)
    consistency: float = 0.6     # ... in at least this share of the window's slices
    min_cause_share: float = 0.1 # a cause finding needs at least this share of the straggler's excess
    enqueue_margin: float = 0.02 # counting sync as waiting must separate the ranks by this much more
    max_step_rate_ratio: float = 1.25   # a rank calling collectives at a rate this different from the others' (or,
                                        # where the collectives are not counted, CUDA calls) is not in lockstep
    more_work_ratio: float = 1.15       # a rank launching this many times the others' work per collective (kernels x
                                        # their size) does more work per step: a cause of its own (more-work), not a
                                        # slow device
    same_speed_ratio: float = 1.25      # ... and when its time per kernel (in synchronize, in launches) is at most
                                        # this times the others', its kernels run as fast as theirs: all of that
                                        # excess is the extra kernels (GPU work overlaps host work, so the time
                                        # per kernel a rank waits is not exact)
    wait_def: str = None         # the job's wait definition when it is known (from its whole trace: where its
                                 # ranks wait); None: chosen here, by the one that separates the ranks more


def median(values):
    return statistics.median(values) if values else 0.0


def separation(ranks, wait_def, exclude=()):
    """(the rank that waits least, its wait share, the median of the others, gap) under wait_def."""
    pool = [r for r in ranks if r.key not in exclude]
    if len(pool) < 2:
        return None
    least = min(pool, key=lambda r: r.wait_share(wait_def))
    others = [r.wait_share(wait_def) for r in pool if r is not least]
    med = median(others)
    return least, least.wait_share(wait_def), med, med - least.wait_share(wait_def)


def choose_wait(ranks, opts):
    """'blocking' (peers are waited for in collectives / blocked) or 'enqueue' (also in sync):
    the job's own when it is known (opts.wait_def), else the one under which the least-waiting rank stands
    out more (enqueue only by a margin)."""
    if opts.wait_def is not None:
        return opts.wait_def
    blocking = separation(ranks, "blocking")
    enqueue = separation(ranks, "enqueue")
    if blocking is None or enqueue is None:
        return "blocking"
    return "enqueue" if enqueue[3] > blocking[3] + opts.enqueue_margin else "blocking"


def lower_in_slices(candidate_key, slices, wait_def, min_gap):
    """Per slice (lists of RankTime over short windows, in time order): True where the candidate waits
    at least min_gap/2 less than the others' median, False where it does not, None where it or the
    others have no data."""
    out = []
    for ranks in slices:
        mine = next((r for r in ranks if r.key == candidate_key), None)
        others = [r.wait_share(wait_def) for r in ranks if r.key != candidate_key]
        if mine is None or not others:
            out.append(None)
        else:
            out.append(median(others) - mine.wait_share(wait_def) >= min_gap / 2)
    return out


def consistent_share(candidate_key, slices, wait_def, min_gap):
    """Share of the slices in which the candidate waits at least min_gap/2 less than the others' median."""
    judged = [x for x in lower_in_slices(candidate_key, slices, wait_def, min_gap) if x is not None]
    return sum(judged) / len(judged) if judged else 0.0


@dataclass
class Verdict:
    stragglers: list = field(default_factory=list)   # [dict(rank=RankTime, wait, others_median, gap, consistency)]
    wait_def: str = "blocking"
    rejected: list = field(default_factory=list)     # [(RankTime, reason)]


def collective_rates(ranks, mix):
    """{key: collectives per second} of the ranks whose collectives the aggregates counted (mix: {key:
    {"launches", "collectives"}} over the same time as the ranks')."""
    out = {}
    for r in ranks:
        m = (mix or {}).get(r.key)
        if m and m.get("collectives") and r.wall_ns:
            out[r.key] = m["collectives"] / (r.wall_ns / 1e9)
    return out


def out_of_lockstep(key, ranks, coll, ratio):
    """Why the rank `key` is not in lockstep with the others, or None (coll: collective_rates). Ranks in
    lockstep call the same collectives as often (one step, one set of collectives); how much work they
    launch between them may differ (a stage with more layers, a longer batch): that is more work, not
    another rhythm. Where the collectives are not counted, a rank calling CUDA far more often than the others
    is out of lockstep."""
    if key in coll and len(coll) >= 2:
        med = median([v for k, v in coll.items() if k != key])
        if med > 0 and not 1 / ratio <= coll[key] / med <= ratio:
            return (f"calls collectives ×{coll[key] / med:.2f} as often as the others: not in lockstep with them (another "
                    f"step count or communicator)")
        return None
    rates = {r.key: r.calls / r.wall_ns for r in ranks if r.wall_ns}
    other_rates = [v for k, v in rates.items() if k != key]
    if other_rates and rates.get(key, 0) > ratio * median(other_rates):
        return "calls CUDA far more often than the others: not in lockstep with them"
    return None


SIZE_MIN_LAUNCHES = 20    # a rank's kernels are sized from at least this many recorded launches
SIZE_MIN_Z = 3.0          # ... and their mean differs from the others' by this many standard errors: sampled
                          # launches of a mix of small and large kernels are no evidence of bigger ones


@dataclass(frozen=True)
class Work:
    """How much more work a rank launches per step than the others (work_ratio): its kernels per collective
    and the others' median, and the size of its kernels against the others' (threads per kernel, from the
    recorded launches; set where they differ beyond their sampling)."""
    kernels: float                 # its kernels per collective
    others_kernels: float          # the other ranks' median
    threads: float = None          # its mean threads per kernel, where its kernels' size differs from the others'
    others_threads: float = None
    sized: int = 0                 # its recorded launches that carry their dimensions (0: its sizes not compared)

    @property
    def kernels_ratio(self):
        return self.kernels / self.others_kernels

    @property
    def size_ratio(self):
        return self.threads / self.others_threads if self.threads and self.others_threads else 1.0

    @property
    def ratio(self):
        """Its work per step over the others': more kernels, bigger kernels, or both."""
        return self.kernels_ratio * self.size_ratio


def _size(m):
    """(mean, standard error of the mean, n) of a rank's recorded kernel sizes, or None (too few). The error is
    the larger of the launches' (as if each were drawn alone) and the pieces' (sql.launch_sizes reads launches
    in runs: one piece may hold a step's small kernels, the next its large ones)."""
    n = int((m or {}).get("sized") or 0)
    if n < SIZE_MIN_LAUNCHES or not m.get("threads"):
        return None
    mean = float(m["threads"])
    var = max(0.0, float(m.get("threads_sq") or 0.0) - mean * mean)
    se = (var / n) ** 0.5
    pieces = int(m.get("pieces") or 0)
    if pieces >= 2 and m.get("piece_mean") is not None and m.get("piece_mean_sq") is not None:
        between = max(0.0, float(m["piece_mean_sq"]) - float(m["piece_mean"]) ** 2)
        se = max(se, (between / (pieces - 1)) ** 0.5)
    return mean, se, n


def kernel_sizes(key, other_keys, mix):
    """(its mean threads per kernel, the other ranks' median, its sized launches, whether the two differ beyond
    what their sampling says: SIZE_MIN_Z standard errors) where it and at least one other rank have
    SIZE_MIN_LAUNCHES sized launches, else None (not compared)."""
    mine = _size((mix or {}).get(key))
    others = [s for s in (_size((mix or {}).get(k)) for k in other_keys) if s is not None]
    if mine is None or not others:
        return None
    ref, ref_se = median([s[0] for s in others]), median([s[1] for s in others])
    differ = ref > 0 and abs(mine[0] - ref) > SIZE_MIN_Z * (mine[1] ** 2 + ref_se ** 2) ** 0.5
    return mine[0], ref, mine[2], differ


def work_ratio(key, other_keys, mix):
    """How much more work the rank `key` launches per step than the others, a Work: its kernels per collective
    against the others' median, times how much bigger its kernels are (kernel_sizes: a longer batch launches
    the same kernels on bigger grids), or None where the aggregates did not count its kernels."""
    def per_step(k):
        m = (mix or {}).get(k)
        return m["launches"] / m["collectives"] if m and m.get("collectives") and m.get("launches") is not None else None
    mine = per_step(key)
    others = [v for v in (per_step(k) for k in other_keys) if v is not None]
    if mine is None or not others or median(others) <= 0:
        return None
    sizes = kernel_sizes(key, other_keys, mix)
    if sizes is None:
        return Work(mine, median(others))
    if not sizes[3]:
        return Work(mine, median(others), sized=sizes[2])
    return Work(mine, median(others), threads=sizes[0], others_threads=sizes[1], sized=sizes[2])


def heavier_ranks(ranks, mix, opts):
    """The ranks, all on one node, that launch more work per collective than the others (work_ratio at
    more_work_ratio or more) while in lockstep with them (out_of_lockstep: their collectives as often — a rank
    of another rhythm or communicator group has kernels per collective of its own): (node, [(key, Work)]), or
    None — none, or ranks on several nodes."""
    coll = collective_rates(ranks, mix)
    found = []
    for r in ranks:
        work = work_ratio(r.key, [o.key for o in ranks if o.key != r.key], mix)
        if work is not None and work.ratio >= opts.more_work_ratio \
                and out_of_lockstep(r.key, ranks, coll, opts.max_step_rate_ratio) is None:
            found.append((r.key, work))
    nodes = {key[0] for key, _ in found}
    return (nodes.pop(), found) if len(nodes) == 1 else None


def find_stragglers(ranks, slices, opts, max_nodes=2, max_ranks=64, mix=None):
    """The rank(s) that wait materially and consistently less than the others, ranked; at most
    `max_nodes` nodes (all the straggling ranks of each: one slow GPU of eight is one rank, CPU contention
    on a node all of its ranks).

    `ranks`: RankTime over the recent window, one per rank; `slices`: lists of RankTime over short
    parts of it; mix: each rank's kernels and collectives over the same time (the lockstep test). A
    machine-wide change moves every rank's wait alike and names none."""
    verdict = Verdict(wait_def=choose_wait(ranks, opts))
    if len(ranks) < 2:
        return verdict
    coll = collective_rates(ranks, mix)
    named = []
    for _ in range(min(max_ranks, len(ranks) - 1)):
        sep = separation(ranks, verdict.wait_def, exclude=[s["rank"].key for s in named])
        if sep is None:
            break
        least, wait, med, gap = sep
        nodes = {s["rank"].key[0] for s in named}
        if least.key[0] not in nodes and len(nodes) >= max_nodes:
            break
        if named:   # a later one is compared with the ranks that are none of them
            rest = [r.wait_share(verdict.wait_def) for r in ranks
                    if r.key != least.key and r.key not in {s["rank"].key for s in named}]
            if not rest:
                break
            med = median(rest)
            gap = med - wait
        if gap < opts.min_gap or wait > opts.max_wait_ratio * med:
            if not named:
                verdict.rejected.append((least, f"waits {wait:.0%} vs {med:.0%} median of the others: not materially less"))
            break
        consistency = consistent_share(least.key, slices, verdict.wait_def, opts.min_gap)
        if slices and consistency < opts.consistency:
            verdict.rejected.append((least, f"waits less only in {consistency:.0%} of the window's slices"))
            break
        apart = out_of_lockstep(least.key, ranks, coll, opts.max_step_rate_ratio)
        if apart:
            verdict.rejected.append((least, apart))
            break
        named.append(dict(rank=least, wait=wait, others_median=med, gap=gap, consistency=consistency))
    verdict.stragglers = named
    return verdict


def by_node(stragglers):
    """The named ranks grouped by node, in the order the nodes were first named: [[straggler dict]]."""
    groups = {}
    for s in stragglers:
        groups.setdefault(s["rank"].key[0], []).append(s)
    return list(groups.values())


def excess(straggler, others, wait_def, baseline=None):
    """The straggler's components above the others' median (share of wall time), and the excess
    its peers waited for it (the others' median wait minus its own).

    baseline: {key: RankTime over the baseline}. With the straggler's and some other rank's, what it
    already had above the others then is not part of its excess now: the cause is what GREW against
    the others (a rank pinned to a busy core always queues a little more; that is not why it
    straggles now)."""
    own = [c for c in COMPONENTS if c not in WAIT_DEFS[wait_def]]
    base = (baseline or {}).get(straggler.key)
    others_base = [(baseline or {}).get(o.key) for o in others]
    others_base = [b for b in others_base if b is not None and b.wall_ns]
    use_base = base is not None and base.wall_ns and others_base
    out = {}
    for c in own:
        gap = straggler.share(c) - median([o.share(c) for o in others])
        if use_base:
            gap -= max(0.0, base.share(c) - median([b.share(c) for b in others_base]))
        out[c] = max(0.0, gap)
    total = median([o.wait_share(wait_def) for o in others]) - straggler.wait_share(wait_def)
    if use_base:
        total -= max(0.0, median([b.wait_share(wait_def) for b in others_base]) - base.wait_share(wait_def))
    return out, max(total, 0.0)


def thief_growth(recent, baseline, recent_s, baseline_s):
    """Who held the straggler's CPU: {(kind, pid, comm): ns/s grown over the baseline} (the recent
    rate when there is no baseline). `recent`/`baseline`: {(kind, pid, comm): ns}."""
    out = {}
    for key, ns in recent.items():
        rate = ns / recent_s if recent_s > 0 else 0.0
        base = (baseline.get(key, 0) / baseline_s) if baseline_s > 0 else 0.0
        if rate - base > 0:
            out[key] = rate - base
    return out


def split_runq(thieves):
    """(own share, others share) of the run-queue excess from thief_growth: the trainer's own
    threads and children vs everyone else."""
    own = sum(v for (kind, _, _), v in thieves.items() if kind in OWN_KINDS)
    other = sum(v for (kind, _, _), v in thieves.items() if kind not in OWN_KINDS)
    total = own + other
    if total <= 0:
        return 0.0, 1.0
    return own / total, other / total


def classify_io(own_bytes_recent, own_bytes_base, others_bytes_recent, recent_s, base_s):
    """io-other when other processes' block I/O dwarfs the trainer's own and the trainer's own did not
    grow (it got slower, not bigger); else io-self."""
    own_rate = own_bytes_recent / recent_s if recent_s > 0 else 0.0
    base_rate = own_bytes_base / base_s if base_s > 0 else 0.0
    others_rate = others_bytes_recent / recent_s if recent_s > 0 else 0.0
    grew = own_rate > 1.5 * base_rate if base_s > 0 else True
    if others_rate > 2 * own_rate and not grew:
        return "io-other"
    return "io-self"


def copy_share(own_bytes_recent, own_bytes_base, recent_s, base_s, bytes_per_s):
    """The least share of its time a rank spent copying the block I/O it issued (written data goes into the
    page cache on its own CPU, at most bytes_per_s): its I/O rate grown over its baseline, / bytes_per_s.
    To the step-time model that CPU is host compute; its cause is the rank's own I/O."""
    if recent_s <= 0 or bytes_per_s <= 0:
        return 0.0
    grown = own_bytes_recent / recent_s - (own_bytes_base / base_s if base_s > 0 else 0.0)
    return max(0.0, grown) / bytes_per_s

