"""What an agent is doing, read from its own store: the dict `straggler status` (straggler.cli.status)
and GET /api/v1/health show.

Everything comes from the store's tables (meta, processes, probes, agent_cost, lost_events)
through a read-only connection, so it works on a live node, on a snapshot, and with the agent
stopped, under a deadline (store.query.reading). Rates are over the last few agent_cost intervals.

This module must not write to the database, must not talk to the network, and prints nothing.
"""
import os
import sqlite3
import time

from .. import __version__
from ..errors import StragglerError
from .query import reading
from .schema import SCHEMA_VERSION

RECENT_INTERVALS = 6          # rates over the last N agent_cost intervals
RECENT_LOST_WINDOW_NS = 60 * 10**9
DEFAULT_TIMEOUT_S = 10.0      # the whole status read; SQLite is interrupted at it


def _table_exists(conn, name):
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type IN ('table','view') AND name = ?",
                        (name,)).fetchone() is not None


def _db_size(db_path):
    sizes = {}
    for suffix in ("", "-wal", "-shm"):
        try:
            sizes[suffix or "db"] = os.path.getsize(db_path + suffix)
        except OSError:
            sizes[suffix or "db"] = 0
    return sizes


def collect_status(db_path, timeout_s=DEFAULT_TIMEOUT_S) -> dict:
    """A dict describing the node's agent, from its database. Raises StragglerError if unreadable
    (QueryTimeout past timeout_s)."""
    with reading(db_path, timeout_s, "the status") as conn:
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            if "interrupted" in str(exc):
                raise
            raise StragglerError(f"{db_path} is not a straggler database (no table meta); point --db at the agent's store") from None
        status = {
            "node": meta.get("node") or meta.get("hostname"),
            "db_path": os.path.abspath(db_path),
            "schema_version": int(meta["schema_version"]) if str(meta.get("schema_version", "")).isdigit() else None,
            "schema_version_supported": SCHEMA_VERSION,
            "agent_version": meta.get("agent_version") or meta.get("version"),
            "reader_version": __version__,
        }
        sizes = _db_size(db_path)
        status["db_bytes"] = sizes["db"]
        status["wal_bytes"] = sizes["-wal"]
        status["db_size_bytes"] = sum(sizes.values())

        ranks, processes = [], []
        if _table_exists(conn, "processes"):
            for pid, comm, rank, local_rank, world_size, exited in conn.execute(
                    "SELECT pid, comm, rank, local_rank, world_size, exited FROM processes ORDER BY rank, pid"):
                processes.append({"pid": pid, "comm": comm, "rank": rank, "local_rank": local_rank,
                                  "world_size": world_size, "exited": bool(exited) if exited is not None else False})
                if rank is not None and rank not in ranks:
                    ranks.append(rank)
        status["ranks"] = sorted(ranks)
        status["processes"] = processes

        probes = []
        if _table_exists(conn, "probes"):
            probes = [{"name": name, "library": library, "attached_at": attached_at}
                      for name, library, attached_at in conn.execute(
                          "SELECT name, library, attached_at FROM probes ORDER BY name, library")]
        missing = [p for p in probes if p["name"].startswith("missing:")]
        probes = [p for p in probes if not p["name"].startswith("missing:")]
        status["probes_attached"] = len(probes)
        status["probes"] = probes
        # per traced library (or executable carrying the CUDA runtime): the functions attached, and the
        # ones a library of its kind should have but lacks (never silent)
        libraries = {}
        for p in probes:
            if p["library"] and p["name"].startswith("uprobe:"):
                libraries.setdefault(p["library"], {"attached": [], "missing": []})["attached"].append(p["name"][7:])
        for p in missing:
            libraries.setdefault(p["library"], {"attached": [], "missing": []})["missing"].append(p["name"][8:])
        status["libraries"] = libraries

        status.update(_rates(conn))
        status.update(_lost(conn))
        status["summary_interval_s"] = (int(meta["agent_summary_interval_ns"]) / 1e9
                                        if str(meta.get("agent_summary_interval_ns", "")).isdigit() else None)
        status["summary_cpu_percent"] = None
        started, cpu = meta.get("agent_started_ns", ""), meta.get("agent_summary_cpu_ns", "")
        heartbeat = meta.get("agent_heartbeat_ns", "")
        if str(started).isdigit() and str(cpu).isdigit() and str(heartbeat).isdigit() and int(heartbeat) > int(started):
            # the step-time summaries' own CPU over the agent's run (part of the agent CPU above)
            status["summary_cpu_percent"] = round(100.0 * int(cpu) / (int(heartbeat) - int(started)), 3)
        status["summary_age_s"] = None
        if _table_exists(conn, "thread_time"):
            newest = conn.execute("SELECT MAX(ts + interval_ns) FROM thread_time").fetchone()[0]
            if newest is not None and status.get("last_interval_age_s") is not None:
                # the same boot's clock: how old the newest step-time summary is (a live watch reads it)
                status["summary_age_s"] = round(max(0, time.monotonic_ns() - newest) / 1e9, 1)
        status["devices"] = _devices(conn, meta)
    return status


