"""The agent's API over HTTPS with mutual TLS: `straggler serve`, and `start_background` for
`straggler trace --listen`.

Routes (JSON unless noted; role = what the client certificate must grant, see tls.peer_roles):
  POST /api/v1/query     {"sql", "limit"[, "timeout_s"]} -> {"node","columns","rows","truncated",
                         ["truncated_reason": "limit"|"bytes",] "elapsed_ms"}; 400 {"error","kind"} for SQL
                         that is refused or fails (kind: rejected|sql-error|timeout)           role query
  GET  /api/v1/clock     -> {"node","realtime_ns","monotonic_ns","pairs":[[mono_ns, real_ns], ...]}
                         (?pairs=N: the last N stored clock pairs, 0 for none; the clock is read last)  query
  GET  /api/v1/health    -> store.status.collect_status() of the served database            query
  GET  /api/v1/live      -> store.live.live_summary(): the step-time model's rows since ?since=NS
                         (node CLOCK_MONOTONIC ns), for `straggler watch`; with the node's clocks  query
  GET  /metrics          -> Prometheus metrics of the node (api/metrics.py; text exposition)   query
  GET  /api/v1/snapshot  -> a consistent copy of the whole database (application/vnd.sqlite3)  snapshot

`--metrics-listen ADDR:PORT` also serves /metrics alone over plain HTTP, on loopback only unless
--metrics-any-address says otherwise (for a local Prometheus agent or node exporter).

How it holds under hostile and heavy use. The server is one asyncio event loop (standard library:
no dependency to ship to the nodes, and TLS handshakes that never hold a thread); SQLite work runs
in small thread pools (queries; snapshots apart, one at a time), so a slow query blocks neither the
loop nor /health.
  - The accept loop only accepts. A connection gets HANDSHAKE_TIMEOUT_S to send its first byte and
    finish the TLS handshake; until then it is "pending", and each peer address may hold at most
    MAX_PENDING_PER_PEER pending connections (MAX_PENDING in all): over that, its oldest pending
    connection is closed. Idle or half-open sockets cannot starve an authenticated client.
  - A request (its line, headers and body) must arrive within REQUEST_TIMEOUT_S of the connection
    becoming ready for it (after the handshake, or after the previous answer); bounded sizes; every
    malformed request gets a 4xx with one line (non-finite numbers, over-deep JSON, duplicate
    Content-Length, chunked bodies, bad request lines) and the server goes on serving.
  - An answer is built in bounded memory (query answers are encoded while fetched, at most
    --max-answer-bytes, then `truncated_reason: "bytes"`; SQLite's length limit stops a single huge
    value) and sent with a Content-Length in chunks, under a deadline that grows with its size: a
    reader that does not take it in time gets a connection closed short of the Content-Length,
    which its HTTP client reports as an incomplete answer, never a silently short one.
  - The TLS context is re-read when the CA, certificate, key or CRL files change (tls.ServerContextCache):
    a revoked client certificate fails its next handshake without a restart.

This module serves what the store and status modules return; it must not write to the database
and must not hold SQL rules of its own (those live in store/query.py).
"""
import asyncio
import collections
import concurrent.futures
import http.client
import io
import ipaddress
import json
import logging
import math
import os
import shutil
import signal
import socket
import ssl
import struct
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

from .. import __version__, defaults
from ..clock import read_clock_pair
from ..errors import StragglerError
from ..text import one_line
from ..store.query import (DEFAULT_DB, DatabaseUnavailable, JsonAnswer, QueryError, node_name, open_readonly,
                           run_query)
from ..tls import (ROLE_QUERY, ROLE_SNAPSHOT, ROLES, ServerContextCache, TLSOptions, peer_roles,
                   warn_no_tls)

log = logging.getLogger("straggler.api")

