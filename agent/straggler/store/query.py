"""Read-only SQL against a node's store: the guard every query path (`straggler query`, the HTTPS
API, the fleet, Ansible) goes through.

Read-only is enforced by SQLite, never by matching the SQL text:
  - the file is opened read-only (`file:…?mode=ro`), and `PRAGMA query_only=1` is set;
  - SQLite's defensive mode (sqlite_lib: Connection.setconfig on 3.12+, else sqlite3_db_config
    through ctypes; where neither works, one warning says so);
  - an authorizer allows only SELECT, reads, functions, recursive CTEs and read-only PRAGMAs
    (ATTACH/DETACH, every write, transactions and PRAGMAs that set a value are denied);
  - exactly one statement.
Bounded, whatever the SQL:
  - time: a deadline enforced by sqlite3_interrupt from the watchdog thread (watchdog.py), which
    stops a query even inside one long opcode (count(*) over a big table, integrity_check);
  - space: the temporary files a query writes (sorts, GROUP BY, DISTINCT) under the watchdog's
    per-query cap, and what SQLite allocates for all queries together under its memory cap; a row
    cap; one value at most the length limit (SQLITE_LIMIT_LENGTH); rows are fetched, encoded and
    counted against the byte cap one at a time (ReadQuery here; the API's JSON encoding of them,
    api/answer.py, counts what escaping makes before it keeps it), so an answer never exists twice or
    whole in memory.

This module must not write to a database, must not import the API, the fleet client or the
analysis, and prints nothing (straggler.cli.query renders a QueryResult).
"""
import contextlib
import logging
import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, List

from .. import defaults
from ..errors import StragglerError
from ..text import one_line
from . import sqlite_lib
from .watchdog import WATCHDOG

log = logging.getLogger("straggler.store")

DEFAULT_DB = defaults.DB_PATH
DEFAULT_LIMIT = 10000
DEFAULT_TIMEOUT_S = 10.0
MIN_VALUE_LIMIT = 1 << 20             # SQLITE_LIMIT_LENGTH never below this, whatever the byte cap

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


class QueryOverMemory(QueryError):
    """The queries' memory (values, aggregates, caches) passed the node's cap; this one was stopped."""
    kind = "memory"


class QueryOverTemp(QueryError):
    """The query wrote more temporary data (sorting, grouping) than the node's cap allows."""
    kind = "temp"


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


_warned = []


def _warn_not_defensive():
    if not _warned:
        _warned.append(True)
        log.warning("SQLite's defensive mode is not available here (%s): reads are still read-only "
                    "(mode=ro, query_only, the authorizer); see docs/security.md", sqlite_lib.defensive_mode()[1])


def defensive_mode():
    """(True, how) when open_readonly's connections are in SQLite's defensive mode, else (False, why)."""
    return sqlite_lib.defensive_mode()


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
            with sqlite_lib.defensive_open() as seen:
                conn = sqlite3.connect(_uri(db_path, immutable), uri=True, isolation_level=None,
                                       check_same_thread=check_same_thread, timeout=5.0)
        except sqlite3.Error as exc:
            last_error = exc
            continue
        try:
            if not sqlite_lib.confirm(conn, seen):
                _warn_not_defensive()
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


