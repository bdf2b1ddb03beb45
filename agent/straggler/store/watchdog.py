"""Deadlines, the memory cap and the temp-file cap of reading connections, enforced from outside the
query: one background thread calls a connection's `interrupt()` (sqlite3_interrupt) when its
deadline passes, so a query stops even in the middle of one long VDBE opcode (count(*) over a big
table, PRAGMA integrity_check), where a progress handler is never called. SQLite forgets an
interrupt that comes while no statement runs, so a stopped query is interrupted again every
REINTERRUPT_S, and its progress handler stops it too, until its caller lets go (unwatch).

While any query is watched the thread also looks, every POLL_S:
  - temp spill, per query: what the query's thread has written (the `wchar` of
    /proc/self/task/TID/io: a reading connection writes nothing but SQLite's temporary files:
    sorts, GROUP BY, DISTINCT, materialized subqueries). Over `temp_cap` bytes the query is stopped.
    A query whose rows stream is counted in each worker thread that fetches them.
  - memory, all queries together: the bytes SQLite has allocated in this process
    (sqlite_lib.memory_used) above what it held when the first watched query started. Over
    `memory_cap` it stops the watched query that has done the most work (VDBE steps counted by its
    progress handler), one at a time, so a small query beside a heavy one is left alone.
Where a counter cannot be read (no /proc, or SQLite's heap not reachable) that cap is not
enforced, and `caps()` says so.

A watch can be paused (an answer that streams waits for its reader: that time is not the query's).
Nothing here knows SQL or HTTP; this module must not open a database.
"""
import itertools
import threading
import time

from . import sqlite_lib

POLL_S = 0.05
REINTERRUPT_S = 0.02                     # a stopped query is interrupted again until its caller lets go
DEFAULT_MEMORY_CAP = 256 << 20           # bytes of SQLite heap the watched queries may add, all together
DEFAULT_TEMP_CAP = 1 << 30               # bytes of temporary files one query may write
STEPS_PER_TICK = 1000                    # VDBE steps between two calls of a watch's progress handler


def thread_written(tid):
    """Bytes the thread `tid` of this process has written (wchar), or None when unreadable."""
    try:
        with open(f"/proc/self/task/{tid}/io", "rb") as fh:
            for line in fh:
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class Watch:
    """One connection under a deadline. `.stopped` is None, or why it was interrupted: "deadline",
    "memory", "temp" or "abandoned"."""
    __slots__ = ("conn", "deadline", "remaining", "stopped", "ticks", "label", "key", "tid", "io_base", "spilled")

    def __init__(self, conn, deadline, label, key):
        self.conn = conn
        self.deadline = deadline          # monotonic seconds; None while paused
        self.remaining = None             # seconds left, while paused
        self.stopped = None
        self.ticks = 0
        self.label = label
        self.key = key
        self.tid = None                   # the thread running it now (None while paused)
        self.io_base = None               # that thread's written bytes when it took the query
        self.spilled = 0                  # temp bytes written in the threads before

    def tick(self):
        """The connection's progress handler: counts work, and stops a query the watchdog stopped or
        whose deadline has passed (checked here too, so a watchdog thread that gets no CPU in time
        does not let a query run on)."""
        self.ticks += 1
        if self.stopped is None:
            deadline = self.deadline
            if deadline is None or time.monotonic() < deadline:
                return 0
            self.stopped = "deadline"
        return 1

    def _take(self):
        """The calling thread runs the query from now on."""
        self.tid = threading.get_native_id()
        self.io_base = thread_written(self.tid)

    def _leave(self):
        self.spilled = self.temp_written()
        self.tid = self.io_base = None

    def temp_written(self):
        """Temporary-file bytes the query has written so far (None when unknown)."""
        if self.tid is None or self.io_base is None:
            return self.spilled
        now = thread_written(self.tid)
        return None if now is None else self.spilled + max(0, now - self.io_base)