DEFAULT_PORT = defaults.AGENT_PORT
DEFAULT_LISTEN = defaults.LISTEN
MAX_BODY_BYTES = 1 << 20           # a query request is SQL text, not data
MAX_HEAD_BYTES = 16 << 10          # request line and headers
MAX_HEADERS = 64
MAX_JSON_DEPTH = 16
MAX_ROWS = 200_000                  # per request, whatever the client asks (explain asks for 200k)
MAX_ANSWER_BYTES = 64 << 20         # per answer, whatever the client asks
MAX_QUERY_SECONDS = 30.0
DEFAULT_QUERY_SECONDS = 10.0
HANDSHAKE_TIMEOUT_S = 5.0           # first byte and TLS handshake
REQUEST_TIMEOUT_S = 10.0            # one whole request (line, headers, body), idle keep-alive included
SEND_TIMEOUT_S = 30.0               # an answer's deadline: this, plus its size at MIN_SEND_RATE
MIN_SEND_RATE = 1 << 20             # bytes/s a reader must take at least
SEND_CHUNK = 256 << 10
MAX_PENDING_PER_PEER = 16           # connections of one address not yet authenticated
MAX_PENDING = 256
MAX_CONNECTIONS = 512               # open connections in all (pending and authenticated)
QUERY_WORKERS = 4                   # SQLite work at once (queries, health, live, metrics)
SNAPSHOT_TIMEOUT_S = 120.0
CLOCK_PAIRS_DEFAULT = 16
API_PREFIX = "/api/v1"
ROUTE_ROLES = {f"{API_PREFIX}/query": ROLE_QUERY, f"{API_PREFIX}/clock": ROLE_QUERY,
               f"{API_PREFIX}/health": ROLE_QUERY, f"{API_PREFIX}/live": ROLE_QUERY, "/metrics": ROLE_QUERY,
               f"{API_PREFIX}/snapshot": ROLE_SNAPSHOT}
ROUTES_TEXT = (f"{API_PREFIX}/query (POST), {API_PREFIX}/clock, {API_PREFIX}/health, {API_PREFIX}/snapshot, "
               f"{API_PREFIX}/live, /metrics")
REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Content Too Large", 414: "URI Too Long",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}


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


class BadRequest(Exception):
    """A request refused before any route ran: (status code, one line, kind)."""

    def __init__(self, code, message, kind="bad-request"):
        super().__init__(message)
        self.code = code
        self.kind = kind


class _Answer:
    """What a route returns: status, headers and the body as chunks (or a file to stream)."""

    def __init__(self, code, chunks=(), content_type="application/json", headers=(), path=None, size=None,
                 cleanup=None):
        self.code = code
        self.chunks = list(chunks)
        self.content_type = content_type
        self.headers = list(headers)
        self.path = path
        self.size = size if size is not None else sum(len(c) for c in self.chunks)
        self.cleanup = cleanup


