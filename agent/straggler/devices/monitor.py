"""The agent's device thread: NVML samples, process -> GPU mapping and Xid errors, into the store's rows.

One daemon thread ("straggler-gpu"), apart from the agent's loop, so a slow NVML call (PCIe throughput
takes 20 ms a GPU on real hardware) or a flood of kernel messages never delays tracing. Every
`interval_ns` it samples each GPU (gpu_samples); every `counters_ns` it re-reads the slow counters and
maps processes to GPUs (gpu_processes: NVML's compute processes, and the /dev/nvidiaN files of the
agent's traced processes) and counts kernel log records lost; about every KMSG_PERIOD_S it reads the
new kernel log records, a bounded number at a time (gpu_errors). Rows go to `submit(table, rows)`,
state to `set_meta(key, value)` (the StoreWriter's methods). A failure inside one part is recorded in
meta `devices_error` and the thread goes on.

The agent builds it, calls start() (which returns what is not read and why, to say once) and stop().
This module must not import BCC and prints nothing.
"""
import errno
import threading
import time

from ..store.schema import GPU_SAMPLE_COLUMNS
from ..text import one_line
from .nvml import Nvml, NvmlUnavailable
from .procmap import nvidia_minors_open
from .xid import KmsgReader, parse_gpu_at, parse_xid

KMSG_PERIOD_S = 0.25             # how often the kernel log is read (and the longest the thread sleeps)
KMSG_RECORDS_PER_READ = 2000     # the most records one read takes before the thread yields
_SAMPLE_COLUMNS = GPU_SAMPLE_COLUMNS[3:]


