"""Export a store or a merged cluster database as a timeline for the Perfetto UI:
`straggler export -d DB -o trace.pftrace` writes Perfetto's native protobuf trace (TrackEvent, built
with the `perfetto` package's streaming trace builder; see pftrace.py); `-o trace.json` or
`--format json` writes Chrome Trace Event JSON for tools that need it.

The same content in both formats:
  - one process per node, named "NODE (rank R)", in rank order then node name (stable across
    exports), with its clock alignment (offset and uncertainty from merge) in its description;
  - per node, tracks for: each traced thread's CUDA/driver/NCCL calls as slices (the op's
    arguments — ret, bytes, grid/block, seq — as arguments); calls that overlap without nesting go
    to extra lanes ("comm tid · lane 2"), so every track nests properly; the thread's off-CPU
    intervals (preempted by …/blocked) and its run-queue waits, each on a track of their own; block
    I/O per issuing process, in lanes;
  - counters per node: calls/s and block I/O bytes/s per second, and per rank the step-time
    components of the step-time model (straggler.store.steptime.rank_time over each thread_time interval: waiting
    for peers, run queue, host compute, synchronize, collectives, CUDA calls, own block I/O,
    blocked), as % of wall time; per GPU its SM clock, temperature and power; per network interface
    its receive and transmit bytes/s (and errors + drops per second, once any occurred) and per RDMA
    port its bytes/s and transmit waits per second, from consecutive samples of their counters;
  - explain's findings as instant events on the node's "findings" track, at the time the evidence
    begins (Finding.at_ns), with the summary, cause, share and recommendation.
Times are on the fleet timeline: events.ts_aligned when the merge filled it, else the node's
monotonic ts through its clock_pairs (straggler.clock's segments, as merge uses) minus its measured
offset.

Cuts: --since/--until, --node, and --around-findings S (only S seconds either side of each
finding); what was skipped is counted per reason in the summary.

One concern per module: plan (what is exported: nodes, clocks, start, cut, explain's report),
timeline (the content, from SQL cursors into a sink), jsonsink and pftrace (the two encodings),
parallel (a big .pftrace written by several processes), errors (ExportError); export_perfetto
here ties them, and values names a bad value in the database that stopped the export (a text where
a number belongs, say: one line naming the table, the column, the node and the row, instead of a
traceback; looked for only once something failed, so a sound export reads nothing more). The
writers stream: SQL cursors (ordered by SQLite, which sorts on disk) feed a sink that writes as it
goes; memory depends on the number of tracks, not on the trace length. The output is written to a
temporary file beside it and renamed into place. The package only reads the database; it must not
parse arguments or print (straggler.cli.export does).
"""
import os
import tempfile
import time

from ...errors import StragglerError
from . import pftrace
from .errors import ExportError
from .jsonsink import JsonSink
from .parallel import MAX_JOBS, PARALLEL_MIN_EVENTS, WorkerCrashed, jobs_for, write_parallel
from .plan import Plan, open_ro, parse_time_bound
from .timeline import write
from .values import refuse_bad_values

FORMATS = ("perfetto", "json")

__all__ = ["export_perfetto", "ExportError", "FORMATS", "format_for", "parse_time_bound", "MAX_JOBS",
           "PARALLEL_MIN_EVENTS"]


def format_for(out_path, fmt=None):
    """The format to write: the one asked for, else by the output's name (.json: json, else perfetto)."""
    if fmt:
        if fmt not in FORMATS:
            raise ExportError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
        return fmt
    return "json" if str(out_path).lower().endswith(".json") else "perfetto"


def export_perfetto(db_path, out_path, since=None, until=None, nodes=None, findings=True, fmt=None,
                    around_findings=None, compress=True, jobs=None):
    """Write db_path as a timeline to out_path (atomically): Perfetto's protobuf trace, or Chrome JSON
    (fmt 'json', or an output named *.json). Returns a summary dict.

    jobs: processes writing the protobuf trace, each a share of the nodes (default: one per node up to
    the CPUs and MAX_JOBS, when the trace has at least PARALLEL_MIN_EVENTS events; 1: in this process)."""
    started = time.monotonic()
    fmt = format_for(out_path, fmt)
    if fmt == "perfetto":
        pftrace.require()           # needs the perfetto package: fail before anything is written
    try:
        summary = _export(db_path, out_path, since, until, nodes, findings, fmt, around_findings, compress, jobs)
    except WorkerCrashed:
        refuse_bad_values(db_path)
        raise
    except (StragglerError, OSError, MemoryError):
        raise
    except Exception:               # a bad value (or a bug): name the value, else the traceback stands
        refuse_bad_values(db_path)
        raise
    summary.update(output=out_path, format=fmt, bytes=os.path.getsize(out_path),
                   elapsed_s=round(time.monotonic() - started, 3))
    return summary


def _export(db_path, out_path, since, until, nodes, findings, fmt, around_findings, compress, jobs):
    conn = open_ro(db_path)
    try:
        plan = Plan(conn, db_path, since, until, nodes, findings, around_findings)
        out_dir = os.path.dirname(os.path.abspath(out_path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out_path)}.", suffix=".tmp", dir=out_dir)
        except OSError as exc:
            raise ExportError(f"cannot write {out_path} ({exc}); choose another -o path") from None
        try:
            if fmt == "json":
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    summary = write(conn, plan, JsonSink(fh, plan.start_ns), findings)
            else:
                jobs = jobs_for(plan, jobs)
                with os.fdopen(fd, "wb") as fh:
                    if jobs > 1:
                        summary = write_parallel(db_path, plan, fh, tmp, findings, compress, jobs)
                    else:
                        summary = write(conn, plan, pftrace.PerfettoSink(fh, plan.start_ns, compress=compress,
                                                                          realtime=plan.realtime), findings)
                summary["jobs"] = jobs
            os.replace(tmp, out_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        conn.close()
    return summary
