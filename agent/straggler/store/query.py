"""Read-only SQL against a node's store: the guard every query path (`straggler query`, the HTTPS
API, the fleet, Ansible) goes through.

Read-only is enforced by SQLite, never by matching the SQL text:
  - the file is opened read-only (`file:…?mode=ro`), and `PRAGMA query_only=1` is set;
  - an authorizer allows only SELECT, reads, functions, recursive CTEs and read-only PRAGMAs
    (ATTACH/DETACH, every write, transactions and PRAGMAs that set a value are denied);
  - exactly one statement; a time limit (progress handler) and a row cap.

This module must not write to a database, must not import the API, the fleet client or the
analysis, and prints nothing (straggler.cli.query renders a QueryResult).
"""
import json
import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, List

from .. import defaults
from ..errors import StragglerError
from ..text import one_line

DEFAULT_DB = defaults.DB_PATH
DEFAULT_LIMIT = 10000
DEFAULT_TIMEOUT_S = 10.0
_PROGRESS_EVERY_OPS = 2000
_FETCH_BATCH = 1000

# PRAGMAs that only read. Those in the second set take a name/number argument, not a value.
READ_PRAGMAS = frozenset({
    "application_id", "auto_vacuum", "cache_size", "collation_list", "compile_options", "data_version",
    "database_list", "encoding", "foreign_keys", "freelist_count", "function_list", "journal_mode",
    "module_list", "page_count", "page_size", "pragma_list", "query_only", "schema_version",
    "user_version", "table_list", "max_page_count", "busy_timeout",
})
READ_PRAGMAS_WITH_ARGUMENT = frozenset({
    "table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list",
    "table_list", "integrity_check", "quick_check",
})
DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})

_ACTION_NAMES = {getattr(sqlite3, name): name[len("SQLITE_"):].lower().replace("_", " ")
                 for name in dir(sqlite3)
                 if name.startswith("SQLITE_") and name in {
                     "SQLITE_ATTACH", "SQLITE_DETACH", "SQLITE_INSERT", "SQLITE_UPDATE", "SQLITE_DELETE",
                     "SQLITE_TRANSACTION", "SQLITE_SAVEPOINT", "SQLITE_ANALYZE", "SQLITE_REINDEX",
                     "SQLITE_ALTER_TABLE", "SQLITE_CREATE_INDEX", "SQLITE_CREATE_TABLE", "SQLITE_CREATE_TEMP_INDEX",
                     "SQLITE_CREATE_TEMP_TABLE", "SQLITE_CREATE_TEMP_TRIGGER", "SQLITE_CREATE_TEMP_VIEW",
                     "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_VIEW", "SQLITE_CREATE_VTABLE", "SQLITE_DROP_INDEX",
                     "SQLITE_DROP_TABLE", "SQLITE_DROP_TEMP_INDEX", "SQLITE_DROP_TEMP_TABLE",
                     "SQLITE_DROP_TEMP_TRIGGER", "SQLITE_DROP_TEMP_VIEW", "SQLITE_DROP_TRIGGER", "SQLITE_DROP_VIEW",
                     "SQLITE_DROP_VTABLE"}}


class QueryError(StragglerError):
    """The SQL failed on this database (syntax, unknown table, time limit, …): the node answered."""
    kind = "sql-error"


class QueryRejected(QueryError):
    """The SQL is not a single read-only query: refused before (or while) it ran."""
    kind = "rejected"


class QueryTimeout(QueryError):
    """The query ran past its time limit and was stopped."""
    kind = "timeout"


class DatabaseUnavailable(StragglerError):
    """The database file is missing, unreadable or not a SQLite database."""


@dataclass
class QueryResult:
    columns: List[str]
    rows: List[List[Any]]
    truncated: bool = False
    elapsed_ms: float = 0.0
    node: str = None   # filled by callers that know it (CLI, API)
    truncated_reason: str = None   # "limit" (row cap) or "bytes" (answer size cap) when truncated

    def to_dict(self):
        answer = {"node": self.node, "columns": list(self.columns), "rows": jsonable_rows(self.rows),
                  "truncated": self.truncated, "elapsed_ms": round(self.elapsed_ms, 3)}
        if self.truncated_reason:
            answer["truncated_reason"] = self.truncated_reason
        return answer


