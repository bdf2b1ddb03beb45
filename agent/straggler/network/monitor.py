"""The agent's network thread: the node's interfaces and RDMA ports, read from sysfs into the store's
net_samples and rdma_samples rows.

One daemon thread ("straggler-net"), apart from the agent's loop and the device thread, so a slow sysfs
read (a driver that asks its firmware for a counter) never delays tracing or the GPU samples. Every
`interval_ns` it lists the interfaces and the RDMA ports again (they come and go) and writes one row for
each: the interfaces (sysfs.list_interfaces, without lo) into net_samples, the ports into rdma_samples.
The most an interface's link modes allow (ethtool) is asked once, and again after its carrier changed
(a new cable or optic). Rows go to `submit(table, rows)`, state to `set_meta(key, value)` (the
StoreWriter's methods). A failure inside one part ("net", "rdma") is recorded once in meta `net_error`
and the thread goes on with the other, and with that part at the next interval.

Absent hardware is no failure: a node without RDMA gets rdma_ports = 0 and `rdma_reason` in meta, and
nothing to say. start() returns what is not read and why, to say once: a directory that cannot be
listed, or interfaces and ports beyond the bounds.

The agent builds it, calls start() and stop(). This module must not import BCC and prints nothing.
"""
import os
import threading
import time

from ..store.schema import NET_SAMPLE_COLUMNS, RDMA_SAMPLE_COLUMNS
from ..text import one_line
from . import sysfs

META_PERIOD_NS = 5_000_000_000       # how often the thread's own CPU time goes into meta
_NET_FIELDS = NET_SAMPLE_COLUMNS[2:]     # after node, ts: named as the InterfaceSample's fields
_RDMA_FIELDS = RDMA_SAMPLE_COLUMNS[2:]   # after node, ts: named as the RdmaPortSample's fields
NOUNS = {"net": "network interfaces", "rdma": "RDMA ports"}