def value_limit(max_bytes):
    """SQLITE_LIMIT_LENGTH for an answer of at most max_bytes: one value can never be bigger than
    the whole answer (a BLOB travels as hex: twice its size)."""
    return max(MIN_VALUE_LIMIT, int(max_bytes) // 2)


class ReadQuery:
    """One read-only statement under the guard, its rows fetched one at a time.

    start() opens the database, checks and starts the statement and returns its columns;
    next_row() gives a row, or None at the end or at `limit` rows (truncated_reason "limit" when
    more existed). The deadline is the watchdog's (pause() while the rows wait for a reader, then
    resume()). Raises QueryRejected, QueryTimeout, QueryOverMemory, QueryError and
    DatabaseUnavailable. `any_thread`: the rows may be fetched from other threads than start()'s,
    one at a time. `batch`: rows SQLite hands over at once (1 for answers streamed to a client, whose
    memory is counted row by row; more for a reader in this process that keeps every row anyway,
    explain). Always close()."""

    def __init__(self, db_path, sql, limit=DEFAULT_LIMIT, timeout_s=DEFAULT_TIMEOUT_S, params=None,
                 max_value_bytes=None, any_thread=False, batch=1):
        self.batch = max(1, int(batch))
        self._buffer = []
        if not isinstance(sql, str) or not sql.strip():
            raise QueryRejected("empty SQL; send one SELECT statement")
        if "\x00" in sql:
            raise QueryRejected("SQL contains a NUL character")
        self.limit = int(limit if limit is not None else DEFAULT_LIMIT)
        if self.limit < 0:
            raise QueryRejected(f"limit must be >= 0, got {self.limit}")
        self.timeout_s = float(timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S)
        self.db_path, self.sql, self.params = db_path, sql, params
        self.max_value_bytes = max_value_bytes
        self.any_thread = any_thread
        self.columns = []
        self.taken = 0
        self.truncated_reason = None
        self.started = time.monotonic()
        self.conn = self.cursor = self.watch = None
        self._guard = _Guard()

    def start(self):
        self.conn = open_readonly(self.db_path, check_same_thread=not self.any_thread)
        self.conn.set_authorizer(self._guard)
        if self.max_value_bytes is not None and hasattr(self.conn, "setlimit"):
            self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, int(self.max_value_bytes))
        self.watch = WATCHDOG.watch(self.conn, self.timeout_s, label="query")
        with self._errors():
            self._in_time()
            self.cursor = self.conn.execute(self.sql, self.params or ())
            self._in_time()
            if self.cursor.description is None:
                if self._guard.denied:
                    raise QueryRejected(self._guard.denied)
                raise QueryRejected("not a query: send one SELECT (or WITH … SELECT, or a read-only PRAGMA)")
            if not self._guard.saw_query:
                raise QueryRejected("not a query: send one SELECT (or WITH … SELECT, or a read-only PRAGMA)")
        self.columns = [d[0] for d in self.cursor.description]
        return self.columns

    def next_row(self):
        if self.cursor is None or self.truncated_reason is not None:
            return None
        if self.taken >= self.limit:
            with self._errors():
                if self._buffer or self.cursor.fetchone() is not None:
                    self.truncated_reason = "limit"
            self.cursor, self._buffer = None, []
            return None
        if not self._buffer:
            with self._errors():
                self._buffer = self.cursor.fetchmany(self.batch) if self.batch > 1 else [self.cursor.fetchone()]
                self._in_time()
            if not self._buffer or self._buffer[0] is None:
                self.cursor, self._buffer = None, []
                return None
            self._buffer.reverse()
        self.taken += 1
        return self._buffer.pop()

    def _in_time(self):
        """Between two steps: a deadline passed (or a stop the watchdog's interrupt came too early or
        too late for) ends the query here, whatever the watchdog thread's scheduling."""
        if self.watch is not None and WATCHDOG.overdue(self.watch) is not None:
            raise sqlite3.OperationalError("interrupted")

    def pause(self):
        if self.watch is not None:
            WATCHDOG.pause(self.watch)

    def resume(self):
        if self.watch is not None:
            WATCHDOG.resume(self.watch)

    def abandon(self):
        """Stop the statement from another thread (its answer will not be read)."""
        if self.watch is not None:
            WATCHDOG.interrupt(self.watch, "abandoned")

    @property
    def elapsed_ms(self):
        return (time.monotonic() - self.started) * 1000.0

    def result(self, rows=()):
        return QueryResult(columns=list(self.columns), rows=list(rows) if not isinstance(rows, list) else rows,
                           truncated=self.truncated_reason is not None, truncated_reason=self.truncated_reason,
                           elapsed_ms=self.elapsed_ms)

    def close(self):
        if self.watch is not None:
            WATCHDOG.unwatch(self.watch)
            self.watch = None
        self.cursor = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    @contextlib.contextmanager
    def _errors(self):
        """SQLite's exceptions as this module's one-line errors."""
        try:
            yield
        except sqlite3.ProgrammingError as exc:
            if "one statement" in str(exc):
                raise QueryRejected("more than one statement; send exactly one (remove everything after the "
                                    "first ';')") from None
            raise QueryError(one_line(exc)) from None
        except sqlite3.Warning as exc:  # Python < 3.11 reports several statements as a Warning
            raise QueryRejected(f"more than one statement ({one_line(exc)}); send exactly one") from None
        except sqlite3.DatabaseError as exc:
            stopped = self.watch.stopped if self.watch is not None else None
            if stopped == "memory":
                raise QueryOverMemory(f"query stopped: the node's memory for queries ({fmt_cap(WATCHDOG.memory_cap)}, "
                                      f"all queries together) was full and this query had done the most work; "
                                      f"narrow it (WHERE ts > …, fewer columns, LIMIT) or retry") from None
            if stopped == "temp":
                raise QueryOverTemp(f"query stopped: it wrote more than the node's {fmt_cap(WATCHDOG.temp_cap)} of "
                                    f"temporary data (sorting, grouping); narrow it (WHERE ts > …, LIMIT, fewer "
                                    f"columns)") from None
            if stopped is not None or "interrupted" in str(exc):
                raise QueryTimeout(f"query stopped after its time limit of {self.timeout_s:g} s; "
                                   f"narrow it (WHERE ts > …, LIMIT) or raise --timeout") from None
            if self._guard.denied:
                raise QueryRejected(self._guard.denied) from None
            text = one_line(exc)
            if "readonly" in text or "read-only" in text or "may not be modified" in text:
                raise QueryRejected(f"the query tried to write ({text}); queries are read-only") from None
            if "not a database" in text:
                raise DatabaseUnavailable(f"{self.db_path} is not a SQLite database ({text})") from None
            if "too big" in text and self.max_value_bytes is not None:
                raise QueryError(f"{text}: a value is over this node's answer limit of {2 * self.max_value_bytes} "
                                 f"bytes; select a part of it (substr, length) instead") from None
            if "out of memory" in text:
                raise QueryOverMemory(f"query stopped: {text}; narrow it (WHERE ts > …, fewer columns)") from None
            raise QueryError(text) from None


