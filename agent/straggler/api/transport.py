"""The API's bytes on the wire: one connection's streams (plain, and TLS over ssl.SSLObject with
memory BIOs), the HTTP/1.1 request head and body length, and an answer sent under a deadline.

  - PlainStream / TLSStream: bounded reads (read_until, read_exactly) and writes; the TLS
    handshake runs in the event loop (no thread waits on a silent client), and a failed one still
    sends its alert ("protocol version", "certificate revoked", … instead of a bare EOF).
  - read_request: the request line and headers (standard library parser) within MAX_HEAD_BYTES
    and MAX_HEADERS, then the body by its one Content-Length (MAX_BODY_BYTES); anything malformed
    is a BadRequest (status, one line, kind): bad request lines, duplicate Content-Length, chunked
    bodies, defects.
  - send_answer: status line, headers and body in chunks under a deadline that grows with the
    bytes sent (Deadlines.send_timeout_s plus them at min_send_rate; the time the answer's own rows
    take to come is not the reader's); a reader too slow gets the connection reset short of the
    answer's end, never a silently short answer. An answer with a length (Content-Length) is sent
    as it is; one that streams (Answer.stream: a query answer made while it is sent) goes out
    chunked (Transfer-Encoding: chunked; to HTTP/1.0 until the connection closes), each part
    pulled from its maker (`pull`, in a worker thread) only after the one before was written, so
    one answer holds one part in memory. An answer cut short lacks the last, empty chunk.
  - first_byte, send_refusal, refuse_now: the peek that tells TLS from plain HTTP, a one-shot 400
    with a lingering close for a client that speaks the other one, and a one-shot answer with a
    lingering close right after the handshake (a revoked certificate, a client over its share).

What a request means (routes, roles, JSON bodies) lives in routes.py, and which connections are
served in server.py: this module must not know a route, read the database or hold a policy on peers.
"""
import asyncio
import http.client
import io
import logging
import socket
import ssl
import struct
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from .. import __version__
from ..text import one_line

log = logging.getLogger("straggler.api")

MAX_BODY_BYTES = 1 << 20           # a query request is SQL text, not data
MAX_HEAD_BYTES = 16 << 10          # request line and headers
MAX_HEADERS = 64
HANDSHAKE_TIMEOUT_S = 5.0           # first byte and TLS handshake
REQUEST_TIMEOUT_S = 10.0            # one whole request (line, headers, body), idle keep-alive included
SEND_TIMEOUT_S = 30.0               # an answer's deadline: this, plus its size at MIN_SEND_RATE
MIN_SEND_RATE = 1 << 20             # bytes/s a reader must take at least
SEND_CHUNK = 256 << 10
REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Content Too Large", 414: "URI Too Long",
           429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}


@dataclass(frozen=True)
class Deadlines:
    """How long a connection may take for each step (seconds), and the slowest reader served."""
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    request_timeout_s: float = REQUEST_TIMEOUT_S
    send_timeout_s: float = SEND_TIMEOUT_S
    min_send_rate: float = MIN_SEND_RATE


class BadRequest(Exception):
    """A request refused before any route ran: (status code, one line, kind)."""

    def __init__(self, code, message, kind="bad-request"):
        super().__init__(message)
        self.code = code
        self.kind = kind


class Answer:
    """What a route returns: status, headers and the body as chunks (or a file to stream, or a
    `stream` that makes the rest of the body while it is sent: next_chunk() -> (pieces, nbytes) or
    None at the end, run in a worker thread; sent(nbytes) once they are written; abandon() when the
    answer will not be finished). `sent(n)` is also called for the first chunks, `cleanup` at the end."""

    def __init__(self, code, chunks=(), content_type="application/json", headers=(), path=None, size=None,
                 cleanup=None, stream=None, on_sent=None, length_unknown=False):
        self.code = code
        self.length_unknown = length_unknown     # headers only (HEAD): no Content-Length to promise
        self.chunks = list(chunks)
        self.content_type = content_type
        self.headers = list(headers)
        self.path = path
        self.size = size if size is not None else sum(len(c) for c in self.chunks)
        self.cleanup = cleanup
        self.stream = stream
        self.on_sent = on_sent

    def sent(self, nbytes):
        if self.on_sent is not None:
            self.on_sent(nbytes)


class Request:
    """One parsed request: method, path (no trailing '/'), query (parse_qs), headers, body, and
    whether the connection closes after it."""
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


def parse_head(head: bytes) -> Request:
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
    return Request(method, target, version, headers)


def body_length(request):
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


async def read_request(stream):
    """The next request on a stream (its body read), or None when the client closed between requests."""
    head = await stream.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
    if not head:
        return None
    request = parse_head(head)
    length = body_length(request)
    if length:
        request.body = await stream.read_exactly(length)
    return request


# ---------------------------------------------------------------- streams

class PlainStream:
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


class TLSStream(PlainStream):
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


# ---------------------------------------------------------------- before the protocol is known

async def first_byte(conn, deadline):
    """Wait (until the loop time `deadline`) for the client's first byte and peek at it; None if it never came."""
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


async def send_refusal(conn, answer, node):
    """Send `answer` as plain HTTP on the raw socket and close (lingering: what the client already
    sent is read first, so closing does not reset the connection and discard the answer)."""
    loop = asyncio.get_running_loop()
    data = answer_head(answer, node, close=True) + b"".join(answer.chunks)
    try:
        await asyncio.wait_for(loop.sock_sendall(conn, data), 2.0)
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


