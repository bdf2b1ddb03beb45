"""The watch's live feed: one agent's GET /api/v1/live, polled on one keep-alive connection, over
the fleet client's transport (fleet/client.py: the connection, its failures' statuses, the
bounded reading).

An answer is read within caps, whatever the node sends: at most the rows the agent itself answers
per table (store/live.py: MAX_THREAD_ROWS thread_time, MAX_BLOCK_ROWS block, 1000 processes,
1000 lost, MAX_NET_ROWS net_flows and net_samples, MAX_COLLECTIVE_ROWS collectives, MAX_AGGREGATE_ROWS
aggregates), each row a list of scalars of at most max_row_bytes, and max_bytes in all. A node
that sends more is `oversized` for that poll: the client stops reading, closes the connection
(the next poll opens a new one) and keeps nothing of that answer; the other nodes' feeds go on.

This module must not judge the rows (analysis/watch.py does) and must not render anything.
"""
import time

from ..store.live import INT64, MAX_AGGREGATE_ROWS, MAX_BLOCK_ROWS, MAX_COLLECTIVE_ROWS, MAX_NET_ROWS, MAX_THREAD_ROWS
from ..text import one_line
from ..tls import TLSOptions, client_context
from .client import (DEFAULT_MAX_ROW_BYTES, AnswerCaps, NodeStatus, _Connection, _NodeFailure, _request, check_caps,
                     checked_node)

LIVE_PROCESS_ROWS = 1000                 # store/live.py answers at most 1000 processes and 1000 lost rows
LIVE_LOST_ROWS = 1000
LIVE_ROWS = (("thread_time", MAX_THREAD_ROWS), ("block", MAX_BLOCK_ROWS), ("processes", LIVE_PROCESS_ROWS),
             ("lost", LIVE_LOST_ROWS), ("net_flows", MAX_NET_ROWS), ("net_samples", MAX_NET_ROWS),
             ("collectives", MAX_COLLECTIVE_ROWS), ("aggregates", MAX_AGGREGATE_ROWS))
# a full answer of the agent (20,000 summaries and 20,000 block rows of long names) is about 12 MB
DEFAULT_MAX_LIVE_BYTES = 32 << 20
# the columns the watch keys and counts rows by: integers in every row, or the answer is refused
LIVE_INTEGERS = {"thread_time": ("ts", "interval_ns", "pid", "tid"), "block": ("ts", "pid"), "processes": ("pid",),
                 "lost": ("ts", "interval_ns"), "net_flows": ("ts", "interval_ns"), "net_samples": ("ts",),
                 "collectives": ("seq", "ts"), "aggregates": ("ts", "interval_ns")}


# the answer's own numbers the watch keeps (the node's clock pair, where its rows end, its highest seq)
LIVE_NUMBERS = ("monotonic_ns", "realtime_ns", "latest_ns", "since_ns", "seq_high")


def checked_live(address, answer):
    """A live answer's tables as the watch reads them: `columns` a mapping of each table to its column
    names, every row as long as its table's columns, the LIVE_INTEGERS columns integers, every integer within
    SQLite's 64 bits (the watch puts the rows into a store); else _NodeFailure
    sql-error (one bad row from a node stops the watch on nothing)."""
    columns = answer.get("columns")
    if not isinstance(columns, dict):
        raise _NodeFailure("sql-error", f"{address} answered /live without its columns; is it a straggler agent?")
    for key in LIVE_NUMBERS:
        value = answer.get(key)
        if value is not None and (type(value) is not int or not INT64[0] <= value <= INT64[1]):
            raise _NodeFailure("sql-error", f"{address} answered /live with a malformed {key} (an integer within "
                                            f"64 bits expected)")
    for table, names in LIVE_INTEGERS.items():
        rows = answer.get(table) or []
        cols = columns.get(table)
        if not rows:
            continue
        if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols) or \
                any(name not in cols for name in names):
            raise _NodeFailure("sql-error", f"{address} answered /live with malformed {table} columns")
        at = [cols.index(name) for name in names]
        for row in rows:
            if len(row) != len(cols) or any(type(row[i]) is not int for i in at) or \
                    any(type(v) is int and not INT64[0] <= v <= INT64[1] for v in row):
                raise _NodeFailure("sql-error", f"{address} answered /live with a malformed {table} row (a row of "
                                                f"{len(cols)} values, {', '.join(names)} integers expected, every "
                                                f"integer within 64 bits)")


def live_caps(max_bytes=DEFAULT_MAX_LIVE_BYTES, max_row_bytes=DEFAULT_MAX_ROW_BYTES):
    check_caps(max_bytes, max_row_bytes)
    return AnswerCaps(max_bytes=int(max_bytes), max_row_bytes=int(max_row_bytes), arrays=LIVE_ROWS,
                      what="a live answer")


class LiveFeed:
    """One agent's GET /api/v1/live, polled on one keep-alive connection (reopened after a failure).

    get(since_ns, after_seq) -> (NodeStatus, answer dict or None, clock sample (t_send, node_real, t_recv) or None).
    Never raises for a node's failure: that is the status. Not thread-safe: one poller per feed.
    The feed's node is `expected_node` when given, else the node its first answer names; an answer
    naming another node is refused (wrong-node): an address cannot turn into another node mid-watch.
    An answer over the caps (live_caps(max_bytes, max_row_bytes)) is refused (oversized)."""

    def __init__(self, address, tls=None, timeout_s=5.0, context=None, expected_node=None,
                 max_bytes=DEFAULT_MAX_LIVE_BYTES, max_row_bytes=DEFAULT_MAX_ROW_BYTES):
        self.caps = live_caps(max_bytes, max_row_bytes)
        self.address = address
        self.node = expected_node
        self.tls = tls or TLSOptions()
        self.context = context if context is not None or self.tls.no_tls else client_context(self.tls)
        self.timeout_s = float(timeout_s)
        self._conn = None

    def get(self, since_ns=None, after_seq=None):
        started = time.monotonic()
        status = NodeStatus(address=self.address)
        answer, sample = None, None
        query = [f"since={int(since_ns)}"] if since_ns is not None else []
        query += [f"after_seq={int(after_seq)}"] if after_seq is not None else []
        path = "/api/v1/live" + ("?" + "&".join(query) if query else "")
        try:
            if self._conn is None:
                self._conn = _Connection(self.address, self.tls, self.context, self.timeout_s)
            t_send = time.time_ns()
            code, answer = _request(self._conn, "GET", path, self.caps, plain=self.context is None,
                                    expected_node=self.node)
            t_recv = time.time_ns()
            if code != 200 or not isinstance(answer.get("thread_time"), list):
                message = answer.get("error")
                raise _NodeFailure("sql-error", message or f"HTTP {code} from {self.address} for {path}: "
                                                           f"an agent older than this watch?")
            status.node = self.node = checked_node(self.address, answer.get("node"), self.node)
            checked_live(self.address, answer)
            status.row_count = len(answer["thread_time"])
            status.status = "ok" if status.row_count else "empty"
            status.message = f"{status.row_count} summaries"
            if answer.get("realtime_ns") is not None:
                sample = (t_send, int(answer["realtime_ns"]), t_recv)
        except _NodeFailure as failure:
            status.status, status.message = failure.status, failure.message
            answer = None
            self.close()       # an oversized answer: nothing more of it is read
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
