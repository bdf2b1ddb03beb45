"""`straggler fleet query`: arguments in, fleet_query out, rendered for people (a rich table,
a progress line on stderr, a per-node status table) or for programs (--json, --csv).

Exit codes: 0 every node answered (ok or empty), 3 some nodes did not answer (partial
result), 4 no node answered, 2 usage or TLS-file errors.

This module must hold no fleet logic (fleet/client.py does).
"""
import json
import sys

from .. import render
from ..fleet.client import (DEFAULT_MAX_ANSWER_BYTES, DEFAULT_MAX_ROW_BYTES, DEFAULT_OFFSET_THRESHOLD_MS, DEFAULT_PORT,
                            EXIT_ALL_ANSWERED, EXIT_NONE_ANSWERED, EXIT_PARTIAL, fleet_query, parse_nodes)
from ..text import safe_text
from .common import add_tls_arguments, tls_options

EPILOG = (f"exit codes: {EXIT_ALL_ANSWERED} every node answered, {EXIT_PARTIAL} some nodes did not answer "
          f"(their status is listed), {EXIT_NONE_ANSWERED} no node answered, 2 usage/TLS file error")


def add_arguments(parser):
    sub = parser.add_subparsers(dest="fleet_command", metavar="ACTION")
    q = sub.add_parser("query", help="run one read-only SQL on every node's agent at once",
                       description="Run one read-only SQL on every node's agent at once (HTTPS, mutual TLS); "
                                   "one table back with a node column, a status per node, and clock offsets.",
                       epilog=EPILOG)
    q.add_argument("sql", metavar="SQL", help="one read-only statement")
    q.add_argument("--nodes", required=True,
                   help="host:port,… or a file: one host:port a line, or an Ansible inventory (INI/YAML: ansible_host, "
                        "port straggler_agent_port from host/group/all vars, else --port)")
    q.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port for nodes given without one and inventory hosts without straggler_agent_port "
                        f"(default {DEFAULT_PORT})")
    fmt = q.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print columns, rows, node statuses and offsets as JSON")
    fmt.add_argument("--csv", action="store_true", help="print the rows as CSV (node statuses go to stderr)")
    q.add_argument("--limit", type=int, default=10000,
                   help="at most N rows per node (default 10000); a node that sends more is refused (oversized)")
    q.add_argument("--max-answer-bytes", type=int, default=DEFAULT_MAX_ANSWER_BYTES, metavar="BYTES",
                   help=f"read at most this much of a node's rows (default {DEFAULT_MAX_ANSWER_BYTES}, the agent's own "
                        f"cap), less when --limit rows of --max-row-bytes take less, plus 1 MiB for the rest of its "
                        f"answer; a node that sends more is refused (oversized)")
    q.add_argument("--max-row-bytes", type=int, default=DEFAULT_MAX_ROW_BYTES, metavar="BYTES",
                   help=f"the largest row taken from a node, as JSON (default {DEFAULT_MAX_ROW_BYTES})")
    q.add_argument("--timeout", type=float, default=5.0, help="seconds per node (default 5)")
    q.add_argument("--deadline", type=float, default=15.0, help="seconds for the whole call (default 15)")
    q.add_argument("--concurrency", type=int, default=32, help="nodes queried at once (default 32)")
    q.add_argument("--clock-samples", type=int, default=5,
                   help="clock requests per node for the offset estimate, 0 to skip (default 5)")
    q.add_argument("--offset-threshold-ms", type=float, default=DEFAULT_OFFSET_THRESHOLD_MS,
                   help=f"flag clock offsets larger than this (default {DEFAULT_OFFSET_THRESHOLD_MS:g} ms)")
    q.add_argument("--offsets-out", metavar="FILE",
                   help='also write the offsets as JSON {node: {"offset_ns", "uncertainty_ns"}} (for merge --offsets)')
    add_tls_arguments(q)


class _Progress:
    """One line on stderr, rewritten as nodes answer (only on a terminal)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.failed = 0

    def __call__(self, done, total, status):
        if not status.answered:
            self.failed += 1
        if self.enabled:
            self.stream.write("\r" + safe_text(f"fleet query: {done}/{total} nodes done, {self.failed} without an "
                                               f"answer (last: {status.node or status.address} {status.status})")
                              + "\x1b[K")
            self.stream.flush()

    def clear(self):
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _ms(ns):
    return None if ns is None else ns / 1e6


def node_table(result):
    rows = []
    for n in result.nodes:
        offset = "" if n.offset_ns is None else f"{_ms(n.offset_ns):+.3f} ± {_ms(n.uncertainty_ns):.3f}"
        if n.offset_flagged:
            offset += " !"
        rows.append([n.node or "?", n.address, n.status, n.row_count,
                     "" if n.latency_ms is None else f"{n.latency_ms:.1f}", offset, n.message])
    return ["node", "address", "status", "rows", "latency ms", "clock offset ms", "message"], rows


def offsets_document(result):
    return {node: {"offset_ns": off, "uncertainty_ns": unc} for node, (off, unc) in result.offsets.items()}


def run(args):
    if args.fleet_command != "query":
        print("straggler fleet: say what to do: `straggler fleet query --nodes h:p,… SQL`", file=sys.stderr)
        return 2
    tls = tls_options(args)
    nodes = parse_nodes(args.nodes, default_port=args.port)
    progress = _Progress() if not (args.json or args.csv) else None
    try:
        result = fleet_query(nodes, args.sql, tls, limit=args.limit, timeout_s=args.timeout, deadline_s=args.deadline,
                             concurrency=args.concurrency, clock_samples=args.clock_samples,
                             offset_threshold_ms=args.offset_threshold_ms, on_progress=progress,
                             max_answer_bytes=args.max_answer_bytes, max_row_bytes=args.max_row_bytes)
    finally:
        if progress:
            progress.clear()
    if args.offsets_out:
        with open(args.offsets_out, "w", encoding="utf-8") as fh:
            json.dump(offsets_document(result), fh, indent=2)
            fh.write("\n")
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), default=str) + "\n")
        return result.exit_code
    if args.csv:
        sys.stdout.write(render.to_csv(result.columns, result.rows))
        for n in result.failed:
            print(safe_text(f"straggler fleet: {n.node or n.address}: {n.status}: {n.message}"), file=sys.stderr)
        return result.exit_code
    if result.columns:
        render.print_table(result.columns, result.rows)
    columns, rows = node_table(result)
    answered = len(result.answered)
    title = f"{answered} of {len(result.nodes)} nodes answered, {len(result.rows)} rows, {result.elapsed_ms:.0f} ms"
    render.print_table(columns, rows, title=title)
    if result.failed:
        print(safe_text("did not answer: " + ", ".join(f"{n.node or n.address} ({n.status})" for n in result.failed)))
    flagged = result.flagged_offsets
    if flagged:
        print(safe_text(f"clock offsets above {args.offset_threshold_ms:g} ms (node minus this machine): " +
                        ", ".join(f"{node} {_ms(off):+.1f} ± {_ms(unc):.1f} ms" for node, (off, unc) in flagged.items())
                        + "; merge/export align timelines with these offsets"))
    return result.exit_code
