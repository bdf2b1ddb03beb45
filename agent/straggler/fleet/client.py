"""The fleet client: one SQL on every node's agent at once (HTTPS, mutual TLS), one table back
with the node's own name on every row, a status for every node, and each node's clock offset.

- Concurrent and bounded: at most `concurrency` queries in flight, each node under `timeout_s`,
  the whole call under `deadline_s` (honoured even for a peer that accepts and never answers:
  the caller never waits on a stuck worker; workers are daemon threads with socket timeouts).
- Bounded in memory too: a node is asked for `limit` rows and the client never takes more. It
  reads each answer in pieces and decodes it row by row (_BoundedJson), and stops reading, closes
  that connection and refuses the node's answer (status `oversized`) at the first row past the
  limit, at the first byte past the answer's byte cap (1 MiB + min(max_answer_bytes, limit x
  (max_row_bytes + 1)); an announced Content-Length over it is refused unread), or at a row over
  max_row_bytes. A row is a list of scalars; the answer's other fields share 1 MiB. What one
  node's answer can cost is set by these caps, whatever the node sends; the other nodes' answers
  are kept. The watch's feed (fleet/live.py) and the clock requests are bounded the same way.
- Statuses: ok | empty | sql-error | tls-error | forbidden | refused | timeout | truncated |
  oversized | unreachable | wrong-node, each with a one-line message and the latency. Nodes that
  did not answer stay in the result. `forbidden`: the certificate lacks the route's role (403).
  `truncated`: the answer ended short of its Content-Length (the agent cut a reader that was too
  slow); `timeout`: no answer, or an answer that stalled, within the time limit; `oversized`: the
  node sent more than it was asked for (rows past the limit, bytes past the cap), its answer
  refused. An answer capped by the agent (rows or bytes) is `ok` with truncated=True and says
  which cap.
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

A node's query gives its status and, beside it, its table (_query_node -> (NodeStatus, table or
None)); the status object carries no rows. The watch's live feed is fleet/live.py (LiveFeed, still
importable from here).

This module talks to agents and combines their answers by the one rule in fleet/combine.py (the
same as the collection's aggregate); it must not judge SQL (the agents do, with
store/query.py) and must not render anything (cli/fleet.py does).
"""
import codecs
import errno
import http.client
import json
import queue
import re
import socket
import ssl
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from ..clock import estimate_offset
from ..errors import StragglerError, UsageError
from ..text import node_name_problem, one_line
from ..tls import TLSOptions, client_context
from .combine import combine_answers, identity_problem, shared_name_message, shared_names, shown as _shown
# Node addresses (the one rule for an inventory host's agent address) live in fleet/inventory.py;
# these names stay importable from here.
from .inventory import DEFAULT_PORT, agent_address, normalize_address, parse_nodes, split_address  # noqa: F401

STATUSES = ("ok", "empty", "sql-error", "tls-error", "forbidden", "refused", "timeout", "truncated", "oversized",
            "unreachable", "wrong-node")
ANSWERED = ("ok", "empty")
EXIT_ALL_ANSWERED = 0
EXIT_PARTIAL = 3
EXIT_NONE_ANSWERED = 4
DEFAULT_OFFSET_THRESHOLD_MS = 5.0
DEFAULT_LIMIT = 10000
# What one node's answer may be, whatever the node sends (see the module docstring). The cap on an
# answer's rows is the agent's own default cap (api/routes.py MAX_ANSWER_BYTES): an honest agent
# never sends more rows' bytes than that, plus its answer's few other fields.
DEFAULT_MAX_ANSWER_BYTES = 64 << 20
DEFAULT_MAX_ROW_BYTES = 64 << 10        # one row as JSON
HEAD_BYTES = 1 << 20                    # an answer's fields other than its rows, all together
MAX_COLUMNS = 2000                      # SQLite's own column limit (SQLITE_MAX_COLUMN)
MAX_FIELDS = 64                         # fields of an answer object (the agent's have a dozen at most)
CLOCK_MAX_BYTES = 1 << 20               # a clock answer (?pairs=0: a few dozen bytes)
READ_PIECE = 64 << 10                   # bytes read from a socket at a time
DECODED_PER_BYTE = 3                    # an answer's rows as Python holds them: at most this times its byte cap
ANSWER_DEADLINE_FACTOR = 3              # a whole answer within this many times the per-read timeout ...
MIN_ANSWER_RATE = 1 << 20               # ... plus the time its bytes take at this rate (the agent's own floor)


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


