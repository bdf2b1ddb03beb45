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
The output is written to a temporary file beside it and renamed into place when complete.

This module must not modify its inputs and must not talk to the network.
"""
import argparse
import bisect
import json
import os
import sqlite3
import tempfile
import time
import urllib.parse

from .. import clock
from ..errors import StragglerError
from ..store import schema

# Tables copied row by row (all carry a node column), in dependency-free order.
NODE_TABLES = ("clock_pairs", "clock_offsets", "processes", "probes", "lost_events", "agent_cost",
               "aggregates", "thread_time", "events")
EVENT_INDEXES = ("events_source_op_ts", "events_pid_ts", "events_ts")
UNIQUE_EVENT_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS events_node_seq ON events(node, seq)"
SQLITE_HEADER = b"SQLite format 3\x00"
NODE_META_PREFIX = "node."


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


def inspect_input(path):
    """Check one input (exists, SQLite, readable schema) and list the nodes it holds."""
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
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            schema.check_version(conn, path)
        except schema.SchemaError as exc:
            raise MergeError(str(exc))
        except sqlite3.DatabaseError as exc:
            raise MergeError(f"{path}: unreadable or corrupt database ({exc}); take a fresh copy with `straggler snapshot`")
        return _nodes_of(conn, path)
    finally:
        conn.close()


def _tables_of(conn, schema_name="main"):
    return {r[0] for r in conn.execute(f"SELECT name FROM {schema_name}.sqlite_master WHERE type = 'table'")}


def _nodes_of(conn, path):
    """Node names an input holds: meta, the small tables, and the first and last event."""
    tables = _tables_of(conn)
    nodes = []

    def add(name):
        if name is not None and name not in nodes:
            nodes.append(name)

    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("nodes"):
            for name in json.loads(meta["nodes"]):
                add(name)
        add(meta.get("node"))
        for table in ("clock_pairs", "processes", "probes", "agent_cost", "lost_events"):
            if table in tables:
                for (name,) in conn.execute(f"SELECT DISTINCT node FROM {table}"):
                    add(name)
        if "events" in tables:
            for order in ("ASC", "DESC"):
                row = conn.execute(f"SELECT node FROM events ORDER BY rowid {order} LIMIT 1").fetchone()
                add(row[0] if row else None)
    except (sqlite3.DatabaseError, ValueError) as exc:
        raise MergeError(f"{path}: unreadable or corrupt database ({exc}); take a fresh copy with `straggler snapshot`")
    if not nodes:
        raise MergeError(f"{path}: holds no node (empty meta and tables); is it a straggler database?")
    return nodes


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
    whens = " ".join(f"WHEN {_q(old)} THEN {_q(new)}" for old, new in changed.items())
    return f"CASE {column} {whens} ELSE {column} END"


def _q(text):
    return "'" + str(text).replace("'", "''") + "'"


def _latest_input_offsets(conn):
    rows = conn.execute("SELECT node, offset_ns, uncertainty_ns, measured_at FROM src.clock_offsets "
                        "ORDER BY measured_at").fetchall()
    latest = {}
    for node, off, unc, at in rows:
        latest[node] = (int(off), int(unc), at)
    return latest


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
        if entry is None or ts is None:
            return None
        los, segs = entry
        knot, base, slope = segs[bisect.bisect_right(los, ts) - 1]
        return ts + base + int((ts - knot) * slope)


def _copy_input(conn, path, plan, offsets, summary, aligner):
    """Copy one attached input (schema `src`) into main, inside one read transaction."""
    conn.execute("ATTACH DATABASE ? AS src", (_ro_uri(path),))
    try:
        conn.execute("BEGIN")
        src_tables = _tables_of(conn, "src")
        input_offsets = _latest_input_offsets(conn) if "clock_offsets" in src_tables else {}
        # clock segments per source node, with the offset to subtract folded into base
        aligner.clear()
        alignment = {}
        for old, new in plan.items():
            pairs = conn.execute("SELECT mono_ns, real_ns FROM src.clock_pairs WHERE node = ?", (old,)).fetchall() \
                if "clock_pairs" in src_tables else []
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
        meta = conn.execute("SELECT key, value FROM src.meta").fetchall()
        single = len(plan) == 1
        for key, value in meta:
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
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.execute("DETACH DATABASE src")


def merge(inputs, output, offsets=None, rename=False):
    """Merge node databases `inputs` into `output` (atomically). Returns a summary dict.

    offsets: {node: (offset_ns, uncertainty_ns)} measured realtime offsets (node minus
    reference); nodes not in it use their input's clock_offsets, else 0 (reported).
    rename: False (refuse duplicate nodes), True (rename later duplicates NODE-2, NODE-3, …),
    or [(old, new), …] / {old: new}: rename node `old` in the later input that repeats it
    (or in the only input that holds it).
    """
    started = time.monotonic()
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
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise MergeError(f"output directory {out_dir} does not exist; create it or choose another -o path")
    nodes_per_input = [inspect_input(p) for p in inputs]
    plans = _plan_names(inputs, nodes_per_input, rename)
    offsets = normalize_offsets(offsets or {}) if offsets else {}

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    summary = dict(output=output, inputs=[], nodes=[], rows={}, clock_alignment={}, elapsed_s=None)
    conn = None
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(tmp), uri=True, isolation_level=None)
        conn.execute("PRAGMA journal_mode=OFF")       # a temp file: all or nothing by the rename
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA temp_store=MEMORY")
        schema.create(conn)
        for name in EVENT_INDEXES:                     # load first, index after
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        aligner = Aligner()
        conn.create_function("straggler_aligned_ts", 2, aligner, deterministic=True)
        for path, plan in zip(inputs, plans):
            try:
                _copy_input(conn, path, plan, offsets, summary, aligner)
            except sqlite3.IntegrityError as exc:
                raise MergeError(f"{path}: rows collide with another input ({exc}); two inputs hold the same "
                                 f"node — rename one with --rename NODE=NEW")
            except sqlite3.DatabaseError as exc:
                raise MergeError(f"{path}: unreadable or corrupt database ({exc}); take a fresh copy with "
                                 f"`straggler snapshot`")
            summary["inputs"].append(dict(path=path, nodes=list(plan.values()),
                                          renamed={o: n for o, n in plan.items() if o != n}))
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
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        conn = None
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        for suffix in ("-wal", "-shm"):                # stale files of an old output would be replayed
            if os.path.exists(output + suffix):
                os.unlink(output + suffix)
        os.replace(tmp, output)
    except MergeError:
        raise
    except sqlite3.Error as exc:
        raise MergeError(f"merge into {output} failed ({exc}); nothing was written")
    except OSError as exc:
        raise MergeError(f"cannot write {output} ({exc}); nothing was written")
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
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args):
    offsets = load_offsets(args.offsets) if args.offsets else None
    rename = True if args.auto_rename else parse_renames(args.rename)
    if args.auto_rename and args.rename:
        raise MergeError("use either --rename OLD=NEW or --auto-rename, not both")
    summary = merge(args.inputs, args.output, offsets=offsets, rename=rename)
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