def _json_answer(code, obj):
    return _Answer(code, [(json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()])


def _json_depth(text):
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _request_json(body):
    """The query request's JSON object; BadRequest for anything else (one line)."""
    def no_constants(name):
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(400, "the body is not UTF-8 text; send a JSON object {\"sql\": ..., \"limit\": N}") from None
    if _json_depth(text) > MAX_JSON_DEPTH:   # checked before the parser recurses
        raise BadRequest(400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels; send a flat "
                              f"object {{\"sql\": ..., \"limit\": N}}")
    try:
        request = json.loads(text, parse_constant=no_constants)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(400, f"the body must be a JSON object {{\"sql\": ..., \"limit\": N}} ({one_line(exc)})") from None
    if not isinstance(request, dict):
        raise BadRequest(400, "the body must be a JSON object {\"sql\": ..., \"limit\": N}")
    return request


def _number(request, key, default, integer):
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(400, f"\"{key}\" must be a number, got {json.dumps(value)[:40]}")
    if not math.isfinite(value) or value < 0:
        raise BadRequest(400, f"\"{key}\" must be a finite number >= 0, got {value}")
    if integer and value != int(value):
        raise BadRequest(400, f"\"{key}\" must be a whole number, got {value}")
    return int(value) if integer else float(value)


class _App:
    """What the routes need: the database, the node name and the limits. Routes run in worker
    threads and return an _Answer; none of them touches a socket."""

    def __init__(self, db_path, node, max_rows=MAX_ROWS, max_query_seconds=MAX_QUERY_SECONDS,
                 snapshot_dir=None, max_answer_bytes=MAX_ANSWER_BYTES, snapshot_timeout_s=SNAPSHOT_TIMEOUT_S,
                 handshake_timeout_s=HANDSHAKE_TIMEOUT_S, request_timeout_s=REQUEST_TIMEOUT_S,
                 send_timeout_s=SEND_TIMEOUT_S, min_send_rate=MIN_SEND_RATE):
        self.db_path = db_path
        self.handshake_timeout_s = handshake_timeout_s
        self.request_timeout_s = request_timeout_s
        self.send_timeout_s = send_timeout_s
        self.min_send_rate = min_send_rate
        self.node = node
        self.max_rows = max_rows
        self.max_query_seconds = max_query_seconds
        self.max_answer_bytes = max_answer_bytes
        self.snapshot_dir = snapshot_dir
        self.snapshot_timeout_s = snapshot_timeout_s
        self.tls = False
        self.started_mono_ns = time.monotonic_ns()

    def error(self, code, message, kind="error"):
        return _json_answer(code, {"node": self.node, "error": one_line(message), "kind": kind})

    def query(self, body):
        request = _request_json(body)
        sql = request.get("sql")
        if not isinstance(sql, str):
            raise BadRequest(400, "missing \"sql\" (a string) in the request")
        limit = min(_number(request, "limit", 10000, integer=True), self.max_rows)
        timeout_s = min(_number(request, "timeout_s", DEFAULT_QUERY_SECONDS, integer=False), self.max_query_seconds)
        answer = JsonAnswer(self.node, self.max_answer_bytes)
        try:
            run_query(self.db_path, sql, limit=limit, timeout_s=timeout_s, into=answer)
        except QueryError as exc:
            return self.error(400, exc, kind=exc.kind)
        return _Answer(200, answer.chunks)

    def clock_pairs(self, query):
        try:
            wanted = int((query.get("pairs") or [CLOCK_PAIRS_DEFAULT])[0])
        except ValueError:
            wanted = CLOCK_PAIRS_DEFAULT
        if wanted <= 0:
            return []
        try:
            conn = open_readonly(self.db_path)
            try:
                return [list(p) for p in reversed(conn.execute(
                    "SELECT mono_ns, real_ns FROM clock_pairs ORDER BY mono_ns DESC LIMIT ?",
                    (min(wanted, 1000),)).fetchall())]
            finally:
                conn.close()
        except Exception as exc:  # the clock answer stays useful without stored pairs
            log.debug("clock pairs unavailable: %s", exc)
            return []

    def health(self, query):
        from ..store.status import collect_status
        status = collect_status(self.db_path)
        status["db_node"] = status.get("node")
        status["node"] = self.node
        status["api"] = {"version": __version__, "uptime_s": round((time.monotonic_ns() - self.started_mono_ns) / 1e9, 1),
                         "tls": self.tls}
        return _json_answer(200, status)

    def live(self, query):
        from ..store.live import live_summary
        text = (query.get("since") or [None])[0]
        try:
            since = int(text) if text not in (None, "") else None
        except ValueError:
            raise BadRequest(400, f"since={text!r}: give the node's CLOCK_MONOTONIC time in ns (an integer)") from None
        answer = live_summary(self.db_path, since)
        mono_ns, real_ns = read_clock_pair()   # last, as for /clock: the watch's offset sample
        answer.update(node=self.node, monotonic_ns=mono_ns, realtime_ns=real_ns)
        return _json_answer(200, answer)

    def metrics(self, query):
        from . import metrics
        try:
            body = metrics.render(self.db_path, self.node)
        except metrics.MetricsUnavailable as exc:
            return self.error(503, exc, kind="metrics-unavailable")
        return _Answer(200, [body], content_type=metrics.CONTENT_TYPE)

    def snapshot(self, query):
        from ..store.snapshot import snapshot, stage_dir
        work_dir = stage_dir(self.snapshot_dir)
        try:
            out_path = os.path.join(work_dir, "snapshot.db")
            summary = snapshot(self.db_path, out_path, deadline_s=self.snapshot_timeout_s)
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        return _Answer(200, content_type="application/vnd.sqlite3", path=out_path, size=summary["bytes"],
                       headers=[("Content-Disposition", f'attachment; filename="{self.node}.db"')],
                       cleanup=lambda: shutil.rmtree(work_dir, ignore_errors=True))


class _Request:
    __slots__ = ("method", "path", "query", "version", "headers", "body", "close")

    def __init__(self, method, target, version, headers):
        parts = urlsplit(target)
        self.method = method
        self.path = parts.path.rstrip("/") or "/"
        self.query = parse_qs(parts.query)
        self.version = version
        self.headers = headers
        self.body = b""
        connection = (headers.get("Connection") or "").lower()
        self.close = version == "HTTP/1.0" and "keep-alive" not in connection or "close" in connection


def _parse_head(head: bytes) -> _Request:
    """The request line and headers (standard library parser); BadRequest for anything malformed."""
    line, _, rest = head.partition(b"\r\n")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "the request line is not ASCII") from None
    parts = text.split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise BadRequest(400, f"malformed request line {text[:80]!r}; expected METHOD PATH HTTP/1.1")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505, f"{version[:20]!r} is not spoken here; use HTTP/1.1")
    if not target.startswith("/"):
        raise BadRequest(400, f"request target {target[:80]!r} must be a path")
    try:
        headers = http.client.parse_headers(io.BytesIO(rest))
    except (http.client.HTTPException, ValueError) as exc:
        raise BadRequest(431, f"malformed or too many headers ({one_line(exc)})") from None
    if len(headers) > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} headers")
    if headers.defects:
        raise BadRequest(400, "malformed header lines")
    return _Request(method, target, version, headers)


