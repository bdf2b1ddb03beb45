"""`straggler query`: one read-only SQL against a node's database (straggler.store.query), the
answer printed as a table (with a one-line note on stderr), JSON or CSV.

This module must hold no query rules (the guard is store/query.py's)."""
import json
import sys

from .. import render
from ..text import safe_text
from ..store.query import DEFAULT_LIMIT, DEFAULT_TIMEOUT_S, jsonable_rows, node_name, run_query
from .common import add_db_argument


def add_arguments(parser):
    parser.add_argument("sql", metavar="SQL", help="one read-only statement (SELECT, WITH … SELECT, read-only PRAGMA)")
    add_db_argument(parser)
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help='print {"node","columns","rows","truncated","elapsed_ms"}')
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header line")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"at most N rows (default {DEFAULT_LIMIT})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"stop the query after S seconds (default {DEFAULT_TIMEOUT_S:g})")


def run(args):
    result = run_query(args.db, args.sql, limit=args.limit, timeout_s=args.timeout)
    result.node = node_name(args.db)
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    elif args.csv:
        sys.stdout.write(render.to_csv(result.columns, jsonable_rows(result.rows)))
    else:
        render.print_table(result.columns, result.rows)
        note = f"{len(result.rows)} row(s) from {result.node} in {result.elapsed_ms:.1f} ms"
        if result.truncated:
            note += f"; truncated at --limit {args.limit}"
        print(safe_text(note), file=sys.stderr)
    return 0
