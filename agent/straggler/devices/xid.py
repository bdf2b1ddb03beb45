"""The NVIDIA driver's Xid errors in the kernel log: parse one line, and read /dev/kmsg without ever
blocking the reader.

The driver (kernel_rc.c, krcReportXid) logs

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 13, pid='<unknown>', name=<unknown>, Graphics ...
    NVRM: Xid (PCI:0000:3b:00): 62, 023f0f30 00000000 ...          (older paths: no pid, no name)
    NVRM: Xid (0000:03:00): 14, Channel 00000001                    (older drivers: no 'PCI:')

and, before a GPU's first Xid, `NVRM: GPU at PCI:0000:3b:00: GPU-8b2f...` (its UUID). A line that is not
one of these, or is odd (too long, a number too big), yields nothing: never an exception.

/dev/kmsg hands one record per read(): `PRIO,SEQ,TS_US,FLAGS[,...];MESSAGE` then optional ` KEY=VALUE`
lines. The reader opens it non-blocking at its end (what the kernel logged before the agent started is
not read), reads at most `max_records` records per call, counts the records the kernel overwrote before
they were read (EPIPE, or a gap in SEQ) and skips a record too long for its buffer (EINVAL).

This module must not import pynvml, BCC or the store, and prints nothing.
"""
import errno
import os
import re
from dataclasses import dataclass
from typing import Optional

# What the common codes mean (NVIDIA's Xid catalogue, in short; docs/devices.md has the table). A code not
# listed here is still recorded, with meaning NULL.
XID_MEANINGS = {
    13: "graphics engine exception: a fault inside a running kernel (usually the application)",
    31: "GPU memory page fault: a kernel used an address it may not (usually the application)",
    32: "invalid or corrupted push buffer stream (driver, system memory or the PCIe bus)",
    38: "driver firmware error",
    43: "GPU stopped processing: a channel was reset after a fault (usually the application)",
    44: "graphics engine fault during a context switch",
    45: "preemptive cleanup: the driver ended a channel (its process exited, or after an earlier error)",
    48: "double-bit ECC error: uncorrectable device memory error (reset the GPU; hardware if it recurs)",
    61: "internal micro-controller breakpoint/warning (GPU firmware)",
    62: "internal micro-controller halt (GPU firmware; reset the GPU)",
    63: "ECC page retirement or row remapping recorded (device memory degrading; the GPU goes on)",
    64: "ECC page retirement or row remapping failed (the GPU needs service)",
    68: "video decoder (NVDEC) exception",
    69: "graphics engine class error",
    74: "NVLink error: a link between GPUs failed or retrained",
    79: "GPU has fallen off the bus: it no longer answers on PCIe",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: an uncorrectable memory error confined to the process that hit it",
    95: "uncontained ECC error: an uncorrectable memory error that may reach other processes (reset the GPU)",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP RPC timeout: the GPU's system processor did not answer the driver",
    120: "GSP error: the GPU's system processor reported an error",
    121: "C2C link error: the chip-to-chip link (CPU-GPU) reported errors",
    122: "SPI PMU RPC read failure",
    123: "SPI PMU RPC write failure",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    154: "GPU recovery action changed: the driver asks for a GPU reset or a reboot",
}

MAX_MESSAGE_CHARS = 2048        # a longer line is stored cut to this
_HEX = "[0-9a-fA-F]"
_XID_LINE = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<domain>{_HEX}{{4,8}}):(?P<bus>{_HEX}{{2}}):(?P<device>{_HEX}{{2}})(?:\.[0-7])?"
    r"(?: GPU-I:(?P<gi>\d{1,5}))?(?: GPU-CI:(?P<ci>\d{1,5}))?\): (?P<xid>\d{1,6}),(?P<rest>.*)\Z", re.S)
_PID_NAME = re.compile(r" pid=(?P<pid>'?<unknown>'?|\d{1,10})(?:,? name=(?P<name>[^,]{0,64}))?")
_GPU_AT = re.compile(rf"NVRM: GPU at PCI:(?P<domain>{_HEX}{{4,8}}):(?P<bus>{_HEX}{{2}}):(?P<device>{_HEX}{{2}}): "
                     r"(?P<uuid>GPU-[0-9a-fA-F-]{8,64})\s*\Z")


@dataclass(frozen=True)
class Xid:
    """One Xid line, parsed."""
    pci_bus_id: str                  # 'dddd:bb:dd', lower case
    xid: int
    meaning: Optional[str]
    pid: Optional[int]
    process: Optional[str]
    gpu_instance: Optional[int]
    compute_instance: Optional[int]
    message: str


def bus_key(domain, bus, device) -> str:
    """The one spelling of a GPU's PCI address that Xid lines and NVML's bus ids are compared in:
    'dddd:bb:dd' lower case (NVML's '00000000:3B:00.0' and the driver's '0000:3b:00' meet here)."""
    domain = int(domain, 16) if isinstance(domain, str) else domain
    bus = int(bus, 16) if isinstance(bus, str) else bus
    device = int(device, 16) if isinstance(device, str) else device
    return f"{domain:04x}:{bus:02x}:{device:02x}"


_BUS_ID = re.compile(rf"\A(?:(?P<domain>{_HEX}{{1,8}}):)?(?P<bus>{_HEX}{{1,2}}):(?P<device>{_HEX}{{1,2}})(?:\.[0-7])?\Z")


