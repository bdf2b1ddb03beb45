"""The agent's API server over HTTPS with mutual TLS: which connections are served and how
(`make_server`, `start_background` for `straggler serve` and `straggler trace --listen`,
ServerHandle). The routes and their answers are in routes.py, the bytes on the wire (streams,
HTTP/1.1 parsing, sending under a deadline) in transport.py, the command in cli/serve.py.

How it holds under hostile and heavy use. The server is one asyncio event loop (standard library:
no dependency to ship to the nodes, and TLS handshakes that never hold a thread); SQLite work runs
in small thread pools (queries; snapshots apart, one at a time), so a slow query blocks neither the
loop nor /health.
  - The accept loop only accepts. A connection gets HANDSHAKE_TIMEOUT_S (transport.Deadlines) to
    send its first byte and finish the TLS handshake; until then it is "pending", and each peer
    address may hold at most MAX_PENDING_PER_PEER pending connections (MAX_PENDING in all): over
    that, its oldest pending connection is closed. Idle or half-open sockets cannot starve an
    authenticated client.
  - A request (its line, headers and body) must arrive within REQUEST_TIMEOUT_S of the connection
    becoming ready for it (after the handshake, or after the previous answer); bounded sizes; every
    malformed request gets a 4xx with one line and the server goes on serving (transport.py).
  - An answer is built in bounded memory (routes.py: query answers are encoded while fetched, at
    most --max-answer-bytes) and sent under a deadline that grows with its size (transport.py).
  - The TLS context is re-read when the CA, certificate, key or CRL files change (tls.ServerContextCache):
    a revoked client certificate fails its next handshake without a restart.
  - Plain HTTP (--no-tls) binds to loopback only unless told otherwise (any_address), and a client
    that speaks the other protocol is told so in one line instead of both sides waiting.

This module must not parse HTTP or build answers (transport.py, routes.py), must not write to the
database, and holds no argparse and prints nothing.
"""
import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import socket
import ssl
import threading

from .. import defaults
from ..addresses import format_address, is_loopback, is_wildcard, parse_listen
from ..errors import StragglerError
from ..store.query import node_name, open_readonly
from ..text import one_line
from ..tls import ROLES, ServerContextCache, TLSOptions, peer_roles, warn_no_tls
from . import transport
from .routes import App
from .transport import BadRequest, Deadlines

log = logging.getLogger("straggler.api")

DEFAULT_PORT = defaults.AGENT_PORT
DEFAULT_LISTEN = defaults.LISTEN
MAX_PENDING_PER_PEER = 16           # connections of one address not yet authenticated
MAX_PENDING = 256
MAX_CONNECTIONS = 512               # open connections in all (pending and authenticated)
QUERY_WORKERS = 4                   # SQLite work at once (queries, health, live, metrics)
POOL_WORKERS = {"query": QUERY_WORKERS, "snapshot": 1}   # routes.Route.pool; a pool of one: one request at a time
LISTEN_BACKLOG = 512


