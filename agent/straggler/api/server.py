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
  - Memory: a query answer is made row by row and streams (routes.QueryStream: one part in memory
    per answer, at most --max-answer-bytes in all), and every answer's bytes not yet written count
    against one cap for the whole server (--max-inflight-bytes, limits.AnswerMemory); queries' own
    memory and the temporary files each one writes (sorts, grouping) are capped by the store's
    watchdog (--max-query-memory, --max-query-temp). Answers go out under a deadline that grows
    with their size (transport.py).
  - Fair shares (limits.ClientShares): a client (its certificate) may hold at most
    --max-connections-per-client connections and run --max-queries-per-client queries (and three
    light requests) at once; over that it gets a 429 with one line. Queries, light reads (clock,
    health, live, metrics, each under a deadline) and snapshots have pools of their own, so a client
    that fills one leaves the others and every other client served.
  - Revocation: the TLS context is re-read when the CA, certificate, key or CRL files change
    (tls.ServerContextCache): a revoked certificate fails its next handshake, every request of an
    open connection is checked against the CRL in use (403, one line, closed), and within
    REVOCATION_CHECK_S of a new CRL the open connections of a revoked certificate are closed. A CRL
    in use that goes missing or unreadable refuses every client (503) until it is back. A
    connection lives at most --max-connection-seconds: the answer after that closes it.
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
from typing import Optional

from .. import defaults
from ..addresses import format_address, is_loopback, is_wildcard, parse_listen
from ..errors import StragglerError
from ..store.query import node_name, open_readonly
from ..store.watchdog import DEFAULT_MEMORY_CAP, DEFAULT_TEMP_CAP, WATCHDOG
from ..text import one_line
from ..tls import ROLES, ServerContextCache, TLSOptions, peer_roles, warn_no_tls
from . import transport
from .limits import (DEFAULT_MAX_INFLIGHT_BYTES, MAX_CONNECTIONS_PER_CLIENT, MAX_LIGHT_PER_CLIENT,
                     MAX_QUERIES_PER_CLIENT, AnswerMemory, ClientShares)
from .routes import App
from .transport import BadRequest, Deadlines

log = logging.getLogger("straggler.api")

