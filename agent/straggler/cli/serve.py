"""`straggler serve`: arguments in, the node's database served over HTTPS with mutual TLS
(straggler.api.server; the routes are listed in straggler.api.routes), and optionally /metrics
alone over plain HTTP on loopback (`--metrics-listen ADDR:PORT`, straggler.api.metrics; any other
address only with --metrics-any-address), until SIGTERM or SIGINT.

Argument parsing and the one status line on stderr; the serving itself lives in the API package.
"""
import logging
import signal
import sys
import threading

from ..addresses import format_address
from ..api.metrics import start_plain_server
from ..api.routes import LIGHT_TIMEOUT_S, MAX_ANSWER_BYTES, MAX_QUERY_SECONDS, MAX_ROWS, SNAPSHOT_TIMEOUT_S
from ..api.server import DEFAULT_LISTEN, ServerLimits, start_background
from ..store.query import DEFAULT_DB
from .common import add_metrics_arguments, add_tls_arguments, tls_options

POLL_S = 0.5   # how often the main thread looks for a signal


def add_arguments(parser):
    parser.add_argument("--db", "-d", default=DEFAULT_DB, help=f"the node's database (default {DEFAULT_DB})")
    parser.add_argument("--node", default=None, help="node name in answers (default: the database's meta.node, else the hostname)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="ADDR:PORT", help=f"where to listen (default {DEFAULT_LISTEN})")
    parser.add_argument("--max-rows", type=int, default=MAX_ROWS, help=f"row cap per query (default {MAX_ROWS})")
    parser.add_argument("--max-answer-bytes", type=int, default=MAX_ANSWER_BYTES,
                        help=f"byte cap per query answer; over it the answer says truncated_reason \"bytes\" "
                             f"(default {MAX_ANSWER_BYTES})")
    parser.add_argument("--max-query-seconds", type=float, default=MAX_QUERY_SECONDS,
                        help=f"time limit per query, whatever the client asks (default {MAX_QUERY_SECONDS:g})")
    parser.add_argument("--snapshot-dir", default=None, help="where snapshots are staged before streaming (default: system temp)")
    parser.add_argument("--snapshot-timeout", type=float, default=SNAPSHOT_TIMEOUT_S,
                        help=f"seconds a snapshot may take before it is stopped (default {SNAPSHOT_TIMEOUT_S:g})")
    parser.add_argument("--light-timeout", type=float, default=LIGHT_TIMEOUT_S,
                        help=f"seconds /api/v1/health, /live, /clock and /metrics may take; then 503 "
                             f"(default {LIGHT_TIMEOUT_S:g})")
    limits = ServerLimits()
    parser.add_argument("--max-inflight-bytes", type=int, default=limits.max_inflight_bytes,
                        help=f"bytes of answers made and not yet sent, all clients together; a row waits for room, "
                             f"then its answer ends (default {limits.max_inflight_bytes})")
    parser.add_argument("--max-query-memory", type=int, default=limits.max_query_memory,
                        help=f"bytes SQLite may allocate for the running queries together; over it the query that "
                             f"did the most work is stopped, 0 for no cap (default {limits.max_query_memory})")
    parser.add_argument("--max-query-temp", type=int, default=limits.max_query_temp,
                        help=f"bytes of temporary files one query may write (sorting, grouping); over it the query "
                             f"is stopped, 0 for no cap (default {limits.max_query_temp})")
    parser.add_argument("--max-connections", type=int, default=limits.max_connections,
                        help=f"open connections in all (default {limits.max_connections})")
    parser.add_argument("--max-connections-per-client", type=int, default=limits.max_connections_per_client,
                        help=f"open connections of one client certificate; over it: 429 "
                             f"(default {limits.max_connections_per_client})")
    parser.add_argument("--max-queries-per-client", type=int, default=limits.max_queries_per_client,
                        help=f"queries one client certificate runs at once; over it: 429 "
                             f"(default {limits.max_queries_per_client})")
    parser.add_argument("--max-connection-seconds", type=float, default=limits.max_connection_s,
                        help=f"a connection's lifetime: the answer after it closes the connection "
                             f"(default {limits.max_connection_s:g})")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    add_tls_arguments(parser)
    add_metrics_arguments(parser)


def run(args):
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="straggler serve: %(levelname)s %(message)s")
    handle = start_background(args.db, node=args.node, listen=args.listen, tls=tls_options(args),
                              max_rows=args.max_rows, max_query_seconds=args.max_query_seconds,
                              max_answer_bytes=args.max_answer_bytes, snapshot_dir=args.snapshot_dir,
                              snapshot_timeout_s=args.snapshot_timeout, max_inflight_bytes=args.max_inflight_bytes,
                              max_query_memory=args.max_query_memory, max_query_temp=args.max_query_temp,
                              max_connections=args.max_connections,
                              max_connections_per_client=args.max_connections_per_client,
                              max_queries_per_client=args.max_queries_per_client,
                              max_connection_s=args.max_connection_seconds, light_timeout_s=args.light_timeout)
    metrics_server = None
    if args.metrics_listen:
        try:
            metrics_server, _ = start_plain_server(args.db, handle.node, args.metrics_listen, args.metrics_any_address)
        except BaseException:
            handle.stop()
            raise
    extra = ""
    if metrics_server is not None:
        extra = f" metrics=http://{format_address(*metrics_server.server_address[:2])}/metrics"
    print(f"straggler serve: {handle.url} node={handle.node} db={args.db}{extra}", file=sys.stderr, flush=True)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(POLL_S):
        pass
    handle.stop()
    if metrics_server is not None:
        metrics_server.shutdown()
        metrics_server.server_close()
    return 0
