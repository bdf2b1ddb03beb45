"""Merge node databases into one clock-aligned cluster database: `straggler merge A.db B.db … -o cluster.db`.

Every table is copied node-aware (events, aggregates, clock_pairs, clock_offsets, processes,
lost_events, agent_cost, probes; each input's meta under `node.<NODE>.<key>`), so nothing is
dropped or collides; events keep (node, seq) and the output gets a UNIQUE index on it.

Clock alignment: `events.ts_aligned` = the node's monotonic `ts` mapped to its realtime with its
own clock_pairs (straggler.clock.mono_to_real: linear between pairs, rate 1 outside; evaluated at
the pairs, interpolated per segment, within 1 ns of the Python function), minus the node's measured
realtime offset (from `offsets`, else the input's latest clock_offsets row). The offsets used
are stored in clock_offsets (method 'merge') with their uncertainty.

Inputs are opened read-only (`file:…?mode=ro`) and each is copied inside one read transaction
(a consistent snapshot, WAL included). The copy is INSERT … SELECT through ATTACH (no Python row
loop). Refused with one line and no output left behind: a missing, non-SQLite or corrupt input,
a newer schema, two inputs holding the same node (unless renamed), an output that is an input.
The output is written to a temporary file beside it (mode 0600: processes.cmdline may hold
secrets) and renamed into place when complete.

Inputs are untrusted (they come from the nodes). Before any statement reads `meta` or a node
table, the input's sqlite_master (plain data) is checked: each object merge reads must be a plain
table (not a view, a virtual table, or a table with virtual generated columns), and the input must
hold no trigger; so an input cannot make merge run SQL of its own. Input connections run with
`trusted_schema=OFF`, `query_only`, `cell_size_check` and, where Python offers it (3.12+),
SQLite's defensive mode. Every meta value merge uses is type-checked (schema_version an integer,
node a node name, nodes a JSON list of node names; node names non-empty text without control
characters), and so are the clock values it computes with; `expected_nodes` ({path: node}, CLI
`--expect PATH=NODE`) refuses an input that holds another node than the host it came from. A
deadline (`deadline_s`, CLI `--deadline`, enforced by a progress handler) stops a merge that
runs too long. Every refusal is one line naming the file, with no output left behind.

This module must not modify its inputs and must not talk to the network.
"""
import argparse
import bisect
import hashlib
import json
import math
import os
import re
import sqlite3
import tempfile
import time
import unicodedata
import urllib.parse

from .. import clock
from ..errors import StragglerError
from ..text import one_line, sql_ident, sql_quote
from ..store import schema

# Tables copied row by row (all carry a node column), in dependency-free order.
NODE_TABLES = ("clock_pairs", "clock_offsets", "processes", "probes", "lost_events", "agent_cost",
               "aggregates", "thread_time", "events")
EVENT_INDEXES = ("events_source_op_ts", "events_pid_ts", "events_ts")
UNIQUE_EVENT_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS events_node_seq ON events(node, seq)"
SQLITE_HEADER = b"SQLite format 3\x00"
NODE_META_PREFIX = "node."
# Everything merge reads from an input: each must be a plain table (or absent, for NODE_TABLES).
READ_OBJECTS = ("meta",) + NODE_TABLES
DEFAULT_DEADLINE_S = 1800.0
PROGRESS_OPS = 10_000               # SQLite VM steps between two deadline checks
MAX_NODE_NAME = 255
MAX_NODES_PER_INPUT = 100_000
MAX_NODES_JSON = 1 << 20            # bytes of meta `nodes` parsed at most
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_PLAIN_TABLE_SQL = re.compile(r"\s*CREATE\s+TABLE\b", re.IGNORECASE)
_VERSION_TEXT = re.compile(r"[0-9]{1,9}")
_BAD_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")   # control, format (bidi), surrogates, line breaks
_NODE_NAME_FORBIDDEN = frozenset(':"\'`\\[]{}')


class MergeError(StragglerError):
    """An input or the output was refused; nothing was written."""


def node_meta_key(node, key):
    """Where a node's own meta key lives in a merged database."""
    return f"{NODE_META_PREFIX}{node}.{key}"


def _ro_uri(path):
    return "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"