DEFAULT_PORT = defaults.AGENT_PORT
DEFAULT_LISTEN = defaults.LISTEN
MAX_PENDING_PER_PEER = 16           # connections of one address not yet authenticated
MAX_PENDING = 256
MAX_CONNECTIONS = 512               # open connections in all (pending and authenticated)
QUERY_WORKERS = 4                   # queries at once
LIGHT_WORKERS = 6                   # clock, health, live, metrics at once
POOL_WORKERS = {"query": QUERY_WORKERS, "light": LIGHT_WORKERS, "snapshot": 1}   # routes.Route.pool; a pool of one: one request at a time
LISTEN_BACKLOG = 512
MAX_CONNECTION_S = 300.0            # a connection's lifetime: the answer after it closes the connection
REVOCATION_CHECK_S = 1.0            # how often the TLS files are looked at for a new CRL (open connections)
GRACE_S = 1.0                       # a light route's answer may come this late before the loop gives up on it


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What the server allows in all and per client (see the module docstring)."""
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    max_queries_per_client: int = MAX_QUERIES_PER_CLIENT
    max_connection_s: float = MAX_CONNECTION_S
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    max_query_memory: int = DEFAULT_MEMORY_CAP
    max_query_temp: int = DEFAULT_TEMP_CAP


@dataclasses.dataclass
class _Session:
    """An authenticated connection: who (client key, certificate serial) and since when."""
    peer: str
    client: tuple
    serial: Optional[str]
    started: float


class _Server:
    """The event loop, its listening socket and its connections (runs in one background thread)."""

    def __init__(self, sock, app, contexts, deadlines, limits=None):
        self.sock = sock
        self.app = app
        self.contexts = contexts          # tls.ServerContextCache, None for plain HTTP
        self.deadlines = deadlines
        self.limits = limits or ServerLimits()
        self.shares = ClientShares(self.limits.max_connections_per_client,
                                   {"query": self.limits.max_queries_per_client, "light": MAX_LIGHT_PER_CLIENT})
        self.loop = None
        self.thread = None
        self.pending = collections.OrderedDict()   # task -> peer, oldest first: not yet authenticated
        self.pending_by_peer = collections.Counter()
        self.evicted = set()              # pending tasks closed to make room: they end at their next step
        self.open = set()
        self.sessions = {}                # task -> _Session: authenticated connections
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
        watch = asyncio.ensure_future(self._revocation_loop()) if self.contexts is not None else None
        self._ready.set()
        await self._stopped.wait()
        accept.cancel()
        if watch is not None:
            watch.cancel()
        for task in list(self.open):
            task.cancel()
        await asyncio.gather(accept, *([watch] if watch else []), *self.open, return_exceptions=True)
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
            if len(self.open) >= self.limits.max_connections:
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
                self.evicted.add(task)    # a cancel that lands as a wait ends can be lost (asyncio.wait_for
                task.cancel()             # on Python 3.11): the task checks this set after each step too
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
        self.evicted.discard(task)
        self.open.discard(task)
        self.sessions.pop(task, None)

    async def _revocation_loop(self):
        """Every REVOCATION_CHECK_S: a new CRL (or one gone missing) closes the open connections it refuses."""
        generation = self.contexts.generation
        while True:
            await asyncio.sleep(REVOCATION_CHECK_S)
            self.contexts.current()
            if self.contexts.generation == generation:
                continue
            generation = self.contexts.generation
            for task, session in list(self.sessions.items()):
                refusal = self.contexts.refusal(session.serial)
                if refusal is not None:
                    log.info("closing the connection of %s: %s", session.peer, refusal[1])
                    task.cancel()

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
            if first is None or task in self.evicted:
                return
            is_tls = first == b"\x16"   # a TLS handshake record
            if (self.contexts is not None) != is_tls:
                await self._wrong_protocol(conn, peer, is_tls)
                return
            if self.contexts is None:
                stream, roles = transport.PlainStream(loop, conn), frozenset(ROLES)   # loopback only (make_server)
                client, serial = ("address", peer), None
            else:
                stream = transport.TLSStream(loop, conn, self.contexts.current())
                try:
                    await asyncio.wait_for(stream.handshake(), max(0.01, deadline - loop.time()))
                except (ssl.SSLError, OSError, asyncio.TimeoutError) as exc:
                    # wrong CA, no or revoked client certificate, TLS 1.2, a silent client: one line
                    log.info("TLS handshake with %s failed: %s", peer,
                             one_line(exc) if str(exc) else "no handshake within the time limit")
                    return
                if task in self.evicted:
                    return
                cert = stream.peercert() or {}
                roles = peer_roles(cert)
                serial = cert.get("serialNumber")
                client = ("certificate", serial)
            self._authenticated(task)
            refusal = self.contexts.refusal(serial) if self.contexts is not None else None
            if refusal is not None:
                log.info("%s refused after the handshake: %s", peer, refusal[1])
                await transport.refuse_now(stream, self._refusal_answer(refusal), self.app.node)
                return
            if not self.shares.open(client):
                cap = self.shares.max_connections
                log.info("%s: over its share of %d connections; told so", peer, cap)
                await transport.refuse_now(stream, self.app.error(
                    429, f"this client already holds {cap} connections to this agent (its share); close some, "
                         f"or reuse them (keep-alive)", kind="too-many-connections"), self.app.node)
                return
            self.sessions[task] = _Session(peer, client, serial, loop.time())
            try:
                await self._session(stream, self.sessions[task], roles)
            finally:
                self.shares.close(client)
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

    def _refusal_answer(self, refusal):
        code, message = refusal
        return self.app.error(code, message, kind="revoked" if code == 403 else "crl")

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
    async def _session(self, stream, session, roles):
        """Requests on one connection (HTTP/1.1 keep-alive), each under its own deadline, each checked
        against the CRL in use; the answer after the connection's lifetime closes it."""
        app, deadlines, peer = self.app, self.deadlines, session.peer
        loop = asyncio.get_running_loop()
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
            refusal = None
            if self.contexts is not None:
                self.contexts.current()   # a changed CRL is read here too (at most once per check interval)
                refusal = self.contexts.refusal(session.serial)
            if refusal is not None:
                log.info("%s: request refused: %s", peer, refusal[1])
                await transport.send_answer(stream, peer, self._refusal_answer(refusal), app.node, deadlines,
                                            close=True)
                return
            close = request.close or loop.time() - session.started >= self.limits.max_connection_s
            route, answer = app.route(request, roles)
            counted = False
            if route is not None:
                if self.shares.start(session.client, route.pool):
                    counted = True
                else:
                    answer = app.error(429, f"this client already runs {self.shares.max_in_pool[route.pool]} "
                                            f"{route.pool} requests on this agent (its share); wait for one to "
                                            f"finish", kind="too-many-requests")
            try:
                if answer is None:
                    answer = await self._dispatch(route, request)
                pool = self.pools[route.pool] if route is not None else None
                sent = await transport.send_answer(stream, peer, answer, app.node, deadlines, close=close,
                                                   head_only=request.method == "HEAD",
                                                   pull=lambda fn: self._pull(pool, fn), version=request.version)
            finally:
                if counted:
                    self.shares.end(session.client, route.pool)
            if not sent or close:
                return

    async def _pull(self, pool, fn):
        """fn() in the pool (a streamed answer's next part); its failure cuts the answer."""
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("a streamed answer failed")
            raise transport.StreamCut(one_line(exc)) from None

    async def _dispatch(self, route, request):
        """The request's route run in its pool (a pool of one answers 503 while busy), within the
        route's deadline (a light route's answer that comes too late is a 503, and dropped)."""
        app = self.app
        one_at_a_time = POOL_WORKERS[route.pool] == 1
        if one_at_a_time:
            if route.pool in self._busy:
                return app.error(503, f"another {route.pool} is being made; retry in a moment", kind="busy")
            self._busy.add(route.pool)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.pools[route.pool], app.call, route.handler, request)
        timeout_s = app.light_timeout_s if route.pool == "light" else None
        try:
            done, _ = await asyncio.wait({future}, timeout=timeout_s + GRACE_S if timeout_s else None)
        except asyncio.CancelledError:
            future.add_done_callback(_drop_answer)
            raise
        finally:
            if one_at_a_time:
                self._busy.discard(route.pool)
        if not done:
            future.add_done_callback(_drop_answer)
            return app.error(503, f"{request.path} did not answer within {timeout_s:g} s; retry",
                             kind="timeout")
        answer = future.result()
        if route.finish is not None and not isinstance(answer, transport.Answer):
            answer = getattr(app, route.finish)(answer)   # in the loop, just before it is sent
        return answer