def _body_length(request):
    """The body's length from its one Content-Length; BadRequest for chunked, duplicate or bad ones."""
    if request.headers.get("Transfer-Encoding") is not None:
        raise BadRequest(411, "send the body with a Content-Length, not Transfer-Encoding")
    values = request.headers.get_all("Content-Length") or []
    if len(values) > 1:
        raise BadRequest(400, "more than one Content-Length header")
    if not values:
        if request.method == "POST":
            raise BadRequest(411, "a Content-Length header is required")
        return 0
    text = values[0].strip()
    if not text.isdigit() or not text.isascii():
        raise BadRequest(400, f"Content-Length {text[:20]!r} is not a number")
    length = int(text)
    if length > MAX_BODY_BYTES:
        raise BadRequest(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}")
    return length


class _PlainStream:
    """A connection's bytes, with the reads an HTTP/1.1 server needs (bounded)."""

    def __init__(self, loop, sock):
        self.loop = loop
        self.sock = sock
        self.buffer = bytearray()
        self.eof = False

    async def _recv_raw(self):
        return await self.loop.sock_recv(self.sock, 65536)

    async def _fill(self):
        data = await self._recv_raw()
        if not data:
            self.eof = True
        self.buffer += data

    async def read_until(self, separator, limit):
        """Bytes up to and including separator; b"" at EOF before any byte; BadRequest when
        more than limit bytes come without it, or the peer stops in the middle."""
        start = 0
        while True:
            index = self.buffer.find(separator, start)
            if index >= 0:
                end = index + len(separator)
                if end > limit:
                    raise BadRequest(431, f"the request line and headers are over {limit} bytes")
                data = bytes(self.buffer[:end])
                del self.buffer[:end]
                return data
            if len(self.buffer) > limit:
                raise BadRequest(431, f"the request line and headers are over {limit} bytes")
            if self.eof:
                if self.buffer.strip():
                    raise BadRequest(400, "the request ended before its headers did")
                return b""
            start = max(0, len(self.buffer) - len(separator) + 1)
            await self._fill()

    async def read_exactly(self, length):
        while len(self.buffer) < length:
            if self.eof:
                raise BadRequest(400, "the body ended before its Content-Length")
            await self._fill()
        data = bytes(self.buffer[:length])
        del self.buffer[:length]
        return data

    async def write(self, data):
        await self.loop.sock_sendall(self.sock, data)

    def peercert(self):
        return None


