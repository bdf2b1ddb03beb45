"""A consistent copy of a node's live database, for collect and merge: what `straggler snapshot`
(straggler.cli.snapshot) and GET /api/v1/snapshot run.

How: SQLite's online backup API from a read-only connection (never a raw copy of the file and
its WAL) that holds ONE read transaction for the whole copy. Inside it the source is a fixed
snapshot (WAL mode: the agent keeps committing, we keep reading the pages as of our start), so
the backup never restarts, however often the agent commits; a backup that opens a new read
transaction for each step (SQLite's default) starts over after every commit of another
connection and, under `collect` on a busy node, never finishes. The copy goes in steps, and
between steps a deadline (`deadline_s`, CLI `--deadline`, default 120 s) is checked: past it the
snapshot stops with a one-line StragglerError and leaves nothing behind. While the copy runs the
agent's WAL cannot be checkpointed past our snapshot, so it grows for that long: one more reason
for the deadline. (A source in rollback-journal mode, such as a snapshot or a merged file, is
locked against writers for that long instead; the agent's store is always WAL.)

What is written: a temporary file next to the output, renamed into place when complete and
synced, in rollback-journal mode (journal_mode=DELETE: one self-contained file, no -wal or -shm),
mode 0600 whatever the umask (it holds processes.cmdline, which may carry secrets). A failed or
stopped snapshot removes its temporary (and its -journal/-wal/-shm).

Temporaries of a KILLED snapshot (SIGKILL, OOM, power loss) are named after their owner,
`.OUT.straggler-snap-<pid>-XXXXXXXX.tmp`; `remove_stale_temporaries(directory)`, run at the start
of every snapshot for its output directory, removes those whose process is gone (a pid that is
alive again, but only started after the file was last written, counts as gone). Temporaries of
snapshots still running are left alone, so two snapshots may share a directory. Leftovers of older
versions (`.OUT.XXXXXXXX.tmp`, no pid) of the same output are removed once an hour old.

Staging directories: a server that writes a snapshot before streaming it (GET /api/v1/snapshot)
takes one from `stage_dir(snapshot_dir=None)`: a new directory `straggler-snapshot-<pid>-XXXXXXXX`
(mode 0700) in `snapshot_dir` or the system temporary directory. The caller removes its own
directory when its answer is sent (shutil.rmtree). Staged copies cannot pile up: a copy stays
staged while a slow reader takes it, after the one-at-a-time snapshot pool has moved on, so
stage_dir refuses (StagingFull, one line; the API answers 429) while MAX_STAGED_COPIES of this
user's staging directories are already in that parent. Before counting it cleans up: the staging
directories of dead processes, and any older than STAGE_MAX_AGE_S (an answer that was never sent
left it; one still being sent reads from its open file, which removing the name does not stop).

This module must not write to the source database, and prints nothing.
"""
import os
import re
import shutil
import sqlite3
import stat
import tempfile
import threading
import time

from ..errors import StragglerError
from .query import open_readonly

DEFAULT_DEADLINE_S = 120.0
_PAGES_PER_STEP = 4096          # the deadline is checked after each step (16 MiB at 4 KiB pages)
TEMP_MARK = "straggler-snap"
STAGE_PREFIX = "straggler-snapshot-"
_TEMP_RE = re.compile(r"^\..+\." + TEMP_MARK + r"-(\d+)-[A-Za-z0-9_]+\.tmp(?:-journal|-wal|-shm)?$")
_STAGE_RE = re.compile(r"^" + STAGE_PREFIX + r"(\d+)-[A-Za-z0-9_]+$")
_LEGACY_AGE_S = 3600.0
MAX_STAGED_COPIES = 2           # staged snapshot copies (being sent) in one directory at once
STAGE_MAX_AGE_S = 3600.0        # a staging directory untouched this long is a leftover
_STAGE_LOCK = threading.Lock()  # count-then-create, one thread of this process at a time
_SIDE_FILES = ("", "-journal", "-wal", "-shm")


class StagingFull(StragglerError):
    """MAX_STAGED_COPIES snapshot copies are staged already (being sent): retry later. The API
    answers it with 429."""
    kind = "busy"


class _DeadlinePassed(Exception):
    def __init__(self, copied, total):
        super().__init__(copied, total)
        self.copied, self.total = copied, total


