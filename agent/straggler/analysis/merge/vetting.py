"""Vetting merge's untrusted inputs (they come from the nodes): before any statement reads `meta` or
a node table, the input's sqlite_master (plain data) is checked — each object merge reads must be
a plain table (not a view, a virtual table, or a table with virtual generated columns) and the
input must hold no trigger — so an input cannot make merge run SQL of its own. Connections to an
input run with `trusted_schema=OFF`, `query_only`, `cell_size_check` and, where Python offers it
(3.12+), SQLite's defensive mode. Every meta value merge uses is type-checked (schema_version an
integer, node a node name, nodes a JSON list of node names), and so are the clock values it
computes with (input_clock_pairs, input_offsets).

Which nodes an input holds is what it says (declared_nodes): meta `node` (a node's store, as the
agent writes it) or meta `nodes` (a merged database); an input that says neither is refused. What
it says is then checked over every row, in SQL (check_rows): each node table's node column must
hold only those names, compared byte for byte whatever collation the input declares; one row of
another node anywhere refuses the input. Rows are never sampled. The other columns' values are
checked by the copy itself (values.py, copy.py): every one, as it is read.

Holds the checks and the checked reads only; must not write anything, plan names or copy rows.
"""
import json
import os
import re
import sqlite3
import urllib.parse

from ... import clock
from ...store import schema
from ...text import has_unprintable, node_name_problem, one_line
from .errors import MergeError, show

NODE_META_PREFIX = "node."         # a merged database keeps each node's own meta keys as node.<NODE>.<key>

# The node tables merge reads and copies (all carry a node column), in dependency-free order.
NODE_TABLES = ("clock_pairs", "clock_offsets", "processes", "probes", "lost_events", "agent_cost",
               "aggregates", "thread_time", "gpus", "gpu_samples", "gpu_processes", "gpu_errors", "net_samples",
               "rdma_samples", "net_flows", "events")
# Everything merge reads from an input: each must be a plain table (or absent, for NODE_TABLES).
READ_OBJECTS = ("meta",) + NODE_TABLES
SQLITE_HEADER = b"SQLite format 3\x00"
MAX_NODES_PER_INPUT = 100_000
MAX_NODES_JSON = 1 << 20            # bytes of meta `nodes` parsed at most
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_PLAIN_TABLE_SQL = re.compile(r"\s*CREATE\s+TABLE\b", re.IGNORECASE)
_VERSION_TEXT = re.compile(r"[0-9]{1,9}")


def ro_uri(path):
    """The read-only URI merge opens (or attaches) a database by."""
    return "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"


def harden(conn, read_only):
    """Settings for a connection that reads untrusted databases: the schema may not call functions
    or virtual tables that are not innocuous, corrupt pages are caught early, and (Python 3.12+)
    SQLite's defensive mode. The read-only input connection also refuses any write."""
    conn.execute("PRAGMA trusted_schema=OFF")
    conn.execute("PRAGMA cell_size_check=ON")
    if read_only:
        conn.execute("PRAGMA query_only=ON")
    defensive = getattr(sqlite3, "SQLITE_DBCONFIG_DEFENSIVE", None)
    if defensive is not None and hasattr(conn, "setconfig"):
        conn.setconfig(defensive, True)


def _check_node_name(name, path, where):
    problem = node_name_problem(name)
    if problem:
        raise MergeError(f"{path}: {where} is {show(name)}; expected {problem}")
    return name


def vet_schema(conn, path, schema_name="main"):
    """Refuse an input that could run SQL of its own when merge reads it; return the tables of
    READ_OBJECTS it has. Reads only sqlite_master (plain data) and table_xinfo (the parsed schema)."""
    present = set()
    for kind, name, sql in conn.execute(f"SELECT type, name, sql FROM {schema_name}.sqlite_master"):
        if kind == "trigger":
            raise MergeError(f"{path}: holds trigger {show(name)}; refusing an input that would run its own SQL")
        lowered = name.translate(_ASCII_LOWER) if isinstance(name, str) else None
        if lowered not in READ_OBJECTS:
            continue
        if kind == "table" and not (isinstance(sql, str) and _PLAIN_TABLE_SQL.match(sql)):
            kind = "virtual table"
        if kind != "table":
            what = {"view": "a view", "index": "an index", "virtual table": "a virtual table"}.get(kind, show(kind, 20))
            raise MergeError(f"{path}: `{lowered}` is {what}, not a table; refusing an input that would run its own SQL")
        present.add(lowered)
    for table in sorted(present):
        for row in conn.execute(f"PRAGMA {schema_name}.table_xinfo({table})"):
            # hidden 2: a VIRTUAL generated column, computed by its own SQL when read (events.id is
            # one in every store, and merge never reads it)
            if len(row) > 6 and row[6] == 2 and not (table == "events" and row[1] == "id"):
                raise MergeError(f"{path}: column {show(row[1])} of `{table}` is computed by its own SQL "
                                 f"(a generated column); refusing an input that would run its own SQL")
    if "meta" not in present:
        raise MergeError(f"{path}: not a straggler database (no table meta)")
    return present


