"""Where explain's SQL runs: one database file (a merged cluster.db or a node's store), every node of
the live fleet through the fleet client, or an open connection (the live watch's in-memory store).
Each runner answers `rows(sql) -> [dict]` and keeps `missing` ({node: {node, status, message}}) and
`answered` ({node: status}). Runners only read; nothing here decides anything."""
from ...errors import StragglerError
from ...fleet.client import ANSWERED

MAX_ROWS = 500_000                 # rows one of explain's queries may answer

class DbRunner:
    """Runs explain's SQL on one database file (read-only, through the store's query guard)."""

    def __init__(self, db_path, timeout_s):
        from ...store.query import run_query
        self._run_query = run_query
        self.db_path = db_path
        self.timeout_s = timeout_s
        self.missing = {}
        self.answered = {}

    def rows(self, text):
        try:
            result = self._run_query(self.db_path, text, limit=MAX_ROWS, timeout_s=self.timeout_s, batch=1024)
        except StragglerError as exc:
            if "no such table: thread_time" in str(exc):
                raise StragglerError(f"{self.db_path} has no thread_time table: it was written by an agent older than "
                                     "this explain (schema 2); trace again with this version") from None
            raise
        if result.truncated:           # explain's queries are bounded by design: a cut answer would mislead
            raise StragglerError(f"{self.db_path}: one of explain's queries answered more than {MAX_ROWS:,} rows; "
                                 f"cut the span with --since/--until")
        columns = result.columns
        return [dict(zip(columns, r)) for r in result.rows]


class FleetRunner:
    """Runs explain's SQL on every node through the fleet client; nodes that did not answer are `missing`."""

    def __init__(self, nodes, tls, timeout_s, deadline_s=None, fleet_query=None):
        if fleet_query is None:
            from ...fleet.client import fleet_query
        self._fleet_query = fleet_query
        self.nodes, self.tls = nodes, tls
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s or max(15.0, timeout_s + 5.0)
        self.missing = {}
        self.answered = {}

    def rows(self, text):
        result = self._fleet_query(self.nodes, text, self.tls, limit=500000, timeout_s=self.timeout_s,
                                   deadline_s=self.deadline_s, clock_samples=0)   # explain needs no offsets
        for st in result.nodes:
            name = st.node or st.address
            if st.status in ANSWERED:
                self.answered[name] = st.status
                continue
            self.missing.setdefault(name, dict(node=name, status=st.status, message=st.message or st.status,
                                               address=st.address))
        columns = list(result.columns)
        return [dict(zip(columns, r)) for r in result.rows]


class ConnRunner:
    """Runs explain's SQL on an open connection (the live watch's in-memory store of every node)."""

    def __init__(self, conn, missing=None, answered=None):
        self.conn = conn
        self.missing = dict(missing or {})
        self.answered = dict(answered or {})

    def rows(self, text):
        cur = self.conn.execute(text)
        columns = [d[0] for d in cur.description or ()]
        return [dict(zip(columns, r)) for r in cur.fetchall()]
