"""The node agent that `straggler trace` (straggler.cli.trace) runs: traces CUDA/NCCL calls,
scheduling and block I/O with BCC into the node's SQLite store, until its duration ends or
SIGTERM/SIGINT (then it flushes and returns 0).

Flow (one way): probes (bpf/, probes/) -> this loop (drain, decode, stamp ranks, aggregate per
interval) -> store/writer.py (one writer thread) -> SQLite. Every interval (AgentOptions.interval_s)
it writes the interval's aggregates, lost events, its own cost and a clock pair; every summary
interval (1 s) the step-time model's summaries (thread_time: what explain, watch and /metrics read).
Every `rescan_s` seconds it looks in /proc for new targets, scope members and CUDA libraries
(attached at once, no restart). What it has to tell its user (ready: every probe attached; a
library attached later; no CUDA library yet) goes to an AgentEvents, which the CLI renders.

Which calls get a row is straggler.probes.RECORD_RULE.
This module holds no argparse and prints nothing; it must not be imported by anything but the CLI:
it starts threads and BPF.
"""
import json
import os
import resource
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import List, Optional

from . import __version__, defaults
from .errors import StragglerError, UsageError
from .tls import TLSOptions

DRAIN_PERIOD_S = 0.05


@dataclass
class AgentOptions:
    """The settings of one agent run, checked when made (a bad value is a one-line UsageError that
    names the `straggler trace` option it comes from). Times in the units the options take."""
    node: Optional[str] = None          # None: this host's name; no ':' or spaces (event ids are NODE:SEQ)
    db: str = defaults.DB_PATH
    duration_s: Optional[float] = None  # None: until SIGTERM/SIGINT
    pids: List[int] = field(default_factory=list)          # trace these processes and their children
    comms: List[str] = field(default_factory=list)         # and processes whose name matches these globs
    cuda_libs: List[str] = field(default_factory=list)     # also attach to these libraries (made absolute)
    scope: str = "host"                 # host: every process; netns: the agent's network namespace only
    record_all: bool = False
    collective_rows: bool = True        # a row for every collective and synchronize: the steps explain lines up
    sample: int = 100                   # also record a random 1 in N of the other calls (0: none)
    slow_factor: float = 8.0            # a call >= F x the running median of its op is slow
    slow_floor_us: float = 10000.0      # a call this long is always slow
    interval_s: float = 5.0             # aggregation / cost / clock-pair interval, unit of retention
    summary_interval_s: float = 1.0     # the step-time model's summaries
    rescan_s: float = 2.0
    max_db_bytes: Optional[int] = 1 << 30   # None: no limit
    max_age_s: Optional[float] = None
    ringbuf_kb: int = 8192
    sys_ringbuf_kb: int = 4096
    listen: Optional[str] = None        # also serve the API here (ADDR:PORT)
    tls: TLSOptions = field(default_factory=TLSOptions)
    metrics_listen: Optional[str] = None
    metrics_any_address: bool = False
    gpu: bool = True                    # read the GPUs (NVML) and the kernel's Xid errors (straggler.devices)
    gpu_interval_s: float = 1.0         # sample every GPU this often (gpu_samples)
    net: bool = True                    # read the network interfaces and RDMA ports (straggler.network)
    net_interval_s: float = 1.0         # sample them this often (net_samples, rdma_samples)
    sysfs_root: str = "/sys"            # where sysfs is (a stand-in tree in tests)
    net_flows: bool = True              # trace the targets' TCP connections (net_flows; bpf/net.c)

    def __post_init__(self):
        self.node = self.node or socket.gethostname()
        if not self.node or ":" in self.node or any(c.isspace() for c in self.node):
            raise UsageError(f"--node {self.node!r}: a node name must be non-empty, without ':' or spaces "
                             "(event ids are NODE:SEQ)")
        for pid in self.pids:
            if not os.path.exists(f"/proc/{pid}"):
                raise UsageError(f"--pid {pid}: no such process; check the pid (ps -p {pid})")
        for path in self.cuda_libs:
            if not os.path.isfile(path):
                raise UsageError(f"--cuda-lib {path}: no such file; give the path of libcuda.so.1, libcudart.so.* "
                                 "or libnccl.so.*")
        self.cuda_libs = [os.path.abspath(path) for path in self.cuda_libs]
        if self.sample < 0 or self.interval_s <= 0 or self.rescan_s <= 0 or self.slow_factor <= 0 \
                or self.summary_interval_s <= 0 or self.gpu_interval_s <= 0:
            raise UsageError("--sample must be >= 0; --interval, --summary-interval, --rescan, --slow-factor and "
                             "--gpu-interval > 0")
        if self.summary_interval_s > self.interval_s:
            raise UsageError(f"--summary-interval {self.summary_interval_s:g} is longer than --interval "
                             f"{self.interval_s:g}: the summaries are the finer of the two")
        if not self.net_interval_s > 0:
            raise UsageError(f"--net-interval {self.net_interval_s:g}: give a number of seconds > 0")
        self.max_db_bytes = self.max_db_bytes or None
        self.max_age_s = self.max_age_s or None

    @property
    def slow_floor_ns(self):
        return int(self.slow_floor_us * 1000)

    @property
    def interval_ns(self):
        return int(self.interval_s * 1e9)

    @property
    def summary_ns(self):
        return int(self.summary_interval_s * 1e9)

    @property
    def gpu_interval_ns(self):
        return int(self.gpu_interval_s * 1e9)

    @property
    def net_interval_ns(self):
        return int(self.net_interval_s * 1e9)

    @property
    def max_age_ns(self):
        return int(self.max_age_s * 1e9) if self.max_age_s else None