def read_meta(conn, path, schema_name="main"):
    """The input's meta as {key: value}, every key checked; the values merge uses are checked too."""
    meta = {}
    for key, value in conn.execute(f"SELECT key, value FROM {schema_name}.meta"):
        if not isinstance(key, str) or not key or has_unprintable(key):
            raise MergeError(f"{path}: meta has a key {show(key)}; expected non-empty text without control characters")
        if key in meta:
            raise MergeError(f"{path}: meta key {key!r} appears twice; expected one row per key")
        meta[key] = value
    version = meta.get("schema_version")
    if version is None:
        raise MergeError(f"{path}: not a straggler database (no schema_version in table meta)")
    if not ((type(version) is int and version >= 0)
            or (isinstance(version, str) and _VERSION_TEXT.fullmatch(version))):
        raise MergeError(f"{path}: meta key schema_version is {show(version)}; expected an integer (a schema version)")
    if int(version) > schema.SCHEMA_VERSION:
        raise MergeError(f"{path}: schema version {int(version)} is newer than this straggler understands "
                         f"({schema.SCHEMA_VERSION}); upgrade straggler")
    if "node" in meta:
        _check_node_name(meta["node"], path, "meta key node")
    if "nodes" in meta:
        meta["nodes"] = _parse_nodes(meta["nodes"], path)
    return meta


def _parse_nodes(value, path):
    expected = "expected a JSON list of node names"
    if not isinstance(value, str) or len(value) > MAX_NODES_JSON:
        raise MergeError(f"{path}: meta key nodes is {show(value)}; {expected}")
    try:
        names = json.loads(value)
    except (ValueError, RecursionError):
        raise MergeError(f"{path}: meta key nodes is {show(value)}, not JSON; {expected}") from None
    if not isinstance(names, list):
        raise MergeError(f"{path}: meta key nodes is {show(value)}; {expected}")
    for name in names:
        _check_node_name(name, path, "a name in meta key nodes")
    return names


def inspect_input(path, deadline=None):
    """Check one input (exists, SQLite, only plain tables where merge reads, sound meta) and list the
    nodes it says it holds (declared_nodes; its rows are checked against them when it is copied,
    check_rows). `deadline`: a merge.deadline.Deadline watching the reads, or None."""
    if not os.path.isfile(path):
        raise MergeError(f"{path}: no such file; pass node databases written by `straggler trace` or `straggler snapshot`")
    with open(path, "rb") as fh:
        header = fh.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise MergeError(f"{path}: not an SQLite database; pass node databases written by `straggler trace` or `straggler snapshot`")
    try:
        conn = sqlite3.connect(ro_uri(path), uri=True)
    except sqlite3.Error as exc:
        raise MergeError(f"{path}: cannot open read-only ({exc}); copy it with `straggler snapshot` first")
    try:
        try:
            if deadline is not None:
                deadline.where = f"checking {path}"
                deadline.watch(conn)
            harden(conn, read_only=True)
            conn.execute("BEGIN")                  # one snapshot for the checks and the reads
            vet_schema(conn, path)
            return declared_nodes(read_meta(conn, path), path)
        except sqlite3.DatabaseError as exc:
            if deadline is not None and deadline.hit:
                raise deadline.error() from None
            raise MergeError(f"{path}: unreadable or corrupt database ({one_line(exc)}); take a fresh copy with "
                             f"`straggler snapshot`") from None
    finally:
        conn.close()