def jsonable_rows(rows):
    """Rows with BLOBs as hex strings, so that JSON can carry them."""
    out = []
    for row in rows:
        out.append([v.hex() if isinstance(v, (bytes, bytearray, memoryview)) else v for v in row])
    return out


def _uri(db_path, immutable=False):
    from urllib.parse import quote
    absolute = os.path.abspath(db_path)
    return f"file:{quote(absolute)}?mode=ro" + ("&immutable=1" if immutable else "")


def _wal_has_data(db_path):
    try:
        return os.path.getsize(db_path + "-wal") > 0
    except OSError:
        return False


def open_readonly(db_path, check_same_thread=True):
    """A read-only connection to db_path (WAL-aware), with query_only set. No authorizer.

    A WAL database needs its -shm file: when the directory is not writable by this user and no
    -shm exists, SQLite cannot open it read-only; then, if the WAL holds nothing, the file alone
    is complete and is opened as immutable. Raises DatabaseUnavailable with a one-line reason.
    """
    if not db_path:
        raise DatabaseUnavailable("no database path given; pass --db PATH")
    if not os.path.exists(db_path):
        raise DatabaseUnavailable(f"no database at {db_path}; is the agent tracing there (straggler trace), or pass --db PATH")
    if os.path.isdir(db_path):
        raise DatabaseUnavailable(f"{db_path} is a directory, not a database file; pass --db PATH/straggler.db")
    if not os.access(db_path, os.R_OK):
        raise DatabaseUnavailable(f"{db_path} is not readable by this user; run as the agent's user (root) or use sudo")
    last_error = None
    for immutable in (False, True):
        if immutable and _wal_has_data(db_path):
            raise DatabaseUnavailable(
                f"cannot open {db_path} read-only: its WAL holds data and this user cannot create or use "
                f"{os.path.basename(db_path)}-shm in {os.path.dirname(os.path.abspath(db_path))}; run as the "
                f"agent's user (root), or read a copy made with `straggler snapshot`")
        try:
            conn = sqlite3.connect(_uri(db_path, immutable), uri=True, isolation_level=None,
                                   check_same_thread=check_same_thread, timeout=5.0)
        except sqlite3.Error as exc:
            last_error = exc
            continue
        try:
            conn.execute("PRAGMA query_only = 1")
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return conn
        except sqlite3.DatabaseError as exc:
            conn.close()
            last_error = exc
            code = getattr(exc, "sqlite_errorcode", None)
            if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT) or "not a database" in str(exc):
                raise DatabaseUnavailable(f"{db_path} is not a SQLite database ({one_line(exc)}); "
                                          f"point --db at the agent's store") from None
            if (code & 0xff if code else None) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
                continue  # WAL index not creatable here: try immutable
            raise DatabaseUnavailable(f"cannot read {db_path}: {one_line(exc)}") from None
    raise DatabaseUnavailable(f"cannot open {db_path} read-only: {one_line(last_error)}")


class _Guard:
    """The authorizer: allows reads only, and remembers why it denied something."""

    def __init__(self):
        self.denials = []   # (specific, reason): the most telling reason is reported
        self.saw_query = False

    @property
    def denied(self):
        """Why the statement was refused, or None. Writes to SQLite's own schema tables are
        side effects of the real statement (CREATE, DROP, ANALYZE): report the statement."""
        if not self.denials:
            return None
        specific = [reason for is_specific, reason in self.denials if is_specific]
        return (specific or [reason for _, reason in self.denials])[0]

    def __call__(self, action, arg1, arg2, db_name, trigger_or_view):
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE):
            self.saw_query = True
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in DENIED_FUNCTIONS:
                return self._deny(f"function {arg2}() is not allowed")
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if arg2 is None and name in READ_PRAGMAS | READ_PRAGMAS_WITH_ARGUMENT:
                self.saw_query = True
                return sqlite3.SQLITE_OK
            if arg2 is not None and name in READ_PRAGMAS_WITH_ARGUMENT:
                self.saw_query = True
                return sqlite3.SQLITE_OK
            if arg2 is not None:
                return self._deny(f"PRAGMA {name} = {arg2} would change a setting; only reading PRAGMAs are allowed")
            return self._deny(f"PRAGMA {name} is not on the list of read-only PRAGMAs")
        if (action == sqlite3.SQLITE_UPDATE and self.saw_query and (arg1 or "").lower() in _SCHEMA_TABLES
                and db_name == "main"):
            # SQLite asks this while it sets up a table-valued function (json_each, pragma_table_info)
            # inside a SELECT; the connection is read-only and query_only either way.
            return sqlite3.SQLITE_OK
        target = (arg1 or "").lower()
        on_internal_table = target in _SCHEMA_TABLES or target.startswith("sqlite_")
        what = _ACTION_NAMES.get(action, f"action {action}")
        if action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE) and on_internal_table:
            return self._deny("the statement changes the schema or data; queries are read-only "
                              "(SELECT, WITH, read-only PRAGMA)", specific=False)
        detail = f" {arg1}" if arg1 and action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) else ""
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            if not arg1:  # VACUUM attaches a scratch database
                return self._deny("VACUUM/ATTACH is not allowed: queries are read-only")
            return self._deny(f"{what.upper()}{detail} is not allowed; query one database at a time")
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            return self._deny("transactions are not allowed; send a single SELECT")
        return self._deny(f"{what.upper()} is not allowed: queries are read-only (SELECT, WITH, read-only PRAGMA)")

    def _deny(self, reason, specific=True):
        self.denials.append((specific, reason))
        return sqlite3.SQLITE_DENY


