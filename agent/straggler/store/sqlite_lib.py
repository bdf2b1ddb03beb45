"""The SQLite library under Python's sqlite3 module, reached through ctypes for the two things
Python < 3.12 cannot ask of it: SQLite's defensive mode on a connection
(sqlite3_db_config(SQLITE_DBCONFIG_DEFENSIVE), `Connection.setconfig` from 3.12 on) and the bytes
SQLite has allocated in this process (sqlite3_memory_used, for the query memory cap in watchdog.py).

How it stays safe. The library is never loaded a second time: only a libsqlite3 this process has
already mapped (the one _sqlite3 links), opened with RTLD_NOLOAD, and only when its version is
sqlite3.sqlite_version. No layout of CPython's connection object is guessed: the connection's
`sqlite3 *` comes from SQLite itself, through an auto-extension (sqlite3_auto_extension), which
SQLite calls with every new connection of this process, in the thread that opens it; the callback
acts only inside `defensive_open()` in that thread and does nothing otherwise. Whether it works is
checked once on a scratch in-memory connection (the callback ran, and SQLite reads the setting back
as on); when any step fails, `available()` is False with the reason, nothing is registered, and
callers fall back (open_readonly logs the fallback once: docs/security.md).

This module must not open a database file, and holds no policy: store/query.py decides when to use it.
"""
import atexit
import contextlib
import ctypes
import os
import sqlite3
import sys
import threading

SQLITE_DBCONFIG_DEFENSIVE = 1010      # sqlite3.h; sqlite3.SQLITE_DBCONFIG_DEFENSIVE from Python 3.12 on
_ENTRY_POINT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)

_lock = threading.Lock()
_state = None                          # None until probed, then a dict (see _probe)
_local = threading.local()


def _mapped_library_paths():
    """Paths of shared objects mapped in this process that can hold SQLite's symbols: a
    libsqlite3, else the _sqlite3 extension itself (a build that links SQLite statically)."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if "libsqlite3" in os.path.basename(path) and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    import _sqlite3
    own = getattr(_sqlite3, "__file__", None)
    if own and own not in paths:
        paths.append(own)
    return paths


def _load():
    """The already loaded SQLite library as a ctypes.CDLL, or (None, why)."""
    if not sys.platform.startswith("linux"):
        return None, f"not on Linux ({sys.platform})"
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)
    why = "no libsqlite3 is mapped in this process"
    for path in _mapped_library_paths():
        try:
            lib = ctypes.CDLL(path, mode=mode)
            version = lib.sqlite3_libversion
        except (OSError, AttributeError) as exc:
            why = f"{os.path.basename(path)} does not export SQLite's API ({exc})"
            continue
        version.restype = ctypes.c_char_p
        found = (version() or b"").decode("ascii", "replace")
        if found != sqlite3.sqlite_version:
            why = f"{path} is SQLite {found}, not the {sqlite3.sqlite_version} Python's sqlite3 runs"
            continue
        return lib, None
    return None, why


def _on_open(db, _errmsg, _api):
    """SQLite's auto-extension entry: called with each new connection of the process, in the thread
    that opens it. Only inside defensive_open() in this thread: defensive mode on, and the setting
    read back."""
    try:
        wanted = getattr(_local, "opening", None)
        if wanted is None or _state is None or _state.get("lib") is None:
            return 0
        lib = _state["lib"]
        out = ctypes.c_int(-1)
        rc = lib.sqlite3_db_config(ctypes.c_void_p(db), ctypes.c_int(SQLITE_DBCONFIG_DEFENSIVE), ctypes.c_int(1),
                                   ctypes.byref(out))
        wanted.append((rc, out.value))
    except Exception:   # never raise into SQLite
        pass
    return 0


_entry = _ENTRY_POINT(_on_open)        # kept alive for as long as SQLite may call it


def _probe():
    global _state
    lib, why = _load()
    state = {"lib": lib, "why": why, "defensive": False, "memory": False}
    if lib is None:
        _state = state
        return state
    try:
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        lib.sqlite3_memory_used.argtypes = []
        state["memory"] = True
    except AttributeError:
        pass
    if hasattr(sqlite3.Connection, "setconfig"):
        state["defensive"], state["how"] = True, "Connection.setconfig (Python 3.12+)"
        _state = state
        return state
    try:
        register = lib.sqlite3_auto_extension
        cancel = lib.sqlite3_cancel_auto_extension
        register.argtypes = cancel.argtypes = [_ENTRY_POINT]
    except AttributeError as exc:
        state["why"] = f"this SQLite has no auto-extensions ({exc})"
        _state = state
        return state
    _state = state
    if register(_entry) != 0:
        state["why"] = "sqlite3_auto_extension refused the callback"
        return state
    atexit.register(cancel, _entry)
    seen = []
    _local.opening = seen
    try:
        scratch = sqlite3.connect(":memory:")
    finally:
        _local.opening = None
    scratch.close()
    if seen == [(0, 1)]:
        state["defensive"], state["how"] = True, "sqlite3_db_config through ctypes (auto-extension)"
    else:
        cancel(_entry)
        state["why"] = (f"the check connection did not come through the callback ({seen!r}): Python's sqlite3 "
                        f"runs another copy of SQLite")
    return state


def _get():
    if _state is None:
        with _lock:
            if _state is None:
                _probe()
    return _state


def defensive_mode():
    """(True, how) when connections opened through defensive_open() get SQLite's defensive mode,
    else (False, why not)."""
    state = _get()
    return (True, state["how"]) if state["defensive"] else (False, state["why"] or "not available")


@contextlib.contextmanager
def defensive_open():
    """Around sqlite3.connect(...) in this thread: the connection it opens gets defensive mode.
    Yields a list that holds [(rc, state)] when the callback set it (Python < 3.12); call
    `confirm(conn, seen)` after the connect."""
    state = _get()
    seen = []
    if not state["defensive"] or hasattr(sqlite3.Connection, "setconfig"):
        yield seen
        return
    _local.opening = seen
    try:
        yield seen
    finally:
        _local.opening = None


def confirm(conn, seen):
    """After a connect inside defensive_open(): True when defensive mode is on for `conn`."""
    if hasattr(conn, "setconfig"):
        conn.setconfig(SQLITE_DBCONFIG_DEFENSIVE, True)
        return bool(conn.getconfig(SQLITE_DBCONFIG_DEFENSIVE))
    return seen == [(0, 1)]


def memory_used():
    """Bytes SQLite has allocated in this process (all connections), or None when unknown."""
    state = _get()
    if not state["memory"]:
        return None
    return int(state["lib"].sqlite3_memory_used())