class NetMonitor:
    """Reads the network on its own thread; see the module doc. enabled=False reads nothing (meta says
    'turned off'); sysfs_root is /sys but for a stand-in tree (then the link modes are not asked)."""

    def __init__(self, node, submit, set_meta, interval_ns=1_000_000_000, enabled=True, sysfs_root=sysfs.SYSFS_ROOT):
        self.node, self.submit, self.set_meta = node, submit, set_meta
        self.interval_ns = int(interval_ns)
        self.enabled, self.sysfs_root = enabled, sysfs_root
        self.net_read = self.rdma_read = False
        self.interfaces = self.ports = None      # the counts last written to meta
        self.speed_max = {}                      # iface name -> (carrier_changes, speed_max_mbps)
        self.samples_written = self.rdma_samples_written = 0
        self.cpu_ns = 0                          # this thread's CPU, since start
        self.failures = {}                       # part -> the first failure's text
        self.limits_said = set()                 # parts whose 'not all read' is in meta
        self._stop = threading.Event()
        self._thread = None
        self._next_sample = self._next_meta = None

    # ---- start / stop -----------------------------------------------------------------------------
    def start(self, now_ns=None, thread=True):
        """Look at sysfs and start the thread. Returns what is not read and why, to say once:
        [("net", why), ("rdma", why)] (empty when everything there is is read)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        notices = []
        if not self.enabled:
            self.set_meta("net_state", "turned off (--no-net)")
            return notices
        net_dir = sysfs.net_dir(self.sysfs_root)
        try:
            listing = sysfs.list_interfaces(self.sysfs_root)
        except OSError as exc:
            why = f"cannot list {net_dir} ({exc.strerror or one_line(exc)}): is sysfs mounted? (--sysfs-root)"
            self.set_meta("net_state", "not read")
            self.set_meta("net_reason", why)
            notices.append(("net", why))
        else:
            self.net_read = True
            self.set_meta("net_state", "read")
            self._count("net", listing, notices)
        rdma_dir = sysfs.rdma_dir(self.sysfs_root)
        try:
            listing = sysfs.list_rdma_ports(self.sysfs_root)
        except OSError as exc:
            why = f"cannot list {rdma_dir} ({exc.strerror or one_line(exc)})"
            self.set_meta("rdma_ports", 0)
            self.set_meta("rdma_reason", why)
            notices.append(("rdma", why))
        else:
            self.rdma_read = True
            self._count("rdma", listing, notices)
            if not os.path.isdir(rdma_dir):      # absent hardware: in meta, nothing to say
                self.set_meta("rdma_reason", f"no RDMA ports ({rdma_dir} is absent)")
        self.set_meta("net_interval_ns", self.interval_ns)
        self._next_sample = self._next_meta = now_ns
        if thread and (self.net_read or self.rdma_read):
            self._thread = threading.Thread(target=self._run, name="straggler-net", daemon=True)
            self._thread.start()
        return notices

    def stop(self, timeout=10.0):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.enabled:
            self.set_meta("net_cpu_ns", self.cpu_ns)

    # ---- the thread -------------------------------------------------------------------------------
    def _run(self):
        while not self._stop.is_set():
            self.poll(time.monotonic_ns())
            self._stop.wait(max(0.0, (self._next_sample - time.monotonic_ns()) / 1e9))

    def poll(self, now_ns):
        """Do what is due at now_ns: one sample of every interface and RDMA port each interval."""
        if self._next_sample is None or now_ns < self._next_sample:   # not started (or turned off)
            return
        started = time.thread_time_ns()
        if self.net_read:
            self._guarded("net", self._sample_interfaces, now_ns)
        if self.rdma_read:
            self._guarded("rdma", self._sample_rdma, now_ns)
        self._next_sample += self.interval_ns
        if self._next_sample <= now_ns:          # fell behind (slow reads): no catching up in a burst
            self._next_sample = now_ns + self.interval_ns
        self.cpu_ns += time.thread_time_ns() - started
        if now_ns >= self._next_meta:
            self.set_meta("net_cpu_ns", self.cpu_ns)
            self._next_meta = now_ns + META_PERIOD_NS

    def _guarded(self, part, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:                 # a part never stops the thread: said once, in meta
            if part not in self.failures:
                self.failures[part] = f"{part}: {one_line(exc)}"
                self.set_meta("net_error", "; ".join(self.failures.values()))
            return None

    def _count(self, part, listing, notices=None):
        """Meta's count of a part when it changed; that some are not read, once (and to say at start)."""
        count = len(listing.entries)
        key = "net_interfaces" if part == "net" else "rdma_ports"
        if count != (self.interfaces if part == "net" else self.ports):
            self.set_meta(key, count)
            if part == "net":
                self.interfaces = count
            else:
                self.ports = count
        if listing.not_read and part not in self.limits_said:
            self.limits_said.add(part)
            order = "physical ones first, then by name" if part == "net" else "by device and port"
            why = f"{listing.not_read} of {listing.total} beyond the first {count} ({order})"
            self.set_meta(f"{part}_not_read", why)
            if notices is not None:
                notices.append((part, why))

    # ---- the parts --------------------------------------------------------------------------------
    def _sample_interfaces(self, now_ns):
        listing = sysfs.list_interfaces(self.sysfs_root)
        self._count("net", listing)
        rows = []
        for name in listing.entries:
            sample = sysfs.read_interface(name, self.sysfs_root, speed_max=False)
            known = self.speed_max.get(name)
            if known is None or known[0] != sample.carrier_changes:
                known = (sample.carrier_changes, sysfs.link_speed_max_mbps(name, self.sysfs_root))
                self.speed_max[name] = known
            sample.speed_max_mbps = known[1]
            rows.append((self.node, now_ns) + tuple(getattr(sample, field) for field in _NET_FIELDS))
        for name in set(self.speed_max) - set(listing.entries):   # gone: asked again if it comes back
            del self.speed_max[name]
        self.submit("net_samples", rows)
        self.samples_written += len(rows)

    def _sample_rdma(self, now_ns):
        listing = sysfs.list_rdma_ports(self.sysfs_root)
        self._count("rdma", listing)
        rows = []
        for device, port in listing.entries:
            sample = sysfs.read_rdma_port(device, port, self.sysfs_root)
            rows.append((self.node, now_ns) + tuple(getattr(sample, field) for field in _RDMA_FIELDS))
        self.submit("rdma_samples", rows)
        self.rdma_samples_written += len(rows)