class _RowCollector:
    """Keeps the rows (run_query); stops at max_bytes of estimated JSON."""

    def __init__(self, max_bytes=None):
        self.columns = []
        self.rows = []
        self.max_bytes = max_bytes
        self.bytes = 0

    def start(self, columns):
        self.columns = columns

    def take(self, batch):
        """Add a batch; False when the byte cap stopped it (the rows that fit are kept)."""
        if self.max_bytes is None:
            self.rows.extend(list(r) for r in batch)
            return True
        for row in batch:
            size = _estimated_json_bytes(row)
            if self.bytes + size > self.max_bytes:
                return False
            self.bytes += size
            self.rows.append(list(row))
        return True


def _estimated_json_bytes(row):
    size = 2
    for value in row:
        if isinstance(value, str):
            size += len(value) + 3
        elif isinstance(value, (bytes, bytearray, memoryview)):
            size += 2 * len(value) + 3
        else:
            size += 21
    return size


class JsonAnswer:
    """A query answer encoded as JSON bytes while the rows are fetched (the API's body): at most
    max_bytes of rows, so a node never holds a big answer twice (rows and text) or without bound.

    .chunks: the body in pieces; .size: their total length. Filled by run_query(..., into=self)."""

    def __init__(self, node, max_bytes):
        self.node = node
        self.max_bytes = int(max_bytes)
        self.chunks = []
        self.size = 0
        self.row_count = 0
        self._rows_bytes = 0

    def start(self, columns):
        head = json.dumps({"node": self.node, "columns": list(columns)}, separators=(",", ":"))
        self._append(head[:-1].encode() + b',"rows":[')

    def _append(self, data):
        self.chunks.append(data)
        self.size += len(data)

    def take(self, batch):
        rows = jsonable_rows(batch)
        text = json.dumps(rows, separators=(",", ":"), default=str)[1:-1].encode()
        if self._rows_bytes + len(text) + 1 <= self.max_bytes:
            self._add_rows(text, len(rows))
            return True
        for row in rows:   # the batch that crosses the cap: row by row, as many as fit
            one = json.dumps(row, separators=(",", ":"), default=str).encode()
            if self._rows_bytes + len(one) + 1 > self.max_bytes:
                return False
            self._add_rows(one, 1)
        return False

    def _add_rows(self, text, count):
        if not text:
            return
        if self.row_count:
            text = b"," + text
        self._append(text)
        self._rows_bytes += len(text)
        self.row_count += count

    def finish(self, result):
        tail = {"truncated": result.truncated, "elapsed_ms": round(result.elapsed_ms, 3)}
        if result.truncated_reason:
            tail["truncated_reason"] = result.truncated_reason
        self._append(b"]," + json.dumps(tail, separators=(",", ":"))[1:].encode() + b"\n")


