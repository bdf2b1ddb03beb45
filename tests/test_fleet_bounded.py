"""A node cannot swamp the controller: the fleet client (fleet_query, every output mode of
`straggler fleet query`), the watch's live feed and `collect` take at most what they asked for.

A hostile node here is a real HTTPS server with mutual TLS (the project's own PKI), in a process of
its own, that answers far more than it was asked: 200,000 rows when 1,000 were asked (with a
Content-Length, chunked, or until the connection closes), one value of 32 MB, a Content-Length of
a terabyte, a 32 MB error message, a million fields; the live route a million summaries. What a
user would notice is asserted: the hostile node is listed as `oversized` with one line naming it
and the cap, the honest node's rows come back, and the controller's memory stays bounded: its peak
(tracemalloc, this process only; the hostile node runs in another) is a small fraction of what the
hostile node sends. These are bounds on memory, never timings.

Run as a script (`python tests/test_fleet_bounded.py serve MODE ADDRESS CA CERT KEY [ROWS]`) this
file is the hostile node (bench/bench_fleet_hostile.py uses it too)."""
import http.server
import json
import os
import ssl
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from test_api_helpers import AGENT_ADDRESSES, EXTRA_ADDRESSES, REPO, Pki, make_node_db, venv_env

from straggler.api.server import start_background
from straggler.errors import UsageError
from straggler.fleet.client import (DEFAULT_MAX_ANSWER_BYTES, DEFAULT_MAX_ROW_BYTES, EXIT_PARTIAL, HEAD_BYTES,
                                    fleet_query, query_caps)
from straggler.fleet.live import DEFAULT_MAX_LIVE_BYTES, LiveFeed

HOSTILE_NODE = "gpu-node-66"
HONEST_NODE = "gpu-node-01"
ASKED = 1000
COUNT_SQL = "SELECT op, count(*) AS n FROM events GROUP BY op ORDER BY op"
MB = 1 << 20

# ---------------------------------------------------------------- the hostile node (a process of its own)

PIECE = 64 << 10
QUERY_COLUMNS = ["op", "n", "comm", "ts", "w"]
LIVE_COLUMNS = {"thread_time": ["node", "ts", "interval_ns", "pid", "tid", "rank", "comm", "calls", "work_ns",
                                "sync_ns", "coll_ns", "runq_ns", "runq_work_ns", "runq_sync_ns", "runq_coll_ns",
                                "blocked_ns", "io_ns", "thieves"],
                "block": ["node", "ts", "pid", "comm", "requests", "bytes", "duration"],
                "processes": ["node", "pid", "ppid", "comm", "rank", "local_rank", "world_size", "first_seen",
                              "last_seen", "exited"],
                "lost": ["node", "probe", "ts", "interval_ns", "count"]}
# mode: (route it misbehaves on, how the body is framed: length | chunked | close)
MODES = {
    "many-rows": ("query", "length"),            # 200,000 rows when 1,000 were asked
    "many-rows-chunked": ("query", "chunked"),
    "many-rows-until-close": ("query", "close"),  # no length: the body ends when the connection does
    "huge-value": ("query", "length"),           # one row, one value of 32 MB
    "huge-length": ("query", "huge"),            # announces 1 TB, then sends a 32 MB value
    "huge-error": ("query", "chunked"),          # a 32 MB error message
    "many-fields": ("query", "chunked"),         # 1,000,000 fields beside the rows
    "live-many-rows": ("live", "chunked"),       # 1,000,000 summaries (an agent answers 20,000 at most)
    "live-huge-length": ("live", "huge"),
    "tiny-strings": ("query", "chunked"),        # rows of 2,000 one-letter strings: small sent, 12x as big held
    "drip": ("query", "drip"),                   # a byte every half second, each just inside the read timeout
    "nan": ("query", "length"),                  # NaN: Python's decoder takes it, JSON has no such thing
    "impostor-clock": ("query", "fail"),         # its query fails, its clock answers as the honest node
}
DRIP_S = 0.5
ANNOUNCED = 10 ** 12
ROWS = 200_000                                  # the rows of many-rows (live-many-rows: 5x as many)