def _drop_answer(future):
    """An answer nobody will send (its request gave up or its connection went): free what it holds."""
    if future.cancelled() or future.exception() is not None:
        return
    answer = future.result()
    if isinstance(answer, transport.Answer):
        if answer.stream is not None:
            answer.stream.abandon()
        elif answer.cleanup is not None:
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
    (handshake_timeout_s, request_timeout_s, send_timeout_s, min_send_rate), ServerLimits'
    (max_connections, max_connections_per_client, max_queries_per_client, max_connection_s,
    max_inflight_bytes, max_query_memory, max_query_temp) and routes.App's (max_rows, max_query_seconds,
    max_answer_bytes, snapshot_dir, snapshot_timeout_s, light_timeout_s)."""
    deadlines = Deadlines(**{field.name: limits.pop(field.name) for field in dataclasses.fields(Deadlines)
                             if field.name in limits})
    server_limits = ServerLimits(**{field.name: limits.pop(field.name) for field in dataclasses.fields(ServerLimits)
                                    if field.name in limits})
    for name in ("max_connections", "max_connections_per_client", "max_queries_per_client", "max_inflight_bytes"):
        if getattr(server_limits, name) < 1:
            raise StragglerError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(server_limits, name)}")
    if not server_limits.max_connection_s > 0 or server_limits.max_query_memory < 0 or server_limits.max_query_temp < 0:
        raise StragglerError("--max-connection-seconds must be more than 0, --max-query-memory and --max-query-temp "
                             "at least 0")
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
    WATCHDOG.memory_cap = server_limits.max_query_memory   # the process's queries, all servers together
    WATCHDOG.temp_cap = server_limits.max_query_temp
    unable = [name for name, able in WATCHDOG.caps().items() if not able]
    if unable:
        log.warning("cannot enforce the queries' %s cap here (no counter to read it from); see docs/security.md",
                    " and ".join(unable))
    app = App(db_path, node, memory=AnswerMemory(server_limits.max_inflight_bytes), **limits)
    app.tls = contexts is not None
    app.limits = dataclasses.asdict(server_limits)
    if contexts is not None:
        app.crl_status = contexts.crl_status
    try:
        sock = _listen_socket(host, port)
    except OSError as exc:
        raise StragglerError(f"cannot listen on {format_address(host, port)}: {exc.strerror or exc}; "
                             f"is another agent serving there? choose another --listen") from None
    return _Server(sock, app, contexts, deadlines, server_limits), node, ("http" if contexts is None else "https")


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