class DeviceMonitor:
    """Reads the devices on its own thread; see the module doc. `pids()` gives the traced processes (for
    their /dev/nvidiaN files), `rank_of(pid)` a process's RANK or None; enabled=False reads nothing
    (meta says 'turned off')."""

    def __init__(self, node, submit, set_meta, interval_ns=1_000_000_000, counters_ns=5_000_000_000,
                 pids=lambda: (), rank_of=lambda pid: None, enabled=True, kmsg_path="/dev/kmsg",
                 proc_root="/proc", nvml_factory=Nvml):
        self.node, self.submit, self.set_meta = node, submit, set_meta
        self.interval_ns, self.counters_ns = int(interval_ns), int(counters_ns)
        self.pids, self.rank_of = pids, rank_of
        self.enabled, self.kmsg_path, self.proc_root = enabled, kmsg_path, proc_root
        self.nvml_factory = nvml_factory
        self.nvml = None
        self.kmsg = None
        self.nvml_reason = self.xid_reason = None
        self.by_bus = {}                 # bus_key -> Gpu (NVML)
        self.by_minor = {}               # /dev/nvidiaN minor -> Gpu
        self.uuid_at_bus = {}            # bus_key -> uuid, from the driver's 'GPU at PCI:' lines
        self.process_first_seen = {}     # (pid, gpu, how) -> first_seen ns
        self.samples_written = self.errors_written = 0
        self.cpu_ns = 0                  # this thread's CPU, since start
        self.failures = {}               # part -> the first failure's text
        self._stop = threading.Event()
        self._thread = None
        self._lost_reported = 0
        self._last_counters = self._next_sample = self._next_counters = None

    # ---- start / stop -----------------------------------------------------------------------------
    def start(self, now_ns=None, thread=True):
        """Open NVML and the kernel log; start the thread. Returns what is not read and why, to say once:
        [("gpu", why), ("xid", why)] (empty when both are read)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        notices = []
        if self.enabled:
            nvml = self.nvml_factory()
            try:
                nvml.open()
            except NvmlUnavailable as exc:
                self.nvml_reason = str(exc)
            else:
                self.nvml = nvml
                for gpu in nvml.gpus:
                    gpu.first_seen = now_ns
                    if gpu.bus_key:
                        self.by_bus[gpu.bus_key] = gpu
                    if gpu.minor is not None:
                        self.by_minor[gpu.minor] = gpu
        else:
            self.nvml_reason = "turned off (--no-gpu)"
        if self.nvml is not None:
            gpus = self.nvml.gpus
            self.set_meta("devices_state", "read")
            self.set_meta("devices_gpus", len(gpus))
            self.set_meta("devices_interval_ns", self.interval_ns)
            if self.nvml.driver_version:
                self.set_meta("devices_driver", self.nvml.driver_version)
            self.submit("gpus", [(self.node, g.index, g.uuid, g.name, g.pci_bus_id, g.minor, now_ns, now_ns)
                                 for g in gpus])
        else:
            self.set_meta("devices_state", "not read")
            self.set_meta("devices_reason", self.nvml_reason)
            if self.enabled:           # turned off on purpose: nothing to say
                notices.append(("gpu", self.nvml_reason))
        if self.enabled:
            self.kmsg = KmsgReader(self.kmsg_path, max_records=KMSG_RECORDS_PER_READ)
            try:
                self.kmsg.open()
            except OSError as exc:
                self.kmsg = None
                hint = "run the agent as root" if exc.errno in (errno.EACCES, errno.EPERM) else \
                    "this node (or container) shows no kernel log"
                self.xid_reason = f"cannot read {self.kmsg_path} ({exc.strerror}): {hint}"
                notices.append(("xid", self.xid_reason))
        else:
            self.xid_reason = "turned off (--no-gpu)"
        self.set_meta("xid_state", "read" if self.kmsg is not None else "not read")
        if self.xid_reason:
            self.set_meta("xid_reason", self.xid_reason)
        self._next_sample = now_ns
        self._next_counters = now_ns
        self._last_counters = now_ns
        if thread and (self.nvml is not None or self.kmsg is not None):
            self._thread = threading.Thread(target=self._run, name="straggler-gpu", daemon=True)
            self._thread.start()
        return notices

    def stop(self, timeout=10.0):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.set_meta("devices_cpu_ns", self.cpu_ns)
        if self.nvml is not None:
            self.nvml.close()
        if self.kmsg is not None:
            self.kmsg.close()

    # ---- the thread -------------------------------------------------------------------------------
    def _run(self):
        while not self._stop.is_set():
            more = self.poll(time.monotonic_ns())
            if more:
                self._stop.wait(0.01)    # the log has more: read on after a breath
                continue
            wait = KMSG_PERIOD_S
            if self.nvml is not None:
                wait = min(wait, max(0.0, (self._next_sample - time.monotonic_ns()) / 1e9))
            self._stop.wait(wait)

    def poll(self, now_ns):
        """Do what is due at now_ns. True when the kernel log has more records waiting."""
        started = time.thread_time_ns()
        more = False
        if self.kmsg is not None:
            more = self._guarded("xid", self._read_xid)
        if self.nvml is not None and now_ns >= self._next_sample:
            counters = now_ns >= self._next_counters
            self._guarded("sample", self._sample, now_ns, counters)
            self._next_sample += self.interval_ns
            if self._next_sample <= now_ns:        # fell behind (slow calls): no catching up in a burst
                self._next_sample = now_ns + self.interval_ns
        if now_ns >= self._next_counters:
            self._guarded("processes", self._map_processes, now_ns)
            self._report_lost(now_ns)
            self._next_counters = now_ns + self.counters_ns
            self._last_counters = now_ns
            self.set_meta("devices_cpu_ns", self.cpu_ns)
        self.cpu_ns += time.thread_time_ns() - started
        return bool(more)

    def _guarded(self, part, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:         # a device never stops the thread: said once, in meta
            if part not in self.failures:
                self.failures[part] = f"{part}: {one_line(exc)}"
                self.set_meta("devices_error", "; ".join(self.failures.values()))
            return None

    # ---- the parts --------------------------------------------------------------------------------
    def _sample(self, now_ns, counters):
        rows = []
        for gpu in self.nvml.gpus:
            values = self.nvml.sample(gpu, counters=counters)
            rows.append((self.node, now_ns, gpu.index) + tuple(values.get(c) for c in _SAMPLE_COLUMNS))
        self.submit("gpu_samples", rows)
        self.samples_written += len(rows)

    def _map_processes(self, now_ns):
        seen = {}                        # (pid, gpu, how) -> (uuid, memory)
        if self.nvml is not None:
            for gpu in self.nvml.gpus:
                for pid, memory in self.nvml.compute_processes(gpu):
                    seen[(pid, gpu.index, "nvml")] = (gpu.uuid, memory)
        for pid in list(self.pids()):
            for minor in nvidia_minors_open(pid, self.proc_root):
                gpu = self.by_minor.get(minor)
                index = gpu.index if gpu is not None else minor
                seen[(pid, index, "fd")] = (gpu.uuid if gpu is not None else None, None)
        rows = []
        for key, (uuid, memory) in sorted(seen.items()):
            first = self.process_first_seen.setdefault(key, now_ns)
            pid, index, how = key
            rows.append((self.node, pid, index, uuid, self.rank_of(pid), how, memory, first, now_ns))
        for key in list(self.process_first_seen):
            if key not in seen:          # gone: its last row keeps its last_seen; a return is a new row
                del self.process_first_seen[key]
        self.submit("gpu_processes", rows)
        if self.nvml is not None:
            self.submit("gpus", [(self.node, g.index, g.uuid, g.name, g.pci_bus_id, g.minor, g.first_seen, now_ns)
                                 for g in self.nvml.gpus])

    def _read_xid(self):
        records, more = self.kmsg.read_new()
        rows = []
        for record in records:
            at = parse_gpu_at(record.message)
            if at is not None:
                self.uuid_at_bus[at[0]] = at[1]
                continue
            xid = parse_xid(record.message)
            if xid is None:
                continue
            gpu = self.by_bus.get(xid.pci_bus_id)
            uuid = gpu.uuid if gpu is not None else self.uuid_at_bus.get(xid.pci_bus_id)
            rows.append((self.node, record.ts_ns, gpu.index if gpu is not None else None, xid.pci_bus_id, uuid,
                         xid.xid, xid.meaning, xid.pid, xid.process, xid.gpu_instance, xid.compute_instance,
                         "kernel" if record.facility == 0 else "user", record.seq, xid.message))
        if rows:
            self.submit("gpu_errors", rows)
            self.errors_written += len(rows)
        return more

    def _report_lost(self, now_ns):
        if self.kmsg is None:
            return
        lost = self.kmsg.records_lost - self._lost_reported
        if lost > 0:
            self.submit("lost_events", [(self.node, "kmsg", self._last_counters, max(1, now_ns - self._last_counters),
                                         lost)])
            self._lost_reported = self.kmsg.records_lost
