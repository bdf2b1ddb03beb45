"""The fleet client: one SQL on every node's agent at once (HTTPS, mutual TLS), one table back
with the node's own name on every row, a status for every node, and each node's clock offset.

- Concurrent and bounded: at most `concurrency` queries in flight, each node under `timeout_s`,
  the whole call under `deadline_s` (honoured even for a peer that accepts and never answers:
  the caller never waits on a stuck worker; workers are daemon threads with socket timeouts).
- Statuses: ok | empty | sql-error | tls-error | forbidden | refused | timeout | truncated |
  unreachable | wrong-node, each with a one-line message and the latency. Nodes that did not answer stay in the
  result. `forbidden`: the certificate lacks the route's role (403). `truncated`: the answer ended
  short of its Content-Length (the agent cut a reader that was too slow); `timeout`: no answer, or
  an answer that stalled, within the time limit. An answer capped by the agent (rows or bytes) is
  `ok` with truncated=True and says which cap.
- A node cannot answer as another (`wrong-node`, its rows dropped, one line saying why): each
  answer must name its node (a node name by straggler.text.node_name_problem), the node expected
  at that address when the caller knows it (`expected_nodes`, e.g. from the inventory); every row
  of a `node` column the SQL selected must be that node's; two addresses answering as one node
  are both refused (which one is genuine cannot be told); a clock answer naming another node than
  the query's gives no offset. The node column of the combined table is always the node asked.
- Clock offsets, NTP-style (straggler.clock.estimate_offset): while the query runs, a separate
  connection per node exchanges `clock_samples` GET /api/v1/clock requests (more while the query
  is still running and no round trip was short); the sample with the smallest round trip gives
  offset (node realtime minus this machine's) and ± half that round trip. They run beside the
  queries, on their own workers, so they add nothing to a node's query latency; the call as a
  whole waits for them, which costs at most (clock_samples - 1) round trips beyond a query that
  ends after one round trip. An offset is flagged when it is above `offset_threshold_ms` even
  at the near edge of its uncertainty (|offset| - uncertainty > threshold): a noisy measurement
  of a good clock is not flagged, a clock that is off is.
- Exit codes: 0 every node answered (ok or empty), 3 some did not, 4 none did.

This module talks to agents and combines their answers by the one rule in fleet/combine.py (the
same as the collection's aggregate); it must not judge SQL (the agents do, with
store/query.py) and must not render anything (cli/fleet.py does).
"""
import errno
import http.client
import json
import queue
import socket
import ssl
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from ..clock import estimate_offset
from ..errors import StragglerError
from ..text import node_name_problem, one_line
from ..tls import TLSOptions, client_context
from .combine import combine_answers, foreign_node
# Node addresses (the one rule for an inventory host's agent address) live in fleet/inventory.py;
# these names stay importable from here.
from .inventory import DEFAULT_PORT, agent_address, normalize_address, parse_nodes, split_address  # noqa: F401

STATUSES = ("ok", "empty", "sql-error", "tls-error", "forbidden", "refused", "timeout", "truncated", "unreachable",
            "wrong-node")
ANSWERED = ("ok", "empty")
EXIT_ALL_ANSWERED = 0
EXIT_PARTIAL = 3
EXIT_NONE_ANSWERED = 4
DEFAULT_OFFSET_THRESHOLD_MS = 5.0
_MAX_RESPONSE_BYTES = 512 << 20


def offset_is_flagged(offset_ns, uncertainty_ns, threshold_ns):
    """True when the clock is off by more than the threshold even allowing for the uncertainty."""
    return abs(offset_ns) - abs(uncertainty_ns or 0) > threshold_ns


@dataclass
class NodeStatus:
    address: str                        # host:port as given
    node: Optional[str] = None          # the node's own name (from its answer), None if it never answered
    status: str = "timeout"
    message: str = ""
    latency_ms: Optional[float] = None  # the query request, connect to last byte
    row_count: int = 0
    offset_ns: Optional[int] = None     # node realtime minus this machine's realtime
    uncertainty_ns: Optional[int] = None
    offset_flagged: bool = False        # |offset| - uncertainty above the threshold
    truncated: bool = False             # the node had more rows than the limit

    @property
    def answered(self):
        return self.status in ANSWERED

    def to_dict(self):
        return asdict(self)


