"""The values a node table's columns may hold, and the SQL that finds a row breaking that: bad
values are bad input. What each column may hold comes from the store's schema (store.schema.DDL,
whatever a database declares):

  INTEGER   an integer (a number or numeric text an INTEGER column would store as an integer:
            42, 42.0, '42'); not text such as 'abc', a blob, a fraction, a number past 64 bits
  REAL      a number
  TEXT      text (a number becomes text when stored); not a blob
  JSON      (events.detail, aggregates.hist, thread_time.thieves) valid JSON text
and NULL only where the schema allows it (a column without NOT NULL).

merge copies only rows that pass (copy.py: the condition is the copy's own WHERE, so the check
costs no read of its own) and refuses an input whose copy left one out, naming it (first_bad_value);
export names the bad value that stopped it the same way (find_bad_value: the whole database). The
conditions are plain SQL of a few opcodes per value (a CAST and a comparison), true for a bad value.

Holds the rules and the reads that find a bad row; must not write anything.
"""
import functools
import sqlite3

from ...store import schema
from ...text import sql_ident

JSON_COLUMNS = frozenset({("events", "detail"), ("aggregates", "hist"), ("thread_time", "thieves")})


@functools.lru_cache(maxsize=None)
def rules():
    """{table: {column: (kind, not_null)}} of every table of the store's schema; kind is INTEGER,
    REAL, TEXT or JSON (generated columns, which no one writes, are left out)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(schema.DDL)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {}
        for table in tables:
            cols = {}
            for _, name, decl, notnull, _, _ in conn.execute(f"PRAGMA table_info({sql_ident(table)})"):
                kind = (decl or "").upper()
                if (table, name) in JSON_COLUMNS:
                    kind = "JSON"
                if kind in ("INTEGER", "REAL", "TEXT", "JSON"):
                    cols[name] = (kind, bool(notnull))
            out[table] = cols
        return out
    finally:
        conn.close()


def bad_sql(table, column, ref=None):
    """SQL true when `column` of a row of `table` holds what it may not (NULL-safe: never NULL for
    a bad value); None for a column the schema does not know. ref: how the column is written in the
    statement (default: the quoted name)."""
    rule = rules().get(table, {}).get(column)
    if rule is None:
        return None
    kind, not_null = rule
    c = ref or sql_ident(column)
    if kind == "REAL":
        allowed = "'integer', 'real'" if not_null else "'integer', 'real', 'null'"
        return f"typeof({c}) NOT IN ({allowed})"
    if kind == "INTEGER":      # text, a blob, a fraction or a number past 64 bits differ from their integer
        bad = f"{c} != CAST({c} AS INTEGER)"
    elif kind == "TEXT":       # blobs sort after all text and numbers
        bad = f"{c} >= x''"
    else:                      # JSON
        bad = f"({c} >= x'' OR ({c} IS NOT NULL AND NOT json_valid({c})))"     # json_valid(NULL) is 0
    # bad is NULL exactly when the value is
    return f"coalesce({bad}, {1 if not_null else 0})"


def expected(table, column):
    """What `column` of `table` may hold, in words."""
    kind, not_null = rules()[table][column]
    words = {"INTEGER": "an integer", "REAL": "a number", "TEXT": "text", "JSON": "JSON text"}[kind]
    return words if not_null else f"{words} or NULL"


def checked_columns(table, columns):
    """The columns of `columns` the schema has a rule for, in order."""
    known = rules().get(table, {})
    return [c for c in columns if c in known]


def first_bad_value(conn, table, columns, schema_name="main"):
    """The first row of `table` (in schema `schema_name`) holding a value one of `columns` may not:
    dict(table, column, node, rowid, value, expected), or None. One statement, one scan of the table
    (stops at the first bad row). rowid is None in a table without one."""
    columns = checked_columns(table, columns)
    if not columns:
        return None
    flags = [bad_sql(table, c) for c in columns]
    src = f"{sql_ident(schema_name)}.{sql_ident(table)}"
    has_node = "node" in rules().get(table, {})
    select = ", ".join(flags + [sql_ident(c) for c in columns])
    for rowid in ("rowid", "NULL"):                  # a WITHOUT ROWID table has none
        try:
            row = conn.execute(f"SELECT {rowid}, {'node' if has_node else 'NULL'}, {select} FROM {src} "
                               f"WHERE {' OR '.join(flags)} LIMIT 1").fetchone()
            break
        except sqlite3.OperationalError as exc:
            if rowid != "rowid" or "rowid" not in str(exc):
                raise
    if row is None:
        return None
    n = len(columns)
    hit = next(k for k in range(n) if row[2 + k])
    return dict(table=table, column=columns[hit], node=row[1], rowid=row[0], value=row[2 + n + hit],
                expected=expected(table, columns[hit]))


def find_bad_value(conn, first=()):
    """The first bad value of a whole database (first_bad_value's dict), or None: its node tables
    and roll-ups, those in `first` first, one scan each, stopping at the first table that has one.
    For a reader that failed on a database it did not write (export, explain): what to name."""
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    order = list(first) + sorted(t for t in rules() if t not in first and t != "meta")
    for table in order:
        if table not in present:
            continue
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({sql_ident(table)})")]
        found = first_bad_value(conn, table, columns)
        if found:
            return found
    return None


def describe(bad, show):
    """A found bad value in words: `events.duration of node gpu-node-02 holds 'slow' (row 17); expected
    an integer`. show: how a value is written in one line (merge.errors.show)."""
    where = f" (row {bad['rowid']})" if bad["rowid"] is not None else ""
    node = f" of node {bad['node']}" if isinstance(bad["node"], str) else f" of node {show(bad['node'])}"
    return f"{bad['table']}.{bad['column']}{node} holds {show(bad['value'])}{where}; expected {bad['expected']}"


# the tables export and explain read, looked at first when a reader failed
READ_FIRST = ("events", "thread_time", "thread_rollup", "clock_pairs", "clock_offsets", "processes", "gpu_samples")


def bad_value_line(db_path, show):
    """For a reader (export, explain) that failed on a database it did not write: one line naming the
    first bad value of db_path (describe), or None when it has none or cannot be opened read-only
    (the failure that led here then stands). show: how a value is written in one line."""
    import os
    import urllib.parse
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(os.path.abspath(db_path)) + "?mode=ro", uri=True)
        try:
            found = find_bad_value(conn, READ_FIRST)
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return describe(found, show) if found else None
