"""The copy: vetted, planned inputs into one cluster database, and the comparison of two merged ones.

Every node table is copied node-aware (events, aggregates, thread_time, clock_pairs,
clock_offsets, processes, lost_events, agent_cost, probes, the device tables; each input's meta
under `node.<NODE>.<key>`), so nothing is dropped or collides; events keep (node, seq) and the
output gets a UNIQUE index on it. Each input is ATTACHed read-only and copied inside one read
transaction (a consistent snapshot, WAL included; vetted again inside it, its rows checked to be
of the nodes it says it holds, so what is copied is what was checked) with INSERT … SELECT
(no Python row loop) whose WHERE takes only rows whose every value is of its column's type
(values.py; the same read as the copy, no scan of its own): a table copied short refuses the input,
naming its first bad row; `events.ts_aligned` is filled by straggler.clock's Aligner, registered as
the SQL function straggler_aligned_ts(node, ts). The offsets used are stored in clock_offsets
(method 'merge') with their uncertainty. The output is written to a temporary file beside it (mode
0600: processes.cmdline may hold secrets) and renamed into place when complete; on any error it is
removed and nothing is left behind.

Must not modify an input, decide names or offsets (planning does), or print.
"""
import hashlib
import json
import os
import sqlite3
import tempfile
import time
import urllib.parse

from ... import clock
from ...store import rollup, schema
from ...text import one_line, sql_ident, sql_quote
from . import values, vetting
from .errors import MergeError, show
from .vetting import NODE_META_PREFIX, NODE_TABLES, harden, ro_uri

EVENT_INDEXES = ("events_source_op_ts", "events_pid_ts", "events_ts")
UNIQUE_EVENT_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS events_node_seq ON events(node, seq)"
# meta keys of an input that describe a merge: written afresh, never copied
MERGE_META_KEYS = ("schema_version", "nodes", "merged_from", "merged_at", "clock_alignment")


def node_meta_key(node, key):
    """Where a node's own meta key lives in a merged database."""
    return f"{NODE_META_PREFIX}{node}.{key}"


def _columns(conn, schema_name, table):
    return [r[1] for r in conn.execute(f"PRAGMA {schema_name}.table_info({table})")]


def _node_case(plan, column="node"):
    """SQL mapping a source node name to its output name."""
    changed = {old: new for old, new in plan.items() if old != new}
    if not changed:
        return column
    whens = " ".join(f"WHEN {sql_quote(old)} THEN {sql_quote(new)}" for old, new in changed.items())
    return f"CASE {column} {whens} ELSE {column} END"


def _copy_input(conn, path, plan, offsets, summary, aligner, deadline):
    """Copy one attached input (schema `src`) into main, inside one read transaction. The input is
    checked again inside that transaction, before anything else reads it: its schema (vet_schema),
    its meta (read_meta), that it still says it holds the nodes planned, that every row of every
    node table is of those nodes (check_rows) and that its node meta keys are its own
    (check_meta_keys). What is copied is what was checked."""
    conn.execute("ATTACH DATABASE ? AS src", (ro_uri(path),))
    try:
        conn.execute("BEGIN")
        src_tables = vetting.vet_schema(conn, path, "src")
        src_meta = vetting.read_meta(conn, path, "src")
        nodes = vetting.declared_nodes(src_meta, path)
        if nodes != list(plan):
            raise MergeError(f"{path}: changed while it was merged (it now says it holds {', '.join(nodes)}, before "
                             f"{', '.join(plan)}); take a fresh copy and merge again")
        deadline.where = f"checking the rows of {path}"
        vetting.check_rows(conn, path, src_tables, nodes)
        own_meta_keys = vetting.check_meta_keys(src_meta, path, nodes)
        deadline.where = f"aligning the clocks of {path}"
        input_offsets = vetting.input_offsets(conn, path, plan) if "clock_offsets" in src_tables else {}
        # clock segments per source node, with the offset to subtract folded into base
        aligner.clear()
        alignment = {}
        for old, new in plan.items():
            pairs = vetting.input_clock_pairs(conn, path, old) if "clock_pairs" in src_tables else []
            if new in offsets or old in offsets:
                off, unc = offsets.get(new, offsets.get(old))
                source, measured_at = "given", None
            elif old in input_offsets:
                off, unc, measured_at = input_offsets[old]
                source = "input"
            else:
                off, unc, source, measured_at = 0, None, "none", None
            segs = clock.clock_segments(pairs)         # sorted already: one pass
            deadline.check()                           # Python work the progress handler does not see
            aligner.set_node(old, segs, off)
            alignment[new] = dict(offset_ns=off, uncertainty_ns=unc, source=source, clock_pairs=len(pairs),
                                  aligned=bool(segs), measured_at=measured_at)
        deadline.where = f"copying {path}"
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
            # every copied value of the type its column holds (values.py; node: check_rows; an
            # input's ts_aligned is computed afresh): the copy takes only the rows that pass, and an
            # input with one that does not is refused
            checked = [c for c in values.checked_columns(table, cols)
                       if c in src_cols and c != "node" and not (table == "events" and c == "ts_aligned")]
            bad = " OR ".join(values.bad_sql(table, c, f"e.{c}") for c in checked)
            copied = conn.execute(f"INSERT INTO main.{table} ({', '.join(cols)}) "
                                  f"SELECT {', '.join(exprs)} "
                                  f"FROM src.{table} AS e" + (f" WHERE NOT ({bad})" if bad else "")).rowcount
            if bad and copied != conn.execute(f"SELECT COUNT(*) FROM src.{table}").fetchone()[0]:
                _refuse_bad_values(conn, path, table, checked)
        # meta: each node's keys under node.<NODE>.<key>; keys of an already merged input are renamed
        single = len(plan) == 1
        for key, value in src_meta.items():
            if key in MERGE_META_KEYS:
                continue
            if key in own_meta_keys:
                node, rest = own_meta_keys[key]
                key = node_meta_key(plan[node], rest)
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