# ---------------------------------------------------------------- answers

def answer_head(answer, node, close=False, chunked=False):
    """The status line and headers of an answer (bytes, ending with the blank line). A streamed
    answer has no length: chunked, or (HTTP/1.0) until the connection closes."""
    length = ["Transfer-Encoding: chunked"] if chunked else [] if (answer.stream is not None
                                                                   or answer.length_unknown) else [
        f"Content-Length: {answer.size}"]
    head = [f"HTTP/1.1 {answer.code} {REASONS.get(answer.code, 'Error')}",
            f"Content-Type: {answer.content_type}", *length,
            f"X-Straggler-Node: {node}", f"Server: straggler/{__version__}"]
    head += [f"{name}: {value}" for name, value in answer.headers]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")


async def send_answer(stream, peer, answer, node, deadlines, close=False, head_only=False, pull=None,
                      version="HTTP/1.1"):
    """Write an answer under a deadline that grows with the bytes written. Returns False when the
    connection cannot go on (the reader was too slow, or went away, or a streamed answer was cut).
    `pull(fn)`: awaits fn() in a worker thread (a streamed answer's next part)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    written = [0]
    waited = [0.0]          # time spent making the streamed answer's parts: not the reader's
    streamed = answer.stream is not None and not head_only
    chunked = streamed and version == "HTTP/1.1"
    if streamed and not chunked:
        close = True        # HTTP/1.0: the body ends where the connection does
    head = answer_head(answer, node, close, chunked=chunked)

    async def send(data):
        written[0] += len(data)
        deadline = started + waited[0] + deadlines.send_timeout_s + written[0] / deadlines.min_send_rate
        await asyncio.wait_for(stream.write(data), max(0.01, deadline - loop.time()))

    async def send_pieces(pieces, head=b""):
        """`head` (the status line and headers) first, then the body's pieces: small ones joined up to
        SEND_CHUNK per write, big ones written as they are (no copy); when chunked, each write's
        part of the body is one chunk."""
        group, size = [], 0

        async def flush():
            nonlocal head, group, size
            if head or size:
                body = b"".join(group)
                await send(head + (b"%x\r\n" % size + body + b"\r\n" if chunked and size else body))
            head, group, size = b"", [], 0

        for piece in pieces:
            if len(piece) < SEND_CHUNK:
                group.append(piece)
                size += len(piece)
                if size >= SEND_CHUNK:
                    await flush()
                continue
            await flush()
            if chunked:
                await send(b"%x\r\n" % len(piece))
            await send(piece)
            if chunked:
                await send(b"\r\n")
        await flush()

    try:
        if head_only:
            await send(head)
        elif answer.path is not None:
            with open(answer.path, "rb") as fh:
                chunk = head + fh.read(SEND_CHUNK - len(head))
                while chunk:
                    await send(chunk)
                    chunk = fh.read(SEND_CHUNK)
        elif not streamed:
            # status line, headers and the first part of the body in one write: no Nagle or
            # delayed-ACK stall, one TLS record for a small answer
            pieces, answer.chunks = answer.chunks, []
            await _send_plain(pieces, head, send)
            answer.sent(answer.size)
        else:
            pieces, answer.chunks = answer.chunks, []
            first_size = sum(len(p) for p in pieces)
            await send_pieces(pieces, head=head)
            answer.sent(first_size)
            while True:
                began = loop.time()
                part = await pull(answer.stream.next_chunk)
                waited[0] += loop.time() - began
                if part is None:
                    break
                pieces, nbytes = part
                await send_pieces(pieces)
                answer.stream.sent(nbytes)
            if chunked:
                await send(b"0\r\n\r\n")
        return True
    except asyncio.TimeoutError:
        log.info("%s: answer not taken within its deadline (%d bytes written); connection reset", peer, written[0])
        # reset, not a graceful close: what is still queued in the kernel would otherwise trickle
        # on, and the cut reach the reader only after it
        try:
            stream.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        return False
    except (ConnectionError, OSError, ssl.SSLError):
        return False
    except StreamCut as exc:
        log.info("%s: streamed answer cut after %d bytes: %s", peer, written[0], exc)
        return False
    finally:
        if answer.cleanup is not None:
            answer.cleanup()


class StreamCut(Exception):
    """A streamed answer's maker failed after its head was sent: the answer ends unfinished."""


async def _send_plain(pieces, head, send):
    pending = [head] + list(pieces)
    while pending:
        data, size = [], 0
        while pending and size < SEND_CHUNK:
            data.append(pending.pop(0))
            size += len(data[-1])
        await send(b"".join(data) if len(data) > 1 else data[0])


async def refuse_now(stream, answer, node):
    """Right after the handshake: send `answer` (with Connection: close) without reading the
    request, then a lingering close (what the client sends meanwhile is read and dropped, so the
    close does not reset the connection and lose the answer). Bounded: 2 s to send, 1 s to drain."""
    loop = asyncio.get_running_loop()
    data = answer_head(answer, node, close=True) + b"".join(answer.chunks)
    try:
        await asyncio.wait_for(stream.write(data), 2.0)
        stream.sock.shutdown(socket.SHUT_WR)
        drained = 0
        end = loop.time() + 1.0
        while drained < (1 << 20) and loop.time() < end:
            chunk = await asyncio.wait_for(loop.sock_recv(stream.sock, 65536), max(0.01, end - loop.time()))
            if not chunk:
                break
            drained += len(chunk)
    except (OSError, ssl.SSLError, asyncio.TimeoutError):
        pass
