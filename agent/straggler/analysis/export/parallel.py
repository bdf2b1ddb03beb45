"""A big .pftrace written by several processes: each a share of the nodes into a part file of its
own (its own packet sequence and uuid range), the parts appended between the head (root
descriptor, clock snapshot) and the tail (findings about no exported node, metadata). A part that
fails or runs past PART_TIMEOUT_S fails the export; no part file is left behind.

Must not decide what is exported (plan.py) or write anything but its parts and the trace it is given.
"""
import json
import os
import shutil
import time

from ...errors import StragglerError
from . import pftrace
from .errors import ExportError
from .plan import open_ro
from .timeline import write, write_tail

MAX_JOBS = 8
PARALLEL_MIN_EVENTS = 200_000
PART_TIMEOUT_S = 6 * 3600          # a part that takes longer than this is stopped and the export fails


class WorkerCrashed(ExportError):
    """A worker stopped on an unexpected exception (not an ExportError of its own): the caller looks
    for the bad value that may have caused it (values.py)."""


def jobs_for(plan, jobs):
    """How many processes write the .pftrace: `jobs` (at most one per node), else one per node up to the
    CPUs and MAX_JOBS when the trace has PARALLEL_MIN_EVENTS events or more; 1 in a daemonic process."""
    import multiprocessing
    if multiprocessing.current_process().daemon:
        return 1                 # a daemonic process (an Ansible worker, say) may not start processes
    if jobs is not None:
        if int(jobs) < 1:
            raise ExportError(f"--jobs {jobs}: expected 1 or more")
        return min(int(jobs), len(plan.order))
    if plan.events < PARALLEL_MIN_EVENTS:
        return 1
    return max(1, min(len(plan.order), os.cpu_count() or 1, MAX_JOBS))


def _part(db_path, plan, findings, compress, nodes, path, sequence, uuid_base):
    """One worker of a parallel export: its nodes into its own part file (its own packet sequence and
    uuid range); its counts as JSON beside it. Runs in a forked child."""
    result = {}
    try:
        plan.skipped = {}                    # only what this part skips (the parent has the rest)
        conn = open_ro(db_path)
        try:
            with open(path, "wb") as fh:
                sink = pftrace.PerfettoSink(fh, plan.start_ns, compress=compress, sequence=sequence,
                                            uuid_base=uuid_base, head=False)
                result = write(conn, plan, sink, findings, nodes=nodes, whole=False)
        finally:
            conn.close()
    except BaseException as exc:             # the parent reports it in one line
        result = dict(error=f"{type(exc).__name__}: {exc}", refused=isinstance(exc, StragglerError))
    with open(path + ".json", "w") as fh:
        json.dump(result, fh)


def write_parallel(db_path, plan, fh, tmp, findings, compress, jobs):
    """The protobuf trace written by `jobs` forked processes, each a share of the nodes into a part
    file; the parts are appended in order between the head (root descriptor, clock snapshot) and the
    tail (findings about no exported node, metadata). A part that fails fails the export."""
    import multiprocessing
    groups = [plan.order[k::jobs] for k in range(jobs)]
    parts = [f"{tmp}.part{k}" for k in range(jobs)]
    head = pftrace.PerfettoSink(fh, plan.start_ns, compress=compress, realtime=plan.realtime)
    head.flush()
    ctx = multiprocessing.get_context("fork")
    procs = []
    try:
        for k, (group, path) in enumerate(zip(groups, parts)):
            proc = ctx.Process(target=_part, args=(db_path, plan, findings, compress, group, path, k + 2,
                                                   (k + 1) << 32), daemon=True)
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + PART_TIMEOUT_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                raise ExportError(f"export: a worker ran past {PART_TIMEOUT_S} s; stopped")
        totals = dict(slices=0, counters=0, instants=0, events=0)
        for proc, path in zip(procs, parts):
            try:
                with open(path + ".json") as rf:
                    result = json.load(rf)
            except (OSError, ValueError):
                result = dict(error=f"worker exited with status {proc.exitcode} and no result")
            if "error" in result:
                raise (ExportError if result.get("refused") else WorkerCrashed)(
                    f"export: a worker failed: {result['error']}")
            for key in totals:
                totals[key] += result.get(key, 0)
            for why, n in result.get("skipped", {}).items():
                plan.skipped[why] = plan.skipped.get(why, 0) + n
        head.flush()
        for path in parts:
            with open(path, "rb") as part:
                shutil.copyfileobj(part, fh, 1 << 20)
        # the tail: findings about no exported node, then the metadata
        tail = write_tail(plan, head, findings)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for path in parts:
            for leftover in (path, path + ".json"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    totals["instants"] += tail
    return dict(events=totals["events"] + head.records, nodes=list(plan.order), trace_start_ns=plan.start_ns,
                slices=totals["slices"], counters=totals["counters"], instants=totals["instants"],
                skipped=dict(plan.skipped), straggler=plan.report.straggler if (plan.report and findings) else None)
