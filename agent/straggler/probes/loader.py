"""BCC side of the agent: compile bpf/*.c as one program, attach, and read/write its maps.

`Probes` owns the BPF object. It compiles cuda.c + sched.c + block.c (+ net.c, where the kernel
has the TCP tracepoints) once (seconds of CPU), attaches the tracepoints, and attaches
uprobes/uretprobes to each CUDA/NCCL library it is given (by path + symbol name; the stand-in and
the real libraries the same way, also after start-up). It exposes the maps user space maintains
(targets, scope, config, slow thresholds) and reads the counters (aggregates, TCP flows, hits,
lost). Draining the ring buffers hands raw fixed-size records to a callback; decoding them is
records.py's job.

This module must not touch SQLite or /proc scanning policy; it only talks to the kernel.
"""
import ctypes
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import StragglerError
from . import symbols

NBUCKETS = 40  # bpf/cuda.c
HIT_NAMES = ["uprobe", "uretprobe", "sched", "block", "proc", "net"]
# lost[] index -> the probe whose ring-buffer write failed (the name used in lost_events.probe);
# net_flows:map_full: a connection, or an interval's counters of one, not counted (net.c's tables full)
LOST_PROBES = ["uretprobe:cuda_calls", "tracepoint:sched:sched_switch", "tracepoint:block:block_rq_complete",
               "tracepoint:sched:process", "net_flows:map_full"]
# bpf/net.c (table net_flows): optional. Where one is missing (sock_send_length and sock_recv_length
# came with Linux 6.3) net.c is left out and everything else is traced (Probes.net_state says why).
NET_TIMED_CALLS = ("sendto", "recvfrom", "sendmsg", "recvmsg")  # bpf/net.c: the send/recv calls it times
NET_TRACEPOINTS = [
    "sock:sock_send_length", "sock:sock_recv_length", "sock:inet_sock_set_state", "tcp:tcp_probe",
    "tcp:tcp_retransmit_skb", "tcp:tcp_cong_state_set",
] + [f"syscalls:sys_{edge}_{call}" for call in NET_TIMED_CALLS for edge in ("enter", "exit")]
TRACEPOINTS = [
    "sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new", "task:task_newtask",
    "sched:sched_process_exec", "sched:sched_process_exit",
    "block:block_bio_queue", "block:block_split", "block:block_bio_backmerge", "block:block_bio_frontmerge",
    "block:block_rq_issue", "block:block_rq_complete",
    "syscalls:sys_exit_setns",
] + NET_TRACEPOINTS
AF_INET, AF_INET6 = 2, 10      # net_socks.family (bpf/net.c)
TRACEFS_ROOTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


@dataclass
class NetCounters:
    """One connection's counters over one interval, as bpf/net.c counted them for one process.
    Addresses are raw: 4 bytes (AF_INET) or 16 (AF_INET6), empty while unknown (family 0)."""
    sk: int
    tgid: int
    family: int
    local_addr: bytes
    local_port: int
    peer_addr: bytes
    peer_port: int
    tx_bytes: int = 0
    rx_bytes: int = 0
    tx_calls: int = 0
    rx_calls: int = 0
    errors: int = 0
    retransmits: int = 0
    rtt_samples: int = 0
    srtt_sum_us: int = 0
    tx_ns: int = 0             # time in the calls that sent (received) data
    rx_ns: int = 0
    srtt_max_us: int = 0
    cwnd_min: int = 0          # 0: no reading
    recoveries: int = 0        # entries into CWR, Recovery or Loss: the kernel reacting to a loss
    opened: int = 0
    closed: int = 0


def bpf_source_dir() -> Path:
    """Where bpf/*.c are: $STRAGGLER_BPF_DIR, the source tree, or <prefix>/share/straggler/bpf."""
    candidates = []
    if os.environ.get("STRAGGLER_BPF_DIR"):
        candidates.append(Path(os.environ["STRAGGLER_BPF_DIR"]))
    here = Path(__file__).resolve()
    candidates += [here.parents[3] / "bpf", here.parent / "bpf"]
    import sys
    candidates.append(Path(sys.prefix) / "share" / "straggler" / "bpf")
    for candidate in candidates:
        if (candidate / "cuda.c").is_file() and (candidate / "common.h").is_file():
            return candidate
    raise StragglerError(
        f"the BPF sources (bpf/cuda.c) were not found in {', '.join(map(str, candidates))}: "
        "set STRAGGLER_BPF_DIR to the repository's bpf/ directory")


