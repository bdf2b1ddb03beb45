"""What the API's requests mean: the routes with the method and role each needs, the query
request's JSON body (an object, finite numbers >= 0, nesting at most MAX_JSON_DEPTH), the limits a
client cannot raise, and the answers (query, clock, health, live, metrics, snapshot) as Answers.

Routes (JSON unless noted; role = what the client certificate must grant, see tls.peer_roles):
  POST /api/v1/query     {"sql", "limit"[, "timeout_s"]} -> {"node","columns","rows","truncated",
                         ["truncated_reason": "limit"|"bytes",] "elapsed_ms"}; 400 {"error","kind"} for SQL
                         that is refused or fails (kind: rejected|sql-error|timeout)           role query
  GET  /api/v1/clock     -> {"node","realtime_ns","monotonic_ns","pairs":[[mono_ns, real_ns], ...]}
                         (?pairs=N: the last N stored clock pairs, 0 for none; the clock is read last)  query
  GET  /api/v1/health    -> store.status.collect_status() of the served database            query
  GET  /api/v1/live      -> store.live.live_summary(): the step-time model's rows since ?since=NS (and the
                            collective calls after ?after_seq=N)
                         (node CLOCK_MONOTONIC ns), for `straggler watch`; with the node's clocks  query
  GET  /metrics          -> Prometheus metrics of the node (api/metrics.py; text exposition)   query
  GET  /api/v1/snapshot  -> a consistent copy of the whole database (application/vnd.sqlite3)  snapshot

App's handlers run in worker threads, take a transport.Request and return a transport.Answer; a
domain error becomes a one-line JSON answer {"node","error","kind"} (App.call): a bad parameter is
a 400, a read past its deadline or over the node's memory a 503. Every answer's bytes are held in
the server's memory for answers in flight (limits.AnswerMemory) until written.

A query answer is made row by row (QueryStream): up to STREAM_AFTER_BYTES it is answered whole,
with its length (and an error before then is a 400, as for any query); a bigger one streams in
parts of about STREAM_CHUNK_BYTES, each made only when the one before was written. A stream that
stops early (its time limit, the node's memory, an SQL error in a later row) still ends as valid
JSON: "truncated": true with "truncated_reason" (timeout | memory | temp | busy | sql-error) and "error".

Light routes (clock, health, live, metrics) run in their own pool under a deadline (App.light_timeout_s),
so heavy queries never delay them. This module must not touch a socket or know a connection
(transport.py, server.py), must not write to the database, and holds no SQL rules of its own
(store/query.py does).
"""
import threading
import json
import logging
import math
import os
import shutil
import time
from typing import NamedTuple, Optional

from .. import __version__
from ..clock import read_clock_pair
from ..errors import StragglerError
from ..store.query import (DatabaseUnavailable, QueryError, ReadQuery,
                           defensive_mode, reading, value_limit)
from ..store.snapshot import StagingFull
from ..text import one_line
from ..tls import ROLE_QUERY, ROLE_SNAPSHOT
from .answer import AnswerMemoryFull, JsonAnswer
from .transport import Answer, BadRequest

log = logging.getLogger("straggler.api")

MAX_JSON_DEPTH = 16
MAX_ROWS = 200_000                  # per request, whatever the client asks (explain asks for 200k)
MAX_ANSWER_BYTES = 64 << 20         # per answer, whatever the client asks
MAX_QUERY_SECONDS = 30.0
DEFAULT_QUERY_SECONDS = 10.0
DEFAULT_LIMIT = 10000
SNAPSHOT_TIMEOUT_S = 120.0
SNAPSHOT_TYPE = "application/vnd.sqlite3"
CLOCK_PAIRS_DEFAULT = 16
CLOCK_PAIRS_MAX = 1000
STREAM_AFTER_BYTES = 256 << 10      # a query answer up to this is sent whole, with its length
STREAM_CHUNK_BYTES = 256 << 10      # then in parts of about this
MEMORY_WAIT_S = 5.0                 # how long an answer waits for room in the answers' memory
LIGHT_TIMEOUT_S = 5.0               # the light routes' deadline (SQLite is interrupted at it)
API_PREFIX = "/api/v1"
QUERY_SHAPE = "{\"sql\": ..., \"limit\": N}"


class Route(NamedTuple):
    """A path's method ("GET" also answers HEAD), the role it needs, the App handler that answers
    it, the pool it runs in ("query"; "light": small reads under App.light_timeout_s; "snapshot":
    one at a time), and, when the answer is made in two steps, the App method that finishes it in
    the event loop just before it is sent."""
    method: str
    role: str
    handler: str
    pool: str = "query"
    finish: Optional[str] = None