@dataclass
class FleetResult:
    columns: List[str]
    rows: List[list]
    nodes: List[NodeStatus]
    offsets: Dict[str, Tuple[int, int]] = field(default_factory=dict)   # node -> (offset_ns, uncertainty_ns)
    offset_threshold_ns: int = int(DEFAULT_OFFSET_THRESHOLD_MS * 1e6)
    elapsed_ms: float = 0.0
    sql: str = ""

    @property
    def answered(self):
        return [n for n in self.nodes if n.answered]

    @property
    def failed(self):
        return [n for n in self.nodes if not n.answered]

    @property
    def exit_code(self):
        if not self.nodes or not self.answered:
            return EXIT_NONE_ANSWERED
        return EXIT_ALL_ANSWERED if not self.failed else EXIT_PARTIAL

    @property
    def flagged_offsets(self):
        return {n.node: (n.offset_ns, n.uncertainty_ns) for n in self.nodes if n.offset_flagged}

    def to_dict(self):
        return {
            "sql": self.sql,
            "columns": list(self.columns),
            "rows": self.rows,
            "nodes": [n.to_dict() for n in self.nodes],
            "offsets": {node: {"offset_ns": off, "uncertainty_ns": unc,
                               "flagged": offset_is_flagged(off, unc, self.offset_threshold_ns)}
                        for node, (off, unc) in self.offsets.items()},
            "offset_threshold_ns": self.offset_threshold_ns,
            "exit_code": self.exit_code,
            "elapsed_ms": round(self.elapsed_ms, 3),
        }


# ---------------------------------------------------------------- one node

