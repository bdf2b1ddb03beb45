"""The agent's API over HTTPS with mutual TLS: `straggler serve`, and `start_background` for
`straggler trace --listen`.

Routes (JSON unless noted):
  POST /api/v1/query     {"sql", "limit"[, "timeout_s"]} -> {"node","columns","rows","truncated","elapsed_ms"};
                         400 {"error","kind"} for SQL that is refused or fails (kind: rejected|sql-error|timeout)
  GET  /api/v1/clock     -> {"node","realtime_ns","monotonic_ns","pairs":[[mono_ns, real_ns], ...]}
                         (?pairs=N: the last N stored clock pairs, 0 for none; the clock is read last)
  GET  /api/v1/health    -> straggler.status.collect_status() of the served database
  GET  /api/v1/snapshot  -> a consistent copy of the database (application/vnd.sqlite3)
  GET  /api/v1/live      -> store.live.live_summary(): the step-time model's rows since ?since=NS
                         (node CLOCK_MONOTONIC ns), for `straggler watch`; with the node's clocks
  GET  /metrics          -> Prometheus metrics of the node (api/metrics.py; text exposition format)

`--metrics-listen ADDR:PORT` also serves /metrics alone over plain HTTP, on loopback only unless
--metrics-any-address says otherwise (for a local Prometheus agent or node exporter).

One thread per connection (bounded), HTTP/1.1 keep-alive, the TLS handshake done in that
thread with a time limit (a client that connects and says nothing holds one thread, not the
server); a slow query does not block /health. Request bodies are bounded.

This module serves what the store and status modules return; it must not write to the
database and must not hold SQL rules of its own (those live in store/query.py).
"""
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import socketserver
import ssl
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .. import __version__
from ..clock import read_clock_pair
from ..errors import StragglerError
from ..store.query import (DEFAULT_DB, DatabaseUnavailable, QueryError, node_name, open_readonly, run_query)
from ..tls import TLSOptions, add_tls_arguments, server_context, warn_no_tls

log = logging.getLogger("straggler.api")

DEFAULT_PORT = 7433
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
MAX_BODY_BYTES = 1 << 20          # a query request is SQL text, not data
MAX_ROWS = 200_000                 # per request, whatever the client asks (explain asks for 200k)
MAX_QUERY_SECONDS = 30.0
DEFAULT_QUERY_SECONDS = 10.0
IO_TIMEOUT_S = 30.0                # handshake, request read, idle keep-alive
MAX_CONNECTIONS = 64
CLOCK_PAIRS_DEFAULT = 16
API_PREFIX = "/api/v1"


def parse_listen(listen, default_port=DEFAULT_PORT):
    """'ADDR:PORT', '[v6]:PORT', ':PORT', 'PORT' or 'ADDR' -> (host, port)."""
    text = str(listen).strip()
    if not text:
        return "0.0.0.0", default_port
    if text.isdigit():
        return "0.0.0.0", int(text)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
        return host, int(port) if port else default_port
    if text.count(":") > 1:  # bare IPv6 address
        return text, default_port
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    if not port.isdigit():
        raise StragglerError(f"--listen {listen!r}: port {port!r} is not a number; use ADDR:PORT")
    return host or "0.0.0.0", int(port)


def _is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _is_wildcard(host):
    return host in ("", "0.0.0.0", "::", "*")