def _same_file(a, b):
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class Deadline:
    """The merge's time limit: a progress handler (SQLite calls it every PROGRESS_OPS VM steps;
    a true answer aborts the statement) and a check between steps. `where` names what is being
    done, for the one-line error."""

    def __init__(self, seconds):
        if seconds is None:
            seconds = DEFAULT_DEADLINE_S
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0 \
                or not math.isfinite(seconds):
            raise MergeError(f"--deadline {seconds!r}: expected a positive number of seconds")
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.hit = False
        self.where = "starting"

    def __call__(self):
        if time.monotonic() > self.end:
            self.hit = True
        return self.hit

    def watch(self, conn):
        conn.set_progress_handler(self, PROGRESS_OPS)

    def check(self):
        if self():
            raise self.error()

    def error(self):
        return MergeError(f"merge stopped after {self.seconds:g} s (--deadline): still {self.where}; nothing was "
                          f"written (raise --deadline for inputs this large)")


def _harden(conn, read_only):
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


def _show(value, limit=60):
    """A value for a one-line message: repr (escapes newlines and control characters), shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def node_name_problem(name):
    """Why `name` cannot be a node name (None when it can): non-empty text of at most MAX_NODE_NAME
    characters, without whitespace or ':' (event ids are NODE:SEQ, as the agent's --node demands),
    without quotes, brackets or braces (no JSON or SQL in disguise), and without control, format or
    line-break characters."""
    if not isinstance(name, str):
        return "a node name (text)"
    if not name:
        return "a non-empty node name"
    if len(name) > MAX_NODE_NAME:
        return f"a node name of at most {MAX_NODE_NAME} characters"
    if any(unicodedata.category(ch) in _BAD_CATEGORIES for ch in name):
        return "a node name without control characters"
    if any(ch.isspace() or ch in _NODE_NAME_FORBIDDEN for ch in name):
        return "a node name without spaces, ':', quotes, brackets or braces"
    return None


def _check_node_name(name, path, where):
    problem = node_name_problem(name)
    if problem:
        raise MergeError(f"{path}: {where} is {_show(name)}; expected {problem}")
    return name


def _vet_schema(conn, path, schema_name="main"):
    """Refuse an input that could run SQL of its own when merge reads it; return the tables of
    READ_OBJECTS it has. Reads only sqlite_master (plain data) and table_xinfo (the parsed schema)."""
    present = set()
    for kind, name, sql in conn.execute(f"SELECT type, name, sql FROM {schema_name}.sqlite_master"):
        if kind == "trigger":
            raise MergeError(f"{path}: holds trigger {_show(name)}; refusing an input that would run its own SQL")
        lowered = name.translate(_ASCII_LOWER) if isinstance(name, str) else None
        if lowered not in READ_OBJECTS:
            continue
        if kind == "table" and not (isinstance(sql, str) and _PLAIN_TABLE_SQL.match(sql)):
            kind = "virtual table"
        if kind != "table":
            what = {"view": "a view", "index": "an index", "virtual table": "a virtual table"}.get(kind, _show(kind, 20))
            raise MergeError(f"{path}: `{lowered}` is {what}, not a table; refusing an input that would run its own SQL")
        present.add(lowered)
    for table in sorted(present):
        for row in conn.execute(f"PRAGMA {schema_name}.table_xinfo({table})"):
            # hidden 2: a VIRTUAL generated column, computed by its own SQL when read (events.id is
            # one in every store, and merge never reads it)
            if len(row) > 6 and row[6] == 2 and not (table == "events" and row[1] == "id"):
                raise MergeError(f"{path}: column {_show(row[1])} of `{table}` is computed by its own SQL "
                                 f"(a generated column); refusing an input that would run its own SQL")
    if "meta" not in present:
        raise MergeError(f"{path}: not a straggler database (no table meta)")
    return present


def _read_meta(conn, path, schema_name="main"):
    """The input's meta as {key: value}, every key checked; the values merge uses are checked too."""
    meta = {}
    for key, value in conn.execute(f"SELECT key, value FROM {schema_name}.meta"):
        if not isinstance(key, str) or not key or any(unicodedata.category(ch) in _BAD_CATEGORIES for ch in key):
            raise MergeError(f"{path}: meta has a key {_show(key)}; expected non-empty text without control characters")
        if key in meta:
            raise MergeError(f"{path}: meta key {key!r} appears twice; expected one row per key")
        meta[key] = value
    version = meta.get("schema_version")
    if version is None:
        raise MergeError(f"{path}: not a straggler database (no schema_version in table meta)")
    if not ((type(version) is int and version >= 0)
            or (isinstance(version, str) and _VERSION_TEXT.fullmatch(version))):
        raise MergeError(f"{path}: meta key schema_version is {_show(version)}; expected an integer (a schema version)")
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
        raise MergeError(f"{path}: meta key nodes is {_show(value)}; {expected}")
    try:
        names = json.loads(value)
    except (ValueError, RecursionError):
        raise MergeError(f"{path}: meta key nodes is {_show(value)}, not JSON; {expected}") from None
    if not isinstance(names, list):
        raise MergeError(f"{path}: meta key nodes is {_show(value)}; {expected}")
    for name in names:
        _check_node_name(name, path, "a name in meta key nodes")
    return names


def inspect_input(path, deadline=None):
    """Check one input (exists, SQLite, only plain tables where merge reads, sound meta) and list the
    nodes it holds."""
    if not os.path.isfile(path):
        raise MergeError(f"{path}: no such file; pass node databases written by `straggler trace` or `straggler snapshot`")
    with open(path, "rb") as fh:
        header = fh.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise MergeError(f"{path}: not an SQLite database; pass node databases written by `straggler trace` or `straggler snapshot`")
    try:
        conn = sqlite3.connect(_ro_uri(path), uri=True)
    except sqlite3.Error as exc:
        raise MergeError(f"{path}: cannot open read-only ({exc}); copy it with `straggler snapshot` first")
    try:
        try:
            if deadline is not None:
                deadline.where = f"checking {path}"
                deadline.watch(conn)
            _harden(conn, read_only=True)
            conn.execute("BEGIN")                  # one snapshot for the checks and the reads
            tables = _vet_schema(conn, path)
            meta = _read_meta(conn, path)
            return _nodes_of(conn, path, tables, meta)
        except sqlite3.DatabaseError as exc:
            if deadline is not None and deadline.hit:
                raise deadline.error() from None
            raise MergeError(f"{path}: unreadable or corrupt database ({one_line(exc)}); take a fresh copy with "
                             f"`straggler snapshot`") from None
    finally:
        conn.close()


def _nodes_of(conn, path, tables, meta):
    """Node names an input holds: meta, the small tables, and the first and last event."""
    nodes = {}                                 # an ordered set

    def add(name, where):
        if name is not None and name not in nodes:
            _check_node_name(name, path, where)
            if len(nodes) >= MAX_NODES_PER_INPUT:
                raise MergeError(f"{path}: holds more than {MAX_NODES_PER_INPUT} node names; is it a straggler database?")
            nodes[name] = True

    for name in meta.get("nodes") or ():
        add(name, "a name in meta key nodes")
    add(meta.get("node"), "meta key node")
    for table in ("clock_pairs", "processes", "probes", "agent_cost", "lost_events"):
        if table in tables:
            for (name,) in conn.execute(f"SELECT DISTINCT node FROM {table}"):
                add(name, f"a node in {table}")
    if "events" in tables:
        for order in ("ASC", "DESC"):
            row = conn.execute(f"SELECT node FROM events ORDER BY rowid {order} LIMIT 1").fetchone()
            add(row[0] if row else None, "a node in events")
    if not nodes:
        raise MergeError(f"{path}: holds no node (empty meta and tables); is it a straggler database?")
    return list(nodes)


def parse_expected(items):
    """['PATH=NODE', …] -> {path: node} (the host each input was collected from)."""
    out = {}
    for item in items or ():
        path, sep, node = item.rpartition("=")
        if not sep or not path or not node:
            raise MergeError(f"--expect {item!r}: expected PATH=NODE (an input and the node it must hold)")
        out[path] = node
    return out


def _expected_per_input(inputs, expected_nodes):
    """{input path: expected node} from {path: node}, matched by file; a path that is no input is refused."""
    found = {}
    for path, node in (expected_nodes or {}).items():
        path = os.fspath(path)
        match = next((p for p in inputs if _same_file(p, path)), None)
        if match is None:
            raise MergeError(f"{path}: a node is expected of it (--expect) but it is not one of the inputs")
        problem = node_name_problem(node)
        if problem:
            raise MergeError(f"--expect {path}={_show(node)}: expected {problem}")
        found[match] = node
    return found


def parse_renames(items):
    """['OLD=NEW', …] -> [(old, new), …]."""
    out = []
    for item in items or ():
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise MergeError(f"--rename {item!r}: expected OLD=NEW (a node name and its new name)")
        out.append((old, new))
    return out


def _plan_names(inputs, nodes_per_input, rename):
    """For each input, {node in file: node in output}; duplicates need a rename."""
    auto = rename is True
    queue = {}
    if isinstance(rename, dict):
        rename = list(rename.items())
    for old, new in (rename if isinstance(rename, (list, tuple)) else ()):
        problem = node_name_problem(new)
        if problem:
            raise MergeError(f"--rename {_show(old)}={_show(new)}: expected {problem}")
        queue.setdefault(old, []).append(new)
    holders = {}
    for nodes in nodes_per_input:
        for n in nodes:
            holders[n] = holders.get(n, 0) + 1
    taken, first_holder, plans = set(), {}, []
    for path, nodes in zip(inputs, nodes_per_input):
        plan = {}
        for n in nodes:
            new = n
            if n in taken or n in first_holder:
                if queue.get(n):
                    new = queue[n].pop(0)
                elif auto:
                    k = 2
                    while f"{n}-{k}" in taken or f"{n}-{k}" in holders:
                        k += 1
                    new = f"{n}-{k}"
                else:
                    raise MergeError(f"{first_holder[n]} and {path} both hold node {n}; rename one with "
                                     f"--rename {n}=NEW (applies to the later input) or --auto-rename")
            elif queue.get(n) and holders[n] == 1:
                new = queue[n].pop(0)
            if new in taken:
                raise MergeError(f"{path}: node {n} would be renamed to {new}, which another input already uses")
            taken.add(new)
            first_holder.setdefault(n, path)
            plan[n] = new
        plans.append(plan)
    unused = [f"{old}={new}" for old, news in queue.items() for new in news]
    if unused:
        raise MergeError(f"--rename {', '.join(unused)}: no input needs it (no such node, or no duplicate)")
    return plans


def load_offsets(path):
    """An offsets file -> {node: (offset_ns, uncertainty_ns)}.

    Accepted: {"NODE": [offset_ns, uncertainty_ns]}, {"NODE": {"offset_ns":…, "uncertainty_ns":…}},
    either wrapped as {"offsets": …} (what `straggler fleet … --json` reports), or a list of
    {"node":…, "offset_ns":…, "uncertainty_ns":…}.
    """
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise MergeError(f"--offsets {path}: cannot read JSON ({exc})")
    return normalize_offsets(data, f"--offsets {path}")


def normalize_offsets(data, where="offsets"):
    if isinstance(data, dict) and isinstance(data.get("offsets"), (dict, list)):
        data = data["offsets"]
    items = data.items() if isinstance(data, dict) else [(d.get("node"), d) for d in data or []]
    out = {}
    for node, value in items:
        try:
            if isinstance(value, dict):
                out[str(node)] = (int(value["offset_ns"]), int(value.get("uncertainty_ns") or 0))
            else:
                out[str(node)] = (int(value[0]), int(value[1]) if len(value) > 1 and value[1] is not None else 0)
        except (KeyError, TypeError, ValueError, IndexError):
            raise MergeError(f"{where}: entry for node {node!r} is not [offset_ns, uncertainty_ns]")
    return out


def clock_segments(pairs):
    """Piecewise-linear mono -> realtime from the node's clock pairs, via clock.mono_to_real at the knots.

    Returns rows (lo_mono, knot_mono, base, slope_minus_1): for lo_mono <= ts < next lo,
    real = ts + base + (ts - knot_mono) * slope_minus_1.
    """
    knots = sorted({int(m) for m, _ in pairs})
    if not knots:
        return []
    real = {m: clock.mono_to_real(pairs, m) for m in knots}
    segs = [(-(1 << 62), knots[0], real[knots[0]] - knots[0], 0.0)]   # before the first pair: rate 1
    for m0, m1 in zip(knots, knots[1:]):
        segs.append((m0, m0, real[m0] - m0, (real[m1] - real[m0]) / (m1 - m0) - 1.0))
    segs.append((knots[-1], knots[-1], real[knots[-1]] - knots[-1], 0.0))  # after the last pair: rate 1
    return segs


def _columns(conn, schema_name, table):
    return [r[1] for r in conn.execute(f"PRAGMA {schema_name}.table_info({table})")]


def _node_case(plan, column="node"):
    """SQL mapping a source node name to its output name."""
    changed = {old: new for old, new in plan.items() if old != new}
    if not changed:
        return column
    whens = " ".join(f"WHEN {sql_quote(old)} THEN {sql_quote(new)}" for old, new in changed.items())
    return f"CASE {column} {whens} ELSE {column} END"


def _as_int(value):
    """An integer column value as int (an integral-valued or finite REAL is truncated); None for
    anything else (text, blob, NULL, inf)."""
    if type(value) is int:
        return value
    if type(value) is float and math.isfinite(value):
        return int(value)
    return None


def _latest_input_offsets(conn, path, nodes):
    """{node: (offset_ns, uncertainty_ns, measured_at)}: the input's latest clock_offsets row per node of `nodes`."""
    rows = conn.execute("SELECT node, offset_ns, uncertainty_ns, measured_at FROM src.clock_offsets "
                        "ORDER BY measured_at").fetchall()
    latest = {}
    for node, off, unc, at in rows:
        if node not in nodes:
            continue
        values = [_as_int(v) for v in (off, unc, at)]
        if None in values:
            raise MergeError(f"{path}: clock_offsets of node {node} holds {_show((off, unc, at))}; expected integer "
                             f"(offset_ns, uncertainty_ns, measured_at)")
        latest[node] = tuple(values)
    return latest


def _clock_pairs(conn, path, node):
    pairs = []
    for mono, real in conn.execute("SELECT mono_ns, real_ns FROM src.clock_pairs WHERE node = ?", (node,)):
        m, r = _as_int(mono), _as_int(real)
        if m is None or r is None:
            raise MergeError(f"{path}: clock_pairs of node {node} holds {_show((mono, real))}; expected integer "
                             f"(mono_ns, real_ns)")
        pairs.append((m, r))
    return pairs


class Aligner:
    """ts_aligned for each source node: its clock segments (clock_segments) minus its offset.
    Registered as the SQL function straggler_aligned_ts(node, ts) (4x faster here than a correlated
    subquery per row); NULL for a node without clock pairs."""

    def __init__(self):
        self.nodes = {}

    def clear(self):
        self.nodes.clear()

    def set_node(self, node, segs, offset_ns):
        if segs:
            self.nodes[node] = ([s[0] for s in segs], [(k, b - int(offset_ns), m) for _, k, b, m in segs])

    def __call__(self, node, ts):
        entry = self.nodes.get(node)
        if type(ts) is not int:
            ts = _as_int(ts)                   # text or a blob in a crafted input: no aligned time
        if entry is None or ts is None:
            return None
        los, segs = entry
        knot, base, slope = segs[bisect.bisect_right(los, ts) - 1]
        aligned = ts + base + int((ts - knot) * slope)
        return aligned if -(1 << 63) <= aligned < (1 << 63) else None


def _copy_input(conn, path, plan, offsets, summary, aligner):
    """Copy one attached input (schema `src`) into main, inside one read transaction. The input is
    checked again (_vet_schema, _read_meta) inside that transaction, before anything else reads it."""
    conn.execute("ATTACH DATABASE ? AS src", (_ro_uri(path),))
    try:
        conn.execute("BEGIN")
        src_tables = _vet_schema(conn, path, "src")
        src_meta = _read_meta(conn, path, "src")
        input_offsets = _latest_input_offsets(conn, path, plan) if "clock_offsets" in src_tables else {}
        # clock segments per source node, with the offset to subtract folded into base
        aligner.clear()
        alignment = {}
        for old, new in plan.items():
            pairs = _clock_pairs(conn, path, old) if "clock_pairs" in src_tables else []
            if new in offsets or old in offsets:
                off, unc = offsets.get(new, offsets.get(old))
                source, measured_at = "given", None
            elif old in input_offsets:
                off, unc, measured_at = input_offsets[old]
                source = "input"
            else:
                off, unc, source, measured_at = 0, None, "none", None
            segs = clock_segments(pairs)
            aligner.set_node(old, segs, off)
            alignment[new] = dict(offset_ns=off, uncertainty_ns=unc, source=source, clock_pairs=len(pairs),
                                  aligned=bool(segs), measured_at=measured_at)
        for table in NODE_TABLES:
            if table not in src_tables:
                continue
            out_cols = [c for c in _columns(conn, "main", table) if c != "id"]
            src_cols = set(_columns(conn, "src", table))
            cols = [c for c in out_cols if c in src_cols or (table == "events" and c == "ts_aligned")]
            exprs = []
            for c in cols:
                if c == "node":
                    exprs.append(_node_case(plan, "e.node"))
                elif table == "events" and c == "ts_aligned":
                    exprs.append("straggler_aligned_ts(e.node, e.ts)")
                else:
                    exprs.append(f"e.{c}")
            conn.execute(f"INSERT INTO main.{table} ({', '.join(cols)}) "
                         f"SELECT {', '.join(exprs)} "
                         f"FROM src.{table} AS e")
        # meta: each node's keys under node.<NODE>.<key>; keys of an already merged input are renamed
        single = len(plan) == 1
        for key, value in src_meta.items():
            if key in ("schema_version", "nodes", "merged_from", "merged_at", "clock_alignment"):
                continue
            if key.startswith(NODE_META_PREFIX):
                rest = key[len(NODE_META_PREFIX):]
                target = next((k for k in sorted(plan, key=len, reverse=True) if rest.startswith(k + ".")), None)
                if target is not None:
                    key = node_meta_key(plan[target], rest[len(target) + 1:])
            elif single:
                key = node_meta_key(next(iter(plan.values())), key)
            else:
                key = f"input.{os.path.basename(path)}.{key}"
            conn.execute("INSERT OR REPLACE INTO main.meta (key, value) VALUES (?, ?)", (key, value))
        now = time.time_ns()
        for new, a in alignment.items():
            if a["source"] != "none":
                conn.execute("INSERT INTO main.clock_offsets (node, offset_ns, uncertainty_ns, measured_at, method) "
                             "VALUES (?, ?, ?, ?, 'merge')", (new, a["offset_ns"], a["uncertainty_ns"] or 0,
                                                              a["measured_at"] or now))
        conn.execute("COMMIT")
        summary["clock_alignment"].update(alignment)
    except BaseException:
        conn.set_progress_handler(None, 0)     # a stopped deadline must not stop the clean-up
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        try:
            conn.execute("DETACH DATABASE src")
        except sqlite3.Error:
            pass                               # the output is discarded anyway after an error


def content_digest(path):
    """A digest of what a merged database holds: its schema and every row of every table, in rowid
    order, leaving out the two stamps of when a merge ran (meta `merged_at`, and `measured_at` of
    the clock_offsets rows a merge adds for offsets it was given). Two merges of the same inputs with
    the same offsets have the same digest. Read-only."""
    digest = hashlib.sha256()
    conn = sqlite3.connect(_ro_uri(path), uri=True)
    try:
        _harden(conn, read_only=True)
        objects = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                               "ORDER BY type, name").fetchall()
        for kind, name, sql in objects:
            digest.update(repr((kind, name, sql)).encode())
            if kind != "table":
                continue
            if name == "meta":
                rows = conn.execute("SELECT key, value FROM meta WHERE key != 'merged_at' ORDER BY key")
            elif name == "clock_offsets":
                exprs = [f"CASE WHEN method = 'merge' THEN NULL ELSE {sql_ident(c)} END" if c == "measured_at"
                         else sql_ident(c) for c in _columns(conn, "main", sql_ident(name))]
                rows = conn.execute(f"SELECT {', '.join(exprs)} FROM {sql_ident(name)} ORDER BY rowid")
            else:
                rows = conn.execute(f"SELECT * FROM {sql_ident(name)} ORDER BY rowid")
            for row in rows:
                digest.update(repr(row).encode())
    finally:
        conn.close()
    return digest.hexdigest()


