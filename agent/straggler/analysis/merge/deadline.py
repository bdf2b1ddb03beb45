"""merge's time limit (--deadline): a progress handler SQLite calls inside long statements, and a
check between steps; past it the merge stops with one line and writes nothing.

Must not do anything but keep time: the steps it limits live in vetting, the copy and merge().
"""
import math
import time

from .errors import MergeError

DEFAULT_DEADLINE_S = 1800.0
PROGRESS_OPS = 10_000               # SQLite VM steps between two deadline checks


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