class _App:
    """What the handlers need: the database, the node name and the limits."""

    def __init__(self, db_path, node, max_rows=MAX_ROWS, max_query_seconds=MAX_QUERY_SECONDS,
                 snapshot_dir=None):
        self.db_path = db_path
        self.node = node
        self.max_rows = max_rows
        self.max_query_seconds = max_query_seconds
        self.snapshot_dir = snapshot_dir
        self.snapshot_lock = threading.Lock()
        self.started_mono_ns = time.monotonic_ns()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"straggler/{__version__}"
    timeout = IO_TIMEOUT_S

    # -- plumbing
    def log_message(self, fmt, *args):
        log.debug("%s %s", self.address_string(), fmt % args)

    def log_error(self, fmt, *args):
        log.info("%s %s", self.address_string(), fmt % args)

    def _send(self, code, body: bytes, content_type="application/json", extra_headers=()):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Straggler-Node", self.server.app.node)
        for name, value in extra_headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        # status line, headers and body in one write: no Nagle/delayed-ACK stalls, one TLS record
        self._headers_buffer.append(b"\r\n")
        self._headers_buffer.append(body)
        self.flush_headers()

    def _json(self, code, obj):
        self._send(code, (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode())

    def _error(self, code, message, kind="error"):
        self._json(code, {"node": self.server.app.node, "error": " ".join(str(message).split()), "kind": kind})

    def _route(self):
        parts = urlsplit(self.path)
        return parts.path.rstrip("/") or "/", parse_qs(parts.query)

    # -- methods
    def do_GET(self):
        path, query = self._route()
        try:
            if path == f"{API_PREFIX}/clock":
                return self._clock(query)
            if path == f"{API_PREFIX}/health":
                return self._health()
            if path == f"{API_PREFIX}/snapshot":
                return self._snapshot()
            if path == f"{API_PREFIX}/live":
                return self._live(query)
            if path == "/metrics":
                return self._metrics()
            if path == f"{API_PREFIX}/query":
                return self._error(405, "use POST for /api/v1/query with a JSON body {\"sql\": ..., \"limit\": N}")
            return self._error(404, f"no such route {path}; routes: {API_PREFIX}/query (POST), "
                                    f"{API_PREFIX}/clock, {API_PREFIX}/health, {API_PREFIX}/snapshot, {API_PREFIX}/live, /metrics")
        except DatabaseUnavailable as exc:
            return self._error(503, exc, kind="database")
        except StragglerError as exc:
            return self._error(500, exc)

    def do_POST(self):
        path, _ = self._route()
        if path != f"{API_PREFIX}/query":
            self.close_connection = True
            return self._error(404 if not path.startswith(API_PREFIX) else 405, f"POST is only for {API_PREFIX}/query")
        body = self._read_body()
        if body is None:
            return
        try:
            request = json.loads(body.decode("utf-8"))
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except (UnicodeDecodeError, ValueError) as exc:
            return self._error(400, f"the body must be a JSON object {{\"sql\": ..., \"limit\": N}} ({exc})", kind="bad-request")
        sql = request.get("sql")
        if not isinstance(sql, str):
            return self._error(400, "missing \"sql\" (a string) in the request", kind="bad-request")
        app = self.server.app
        try:
            limit = min(int(request.get("limit", 10000)), app.max_rows)
            timeout_s = min(float(request.get("timeout_s", DEFAULT_QUERY_SECONDS)), app.max_query_seconds)
        except (TypeError, ValueError):
            return self._error(400, "\"limit\" and \"timeout_s\" must be numbers", kind="bad-request")
        try:
            result = run_query(app.db_path, sql, limit=limit, timeout_s=timeout_s)
        except QueryError as exc:
            return self._error(400, exc, kind=exc.kind)
        except DatabaseUnavailable as exc:
            return self._error(503, exc, kind="database")
        except StragglerError as exc:
            return self._error(500, exc)
        result.node = app.node
        return self._json(200, result.to_dict())

    def _read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            self._error(411, "send the body with a Content-Length, not chunked", kind="bad-request")
            return None
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.strip().isdigit():
            self.close_connection = True
            self._error(411, "a Content-Length header is required", kind="bad-request")
            return None
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._error(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}", kind="bad-request")
            return None
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return None
        return body

    # -- routes
    def _clock(self, query):
        app = self.server.app
        try:
            wanted = int((query.get("pairs") or [CLOCK_PAIRS_DEFAULT])[0])
        except ValueError:
            wanted = CLOCK_PAIRS_DEFAULT
        pairs = []
        if wanted > 0:
            try:
                conn = open_readonly(app.db_path)
                try:
                    pairs = [list(p) for p in reversed(conn.execute(
                        "SELECT mono_ns, real_ns FROM clock_pairs ORDER BY mono_ns DESC LIMIT ?",
                        (min(wanted, 1000),)).fetchall())]
                finally:
                    conn.close()
            except Exception as exc:  # the clock answer stays useful without stored pairs
                log.debug("clock pairs unavailable: %s", exc)
        # read the clocks last, just before the answer leaves: keeps the two legs of the round trip even
        mono_ns, real_ns = read_clock_pair()
        body = json.dumps({"node": app.node, "realtime_ns": real_ns, "monotonic_ns": mono_ns,
                           "pairs": pairs}, separators=(",", ":")).encode() + b"\n"
        self._send(200, body)

    def _health(self):
        from ..status import collect_status
        app = self.server.app
        status = collect_status(app.db_path)
        status["db_node"] = status.get("node")
        status["node"] = app.node
        status["api"] = {"version": __version__, "uptime_s": round((time.monotonic_ns() - app.started_mono_ns) / 1e9, 1),
                         "tls": self.server.ssl_context is not None}
        self._json(200, status)

    def _live(self, query):
        from ..store.live import live_summary
        app = self.server.app
        text = (query.get("since") or [None])[0]
        try:
            since = int(text) if text not in (None, "") else None
        except ValueError:
            return self._error(400, f"since={text!r}: give the node's CLOCK_MONOTONIC time in ns (an integer)",
                               kind="bad-request")
        answer = live_summary(app.db_path, since)
        mono_ns, real_ns = read_clock_pair()   # last, as for /clock: the watch's offset sample
        answer.update(node=app.node, monotonic_ns=mono_ns, realtime_ns=real_ns)
        self._json(200, answer)

    def _metrics(self):
        from . import metrics
        app = self.server.app
        try:
            body = metrics.render(app.db_path, app.node)
        except metrics.MetricsUnavailable as exc:
            return self._error(503, exc, kind="metrics-unavailable")
        self._send(200, body, content_type=metrics.CONTENT_TYPE)

    def _snapshot(self):
        from ..store.snapshot import snapshot
        app = self.server.app
        if not app.snapshot_lock.acquire(timeout=1.0):
            return self._error(503, "another snapshot is being made; retry in a moment", kind="busy")
        work_dir = None
        try:
            work_dir = tempfile.mkdtemp(prefix="straggler-snapshot-", dir=app.snapshot_dir)
            out_path = os.path.join(work_dir, "snapshot.db")
            summary = snapshot(app.db_path, out_path)
            size = summary["bytes"]
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.sqlite3")
            self.send_header("Content-Length", str(size))
            self.send_header("Content-Disposition", f'attachment; filename="{app.node}.db"')
            self.send_header("X-Straggler-Node", app.node)
            self.end_headers()
            with open(out_path, "rb") as fh:
                shutil.copyfileobj(fh, self.wfile, length=1 << 20)
        finally:
            app.snapshot_lock.release()
            if work_dir:
                shutil.rmtree(work_dir, ignore_errors=True)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False      # stop() must not wait for a client's hung query
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, app, ssl_context, max_connections=MAX_CONNECTIONS):
        self.app = app
        self.ssl_context = ssl_context
        self._slots = threading.BoundedSemaphore(max_connections)
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)

    def server_bind(self):
        # HTTPServer.server_bind would resolve our own address (socket.getfqdn): a slow start on a
        # node with broken DNS, for a name nothing uses
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address):
        # bounded: with every slot busy, the accept loop waits (connections queue in the backlog)
        if not self._slots.acquire(timeout=IO_TIMEOUT_S):
            log.warning("connection from %s dropped: %d connections busy", client_address[0], MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        conn = request
        try:
            request.settimeout(IO_TIMEOUT_S)
            try:
                request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if not self._protocol_matches(request, client_address):
                return
            if self.ssl_context is not None:
                try:
                    conn = self.ssl_context.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    # wrong CA, no client certificate, TLS 1.2, plain HTTP: one line, no traceback
                    log.info("TLS handshake with %s failed: %s", client_address[0], " ".join(str(exc).split()))
                    return
            self.finish_request(conn, client_address)
        except (ConnectionError, TimeoutError, ssl.SSLError) as exc:
            log.debug("connection from %s ended: %s", client_address[0], exc)
        except Exception:
            log.exception("request from %s failed", client_address[0])
        finally:
            try:
                conn.close()
            except OSError:
                pass
            if conn is not request:
                try:
                    request.close()
                except OSError:
                    pass
            self._slots.release()


    def _protocol_matches(self, request, client_address):
        """Answer a client that speaks the other protocol (plain HTTP to HTTPS, TLS to plain HTTP)
        with a plain-text 400 that says so, instead of letting both sides wait."""
        try:
            first = request.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return False
        if not first:
            return False
        is_tls = first == b"\x16"   # a TLS handshake record
        if (self.ssl_context is not None) == is_tls:
            return True
        if self.ssl_context is not None:
            message = (f"this straggler agent ({self.app.node}) speaks HTTPS with client certificates only; "
                       f"use https:// with --ca/--cert/--key (drop --no-tls)")
            kind = "tls-required"
        else:
            message = (f"this straggler agent ({self.app.node}) serves plain HTTP (--no-tls); "
                       f"pass --no-tls to the client")
            kind = "plain-http"
        log.info("%s connected with %s; told it so", client_address[0], "TLS" if is_tls else "plain HTTP")
        body = (json.dumps({"node": self.app.node, "error": message, "kind": kind}) + "\n").encode()
        head = (f"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"X-Straggler-Node: {self.app.node}\r\nConnection: close\r\n\r\n").encode()
        try:
            request.sendall(head + body)
            # lingering close: read what the client already sent, so closing does not reset the
            # connection (an RST would discard our answer before the client reads it)
            request.shutdown(socket.SHUT_WR)
            request.settimeout(1.0)
            drained = 0
            while drained < (1 << 20):
                chunk = request.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass
        return False


class ServerHandle:
    """A running API server: .host, .port, .url, .node, .stop()."""

    def __init__(self, server, thread, node, scheme):
        self._server = server
        self._thread = thread
        self.node = node
        self.host, self.port = server.server_address[:2]
        self.scheme = scheme
        self._stopped = False

    @property
    def url(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def stop(self, timeout_s=5.0):
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=timeout_s)

    def wait(self):
        """Block until stopped (polling, so signals are handled)."""
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def make_server(db_path, node=None, listen=DEFAULT_LISTEN, tls=None, **limits):
    """Bind (not yet serving). Returns (server, node, scheme)."""
    tls = tls or TLSOptions()
    host, port = parse_listen(listen)
    if tls.no_tls:
        warn_no_tls(log)
        if not _is_loopback(host) and not tls.any_address:
            if _is_wildcard(host):
                log.warning("--no-tls: binding to 127.0.0.1 only (add --no-tls-any-address to serve plain HTTP "
                            "on every address)")
                host = "127.0.0.1"
            else:
                raise StragglerError(f"refusing to serve plain HTTP on {host}: --no-tls binds to loopback only; "
                                     f"add --no-tls-any-address, or drop --no-tls and use certificates")
        context = None
    else:
        context = server_context(tls)
    # fail early (and clearly) on a database we cannot read; the API serves it read-only
    open_readonly(db_path).close()
    node = node or node_name(db_path)
    app = _App(db_path, node, **limits)
    try:
        server = _Server((host, port), app, context)
    except OSError as exc:
        raise StragglerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                             f"is another agent serving there? choose another --listen") from None
    return server, node, ("http" if context is None else "https")


def start_background(db_path, node=None, listen=DEFAULT_LISTEN, tls=None, **limits) -> ServerHandle:
    """Serve db_path in a background thread; returns a handle with .port and .stop()."""
    server, node, scheme = make_server(db_path, node=node, listen=listen, tls=tls, **limits)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name=f"straggler-api-{server.server_address[1]}", daemon=True)
    thread.start()
    handle = ServerHandle(server, thread, node, scheme)
    log.info("serving %s for node %s (database %s)", handle.url, node, db_path)
    return handle