class _TLSStream(_PlainStream):
    """TLS over the socket with the standard library's ssl.SSLObject and memory BIOs: the
    handshake runs in the event loop (no thread waits on a silent client), and a failed
    handshake still sends its alert (the client reads "protocol version", "certificate
    revoked", … instead of a bare EOF)."""

    def __init__(self, loop, sock, context):
        super().__init__(loop, sock)
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)

    async def _flush(self):
        data = self.outgoing.read()
        if data:
            await self.loop.sock_sendall(self.sock, data)

    async def handshake(self):
        while True:
            try:
                self.tls.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                data = await self._recv_raw()
                if not data:
                    raise ConnectionResetError("the client closed the connection during the TLS handshake")
                self.incoming.write(data)
            except ssl.SSLError:
                try:   # the alert, so the client knows why, then a lingering close: closing with the
                    # client's first request unread would reset the connection and lose the alert
                    await asyncio.wait_for(self._flush(), 1.0)
                    self.sock.shutdown(socket.SHUT_WR)
                    end = self.loop.time() + 1.0
                    while self.loop.time() < end:
                        if not await asyncio.wait_for(self._recv_raw(), max(0.01, end - self.loop.time())):
                            break
                except (OSError, asyncio.TimeoutError):
                    pass
                raise

    async def _fill(self):
        while True:
            try:
                data = self.tls.read(65536)
                if not data:
                    self.eof = True
                self.buffer += data
                break
            except ssl.SSLWantReadError:
                await self._flush()   # post-handshake messages (key updates) need answers too
                raw = await self._recv_raw()
                if not raw:
                    self.eof = True
                    break
                self.incoming.write(raw)
            except ssl.SSLZeroReturnError:
                self.eof = True
                break
        await self._flush()

    async def write(self, data):
        view = memoryview(data)
        while view:
            written = self.tls.write(view[:SEND_CHUNK])
            view = view[written:]
            await self._flush()

    def peercert(self):
        return self.tls.getpeercert()


