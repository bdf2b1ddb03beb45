"""The server's shared limits as counters: the memory of answers in flight (AnswerMemory) and
each client's fair share of connections and of work in each pool (ClientShares).

AnswerMemory: every byte of an answer that is made and not yet written to its socket is reserved
here (query answers row by row as they are encoded, the other answers whole); a reservation that
does not fit waits (bounded) for writers to release, then fails. Thread-safe: worker threads
reserve, the event loop releases.

ClientShares: a client is its certificate (issuer and serial; the peer address for plain HTTP on
loopback). Over its share the server answers 429 with one line. Used from the event loop only.

No sockets, no HTTP, no SQL here.
"""
import collections
import threading
import time

DEFAULT_MAX_INFLIGHT_BYTES = 192 << 20      # answers made and not yet written, all requests together
MAX_CONNECTIONS_PER_CLIENT = 32
MAX_QUERIES_PER_CLIENT = 2                  # the query pool (POST /api/v1/query) at once, per client
MAX_LIGHT_PER_CLIENT = 3                    # the light pool (clock, health, live, metrics) at once, per client


class AnswerMemory:
    """At most `capacity` bytes of answers held at once."""

    def __init__(self, capacity=DEFAULT_MAX_INFLIGHT_BYTES):
        self.capacity = int(capacity)
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()

    def reserve(self, nbytes, wait_s=0.0):
        """Take nbytes, waiting up to wait_s for room; False when none came. A request bigger than the
        whole capacity is granted when nothing else is held (one answer can always go out, alone)."""
        end = time.monotonic() + max(0.0, wait_s)
        with self._cond:
            while self.used + nbytes > self.capacity and self.used > 0:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self._take(nbytes)
            return True

    def force(self, nbytes):
        """Take nbytes whatever is held (the small head and tail of an answer, a row's last bytes)."""
        with self._cond:
            self._take(nbytes)

    def _take(self, nbytes):
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def release(self, nbytes):
        if nbytes <= 0:
            return
        with self._cond:
            self.used = max(0, self.used - nbytes)
            self._cond.notify_all()


class ClientShares:
    """Open connections and running requests per client, against the caps."""

    def __init__(self, max_connections=MAX_CONNECTIONS_PER_CLIENT, max_in_pool=None):
        self.max_connections = int(max_connections)
        self.max_in_pool = dict(max_in_pool or {"query": MAX_QUERIES_PER_CLIENT, "light": MAX_LIGHT_PER_CLIENT})
        self.connections = collections.Counter()
        self.running = collections.Counter()     # (client, pool) -> requests

    def open(self, client):
        """Count a new connection of `client`; False (nothing counted) when it already has its share."""
        if self.connections[client] >= self.max_connections:
            return False
        self.connections[client] += 1
        return True

    def close(self, client):
        self.connections[client] -= 1
        if self.connections[client] <= 0:
            del self.connections[client]

    def start(self, client, pool):
        """Count a request of `client` in `pool`; False when it already runs its share there."""
        cap = self.max_in_pool.get(pool)
        if cap is not None and self.running[(client, pool)] >= cap:
            return False
        self.running[(client, pool)] += 1
        return True

    def end(self, client, pool):
        key = (client, pool)
        self.running[key] -= 1
        if self.running[key] <= 0:
            del self.running[key]