def _pages(kib: int) -> int:
    """Ring buffer size in pages: a power of two, at least one page."""
    pages = max(1, (int(kib) * 1024) // 4096)
    return 1 << (pages.bit_length() - 1)


def check_environment():
    """One-line, actionable errors for what would make BCC fail later with a wall of text."""
    if os.geteuid() != 0:
        raise StragglerError("tracing needs root (eBPF needs CAP_BPF and CAP_PERFMON): run it with sudo")
    try:
        import bcc  # noqa: F401
    except Exception as exc:  # ImportError, or a broken libbcc
        raise StragglerError(
            f"BCC's Python bindings cannot be imported ({exc}): apt-get install python3-bpfcc and run from a "
            "venv made with --system-site-packages (make setup does both)") from None
    if not os.path.exists("/sys/kernel/tracing/events") and not os.path.exists("/sys/kernel/debug/tracing/events"):
        os.makedirs("/sys/kernel/tracing", exist_ok=True)
        if os.system("mount -t tracefs nodev /sys/kernel/tracing >/dev/null 2>&1") != 0:
            raise StragglerError("tracefs is not mounted and mounting it failed: run "
                                 "'mount -t tracefs nodev /sys/kernel/tracing' (the kernel needs CONFIG_TRACING)")
    release = platform.release()
    header_paths = [f"/lib/modules/{release}/build/include/linux/kconfig.h",
                    f"/lib/modules/{release}/source/include/linux/kconfig.h", "/sys/kernel/kheaders.tar.xz"]
    if not os.environ.get("BCC_KERNEL_SOURCE") and not any(os.path.exists(p) for p in header_paths):
        raise StragglerError(
            f"kernel headers for {release} not found (BCC compiles against them): install linux-headers-{release}, "
            "or run make setup (it links Debian's generic headers when the exact ones do not exist)")
    for tracepoint in missing_tracepoints([tp for tp in TRACEPOINTS if tp not in NET_TRACEPOINTS]):
        raise StragglerError(f"tracepoint {tracepoint} is missing in this kernel: it needs CONFIG_BPF_EVENTS "
                             "and the scheduler/block tracepoints")


def _tracepoint_dir(tracepoint):
    category, event = tracepoint.split(":")
    for root in TRACEFS_ROOTS:
        path = Path(root) / "events" / category / event
        if path.exists():
            return path
    return None


def missing_tracepoints(tracepoints):
    """Those of `tracepoints` ('category:event') this kernel does not have."""
    return [tp for tp in tracepoints if _tracepoint_dir(tp) is None]


def _net_cflags():
    """tcp_retransmit_skb has an `err` field (failed attempts fire it too) on newer kernels only."""
    path = _tracepoint_dir("tcp:tcp_retransmit_skb")
    try:
        has_err = path is not None and " err;" in (path / "format").read_text()
    except OSError:
        has_err = False
    return ["-DNET_RETRANSMIT_ERR"] if has_err else []


def program_text(bpf_dir, files):
    """The one BCC text of common.h + `files`: BCC rewrites map calls and makes tracepoint argument
    structs only in its main file, so common.h is pasted in (once) where the sources #include it."""
    parts = [(bpf_dir / "common.h").read_text()]
    for name in files:
        parts.append((bpf_dir / name).read_text().replace('#include "common.h"', "/* common.h (above) */"))
    return "\n".join(parts)


class Probes:
    """The compiled BPF program, its attachments and its maps.

    net_flows: also compile bpf/net.c (the TCP flows) if this kernel has its tracepoints. Whether it
    did is `net_state`: 'on', 'off' (not asked for), 'absent' (a tracepoint missing) or 'failed' (it
    did not compile or load; the rest then runs without it), and `net_reason` says why not."""

    def __init__(self, call_ringbuf_kib=8192, sys_ringbuf_kib=4096, net_flows=True):
        from bcc import BPF
        self._BPF = BPF
        bpf_dir = bpf_source_dir()
        cflags = [f"-DNUM_OPS={len(symbols.OPS)}",
                  f"-DCALL_RINGBUF_PAGES={_pages(call_ringbuf_kib)}", f"-DSYS_RINGBUF_PAGES={_pages(sys_ringbuf_kib)}",
                  "-Wno-macro-redefined", "-Wno-unused-function"]
        files = ["cuda.c", "sched.c", "block.c"]
        self.net_state, self.net_reason = "off", "not asked for (--no-net-flows)"
        if net_flows:
            missing = missing_tracepoints(NET_TRACEPOINTS)
            if missing:
                self.net_state = "absent"
                self.net_reason = (f"this kernel has no tracepoint {', '.join(missing)} (sock_send_length and "
                                   "sock_recv_length came with Linux 6.3)")
            else:
                self.net_state, self.net_reason = "on", None
        started = time.monotonic()
        entries = symbols.bpf_entry_lines()
        try:
            if self.net_state == "on":
                try:
                    self.bpf = BPF(text=program_text(bpf_dir, files + ["net.c"]) + "\n" + entries + "\n",
                                   cflags=cflags + _net_cflags())
                except Exception as exc:
                    self.net_state = "failed"
                    self.net_reason = f"their probes (bpf/net.c) did not load: {_first_line(exc)}"
            if self.net_state != "on":
                self.bpf = BPF(text=program_text(bpf_dir, files) + "\n" + entries + "\n", cflags=cflags)
        except Exception as exc:
            raise StragglerError(
                f"compiling/loading the BPF program failed ({_first_line(exc)}): "
                "check the kernel headers (make setup) and that this kernel has BPF (CONFIG_BPF_SYSCALL, CONFIG_BPF_EVENTS)"
            ) from None
        self.compile_seconds = time.monotonic() - started
        self.attached = []          # (probe name, library path or None)
        self.libraries = {}         # (st_dev, st_ino) -> path, attached
        self.failed_libraries = {}  # (st_dev, st_ino) -> reason
        self.missing = []           # (f"missing:{op}", library path): functions a library of its kind lacks
        self.tracepoint_count = 0
        self.uprobe_count = 0
        self.config = self.bpf["config"]
        self.targets = self.bpf["targets"]
        self.in_scope = self.bpf["in_scope"]
        self.tid_tgid = self.bpf["tid_tgid"]
        self.call_aggs = self.bpf["call_aggs"]
        self.slow_ns = self.bpf["slow_ns"]
        self.thread_calls = self.bpf["thread_calls"]
        op_class = self.bpf["op_class"]
        for op_id, op in enumerate(symbols.OPS):
            op_class[ctypes.c_int(op_id)] = ctypes.c_uint32(symbols.CLASS_ID[symbols.OP_CLASS[op]])
        self.hits = self.bpf["hits"]
        self.lost = self.bpf["lost"]
        self._one = ctypes.c_uint8(1)
        self.net_socks = self.bpf["net_socks"] if self.net_state == "on" else None
        self.net_counts = self.bpf["net_counts"] if self.net_state == "on" else None
        self._closed_reported = set()   # (sk, born) of connections seen closed at the last read_net_flows

    # ---- attaching ---------------------------------------------------------------------
    def attach_tracepoints(self):
        """Record the tracepoints: BCC attaches every TRACEPOINT_PROBE when it loads the program."""
        attached = set(getattr(self.bpf, "tracepoint_fds", {}) or {})
        for tracepoint in TRACEPOINTS:
            if tracepoint in NET_TRACEPOINTS and self.net_state != "on":
                continue
            if attached and tracepoint.encode() not in attached and tracepoint not in attached:
                raise StragglerError(f"tracepoint {tracepoint} did not attach: is tracefs mounted and are you root?")
            self.attached.append((f"tracepoint:{tracepoint}", None))
            self.tracepoint_count += 1

    def attach_library(self, path):
        """Attach every traced symbol `path` exports. Returns the number of probes attached (0 if
        the library was attached before or exports none of them)."""
        identity = symbols.file_identity(path)
        if identity in self.libraries or identity in self.failed_libraries:
            return 0
        try:
            exported = dict(self._BPF.get_user_functions_and_addresses(path.encode(), symbols.SYMBOL_REGEX.encode()))
        except Exception as exc:
            self.failed_libraries[identity] = f"cannot read its symbols: {exc}"
            return 0
        exported = {name.decode() if isinstance(name, bytes) else name: addr for name, addr in exported.items()}
        chosen = symbols.choose_symbols(exported)
        count = 0
        for sym, _addr in chosen:
            try:
                self.bpf.attach_uprobe(name=path.encode(), sym=sym.name.encode(), fn_name=sym.fn_name.encode())
                self.bpf.attach_uretprobe(name=path.encode(), sym=sym.name.encode(), fn_name=b"call_return")
            except Exception as exc:
                self.failed_libraries.setdefault(identity, f"attaching {sym.name} failed: {exc}")
                continue
            self.attached.append((f"uprobe:{sym.name}", path))
            self.attached.append((f"uretprobe:{sym.name}", path))
            count += 2
        self.uprobe_count += count
        if count:
            self.libraries[identity] = path
            self.missing += [(f"missing:{op}", path) for op in symbols.missing_functions(chosen)]
        else:
            self.failed_libraries.setdefault(identity, "exports none of the traced functions")
        return count

    @property
    def probe_count(self):
        return self.tracepoint_count + self.uprobe_count

    # ---- maps user space keeps --------------------------------------------------------
    def set_config(self, gen=0, record_all=False, sample_n=100, scope_all=True, auto_target=True,
                   notify_exec=False, self_tgid=0, record_coll=True):
        value = self.config.Leaf()
        value.gen, value.record_all, value.sample_n = gen, int(record_all), int(sample_n)
        value.scope_all, value.auto_target, value.notify_exec = int(scope_all), int(auto_target), int(notify_exec)
        value.self_tgid, value.record_coll = int(self_tgid), int(record_coll)
        self.config[ctypes.c_int(0)] = value
        self._config = dict(gen=gen, record_all=record_all, sample_n=sample_n, scope_all=scope_all,
                            auto_target=auto_target, notify_exec=notify_exec, self_tgid=self_tgid,
                            record_coll=record_coll)

    def flip_generation(self):
        """Switch the aggregation generation; returns the one to harvest now."""
        old = self._config["gen"]
        self.set_config(**dict(self._config, gen=1 - old))
        return old

    def add_target(self, tgid, thread_ids=()):
        self.targets[ctypes.c_uint32(tgid)] = self._one
        self.tid_tgid[ctypes.c_uint32(tgid)] = ctypes.c_uint32(tgid)
        for tid in thread_ids:
            self.tid_tgid[ctypes.c_uint32(tid)] = ctypes.c_uint32(tgid)

    def target_tgids(self):
        return {key.value for key in self.targets.keys()}

    def add_in_scope(self, tgids):
        for tgid in tgids:
            self.in_scope[ctypes.c_uint32(tgid)] = self._one

    def scope_tgids(self):
        return {key.value for key in self.in_scope.keys()}

    def remove_in_scope(self, tgids):
        for tgid in tgids:
            try:
                del self.in_scope[ctypes.c_uint32(tgid)]
            except KeyError:
                pass

    def set_slow_threshold(self, op_id, ns):
        self.slow_ns[ctypes.c_int(op_id)] = ctypes.c_uint64(int(ns))

    # ---- counters ----------------------------------------------------------------------
    def harvest_aggregates(self, gen):
        """{(tgid, op_id): (count, sum_ns, max_ns, [hist])} of generation `gen`, removed from the map."""
        result, stale = {}, []
        for key, value in self.call_aggs.items():
            if key.gen != gen:
                continue
            result[(key.tgid, key.op)] = (value.count, value.sum, value.max, list(value.hist))
            stale.append(key)
        for key in stale:
            try:
                del self.call_aggs[key]
            except KeyError:
                pass
        return result

    def read_net_flows(self, gen):
        """[NetCounters] of generation `gen` (one per connection and process with anything counted),
        removed from the kernel's table; what is known of each open connection stays. A connection
        that closed is forgotten at the read after the one that reported it closed (a late call on it
        still finds its addresses), and so is one whose process is no longer traced and that had
        nothing counted now. [] when the TCP flows are not traced."""
        if self.net_counts is None:
            return []
        flows, harvested, active = [], [], set()
        for key, value in self.net_counts.items():
            if key.gen != gen:
                continue
            harvested.append(key)
            active.add((key.sk, key.born))
            a = value.a
            size = {AF_INET: 4, AF_INET6: 16}.get(a.family, 0)
            flows.append(NetCounters(
                sk=key.sk, tgid=key.tgid, family=a.family if size else 0,
                local_addr=bytes(a.saddr)[:size], local_port=a.sport if size else 0,
                peer_addr=bytes(a.daddr)[:size], peer_port=a.dport if size else 0,
                tx_bytes=value.tx_bytes, rx_bytes=value.rx_bytes, tx_calls=value.tx_calls, rx_calls=value.rx_calls,
                tx_ns=value.tx_ns, rx_ns=value.rx_ns,
                errors=value.errors, retransmits=value.retransmits, rtt_samples=value.rtt_samples,
                srtt_sum_us=value.srtt_sum_us, srtt_max_us=value.srtt_max_us, cwnd_min=value.cwnd_min,
                recoveries=value.recoveries, opened=value.opened, closed=value.closed))
        for key in harvested:
            try:
                del self.net_counts[key]
            except KeyError:
                pass
        targets = self.target_tgids()
        socks = {key.value: (value.born, value.closed, value.tgid) for key, value in self.net_socks.items()}
        forget = {sk: born for sk, (born, closed, _tgid) in socks.items()
                  if closed and (sk, born) in self._closed_reported}
        forget.update({sk: born for sk, (born, _closed, tgid) in socks.items()
                       if tgid not in targets and (sk, born) not in active})
        for sk, born in forget.items():
            key = ctypes.c_uint64(sk)
            try:
                if self.net_socks[key].born == born:   # not a new connection on the same sk since
                    del self.net_socks[key]
            except KeyError:
                pass
        self._closed_reported = {(sk, born) for sk, (born, closed, _tgid) in socks.items()
                                 if closed and sk not in forget}
        return flows

    def read_thread_calls(self):
        """{tid: (tgid, [ns per class id 0..3], [count per class id])}: running totals since each
        thread's first traced call (the caller takes differences)."""
        return {key.value: (value.tgid, list(value.ns), list(value.count))
                for key, value in self.thread_calls.items()}

    def forget_threads(self, tids):
        """Drop the running totals of threads that are gone."""
        for tid in tids:
            try:
                del self.thread_calls[ctypes.c_uint32(tid)]
            except KeyError:
                pass

    def _percpu_totals(self, table, n):
        totals = []
        for index in range(n):
            values = table[ctypes.c_int(index)]
            totals.append(int(sum(values)))
        return totals

    def hit_totals(self):
        return self._percpu_totals(self.hits, len(HIT_NAMES))

    def lost_totals(self):
        return dict(zip(LOST_PROBES, self._percpu_totals(self.lost, len(LOST_PROBES))))

    # ---- draining ----------------------------------------------------------------------
    def open_ring_buffers(self, on_record):
        """Call on_record(bytes) for each record; both ring buffers feed the same callback."""
        def callback(_ctx, data, size):
            on_record(ctypes.string_at(data, size))
            return 0
        self._callbacks = [callback]
        self.bpf["call_events"].open_ring_buffer(callback)
        self.bpf["sys_events"].open_ring_buffer(callback)

    def drain(self):
        """Consume everything in both ring buffers now (records are submitted without wakeups)."""
        self.bpf.ring_buffer_consume()

    def close(self):
        try:
            self.bpf.cleanup()
        except Exception:
            pass


def _first_line(exc):
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