class _NodeFailure(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class _Connection(http.client.HTTPConnection):
    """HTTP(S) to one agent, with the phase of every failure classified."""

    def __init__(self, address, tls: TLSOptions, context, timeout_s):
        host, port = split_address(address)
        super().__init__(host, port, timeout=timeout_s)
        self.address = address
        self.tls = tls
        self.context = context

    def connect(self):
        try:
            self.sock = socket.create_connection((self.host, self.port), self.timeout)
        except ConnectionRefusedError:
            raise _NodeFailure("refused", f"connection refused at {self.address}: no agent listening; "
                                          f"start it (straggler serve / the agent role) or check the port") from None
        except socket.gaierror as exc:
            raise _NodeFailure("unreachable", f"cannot resolve {self.host}: {exc.strerror}; use an IP address "
                                              f"or fix the name") from None
        except (socket.timeout, TimeoutError):
            raise _NodeFailure("unreachable", f"no answer to a TCP connect to {self.address} within "
                                              f"{self.timeout:g} s: host down, or a firewall drops the port") from None
        except OSError as exc:
            if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN):
                raise _NodeFailure("unreachable", f"{self.address} is unreachable ({exc.strerror})") from None
            raise _NodeFailure("unreachable", f"cannot connect to {self.address}: {one_line(exc)}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.context is None:
            return
        try:
            self.sock = self.context.wrap_socket(self.sock, server_hostname=self.tls.server_name or self.host)
        except ssl.SSLCertVerificationError as exc:
            raise _NodeFailure("tls-error", f"{self.address}: the agent's certificate is not trusted "
                                            f"({exc.verify_message or one_line(exc)}); is it signed by --ca, "
                                            f"with {self.tls.server_name or self.host} in its SAN?") from None
        except ssl.SSLError as exc:
            raise _NodeFailure("tls-error", _tls_message(self.address, exc)) from None
        except (socket.timeout, TimeoutError):
            raise _NodeFailure("timeout", f"{self.address} accepted the connection but did not complete the TLS "
                                          f"handshake within {self.timeout:g} s") from None
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as exc:
            raise _NodeFailure("tls-error", f"{self.address} closed the connection during the TLS handshake "
                                            f"({one_line(exc)}): is it serving plain HTTP (--no-tls)?") from None
        except OSError as exc:
            raise _NodeFailure("tls-error", f"TLS handshake with {self.address} failed: {one_line(exc)}") from None


def _tls_message(address, exc):
    text = one_line(exc)
    lower = text.lower()
    if "wrong version number" in lower or "record layer failure" in lower or "packet length too long" in lower \
            or "http request" in lower:
        return (f"{address} does not speak TLS ({text}): it is probably serving plain HTTP (--no-tls); "
                f"pass --no-tls to the client too, or restart it with certificates")
    if "certificate required" in lower or "unknown ca" in lower or "bad certificate" in lower \
            or "certificate unknown" in lower or "decrypt error" in lower:
        return (f"{address} refused this client's certificate ({text}); use a --cert/--key signed by the "
                f"fleet CA the agents trust")
    if "protocol version" in lower or "unsupported protocol" in lower:
        return f"{address} and this client share no TLS version ({text}); the agents speak TLS 1.3 only"
    return f"TLS with {address} failed: {text}"


def _request(conn, method, path, body=None, plain=False):
    """Send one request and read the whole answer -> (status_code, body bytes)."""
    headers = {"Host": conn.address, "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
    except _NodeFailure:
        raise
    except (socket.timeout, TimeoutError):
        raise _NodeFailure("timeout", f"{conn.address} accepted the request but sent no answer within "
                                      f"{conn.timeout:g} s") from None
    except ssl.SSLEOFError as exc:
        # TLS 1.3: the agent checks our certificate after our side of the handshake is done, so its
        # refusal shows up as the connection ending under the first request
        raise _NodeFailure("tls-error", f"{conn.address} ended the TLS connection right after the handshake "
                                        f"({one_line(exc)}): it refused this client's certificate; use a "
                                        f"--cert/--key signed by the fleet CA the agents trust") from None
    except ssl.SSLError as exc:
        raise _NodeFailure("tls-error", _tls_message(conn.address, exc)) from None
    except (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError,
            BrokenPipeError, http.client.IncompleteRead) as exc:
        if plain:
            raise _NodeFailure("tls-error", f"{conn.address} closed the connection on a plain-HTTP request "
                                            f"({one_line(exc)}): it probably requires TLS; drop --no-tls and "
                                            f"pass --ca/--cert/--key") from None
        raise _NodeFailure("tls-error", f"{conn.address} closed the connection without an answer "
                                        f"({one_line(exc)}): did it refuse this client's certificate?") from None
    except OSError as exc:
        raise _NodeFailure("unreachable", f"{conn.address}: {one_line(exc)}") from None
    data = _read_answer(conn, response)
    if len(data) > _MAX_RESPONSE_BYTES:
        raise _NodeFailure("sql-error", f"{conn.address} answered with more than {_MAX_RESPONSE_BYTES} bytes; "
                                        f"lower --limit")
    return response.status, data


def _read_answer(conn, response):
    """The answer's body, read whole: an answer cut short of its Content-Length, or a streamed
    (chunked) one that ends before its last chunk, is "truncated", one that stalls is "timeout"
    (never a certificate problem: the request was already answered)."""
    expected = (response.getheader("Content-Length") or "").strip()
    try:
        data = response.read(_MAX_RESPONSE_BYTES + 1)
    except http.client.IncompleteRead as exc:
        if not expected.isdigit():
            raise _NodeFailure("truncated", f"{conn.address} ended its streamed answer after {len(exc.partial)} "
                                            f"bytes, before its end (an agent cuts an answer its reader does not "
                                            f"take in time): retry, or ask for less (--limit, fewer columns)") from None
        data = exc.partial
    except (socket.timeout, TimeoutError):
        raise _NodeFailure("timeout", f"{conn.address} started its answer ({expected or '?'} bytes) but did not "
                                      f"finish it within {conn.timeout:g} s; raise --timeout or ask for less") from None
    except (ssl.SSLError, ConnectionError, OSError) as exc:
        raise _NodeFailure("truncated", f"{conn.address} ended the connection in the middle of its answer "
                                        f"({one_line(exc)}); retry") from None
    # read(amt) returns what came before the connection ended, without a word: compare the length
    if expected.isdigit() and len(data) < int(expected):
        raise _NodeFailure("truncated", f"{conn.address} ended its answer after {len(data)} of {expected} bytes "
                                        f"(an agent cuts an answer its reader does not take in time): retry, "
                                        f"or ask for less (--limit, fewer columns)")
    return data


def _decode(conn, data):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _NodeFailure("sql-error", f"{conn.address} answered with something that is not JSON "
                                        f"({data[:60]!r}); is it a straggler agent?") from None


def _shown(value, limit=60):
    """A value a node sent, for a one-line message: repr (quotes, escapes), shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def checked_node(address, claimed, expected=None):
    """The node an answer from `address` names (`claimed`), when it may: a node name, and the
    `expected` one when the caller knows which node that address is; else _NodeFailure wrong-node."""
    problem = node_name_problem(claimed)
    if problem:
        raise _NodeFailure("wrong-node", f"{address} answered as node {_shown(claimed)}, not {problem}; refusing "
                                         f"its answer")
    if expected is not None and claimed != expected:
        raise _NodeFailure("wrong-node", f"{address} answered as node {_shown(claimed)}, but it is {expected}; "
                                         f"refusing its answer: a node cannot answer as another")
    return claimed


def _checked_table(address, node, answer):
    """(columns, rows) of an answer: a list of column names and a list of rows as long; every value
    of a `node` column must be `node` (combine.foreign_node)."""
    columns, rows = answer.get("columns"), answer.get("rows")
    rows = [] if rows is None else rows
    if (not isinstance(columns, list) or not all(isinstance(c, str) for c in columns) or not isinstance(rows, list)
            or not all(isinstance(r, list) and len(r) == len(columns) for r in rows)):
        raise _NodeFailure("sql-error", f"{address} answered with a malformed table (columns and rows of equal "
                                        f"length expected); is it a straggler agent?")
    foreign = foreign_node(node, columns, rows)
    if foreign is not None:
        raise _NodeFailure("wrong-node", f"{address} (node {node}) answered rows of node {_shown(foreign[0])}; "
                                         f"refusing its answer: a node cannot answer for another")
    return columns, rows


def _query_node(address, sql, tls, context, limit, timeout_s, expected_node=None):
    started = time.monotonic()
    status = NodeStatus(address=address)
    conn = _Connection(address, tls, context, timeout_s)
    try:
        # the agent stops the query a little before we would give up, so the answer says why
        server_timeout = max(0.1, timeout_s * 0.9 - 0.05)
        body = json.dumps({"sql": sql, "limit": limit, "timeout_s": round(server_timeout, 3)}).encode()
        code, data = _request(conn, "POST", "/api/v1/query", body=body, plain=context is None)
        answer = _decode(conn, data)
        if not isinstance(answer, dict):
            raise _NodeFailure("sql-error", f"{address} answered with JSON that is not an object "
                                            f"(HTTP {code}); is it a straggler agent?")
        if code == 200 or answer.get("node") is not None:
            status.node = checked_node(address, answer.get("node"), expected_node)
        if code == 200 and "columns" in answer:
            status.columns, status.rows = _checked_table(address, status.node, answer)
            status.row_count = len(status.rows)
            status.truncated = bool(answer.get("truncated"))
            status.status = "ok" if status.rows else "empty"
            status.message = (f"{status.row_count} row{'' if status.row_count == 1 else 's'}"
                              + (_truncation_note(answer) if status.truncated else "")
                              if status.rows else "no rows")
        else:
            message, kind = answer.get("error"), answer.get("kind")
            status.status = ("tls-error" if kind in ("tls-required", "plain-http")
                             else "forbidden" if code == 403 else "sql-error")
            status.message = message or f"HTTP {code} from {address}"
    except _NodeFailure as failure:
        status.status, status.message = failure.status, failure.message
        if failure.status == "wrong-node":
            status.node = None
    except Exception as exc:  # never let one node break the call
        status.status, status.message = "unreachable", f"{address}: {one_line(exc)}"
    finally:
        conn.close()
    if not status.answered:
        status.__dict__.pop("rows", None)
        status.__dict__.pop("columns", None)
    status.latency_ms = round((time.monotonic() - started) * 1000.0, 3)
    return status


def _truncation_note(answer):
    reason = answer.get("truncated_reason")
    if reason == "bytes":
        return " (truncated at the agent's answer size cap: ask for fewer rows or columns)"
    if reason in ("timeout", "memory", "temp", "busy", "sql-error"):   # a streamed answer the agent ended early
        return f" (cut by the agent: {one_line(answer.get('error') or reason)})"
    return " (truncated at the limit)"


CLOCK_GOOD_RTT_NS = 1_000_000      # keep sampling (up to 4x) while no round trip was this short
CLOCK_EXTRA_FACTOR = 4


def _clock_node(address, tls, context, samples, timeout_s, query_running=None):
    """(node, [(t_send, node_real, t_recv), ...]) from clock requests on one connection: `samples`
    of them, and, while the node's query is still running (so it costs no latency), up to 4x as
    many while no round trip was shorter than 1 ms (a busy machine delays some answers; the
    shortest round trip bounds the error)."""
    conn = _Connection(address, tls, context, timeout_s)
    taken, node = [], None
    give_up_at = time.monotonic() + timeout_s * 0.8
    best_rtt = None
    try:
        conn.connect()
        while len(taken) < samples or (best_rtt > CLOCK_GOOD_RTT_NS and len(taken) < samples * CLOCK_EXTRA_FACTOR
                                       and query_running is not None and query_running.is_set()
                                       and time.monotonic() < give_up_at):
            t_send = time.time_ns()
            code, data = _request(conn, "GET", "/api/v1/clock?pairs=0", plain=context is None)
            t_recv = time.time_ns()
            if code != 200:
                break
            answer = _decode(conn, data)
            node = answer.get("node") or node
            taken.append((t_send, int(answer["realtime_ns"]), t_recv))
            best_rtt = t_recv - t_send if best_rtt is None else min(best_rtt, t_recv - t_send)
    except (_NodeFailure, KeyError, TypeError, ValueError, OSError, http.client.HTTPException):
        pass
    finally:
        conn.close()
    return node, taken


# ---------------------------------------------------------------- fan-out

def _run_pool(tasks, workers, results, name):
    """Run callables from `tasks` (a list of (key, fn)) on `workers` daemon threads; results go to the queue."""
    work = queue.Queue()
    for task in tasks:
        work.put(task)

    def worker():
        while True:
            try:
                key, fn = work.get_nowait()
            except queue.Empty:
                return
            try:
                value = fn()
            except BaseException as exc:  # reported, never raised in a worker
                value = exc
            results.put((key, value))

    for index in range(max(1, min(workers, len(tasks)))):
        threading.Thread(target=worker, name=f"straggler-{name}-{index}", daemon=True).start()


def _expected_per_address(addresses, expected_nodes):
    """{address: node} from {address as given: node}; StragglerError for a name that is no node name
    or an address that is not one of the nodes asked."""
    expected = {}
    for address, node in (expected_nodes or {}).items():
        key = normalize_address(address)
        if key not in addresses:
            raise StragglerError(f"a node is expected at {address} but it is not one of the nodes asked")
        problem = node_name_problem(node)
        if problem:
            raise StragglerError(f"the node expected at {address} is {_shown(node)}; expected {problem}")
        expected[key] = node
    return expected


def _refuse_shared_names(ordered):
    """Two or more addresses that answered as one node: each refused (wrong-node), its rows dropped."""
    by_node = {}
    for status in ordered:
        if status.answered:
            by_node.setdefault(status.node, []).append(status)
    for node, holders in by_node.items():
        if len(holders) < 2:
            continue
        addresses = ", ".join(s.address for s in holders)
        for status in holders:
            status.status, status.node, status.row_count = "wrong-node", None, 0
            status.message = (f"{addresses} all answered as node {node}; refusing each: a node cannot answer as "
                              f"another (give each agent its own --node, or say which node each address is)")
            status.__dict__.pop("rows", None)
            status.__dict__.pop("columns", None)


def fleet_query(nodes, sql, tls=None, limit=10000, timeout_s=5.0, deadline_s=15.0, concurrency=32,
                clock_samples=5, offset_threshold_ms=DEFAULT_OFFSET_THRESHOLD_MS, on_progress=None,
                expected_nodes=None) -> FleetResult:
    """Run `sql` on every node's agent concurrently; see the module docstring.

    nodes: 'h:p,…', a file, or a list (see parse_nodes). tls: TLSOptions (default files).
    on_progress(done, total, node_status): called in the caller's thread as each node's query ends.
    expected_nodes: {address: node name}, the node each address is (an inventory host's node name),
    where the caller knows it: an answer naming another node is refused (wrong-node).
    Raises StragglerError only for bad arguments or unusable TLS files; node failures are statuses.
    """
    started = time.monotonic()
    deadline_at = started + float(deadline_s)
    addresses = parse_nodes(nodes)
    expected = _expected_per_address(addresses, expected_nodes)
    tls = tls or TLSOptions()
    if float(timeout_s) <= 0 or float(deadline_s) <= 0:
        raise StragglerError("--timeout and --deadline must be more than 0 seconds")
    context = None if tls.no_tls else client_context(tls)
    per_node_s = min(float(timeout_s), float(deadline_s))
    results = queue.Queue()
    query_running = [threading.Event() for _ in addresses]

    def query_task(index, address):
        query_running[index].set()
        try:
            return _query_node(address, sql, tls, context, int(limit), per_node_s, expected.get(address))
        finally:
            query_running[index].clear()

    query_tasks = [(("query", i), (lambda i=i, a=a: query_task(i, a))) for i, a in enumerate(addresses)]
    _run_pool(query_tasks, int(concurrency), results, "query")
    if clock_samples and clock_samples > 0:
        clock_tasks = [(("clock", i), (lambda i=i, a=a: _clock_node(a, tls, context, int(clock_samples), per_node_s,
                                                                    query_running[i])))
                       for i, a in enumerate(addresses)]
        _run_pool(clock_tasks, int(concurrency), results, "clock")
    else:
        clock_tasks = []

    statuses: Dict[int, NodeStatus] = {}
    clocks: Dict[int, tuple] = {}
    outstanding = len(query_tasks) + len(clock_tasks)
    while outstanding:
        remaining = deadline_at - time.monotonic()
        if remaining <= 0:
            break
        try:
            (kind, index), value = results.get(timeout=remaining)
        except queue.Empty:
            break
        outstanding -= 1
        if kind == "query":
            if isinstance(value, BaseException):
                value = NodeStatus(address=addresses[index], status="unreachable", message=one_line(value))
            statuses[index] = value
            if on_progress:
                try:
                    on_progress(len(statuses), len(addresses), value)
                except Exception:
                    pass
        else:
            clocks[index] = value if not isinstance(value, BaseException) else (None, [])

    for index, address in enumerate(addresses):
        if index not in statuses:
            statuses[index] = NodeStatus(
                address=address, status="timeout", latency_ms=round((time.monotonic() - started) * 1000.0, 3),
                message=f"no answer from {address} within the whole call's deadline of {float(deadline_s):g} s")
            if on_progress:
                try:
                    on_progress(len(statuses), len(addresses), statuses[index])
                except Exception:
                    pass

    threshold_ns = int(float(offset_threshold_ms) * 1e6)
    ordered = [statuses[i] for i in range(len(addresses))]
    _refuse_shared_names(ordered)
    offsets = {}
    for index, status in enumerate(ordered):
        clock_node, samples = clocks.get(index, (None, []))
        if status.status == "wrong-node":
            continue                                   # no offset for an address that answers as another
        if status.node is None and clock_node:
            try:                                       # a node whose query failed: named by its clock answers
                status.node = checked_node(status.address, clock_node, expected.get(status.address))
            except _NodeFailure:
                continue
        if clock_node != status.node:
            continue                                   # its clock answers named another node: no offset
        if samples:
            try:
                offset_ns, uncertainty_ns = estimate_offset(samples)
            except ValueError:
                continue
            status.offset_ns, status.uncertainty_ns = offset_ns, uncertainty_ns
            status.offset_flagged = offset_is_flagged(offset_ns, uncertainty_ns, threshold_ns)
            offsets[status.node or status.address] = (offset_ns, uncertainty_ns)

    columns, rows = _combine(ordered)
    for status in ordered:   # the per-node payload is now in the combined table
        status.__dict__.pop("rows", None)
        status.__dict__.pop("columns", None)
    return FleetResult(columns=columns, rows=rows, nodes=ordered, offsets=offsets, offset_threshold_ns=threshold_ns,
                       elapsed_ms=(time.monotonic() - started) * 1000.0, sql=sql)


def _combine(ordered):
    """One table from the answering nodes, by the one rule in fleet/combine.py (the union of their
    columns, lined up by name, `node` first unless the SQL selected it); a node whose columns
    differ keeps its rows and says so in its message. Each answering node's name was checked
    (checked_node, _refuse_shared_names): one node, one address."""
    answering = [status for status in ordered if status.answered]
    columns, rows, notes = combine_answers(
        (status.node, getattr(status, "columns", None) or [], getattr(status, "rows", None) or [])
        for status in answering)
    for status, note in zip(answering, notes):
        if note:
            status.message += f"; {note}"
    return columns, rows


# ---------------------------------------------------------------- live polling (straggler watch)

class LiveFeed:
    """One agent's GET /api/v1/live, polled on one keep-alive connection (reopened after a failure).

    get(since_ns) -> (NodeStatus, answer dict or None, clock sample (t_send, node_real, t_recv) or None).
    Never raises for a node's failure: that is the status. Not thread-safe: one poller per feed.
    The feed's node is `expected_node` when given, else the node its first answer names; an answer
    naming another node is refused (wrong-node): an address cannot turn into another node mid-watch."""

    def __init__(self, address, tls=None, timeout_s=5.0, context=None, expected_node=None):
        self.address = address
        self.node = expected_node
        self.tls = tls or TLSOptions()
        self.context = context if context is not None or self.tls.no_tls else client_context(self.tls)
        self.timeout_s = float(timeout_s)
        self._conn = None

    def get(self, since_ns=None):
        started = time.monotonic()
        status = NodeStatus(address=self.address)
        answer, sample = None, None
        path = "/api/v1/live" + (f"?since={int(since_ns)}" if since_ns is not None else "")
        try:
            if self._conn is None:
                self._conn = _Connection(self.address, self.tls, self.context, self.timeout_s)
            t_send = time.time_ns()
            code, data = _request(self._conn, "GET", path, plain=self.context is None)
            t_recv = time.time_ns()
            answer = _decode(self._conn, data)
            if code != 200 or not isinstance(answer, dict) or "thread_time" not in answer:
                message = answer.get("error") if isinstance(answer, dict) else None
                raise _NodeFailure("sql-error", message or f"HTTP {code} from {self.address} for {path}: "
                                                           f"an agent older than this watch?")
            status.node = self.node = checked_node(self.address, answer.get("node"), self.node)
            status.row_count = len(answer["thread_time"])
            status.status = "ok" if status.row_count else "empty"
            status.message = f"{status.row_count} summaries"
            if answer.get("realtime_ns") is not None:
                sample = (t_send, int(answer["realtime_ns"]), t_recv)
        except _NodeFailure as failure:
            status.status, status.message = failure.status, failure.message
            answer = None
            self.close()
        except Exception as exc:  # never let one node break the watch
            status.status, status.message = "unreachable", f"{self.address}: {one_line(exc)}"
            answer = None
            self.close()
        status.latency_ms = round((time.monotonic() - started) * 1000.0, 3)
        return status, answer, sample

    def close(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None