class AgentEvents:
    """What the agent has to tell its user while it runs. This one says nothing; the CLI's renders
    each as a line on stderr (straggler.cli.trace)."""

    def ready(self, probes: int, node: str, db: str, api_url: Optional[str]):
        """Every probe is attached and the first rows are written (api_url: the API, when serving)."""

    def no_cuda_library(self, scope: str):
        """No CUDA library found at start: tracing scheduling and block I/O until a process maps one."""

    def attached(self, probes: int, library: str):
        """A library found after the start, attached (`probes` probes)."""

    def devices_not_read(self, what: str, why: str):
        """Said once at the start: no GPU is read through NVML (what='gpu') or the kernel's Xid errors are
        not (what='xid'), and why; the agent traces on without them."""

    def network_not_read(self, what: str, why: str):
        """Said once at the start: network interfaces (what='net') or RDMA ports (what='rdma') are not
        read, or not all of them, and why; the agent traces on without them."""

    def net_flows_not_traced(self, why: str):
        """Said once at the start: the TCP flows (net_flows) are not traced though asked for (this kernel
        lacks their tracepoints, or they did not load), and why; the agent traces on without them."""


class Agent:
    """One tracing run: probes + targets + writer, driven by run()."""

    def __init__(self, opts: AgentOptions, events: Optional[AgentEvents] = None):
        self.opts = opts
        self.events = events or AgentEvents()
        self.stop_requested = False
        self.processes = {}        # tgid -> ProcessInfo (targets)
        self.other_ranks = {}      # pid -> (rank, local_rank) of non-target pids (block submitters)
        self.raw_records = []
        self.scope_known = set()
        self.op_hist = {}          # op_id -> decayed histogram of all calls (for the slow threshold)
        self.thread_calls_seen = {}  # tid -> the kernel's running call totals at the last interval
        self.api = None
        self.metrics_server = None
        self.summary_cpu_ns = 0    # CPU the step-time summaries took (this thread), since the start
        self.devices = None        # the device thread (straggler.devices.monitor)
        self.network = None        # the network thread (straggler.network.monitor)
        self.net_flows = None      # the TCP flows' rows (probes/net.py), when traced

    # ---- identity --------------------------------------------------------------------------
    def rank_of(self, pid):
        info = self.processes.get(pid)
        if info is not None:
            return info.rank, info.local_rank
        ranks = self.other_ranks.get(pid)
        if ranks is None:
            from .probes.targets import read_torchrun_env
            env = read_torchrun_env(pid)
            ranks = (_int(env.get("RANK")), _int(env.get("LOCAL_RANK")))
            if len(self.other_ranks) > 50000:
                self.other_ranks.clear()
            self.other_ranks[pid] = ranks
        return ranks

    def _track(self, tgid, now_ns):
        """Make tgid a known target (BPF maps + processes table). False if it is gone already."""
        from .probes.targets import ProcessInfo, thread_ids
        if tgid in self.processes and self.processes[tgid].exited is None:
            return True
        info = ProcessInfo.read(tgid, now_ns)
        if info is None:
            return False
        self.processes[tgid] = info
        self.other_ranks.pop(tgid, None)
        self.probes.add_target(tgid, thread_ids(tgid))
        return True

    # ---- start-up -------------------------------------------------------------------------------
    def start(self):
        from .clock import read_clock_pair
        from .probes.loader import Probes, check_environment
        from .probes.records import Decoder
        from .probes.targets import TargetFinder
        from .store.writer import StoreWriter
        opts = self.opts
        check_environment()
        self.writer = StoreWriter(opts.db, opts.node, interval_ns=opts.interval_ns, max_db_bytes=opts.max_db_bytes,
                                  max_age_ns=opts.max_age_ns)
        self.finder = TargetFinder(pids=opts.pids, comm_patterns=opts.comms, scope=opts.scope)
        self.probes = Probes(call_ringbuf_kib=opts.ringbuf_kb, sys_ringbuf_kib=opts.sys_ringbuf_kb,
                             net_flows=opts.net_flows)
        self.decoder = Decoder(self.rank_of)
        self.probes.attach_tracepoints()
        self.probes.set_config(record_all=opts.record_all, record_coll=opts.collective_rows, sample_n=opts.sample,
                               scope_all=opts.scope == "host",
                               auto_target=self.finder.by_maps, notify_exec=bool(opts.comms), self_tgid=os.getpid())
        from .probes import symbols
        for op_id in range(len(symbols.OPS)):
            self.probes.set_slow_threshold(op_id, opts.slow_floor_ns)
        self.probes.open_ring_buffers(self.raw_records.append)

        now = time.monotonic_ns()
        self.started_ns = now
        self.writer.clear_probes()
        for name, library in self.probes.attached:
            self.writer.submit("probes", [(opts.node, name, library, now)])
        self._rescan(now, initial=True)
        if not self.probes.libraries:
            self.events.no_cuda_library(opts.scope)
        self._start_net_flows()
        for key, value in (("agent_version", __version__), ("agent_pid", os.getpid()), ("agent_state", "running"),
                           ("agent_started_ns", now), ("agent_interval_ns", opts.interval_ns),
                           ("agent_summary_interval_ns", opts.summary_ns),
                           ("agent_record_rule", json.dumps({"record_all": opts.record_all,
                                                             "collective_rows": opts.collective_rows,
                                                             "sample": opts.sample,
                                                             "slow_factor": opts.slow_factor,
                                                             "slow_floor_ns": opts.slow_floor_ns}))):
            self.writer.set_meta(key, value)
        mono, real = read_clock_pair()
        self.writer.submit("clock_pairs", [(opts.node, mono, real)])
        self.writer.start()
        self._start_devices()
        self._start_network()
        if opts.listen:
            self._start_api()
        if opts.metrics_listen:
            from .api.metrics import start_plain_server
            self.metrics_server, _ = start_plain_server(opts.db, opts.node, opts.metrics_listen,
                                                        opts.metrics_any_address)
        self.writer.set_meta("agent_ready_ns", time.monotonic_ns())
        self.writer.flush(timeout=10)
        if self.writer.error:
            raise StragglerError(self.writer.error)
        self.events.ready(self.probes.probe_count, opts.node, opts.db,
                          getattr(self.api, "url", opts.listen) if self.api is not None else None)

    def _start_devices(self):
        """The device thread: NVML samples, which process uses which GPU, Xid errors (straggler.devices)."""
        from .devices.monitor import DeviceMonitor
        opts = self.opts
        self.devices = DeviceMonitor(opts.node, self.writer.submit, self.writer.set_meta,
                                     interval_ns=opts.gpu_interval_ns, counters_ns=opts.interval_ns,
                                     pids=self._live_targets, rank_of=lambda pid: self.rank_of(pid)[0],
                                     enabled=opts.gpu)
        for what, why in self.devices.start():
            self.events.devices_not_read(what, why)

    def _start_network(self):
        """The network thread: the interfaces' and RDMA ports' state and counters (straggler.network)."""
        from .network.monitor import NetMonitor
        opts = self.opts
        self.network = NetMonitor(opts.node, self.writer.submit, self.writer.set_meta,
                                  interval_ns=opts.net_interval_ns, enabled=opts.net, sysfs_root=opts.sysfs_root)
        for what, why in self.network.start():
            self.events.network_not_read(what, why)

    def _start_net_flows(self):
        """The TCP flows (bpf/net.c -> net_flows), when compiled in; meta says whether and why not."""
        state = self.probes.net_state
        if state == "on":
            from .probes.net import NetFlows
            self.net_flows = NetFlows(self.opts.node, lambda pid: self.rank_of(pid)[0])
            self.writer.set_meta("net_probe_state", "traced")
        elif state == "off":
            self.writer.set_meta("net_probe_state", "turned off (--no-net-flows)")
        else:
            self.writer.set_meta("net_probe_state", "not traced")
            self.writer.set_meta("net_probe_reason", self.probes.net_reason)
            self.events.net_flows_not_traced(self.probes.net_reason)

    def _live_targets(self):
        return [tgid for tgid, info in list(self.processes.items()) if info.exited is None]

    def _start_api(self):
        try:
            from .api import server as api_server
        except ImportError as exc:
            raise StragglerError(f"--listen needs the API module ({exc}): update straggler, or run "
                                 "`straggler serve` separately") from None
        self.api = api_server.start_background(self.opts.db, self.opts.node, self.opts.listen, self.opts.tls)

    # ---- periodic work --------------------------------------------------------------------------
    def _rescan(self, now_ns, initial=False):
        from .probes import symbols
        scope, targets, libraries = self.finder.scan(known_targets=self.probes.target_tgids())
        if scope is not None:
            self.probes.add_in_scope(scope - self.scope_known)
            # gone from /proc: the kernel removed them; still there but elsewhere now: remove
            self.probes.remove_in_scope({pid for pid in self.scope_known - scope if os.path.exists(f"/proc/{pid}")})
            self.scope_known = scope
            targets &= scope
        for tgid in sorted(targets):
            self._track(tgid, now_ns)
        candidates = list(self.opts.cuda_libs) if initial else []
        # The usual install paths are the machine's own: with --scope host they are the libraries
        # jobs will map, so attach them up front. In a narrower scope (a container, a test-bed host)
        # they may be nobody's, and every probe costs a kernel grace period when it is detached
        # (serialised, ~0.1 s each here), so only the libraries that processes in scope map count.
        if self.opts.scope == "host":
            candidates += symbols.libraries_in_install_paths()
        candidates += list(libraries)
        for path in candidates:
            try:
                attached = self.probes.attach_library(path)
            except OSError:
                continue
            if attached:
                self.writer.submit("probes", [(self.opts.node, name, lib, now_ns)
                                              for name, lib in self.probes.attached if lib == path]
                                   + [(self.opts.node, name, lib, None) for name, lib in self.probes.missing if lib == path])
                if not initial:
                    self.events.attached(attached, path)
        if initial:
            for path in self.opts.cuda_libs:
                identity = symbols.file_identity(path)
                if identity in self.probes.failed_libraries:
                    raise StragglerError(f"--cuda-lib {path}: {self.probes.failed_libraries[identity]}; "
                                         "give a libcuda/libcudart/libnccl library")

    def _recheck_scope(self, tgid):
        """After a setns: is the process in our network namespace now (or not any more)?"""
        if self.opts.scope != "netns":
            return
        if self.finder.in_scope(tgid):
            if tgid not in self.scope_known:
                self.probes.add_in_scope([tgid])
                self.scope_known.add(tgid)
        elif tgid in self.scope_known:
            self.probes.remove_in_scope([tgid])
            self.scope_known.discard(tgid)

    def _handle_notices(self, notices):
        from .probes.records import PROC_EXEC, PROC_EXIT, PROC_FORK, PROC_NEW, PROC_SETNS
        for what, tgid, parent, comm, ts in notices:
            if what == PROC_SETNS:
                self._recheck_scope(tgid)
            elif what in (PROC_NEW, PROC_FORK):
                self._track(tgid, ts)
            elif what == PROC_EXEC:
                self.other_ranks.pop(tgid, None)     # read before the exec: its environment may have changed
                if tgid in self.processes:
                    self.processes.pop(tgid)
                    self._track(tgid, ts)
                elif self.opts.comms and self.finder.in_scope(tgid):
                    from .probes.targets import read_stat
                    stat = read_stat(tgid)
                    if stat and self.finder._comm_matches(tgid, stat[0]):
                        self._track(tgid, ts)
            elif what == PROC_EXIT:
                info = self.processes.get(tgid)
                if info is not None:
                    info.exited = ts
                    info.last_seen = ts
                    info.dirty = True

    def _drain(self):
        self.probes.drain()
        if not self.raw_records:
            return
        raw, self.raw_records[:] = list(self.raw_records), []
        rows, notices = self.decoder.decode(raw)
        if notices:
            self._handle_notices(notices)
            rows = self._restamp(rows, notices)
        self.writer.submit_events(rows)

    def _restamp(self, rows, notices):
        """The rank of rows decoded before this batch's notices were handled. A process that a target
        forked (or that called CUDA before the agent knew it) was read while it still had its parent's
        environment, or not at all: its rows would carry no rank, or the parent's. Now that its notice is
        handled (its environment re-read): rows after its exec get the rank it has after the exec,
        whatever was stamped; rows of a new process without a rank get its rank."""
        from .probes.records import PROC_EXEC, PROC_FORK, PROC_NEW
        execs, new = {}, set()
        for what, tgid, _parent, _comm, ts in notices:
            if what == PROC_EXEC:
                execs[tgid] = min(execs.get(tgid, ts), ts)
            elif what in (PROC_NEW, PROC_FORK):
                new.add(tgid)
        if not execs and not new:
            return rows
        out = []
        for row in rows:
            tgid = row[4]
            exec_ts = execs.get(tgid)
            if (exec_ts is not None and row[7] >= exec_ts) or (row[0] is None and tgid in new):
                rank, local_rank = self.rank_of(tgid)
                if (rank, local_rank) != (row[0], row[1]):
                    row = (rank, local_rank) + row[2:]
            out.append(row)
        return out

    def _update_slow_thresholds(self, harvested):
        opts = self.opts
        per_op = {}
        for (_tgid, op_id), (count, _sum, _max, hist) in harvested.items():
            acc = per_op.setdefault(op_id, [0] * len(hist))
            for i, n in enumerate(hist):
                acc[i] += n
        for op_id, hist in per_op.items():
            decayed = self.op_hist.get(op_id)
            decayed = [n + 0.5 * d for n, d in zip(hist, decayed)] if decayed else [float(n) for n in hist]
            self.op_hist[op_id] = decayed
        for op_id, decayed in self.op_hist.items():
            total = sum(decayed)
            threshold = opts.slow_floor_ns
            if total >= 20:
                running, median_ns = 0.0, None
                for bucket, n in enumerate(decayed):
                    running += n
                    if running >= total / 2:
                        median_ns = int((1 << bucket) * 1.41421356)  # the bucket's geometric middle
                        break
                if median_ns is not None:
                    threshold = min(threshold, int(opts.slow_factor * median_ns))
            self.probes.set_slow_threshold(op_id, max(1, threshold))

    def _interval(self, interval_start, now_ns):
        """Close the interval [interval_start, +interval): aggregates, lost, cost, clock, processes."""
        from .clock import read_clock_pair
        from .probes import symbols
        from .probes.records import trim_hist
        opts, node, length = self.opts, self.opts.node, self.opts.interval_ns
        old_gen = self.probes.flip_generation()
        self._drain()
        harvested = self.probes.harvest_aggregates(old_gen)
        rows = []
        for (tgid, op_id), (count, total, longest, hist) in sorted(harvested.items()):
            op = symbols.OPS[op_id]
            rows.append((node, interval_start, length, tgid, self.rank_of(tgid)[0], symbols.OP_SOURCE[op], op,
                         count, total, longest, json.dumps(trim_hist(hist))))
        for (pid, source, op), (count, total, longest, hist) in sorted(self.decoder.take_aggregates().items()):
            rows.append((node, interval_start, length, pid, self.rank_of(pid)[0], source, op, count, total, longest,
                         json.dumps(trim_hist(hist))))
        self.writer.submit("aggregates", rows)
        self._update_slow_thresholds(harvested)
        if self.net_flows is not None:   # one row per connection and process with anything in the interval
            self.writer.submit("net_flows", self.net_flows.rows(interval_start, length,
                                                                self.probes.read_net_flows(old_gen)))

        lost = self.probes.lost_totals()
        lost["writer:queue"] = self.writer.dropped_events
        lost_rows = []
        for probe, total in lost.items():
            delta = total - self.last_lost.get(probe, 0)
            if delta > 0:
                lost_rows.append((node, probe, interval_start, length, delta))
        self.last_lost = lost
        self.writer.submit("lost_events", lost_rows)

        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        hits = sum(self.probes.hit_totals())
        written = self.writer.events_written
        self.writer.submit("agent_cost", [(node, interval_start, length, round(cpu - self.last_cpu, 6),
                                           hits - self.last_hits, written - self.last_written, _rss_bytes())])
        self.last_cpu, self.last_hits, self.last_written = cpu, hits, written

        mono, real = read_clock_pair()
        self.writer.submit("clock_pairs", [(node, mono, real)])
        process_rows = []
        for tgid, info in list(self.processes.items()):
            if info.exited is None:
                info.last_seen = now_ns
                process_rows.append(info.row(node))
            elif info.dirty:
                process_rows.append(info.row(node))
            elif now_ns - info.exited > 2 * length:
                del self.processes[tgid]  # its last events are written by now
            info.dirty = False
        self.writer.submit("processes", process_rows)
        self.writer.set_meta("agent_heartbeat_ns", now_ns)
        self.writer.set_meta("agent_summary_cpu_ns", self.summary_cpu_ns)

    def _summary(self, summary_start):
        """Close a summary interval: the step-time model's rows (thread_time) since the last one.
        Its own CPU (this thread's) is added up in meta agent_summary_cpu_ns, for status and bench."""
        started = time.thread_time_ns()   # the loop drained the ring buffers just before
        self.writer.submit("thread_time", self._thread_time_rows(summary_start, self.opts.summary_ns))
        self.writer.roll_up(summary_start + self.opts.summary_ns)     # each minute's thread_rollup, as it closes
        self.summary_cpu_ns += time.thread_time_ns() - started

    def _thread_time_rows(self, interval_start, length):
        """The step-time model's rows for this interval: per traced thread, the call time by class
        (differences of the kernel's running totals) joined with the sched/block part (decoder)."""
        totals = self.probes.read_thread_calls()
        sched = self.decoder.thread_time.take()
        rows, previous = [], self.thread_calls_seen
        keys = set(sched)
        deltas = {}
        for tid, (tgid, ns, count) in totals.items():
            before = previous.get(tid)
            if before is None or before[0] != tgid:
                before = (tgid, [0] * len(ns), [0] * len(count))
            d_ns = [a - b for a, b in zip(ns, before[1])]
            d_count = [a - b for a, b in zip(count, before[2])]
            if any(d_count):
                deltas[(tgid, tid)] = (d_ns, sum(d_count))
                keys.add((tgid, tid))
        self.thread_calls_seen = totals
        gone = [tid for tid, (tgid, _ns, _count) in totals.items()
                if tgid not in self.processes or self.processes[tgid].exited is not None]
        if gone:
            self.probes.forget_threads(gone)
            for tid in gone:
                self.thread_calls_seen.pop(tid, None)
        node = self.opts.node
        for tgid, tid in sorted(keys):
            d_ns, calls = deltas.get((tgid, tid), ([0, 0, 0, 0], 0))
            t = sched.get((tgid, tid)) or {}
            comm = t.get("comm") or _thread_comm(tgid, tid)
            rows.append((node, interval_start, length, tgid, tid, self.rank_of(tgid)[0], comm, calls,
                         d_ns[1], d_ns[2], d_ns[3], t.get("runq_ns", 0), t.get("runq_work_ns", 0),
                         t.get("runq_sync_ns", 0), t.get("runq_coll_ns", 0), t.get("blocked_ns", 0),
                         t.get("io_ns", 0), json.dumps(t["thieves"]) if t.get("thieves") else None))
        return rows

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        opts = self.opts
        self.last_lost, self.last_hits, self.last_written = {}, 0, 0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.last_cpu = usage.ru_utime + usage.ru_stime
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            self.last_hits = sum(self.probes.hit_totals())
            deadline = time.monotonic_ns() + int(opts.duration_s * 1e9) if opts.duration_s else None
            interval_start = time.monotonic_ns() // opts.interval_ns * opts.interval_ns
            summary_start = time.monotonic_ns() // opts.summary_ns * opts.summary_ns
            next_rescan = time.monotonic() + opts.rescan_s
            while not self.stop_requested:
                time.sleep(DRAIN_PERIOD_S)
                self._drain()
                now_ns = time.monotonic_ns()
                if now_ns >= summary_start + opts.summary_ns:
                    self._summary(summary_start)
                    summary_start = now_ns // opts.summary_ns * opts.summary_ns
                if now_ns >= interval_start + opts.interval_ns:
                    self._interval(interval_start, now_ns)
                    interval_start = now_ns // opts.interval_ns * opts.interval_ns
                if time.monotonic() >= next_rescan:
                    self._rescan(now_ns)
                    next_rescan = time.monotonic() + opts.rescan_s
                if self.writer.error:
                    raise StragglerError(self.writer.error)
                if deadline and now_ns >= deadline:
                    break
            self._summary(summary_start)
            self._interval(interval_start, time.monotonic_ns())
            self.writer.set_meta("agent_state", "stopped")
            self.writer.set_meta("agent_stopped_ns", time.monotonic_ns())
            return 0
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, _frame):
        self.stop_requested = True

    def _shutdown(self):
        if self.metrics_server is not None:
            try:
                self.metrics_server.shutdown()
                self.metrics_server.server_close()
            except Exception:
                pass
        if self.api is not None:
            try:
                self.api.stop()
            except Exception:
                pass
        if self.devices is not None:   # before the writer: its last rows and meta go in
            self.devices.stop()
        if self.network is not None:   # so too the network thread's
            self.network.stop()
        writer = getattr(self, "writer", None)
        if writer is not None:
            writer.stop()
        probes = getattr(self, "probes", None)
        if probes is not None:
            probes.close()


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _thread_comm(tgid, tid):
    try:
        with open(f"/proc/{tgid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None