def run_query(db_path, sql, limit=DEFAULT_LIMIT, timeout_s=DEFAULT_TIMEOUT_S, params=None, max_bytes=None,
              into=None) -> QueryResult:
    """Run one read-only SQL statement; at most `limit` rows and about `max_bytes` of rows as JSON
    (truncated=True and truncated_reason "limit" or "bytes" when more existed).

    With max_bytes, SQLite's own length limit stops any single value over it (a QueryError).
    With `into` (a JsonAnswer), the rows are encoded into it as they are fetched and the result
    holds no rows. Raises QueryRejected (not a single read-only statement), QueryTimeout (ran
    past timeout_s), QueryError (SQLite refused it: syntax, unknown table, too big, …) and
    DatabaseUnavailable.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise QueryRejected("empty SQL; send one SELECT statement")
    if "\x00" in sql:
        raise QueryRejected("SQL contains a NUL character")
    limit = int(limit if limit is not None else DEFAULT_LIMIT)
    if limit < 0:
        raise QueryRejected(f"limit must be >= 0, got {limit}")
    timeout_s = float(timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S)
    if max_bytes is not None:
        max_bytes = int(max_bytes)
        if into is not None:
            max_bytes = min(max_bytes, into.max_bytes)
    elif into is not None:
        max_bytes = into.max_bytes
    sink = into if into is not None else _RowCollector(max_bytes)
    started = time.monotonic()
    conn = open_readonly(db_path)
    guard = _Guard()
    deadline = started + max(0.0, timeout_s)
    stopped_by_timer = []

    def progress():
        if time.monotonic() > deadline:
            stopped_by_timer.append(True)
            return 1
        return 0

    truncated_reason = None
    try:
        conn.set_authorizer(guard)
        conn.set_progress_handler(progress, _PROGRESS_EVERY_OPS)
        if max_bytes is not None and hasattr(conn, "setlimit"):
            # one value can never be bigger than the whole answer (a BLOB travels as hex: twice)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(1 << 20, max_bytes // 2))
        try:
            cursor = conn.execute(sql, params or ())
            if cursor.description is None:
                if guard.denied:
                    raise QueryRejected(guard.denied)
                raise QueryRejected("not a query: send one SELECT (or WITH … SELECT, or a read-only PRAGMA)")
            if not guard.saw_query:
                raise QueryRejected("not a query: send one SELECT (or WITH … SELECT, or a read-only PRAGMA)")
            sink.start([d[0] for d in cursor.description])
            taken = 0
            while taken < limit:
                batch = cursor.fetchmany(min(_FETCH_BATCH, limit - taken))
                if not batch:
                    break
                if not sink.take(batch):
                    truncated_reason = "bytes"
                    break
                taken += len(batch)
            if truncated_reason is None and taken >= limit and cursor.fetchmany(1):
                truncated_reason = "limit"
        except sqlite3.ProgrammingError as exc:
            if "one statement" in str(exc):
                raise QueryRejected("more than one statement; send exactly one (remove everything after the first ';')") from None
            raise QueryError(one_line(exc)) from None
        except sqlite3.Warning as exc:  # Python < 3.11 reports several statements as a Warning
            raise QueryRejected(f"more than one statement ({one_line(exc)}); send exactly one") from None
        except sqlite3.DatabaseError as exc:
            if stopped_by_timer or "interrupted" in str(exc):
                raise QueryTimeout(f"query stopped after its time limit of {timeout_s:g} s; "
                                   f"narrow it (WHERE ts > …, LIMIT) or raise --timeout") from None
            if guard.denied:
                raise QueryRejected(guard.denied) from None
            text = one_line(exc)
            if "readonly" in text or "read-only" in text or "may not be modified" in text:
                raise QueryRejected(f"the query tried to write ({text}); queries are read-only") from None
            if "not a database" in text:
                raise DatabaseUnavailable(f"{db_path} is not a SQLite database ({text})") from None
            if "too big" in text and max_bytes is not None:
                raise QueryError(f"{text}: a value is over this node's answer limit of {max_bytes} bytes; "
                                 f"select a part of it (substr, length) instead") from None
            raise QueryError(text) from None
        result = QueryResult(columns=list(getattr(sink, "columns", []) or []),
                             rows=getattr(sink, "rows", []) if into is None else [],
                             truncated=truncated_reason is not None, truncated_reason=truncated_reason,
                             elapsed_ms=(time.monotonic() - started) * 1000.0)
        if into is not None:
            into.finish(result)
        return result
    finally:
        conn.set_progress_handler(None, 0)
        conn.close()


def node_name(db_path, default=None):
    """The node name stored in meta (key 'node'), else `default`, else this host's name."""
    try:
        conn = open_readonly(db_path)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()
        finally:
            conn.close()
        if row and row[0]:
            return str(row[0])
    except (StragglerError, sqlite3.Error):
        pass
    return default or socket.gethostname()