def _devices(conn, meta):
    """Whether the agent reads the GPUs (NVML) and the kernel's Xid errors, how many GPUs, and why not
    (meta devices_*, xid_*; docs/devices.md). read is None for an agent that predates them."""
    state, interval = meta.get("devices_state"), meta.get("devices_interval_ns", "")
    gpus = meta.get("devices_gpus", "")
    errors = None
    if _table_exists(conn, "gpu_errors"):
        errors = conn.execute("SELECT count(*) FROM gpu_errors").fetchone()[0]
    return {"read": None if state is None else state == "read",
            "gpus": int(gpus) if str(gpus).isdigit() else None,
            "why_not": meta.get("devices_reason") if state == "not read" else None,
            "driver": meta.get("devices_driver"),
            "interval_s": int(interval) / 1e9 if str(interval).isdigit() else None,
            "xid_read": None if meta.get("xid_state") is None else meta.get("xid_state") == "read",
            "xid_why_not": meta.get("xid_reason") if meta.get("xid_state") == "not read" else None,
            "xid_errors": errors}


def _rates(conn):
    out = {"events_per_s": None, "probe_hits_per_s": None, "agent_cpu_percent": None, "agent_rss_bytes": None,
           "cost_intervals": 0, "last_interval_end_mono_ns": None, "last_interval_age_s": None}
    if not _table_exists(conn, "agent_cost"):
        return out
    rows = conn.execute(
        "SELECT ts, interval_ns, cpu_seconds, probe_hits, events_written, rss_bytes FROM agent_cost "
        "ORDER BY ts DESC LIMIT ?", (RECENT_INTERVALS,)).fetchall()
    if not rows:
        return out
    span_ns = sum(max(0, r[1]) for r in rows)
    out["cost_intervals"] = len(rows)
    if span_ns > 0:
        span_s = span_ns / 1e9
        out["events_per_s"] = round(sum(r[4] for r in rows) / span_s, 1)
        out["probe_hits_per_s"] = round(sum(r[3] for r in rows) / span_s, 1)
        out["agent_cpu_percent"] = round(100.0 * sum(r[2] for r in rows) / span_s, 2)
    out["agent_rss_bytes"] = rows[0][5]
    last_end = rows[0][0] + rows[0][1]
    out["last_interval_end_mono_ns"] = last_end
    # same boot, same clock: how long ago the agent last wrote its cost row (on the node itself)
    age = (time.monotonic_ns() - last_end) / 1e9
    out["last_interval_age_s"] = round(age, 1) if age >= -1 else None
    return out


def _lost(conn):
    out = {"lost_events_total": 0, "lost_events_recent": 0, "lost_events_by_probe": {}}
    if not _table_exists(conn, "lost_events"):
        return out
    total = conn.execute("SELECT COALESCE(SUM(count), 0), MAX(ts + interval_ns) FROM lost_events").fetchone()
    out["lost_events_total"] = int(total[0] or 0)
    if total[1] is not None:
        recent = conn.execute("SELECT COALESCE(SUM(count), 0) FROM lost_events WHERE ts + interval_ns >= ?",
                              (total[1] - RECENT_LOST_WINDOW_NS,)).fetchone()
        out["lost_events_recent"] = int(recent[0] or 0)
    out["lost_events_by_probe"] = {probe: int(n) for probe, n in conn.execute(
        "SELECT probe, SUM(count) FROM lost_events GROUP BY probe ORDER BY probe")}
    return out

