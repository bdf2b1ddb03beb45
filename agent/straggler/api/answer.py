"""A query answer as the API sends it: JSON bytes made one row at a time while the rows are fetched
(store.query.ReadQuery), each row counted against the answer's byte cap as it will be written.

What a value costs is what its JSON takes, not its length: a string of control characters is six
bytes a character as JSON (\\u0001), one outside the Basic Multilingual Plane twelve. So a row is
first counted from the fewest bytes it can take (store.query.lower_bound_json_bytes: reserved in
the server's answer memory before anything is made), then a big string is measured a slice at a
time with nothing kept, and only a row that fits is encoded — a row that does not fit commits no
more than a slice of its escaping. A big BLOB's hex and a big string's slices are pieces of their
own (never copied into their row's bytes).

This module must not import the fleet client or the analysis; it prints nothing.
"""
import binascii
import json

from ..store.query import QueryError, fmt_cap, lower_bound_json_bytes
from ..text import one_line

BIG_PIECE = 64 << 10                  # a value encoded alone (no copy into its row's bytes) from this size
SLICE_CHARS = 16 << 10                # a big string is measured and escaped this many characters at a time
KEEP_BEFORE_CHECK = 256 << 10         # the most of a row's small values encoded before the row is known to fit
MAX_ESCAPE = 12                       # the most bytes one character takes escaped (outside the BMP: \\ud83d\\ude00)


class AnswerMemoryFull(QueryError):
    """The node's memory for answers in flight stayed full: the answer was not made (or was cut)."""
    kind = "busy"


def _escaped_slices(text):
    """A string's JSON escaping (without its quotes), a slice at a time, as ASCII str."""
    for i in range(0, len(text), SLICE_CHARS):
        yield json.dumps(text[i:i + SLICE_CHARS])[1:-1]