def declared_nodes(meta, path):
    """The nodes an input says it holds (its meta, checked by read_meta): `nodes` (a merged
    database: each name once; `node`, if there too, one of them), else [`node`] (a node's store).
    Refused when it says neither: then no row could be checked against anything."""
    names, node = meta.get("nodes"), meta.get("node")
    if names is None:
        if node is None:
            raise MergeError(f"{path}: says no node (meta has neither node nor nodes); pass node stores written by "
                             f"`straggler trace` or `straggler snapshot`, or databases written by `straggler merge`")
        return [node]
    if not names:
        raise MergeError(f"{path}: meta key nodes is an empty list; expected the node names the database holds")
    if len(names) > MAX_NODES_PER_INPUT:
        raise MergeError(f"{path}: meta key nodes names more than {MAX_NODES_PER_INPUT} nodes; is it a straggler "
                         f"database?")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise MergeError(f"{path}: meta key nodes names {twice} twice; expected each node once")
    if node is not None and node not in names:
        raise MergeError(f"{path}: meta key node is {node} but meta key nodes is {show(names)}; refusing an input "
                         f"that says two things")
    return list(names)


def _holding(nodes):
    return f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {', '.join(nodes)}"


def check_rows(conn, path, tables, nodes, schema_name="src"):
    """Refuse an input whose node tables hold a row of any node but `nodes` (what it says it holds):
    one SQL statement per table, over the whole table (NULL and non-text nodes included; names
    compared byte for byte, whatever collation the input's column declares). Runs under the
    deadline's progress handler like every statement of the merge."""
    listed = json.dumps(list(nodes))
    for table in NODE_TABLES:
        if table not in tables:
            continue
        row = conn.execute(f"SELECT node FROM {schema_name}.{table} WHERE node IS NULL OR (node COLLATE BINARY) "
                           f"NOT IN (SELECT value FROM json_each(?)) LIMIT 1", (listed,)).fetchone()
        if row is not None:
            raise MergeError(f"{path}: {table} holds a row of node {show(row[0])}, but the input is "
                             f"{_holding(nodes)} (its meta); refusing a forged or mixed input")


def check_meta_keys(meta, path, nodes):
    """Refuse meta keys `node.<NODE>.<key>` of a node the input does not hold: an input may describe
    only itself. Returns {key: (node, rest)} of its own node keys (the longest matching name)."""
    own = {}
    by_length = sorted(nodes, key=len, reverse=True)
    for key in meta:
        if not key.startswith(NODE_META_PREFIX):
            continue
        rest = key[len(NODE_META_PREFIX):]
        node = next((n for n in by_length if rest.startswith(n + ".") and len(rest) > len(n) + 1), None)
        if node is None:
            raise MergeError(f"{path}: meta key {show(key)} describes a node the input does not hold (it is "
                             f"{_holding(nodes)}); refusing a forged input")
        own[key] = (node, rest[len(node) + 1:])
    return own


def input_offsets(conn, path, nodes, schema_name="src"):
    """{node: (offset_ns, uncertainty_ns, measured_at)}: the input's latest clock_offsets row per node
    of `nodes`, each value an integer (clock.as_int_ns) or the input is refused."""
    rows = conn.execute(f"SELECT node, offset_ns, uncertainty_ns, measured_at FROM {schema_name}.clock_offsets "
                        f"ORDER BY measured_at").fetchall()
    latest = {}
    for node, off, unc, at in rows:
        if node not in nodes:
            continue
        values = [clock.as_int_ns(v) for v in (off, unc, at)]
        if None in values:
            raise MergeError(f"{path}: clock_offsets of node {node} holds {show((off, unc, at))}; expected integer "
                             f"(offset_ns, uncertainty_ns, measured_at)")
        latest[node] = tuple(values)
    return latest


def input_clock_pairs(conn, path, node, schema_name="src"):
    """The input's (mono_ns, real_ns) pairs of `node`, each an integer or the input is refused, in
    order: SQLite sorts them, and fetching them steps SQLite, so the deadline's progress handler
    stops a read that runs too long; clock_segments' own sort then finds them sorted (one pass)."""
    pairs = []
    rows = conn.execute(f"SELECT mono_ns, real_ns FROM {schema_name}.clock_pairs WHERE node = ? "
                        f"ORDER BY mono_ns, real_ns", (node,))
    for mono, real in rows:
        m, r = clock.as_int_ns(mono), clock.as_int_ns(real)
        if m is None or r is None:
            raise MergeError(f"{path}: clock_pairs of node {node} holds {show((mono, real))}; expected integer "
                             f"(mono_ns, real_ns)")
        pairs.append((m, r))
    return pairs