class Watchdog:
    def __init__(self, memory_cap=DEFAULT_MEMORY_CAP, temp_cap=DEFAULT_TEMP_CAP):
        self._cond = threading.Condition()
        self._watches = {}
        self._ids = itertools.count()
        self._thread = None
        self.memory_cap = memory_cap
        self.temp_cap = temp_cap
        self._baseline = None
        self.interrupts = {"deadline": 0, "memory": 0, "temp": 0, "abandoned": 0}

    def caps(self):
        """{"memory": bool, "temp": bool}: which caps this process can enforce."""
        return {"memory": sqlite_lib.memory_used() is not None,
                "temp": thread_written(threading.get_native_id()) is not None}

    # -- the callers' side (in the thread that runs the query)
    def watch(self, conn, timeout_s, label=""):
        """Register `conn` with a deadline `timeout_s` from now, run by the calling thread; returns the
        Watch (unwatch it before closing the connection). Installs the progress handler."""
        watch = Watch(conn, time.monotonic() + max(0.0, float(timeout_s)), label, next(self._ids))
        watch._take()
        conn.set_progress_handler(watch.tick, STEPS_PER_TICK)
        with self._cond:
            if not self._watches:
                self._baseline = sqlite_lib.memory_used()
            self._watches[watch.key] = watch
            self._ensure_thread()
            self._cond.notify()
        return watch

    def unwatch(self, watch):
        """Forget the watch: after this returns the thread never touches its connection."""
        with self._cond:
            self._watches.pop(watch.key, None)
        try:
            watch.conn.set_progress_handler(None, 0)
        except Exception:   # a closed connection
            pass

    def pause(self, watch):
        """The query waits (its rows wait for a reader): its clock stops, its thread lets go."""
        with self._cond:
            if watch.deadline is not None:
                watch.remaining = max(0.0, watch.deadline - time.monotonic())
                watch.deadline = None
                watch._leave()

    def resume(self, watch):
        """The calling thread goes on with the query; its clock runs again."""
        with self._cond:
            if watch.deadline is None:
                watch._take()
                watch.deadline = time.monotonic() + (watch.remaining or 0.0)
                watch.remaining = None
                self._cond.notify()

    def interrupt(self, watch, reason):
        """Stop the watch's query now (from any thread: its answer was abandoned)."""
        with self._cond:
            self._stop(watch, reason)

    def overdue(self, watch):
        """In the query's own thread, between two steps: stop the watch when its deadline has passed
        and say why it is stopped (None while it may go on). The thread's interrupt is the deadline's
        only guard while a step runs; this one does not depend on that thread being scheduled in
        time, so a deadline already past before SQLite starts, or passed during a step the interrupt
        came too late for, is kept all the same."""
        with self._cond:
            if watch.stopped is None and watch.deadline is not None and time.monotonic() >= watch.deadline:
                self._stop(watch, "deadline")
            return watch.stopped

    # -- the thread
    def _ensure_thread(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="straggler-query-watchdog", daemon=True)
            self._thread.start()

    def _stop(self, watch, reason):
        if watch.stopped is None and watch.key in self._watches:
            watch.stopped = reason
            self.interrupts[reason] = self.interrupts.get(reason, 0) + 1
            self._interrupt(watch)

    @staticmethod
    def _interrupt(watch):
        try:
            watch.conn.interrupt()
        except Exception:   # closed meanwhile
            pass

    def _run(self):
        with self._cond:
            while True:
                if not self._watches:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                wait = POLL_S if (self.memory_cap or self.temp_cap) else None
                for watch in list(self._watches.values()):
                    if watch.stopped is not None:
                        # SQLite forgets an interrupt that comes while no statement runs: say it again
                        # until the caller has seen it and unwatched
                        self._interrupt(watch)
                        wait = REINTERRUPT_S if wait is None else min(wait, REINTERRUPT_S)
                        continue
                    if watch.deadline is None:
                        continue
                    if now >= watch.deadline:
                        self._stop(watch, "deadline")
                        continue
                    wait = watch.deadline - now if wait is None else min(wait, watch.deadline - now)
                    if self.temp_cap:
                        written = watch.temp_written()
                        if written is not None and written > self.temp_cap:
                            self._stop(watch, "temp")
                self._check_memory()
                self._cond.wait(wait)

    def _check_memory(self):
        if not self.memory_cap or self._baseline is None:
            return
        used = sqlite_lib.memory_used()
        if used is None or used - self._baseline <= self.memory_cap:
            return
        running = [w for w in self._watches.values() if w.stopped is None]
        # one at a time: a stopped query frees its memory when its thread sees the interrupt
        settling = any(w.stopped == "memory" for w in self._watches.values())
        if running and not settling:
            self._stop(max(running, key=lambda w: w.ticks), "memory")


WATCHDOG = Watchdog()