def _refuse_bad_values(conn, path, table, columns):
    """The copy of `table` left rows out: refuse the input, naming the first (values.first_bad_value)."""
    found = values.first_bad_value(conn, table, columns, "src")
    what = values.describe(found, show) if found else f"{table} holds values of the wrong type"
    raise MergeError(f"{path}: {what}; refusing an input with bad values (take a fresh copy with "
                     f"`straggler snapshot`)")


def content_digest(path):
    """A digest of what a merged database holds: its schema and every row of every table, in rowid
    order, leaving out the two stamps of when a merge ran (meta `merged_at`, and `measured_at` of
    the clock_offsets rows a merge adds for offsets it was given). Two merges of the same inputs with
    the same offsets have the same digest. Read-only."""
    digest = hashlib.sha256()
    conn = sqlite3.connect(ro_uri(path), uri=True)
    try:
        harden(conn, read_only=True)
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
            conn = sqlite3.connect(ro_uri(path), uri=True)
            try:
                harden(conn, read_only=True)
                counts.append([conn.execute(f"SELECT COUNT(*) FROM {sql_ident(t)}").fetchone()[0]
                               for t in ("meta",) + NODE_TABLES])
            finally:
                conn.close()
        if counts[0] != counts[1]:                     # the cheap answer first
            return False
        return content_digest(new) == content_digest(old)
    except sqlite3.Error:
        return False


def write_merged(inputs, plans, offsets, output, out_dir, deadline, only_if_changed):
    """Copy `inputs` (each renamed by its plan, {node in file: node in output}) into `output` in
    `out_dir`, atomically. Returns the summary (output, inputs, nodes, rows, clock_alignment,
    changed); `changed` False when only_if_changed and `output` already held exactly these rows."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", suffix=".tmp", dir=out_dir)
    except OSError as exc:
        raise MergeError(f"cannot write {output} ({exc}); nothing was written") from None
    os.close(fd)
    summary = dict(output=output, inputs=[], nodes=[], rows={}, clock_alignment={}, elapsed_s=None, changed=None)
    conn = None
    try:
        os.chmod(tmp, 0o600)                           # processes.cmdline may hold secrets
        conn = sqlite3.connect("file:" + urllib.parse.quote(tmp), uri=True, isolation_level=None)
        conn.execute("PRAGMA journal_mode=OFF")       # a temp file: all or nothing by the rename
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA temp_store=MEMORY")
        harden(conn, read_only=False)                  # after journal_mode=OFF, which defensive mode forbids
        deadline.watch(conn)
        schema.create(conn)
        for name in EVENT_INDEXES:                     # load first, index after
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        aligner = clock.Aligner()
        conn.create_function("straggler_aligned_ts", 2, aligner, deterministic=True)
        for path, plan in zip(inputs, plans):
            deadline.check()
            deadline.where = f"copying {path}"
            try:
                _copy_input(conn, path, plan, offsets, summary, aligner, deadline)
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
        deadline.where = f"rolling up {output}"
        rollup.rebuild(conn)                           # from the rows copied (an input's own are never read)
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
    return summary
