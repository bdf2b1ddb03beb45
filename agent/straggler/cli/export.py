"""`straggler export`: arguments in, straggler.analysis.export.export_perfetto, one summary line and
where to open the trace out. Holds no export logic."""
from ..analysis.export import FORMATS, MAX_JOBS, PARALLEL_MIN_EVENTS, export_perfetto


def add_arguments(parser):
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="perfetto: Perfetto's native protobuf trace (.pftrace); json: Chrome Trace Event JSON "
                             "(default: json when -o ends in .json, else perfetto)")
    parser.add_argument("-d", "--db", required=True, help="a node's store or a merged cluster.db")
    parser.add_argument("-o", "--output", required=True, help="the trace file to write (replaced atomically)")
    parser.add_argument("--since", help="start: seconds from the trace start (e.g. 30) or an ISO-8601 time")
    parser.add_argument("--until", help="end: seconds from the trace start or an ISO-8601 time")
    parser.add_argument("--node", action="append", default=[], help="only this node (repeatable)")
    parser.add_argument("--nodes", help="only these nodes, comma-separated")
    parser.add_argument("--around-findings", type=float, metavar="S",
                        help="only S seconds either side of each of explain's findings")
    parser.add_argument("--no-findings", action="store_true", help="do not run explain for instant events")
    parser.add_argument("--jobs", type=int, help="processes writing the .pftrace, each a share of the nodes "
                                                 f"(default: up to one per node, CPU and {MAX_JOBS}, for "
                                                 f"{PARALLEL_MIN_EVENTS:,} events or more)")


def run(args):
    nodes = list(args.node) + [n.strip() for n in (args.nodes or "").split(",") if n.strip()]
    summary = export_perfetto(args.db, args.output, since=args.since, until=args.until, nodes=nodes or None,
                              findings=not args.no_findings, fmt=args.format, around_findings=args.around_findings,
                              jobs=args.jobs)
    print(summary_line(summary))
    print(f"open it at https://ui.perfetto.dev → Open trace file → {summary['output']}")
    return 0


def summary_line(summary):
    """What was written, where, how big and how fast, and what the cut skipped."""
    skipped = "; ".join(f"skipped {n} events: {why}" for why, n in summary["skipped"].items())
    return (f"wrote {summary['slices']} slices, {summary['counters']} counter samples and {summary['instants']} "
            f"findings for {len(summary['nodes'])} node(s) to {summary['output']} ({summary['format']}, "
            f"{summary['bytes'] / 1e6:.1f} MB) in {summary['elapsed_s']} s" + (f"; {skipped}" if skipped else ""))
