"""explain's findings: what each one says, with its numbers, the SQL behind each number and a
recommendation — the straggler and its causes, the waiters, the communicators, no straggler,
call errors, missing nodes and lost events. Each takes the analysis' Context (engine.py) and appends
Findings to the Report; the decisions themselves are model.py's (and comms.py's)."""
from typing import NamedTuple

from ...probes import symbols
from ...text import fmt_bytes, fmt_ns as _fmt_ns
from . import comms as comms_model, model, sql
from .causes import (CAUSE_CLASSES, DEVICE_RECOMMENDATION, DEVICE_WORDS, IMBALANCE_RECOMMENDATION,
                     MORE_WORK_RECOMMENDATION, ONE_RANK_RECOMMENDATION, NET_RECOMMENDATION, NET_WORDS, SIMPLE_CAUSES)
from .report import Finding



def _fmt_bytes(b):
    return fmt_bytes(b or 0)


def error_findings(report, runner, cut=None):
    """cuda-errors: a node whose CUDA/NCCL calls return errors (a lost GPU, an ECC error, a driver
    mismatch) is not fast, it is broken: which calls, which codes, since when, and what share of
    all its calls failed."""
    errors_sql = sql.call_errors(cut)
    rows = runner.rows(errors_sql)
    if not rows:
        return
    counts_sql = sql.call_counts(cut)
    totals = {r["node"]: int(r["calls"] or 0) for r in runner.rows(counts_sql)}
    by_node = {}
    for r in rows:
        by_node.setdefault(r["node"], []).append(r)
    for node, found in by_node.items():
        failed = sum(int(r["failed"]) for r in found)
        calls = max(totals.get(node, 0), failed)
        share = failed / calls if calls else 1.0
        first, last = min(int(r["first_ts"]) for r in found), max(int(r["last_ts"]) for r in found)
        codes = "; ".join(f"{r['op']} → {symbols.error_name(r['source'], int(r['ret']))} ×{int(r['failed']):,}"
                          for r in found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")
        numbers = {"failed_calls": failed, "calls": calls, "failed_pct": round(100 * share, 1)}
        sources = {"calls": dict(sql="calls", match={"node": node}, column="calls"),
                   "failed_calls": dict(sql="errors", match={"node": node}, column="failed", sum=True)}
        for r in found[:6]:
            key = f"failed.{r['op']}.{int(r['ret'])}"
            numbers[key] = int(r["failed"])
            sources[key] = dict(sql="errors", match={"node": node, "op": r["op"], "ret": int(r["ret"])}, column="failed")
        report.findings.append(Finding(
            severity="critical" if share >= 0.5 else "warning", node=node, cause="cuda-errors",
            summary=(f"{node}: {failed:,} of its {calls:,} CUDA/NCCL calls returned an error ({share:.0%}) over "
                     f"{_fmt_ns(last - first)} from the first: {codes}"),
            numbers=numbers, sources=sources, sql={"errors": errors_sql.strip(), "calls": counts_sql.strip()},
            recommendation=(f"check the GPU, driver and NCCL set-up on {node} (nvidia-smi; dmesg for Xid errors; the "
                            "driver and runtime versions): a node whose calls fail is broken, not fast"),
            share=share, at_ns=first, window_ns=[first, last]))


ONE_RANK_SHARE = 0.5        # the time lost falls on one rank when it was the slowest at more than this share of the
                            # sync points no episode holds (and 1.5 times its fair share: 3 of 4 with two ranks)


def imbalance_finding(whatif, n_ranks):
    """The job's time lost at sync points where its slowest rank was none an episode names (steps.py): imbalance
    that moves between ranks, and jitter — a finding of the job, no node's. Where one rank was the slowest at
    most of them, it says so: a rank late at every step that no episode names (a gap too small in each step,
    or collectives that only enqueue, where the ranks' time shares are alike)."""
    imb = whatif["imbalance"]
    points = imb["sync_points"] or 1
    fell = "; ".join(f"{r['node']} (rank {r['rank']}) {r['sync_points'] / points:.0%}" for r in imb["slowest"])
    top = imb["slowest"][0]["sync_points"] / points if imb["slowest"] else 0.0
    moves = top <= max(ONE_RANK_SHARE, 1.5 / max(2, n_ranks))
    share = imb["lost_s"] / whatif["span_s"] if whatif["span_s"] else 0.0
    numbers = {"lost_s": imb["lost_s"], "lost_ratio": round(share, 3), "sync_points": imb["sync_points"],
               "job_sync_points": whatif["sync_points"], "span_s": whatif["span_s"],
               **{f"{r['node']}.rank{r['rank']}.slowest": r["sync_points"] for r in imb["slowest"]}}
    lost = (f"the job lost {imb['lost_s']:g} s ({share:.0%} of its {whatif['span_s']:g} s) waiting for its slowest rank "
            f"at {imb['sync_points']:,} of its {whatif['sync_points']:,} sync points where no episode was — what if every "
            f"rank had taken the median rank's time at each; slowest there: {fell or 'nobody'}")
    if moves:
        summary = f"imbalance that moves between ranks: {lost} (" + (
            "no rank stands out: it moves from rank to rank)" if top <= 2.0 / max(2, n_ranks) else
            "the one most often slowest still too little each time to be a straggler episode)")
    else:
        first = imb["slowest"][0]
        summary = (f"time lost to one rank that no episode names: {lost} — {first['node']} (rank {first['rank']}) "
                   f"came last at {top:.0%} of them ("
                   + ("its time shares were like the others': with collectives that only enqueue every rank "
                      "waits in synchronize alike" if whatif.get("waited_in") == "synchronize" else
                      "too little each time to be a straggler episode") + ")")
    return Finding(severity="warning", node=None, cause="imbalance", summary=summary, numbers=numbers,
                   sql=dict(whatif["sql"]), share=round(share, 3),
                   recommendation=IMBALANCE_RECOMMENDATION if moves else ONE_RANK_RECOMMENDATION)


def missing_finding(report, ctx, world, spans_sql):
    """Nodes that did not answer, or ranks the job has (world_size) but no node holds: a straggler
    could hide among them."""
    if not report.missing:
        return
    ranks = ctx.ranks
    names = ", ".join(f"{m['node']} ({m['status']})" for m in report.missing)
    doubt = (f"a rank among the missing could be slower than {report.straggler}" if report.straggler
             else "a straggler among the missing nodes cannot be seen from here")
    report.findings.append(Finding(
        severity="warning", node=None, cause="missing-nodes",
        summary=f"{len(report.missing)} node(s) missing: {names}; the comparison used {len(ranks)} rank(s): {doubt}",
        numbers={"ranks_with_data": len(ranks), "missing": len(report.missing), "world_size": world or None},
        sql={"ranks": sql.RANKS.strip(), "spans": spans_sql.strip()},
        recommendation="bring the missing agents up (straggler status on each) and re-run explain"))


def lost_findings(report, lost):
    """Nodes whose agent lost events: their numbers are lower bounds."""
    for r in lost:
        report.findings.append(Finding(
            severity="warning", node=r["node"], cause="data-loss",
            summary=f"{r['node']} lost {r['lost_events']} events (BPF buffer overruns): its numbers are lower bounds",
            numbers={"lost_events": r["lost_events"]}, sql={"lost_events": sql.LOST.strip()},
            sources={"lost_events": dict(sql="lost_events", match={"node": r["node"]}, column="lost_events")},
            recommendation="raise the agent's buffer size (--ringbuf-kb, --sys-ringbuf-kb) or trace fewer calls"))


def unaligned_cut_finding(report, cut, clocks_sql):
    """--since/--until on nodes without clock pairs: cut on their own clock, placed as the timeline places
    them (their first summary at the earliest aligned node's), so their bounds are approximate. Once."""
    nodes = cut.unaligned
    if not nodes:
        return
    numbers = {}
    for node in nodes:
        lo, hi = cut.bounds(node)
        numbers.update({f"{node}.{name}": v for name, v in (("since_mono_ns", lo), ("until_mono_ns", hi)) if v is not None})
    where = ("no node has clock pairs: the span is cut on each node's own clock, every node placed as if it "
             "started with the others" if len(nodes) == len(cut.clocks) else
             f"no clock pairs on {', '.join(nodes)}: each is cut on its own monotonic clock, placed as if it started "
             "with the other nodes, so there the bounds are approximate")
    report.findings.append(Finding(
        severity="warning", node=None, cause="unaligned-clock", summary=f"--since/--until: {where}",
        numbers=numbers, sql={"clocks": clocks_sql.strip(), "span": cut.span_sql.strip()},
        recommendation="merge stores that hold the agents' clock pairs (an agent of this version writes them as it "
                       "traces); meanwhile read that node's part of the span as approximate"))


def device_findings(series_sql, device_sql, j, ev, ranks):
    """The findings of an episode named by a GPU's own word (devices.py): every rank waited alike, the
    job ran slower, and one GPU alone reports throttling, a degraded link or errors."""
    node = ev.node
    who = _ranks_words(ranks)
    e = j.episode
    if j.all_along:
        how = ("slow all along: no clean time in this trace (its GPU said so from the first sample to the last), "
               "so the job's slowdown is not measured; judged against the other GPUs at work at the same time. Every "
               "rank waited alike")
    else:
        how = f"the job ran ×{j.slowdown:.2f} slower while every rank waited alike"
    summary = (f"{node} ({who}, GPU {ev.gpu}) is the straggler: {how} (in synchronize: with collectives that only "
               f"enqueue the calls cannot tell whose GPU is slow) — and its GPU alone says why: {ev.detail}")
    sql_texts = {"series": series_sql.strip(), **{k: v.strip() for k, v in device_sql.items()}}
    numbers = dict(gpu=ev.gpu, slowdown=None if j.slowdown is None else round(j.slowdown, 3), all_along=j.all_along,
                   **{k: v for k, v in ev.numbers.items() if not isinstance(v, list)})
    out = [Finding(severity="critical", node=node, cause="straggler", summary=summary, numbers=numbers,
                   sql=sql_texts, recommendation="see the cause finding below", share=1.0),
           Finding(severity="critical", node=node, cause=ev.kind,
                   summary=f"{DEVICE_WORDS[ev.kind]} on {node} GPU {ev.gpu} ({who}): {ev.detail}",
                   numbers=dict(gpu=ev.gpu, **{k: v for k, v in ev.numbers.items() if not isinstance(v, list)}),
                   sql={k: v.strip() for k, v in device_sql.items()}, recommendation=DEVICE_RECOMMENDATION[ev.kind],
                   share=1.0)]
    del e
    return out


def link_findings(series_sql, link_sql, j, ev, ranks):
    """The findings of an episode named by a node's links (network.py): every rank waited alike in its
    collectives, the job ran slower, and one node's link alone says why."""
    node = ev.node
    who = _ranks_words(ranks)
    link = f", {ev.link}" if ev.link else ""
    peers = f"; slow to {', '.join(ev.peers)}" if ev.peers else ""
    if j.all_along:
        how = ("slow all along: no clean time in this trace (its link said so in every part of it), so the job's "
               "slowdown is not measured; judged against the other nodes' links at the same time. Every rank waited "
               "alike in its collectives")
    else:
        how = f"the job ran ×{j.slowdown:.2f} slower while every rank waited alike in its collectives"
    summary = (f"{node} ({who}{link}) is the straggler: {how} (the calls cannot tell whose link is slow) — and its "
               f"link alone says why: {ev.detail}{peers}")
    sql_texts = {"series": series_sql.strip(), **{k: v.strip() for k, v in link_sql.items()}}
    numbers = dict(link=ev.link, peers=", ".join(ev.peers), slowdown=None if j.slowdown is None else round(j.slowdown, 3),
                   all_along=j.all_along, **ev.numbers)
    return [Finding(severity="critical", node=node, cause="straggler", summary=summary, numbers=numbers,
                    sql=sql_texts, recommendation="see the cause finding below", share=1.0),
            Finding(severity="critical", node=node, cause=ev.kind,
                    summary=f"{NET_WORDS[ev.kind].capitalize()} on {node}{link} ({who}): {ev.detail}{peers}",
                    numbers=dict(link=ev.link, peers=", ".join(ev.peers), **ev.numbers),
                    sql={k: v.strip() for k, v in link_sql.items()}, recommendation=NET_RECOMMENDATION[ev.kind],
                    share=1.0)]


def add_link_evidence(found, ev, link_sql):
    """A straggler named by its waits whose node's link also says why: an info finding beside its causes."""
    link = f" {ev.link}" if ev.link else ""
    found.append(Finding(severity="info", node=ev.node, cause=ev.kind,
                         summary=f"{ev.node}: its link{link} says why too — {NET_WORDS[ev.kind]}: {ev.detail}",
                         numbers=dict(link=ev.link, peers=", ".join(ev.peers), **ev.numbers),
                         sql={k: v.strip() for k, v in link_sql.items()},
                         recommendation=NET_RECOMMENDATION[ev.kind], share=0.0))


def link_warning(ev, link_sql, why, node=None, fabric=False):
    """A link's evidence where the job did not slow down, or on every node alike: a warning, never a
    straggler. `fabric`: the job slowed and the links cannot say whose (every node's alike, or the two
    ends of slow connections that cannot be told apart)."""
    link = f" {ev.link}" if ev.link else ""
    numbers = dict(link=ev.link, peers=", ".join(ev.peers), **ev.numbers)
    if fabric:
        numbers["fabric"] = True
    return Finding(severity="warning", node=node if node is not None else ev.node, cause=ev.kind,
                   summary=f"{NET_WORDS[ev.kind].capitalize()} on {ev.node}{link}, {why}: {ev.detail}",
                   numbers=numbers, sql={k: v.strip() for k, v in link_sql.items()},
                   recommendation=NET_RECOMMENDATION[ev.kind], share=0.0)


def add_device_evidence(found, ev, device_sql):
    """A straggler's GPU that also reports why (a slow GPU in the blocking style): its evidence goes into
    the gpu-slow finding of that node (summary, numbers, SQL, recommendation); else an info finding."""
    slow = next((f for f in found if f.cause == "gpu-slow" and f.node == ev.node), None)
    words = f"its GPU {ev.gpu} says why — {DEVICE_WORDS[ev.kind].lower()}: {ev.detail}"
    if slow is not None:
        slow.summary += f"; {words}"
        slow.numbers.update({f"gpu.{k}": v for k, v in ev.numbers.items() if not isinstance(v, list)},
                            gpu=ev.gpu, gpu_evidence=ev.kind)
        slow.sql.update({k: v.strip() for k, v in device_sql.items()})
        slow.recommendation = DEVICE_RECOMMENDATION[ev.kind]
        return
    found.append(Finding(severity="info", node=ev.node, cause=ev.kind, summary=f"{ev.node}: {words}",
                         numbers=dict(gpu=ev.gpu), sql={k: v.strip() for k, v in device_sql.items()},
                         recommendation=DEVICE_RECOMMENDATION[ev.kind], share=0.0))


def device_warning(ev, device_sql, why):
    """A GPU's evidence where the job did not slow down: a warning, never a straggler."""
    return Finding(severity="warning", node=ev.node, cause=ev.kind,
                   summary=f"{DEVICE_WORDS[ev.kind]} on {ev.node} GPU {ev.gpu}, {why}: {ev.detail}",
                   numbers=dict(gpu=ev.gpu, **{k: v for k, v in ev.numbers.items() if not isinstance(v, list)}),
                   sql={k: v.strip() for k, v in device_sql.items()}, recommendation=DEVICE_RECOMMENDATION[ev.kind],
                   share=0.0)


def _ranks_words(ranks):
    """'rank 2', 'ranks 0-3', or 'its ranks' (none known)."""
    return (f"rank {_rank_list(ranks)}" if len(ranks) == 1 else f"ranks {_rank_list(ranks)}") if ranks else "its ranks"


def _rank_list(ranks):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ", ".join(out)


def _who(rt):
    return f"{rt.key[0]} (rank {rt.rank})" if rt.rank is not None else f"{rt.key[0]} (pid {rt.key[1]})"


def _pct(x):
    return f"{100 * x:.0f}%"


def straggler_findings(report, ctx, group, first):
    """The straggler finding of one node (`group`: its named ranks, the one that waits least first) and
    its causes (those of that rank; the node's other straggling ranks are listed with it)."""
    s = group[0]
    rt, verdict = s["rank"], ctx.verdict
    named = {x["rank"].key for x in verdict.stragglers}
    others = [r for r in ctx.ranks if r.key != rt.key and r.key not in named]
    others = others or [r for r in ctx.ranks if r.key != rt.key]
    node, pid = rt.key
    base = ctx.baseline.get(rt.key)
    base_txt = (f" (its own baseline: {_pct(base.wait_share(verdict.wait_def))})" if base and base.wall_ns else "")
    style = ("in collectives and blocked" if verdict.wait_def == "blocking"
             else "in collectives, blocked and in synchronize: in this job the ranks wait for each other in synchronize "
                  "too, as with collectives that only enqueue")
    node_ranks = [r for r in ctx.ranks if r.key[0] == node]
    if len(node_ranks) > 1:
        slow = sorted(x["rank"].rank for x in group if x["rank"].rank is not None)
        which = (f"all {len(node_ranks)} of its ranks ({_rank_list(slow)}) wait less than the others: the whole node "
                 f"is slow" if len(group) == len(node_ranks) else
                 f"{len(group)} of its {len(node_ranks)} ranks ({_rank_list(slow)}) wait less than the others: those "
                 f"ranks' own devices or threads, not the whole node")
        lead = f"{node} is the straggler: {which}; the least waiting, {_who(rt)},"
    else:
        lead = f"{_who(rt)} is the straggler: it waits least for its peers —"
    summary = (f"{lead} its calling thread {rt.comm} (tid {rt.tid}) spent {_pct(s['wait'])} of its time waiting "
               f"({style}) vs {_pct(s['others_median'])} median on the other ranks{base_txt}, lower in "
               f"{s['consistency']:.0%} of the window's slices; everyone else waits for it")
    match = {"node": node, "pid": pid, "tid": rt.tid, "part": "recent"}
    numbers = {"wait_pct": round(100 * s["wait"], 1), "others_median_wait_pct": round(100 * s["others_median"], 1),
               "gap_pct": round(100 * s["gap"], 1), "slices_lower": round(s["consistency"], 2),
               "coll_ns": rt.raw.get("coll_ns"), "blocked_ns": rt.raw.get("blocked_ns"), "wall_ns": rt.wall_ns,
               "rank": rt.rank}
    if len(node_ranks) > 1:
        numbers.update(ranks_straggling=len(group), ranks_on_node=len(node_ranks))
    report.findings.append(Finding(
        severity="critical", node=node, cause="straggler", summary=summary, numbers=numbers,
        sources={"coll_ns": dict(sql="threads", match=match, column="coll_ns"),
                 "blocked_ns": dict(sql="threads", match=match, column="blocked_ns")},
        sql={"threads": ctx.threads_sql.strip(), **({"slices": ctx.slices_sql.strip()} if ctx.slices_sql else {})},
        recommendation="see the cause findings below", share=1.0))
    first_new = len(report.findings) - 1
    _cause_findings(report, ctx, rt, others, base)
    # when: the straggler's recent window, from the first slice in which it waited less than the others
    w = ctx.win_of[rt.key]
    tb, t1 = w.tb, w.t1
    lower = model.lower_in_slices(rt.key, ctx.slices, verdict.wait_def, ctx.mopts.min_gap)
    onset = next((tb + i * ctx.slice_ns for i, hit in zip(ctx.slice_index, lower) if hit), tb)
    for f in report.findings[first_new:]:
        f.at_ns, f.window_ns = int(onset), [int(tb), int(t1)]


def _cause_findings(report, ctx, rt, others, base):
    runner, windows, mopts = ctx.runner, ctx.windows, ctx.mopts
    verdict = ctx.verdict
    node, pid = rt.key
    w = ctx.win_of[rt.key]
    recent_s, base_s = w.recent_ns / 1e9, w.baseline_ns / 1e9
    ex, total = model.excess(rt, others, verdict.wait_def, ctx.baseline)
    explained = sum(ex.values())
    denom = max(total, explained, 1e-9)
    threads_sql = ctx.threads_sql.strip()
    match = {"node": node, "pid": pid, "tid": rt.tid, "part": "recent"}

    def grew(component):
        now = rt.share(component)
        if base is None or not base.wall_ns:
            return f"{_pct(now)} of its time"
        return f"{_pct(base.share(component))} → {_pct(now)} of its time"

    def others_txt(component):
        return f"{_pct(model.median([o.share(component) for o in others]))} median on the other ranks"

    def add(cause, share, summary, numbers, sources=None, extra_sql=None, recommendation=""):
        if share < mopts.min_cause_share:
            return
        report.findings.append(Finding(
            severity="critical" if share >= 0.5 else "warning" if share >= 0.2 else "info", node=node, cause=cause,
            summary=summary, numbers=dict(numbers, share_of_excess=round(share, 3)), sources=sources or {},
            sql=dict({"threads": threads_sql}, **(extra_sql or {})), recommendation=recommendation,
            share=round(share, 3)))

    excess_ns = int(total * rt.wall_ns)
    # ---- run queue: who held the CPU
    if ex.get("runq", 0) > 0:
        thieves_sql = sql.thieves(windows, node, pid)
        rows = runner.rows(thieves_sql)
        siblings = {int(r["pid"]): r.get("rank") for r in ctx.span_rows if r["node"] == node and int(r["pid"]) != pid}

        def kind_of(r):             # another rank of this job on the node is the job's own contention
            return "sibling" if r["kind"] == "process" and r["thief_pid"] in siblings else r["kind"]
        rec = {(kind_of(r), r["thief_pid"], r["thief_comm"]): r["runq_ns"] or 0 for r in rows if r["part"] == "recent"}
        bas = {(kind_of(r), r["thief_pid"], r["thief_comm"]): r["runq_ns"] or 0 for r in rows if r["part"] == "baseline"}
        growth = model.thief_growth(rec, bas, recent_s, base_s)
        own_share, other_share = model.split_runq(growth)
        runq_share = ex["runq"] / denom
        helpers = (f"; {_fmt_ns(rt.helper_runq_ns)} of it while it waited for its own threads"
                   if rt.helper_runq_ns else "")
        base_runq = f"run-queue wait {grew('runq')} vs {others_txt('runq')}{helpers}"
        # group the thieves by process (kind, pid) for naming
        by_proc = {}
        for (kind, tpid, comm), rate in growth.items():
            acc = by_proc.setdefault((kind, tpid), dict(rate=0.0, comms=set(), by_comm={}))
            acc["rate"] += rate
            if comm:
                acc["comms"].add(comm)
                acc["by_comm"][comm] = acc["by_comm"].get(comm, 0.0) + rate
        for (kind, tpid), acc in by_proc.items():
            if tpid is not None and acc["by_comm"]:   # one process: named by the name its threads mostly had
                acc["comms"] = {max(acc["by_comm"], key=acc["by_comm"].get)}
        total_rate = sum(v["rate"] for v in by_proc.values()) or 1.0
        foreign = sorted(((k, v) for k, v in by_proc.items() if k[0] not in model.OWN_KINDS), key=lambda kv: -kv[1]["rate"])
        own = sorted(((k, v) for k, v in by_proc.items() if k[0] in model.OWN_KINDS), key=lambda kv: -kv[1]["rate"])
        io_rows = None
        if other_share * runq_share >= mopts.min_cause_share:
            io_rows = runner.rows(sql.block_io(windows, node, pid))
            names = []
            numbers = {"runq_ns": rt.raw.get("runq_ns"), "excess_ns": excess_ns}
            top = None
            for (kind, tpid), v in foreign[:4]:
                label = _thief_label(kind, tpid, v["comms"], io_rows)
                names.append(f"{label}: {_fmt_ns(v['rate'] * recent_s)} ({v['rate'] / total_rate:.0%})")
                top = top or (kind, tpid, v["comms"])
            numbers["runq_recent_ns"] = sum(rec.values())
            summary = (f"CPU contention on {node}: other tasks held its trainer's CPU — {base_runq}; who held it "
                       f"(run-queue wait grown over the baseline): " + "; ".join(names or ["not recorded"]))
            add("cpu-contention", runq_share * other_share, summary, numbers,
                sources={"runq_ns": dict(sql="threads", match=match, column="runq_ns")},
                extra_sql={"thieves": thieves_sql.strip()},
                recommendation=_recommend_cpu(top, io_rows))
        if own_share * runq_share >= mopts.min_cause_share:
            names = [(f"rank {siblings.get(tpid)} (pid {tpid}), another rank of this job on the node"
                      if kind == "sibling" else f"{', '.join(sorted(v['comms'])) or 'its threads'}")
                     + f": {v['rate'] / total_rate:.0%}" for (kind, tpid), v in own[:3]]
            summary = (f"self-contention on {node}: the trainer's own threads (or its child processes) compete for "
                       f"too few cores — {base_runq}; its own: " + "; ".join(names))
            add("self-contention", runq_share * own_share, summary, {"runq_ns": rt.raw.get("runq_ns"), "excess_ns": excess_ns},
                sources={"runq_ns": dict(sql="threads", match=match, column="runq_ns")},
                extra_sql={"thieves": sql.thieves(windows, node, pid).strip()},
                recommendation="give the trainer more cores (its cpuset/affinity), or fewer threads: torch.set_num_threads, "
                               "OMP_NUM_THREADS, DataLoader num_workers sized to the cores it has")
    same_work = model.work_ratio(rt.key, [o.key for o in others], ctx.mix)
    more = _more_work(ctx, rt, others, ex, same_work)
    if more is not None:
        share, work, parts = more
        numbers, extra = dict(_work_numbers(work), excess_ns=excess_ns), _work_sql(ctx, work)
        beside, beside_numbers = _step_work(ctx, rt, others)
        numbers.update(beside_numbers)
        if beside_numbers.get("bytes_per_collective") is not None:
            extra["collectives"] = ctx.coll_sql.strip()
        add("more-work", share / denom,
            f"more work on {node}: it launches {_work_text(work)} — ×{work.ratio:.2f} the work per step between the same "
            f"collectives ({'a longer batch or sequence' if work.threads and work.kernels_ratio < 1.05 else 'a pipeline stage with more layers, a longer batch'}); "
            f"its GPU and launch time above the others' is what that work takes"
            + (f", and {_pct(parts['rest'] / denom)} of its excess is beyond it" if parts["rest"] > 0 else "")
            + (f"; beside its kernels, {beside}" if beside else ""),
            numbers, extra_sql=extra, recommendation=MORE_WORK_RECOMMENDATION)
    # its own block I/O first: the CPU it took to copy what it wrote (into the page cache) is host compute to
    # the step-time model, and the I/O's, not the rank's other work (at least bytes / PAGE_CACHE_BYTES_PER_S)
    io = None
    if ex.get("io", 0) > 0:
        io_sql = sql.block_io(windows, node, pid)
        rows = runner.rows(io_sql)
        own_rec = sum(r["bytes"] or 0 for r in rows if r["own"] and r["part"] == "recent")
        own_base = sum(r["bytes"] or 0 for r in rows if r["own"] and r["part"] == "baseline")
        others_rec = [r for r in rows if not r["own"] and r["part"] == "recent"]
        cls = model.classify_io(own_rec, own_base, sum(r["bytes"] or 0 for r in others_rec), recent_s, base_s)
        copying = 0.0
        if cls == "io-self":
            copying = min(ex.get("host", 0.0), model.copy_share(own_rec, own_base, recent_s, base_s,
                                                                PAGE_CACHE_BYTES_PER_S))
            ex["host"] = ex.get("host", 0.0) - copying
        io = (io_sql, cls, own_rec, others_rec, copying)
    for component, (cause, what, recommendation) in SIMPLE_CAUSES.items():
        if ex.get(component, 0) > 0:
            column = f"{component}_ns"
            text = what.format(node=node, grew=grew(component), others=others_txt(component))
            if cause == "gpu-slow" and more is None:       # same work, slower — or can it not be told?
                text += _same_work_text(ctx, rt, others, same_work)
            add(cause, ex[component] / denom, text,
                dict({f"{component}_pct": round(100 * rt.share(component), 1), "excess_ns": excess_ns},
                     **({column: rt.raw[column]} if column in rt.raw else {})),
                sources={column: dict(sql="threads", match=match, column=column)} if column in rt.raw else {},
                recommendation=recommendation)
    if io is not None:
        io_sql, cls, own_rec, others_rec, copying = io
        numbers = {"io_ns": rt.raw.get("io_ns"), "own_io_bytes": own_rec, "excess_ns": excess_ns}
        if cls == "io-self":
            summary = (f"its own block I/O on {node}: the trainer sleeps on I/O it issued itself — {grew('io')} vs "
                       f"{others_txt('io')}; it wrote/read {_fmt_bytes(own_rec)} in the recent window"
                       + (f", and at least {_pct(copying)} of its time went to copying it on its CPU (host compute at "
                          f"{_fmt_bytes(PAGE_CACHE_BYTES_PER_S)}/s)" if copying > 0 else ""))
            rec = ("move checkpoint writes and data reads out of the training loop's thread: an async checkpoint "
                   "(torch.distributed.checkpoint async_save), a background writer, prefetching loaders")
            numbers["copying_pct"] = round(100 * copying, 1)
        else:
            top = max(others_rec, key=lambda r: r["bytes"] or 0)
            summary = (f"block I/O of another process on {node}: the trainer's own I/O ({_fmt_bytes(own_rec)}) got "
                       f"slower while {top['comm']} (pid {top['pid']}) wrote/read {_fmt_bytes(top['bytes'])} on the same "
                       f"node — {grew('io')} vs {others_txt('io')}")
            rec = f"`ionice -c3 -p {top['pid']}`, move its I/O to another disk, or schedule it outside training"
            numbers["other_io_bytes"] = top["bytes"]
        add(cls, (ex["io"] + copying) / denom, summary, numbers,
            sources={"io_ns": dict(sql="threads", match=match, column="io_ns")},
            extra_sql={"block_io": io_sql.strip()}, recommendation=rec)
    unknown = max(0.0, total - explained) / denom if total > 0 else 0.0
    if unknown >= max(0.2, mopts.min_cause_share):
        add("unknown", unknown,
            f"{unknown:.0%} of {node}'s excess step time is explained by none of the classes (on-CPU in calls, host "
            f"compute, run queue, synchronize, own I/O): it may wait on something not traced (a lock, the network "
            f"outside NCCL, page faults)",
            {"excess_ns": excess_ns, "explained_ns": int(explained * rt.wall_ns)},
            recommendation="profile its blocking: offcputime-style stacks (py-spy dump --pid PID) while it straggles")


def _work_text(work):
    """What a rank launches per collective against the others, in words (model.Work): its kernels, and their
    size where it was compared."""
    text = f"{work.kernels:.1f} kernels per collective vs {work.others_kernels:.1f} median on the other ranks"
    if work.threads:
        text += (f", each of ×{work.size_ratio:.2f} the threads ({work.threads:,.0f} vs {work.others_threads:,.0f} per "
                 f"kernel, from {work.sized} of its launches recorded with their grid)")
    elif work.sized:
        text += f", of the same size as far as {work.sized} of its launches recorded with their grid tell"
    else:
        text += ", their sizes not compared (too few launches recorded with their grid)"
    return text


def _work_numbers(work):
    """The numbers behind _work_text."""
    numbers = {"launches_per_collective": round(work.kernels, 2),
               "others_launches_per_collective": round(work.others_kernels, 2), "work_ratio": round(work.ratio, 3)}
    if work.threads:
        numbers.update(threads_per_kernel=round(work.threads, 1), others_threads_per_kernel=round(work.others_threads, 1))
    if work.sized:
        numbers["sized_launches"] = work.sized
    return numbers


def _work_sql(ctx, work):
    """The SQL behind _work_numbers."""
    out = {"call_mix": ctx.mix_sql.strip()}
    if work.sized and ctx.sizes_sql:
        out["kernel_sizes"] = ctx.sizes_sql.strip()
    return out


def _same_work_text(ctx, rt, others, work):
    """gpu-slow's word on its work (`work`: model.work_ratio, None where its kernels were not counted): what it
    launches per collective against the others, what it does beside, and whether that is the same work."""
    if work is None:
        return ("; its kernels per step were not counted, so more work per step (a longer batch, a heavier stage) "
                "cannot be told from a slower GPU here")
    beside = _step_work(ctx, rt, others)[0]
    text = f"; it launches {_work_text(work)}" + (f" ({beside})" if beside else "")
    if work.ratio >= ctx.mopts.more_work_ratio:
        return text + f": ×{work.ratio:.2f} the work, yet slower than that work takes"
    if work.ratio <= 1 / ctx.mopts.more_work_ratio:
        return text + f": less work (×{work.ratio:.2f}), and still slower"
    if not work.sized:
        return text + f": as many kernels (×{work.ratio:.2f}), slower — unless its kernels are bigger"
    return text + f": the same work (×{work.ratio:.2f}), slower"


STEP_BYTES_MIN_CALLS = 20     # a rank's bytes per collective from at least this many recorded calls of a known size


def _step_work(ctx, rt, others):
    """What the rank does per collective beside its kernels, against the other ranks' median: its host compute
    and the bytes its collectives carry (evidence of the kind of work, not a cause: a cause is its share of
    the excess). (words, numbers); no words where neither is known."""
    def per_collective(r):
        m = (ctx.mix or {}).get(r.key) or {}
        host = r.share("host") * r.wall_ns / m["collectives"] if m.get("collectives") else None
        nbytes = (m["coll_bytes"] / m["coll_calls"] if (m.get("coll_calls") or 0) >= STEP_BYTES_MIN_CALLS
                  and m.get("coll_bytes") is not None else None)
        return host, nbytes
    mine, theirs = per_collective(rt), [per_collective(o) for o in others]
    what, its, their, numbers = [], [], [], {}
    for i, (name, fmt, key) in enumerate((("its host compute", _fmt_ns, "host_ns_per_collective"),
                                          ("the bytes of its collective calls", fmt_bytes, "bytes_per_collective"))):
        values = [v[i] for v in theirs if v[i] is not None]
        if mine[i] is None or not values:
            continue
        med = model.median(values)
        numbers[key], numbers[f"others_{key}"] = round(mine[i]), round(med)
        what.append(name)
        its.append(fmt(round(mine[i])))
        their.append(fmt(round(med)))
    if not what:
        return "", numbers
    return (f"per collective {' and '.join(what)}: {' and '.join(its)}, against {' and '.join(their)} on the other "
            f"ranks (median)"), numbers


def _more_work(ctx, rt, others, ex, found):
    """The straggler's more work per step (`found`: model.work_ratio, a Work): the part of its sync and work excess
    (`ex`, taken out of it in place) that its extra work accounts for — the others' median share of each times
    the extra work (its kernels for the launch time) — as (that share of wall time, the Work, {"rest": what is left
    beyond it}); None when it launches no more work than the others (more_work_ratio)."""
    if found is None or found.ratio < ctx.mopts.more_work_ratio:
        return None
    taken = 0.0
    for component in ("sync", "work"):
        # the GPU's time grows with the work (kernels x their size), the launches' time with the kernels alone
        ratio = found.ratio if component == "sync" else found.kernels_ratio
        if ex.get(component, 0) <= 0 or ratio <= 1.0:
            continue
        theirs = model.median([o.share(component) for o in others])
        per_kernel = (rt.share(component) / ratio) / theirs if theirs > 0 else float("inf")
        # as fast per kernel as the others: all of it is the extra kernels; else what they would take at the
        # others' speed, the rest being a slower device (or calls)
        part = ex[component] if per_kernel <= ctx.mopts.same_speed_ratio else min(ex[component], theirs * (ratio - 1.0))
        ex[component] -= part
        taken += part
    if taken <= 0:
        return None
    return taken, found, {"rest": sum(ex.get(c, 0.0) for c in ("sync", "work"))}


PAGE_CACHE_BYTES_PER_S = 4 << 30   # a core copies written data into the page cache at most this fast: the least
                                   # CPU its own writes took a rank (their host compute is the I/O's)
WRITER_MIN_BYTES = 1 << 20     # a thief is 'a writer' from this much block I/O in the recent window


def _bytes_written(pid, io_rows):
    """Block I/O bytes a thief issued in the recent window, when they make it 'a writer' (its label and
    the recommendation alike), else 0: a pid's I/O in the baseline only says nothing about it now, and a
    few KiB (a program's start-up, a log line) make no checkpoint writer."""
    wrote = sum(r["bytes"] or 0 for r in (io_rows or []) if r["pid"] == pid and r["part"] == "recent")
    return wrote if wrote >= WRITER_MIN_BYTES else 0


def _thief_label(kind, pid, comms, io_rows):
    names = ", ".join(sorted(comms)[:4]) + (f" and {len(comms) - 4} more" if len(comms) > 4 else "") if comms else "?"
    if kind == "kernel":
        return f"kernel work ({names})"
    if kind == "outside":
        return f"{names} (outside this agent's scope: another container or namespace; pid not visible)"
    if kind == "idle":
        return "no one (an idle CPU: the scheduler was slow to move it)"
    wrote = _bytes_written(pid, io_rows)
    what = f", a writer: {_fmt_bytes(wrote)} of block I/O in the window" if wrote else ""
    return f"{names} (pid {pid}{what})"


def _recommend_cpu(top, io_rows):
    if not top:
        return "find what runs on the trainer's cores (top -H, pidstat -t) and move it away"
    kind, pid, comms = top
    name = ", ".join(sorted(comms)) or "it"
    if kind == "kernel":
        return (f"kernel work ({name}) takes the trainer's CPU: check interrupts and softirqs on its cores "
                "(/proc/interrupts, irqbalance), and keep them off the trainer's cores")
    if kind == "outside":
        return (f"{name} runs in another container/namespace on the same cores: give the trainer a cpuset of its own "
                "or run the other workload elsewhere")
    if kind == "idle":
        return "the CPU was free but the trainer waited: check the cpuset/affinity it is pinned to"
    wrote = _bytes_written(pid, io_rows)
    base = (f"move {name} (pid {pid}) off the trainer's cores: `taskset -pc <other cores> {pid}` (or pin the trainer to "
            f"cores of its own with a cpuset), and lower its priority (`renice +19 -p {pid}`)")
    if wrote:
        return base + "; it writes: make the checkpoint asynchronous / throttled, or run it with `ionice -c3`"
    return base + "; or stop it while training"


def waiter_finding(report, ctx):
    verdict = ctx.verdict
    named = {s["rank"].key for s in verdict.stragglers}
    waiters = [r for r in ctx.ranks if r.key not in named]
    if not waiters:
        return
    who = ", ".join(_who(g[0]["rank"]) if len(g) == 1 else
                    f"{g[0]['rank'].key[0]} (ranks {_rank_list([s['rank'].rank for s in g if s['rank'].rank is not None])})"
                    for g in model.by_node(verdict.stragglers))
    parts = [f"{_who(r)} waits {_pct(r.wait_share(verdict.wait_def))} (run queue {_pct(r.share('runq'))})" for r in waiters]
    report.findings.append(Finding(
        severity="info", node=None, cause="waiters",
        summary=f"the other ranks are waiters, not causes: they spend their time waiting for {who} — " + "; ".join(parts),
        numbers={f"{r.key[0]}.wait_pct": round(100 * r.wait_share(verdict.wait_def), 1) for r in waiters},
        sql={"threads": ctx.threads_sql.strip()}, recommendation=f"nothing to fix on them: they wait for {who}"))


MEMBERS_SHOWN = 8      # per communicator, in a summary and its numbers (a data-parallel group can have thousands)


def _comm_label(c):
    if not c.matched:
        return (f"communicator {c.cid} (its set-up was not traced: made before the agent attached, or by a call it "
                "does not trace such as ncclCommInitAll, so its members on other nodes cannot be matched)")
    size = f"{len(c.members)} of {c.nranks} ranks" if c.nranks else f"{len(c.members)} ranks"
    ranks = ", ".join(f"{m.node}" + (f" rank {m.rank}" if m.rank is not None else "") for m in c.members[:MEMBERS_SHOWN])
    if len(c.members) > MEMBERS_SHOWN:
        ranks += f", and {len(c.members) - MEMBERS_SHOWN} more"
    return f"communicator {c.cid} ({size}, made by {c.made_by}: {ranks})"


def communicator_finding(report, ctx, cut=None):
    """The job's NCCL communicators (matched across nodes by their set-up) and each rank's recorded time
    in the collectives of each; with a straggler, the communicator in which its peers wait for it, when
    they do wait inside collective calls (not with collectives that only enqueue)."""
    coll_sql, coll_rows = ctx.coll_sql, ctx.coll_rows       # (read once, by engine.analyse)
    if not coll_sql or not any(r.get("communicator") for r in coll_rows):
        return
    setup_sql = sql.comm_setups(cut.until_only() if cut is not None else None)
    ranks = {(r["node"], int(r["pid"])): r["rank"] for r in ctx.span_rows}
    found = comms_model.group(ctx.runner.rows(setup_sql), coll_rows, ranks)
    if not found:
        return
    numbers, sources = {}, {}

    def cite(i, c):
        for m in c.members[:MEMBERS_SHOWN]:
            name = f"comm{i}.{m.node}.pid{m.pid}.dur_ns"
            numbers[name] = m.dur_ns
            sources[name] = dict(sql="collectives", match={"node": m.node, "pid": m.pid, "communicator": m.address},
                                 column="dur_ns", sum=True)

    def times(c):
        parts = [f"{m.node} {_fmt_ns(m.dur_ns)}" for m in c.members[:MEMBERS_SHOWN]]
        more = len(c.members) - MEMBERS_SHOWN
        return ", ".join(parts) + (f", and {more} more" if more > 0 else "")

    def ops(c):
        return ", ".join(f"{op} ×{n:,}" for op, n in sorted(c.ops().items(), key=lambda kv: -kv[1]))

    shown = found[:4]
    for i, c in enumerate(shown):
        cite(i, c)
    verdict = ctx.verdict
    node, share, waited_in = None, 0.0, None
    if verdict.stragglers:
        rt = verdict.stragglers[0]["rank"]
        node = rt.key[0]
        where = comms_model.where_waited(found, rt.key, rt.wall_ns)
        if where is not None:
            c, others_ns, mine_ns = where
            waited_in = c
            head = (f"its peers wait for {_who(rt)} in {_comm_label(c)}: in its recorded collectives ({ops(c)}) over "
                    f"the recent window the other members spent {_fmt_ns(others_ns)} (median), {_who(rt)} "
                    f"{_fmt_ns(mine_ns)} — {times(c)}")
            if all(c is not x for x in shown):
                cite(len(shown), c)
        elif verdict.wait_def == "enqueue":
            head = (f"the ranks wait for {_who(rt)} in synchronize, not inside collective calls (collectives that only "
                    "enqueue): which communicator holds them cannot be told from the calls' times; recorded collective "
                    "time per communicator")
        else:
            head = (f"no communicator of {_who(rt)}'s shows its peers waiting inside its collectives (at least 5% of "
                    "the window and twice its own); recorded collective time per communicator")
    else:
        head = "no straggler; recorded collective time per communicator"
    rest = [c for c in shown if c is not waited_in]
    tail = "; ".join(f"{_comm_label(c)}: {ops(c)} — {times(c)}" for c in rest)
    more = f"; and {len(found) - len(shown)} more communicator(s)" if len(found) > len(shown) else ""
    summary = head + (f". Communicators: {tail}" if tail and waited_in is not None else f": {tail}" if tail else "") + more
    report.findings.append(Finding(
        severity="info", node=node, cause="communicators", summary=summary, numbers=numbers, sources=sources,
        sql={"setups": setup_sql.strip(), "collectives": coll_sql.strip()}, share=share,
        recommendation=("the members of that communicator are the ranks the straggler delays first; fix the "
                        "straggler (see the cause findings) rather than the collective" if waited_in else
                        "nothing to fix here: collective time per communicator, for reference")))


class Heavier(NamedTuple):
    """model.heavier_ranks in words (_heavier)."""
    who: str                   # the rank, or the node and its ranks
    one: bool                  # one rank (else several of one node)
    work: model.Work           # the heaviest one's
    numbers: dict
    sql: dict


def _heavier(ctx):
    """model.heavier_ranks in words, a Heavier, or None."""
    found = model.heavier_ranks(ctx.ranks, ctx.mix, ctx.mopts)
    if found is None:
        return None
    node, heavier = found
    by_key = {r.key: r for r in ctx.ranks}
    key, work = max(heavier, key=lambda kw: kw[1].ratio)
    if len(heavier) == 1:
        who = _who(by_key[key])
    else:
        who = f"{node} (" + ", ".join(f"rank {by_key[k].rank}" if by_key[k].rank is not None else f"pid {k[1]}"
                                      for k, _ in sorted(heavier)) + ")"
    return Heavier(who, len(heavier) == 1, work, dict(_work_numbers(work), heavier_rank=who), _work_sql(ctx, work))


def _heavier_words(heavier):
    who, one, work = heavier.who, heavier.one, heavier.work
    return (f"{who} {'launches' if one else 'launch up to'} ×{work.ratio:.2f} the work of the other ranks per "
            f"collective ({_work_text(work)}): if {'its GPU is' if one else 'their GPUs are'} what the others wait "
            f"for, that is more work, not a slower GPU")


def _heavier_recommendation(heavier):
    who, one = heavier.who, heavier.one
    return (f"first see whether {who} {'does' if one else 'do'} more work per step than the others (a pipeline stage, "
            f"batches): even out the stages, pack or bucket sequences, size batches by tokens — do not drain "
            f"{'its' if one else 'the'} node for it")


def heavier_warning(heavier):
    """Nobody named, the ranks waiting in synchronize (collectives that only enqueue: the host cannot see whose
    GPU finishes last), and one rank, or ranks of one node, launching more work per collective than the others
    (_heavier): pointed at, as more work and not a slower GPU, naming no straggler (their extra kernels may be
    few of the step's time)."""
    return Finding(severity="warning", node=None, cause="more-work",
                   summary=("nobody can be named: every rank waits in synchronize (collectives that only enqueue), where "
                            f"the host cannot see whose GPU finishes last; but {_heavier_words(heavier)}"),
                   numbers=dict(heavier.numbers), sql=dict(heavier.sql), recommendation=_heavier_recommendation(heavier))


def device_wide_warning(grown, threads_sql, beside=(), heavier=None):
    """Every rank's synchronize grew alike (`grown`: [(node, its baseline sync share, its recent one)]): the
    device side or the network, not one host. With a `fabric` link warning among `beside` (the warnings of
    the same trace: the links say the job's slowdown is the fabric's), it says the links are why and points
    there first. With ranks of one node that launch more work per collective than the others (`heavier`:
    _heavier), it names them as the likely ones the others wait for — more work, not a slower GPU — naming no
    straggler: behind collectives that only enqueue the host cannot see whose GPU finishes last, and their
    extra kernels may be few of the step's time."""
    summary = ("every rank's time in synchronize grew alike ("
               + ", ".join(f"{node} {_pct(before)} → {_pct(now)}" for node, before, now in grown)
               + "): the wait is on the device side or in the collective's network, and with collectives that only "
                 "enqueue (NCCL on GPUs) the host cannot tell whose GPU is slow")
    numbers = {f"{node}.sync_pct": round(100 * now, 1) for node, _, now in grown}
    recommendation = ("compare the GPUs directly: nvidia-smi -q -d PERFORMANCE,CLOCK on each node, or NCCL's own "
                      "timing (NCCL_DEBUG=INFO, the PyTorch flight recorder)")
    sql = {"threads": threads_sql.strip()}
    if heavier is not None:
        summary += f"; {_heavier_words(heavier)}"
        numbers.update(heavier.numbers)
        sql.update(heavier.sql)
        recommendation = _heavier_recommendation(heavier) + "; only then the GPUs: " + recommendation
    fabric = next((f for f in beside if f.severity == "warning" and f.numbers.get("fabric") is True
                   and f.cause in NET_RECOMMENDATION), None)
    if fabric is not None:
        summary += (f"; the links say why ({fabric.cause} on every node alike, or between nodes that cannot be told "
                    f"apart: see that warning): a condition of the network, not of one GPU")
        numbers["fabric"] = fabric.cause
        recommendation = NET_RECOMMENDATION[fabric.cause] + "; only then the GPUs: " + recommendation
    return Finding(severity="warning", node=None, cause="device-wide", summary=summary, numbers=numbers,
                   sql=sql, recommendation=recommendation)


def no_straggler_findings(report, ctx, beside=()):
    """Why no rank is named (the model's rejections), and what the whole job's waits say instead: every
    rank's synchronize grown alike (device_wide_warning, beside the trace's other warnings), or every rank
    waiting longer with nodes missing."""
    verdict, ranks, base = ctx.verdict, ctx.ranks, ctx.baseline
    why = "; ".join(f"{_who(rt)} {reason}" for rt, reason in verdict.rejected) or (
        "fewer than two ranks with data" if len(ranks) < 2 else "every rank waits about as much as the others")
    numbers = {f"{r.key[0]}.wait_pct": round(100 * r.wait_share(verdict.wait_def), 1) for r in ranks}
    # every rank's synchronize grew alike: the device side or the network, not one host
    grown = [r for r in ranks if r.key in base and base[r.key].share("sync") > 0
             and r.share("sync") >= 1.3 * base[r.key].share("sync") and r.share("sync") - base[r.key].share("sync") >= 0.05]
    heavier = _heavier(ctx) if len(ranks) >= 2 else None
    if ranks and len(grown) == len(ranks) and len(ranks) >= 2:
        report.findings.append(device_wide_warning(
            [(r.key[0], base[r.key].share("sync"), r.share("sync")) for r in grown], ctx.threads_sql, beside, heavier))
    elif heavier is not None and (ctx.job_wait_def or ctx.verdict.wait_def) == "enqueue":
        report.findings.append(heavier_warning(heavier))
    missing = report.missing
    if missing and ranks and all(r.key in base and r.wait_share(verdict.wait_def) >= 1.15 * base[r.key].wait_share(verdict.wait_def)
                                 and r.wait_share(verdict.wait_def) > 0 for r in ranks):
        report.findings.append(Finding(
            severity="warning", node=None, cause="waiters",
            summary=(f"no straggler among the {len(ranks)} ranks with data, but all of them now wait longer than in their "
                     f"own baseline: the straggler is probably one of the missing nodes "
                     f"({', '.join(m['node'] for m in missing)})"),
            numbers=numbers, sql={"threads": ctx.threads_sql.strip()},
            recommendation="bring the missing agents up and re-run explain"))
    report.findings.append(Finding(
        severity="info", node=None, cause="no-straggler",
        summary=f"no straggler among {len(ranks)} rank(s): {why}", numbers=numbers,
        sql={"threads": ctx.threads_sql.strip()}))