def _send(conn, method, path, body=None, plain=False):
    """Send one request -> the response, its body not read yet (_BoundedJson reads it)."""
    headers = {"Host": conn.address, "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body, headers=headers)
        return conn.getresponse()
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
    except http.client.HTTPException as exc:    # a status line or headers over http.client's own limits
        raise _NodeFailure("sql-error", f"{conn.address} answered with a malformed HTTP head ({one_line(exc, 120)}); "
                                        f"is it a straggler agent?") from None
    except OSError as exc:
        raise _NodeFailure("unreachable", f"{conn.address}: {one_line(exc)}") from None


def _request(conn, method, path, caps, body=None, plain=False, expected_node=None):
    """Send one request and read its JSON answer within `caps` -> (status code, answer)."""
    response = _send(conn, method, path, body=body, plain=plain)
    return response.status, _BoundedJson(conn, response, caps, expected_node).read()


@dataclass(frozen=True)
class AnswerCaps:
    """What the client takes of one answer at most: max_bytes of body; in each array field named
    in `arrays` ((field, max rows), ...) at most that many rows, each a list of at most MAX_COLUMNS
    scalars and max_row_bytes of JSON; max_head_bytes of JSON for all the other fields together
    (at most MAX_FIELDS of them).
    `what` names what was asked (for messages: "1,000 rows"), `hint` ends an oversized message."""
    max_bytes: int
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    arrays: Tuple[Tuple[str, int], ...] = ()
    max_head_bytes: int = HEAD_BYTES
    what: str = "an answer"
    hint: str = ""
    rows_are: str = "allowed"          # "asked for": the rows of the array are the limit the client asked


def check_caps(max_answer_bytes, max_row_bytes):
    """UsageError unless both caps are positive whole numbers of bytes."""
    for name, value in (("--max-answer-bytes", max_answer_bytes), ("--max-row-bytes", max_row_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError(f"{name} must be a positive number of bytes, not {value!r}")


def query_caps(limit, max_answer_bytes=DEFAULT_MAX_ANSWER_BYTES, max_row_bytes=DEFAULT_MAX_ROW_BYTES):
    """The caps of a query answer of at most `limit` rows: its byte cap is what that many rows of
    max_row_bytes take, never more than max_answer_bytes (the agent caps its rows' bytes the same
    way), plus HEAD_BYTES for the answer's other fields."""
    check_caps(max_answer_bytes, max_row_bytes)
    limit = max(0, int(limit))
    max_bytes = HEAD_BYTES + min(int(max_answer_bytes), limit * (int(max_row_bytes) + 1))
    return AnswerCaps(max_bytes=max_bytes, max_row_bytes=int(max_row_bytes), arrays=(("rows", limit),),
                      what=f"{limit:,} row{'' if limit == 1 else 's'}", rows_are="asked for",
                      hint="; if this node is trusted, raise --max-answer-bytes / --max-row-bytes")


CLOCK_CAPS = AnswerCaps(max_bytes=CLOCK_MAX_BYTES, max_row_bytes=CLOCK_MAX_BYTES, max_head_bytes=CLOCK_MAX_BYTES,
                        what="a clock answer")
_SCALARS = frozenset((str, int, float, bool, type(None)))
_SPACE = re.compile(r"[ \t\n\r]*")



def _no_constant(name):
    """NaN and Infinity are no JSON (Python's decoder takes them): an answer holding one is refused."""
    raise ValueError(f"{name} is not JSON")


class _BoundedJson:
    """One answer's JSON object, read from the response in pieces and decoded value by value,
    rows one at a time: never more than the caps (AnswerCaps) read or held, whatever the node
    sends. read() -> the object; _NodeFailure oversized (the node sent more than was asked: the
    caller closes the connection, nothing more is read), truncated (the answer ended before its
    end), timeout (it stalled), sql-error (not JSON, or not a table's shape)."""

    def __init__(self, conn, response, caps: AnswerCaps, expected_node=None):
        self.address = conn.address
        self.expected_node = expected_node
        self.timeout = conn.timeout
        self.response = response
        self.caps = caps
        length = (response.getheader("Content-Length") or "").strip()
        self.expected = int(length) if length.isascii() and length.isdigit() else None
        self.received = 0
        self.ended = False
        self.first = b""                 # the answer's first bytes, for a "not JSON" message
        self.text, self.pos = "", 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.decode = json.JSONDecoder(parse_constant=_no_constant).raw_decode   # NaN/Infinity: not JSON
        self.head_left = caps.max_head_bytes
        # what the rows take decoded, as Python holds them (a two-character string is 5 bytes sent, about 50
        # held): counted against its own cap, DECODED_PER_BYTE times the bytes allowed
        self.decoded_left = DECODED_PER_BYTE * caps.max_bytes
        # the whole answer within a deadline, not only each read: a node dripping a byte just inside the
        # socket timeout holds no reader for long (an honest big answer gets the time its bytes take)
        self.started = time.monotonic()
        self.answer = {}
        if self.expected is not None and self.expected > caps.max_bytes:
            raise self._oversized(f"announced an answer of {self.expected:,} bytes, more than the "
                                  f"{caps.max_bytes:,} bytes allowed for {caps.what}; refused it unread{caps.hint}")

    def deadline_s(self):
        """The answer's deadline so far: a base, and the time its bytes received take at MIN_ANSWER_RATE."""
        return ANSWER_DEADLINE_FACTOR * max(1.0, float(self.timeout or 0)) + self.received / MIN_ANSWER_RATE

    # ---- what went wrong, in one line

    def who(self):
        """The address, and the node its answer names once read (when that is a node name, and the
        node expected there when the caller knows it)."""
        node = self.answer.get("node")
        if node_name_problem(node) is None and self.expected_node in (None, node):
            return f"{self.address} (node {node})"
        return self.address

    def _oversized(self, what):
        return _NodeFailure("oversized", f"{self.who()} {what}")

    def _not_json(self):
        return _NodeFailure("sql-error", f"{self.address} answered with something that is not JSON "
                                         f"({self.first[:60]!r}); is it a straggler agent?")

    def _malformed(self, what):
        return _NodeFailure("sql-error", f"{self.address} answered with a malformed table ({what}); is it a "
                                         f"straggler agent?")

    # ---- bytes in

    def _more(self, want=READ_PIECE):
        """Read up to `want` more bytes into the text (never past max_bytes + 1 in all); False at the end."""
        if self.ended:
            return False
        room = self.caps.max_bytes + 1 - self.received
        if time.monotonic() > self.started + self.deadline_s():
            raise _NodeFailure("timeout", f"{self.address} did not finish its answer within "
                                          f"{self.deadline_s():g} s ({self.received:,} bytes so far); raise --timeout "
                                          f"or ask for less")
        try:
            data = self.response.read1(max(1, min(int(want), room)))
        except http.client.IncompleteRead as exc:
            if self.expected is None:
                raise _NodeFailure("truncated", f"{self.address} ended its streamed answer after "
                                                f"{self.received + len(exc.partial)} bytes, before its end (an agent "
                                                f"cuts an answer its reader does not take in time): retry, or ask "
                                                f"for less (--limit, fewer columns)") from None
            data = exc.partial
        except (socket.timeout, TimeoutError):
            raise _NodeFailure("timeout", f"{self.address} started its answer ({self.expected or '?'} bytes) but "
                                          f"did not finish it within {self.timeout:g} s; raise --timeout or ask for "
                                          f"less") from None
        except (ssl.SSLError, ConnectionError, OSError, http.client.HTTPException) as exc:
            raise _NodeFailure("truncated", f"{self.address} ended the connection in the middle of its answer "
                                            f"({one_line(exc, 120)}); retry") from None
        if not data:
            self.ended = True
            # read(amt) returns what came before the connection ended, without a word: compare the length
            if self.expected is not None and self.received < self.expected:
                raise _NodeFailure("truncated", f"{self.address} ended its answer after {self.received} of "
                                                f"{self.expected} bytes (an agent cuts an answer its reader does not "
                                                f"take in time): retry, or ask for less (--limit, fewer columns)")
            return self._take(b"", final=True)
        self.received += len(data)
        if getattr(self.response, "length", None) == 0 and not self.response.isclosed():
            self.response.read()          # read1 does not close a body read to its length: the connection is reused
        if self.received > self.caps.max_bytes:
            raise self._oversized(f"sent more than the {self.caps.max_bytes:,} bytes allowed for {self.caps.what}; "
                                  f"stopped reading and refused its answer{self.caps.hint}")
        if len(self.first) < 60:
            self.first += data[:60 - len(self.first)]
        return self._take(data)

    def _take(self, data, final=False):
        try:
            more = self.utf8.decode(data, final)
        except UnicodeDecodeError:
            raise self._not_json() from None
        if self.pos:
            self.text, self.pos = self.text[self.pos:], 0
        self.text += more
        return bool(more) or not final

    # ---- JSON, a piece at a time

    def _peek(self):
        """The next character that is not white space (None at the end of the answer)."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self._more():
                return None

    def _expect(self, allowed):
        char = self._peek()
        if char is None or char not in allowed:
            raise self._not_json()
        self.pos += 1
        return char

    def _value(self, cap, what):
        """The next whole JSON value, of at most `cap` characters (oversized past them)."""
        if self._peek() is None:
            raise self._not_json()
        while True:
            try:
                value, end = self.decode(self.text, self.pos)
            except RecursionError:
                raise self._not_json() from None
            except ValueError:
                if self.ended:
                    raise self._not_json() from None
            else:
                if end - self.pos > cap:
                    break
                if end < len(self.text) or self.ended:   # a number at the end of the text may go on
                    self.pos = end
                    return value
            if len(self.text) - self.pos > cap:
                break
            self._more(max(READ_PIECE, len(self.text) - self.pos))   # doubling: a long value is decoded O(n)
        raise self._oversized(f"sent {what} of more than {cap:,} bytes; stopped reading and refused its "
                              f"answer{self.caps.hint}")

    def _head_value(self, what):
        """A field name or a value that is not a row: all of them together within max_head_bytes."""
        start = self.pos
        value = self._value(self.head_left, what)
        self.head_left -= self.pos - start
        return value

    def _rows(self, key, max_rows):
        """An array of rows, each checked as it comes: at most max_rows (the next one is not read)."""
        rows = []
        label = "rows" if key == "rows" else f"{key} rows"
        self._expect("[")
        if self._peek() == "]":
            self.pos += 1
            return rows
        while True:
            if len(rows) >= max_rows:
                raise self._oversized(f"sent more than the {max_rows:,} {label} {self.caps.rows_are}; stopped "
                                      f"reading at row {max_rows + 1:,} and refused its answer")
            row = self._value(self.caps.max_row_bytes, "a row" if key == "rows" else f"a row of {key}")
            if type(row) is not list or len(row) > MAX_COLUMNS or not set(map(type, row)) <= _SCALARS:
                raise self._malformed(f"{label}: a row that is not a list of at most {MAX_COLUMNS} values")
            self.decoded_left -= sys.getsizeof(row) + sum(map(sys.getsizeof, row))
            if self.decoded_left < 0:
                raise self._oversized(f"sent rows that take more than {DECODED_PER_BYTE * self.caps.max_bytes:,} "
                                      f"bytes decoded ({DECODED_PER_BYTE}x the {self.caps.max_bytes:,} bytes allowed for "
                                      f"{self.caps.what}); stopped reading at row {len(rows) + 1:,} and refused its "
                                      f"answer{self.caps.hint}")
            rows.append(row)
            if self._expect(",]") == "]":
                return rows

    def read(self):
        arrays = dict(self.caps.arrays)
        self._expect("{")
        if self._peek() == "}":
            self.pos += 1
        else:
            while True:
                if self._peek() != '"':
                    raise self._not_json()
                key = self._head_value("fields besides its rows")
                if len(self.answer) >= MAX_FIELDS and key not in self.answer:
                    raise self._oversized(f"sent more than {MAX_FIELDS} fields; stopped reading and refused its "
                                          f"answer")
                self._expect(":")
                if key in arrays and self._peek() == "[":
                    self.answer[key] = self._rows(key, arrays[key])
                else:
                    self.answer[key] = self._head_value(f"fields besides its rows ({_shown(key, 40)}...)")
                if self._expect(",}") == "}":
                    break
        if self._peek() is not None:          # one object, then the end of the answer
            raise self._not_json()
        return self.answer


def checked_node(address, claimed, expected=None):
    """The node an answer from `address` names (`claimed`), when it may (combine.identity_problem: a
    node name, and the `expected` one when the caller knows which node that address is); else
    _NodeFailure wrong-node."""
    problem = identity_problem(address, claimed, expected)
    if problem:
        raise _NodeFailure("wrong-node", problem)
    return claimed


def _checked_table(address, node, answer):
    """(columns, rows) of an answer: a list of column names and a list of rows as long; every value
    of a `node` column must be `node` (combine.identity_problem)."""
    columns, rows = answer.get("columns"), answer.get("rows")
    rows = [] if rows is None else rows
    if (not isinstance(columns, list) or not all(isinstance(c, str) for c in columns) or not isinstance(rows, list)
            or not all(isinstance(r, list) and len(r) == len(columns) for r in rows)):
        raise _NodeFailure("sql-error", f"{address} answered with a malformed table (columns and rows of equal "
                                        f"length expected); is it a straggler agent?")
    problem = identity_problem(address, node, None, columns, rows)
    if problem:
        raise _NodeFailure("wrong-node", problem)
    return columns, rows


def _query_node(address, sql, tls, context, limit, timeout_s, expected_node=None, caps=None):
    """(NodeStatus, table) of one node's answer: table is (columns, rows) when it answered (ok or
    empty), else None. Never more than `caps` (query_caps(limit)) is read of its answer."""
    started = time.monotonic()
    status = NodeStatus(address=address)
    table = None
    caps = caps or query_caps(limit)
    conn = _Connection(address, tls, context, timeout_s)
    reader = None
    try:
        # the agent stops the query a little before we would give up, so the answer says why
        server_timeout = max(0.1, timeout_s * 0.9 - 0.05)
        body = json.dumps({"sql": sql, "limit": limit, "timeout_s": round(server_timeout, 3)}).encode()
        response = _send(conn, "POST", "/api/v1/query", body=body, plain=context is None)
        code = response.status
        reader = _BoundedJson(conn, response, caps, expected_node)
        answer = reader.read()
        if code == 200 or answer.get("node") is not None:
            status.node = checked_node(address, answer.get("node"), expected_node)
        if code == 200 and "columns" in answer:
            table = _checked_table(address, status.node, answer)
            rows = table[1]
            status.row_count = len(rows)
            status.truncated = bool(answer.get("truncated"))
            status.status = "ok" if rows else "empty"
            status.message = (f"{status.row_count} row{'' if status.row_count == 1 else 's'}"
                              + (_truncation_note(answer) if status.truncated else "")
                              if rows else "no rows")
        else:
            message, kind = answer.get("error"), answer.get("kind")
            status.status = ("tls-error" if kind in ("tls-required", "plain-http")
                             else "forbidden" if code == 403 else "sql-error")
            status.message = message or f"HTTP {code} from {address}"
    except _NodeFailure as failure:
        status.status, status.message = failure.status, failure.message
        if failure.status == "wrong-node":
            status.node = None
        elif failure.status == "oversized" and reader is not None:
            try:                  # named as its answer named itself, when that may be its name
                status.node = checked_node(address, reader.answer.get("node"), expected_node)
            except _NodeFailure:
                pass
    except Exception as exc:  # never let one node break the call
        status.status, status.message = "unreachable", f"{address}: {one_line(exc)}"
    finally:
        conn.close()         # an oversized answer: nothing more of it is read
    if not status.answered:
        table = None
    status.latency_ms = round((time.monotonic() - started) * 1000.0, 3)
    return status, table


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
            code, answer = _request(conn, "GET", "/api/v1/clock?pairs=0", CLOCK_CAPS, plain=context is None)
            t_recv = time.time_ns()
            if code != 200:
                break
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


def _refuse_shared_names(ordered, tables):
    """Two or more addresses that answered as one node: each refused (wrong-node), its table
    ({index in ordered: (columns, rows)}) dropped."""
    answered = [(index, status) for index, status in enumerate(ordered) if status.answered]
    for node, holders in shared_names([(index, status.node) for index, status in answered]).items():
        message = shared_name_message(node, [ordered[index].address for index in holders])
        for index in holders:
            status = ordered[index]
            status.status, status.node, status.row_count, status.message = "wrong-node", None, 0, message
            tables.pop(index, None)


def fleet_query(nodes, sql, tls=None, limit=DEFAULT_LIMIT, timeout_s=5.0, deadline_s=15.0, concurrency=32,
                clock_samples=5, offset_threshold_ms=DEFAULT_OFFSET_THRESHOLD_MS, on_progress=None,
                expected_nodes=None, max_answer_bytes=DEFAULT_MAX_ANSWER_BYTES,
                max_row_bytes=DEFAULT_MAX_ROW_BYTES) -> FleetResult:
    """Run `sql` on every node's agent concurrently; see the module docstring.

    nodes: 'h:p,…', a file, or a list (see parse_nodes). tls: TLSOptions (default files).
    on_progress(done, total, node_status): called in the caller's thread as each node's query ends.
    expected_nodes: {address: node name}, the node each address is (an inventory host's node name),
    where the caller knows it: an answer naming another node is refused (wrong-node).
    limit, max_answer_bytes, max_row_bytes: the most taken of a node's answer (query_caps); a node
    that sends more is `oversized`, its answer refused, the others kept.
    Raises StragglerError only for bad arguments or unusable TLS files; node failures are statuses.
    """
    started = time.monotonic()
    deadline_at = started + float(deadline_s)
    addresses = parse_nodes(nodes)
    expected = _expected_per_address(addresses, expected_nodes)
    tls = tls or TLSOptions()
    if float(timeout_s) <= 0 or float(deadline_s) <= 0:
        raise StragglerError("--timeout and --deadline must be more than 0 seconds")
    caps = query_caps(int(limit), max_answer_bytes, max_row_bytes)
    context = None if tls.no_tls else client_context(tls)
    per_node_s = min(float(timeout_s), float(deadline_s))
    results = queue.Queue()
    query_running = [threading.Event() for _ in addresses]

    def query_task(index, address):
        query_running[index].set()
        try:
            return _query_node(address, sql, tls, context, int(limit), per_node_s, expected.get(address), caps)
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
    tables: Dict[int, tuple] = {}          # index -> (columns, rows) of a node that answered
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
                value = (NodeStatus(address=addresses[index], status="unreachable", message=one_line(value)), None)
            value, table = value
            statuses[index] = value
            if table is not None:
                tables[index] = table
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
    _refuse_shared_names(ordered, tables)
    # a node whose query failed is named by its clock answers, unless that name is another address's: an
    # answering node's, or one two failed addresses both give (one node, one address, for offsets too)
    answered_names = {status.node for status in ordered if status.answered}
    clock_names = {}
    for index, status in enumerate(ordered):
        clock_node = clocks.get(index, (None, []))[0]
        if status.node is None and clock_node and status.status != "wrong-node":
            clock_names.setdefault(clock_node, []).append(index)
    offsets = {}
    for index, status in enumerate(ordered):
        clock_node, samples = clocks.get(index, (None, []))
        if status.status == "wrong-node":
            continue                                   # no offset for an address that answers as another
        if status.node is None and clock_node:
            if clock_node in answered_names or len(clock_names.get(clock_node, ())) > 1:
                continue                               # another address's name: neither named nor an offset
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
            offsets.setdefault(status.node or status.address, (offset_ns, uncertainty_ns))

    columns, rows = _combine(ordered, tables)
    return FleetResult(columns=columns, rows=rows, nodes=ordered, offsets=offsets, offset_threshold_ns=threshold_ns,
                       elapsed_ms=(time.monotonic() - started) * 1000.0, sql=sql)


def _combine(ordered, tables):
    """One table from the answering nodes, by the one rule in fleet/combine.py (the union of their
    columns, lined up by name, `node` first unless the SQL selected it); a node whose columns
    differ keeps its rows and says so in its message. Each answering node's name was checked
    (checked_node, _refuse_shared_names): one node, one address."""
    answering = [(index, status) for index, status in enumerate(ordered) if status.answered]
    columns, rows, notes = combine_answers(
        (status.node,) + tuple(tables.get(index) or ([], [])) for index, status in answering)
    for (_, status), note in zip(answering, notes):
        if note:
            status.message += f"; {note}"
    return columns, rows


# ---------------------------------------------------------------- live polling (straggler watch)

def __getattr__(name):
    """LiveFeed lives in fleet/live.py (it uses this module's transport); still importable from here."""
    if name == "LiveFeed":
        from .live import LiveFeed
        return LiveFeed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