# ---- who owns a temporary ---------------------------------------------------------------------
def _process_started_at(pid):
    """Wall-clock time at which process pid started (Linux /proc), or None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith(b"btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def _owner_alive(pid, written_at):
    """Whether the process that wrote a file at `written_at` (with pid in its name) may still run."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # EPERM: alive, someone else's
    started = _process_started_at(pid)
    # the owner started before it wrote the file; a process with its pid started later is not it
    # (2 s of slack: /proc/stat's boot time has whole seconds)
    return started is None or started <= written_at + 2.0


def _mine(st):
    return st.st_uid == os.geteuid()


def _unlink_quietly(path):
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _matching_entries(directory, pattern):
    """(match, path, lstat) of the entries of `directory` whose name matches `pattern`, this user's
    only; nothing when the directory cannot be read (a cleanup must not stop the snapshot)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = pattern.match(name)
        if not match:
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if _mine(st):
            yield match, path, st


def remove_stale_temporaries(directory):
    """Remove the snapshot temporaries in `directory` whose owner process is gone (see the module
    docstring), with their -journal/-wal/-shm. Only this user's regular files are touched; errors
    are ignored (a cleanup must not stop the snapshot). Returns the paths removed."""
    removed = []
    for match, path, st in _matching_entries(directory, _TEMP_RE):
        if stat.S_ISREG(st.st_mode) and not _owner_alive(int(match.group(1)), st.st_mtime) and _unlink_quietly(path):
            removed.append(path)
    return removed


def _remove_legacy_temporaries(directory, base):
    """Temporaries of this output left by versions before pid-named ones: `.BASE.XXXXXXXX.tmp`
    (mkstemp's 8 characters) and its journal, once an hour untouched."""
    legacy = re.compile(r"^\." + re.escape(base) + r"\.[a-z0-9_]{8}\.tmp(?:-journal|-wal|-shm)?$")
    now = time.time()
    for _, path, st in _matching_entries(directory, legacy):
        if stat.S_ISREG(st.st_mode) and now - st.st_mtime > _LEGACY_AGE_S:
            _unlink_quietly(path)


def remove_stale_stage_dirs(parent, max_age_s=None):
    """Remove the staging directories (`straggler-snapshot-<pid>-*`) in `parent` whose process is
    gone, or that nothing touched for `max_age_s` (default STAGE_MAX_AGE_S). Only this user's real
    directories (not symlinks) are touched. Returns (the paths removed, the paths kept)."""
    max_age_s = STAGE_MAX_AGE_S if max_age_s is None else max_age_s
    removed, kept = [], []
    now = time.time()
    for match, path, st in _matching_entries(parent, _STAGE_RE):
        if not stat.S_ISDIR(st.st_mode):
            continue
        if _owner_alive(int(match.group(1)), st.st_mtime) and now - st.st_mtime <= max_age_s:
            kept.append(path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        (kept if os.path.lexists(path) else removed).append(path)
    return removed, kept


def stage_dir(snapshot_dir=None, max_staged=MAX_STAGED_COPIES):
    """A new directory (mode 0700) in which to write a snapshot before serving it:
    `straggler-snapshot-<pid>-XXXXXXXX` in `snapshot_dir` or the system temporary directory.
    Removes the leftovers there first (remove_stale_stage_dirs); StagingFull when `max_staged`
    staging directories remain. The caller removes the directory it got."""
    parent = snapshot_dir or tempfile.gettempdir()
    with _STAGE_LOCK:
        _, staged = remove_stale_stage_dirs(parent)
        if len(staged) >= max_staged:
            raise StagingFull(f"{len(staged)} snapshot copies are already staged in {parent}, waiting for their "
                              f"readers (at most {max_staged} at once); retry when one is fetched")
        try:
            return tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=parent)
        except OSError as exc:
            raise StragglerError(f"cannot make a staging directory in {parent} ({exc.strerror or exc}); "
                                 f"choose a writable --snapshot-dir") from None


# ---- the copy --------------------------------------------------------------------------------------
def _copy(source, tmp_path, deadline):
    """Back up `source` into the (empty) file tmp_path inside one read transaction of the source;
    raises _DeadlinePassed when the monotonic clock passes `deadline` between two steps."""
    # BEGIN alone starts nothing: the first read opens the transaction and fixes its snapshot
    source.execute("BEGIN")
    source.execute("SELECT count(*) FROM sqlite_master").fetchone()
    if time.monotonic() > deadline:
        raise _DeadlinePassed(0, source.execute("PRAGMA page_count").fetchone()[0])

    def progress(_status, remaining, total):
        if time.monotonic() > deadline and remaining > 0:
            raise _DeadlinePassed(total - remaining, total)

    target = sqlite3.connect(tmp_path, isolation_level=None)
    try:
        source.backup(target, pages=_PAGES_PER_STEP, progress=progress, sleep=0.05)
        # the copied header says WAL (like the source): make it one self-contained file
        mode = target.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
        if mode.lower() != "delete":
            raise StragglerError(f"the copy {tmp_path} stayed in journal_mode {mode}, not delete; "
                                 f"choose an -o on a local filesystem")
        return target.execute("PRAGMA page_count").fetchone()[0]
    finally:
        target.close()
        try:
            source.execute("COMMIT")
        except sqlite3.Error:
            pass


def _fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def snapshot(db_path, out_path, deadline_s=DEFAULT_DEADLINE_S):
    """Copy db_path to out_path consistently, within deadline_s seconds.

    Returns {"path", "bytes", "pages", "elapsed_ms", "deadline_s"}. Raises StragglerError (one line)
    when the output is refused, the copy fails or the deadline passes; then nothing is left behind.
    """
    started = time.monotonic()
    try:
        deadline_s = float(deadline_s)
    except (TypeError, ValueError):
        raise StragglerError(f"deadline {deadline_s!r} is not a number of seconds; pass --deadline S") from None
    if not deadline_s > 0:
        raise StragglerError(f"deadline {deadline_s:g} s is not positive; pass --deadline S with S > 0")
    out_path = os.path.abspath(out_path)
    out_dir = os.path.dirname(out_path)
    base = os.path.basename(out_path)
    same = os.path.abspath(db_path) == out_path
    if not same and os.path.exists(out_path) and os.path.exists(db_path):
        try:
            same = os.path.samefile(db_path, out_path)
        except OSError:
            pass
    if same:
        raise StragglerError(f"snapshot output {out_path} is the database itself; choose another -o")
    if not os.path.isdir(out_dir):
        raise StragglerError(f"directory {out_dir} does not exist; create it or choose another -o")
    if not os.access(out_dir, os.W_OK):
        raise StragglerError(f"directory {out_dir} is not writable by this user; choose another -o")
    remove_stale_temporaries(out_dir)
    _remove_legacy_temporaries(out_dir, base)
    source = open_readonly(db_path)
    tmp_path = None
    try:
        # mkstemp: a new file, mode 0600 whatever the umask; SQLite gives its journal the same mode
        fd, tmp_path = tempfile.mkstemp(prefix=f".{base}.{TEMP_MARK}-{os.getpid()}-", suffix=".tmp", dir=out_dir)
        os.close(fd)
        pages = _copy(source, tmp_path, started + deadline_s)
        _fsync_path(tmp_path)
        os.replace(tmp_path, out_path)
        tmp_path = None
        try:
            _fsync_path(out_dir, directory=True)  # the rename itself: best effort
        except OSError:
            pass
    except _DeadlinePassed as exc:
        raise StragglerError(f"snapshot of {db_path} stopped after {deadline_s:g} s (deadline): {exc.copied} of "
                             f"{exc.total} pages copied, nothing written; pass a longer --deadline or retry when "
                             f"the node's disk is less busy") from None
    except sqlite3.Error as exc:
        raise StragglerError(f"snapshot of {db_path} failed: {' '.join(str(exc).split())}; "
                             f"check free space in {out_dir}") from None
    except OSError as exc:
        raise StragglerError(f"snapshot of {db_path} to {out_path} failed: {exc.strerror or exc}") from None
    finally:
        source.close()
        if tmp_path:
            for suffix in _SIDE_FILES:
                _unlink_quietly(tmp_path + suffix)
    return {"path": out_path, "bytes": os.path.getsize(out_path), "pages": pages,
            "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3), "deadline_s": deadline_s}

