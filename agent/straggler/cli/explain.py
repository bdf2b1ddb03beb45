"""`straggler explain`: arguments in, the analysis (straggler.analysis.explain), the report out as
text, JSON, Markdown or JUnit."""
import json
import os
import sys

from ..analysis.explain import ExplainOptions, explain_db, explain_fleet
from ..errors import StragglerError, UsageError
from ..fleet.client import parse_nodes
from ..render.report import to_junit, to_markdown, to_text
from .common import add_tls_arguments, tls_options


def add_arguments(parser):
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("-d", "--db", help="a database: a merged cluster.db, or one node's store")
    where.add_argument("--nodes", help="live: the fleet's agents, host:port,… or a file with one per line")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown to FILE")
    parser.add_argument("--junit", metavar="FILE", help="also write the report as JUnit XML to FILE (for CI)")
    parser.add_argument("--baseline-fraction", type=float, metavar="F",
                        help="judge one fixed window instead of finding the episodes in time: the first F of each "
                             "rank's span is its own baseline, the rest is judged")
    parser.add_argument("--last", type=float, metavar="S",
                        help="judge one fixed window instead of finding the episodes in time: each rank's last S "
                             "seconds (the rest before it is the baseline)")
    parser.add_argument("--since", metavar="T",
                        help="judge only the trace from T on the fleet's timeline (the report's, UTC): an ISO-8601 "
                             "time (2026-01-01T02:00:00, UTC if no zone) or seconds from the trace's start (30, 90s); "
                             "each node is cut at that time through its own clock")
    parser.add_argument("--until", metavar="T", help="judge only the trace before T (the forms of --since)")
    parser.add_argument("--min-gap", type=float, default=ExplainOptions.min_gap,
                        help="the straggler waits at least this share of its time less than the other ranks' median "
                             f"(default {ExplainOptions.min_gap:g})")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per query (default 300 local, 30 fleet)")
    parser.add_argument("--no-sql", action="store_true", help="text output without the SQL of each finding")
    parser.add_argument("--fail-on-straggler", action="store_true", help="exit 1 when a straggler is found")
    parser.add_argument("--count-user-xids", action="store_true",
                        help="also count GPU Xid lines a program wrote into the kernel log (a log relay), not only "
                             "the driver's own")
    add_tls_arguments(parser)


def run(args):
    opts = dict(baseline_fraction=args.baseline_fraction, min_gap=args.min_gap, user_xids=args.count_user_xids or None,
                since=args.since, until=args.until)
    if args.timeout:
        opts["timeout_s"] = args.timeout
    if args.last is not None and args.last <= 0:
        raise UsageError("--last must be > 0 seconds")
    if args.baseline_fraction is not None and not 0 < args.baseline_fraction < 1:
        raise UsageError("--baseline-fraction must be between 0 and 1")
    if args.db:
        if not os.path.exists(args.db):
            raise StragglerError(f"{args.db}: no such database; pass -d a store or a merged cluster.db")
        report = explain_db(args.db, recent_s=args.last, **opts)
    else:
        nodes, tls = parse_nodes(args.nodes), tls_options(args)
        report = explain_fleet(nodes, tls, recent_s=args.last, **opts)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(to_markdown(report))
    if args.junit:
        with open(args.junit, "w") as fh:
            fh.write(to_junit(report))
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(to_text(report, show_sql=not args.no_sql))
    return 1 if (args.fail_on_straggler and report.straggler) else 0
