"""A consistent copy of a node's live database, for collect and merge: `straggler snapshot`
and GET /api/v1/snapshot.

Uses SQLite's online backup API from a read-only connection (never a raw copy of the file and
its WAL), writes to a temporary file next to the output and renames it into place, and
leaves the copy in rollback-journal mode so that it is one self-contained file.

This module must not write to the source database.
"""
import json
import os
import sqlite3
import sys
import tempfile
import time

from ..errors import StragglerError
from .query import DEFAULT_DB, open_readonly

_PAGES_PER_STEP = 4096


def snapshot(db_path, out_path):
    """Copy db_path to out_path consistently. Returns {"path", "bytes", "elapsed_ms", "pages"}."""
    started = time.monotonic()
    out_path = os.path.abspath(out_path)
    out_dir = os.path.dirname(out_path)
    if os.path.abspath(db_path) == out_path:
        raise StragglerError(f"snapshot output {out_path} is the database itself; choose another -o")
    if not os.path.isdir(out_dir):
        raise StragglerError(f"directory {out_dir} does not exist; create it or choose another -o")
    if not os.access(out_dir, os.W_OK):
        raise StragglerError(f"directory {out_dir} is not writable by this user; choose another -o")
    source = open_readonly(db_path)
    fd, tmp_path = tempfile.mkstemp(prefix="." + os.path.basename(out_path) + ".", suffix=".tmp", dir=out_dir)
    os.close(fd)
    try:
        target = sqlite3.connect(tmp_path, isolation_level=None)
        try:
            source.backup(target, pages=_PAGES_PER_STEP)
            target.execute("PRAGMA journal_mode = DELETE")
            pages = target.execute("PRAGMA page_count").fetchone()[0]
        finally:
            target.close()
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, out_path)
    except sqlite3.Error as exc:
        raise StragglerError(f"snapshot of {db_path} failed: {' '.join(str(exc).split())}; "
                             f"check free space in {out_dir}") from None
    except OSError as exc:
        raise StragglerError(f"snapshot of {db_path} to {out_path} failed: {exc.strerror or exc}") from None
    finally:
        source.close()
        for leftover in (tmp_path, tmp_path + "-journal", tmp_path + "-wal", tmp_path + "-shm"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
    return {"path": out_path, "bytes": os.path.getsize(out_path), "pages": pages,
            "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3)}


def add_arguments(parser):
    parser.add_argument("--db", "-d", default=DEFAULT_DB, help=f"the node's database (default {DEFAULT_DB})")
    parser.add_argument("-o", "--output", required=True, help="where to write the copy")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")


def run(args):
    summary = snapshot(args.db, args.output)
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        print(f"wrote {summary['path']} ({summary['bytes']} bytes) in {summary['elapsed_ms']:.0f} ms")
    return 0