def _same_content(new, old):
    """Whether the merged database `new` holds what `old` (an existing output) holds; False when
    `old` cannot be read as a straggler database (it is then replaced)."""
    try:
        counts = []
        for path in (new, old):
            conn = sqlite3.connect(_ro_uri(path), uri=True)
            try:
                _harden(conn, read_only=True)
                counts.append([conn.execute(f"SELECT COUNT(*) FROM {sql_ident(t)}").fetchone()[0]
                               for t in ("meta",) + NODE_TABLES])
            finally:
                conn.close()
        if counts[0] != counts[1]:                     # the cheap answer first
            return False
        return content_digest(new) == content_digest(old)
    except sqlite3.Error:
        return False


def merge(inputs, output, offsets=None, rename=False, deadline_s=DEFAULT_DEADLINE_S, expected_nodes=None,
          only_if_changed=False):
    """Merge node databases `inputs` into `output` (atomically). Returns a summary dict, whose
    `changed` says whether `output` was written.

    offsets: {node: (offset_ns, uncertainty_ns)} measured realtime offsets (node minus
    reference); nodes not in it use their input's clock_offsets, else 0 (reported).
    rename: False (refuse duplicate nodes), True (rename later duplicates NODE-2, NODE-3, …),
    or [(old, new), …] / {old: new}: rename node `old` in the later input that repeats it
    (or in the only input that holds it).
    deadline_s: seconds the whole merge may take (None: DEFAULT_DEADLINE_S); past it the merge
    stops with MergeError and writes nothing.
    expected_nodes: {input path: node name}: such an input must hold exactly that node (the
    host it was collected from), else it is refused.
    only_if_changed: when `output` exists and holds what this merge would write (content_digest:
    every row, leaving out the stamps of when a merge ran), leave it as it is (`changed` False).
    """
    started = time.monotonic()
    deadline = Deadline(deadline_s)
    inputs = [os.fspath(p) for p in inputs]
    output = os.fspath(output)
    if not inputs:
        raise MergeError("no input databases; pass node databases to merge")
    for path in inputs:
        if _same_file(path, output):
            raise MergeError(f"output {output} is also an input; choose another -o path")
    seen = []
    for path in inputs:
        for other in seen:
            if _same_file(path, other):
                raise MergeError(f"{path} is given twice; pass each database once")
        seen.append(path)
    expected = _expected_per_input(inputs, expected_nodes)
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise MergeError(f"output directory {out_dir} does not exist; create it or choose another -o path")
    nodes_per_input = []
    for path in inputs:
        deadline.check()
        nodes = inspect_input(path, deadline)
        if path in expected and nodes != [expected[path]]:
            held = ", ".join(nodes)
            raise MergeError(f"{path}: holds node{'s' if len(nodes) > 1 else ''} {held}, expected {expected[path]} "
                             f"(the host it was collected from); refusing it")
        nodes_per_input.append(nodes)
    plans = _plan_names(inputs, nodes_per_input, rename)
    offsets = normalize_offsets(offsets or {}) if offsets else {}

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    summary = dict(output=output, inputs=[], nodes=[], rows={}, clock_alignment={}, elapsed_s=None, changed=None)
    conn = None
    try:
        os.chmod(tmp, 0o600)                           # processes.cmdline may hold secrets
        conn = sqlite3.connect("file:" + urllib.parse.quote(tmp), uri=True, isolation_level=None)
        conn.execute("PRAGMA journal_mode=OFF")       # a temp file: all or nothing by the rename
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA temp_store=MEMORY")
        _harden(conn, read_only=False)                 # after journal_mode=OFF, which defensive mode forbids
        deadline.watch(conn)
        schema.create(conn)
        for name in EVENT_INDEXES:                     # load first, index after
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        aligner = Aligner()
        conn.create_function("straggler_aligned_ts", 2, aligner, deterministic=True)
        for path, plan in zip(inputs, plans):
            deadline.check()
            deadline.where = f"copying {path}"
            try:
                _copy_input(conn, path, plan, offsets, summary, aligner)
            except sqlite3.IntegrityError as exc:
                if "UNIQUE" not in str(exc):
                    raise MergeError(f"{path}: rows break the schema ({one_line(exc)}); take a fresh copy with "
                                     f"`straggler snapshot`") from None
                raise MergeError(f"{path}: rows collide with another input ({one_line(exc)}); two inputs hold the "
                                 f"same node — rename one with --rename NODE=NEW") from None
            except sqlite3.DatabaseError as exc:
                if deadline.hit:
                    raise deadline.error() from None
                raise MergeError(f"{path}: unreadable or corrupt database ({one_line(exc)}); take a fresh copy with "
                                 f"`straggler snapshot`") from None
            summary["inputs"].append(dict(path=path, nodes=list(plan.values()),
                                          renamed={o: n for o, n in plan.items() if o != n}))
        deadline.where = f"indexing {output}"
        try:
            conn.execute(UNIQUE_EVENT_INDEX)
        except sqlite3.IntegrityError:
            dup = conn.execute("SELECT node FROM events GROUP BY node, seq HAVING COUNT(*) > 1 LIMIT 1").fetchone()
            raise MergeError(f"events of node {dup[0] if dup else '?'} appear in two inputs; rename one with "
                             f"--rename NODE=NEW or --auto-rename")
        schema.create(conn)                            # the standard indexes, IF NOT EXISTS
        node_names = [n for plan in plans for n in plan.values()]
        summary["nodes"] = node_names
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('nodes', ?)", (json.dumps(node_names),))
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('merged_from', ?)",
                     (json.dumps(summary["inputs"]),))
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('merged_at', ?)", (str(time.time_ns()),))
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('clock_alignment', ?)",
                     (json.dumps(summary["clock_alignment"]),))
        for table in NODE_TABLES:
            summary["rows"][table] = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        deadline.check()
        conn.set_progress_handler(None, 0)
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        conn = None
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        deadline.where = f"comparing with {output}"
        if only_if_changed and os.path.isfile(output) and _same_content(tmp, output):
            summary["changed"] = False                 # the temporary is removed below
        else:
            for suffix in ("-wal", "-shm"):            # stale files of an old output would be replayed
                if os.path.exists(output + suffix):
                    os.unlink(output + suffix)
            os.replace(tmp, output)
            summary["changed"] = True
    except MergeError:
        raise
    except sqlite3.Error as exc:
        if deadline.hit:
            raise deadline.error() from None
        raise MergeError(f"merge into {output} failed ({one_line(exc)}); nothing was written") from None
    except OSError as exc:
        raise MergeError(f"cannot write {output} ({exc}); nothing was written") from None
    finally:
        if conn is not None:
            conn.close()
        for leftover in (tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    summary["unaligned"] = [n for n, a in summary["clock_alignment"].items() if not a["aligned"]]
    summary["offset_unknown"] = [n for n, a in summary["clock_alignment"].items() if a["source"] == "none"]
    summary["elapsed_s"] = round(time.monotonic() - started, 3)
    return summary


# ---- CLI ----

def add_arguments(parser):
    parser.add_argument("inputs", nargs="+", metavar="DB", help="node databases (from `straggler snapshot` or a node's store)")
    parser.add_argument("-o", "--output", required=True, help="the cluster database to write (replaced atomically)")
    parser.add_argument("--offsets", metavar="JSON", help="measured clock offsets: {NODE: [offset_ns, uncertainty_ns]}")
    parser.add_argument("--rename", action="append", metavar="OLD=NEW", default=[],
                        help="rename node OLD to NEW in the later input that repeats it (repeatable)")
    parser.add_argument("--auto-rename", action="store_true", help="rename repeated nodes NODE-2, NODE-3, …")
    parser.add_argument("--expect", action="append", metavar="PATH=NODE", default=[],
                        help="input PATH must hold node NODE, the host it was collected from (repeatable)")
    parser.add_argument("--deadline", type=float, metavar="S", default=DEFAULT_DEADLINE_S,
                        help=f"stop (writing nothing) when the merge takes longer than S seconds "
                             f"(default {DEFAULT_DEADLINE_S:g})")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args):
    offsets = load_offsets(args.offsets) if args.offsets else None
    rename = True if args.auto_rename else parse_renames(args.rename)
    if args.auto_rename and args.rename:
        raise MergeError("use either --rename OLD=NEW or --auto-rename, not both")
    summary = merge(args.inputs, args.output, offsets=offsets, rename=rename, deadline_s=args.deadline,
                    expected_nodes=parse_expected(args.expect))
    from .. import render
    if args.json:
        print(render.to_json(summary), end="")
        return 0
    rows = []
    for node, a in summary["clock_alignment"].items():
        unc = "" if a["uncertainty_ns"] is None else f"±{a['uncertainty_ns'] / 1e6:.3f}"
        rows.append((node, a["clock_pairs"], f"{a['offset_ns'] / 1e6:.3f}", unc,
                     {"given": "--offsets", "input": "input's clock_offsets", "none": "unknown (0 assumed)"}[a["source"]]))
    print(render.table_text(["node", "clock pairs", "offset ms", "uncertainty ms", "offset from"], rows,
                            title=f"merged {len(summary['inputs'])} databases into {summary['output']}"), end="")
    print("rows: " + ", ".join(f"{t} {n}" for t, n in summary["rows"].items()) + f"  ({summary['elapsed_s']} s)")
    for node in summary["unaligned"]:
        print(f"warning: {node} has no clock pairs: its ts_aligned is NULL")
    for node in summary["offset_unknown"]:
        print(f"note: no measured offset for {node}: its realtime clock is taken as correct")
    return 0