def bus_key_of(bus_id) -> Optional[str]:
    """bus_key of a written PCI bus id ('00000000:3B:00.0', '0000:3b:00', '3b:00.0'), None if it is not one."""
    match = _BUS_ID.match((bus_id or "").strip())
    if not match:
        return None
    return bus_key(match.group("domain") or "0", match.group("bus"), match.group("device"))


def parse_xid(message) -> Optional[Xid]:
    """The Xid in one kernel log message, or None (not an Xid line, or an odd one)."""
    if not message or "NVRM: Xid" not in message:
        return None
    match = _XID_LINE.search(message)
    if match is None:
        return None
    code = int(match.group("xid"))
    pid = process = None
    who = _PID_NAME.match(match.group("rest"))
    if who is not None:
        if who.group("pid").isdigit():
            pid = int(who.group("pid"))
            if pid <= 0 or pid > 4_194_304:       # PID_MAX_LIMIT
                pid = None
        name = (who.group("name") or "").strip()
        process = name if name and name != "<unknown>" else None
    gi, ci = match.group("gi"), match.group("ci")
    return Xid(pci_bus_id=bus_key(match.group("domain"), match.group("bus"), match.group("device")), xid=code,
               meaning=XID_MEANINGS.get(code), pid=pid, process=process,
               gpu_instance=int(gi) if gi is not None else None, compute_instance=int(ci) if ci is not None else None,
               message=message[:MAX_MESSAGE_CHARS])


def parse_gpu_at(message):
    """(bus_key, uuid) from the driver's 'NVRM: GPU at PCI:dddd:bb:dd: GPU-...' line, else None."""
    if not message or "NVRM: GPU at PCI:" not in message:
        return None
    match = _GPU_AT.search(message)
    if match is None:
        return None
    return bus_key(match.group("domain"), match.group("bus"), match.group("device")), match.group("uuid")


@dataclass(frozen=True)
class KmsgRecord:
    """One /dev/kmsg record: its first message line (continuation ' KEY=VALUE' lines dropped)."""
    facility: int                    # 0: the kernel; 1: user (a program wrote to /dev/kmsg)
    level: int
    seq: int
    ts_ns: int                       # time stamp, ns since boot (the kernel log's clock: CLOCK_MONOTONIC)
    message: str


def parse_kmsg_record(data: bytes) -> Optional[KmsgRecord]:
    """A /dev/kmsg record, or None when it is not one (never an exception)."""
    header, sep, rest = data.partition(b";")
    if not sep:
        return None
    fields = header.split(b",")
    if len(fields) < 4:
        return None
    try:
        prio, seq, ts_us = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    if prio < 0 or seq < 0 or ts_us < 0 or ts_us > (1 << 62) // 1000:
        return None
    message = rest.split(b"\n", 1)[0].decode("utf-8", "replace")
    return KmsgRecord(facility=prio >> 3, level=prio & 7, seq=seq, ts_ns=ts_us * 1000, message=message)


class KmsgReader:
    """/dev/kmsg from its end, non-blocking, a bounded number of records per read_new() call.

    Keeps only the records whose message contains `keep` (bytes; b"NVRM: " by default), so a flood of
    other kernel messages costs one read() each and no decoding. Counters: records_read, records_lost
    (overwritten by the kernel before they were read), records_skipped (too long, or not a record)."""

    BUFFER_BYTES = 8192              # the kernel's largest record (CONSOLE_EXT_LOG_MAX) fits

    def __init__(self, path="/dev/kmsg", max_records=2000, keep=b"NVRM: "):
        self.path, self.max_records, self.keep = path, max_records, keep
        self.fd = None
        self.last_seq = None
        self.records_read = self.records_lost = self.records_skipped = 0

    def open(self):
        """Open at the log's end. Raises OSError (e.g. EPERM without root, ENOENT in some containers)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            os.close(fd)
            raise
        self.fd = fd

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read_new(self):
        """The kept records logged since the last call, at most max_records read. Returns (records, more):
        more is True when the budget ran out before the log did (call again soon)."""
        kept = []
        if self.fd is None:
            return kept, False
        for _ in range(self.max_records):
            try:
                data = os.read(self.fd, self.BUFFER_BYTES)
            except BlockingIOError:
                return kept, False
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:      # overwritten before we read it: the next read goes on
                    if self.last_seq is None:     # else the next record's sequence gap says how many
                        self.records_lost += 1
                    continue
                if exc.errno == errno.EINVAL:     # longer than our buffer: the kernel has skipped it
                    self.records_skipped += 1
                    continue
                raise
            if not data:
                return kept, False
            self.records_read += 1
            if self.keep not in data:
                self._seq_of(data)
                continue
            record = parse_kmsg_record(data)
            if record is None:
                self.records_skipped += 1
                continue
            self._count_gap(record.seq)
            kept.append(record)
        return kept, True

    def _seq_of(self, data):
        """Count a gap in the sequence numbers (records lost) from a record we do not otherwise parse."""
        comma = data.find(b",")
        if comma < 0:
            return
        end = data.find(b",", comma + 1)
        try:
            self._count_gap(int(data[comma + 1:end]))
        except ValueError:
            pass

    def _count_gap(self, seq):
        if self.last_seq is not None and seq > self.last_seq + 1:
            self.records_lost += seq - self.last_seq - 1
        self.last_seq = seq