class _Server:
    """The event loop, its listening socket and its connections (runs in one background thread)."""

    def __init__(self, sock, app, contexts, deadlines):
        self.sock = sock
        self.app = app
        self.contexts = contexts          # tls.ServerContextCache, None for plain HTTP
        self.deadlines = deadlines
        self.loop = None
        self.thread = None
        self.pending = collections.OrderedDict()   # task -> peer, oldest first: not yet authenticated
        self.pending_by_peer = collections.Counter()
        self.open = set()
        self.pools = {name: concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=f"straggler-{name}")
                      for name, workers in POOL_WORKERS.items()}
        self._busy = set()                # pools of one at work now (a second request is told to retry)
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
            for pool in self.pools.values():
                pool.shutdown(wait=False, cancel_futures=True)

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
            deadline = loop.time() + self.deadlines.handshake_timeout_s
            first = await transport.first_byte(conn, deadline)
            if first is None:
                return
            is_tls = first == b"\x16"   # a TLS handshake record
            if (self.contexts is not None) != is_tls:
                await self._wrong_protocol(conn, peer, is_tls)
                return
            if self.contexts is None:
                stream, roles = transport.PlainStream(loop, conn), frozenset(ROLES)   # loopback only (make_server)
            else:
                stream = transport.TLSStream(loop, conn, self.contexts.current())
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

    async def _wrong_protocol(self, conn, peer, is_tls):
        """A client that speaks the other protocol (plain HTTP to HTTPS, TLS to plain HTTP) gets a
        plain-text 400 that says so, instead of both sides waiting."""
        node = self.app.node
        if self.contexts is not None:
            answer = self.app.error(400, f"this straggler agent ({node}) speaks HTTPS with client certificates "
                                         f"only; use https:// with --ca/--cert/--key (drop --no-tls)",
                                    kind="tls-required")
        else:
            answer = self.app.error(400, f"this straggler agent ({node}) serves plain HTTP (--no-tls); "
                                         f"pass --no-tls to the client", kind="plain-http")
        log.info("%s connected with %s; told it so", peer, "TLS" if is_tls else "plain HTTP")
        await transport.send_refusal(conn, answer, node)

    # -- requests
    async def _session(self, stream, peer, roles):
        """Requests on one connection (HTTP/1.1 keep-alive), each under its own deadline."""
        app, deadlines = self.app, self.deadlines
        while True:
            try:
                request = await asyncio.wait_for(transport.read_request(stream), deadlines.request_timeout_s)
            except asyncio.TimeoutError:
                log.info("%s: no complete request within %g s; connection closed", peer, deadlines.request_timeout_s)
                return
            except BadRequest as exc:
                log.info("%s: %d %s", peer, exc.code, exc)
                await transport.send_answer(stream, peer, app.error(exc.code, exc, kind=exc.kind), app.node,
                                            deadlines, close=True)
                return
            if request is None:   # the client closed between requests
                return
            answer = await self._dispatch(request, roles)
            if not await transport.send_answer(stream, peer, answer, app.node, deadlines, close=request.close,
                                               head_only=request.method == "HEAD"):
                return
            if request.close:
                return

    async def _dispatch(self, request, roles):
        """The request's route run in its pool (a pool of one answers 503 while busy)."""
        app = self.app
        route, refusal = app.route(request, roles)
        if refusal is not None:
            return refusal
        one_at_a_time = POOL_WORKERS[route.pool] == 1
        if one_at_a_time:
            if route.pool in self._busy:
                return app.error(503, f"another {route.pool} is being made; retry in a moment", kind="busy")
            self._busy.add(route.pool)
        try:
            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(self.pools[route.pool], app.call, route.handler, request)
        finally:
            if one_at_a_time:
                self._busy.discard(route.pool)
        if route.finish is not None and not isinstance(answer, transport.Answer):
            answer = getattr(app, route.finish)(answer)   # in the loop, just before it is sent
        return answer


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
        return f"{self.scheme}://{format_address(self.host, self.port)}"

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
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def make_server(db_path, node=None, listen=DEFAULT_LISTEN, tls=None, **limits):
    """Bind (not yet serving). Returns (server, node, scheme). `limits`: transport.Deadlines'
    (handshake_timeout_s, request_timeout_s, send_timeout_s, min_send_rate) and routes.App's
    (max_rows, max_query_seconds, max_answer_bytes, snapshot_dir, snapshot_timeout_s)."""
    deadlines = Deadlines(**{field.name: limits.pop(field.name) for field in dataclasses.fields(Deadlines)
                             if field.name in limits})
    tls = tls or TLSOptions()
    host, port = parse_listen(listen, DEFAULT_PORT)
    if tls.no_tls:
        warn_no_tls(log)
        if not is_loopback(host) and not tls.any_address:
            if is_wildcard(host):
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
    app = App(db_path, node, **limits)
    app.tls = contexts is not None
    try:
        sock = _listen_socket(host, port)
    except OSError as exc:
        raise StragglerError(f"cannot listen on {format_address(host, port)}: {exc.strerror or exc}; "
                             f"is another agent serving there? choose another --listen") from None
    return _Server(sock, app, contexts, deadlines), node, ("http" if contexts is None else "https")


def start_background(db_path, node=None, listen=DEFAULT_LISTEN, tls=None, **limits) -> ServerHandle:
    """Serve db_path in a background thread; returns a handle with .port and .stop(). `limits`:
    make_server's deadlines and routes.App's limits."""
    server, node, scheme = make_server(db_path, node=node, listen=listen, tls=tls, **limits)
    server.thread = threading.Thread(target=server.run, name=f"straggler-api-{server.server_address[1]}", daemon=True)
    server.thread.start()
    server._ready.wait(timeout=10.0)
    handle = ServerHandle(server, node, scheme)
    log.info("serving %s for node %s (database %s)", handle.url, node, db_path)
    return handle