# ---------------------------------------------------------------- CLI

def add_arguments(parser):
    parser.add_argument("--db", "-d", default=DEFAULT_DB, help=f"the node's database (default {DEFAULT_DB})")
    parser.add_argument("--node", default=None, help="node name in answers (default: the database's meta.node, else the hostname)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="ADDR:PORT", help=f"where to listen (default {DEFAULT_LISTEN})")
    parser.add_argument("--max-rows", type=int, default=MAX_ROWS, help=f"row cap per query (default {MAX_ROWS})")
    parser.add_argument("--max-query-seconds", type=float, default=MAX_QUERY_SECONDS,
                        help=f"time limit per query, whatever the client asks (default {MAX_QUERY_SECONDS:g})")
    parser.add_argument("--snapshot-dir", default=None, help="where snapshots are staged before streaming (default: system temp)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    add_tls_arguments(parser)
    from .metrics import add_metrics_arguments
    add_metrics_arguments(parser)


def run(args):
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="straggler serve: %(levelname)s %(message)s")
    handle = start_background(args.db, node=args.node, listen=args.listen, tls=TLSOptions.from_args(args),
                              max_rows=args.max_rows, max_query_seconds=args.max_query_seconds,
                              snapshot_dir=args.snapshot_dir)
    metrics_server = None
    if args.metrics_listen:
        from .metrics import start_plain_server
        try:
            metrics_server, _ = start_plain_server(args.db, handle.node, args.metrics_listen, args.metrics_any_address)
        except BaseException:
            handle.stop()
            raise
    extra = ""
    if metrics_server is not None:
        extra = " metrics=http://%s:%d/metrics" % metrics_server.server_address[:2]
    print(f"straggler serve: {handle.url} node={handle.node} db={args.db}{extra}", file=sys.stderr, flush=True)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(0.5):
        pass
    handle.stop()
    if metrics_server is not None:
        metrics_server.shutdown()
        metrics_server.server_close()
    return 0
