"""`straggler snapshot`: a consistent copy of a node's database (straggler.store.snapshot.snapshot),
with a one-line or JSON summary.

This module must hold no copying logic (store/snapshot.py does)."""
import argparse
import json
import sys

from ..store.snapshot import DEFAULT_DEADLINE_S, snapshot
from .common import add_db_argument


def _positive_seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def add_arguments(parser):
    add_db_argument(parser)
    parser.add_argument("-o", "--output", required=True, help="where to write the copy (mode 0600)")
    parser.add_argument("--deadline", type=_positive_seconds, default=DEFAULT_DEADLINE_S, metavar="S",
                        help=f"give up after S seconds, leaving nothing behind (default {DEFAULT_DEADLINE_S:g})")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")


def run(args):
    summary = snapshot(args.db, args.output, deadline_s=args.deadline)
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        print(f"wrote {summary['path']} ({summary['bytes']} bytes) in {summary['elapsed_ms']:.0f} ms")
    return 0