class _Server:
    """The event loop, its listening socket and its connections (runs in one background thread)."""

    def __init__(self, sock, app, contexts):
        self.sock = sock
        self.app = app
        self.contexts = contexts          # tls.ServerContextCache, None for plain HTTP
        self.loop = None
        self.thread = None
        self.pending = collections.OrderedDict()   # task -> peer, oldest first: not yet authenticated
        self.pending_by_peer = collections.Counter()
        self.open = set()
        self.query_pool = concurrent.futures.ThreadPoolExecutor(QUERY_WORKERS, thread_name_prefix="straggler-query")
        self.snapshot_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="straggler-snapshot")
        self._snapshot_busy = False
        self._ready = threading.Event()
        self._stopped = None
        self.server_address = sock.getsockname()

    # -- lifecycle
    def run(self):
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()
            self.query_pool.shutdown(wait=False, cancel_futures=True)
            self.snapshot_pool.shutdown(wait=False)

    async def _main(self):
        self._stopped = asyncio.Event()
        accept = asyncio.ensure_future(self._accept_loop())
        self._ready.set()
        await self._stopped.wait()
        accept.cancel()
        for task in list(self.open):
            task.cancel()
        await asyncio.gather(accept, *self.open, return_exceptions=True)
        self.sock.close()

    def stop(self, timeout_s=5.0):
        if self.loop is not None and self._stopped is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._stopped.set)
            except RuntimeError:
                pass
        if self.thread is not None:
            self.thread.join(timeout=timeout_s)

    # -- connections
    async def _accept_loop(self):
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(self.sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:   # EMFILE and friends: wait, do not spin
                log.warning("accept failed: %s", one_line(exc))
                await asyncio.sleep(0.1)
                continue
            peer = address[0]
            if len(self.open) >= MAX_CONNECTIONS:
                if not self._evict_oldest_pending(None):
                    log.warning("connection from %s dropped: %d connections open", peer, len(self.open))
                    conn.close()
                    continue
            if self.pending_by_peer[peer] >= MAX_PENDING_PER_PEER:
                self._evict_oldest_pending(peer)
            elif len(self.pending) >= MAX_PENDING:
                self._evict_oldest_pending(None)
            task = asyncio.ensure_future(self._connection(conn, peer))
            self.open.add(task)
            self.pending[task] = peer
            self.pending_by_peer[peer] += 1
            task.add_done_callback(self._forget)

    def _evict_oldest_pending(self, peer):
        for task, owner in self.pending.items():
            if peer is None or owner == peer:
                log.info("closing the oldest unauthenticated connection from %s (over %d pending)", owner,
                         MAX_PENDING_PER_PEER if peer else MAX_PENDING)
                self._authenticated(task)
                task.cancel()
                return True
        return False

    def _authenticated(self, task):
        peer = self.pending.pop(task, None)
        if peer is not None:
            self.pending_by_peer[peer] -= 1
            if self.pending_by_peer[peer] <= 0:
                del self.pending_by_peer[peer]

    def _forget(self, task):
        self._authenticated(task)
        self.open.discard(task)

    async def _connection(self, conn, peer):
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        try:
            conn.setblocking(False)
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            deadline = loop.time() + self.app.handshake_timeout_s
            first = await self._first_byte(conn, deadline)
            if first is None:
                return
            is_tls = first == b"\x16"   # a TLS handshake record
            if (self.contexts is not None) != is_tls:
                await self._wrong_protocol(conn, peer, is_tls)
                return
            if self.contexts is None:
                stream, roles = _PlainStream(loop, conn), frozenset(ROLES)   # loopback only (make_server)
            else:
                stream = _TLSStream(loop, conn, self.contexts.current())
                try:
                    await asyncio.wait_for(stream.handshake(), max(0.01, deadline - loop.time()))
                except (ssl.SSLError, OSError, asyncio.TimeoutError) as exc:
                    # wrong CA, no or revoked client certificate, TLS 1.2, a silent client: one line
                    log.info("TLS handshake with %s failed: %s", peer,
                             one_line(exc) if str(exc) else "no handshake within the time limit")
                    return
                roles = peer_roles(stream.peercert() or {})
            self._authenticated(task)
            await self._session(stream, peer, roles)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, ssl.SSLError, OSError) as exc:
            log.debug("connection from %s ended: %s", peer, one_line(exc))
        except Exception:
            log.exception("connection from %s failed", peer)
        finally:
            try:
                conn.close()
            except OSError:
                pass

    async def _first_byte(self, conn, deadline):
        """Wait (until the deadline) for the client's first byte and peek at it; None if it never came."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()

        def readable():
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(conn.fileno(), readable)
        try:
            await asyncio.wait_for(ready, max(0.01, deadline - loop.time()))
        except asyncio.TimeoutError:
            return None
        finally:
            loop.remove_reader(conn.fileno())
        try:
            return conn.recv(1, socket.MSG_PEEK) or None
        except (BlockingIOError, InterruptedError, OSError):
            return None

    async def _wrong_protocol(self, conn, peer, is_tls):
        """A client that speaks the other protocol (plain HTTP to HTTPS, TLS to plain HTTP) gets a
        plain-text 400 that says so, instead of both sides waiting."""
        loop = asyncio.get_running_loop()
        if self.contexts is not None:
            message = (f"this straggler agent ({self.app.node}) speaks HTTPS with client certificates only; "
                       f"use https:// with --ca/--cert/--key (drop --no-tls)")
            kind = "tls-required"
        else:
            message = (f"this straggler agent ({self.app.node}) serves plain HTTP (--no-tls); "
                       f"pass --no-tls to the client")
            kind = "plain-http"
        log.info("%s connected with %s; told it so", peer, "TLS" if is_tls else "plain HTTP")
        body = (json.dumps({"node": self.app.node, "error": message, "kind": kind}) + "\n").encode()
        head = (f"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"X-Straggler-Node: {self.app.node}\r\nConnection: close\r\n\r\n").encode()
        try:
            await asyncio.wait_for(loop.sock_sendall(conn, head + body), 2.0)
            # lingering close: read what the client already sent, so closing does not reset the
            # connection (an RST would discard our answer before the client reads it)
            conn.shutdown(socket.SHUT_WR)
            drained = 0
            end = loop.time() + 1.0
            while drained < (1 << 20) and loop.time() < end:
                chunk = await asyncio.wait_for(loop.sock_recv(conn, 65536), max(0.01, end - loop.time()))
                if not chunk:
                    break
                drained += len(chunk)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            conn.close()

    # -- HTTP
    async def _session(self, stream, peer, roles):
        """Requests on one connection (HTTP/1.1 keep-alive), each under its own deadline."""
        while True:
            try:
                request = await asyncio.wait_for(self._read_request(stream), self.app.request_timeout_s)
            except asyncio.TimeoutError:
                log.info("%s: no complete request within %g s; connection closed", peer, self.app.request_timeout_s)
                return
            except BadRequest as exc:
                log.info("%s: %d %s", peer, exc.code, exc)
                await self._send(stream, peer, self.app.error(exc.code, exc, kind=exc.kind), close=True)
                return
            if request is None:   # the client closed between requests
                return
            try:
                answer = await self._dispatch(request, roles)
            except BadRequest as exc:
                answer = self.app.error(exc.code, exc, kind=exc.kind)
            if not await self._send(stream, peer, answer, close=request.close, head_only=request.method == "HEAD"):
                return
            if request.close:
                return

    async def _read_request(self, stream):
        head = await stream.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
        if not head:
            return None
        request = _parse_head(head)
        length = _body_length(request)
        if length:
            request.body = await stream.read_exactly(length)
        return request

    async def _dispatch(self, request, roles):
        app = self.app
        path, method = request.path, request.method
        if path not in ROUTE_ROLES:
            return app.error(404, f"no such route {path}; routes: {ROUTES_TEXT}", kind="not-found")
        wanted_method = "POST" if path == f"{API_PREFIX}/query" else "GET"
        if method != wanted_method and not (method == "HEAD" and wanted_method == "GET"):
            if path == f"{API_PREFIX}/query":
                return app.error(405, "use POST for /api/v1/query with a JSON body {\"sql\": ..., \"limit\": N}",
                                 kind="bad-request")
            return app.error(405, f"use GET for {path}; POST is only for {API_PREFIX}/query", kind="bad-request")
        role = ROUTE_ROLES[path]
        if role not in roles:
            return app.error(403, f"this client's certificate does not grant the {role!r} role that {path} needs; "
                                  f"issue one with `straggler pki issue --client NAME --role {role}`",
                             kind="forbidden")
        loop = asyncio.get_running_loop()
        if path == f"{API_PREFIX}/clock":
            pairs = await loop.run_in_executor(self.query_pool, app.clock_pairs, request.query)
            # read the clocks last, just before the answer leaves: keeps the two legs of the round trip even
            mono_ns, real_ns = read_clock_pair()
            return _json_answer(200, {"node": app.node, "realtime_ns": real_ns, "monotonic_ns": mono_ns,
                                      "pairs": pairs})
        if path == f"{API_PREFIX}/snapshot":
            if self._snapshot_busy:
                return app.error(503, "another snapshot is being made; retry in a moment", kind="busy")
            self._snapshot_busy = True
            try:
                return await self._run(self.snapshot_pool, app.snapshot, request.query)
            finally:
                self._snapshot_busy = False
        handler = {f"{API_PREFIX}/query": lambda: app.query(request.body),
                   f"{API_PREFIX}/health": lambda: app.health(request.query),
                   f"{API_PREFIX}/live": lambda: app.live(request.query),
                   "/metrics": lambda: app.metrics(request.query)}[path]
        return await self._run(self.query_pool, handler)

    async def _run(self, pool, function, *args):
        """A route in a worker thread; domain errors become one-line answers."""
        loop = asyncio.get_running_loop()
        app = self.app
        try:
            return await loop.run_in_executor(pool, function, *args)
        except BadRequest:
            raise
        except DatabaseUnavailable as exc:
            return app.error(503, exc, kind="database")
        except StragglerError as exc:
            return app.error(500, exc)
        except Exception as exc:
            log.exception("route failed")
            return app.error(500, f"internal error: {one_line(exc)}")

    async def _send(self, stream, peer, answer, close=False, head_only=False):
        """Write an answer in chunks under a deadline that grows with its size. Returns False when
        the connection cannot go on (the reader was too slow, or went away)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.app.send_timeout_s + answer.size / self.app.min_send_rate
        head = [f"HTTP/1.1 {answer.code} {REASONS.get(answer.code, 'Error')}",
                f"Content-Type: {answer.content_type}", f"Content-Length: {answer.size}",
                f"X-Straggler-Node: {self.app.node}", f"Server: straggler/{__version__}"]
        head += [f"{name}: {value}" for name, value in answer.headers]
        if close:
            head.append("Connection: close")
        head = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")

        async def send(data):
            await asyncio.wait_for(stream.write(data), max(0.01, deadline - loop.time()))

        try:
            if head_only:
                await send(head)
            elif answer.path is not None:
                with open(answer.path, "rb") as fh:
                    chunk = head + fh.read(SEND_CHUNK - len(head))
                    while chunk:
                        await send(chunk)
                        chunk = fh.read(SEND_CHUNK)
            else:
                # status line, headers and the first part of the body in one write: no Nagle or
                # delayed-ACK stall, one TLS record for a small answer
                pending = [head] + answer.chunks
                answer.chunks = []
                while pending:
                    data, size = [], 0
                    while pending and size < SEND_CHUNK:
                        data.append(pending.pop(0))
                        size += len(data[-1])
                    await send(b"".join(data))
            return True
        except asyncio.TimeoutError:
            log.info("%s: answer of %d bytes not taken within its deadline; connection reset", peer, answer.size)
            # reset, not a graceful close: what is still queued in the kernel would otherwise trickle
            # on, and the cut reach the reader only after it
            try:
                stream.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            return False
        except (ConnectionError, OSError, ssl.SSLError):
            return False
        finally:
            if answer.cleanup is not None:
                answer.cleanup()