def _in_pieces(parts):
    """bytes parts joined into pieces of about PIECE bytes."""
    buffer = []
    size = 0
    for part in parts:
        buffer.append(part)
        size += len(part)
        if size >= PIECE:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


def _query_rows(count):
    yield b'{"node":"%s","columns":%s,"rows":[' % (HOSTILE_NODE.encode(), json.dumps(QUERY_COLUMNS).encode())
    for i in range(count):
        yield (b"," if i else b"") + b'["cuLaunchKernel",%d,"python",1767225600123456789,0.5]' % i
    yield b'],"truncated":false,"elapsed_ms":1.0}'


def _live_rows(count):
    yield b'{"columns":%s,"thread_time":[' % json.dumps(LIVE_COLUMNS).encode()
    for i in range(count):
        yield ((b"," if i else b"") + b'["%s",%d,1000000000,4242,4242,0,"python",10,900000000,50000000,0,0,0,0,0,0,0,0]'
               % (HOSTILE_NODE.encode(), i))
    yield (b'],"block":[],"processes":[],"lost":[],"since_ns":0,"latest_ns":1,"truncated":false,'
           b'"node":"%s","monotonic_ns":1,"realtime_ns":%d}' % (HOSTILE_NODE.encode(), time.time_ns()))


def _filler(total, byte=b"A"):
    for _ in range(total // PIECE):
        yield byte * PIECE


def hostile_body(mode, rows=ROWS):
    """The pieces of the hostile answer of `mode`, made as they are sent (a new generator each call)."""
    node = HOSTILE_NODE.encode()
    if mode.startswith("many-rows"):
        return _in_pieces(_query_rows(rows))
    if mode == "huge-value":
        return _in_pieces([b'{"node":"%s","columns":["v"],"rows":[["' % node, *_filler(32 * MB), b'"]]}'])
    if mode == "huge-length":          # announced as 1 TB
        return _in_pieces([b'{"node":"%s","columns":["v"],"rows":[["' % node, *_filler(32 * MB), b'"]]}'])
    if mode == "huge-error":
        return _in_pieces([b'{"node":"%s","kind":"sql-error","error":"' % node, *_filler(32 * MB), b'"}'])
    if mode == "many-fields":
        return _in_pieces([b'{"node":"%s","columns":["v"],"rows":[]' % node]
                          + [b',"f%d":0' % i for i in range(1_000_000)] + [b"}"])
    if mode == "tiny-strings":
        row = b"[" + b",".join([b'"a"'] * 2000) + b"]"
        return _in_pieces([b'{"node":"%s","columns":%s,"rows":[' % (node, json.dumps(["c%d" % i for i in range(2000)])
                                                                       .encode())]
                          + [row + b"," for _ in range(7000)] + [row + b"]}"])
    if mode == "drip":
        return iter([b'{"node":"%s","columns":["v"],"rows":[["' % node] + [b"A"] * 1000 + [b'"]]}'])
    if mode == "nan":
        return iter([b'{"node":"%s","columns":["v"],"rows":[[NaN]]}' % node])
    if mode == "live-many-rows":
        return _in_pieces(_live_rows(5 * rows))
    if mode == "live-huge-length":     # announced as 1 TB
        return _in_pieces([b'{"columns":%s,"thread_time":[["' % json.dumps(LIVE_COLUMNS).encode(), *_filler(32 * MB),
                           b'"]]}'])
    raise ValueError(mode)


def hostile_size(mode, rows=ROWS):
    """How many bytes the hostile node sends for `mode`."""
    return sum(len(piece) for piece in hostile_body(mode, rows))


def _serve(mode, address, ca, cert, key, rows=ROWS):
    rows = int(rows)
    route_of, framing = MODES[mode]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer("query")

        def do_GET(self):
            self._answer("live" if self.path.startswith("/api/v1/live") else "clock")

        def _answer(self, route):
            if route == "query" and framing == "fail":
                body = json.dumps({"error": "no such table"}).encode()
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if route == "clock":
                claimed = HONEST_NODE if mode == "impostor-clock" else HOSTILE_NODE
                body = json.dumps({"node": claimed, "realtime_ns": time.time_ns() + (
                                   int(3600e9) if mode == "impostor-clock" else 0),
                                   "monotonic_ns": time.monotonic_ns(), "pairs": []}).encode()
                pieces, how, length = [body], "length", len(body)
            elif route == route_of:
                pieces, how = hostile_body(mode, rows), framing
                length = hostile_size(mode, rows) if how == "length" else ANNOUNCED
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if how == "drip":
                length, how = hostile_size(mode, rows), "length"
                pieces = (time.sleep(DRIP_S) or piece for piece in pieces)
            if how in ("length", "huge"):
                self.send_header("Content-Length", str(length))
            elif how == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            try:
                for piece in pieces:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if how == "chunked" else piece)
                if how == "chunked":
                    self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (OSError, ssl.SSLError):      # the client stopped reading and closed: what it should do
                self.close_connection = True

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    server = http.server.ThreadingHTTPServer((address, 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


class HostileNode:
    """The hostile node of `mode`, serving mutual TLS on `address` with the fleet CA's server
    certificate for it, in a process of its own. .address is host:port."""

    def __init__(self, certs, mode, address=EXTRA_ADDRESSES[0], rows=ROWS):
        tls = certs.server(address)
        self.mode = mode
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", mode, address, tls.ca,
                                      tls.cert, tls.key, str(rows)], stdout=subprocess.PIPE, text=True, env=venv_env(),
                                     cwd=REPO / "tests")
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.close()
            raise RuntimeError(f"the hostile node did not start: {line!r}")
        self.address = f"{address}:{int(line.split()[1])}"

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def peak_of(fn):
    """(fn(), the peak of this process's Python memory while fn ran, in bytes): tracemalloc."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        value = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return value, peak


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("bounded-pki"))


@pytest.fixture(scope="module")
def honest(certs, tmp_path_factory):
    """A real agent (in this process) with a database of its own. Yields (address, its rows of COUNT_SQL)."""
    db = tmp_path_factory.mktemp("honest") / "honest.db"
    expected = make_node_db(db, HONEST_NODE, 0)
    handle = start_background(str(db), listen=f"{AGENT_ADDRESSES[0]}:0", tls=certs.server(AGENT_ADDRESSES[0]))
    try:
        yield f"{AGENT_ADDRESSES[0]}:{handle.port}", sorted([HONEST_NODE, op, n] for op, n in expected.items())
    finally:
        handle.stop()


# ---------------------------------------------------------------- the fleet client

EXPECTED_MESSAGE = {
    "many-rows": "sent more than the 1,000 rows asked for; stopped reading at row 1,001 and refused its answer",
    "many-rows-chunked": "sent more than the 1,000 rows asked for; stopped reading at row 1,001",
    "many-rows-until-close": "sent more than the 1,000 rows asked for; stopped reading at row 1,001",
    "huge-value": f"sent a row of more than {DEFAULT_MAX_ROW_BYTES:,} bytes; stopped reading and refused its answer",
    "huge-length": (f"announced an answer of {ANNOUNCED:,} bytes, more than the {query_caps(ASKED).max_bytes:,} "
                    f"bytes allowed for 1,000 rows; refused it unread"),
    "huge-error": "sent fields besides its rows ('error'...) of more than",
    "many-fields": "sent more than 64 fields",
}


def test_rows_that_take_far_more_held_than_sent_a_drip_and_nan_are_refused(certs, honest):
    """What the byte caps alone let through: rows of one-letter strings (64 MB sent, about 800 MB as Python
    holds them: refused past 3x the byte cap, held), a node dripping a byte every half second within the
    read timeout (refused at the answer's deadline, not after its 1,000 bytes), NaN (no JSON)."""
    honest_address, honest_rows = honest
    with HostileNode(certs, "tiny-strings") as hostile:
        result, peak = peak_of(lambda: fleet_query([honest_address, hostile.address], COUNT_SQL, certs.client(),
                                                   limit=200_000, timeout_s=30, deadline_s=60, clock_samples=0))
    good, bad = result.nodes
    assert good.status == "ok" and bad.status == "oversized" and "bytes decoded" in bad.message, bad
    assert peak < 400 * MB, f"peak {peak:,} bytes"
    with HostileNode(certs, "drip") as hostile:
        started = time.monotonic()
        result = fleet_query([honest_address, hostile.address], COUNT_SQL, certs.client(), limit=ASKED,
                             timeout_s=1, deadline_s=120, clock_samples=0)
        took = time.monotonic() - started
    good, bad = result.nodes
    assert good.status == "ok" and bad.status == "timeout" and "did not finish its answer within" in bad.message, bad
    assert took < 60, f"the drip held the client {took:.0f} s (its whole answer takes 500 s)"
    with HostileNode(certs, "nan") as hostile:
        result = fleet_query([honest_address, hostile.address], COUNT_SQL, certs.client(), limit=ASKED,
                             timeout_s=30, deadline_s=60, clock_samples=0)
    good, bad = result.nodes
    assert good.status == "ok" and bad.status == "sql-error" and "not JSON" in bad.message, bad


def test_a_node_whose_query_fails_cannot_set_another_nodes_clock_offset(certs, honest):
    """Its query failed (no node named), its clock answers name the honest node an hour ahead: before, that
    became the honest node's offset (merge would have shifted its timeline); now it names nobody."""
    honest_address, _ = honest
    with HostileNode(certs, "impostor-clock") as hostile:
        result = fleet_query([honest_address, hostile.address], COUNT_SQL, certs.client(), limit=ASKED,
                             timeout_s=30, deadline_s=60, clock_samples=3)
    good, bad = result.nodes
    assert good.status == "ok" and bad.status != "ok" and bad.node is None, bad
    assert set(result.offsets) == {HONEST_NODE} and abs(result.offsets[HONEST_NODE][0]) < 60e9, result.offsets


@pytest.mark.parametrize("mode", list(EXPECTED_MESSAGE))
def test_a_node_that_answers_far_more_than_asked_is_refused_and_the_others_answer(certs, honest, mode):
    honest_address, honest_rows = honest
    with HostileNode(certs, mode) as hostile:
        result, peak = peak_of(lambda: fleet_query([honest_address, hostile.address], COUNT_SQL, certs.client(),
                                                   limit=ASKED, timeout_s=30, deadline_s=60, clock_samples=0))
    sent = hostile_size(mode)
    good, bad = result.nodes
    assert (good.status, good.node) == ("ok", HONEST_NODE), good
    assert sorted(result.rows) == honest_rows, "the honest node's rows, and nothing of the hostile one's"
    assert bad.status == "oversized", bad
    assert bad.node == HOSTILE_NODE or mode == "huge-length", bad     # named as it named itself, once read
    assert bad.message.startswith(hostile.address), bad.message
    assert EXPECTED_MESSAGE[mode] in bad.message, bad.message
    assert "\n" not in bad.message and bad.row_count == 0
    assert result.exit_code == EXIT_PARTIAL
    # the bound: what the client held at most is a small part of what the node sent (10 to 32 MB)
    assert peak < sent // 4, f"peak {peak:,} bytes of Python memory while the node sent {sent:,}"


def test_with_the_clock_exchange_too_the_hostile_node_is_refused_and_its_clock_still_measured(certs, honest):
    honest_address, honest_rows = honest
    with HostileNode(certs, "many-rows-chunked") as hostile:
        result, peak = peak_of(lambda: fleet_query([honest_address, hostile.address], COUNT_SQL, certs.client(),
                                                   limit=ASKED, timeout_s=30, deadline_s=60, clock_samples=3))
    assert [n.status for n in result.nodes] == ["ok", "oversized"]
    assert sorted(result.rows) == honest_rows
    assert set(result.offsets) == {HONEST_NODE, HOSTILE_NODE}
    assert peak < hostile_size("many-rows-chunked") // 4


@pytest.mark.parametrize("flag", ["", "--json", "--csv"])
def test_every_output_mode_of_fleet_query_lists_the_oversized_node_and_prints_the_others(certs, honest, flag):
    honest_address, _ = honest
    with HostileNode(certs, "many-rows") as hostile:
        proc = subprocess.run([sys.executable, "-m", "straggler.cli", "fleet", "query", "--nodes",
                               f"{honest_address},{hostile.address}", "--limit", str(ASKED), "--clock-samples", "0",
                               "--timeout", "30", "--deadline", "60"] + certs.tls_args(certs.client())
                              + ([flag] if flag else []) + [COUNT_SQL],
                              capture_output=True, text=True, timeout=120, env=venv_env(), cwd=REPO)
    assert proc.returncode == EXIT_PARTIAL, proc.stderr
    assert "Traceback" not in proc.stderr
    if flag == "--json":
        answer = json.loads(proc.stdout)
        assert [n["status"] for n in answer["nodes"]] == ["ok", "oversized"]
        assert {row[0] for row in answer["rows"]} == {HONEST_NODE} and len(answer["rows"]) == 3
    elif flag == "--csv":
        assert proc.stdout.splitlines()[0] == "node,op,n" and len(proc.stdout.splitlines()) == 4
        assert f"straggler fleet: {HOSTILE_NODE}: oversized: {hostile.address} (node {HOSTILE_NODE}) sent more " \
               f"than the 1,000 rows asked for" in proc.stderr, proc.stderr
    else:
        assert "oversized" in proc.stdout and f"did not answer: {HOSTILE_NODE} (oversized)" in proc.stdout, proc.stdout
        assert "1 of 2 nodes answered, 3 rows" in proc.stdout


def test_an_honest_agent_over_the_limit_is_cut_by_the_agent_and_a_long_row_needs_a_raised_cap(certs, honest):
    """An agent asked for 1,000 rows of 5,000 answers 1,000 and says so: ok, truncated. A row longer
    than the row cap is refused even from an honest agent, and taken once the cap is raised."""
    honest_address, _ = honest
    many = fleet_query([honest_address], "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                                         "LIMIT 5000) SELECT x FROM c", certs.client(), limit=ASKED, clock_samples=0)
    assert (many.nodes[0].status, many.nodes[0].truncated, len(many.rows)) == ("ok", True, ASKED)
    long_sql = "SELECT printf('%.*c', 100000, 'x') AS v"
    refused = fleet_query([honest_address], long_sql, certs.client(), limit=10, clock_samples=0)
    assert refused.nodes[0].status == "oversized" and refused.rows == []
    assert "raise --max-answer-bytes / --max-row-bytes" in refused.nodes[0].message
    taken = fleet_query([honest_address], long_sql, certs.client(), limit=10, clock_samples=0, max_row_bytes=1 << 20)
    assert taken.nodes[0].status == "ok" and taken.rows == [[HONEST_NODE, "x" * 100000]]


def test_the_caps_follow_the_limit_and_are_checked():
    assert query_caps(ASKED).max_bytes == HEAD_BYTES + ASKED * (DEFAULT_MAX_ROW_BYTES + 1)
    # rows never past the agent's own cap on them, plus the answer's other fields
    assert query_caps(200_000).max_bytes == HEAD_BYTES + DEFAULT_MAX_ANSWER_BYTES
    assert query_caps(10, max_row_bytes=100).max_bytes == HEAD_BYTES + 10 * 101
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError):
            query_caps(10, max_answer_bytes=bad)
        with pytest.raises(UsageError):
            LiveFeed("127.0.0.1:1", max_row_bytes=bad)
    proc = subprocess.run([sys.executable, "-m", "straggler.cli", "fleet", "query", "--nodes", "127.0.0.1:1",
                           "--no-tls", "--max-row-bytes", "0", "SELECT 1"],
                          capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    assert proc.returncode == 2 and "--max-row-bytes must be a positive number of bytes" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- the watch's live feed

@pytest.mark.parametrize("mode", ["live-many-rows", "live-huge-length"])
def test_the_live_feed_refuses_an_oversized_answer_and_holds_little(certs, honest, mode):
    honest_address, _ = honest
    with HostileNode(certs, mode) as hostile:
        feed = LiveFeed(hostile.address, certs.client(), timeout_s=30)

        def two_polls():
            first = feed.get()
            return first, feed.get()   # a new connection for the next poll: refused again, never stuck
        (first, second), peak = peak_of(two_polls)
        feed.close()
    for status, answer, sample in (first, second):
        assert status.status == "oversized" and answer is None and sample is None, status
        assert status.message.startswith(hostile.address), status.message
    if mode == "live-many-rows":
        assert "sent more than the 20,000 thread_time rows allowed; stopped reading at row 20,001" in first[0].message
    else:
        assert (f"announced an answer of {ANNOUNCED:,} bytes, more than the {DEFAULT_MAX_LIVE_BYTES:,} bytes allowed "
                f"for a live answer; refused it unread") in first[0].message
    sent = hostile_size(mode)
    assert peak < sent // 4, f"peak {peak:,} bytes of Python memory while the node sent {sent:,}"
    status, answer, _ = LiveFeed(honest_address, certs.client()).get()
    assert status.answered and answer["node"] == HONEST_NODE


def test_the_watch_lists_the_oversized_node_and_goes_on_with_the_others(certs, honest):
    from straggler.analysis.watch import watch
    honest_address, _ = honest
    events = []
    with HostileNode(certs, "live-many-rows") as hostile:
        (code, _), peak = peak_of(lambda: watch([honest_address, hostile.address], certs.client(), interval_s=0.5,
                                                window_s=2, baseline_s=0, timeout_s=4, on_event=events.append,
                                                request_timeout_s=20))
    lost = [e for e in events if e["event"] == "lost"]
    assert [(e["address"], e["status"]) for e in lost] == [(hostile.address, "oversized")], events
    assert "stopped reading at row 20,001" in lost[0]["message"]
    # polled every half second, each poll refused: the peak is that of one poll, not their sum
    assert peak < hostile_size("live-many-rows") // 4


# ---------------------------------------------------------------- collect: a size cap per host

def _collection():
    pytest.importorskip("ansible")
    if str(REPO / "collections") not in sys.path:
        sys.path.insert(0, str(REPO / "collections"))


def test_collect_refuses_a_database_over_max_bytes_on_the_host_and_leaves_nothing(tmp_path, capsys):
    _collection()
    from ansible.module_utils.testing import patch_module_args
    from ansible_collections.straggler.fleet.plugins.modules import collect
    db = tmp_path / "node.db"
    make_node_db(db, HONEST_NODE, 0)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    straggler_bin = str(Path(sys.executable).parent / "straggler")

    def run(**extra):
        args = dict(dest="/controller", db=str(db), straggler_bin=straggler_bin, snapshot_dir=str(scratch), **extra)
        with patch_module_args(args):
            with pytest.raises(SystemExit) as exit_info:
                collect.main()
        return exit_info.value.code, json.loads(capsys.readouterr().out)

    size = os.path.getsize(db)
    code, result = run(max_bytes=size - 1)
    assert code == 1
    assert result["msg"] == (f"the database {db} is {size} bytes, more than max_bytes ({size - 1}): nothing is "
                             f"fetched from this host; raise max_bytes if this host is trusted and its database is "
                             f"that large")
    assert os.listdir(scratch) == []
    code, result = run(max_bytes=size - 1, _ansible_check_mode=True)
    assert code == 1 and "more than max_bytes" in result["msg"]
    code, result = run()                                 # the default cap: 4 GiB
    assert code == 0 and result["max_bytes"] == 4 << 30 and result["size"] <= 4 << 30, result
    import shutil
    shutil.rmtree(result["remote_dir"])


class _Host:
    """The host side of collect for the action plugin: the module's answer (its size as reported)
    and a fetch that writes `fetched` bytes."""

    def __init__(self, tmp_path, reported, fetched):
        self.remote_dir = tmp_path / "remote"
        self.remote_dir.mkdir()
        self.reported, self.fetched = reported, fetched
        self.commands, self.fetches = [], []

    def execute_module(self, module_name, module_args, task_vars):
        import hashlib
        return dict(changed=True, db="/var/lib/straggler/straggler.db", remote_path=str(self.remote_dir / "s.db"),
                    remote_dir=str(self.remote_dir), size=self.reported,
                    checksum=hashlib.sha256(b"x" * self.fetched).hexdigest())

    def fetch(self, remote, local):
        self.fetches.append(remote)
        with open(local, "wb") as handle:
            handle.write(b"x" * self.fetched)


def _run_collect_action(monkeypatch, host, args):
    from unittest import mock
    from ansible_collections.straggler.fleet.plugins.action.collect import ActionModule
    task = mock.MagicMock()
    task.args, task.check_mode, task.diff, task.async_val, task.action = dict(args), False, False, 0, "collect"
    connection = mock.MagicMock()
    connection._shell.tmpdir, connection.become = None, False
    connection.fetch_file = host.fetch
    connection._shell.remove = lambda path, recurse=False: f"rm -rf {path}"
    action = ActionModule(task, connection, mock.MagicMock(), loader=None, templar=None, shared_loader_obj=None)
    monkeypatch.setattr(action, "_execute_module", host.execute_module)
    monkeypatch.setattr(action, "_low_level_execute_command", lambda command, sudoable=True: host.commands.append(
        command) or dict(rc=0, stdout="", stderr=""))
    monkeypatch.setattr(action, "_remove_tmp_path", lambda path: None)
    monkeypatch.setattr(action, "_make_tmp_path", lambda *args, **kwargs: None)
    return action.run(task_vars=dict(inventory_hostname=HOSTILE_NODE))


@pytest.mark.parametrize("reported, fetched, fetches", [(5000, 5000, 0), (10, 5000, 1)])
def test_collect_keeps_nothing_of_a_host_over_max_bytes_whatever_size_it_reports(monkeypatch, tmp_path, reported,
                                                                                   fetched, fetches):
    """Reported over the cap: not fetched. Reported under it but bigger when it arrives (a host
    that lies): the fetched file is removed. Either way the task fails, and the host is cleaned."""
    _collection()
    from ansible.errors import AnsibleActionFail
    host = _Host(tmp_path, reported, fetched)
    dest = tmp_path / "collected"
    with pytest.raises(AnsibleActionFail, match=r"is 5000 bytes, more than max_bytes \(1000\): nothing is kept"):
        _run_collect_action(monkeypatch, host, dict(dest=str(dest), max_bytes=1000))
    assert len(host.fetches) == fetches
    assert not dest.exists() or os.listdir(dest) == []
    assert host.commands == [f"rm -rf {host.remote_dir}"]
    (tmp_path / "again").mkdir()
    honest_host = _Host(tmp_path / "again", 5000, 5000)
    result = _run_collect_action(monkeypatch, honest_host, dict(dest=str(dest), max_bytes=5000))   # at the cap
    assert result["changed"] is True and os.path.getsize(dest / f"{HOSTILE_NODE}.db") == 5000


def test_collect_action_and_module_share_the_default_cap():
    import ast
    import yaml
    base = REPO / "collections/ansible_collections/straggler/fleet/plugins"

    def constant(path, name):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                return eval(compile(ast.Expression(node.value), str(path), "eval"))     # a literal expression
        raise AssertionError(f"{path}: no {name}")
    documented = None
    for node in ast.walk(ast.parse((base / "modules/collect.py").read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            documented = yaml.safe_load(ast.literal_eval(node.value))["options"]["max_bytes"]["default"]
    assert documented == constant(base / "modules/collect.py", "DEFAULT_MAX_BYTES") \
        == constant(base / "action/collect.py", "DEFAULT_MAX_BYTES") == 4 << 30


if __name__ == "__main__":
    if len(sys.argv) in (7, 8) and sys.argv[1] == "serve":
        _serve(*sys.argv[2:])
    else:
        sys.exit("usage: test_fleet_bounded.py serve MODE ADDRESS CA CERT KEY [ROWS]")
