"""Deadlines and the memory cap of reading connections, enforced from outside the query: one
background thread calls a connection's `interrupt()` (sqlite3_interrupt) when its deadline passes,
so a query stops even in the middle of one long VDBE opcode (count(*) over a big table,
PRAGMA integrity_check), where a progress handler is never called.

It also holds the memory cap of queries. Reading connections keep their temporary b-trees and
sorts in memory (PRAGMA temp_store=MEMORY: nothing spills to disk), and while any is watched the
thread samples the bytes SQLite has allocated in this process (sqlite_lib.memory_used) every
MEMORY_POLL_S; above `memory_cap` bytes more than when the first of them started, it interrupts the
watched connection that has done the most work (VDBE steps counted by its progress handler), one at
a time, until the heap is back under the cap. A small query running beside a heavy one is left alone.

A watch can be paused (an answer that streams waits for its reader: that time is not the query's).
Nothing here knows SQL or HTTP; this module must not open a database.
"""
import itertools
import threading
import time

from . import sqlite_lib

MEMORY_POLL_S = 0.05
REINTERRUPT_S = 0.02                     # a stopped query is interrupted again until its caller lets go
DEFAULT_MEMORY_CAP = 256 << 20           # bytes of SQLite heap the watched queries may add, all together
STEPS_PER_TICK = 1000                    # VDBE steps between two calls of a watch's progress handler


class Watch:
    """One connection under a deadline. `.stopped` is None, "deadline" or "memory" once interrupted."""
    __slots__ = ("conn", "deadline", "remaining", "stopped", "ticks", "label", "key")

    def __init__(self, conn, deadline, label, key):
        self.conn = conn
        self.deadline = deadline          # monotonic seconds; None while paused
        self.remaining = None             # seconds left, while paused
        self.stopped = None
        self.ticks = 0
        self.label = label
        self.key = key

    def tick(self):
        """The connection's progress handler: counts work, and stops a query the watchdog stopped
        (an interrupt that came before the statement started is forgotten by SQLite)."""
        self.ticks += 1
        return 1 if self.stopped is not None else 0


class Watchdog:
    def __init__(self, memory_cap=DEFAULT_MEMORY_CAP):
        self._cond = threading.Condition()
        self._watches = {}
        self._ids = itertools.count()
        self._thread = None
        self.memory_cap = memory_cap
        self._baseline = None
        self.interrupts = {"deadline": 0, "memory": 0}

    # -- the callers' side
    def watch(self, conn, timeout_s, label=""):
        """Register `conn` with a deadline `timeout_s` from now; returns the Watch (unwatch it before
        closing the connection). Installs the progress handler that counts its work."""
        watch = Watch(conn, time.monotonic() + max(0.0, float(timeout_s)), label, next(self._ids))
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
        with self._cond:
            if watch.deadline is not None:
                watch.remaining = max(0.0, watch.deadline - time.monotonic())
                watch.deadline = None

    def resume(self, watch):
        with self._cond:
            if watch.deadline is None:
                watch.deadline = time.monotonic() + (watch.remaining or 0.0)
                watch.remaining = None
                self._cond.notify()

    def interrupt(self, watch, reason):
        """Stop the watch's query now (another thread's request: its answer was abandoned)."""
        with self._cond:
            self._stop(watch, reason)

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
                wait = None
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
                    else:
                        wait = watch.deadline - now if wait is None else min(wait, watch.deadline - now)
                if self.memory_cap and self._baseline is not None:
                    used = sqlite_lib.memory_used()
                    if used is not None and used - self._baseline > self.memory_cap:
                        running = [w for w in self._watches.values() if w.stopped is None]
                        # one at a time: a stopped query frees its memory when its thread sees the interrupt
                        settling = any(w.stopped == "memory" for w in self._watches.values())
                        if running and not settling:
                            self._stop(max(running, key=lambda w: w.ticks), "memory")
                    wait = MEMORY_POLL_S if wait is None else min(wait, MEMORY_POLL_S)
                self._cond.wait(wait)


WATCHDOG = Watchdog()