class ServerHandle:
    """A running API server: .host, .port, .url, .node, .stop()."""

    def __init__(self, server, node, scheme):
        self._server = server
        self._thread = server.thread
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
        self._server.stop(timeout_s)

    def wait(self):
        """Block until stopped (polling, so signals are handled)."""
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _listen_socket(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


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
        contexts = None
    else:
        contexts = ServerContextCache(tls)
        contexts.current()   # fail at start on bad TLS files, not at the first client
    # fail early (and clearly) on a database we cannot read; the API serves it read-only
    open_readonly(db_path).close()
    node = node or node_name(db_path)
    app = _App(db_path, node, **limits)
    app.tls = contexts is not None
    try:
        sock = _listen_socket(host, port)
    except OSError as exc:
        raise StragglerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                             f"is another agent serving there? choose another --listen") from None
    return _Server(sock, app, contexts), node, ("http" if contexts is None else "https")


def start_background(db_path, node=None, listen=DEFAULT_LISTEN, tls=None, **limits) -> ServerHandle:
    """Serve db_path in a background thread; returns a handle with .port and .stop()."""
    server, node, scheme = make_server(db_path, node=node, listen=listen, tls=tls, **limits)
    server.thread = threading.Thread(target=server.run, name=f"straggler-api-{server.server_address[1]}", daemon=True)
    server.thread.start()
    server._ready.wait(timeout=10.0)
    handle = ServerHandle(server, node, scheme)
    log.info("serving %s for node %s (database %s)", handle.url, node, db_path)
    return handle


# ---------------------------------------------------------------- CLI

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
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    from ..cli.common import add_metrics_arguments, add_tls_arguments
    add_tls_arguments(parser)
    add_metrics_arguments(parser)


def run(args):
    from ..cli.common import tls_options as _tls_options
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="straggler serve: %(levelname)s %(message)s")
    handle = start_background(args.db, node=args.node, listen=args.listen, tls=_tls_options(args),
                              max_rows=args.max_rows, max_query_seconds=args.max_query_seconds,
                              max_answer_bytes=args.max_answer_bytes, snapshot_dir=args.snapshot_dir,
                              snapshot_timeout_s=args.snapshot_timeout)
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