ROUTES = {
    f"{API_PREFIX}/query": Route("POST", ROLE_QUERY, "query"),
    f"{API_PREFIX}/clock": Route("GET", ROLE_QUERY, "clock_pairs", "light", finish="clock"),
    f"{API_PREFIX}/health": Route("GET", ROLE_QUERY, "health", "light"),
    f"{API_PREFIX}/live": Route("GET", ROLE_QUERY, "live", "light"),
    "/metrics": Route("GET", ROLE_QUERY, "metrics", "light"),
    f"{API_PREFIX}/snapshot": Route("GET", ROLE_SNAPSHOT, "snapshot", pool="snapshot"),
}
ROUTES_TEXT = (f"{API_PREFIX}/query (POST), {API_PREFIX}/clock, {API_PREFIX}/health, {API_PREFIX}/snapshot, "
               f"{API_PREFIX}/live, /metrics")


def json_answer(code, obj):
    return Answer(code, [(json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()])


# ---------------------------------------------------------------- the query request's body

def json_depth(text):
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


def request_json(body):
    """The query request's JSON object; BadRequest for anything else (one line)."""
    def no_constants(name):
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(400, f"the body is not UTF-8 text; send a JSON object {QUERY_SHAPE}") from None
    if json_depth(text) > MAX_JSON_DEPTH:   # checked before the parser recurses
        raise BadRequest(400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels; send a flat "
                              f"object {QUERY_SHAPE}")
    try:
        request = json.loads(text, parse_constant=no_constants)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(400, f"the body must be a JSON object {QUERY_SHAPE} ({one_line(exc)})") from None
    if not isinstance(request, dict):
        raise BadRequest(400, f"the body must be a JSON object {QUERY_SHAPE}")
    return request


def number(request, key, default, integer):
    """request[key] (else default) as a finite number >= 0 (a whole one if `integer`); BadRequest otherwise."""
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(400, f"\"{key}\" must be a number, got {json.dumps(value)[:40]}")
    if not math.isfinite(value) or value < 0:
        raise BadRequest(400, f"\"{key}\" must be a finite number >= 0, got {value}")
    if integer and value != int(value):
        raise BadRequest(400, f"\"{key}\" must be a whole number, got {value}")
    return int(value) if integer else float(value)


# ---------------------------------------------------------------- the routes

class App:
    """What the routes need: the database, the node name and the limits. Handlers run in worker
    threads and return an Answer; none of them touches a socket."""

    def __init__(self, db_path, node, max_rows=MAX_ROWS, max_query_seconds=MAX_QUERY_SECONDS,
                 snapshot_dir=None, max_answer_bytes=MAX_ANSWER_BYTES, snapshot_timeout_s=SNAPSHOT_TIMEOUT_S,
                 light_timeout_s=LIGHT_TIMEOUT_S, memory=None):
        self.db_path = db_path
        self.node = node
        self.max_rows = max_rows
        self.max_query_seconds = max_query_seconds
        self.max_answer_bytes = max_answer_bytes
        self.snapshot_dir = snapshot_dir
        self.snapshot_timeout_s = snapshot_timeout_s
        self.light_timeout_s = float(light_timeout_s)
        if not self.light_timeout_s > 0:
            raise StragglerError(f"--light-timeout must be more than 0 seconds, got {light_timeout_s}")
        self.memory = memory            # limits.AnswerMemory (None: unbounded, for tests of the routes alone)
        self.tls = False
        self.crl_status = None          # a callable -> tls.crl_status dict, set by the server when it checks a CRL
        self.limits = {}                # the server's limits, shown by /api/v1/health
        self.started_mono_ns = time.monotonic_ns()

    def error(self, code, message, kind="error"):
        return json_answer(code, {"node": self.node, "error": one_line(message), "kind": kind})

    def route(self, request, roles):
        """(Route, None) for a request this client may make, else (None, the refusal: 404, 405 or 403)."""
        path, method = request.path, request.method
        route = ROUTES.get(path)
        if route is None:
            return None, self.error(404, f"no such route {path}; routes: {ROUTES_TEXT}", kind="not-found")
        if method != route.method and not (method == "HEAD" and route.method == "GET"):
            if route.method == "POST":
                return None, self.error(405, f"use POST for {path} with a JSON body {QUERY_SHAPE}",
                                        kind="bad-request")
            return None, self.error(405, f"use GET for {path}; POST is only for {API_PREFIX}/query",
                                    kind="bad-request")
        if route.role not in roles:
            return None, self.error(403, f"this client's certificate does not grant the {route.role!r} role that "
                                         f"{path} needs; issue one with `straggler pki issue --client NAME "
                                         f"--role {route.role}`", kind="forbidden")
        return route, None

    def call(self, handler, request):
        """A handler (in a worker thread); BadRequest and domain errors become one-line answers, and
        the answer's bytes are held in the answers' memory until written."""
        try:
            answer = getattr(self, handler)(request)
        except BadRequest as exc:
            answer = self.error(exc.code, exc, kind=exc.kind)
        except DatabaseUnavailable as exc:
            answer = self.error(503, exc, kind="database")
        except QueryError as exc:   # a light route's read past its deadline, or over the node's memory
            answer = self.error(503, exc, kind=exc.kind)
        except StagingFull as exc:   # store.snapshot: as many staged copies as allowed are still being sent
            answer = self.error(429, exc, kind=exc.kind)
        except StragglerError as exc:
            answer = self.error(500, exc)
        except Exception as exc:
            log.exception("route failed")
            answer = self.error(500, f"internal error: {one_line(exc)}")
        return self.hold(answer)

    def hold(self, answer):
        """Reserve an answer's bytes in the answers' memory (released when it is written), unless it
        holds its own (a query's, a file's); a 503 when no room comes within MEMORY_WAIT_S."""
        if not isinstance(answer, Answer) or self.memory is None or answer.cleanup is not None \
                or answer.stream is not None or answer.path is not None or not answer.size:
            return answer
        size, memory = answer.size, self.memory
        if answer.code < 400 and not memory.reserve(size, MEMORY_WAIT_S):
            answer = self.error(503, f"the node's memory for answers in flight ({memory.capacity >> 20} MiB) stayed "
                                     f"full for {MEMORY_WAIT_S:g} s; retry in a moment", kind="busy")
            size = answer.size
            memory.force(size)
        elif answer.code >= 400:
            memory.force(size)
        answer.cleanup = lambda: memory.release(size)
        return answer

    def query(self, request):
        body = request_json(request.body)
        sql = body.get("sql")
        if not isinstance(sql, str):
            raise BadRequest(400, "missing \"sql\" (a string) in the request")
        limit = min(number(body, "limit", DEFAULT_LIMIT, integer=True), self.max_rows)
        timeout_s = min(number(body, "timeout_s", DEFAULT_QUERY_SECONDS, integer=False), self.max_query_seconds)
        return QueryStream(self, sql, limit, timeout_s).first()

    def clock_pairs(self, request):
        """The last ?pairs=N stored clock pairs (the clock itself is read by `clock`, last)."""
        try:
            wanted = int((request.query.get("pairs") or [CLOCK_PAIRS_DEFAULT])[0])
        except ValueError:
            wanted = CLOCK_PAIRS_DEFAULT
        if wanted <= 0:
            return []
        try:
            with reading(self.db_path, self.light_timeout_s, "the clock pairs") as conn:
                return [list(p) for p in reversed(conn.execute(
                    "SELECT mono_ns, real_ns FROM clock_pairs ORDER BY mono_ns DESC LIMIT ?",
                    (min(wanted, CLOCK_PAIRS_MAX),)).fetchall())]
        except Exception as exc:  # the clock answer stays useful without stored pairs
            log.debug("clock pairs unavailable: %s", exc)
            return []

    def clock(self, pairs):
        """The clock answer, read just before it leaves: keeps the two legs of the round trip even."""
        mono_ns, real_ns = read_clock_pair()
        return json_answer(200, {"node": self.node, "realtime_ns": real_ns, "monotonic_ns": mono_ns, "pairs": pairs})

    def health(self, request):
        from ..store.status import collect_status
        status = collect_status(self.db_path, timeout_s=self.light_timeout_s)
        status["db_node"] = status.get("node")
        status["node"] = self.node
        defensive, how = defensive_mode()
        status["api"] = {"version": __version__, "uptime_s": round((time.monotonic_ns() - self.started_mono_ns) / 1e9, 1),
                         "tls": self.tls, "sqlite_defensive": how if defensive else f"off: {how}",
                         "limits": dict(self.limits)}
        if self.memory is not None:
            status["api"]["answer_memory"] = {"used": self.memory.used, "peak": self.memory.peak,
                                              "capacity": self.memory.capacity}
        # the revocation list: "expiring"/"expired"/"missing"/"unreadable" say loudly what to do
        status["crl"] = self.crl_status() if self.crl_status is not None else None
        return json_answer(200, status)

    def live(self, request):
        from ..store.live import check_seq, check_since, live_summary
        try:
            since = check_since((request.query.get("since") or [None])[0])
            after_seq = check_seq((request.query.get("after_seq") or [None])[0])
        except ValueError as exc:
            raise BadRequest(400, str(exc)) from None
        answer = live_summary(self.db_path, since, timeout_s=self.light_timeout_s, after_seq=after_seq)
        mono_ns, real_ns = read_clock_pair()   # last, as for /clock: the watch's offset sample
        answer.update(node=self.node, monotonic_ns=mono_ns, realtime_ns=real_ns)
        return json_answer(200, answer)

    def metrics(self, request):
        from . import metrics
        try:
            body = metrics.render(self.db_path, self.node, timeout_s=self.light_timeout_s)
        except metrics.MetricsUnavailable as exc:
            return self.error(503, exc, kind="metrics-unavailable")
        return Answer(200, [body], content_type=metrics.CONTENT_TYPE)

    def snapshot(self, request):
        from ..store.snapshot import snapshot, stage_dir
        headers = [("Content-Disposition", f'attachment; filename="{self.node}.db"')]
        if request.method == "HEAD":      # the headers a GET sends, without staging a copy of the store to
            return Answer(200, content_type=SNAPSHOT_TYPE, headers=headers, length_unknown=True)   # measure it
        work_dir = stage_dir(self.snapshot_dir)
        try:
            out_path = os.path.join(work_dir, "snapshot.db")
            summary = snapshot(self.db_path, out_path, deadline_s=self.snapshot_timeout_s)
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        return Answer(200, content_type=SNAPSHOT_TYPE, path=out_path, size=summary["bytes"], headers=headers,
                      cleanup=lambda: shutil.rmtree(work_dir, ignore_errors=True))


class QueryStream:
    """A query answer made row by row (ReadQuery into a JsonAnswer) while it is sent.

    first() (in a worker) starts the query and makes up to STREAM_AFTER_BYTES: an answer that ends
    there goes out whole with its length (an error there is a one-line 400, 503 when the node's
    memory is full); a longer one goes out as a stream whose next parts next_chunk() makes (in a
    worker, each after the one before was written). Between parts the query's deadline is paused
    (the reader's time is not the query's). Thread-safe against abandon() from the event loop."""

    def __init__(self, app, sql, limit, timeout_s):
        self.app = app
        self.query = ReadQuery(app.db_path, sql, limit=limit, timeout_s=timeout_s,
                               max_value_bytes=value_limit(app.max_answer_bytes), any_thread=True)
        self.answer = JsonAnswer(app.node, app.max_answer_bytes, memory=app.memory, wait_s=MEMORY_WAIT_S)
        self.done = False
        self._lock = threading.Lock()
        self._abandoned = False

    def first(self):
        try:
            self.answer.start(self.query.start())
            self._fill(STREAM_AFTER_BYTES, committed=False)
        except QueryError as exc:
            self.close()
            return self.app.error(503 if isinstance(exc, AnswerMemoryFull) else 400, exc, kind=exc.kind)
        except BaseException:
            self.close()
            raise
        pieces, nbytes = self.answer.take()
        if self.done:
            self.close(keep=nbytes)
            return Answer(200, pieces, cleanup=lambda: self.answer.release_all())
        self.query.pause()
        return Answer(200, pieces, stream=self, on_sent=self.sent, cleanup=self.abandon)

    def _fill(self, nbytes, committed=True):
        """Rows into the answer until it holds nbytes or the rows end (self.done). Before the answer
        is committed (nothing sent yet) an error is raised, to become an error answer; after, it
        ends the rows: truncated, with its reason and the error."""
        while self.answer.pending < nbytes:
            try:
                row = self.query.next_row()
                if row is not None and not self.answer.add(row):
                    self.query.truncated_reason = "bytes"
                    row = None
            except QueryError as exc:
                if not committed:
                    raise
                self.query.truncated_reason = exc.kind
                self._finish(error=exc)
                return
            if row is None:
                self._finish()
                return

    def _finish(self, error=None):
        self.answer.finish(self.query.result(), error=error)
        self.done = True

    def next_chunk(self):
        """The next part (pieces, bytes), or None at the end; in a worker thread."""
        with self._lock:
            if self.done or self._abandoned:
                self._close_locked()
                return None
            self.query.resume()
            try:
                self._fill(STREAM_CHUNK_BYTES)
            finally:
                self.query.pause()
            if self.done:
                self.query.close()
            return self.answer.take()

    def sent(self, nbytes):
        self.answer.release(nbytes)

    def abandon(self):
        """From the event loop, when the answer ends (finished, cut or its connection gone): stop the
        query and free what the answer holds, now if no part is being made, else when it is."""
        self._abandoned = True
        self.query.abandon()
        if self._lock.acquire(blocking=False):
            try:
                self._close_locked()
            finally:
                self._lock.release()

    def _close_locked(self):
        self.query.close()
        self.answer.release_all()

    def close(self, keep=0):
        """Close the query; free what the answer holds but `keep` bytes (handed to the sender)."""
        self.query.close()
        self.answer.release(max(0, self.answer.held - keep))