def json_size(value):
    """The bytes `value` takes in a row of the answer (a BLOB as quoted hex), its escaping included;
    a big string is measured a slice at a time, nothing kept."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return 2 * len(value) + 2
    if value is None:
        return 4
    if isinstance(value, str):
        return 2 + sum(len(part) for part in _escaped_slices(value))
    return len(json.dumps(value, default=str))


def encode_row(row, budget=None):
    """A row as JSON bytes, in pieces; None when they would pass `budget` bytes (checked before any
    big value is encoded: a big string is measured first, nothing kept)."""
    parts, size, kept = [], 1 + len(row), 0      # brackets and commas; bytes made before the whole row is measured
    for value in row:
        if isinstance(value, (bytes, bytearray, memoryview)):
            n = 2 * len(value) + 2
            part = ("blob", value) if n - 2 >= BIG_PIECE else b'"' + binascii.hexlify(value) + b'"'
        elif value is None:
            part, n = b"null", 4
        elif isinstance(value, str) and (len(value) >= SLICE_CHARS or (
                budget is not None and kept + MAX_ESCAPE * len(value) + 2 > KEEP_BEFORE_CHECK)):
            # a big string, or one past what may be made before the row is known to fit: measured first (a
            # slice at a time, nothing kept), encoded only once the whole row fits
            part, n = ("str", value), (json_size(value) if budget is not None else 0)
        else:
            part = json.dumps(value, default=str).encode()
            n = len(part)
            kept += n
        size += n
        if budget is not None and size > budget:
            return None
        parts.append(part)
    pieces, small = [], [b"["]
    for index, part in enumerate(parts):
        if index:
            small.append(b",")
        if isinstance(part, bytes):
            small.append(part)
            continue
        kind, big = part                # a big value: pieces of its own
        small.append(b'"')
        pieces.append(b"".join(small))
        if kind == "str":
            pieces.extend(piece.encode("ascii") for piece in _escaped_slices(big))
        else:
            pieces.append(binascii.hexlify(big))
        small = [b'"']
    small.append(b"]")
    pieces.append(b"".join(small))
    return pieces


class JsonAnswer:
    """A query answer encoded as JSON bytes while the rows are fetched (the API's body), one row at a
    time: at most max_bytes of rows, each counted against the cap as written (its escaping included)
    before it is encoded, so a node never holds a big answer whole or twice, nor the escaping of a
    row that does not fit.

    `memory` (optional: reserve(n, wait_s) -> bool, force(n), release(n)): the server's memory for
    answers in flight; every byte made is reserved there until the sender has written it and
    released it. add() raises AnswerMemoryFull when no room came within wait_s.
    The bytes made and not yet handed over: `pieces` (.chunks) and `pending`; take() hands them over
    with their reservation."""

    def __init__(self, node, max_bytes, memory=None, wait_s=0.0):
        self.node = node
        self.max_bytes = int(max_bytes)
        self.memory = memory
        self.wait_s = float(wait_s)
        self.pieces = []
        self.pending = 0        # bytes in pieces
        self.held = 0           # bytes reserved in memory (pieces, and those handed over and not released)
        self.size = 0           # every byte made
        self.row_count = 0
        self._rows_bytes = 0

    @property
    def chunks(self):
        return self.pieces

    def _append(self, data, reserved=False):
        if not reserved and self.memory is not None:
            self.memory.force(len(data))
            self.held += len(data)
        self.pieces.append(data)
        self.pending += len(data)
        self.size += len(data)

    def start(self, columns):
        head = json.dumps({"node": self.node, "columns": list(columns)}, separators=(",", ":"))
        self._append(head[:-1].encode() + b',"rows":[')

    def add(self, row):
        """Encode a row; False when the byte cap stops it (nothing of it is kept)."""
        comma = 1 if self.row_count else 0
        room = self.max_bytes - self._rows_bytes - comma
        lower = lower_bound_json_bytes(row)
        if lower > room:
            return False
        if self.memory is not None:
            if not self.memory.reserve(lower + comma, self.wait_s):
                raise AnswerMemoryFull(f"the node's memory for answers in flight ({fmt_cap(self.memory.capacity)}) "
                                       f"stayed full for {self.wait_s:g} s; retry in a moment")
            self.held += lower + comma
        pieces = encode_row(row, budget=room)
        if pieces is None:
            self._release(lower + comma)
            return False
        size = sum(len(p) for p in pieces) + comma
        if self.memory is not None and size > lower + comma:
            if not self.memory.reserve(size - lower - comma, self.wait_s):      # what escaping made, as reserved
                self._release(lower + comma)
                raise AnswerMemoryFull(f"the node's memory for answers in flight ({fmt_cap(self.memory.capacity)}) "
                                       f"stayed full for {self.wait_s:g} s; retry in a moment")
            self.held += size - lower - comma
        if comma:
            pieces[0] = b"," + pieces[0]
        for piece in pieces:
            self._append(piece, reserved=True)
        self._rows_bytes += size
        self.row_count += 1
        return True

    def finish(self, result, error=None):
        """The closing part: truncated, truncated_reason, elapsed_ms (and `error` when the rows were cut by one)."""
        tail = {"truncated": result.truncated, "elapsed_ms": round(result.elapsed_ms, 3)}
        if result.truncated_reason:
            tail["truncated_reason"] = result.truncated_reason
        if error:
            tail["error"] = one_line(error)
        self._append(b"]," + json.dumps(tail, separators=(",", ":"))[1:].encode() + b"\n")

    def take(self):
        """(pieces, bytes) made since the last take; their reservation goes with them: release it
        with release(n) once they are written."""
        pieces, pending = self.pieces, self.pending
        self.pieces, self.pending = [], 0
        return pieces, pending

    def release(self, nbytes):
        self._release(min(nbytes, self.held))

    def release_all(self):
        self._release(self.held)

    def _release(self, nbytes):
        if self.memory is not None and nbytes > 0:
            self.memory.release(nbytes)
            self.held -= nbytes