def fmt_cap(nbytes):
    return f"{nbytes / (1 << 20):g} MiB"


class _RowCollector:
    """Keeps the rows (run_query without `into`); stops at max_bytes of estimated JSON."""

    def __init__(self, max_bytes=None):
        self.columns = []
        self.rows = []
        self.max_bytes = max_bytes
        self.bytes = 0

    def start(self, columns):
        self.columns = columns

    def add(self, row):
        """Keep a row; False when the byte cap stops it."""
        if self.max_bytes is not None:
            size = lower_bound_json_bytes(row)
            if self.bytes + size > self.max_bytes:
                return False
            self.bytes += size
        self.rows.append(list(row))
        return True


def lower_bound_json_bytes(row):
    """The fewest bytes `row` can take as JSON (a BLOB as hex): checked before a row is encoded."""
    size = 1 + len(row)   # brackets and commas
    for value in row:
        if isinstance(value, (bytes, bytearray, memoryview)):
            size += 2 * len(value) + 2
        elif isinstance(value, str):
            size += len(value) + 2
        elif value is None:
            size += 4
        else:
            size += 1
    return size


def run_query(db_path, sql, limit=DEFAULT_LIMIT, timeout_s=DEFAULT_TIMEOUT_S, params=None, max_bytes=None,
              into=None, batch=1) -> QueryResult:
    """Run one read-only SQL statement; at most `limit` rows and about `max_bytes` of rows as JSON
    (truncated=True and truncated_reason "limit" or "bytes" when more existed).

    With max_bytes, SQLite's own length limit stops any single value over it (a QueryError).
    With `into` (a JsonAnswer), the rows are encoded into it as they are fetched and the result
    holds no rows. Raises QueryRejected (not a single read-only statement), QueryTimeout (ran
    past timeout_s), QueryOverMemory, QueryError (SQLite refused it: syntax, unknown table, too
    big, …) and DatabaseUnavailable. `batch`: ReadQuery's.
    """
    if max_bytes is not None:
        max_bytes = int(max_bytes)
        if into is not None:
            max_bytes = min(max_bytes, into.max_bytes)
    elif into is not None:
        max_bytes = into.max_bytes
    query = ReadQuery(db_path, sql, limit=limit, timeout_s=timeout_s, params=params,
                      max_value_bytes=value_limit(max_bytes) if max_bytes is not None else None, batch=batch)
    sink = into if into is not None else _RowCollector(max_bytes)
    try:
        sink.start(query.start())
        while True:
            row = query.next_row()
            if row is None:
                break
            if not sink.add(row):
                query.truncated_reason = "bytes"
                break
        result = query.result(rows=sink.rows if into is None else [])
        if into is not None:
            into.finish(result)
        return result
    finally:
        query.close()


@contextlib.contextmanager
def reading(db_path, timeout_s, what="the read"):
    """A read-only connection (open_readonly) under a deadline from the watchdog: SQLite stops at it
    (QueryTimeout, one line), inside any opcode. For the API's health, live and metrics answers."""
    conn = open_readonly(db_path)
    watch = WATCHDOG.watch(conn, timeout_s, label=what) if timeout_s else None
    try:
        yield conn
    except sqlite3.DatabaseError as exc:
        if watch is not None and (watch.stopped or "interrupted" in str(exc)):
            raise QueryTimeout(f"{what} did not finish within its time limit of {timeout_s:g} s "
                               f"(the store is busy or very large); retry") from None
        raise
    finally:
        if watch is not None:
            WATCHDOG.unwatch(watch)
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

