"""Readers of the node's network state in sysfs: the interfaces (/sys/class/net/IFACE: link state,
speed, MTU, traffic and error counters) and the RDMA ports (/sys/class/infiniband/DEVICE/ports/PORT:
state, rate, the InfiniBand port counters), and the most an interface's link modes allow (ethtool's
ETHTOOL_GLINKSETTINGS ioctl; sysfs does not say it).

Every reader takes the sysfs root (default /sys; a test passes a stand-in tree) and is bounded: a file
is read at most MAX_READ_BYTES, at most MAX_INTERFACES interfaces and MAX_RDMA_PORTS ports are listed
(the listings say how many more there are). A file that cannot be read or does not hold what it should
(absent, EINVAL from a virtual or down link, a value out of range) gives None, never an exception; only
a directory that cannot be listed raises OSError. The link modes are asked of the kernel only for the
real /sys (the interface names of a stand-in tree are not this node's).

Pure readers: no threads, no store, nothing printed. The loopback interface (lo) is not read.
"""
import ctypes
import errno
import fcntl
import os
import re
import socket
import struct
from dataclasses import dataclass
from typing import Optional, Tuple

SYSFS_ROOT = "/sys"
MAX_READ_BYTES = 4096            # the most read of one file
MAX_INTERFACES = 256             # the most interfaces read (physical ones first when there are more)
MAX_RDMA_PORTS = 64              # the most RDMA ports read (by device, then port)
MAX_NETDEVS_LISTED = 16          # the most names looked at under an RDMA device's device/net/
EXCLUDED_INTERFACES = frozenset({"lo"})
_INT64 = (-(1 << 63), (1 << 63) - 1)   # what an SQLite INTEGER holds
_INTEGER = re.compile(r"\A-?\d{1,20}\Z")

# /sys/class/net/IFACE/statistics/NAME, in the order of the net_samples columns
NET_STATISTICS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped",
                  "tx_dropped", "rx_crc_errors", "rx_missed_errors", "tx_carrier_errors")
# /sys/class/infiniband/DEVICE/ports/PORT/counters/NAME, in the order of the rdma_samples columns
RDMA_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait",
                 "port_xmit_discards", "port_rcv_errors", "port_rcv_remote_physical_errors", "symbol_error",
                 "link_error_recovery", "link_downed", "local_link_integrity_errors",
                 "excessive_buffer_overrun_errors")


@dataclass
class InterfaceSample:
    """One interface as read now; fields named as the net_samples columns (None: not reported)."""
    iface: str
    operstate: Optional[str] = None
    carrier: Optional[int] = None
    speed_mbps: Optional[int] = None
    speed_max_mbps: Optional[int] = None
    duplex: Optional[str] = None
    mtu: Optional[int] = None
    carrier_changes: Optional[int] = None
    rx_bytes: Optional[int] = None
    tx_bytes: Optional[int] = None
    rx_packets: Optional[int] = None
    tx_packets: Optional[int] = None
    rx_errors: Optional[int] = None
    tx_errors: Optional[int] = None
    rx_dropped: Optional[int] = None
    tx_dropped: Optional[int] = None
    rx_crc_errors: Optional[int] = None
    rx_missed_errors: Optional[int] = None
    tx_carrier_errors: Optional[int] = None


@dataclass
class RdmaPortSample:
    """One RDMA port as read now; fields named as the rdma_samples columns (None: not reported)."""
    device: str
    port: int
    netdev: Optional[str] = None
    state: Optional[str] = None
    phys_state: Optional[str] = None
    rate_gbps: Optional[float] = None
    link_layer: Optional[str] = None
    port_xmit_data: Optional[int] = None
    port_rcv_data: Optional[int] = None
    port_xmit_packets: Optional[int] = None
    port_rcv_packets: Optional[int] = None
    port_xmit_wait: Optional[int] = None
    port_xmit_discards: Optional[int] = None
    port_rcv_errors: Optional[int] = None
    port_rcv_remote_physical_errors: Optional[int] = None
    symbol_error: Optional[int] = None
    link_error_recovery: Optional[int] = None
    link_downed: Optional[int] = None
    local_link_integrity_errors: Optional[int] = None
    excessive_buffer_overrun_errors: Optional[int] = None


@dataclass(frozen=True)
class Listing:
    """What a bounded listing gives: the entries to read, in order, and how many there were in all."""
    entries: Tuple
    total: int

    @property
    def not_read(self):
        return self.total - len(self.entries)


# ---- files ----------------------------------------------------------------------------------------
def read_text(path) -> Optional[str]:
    """The first MAX_READ_BYTES of a file, stripped (undecodable bytes replaced); None when it cannot be
    read or is empty. Opened without blocking: a FIFO in a stand-in tree reads as empty, never hangs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_READ_BYTES)
    except OSError:                  # EINVAL: speed, carrier, duplex of a down or virtual link; EISDIR
        return None
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").strip()
    return text or None


def read_int(path) -> Optional[int]:
    """A file holding one integer (what an SQLite INTEGER holds); None otherwise."""
    text = read_text(path)
    if text is None or not _INTEGER.match(text):
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


def printable_name(name) -> str:
    """A directory name as text for the store: bytes that are not UTF-8 become U+FFFD (the kernel lets
    an interface name hold any byte but '/', ':' and white space)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# ---- interfaces -----------------------------------------------------------------------------------
def net_dir(root=SYSFS_ROOT):
    return os.path.join(root, "class", "net")


def is_physical(name, root=SYSFS_ROOT) -> bool:
    """The interface has a device behind it (a NIC, not a bridge, veth, tunnel or bond)."""
    return os.path.lexists(os.path.join(net_dir(root), name, "device"))


def list_interfaces(root=SYSFS_ROOT, limit=MAX_INTERFACES) -> Listing:
    """The interfaces to read (names; not lo), by name; when there are more than `limit`, the physical
    ones first. OSError when /sys/class/net cannot be listed."""
    names = sorted(name for name in os.listdir(net_dir(root)) if name not in EXCLUDED_INTERFACES)
    if len(names) > limit:
        names.sort(key=lambda name: (not is_physical(name, root), name))
    return Listing(tuple(names[:limit]), len(names))


def read_interface(name, root=SYSFS_ROOT, speed_max=True) -> InterfaceSample:
    """One interface's state and counters (speed_max: also ask the kernel for its link modes, see
    link_speed_max_mbps)."""
    base = os.path.join(net_dir(root), name)
    sample = InterfaceSample(printable_name(name))
    sample.operstate = read_text(os.path.join(base, "operstate"))
    carrier = read_int(os.path.join(base, "carrier"))
    sample.carrier = carrier if carrier in (0, 1) else None
    speed = read_int(os.path.join(base, "speed"))
    sample.speed_mbps = speed if speed is not None and 0 <= speed < 0xFFFFFFFF else None   # -1: SPEED_UNKNOWN
    duplex = read_text(os.path.join(base, "duplex"))
    sample.duplex = duplex if duplex in ("full", "half") else None
    sample.mtu = read_int(os.path.join(base, "mtu"))
    sample.carrier_changes = read_int(os.path.join(base, "carrier_changes"))
    for counter in NET_STATISTICS:
        setattr(sample, counter, read_int(os.path.join(base, "statistics", counter)))
    if speed_max:
        sample.speed_max_mbps = link_speed_max_mbps(name, root)
    return sample


# ---- the link modes (ethtool) ---------------------------------------------------------------------
SIOCETHTOOL = 0x8946
ETHTOOL_GLINKSETTINGS = 0x4C
IFNAMSIZ = 16
_IFREQ_SIZE = 40                     # struct ifreq on 64-bit Linux: a 16-byte name, a 24-byte union
# struct ethtool_link_settings up to link_mode_masks[]: cmd, speed, duplex, port, phy_address, autoneg,
# mdio_support, eth_tp_mdix, eth_tp_mdix_ctrl, link_mode_masks_nwords (signed), transceiver,
# master_slave_cfg, master_slave_state, rate_matching, reserved[7]
_LINK_SETTINGS = struct.Struct("=II7Bb4B7I")
_NWORDS_OFFSET = 15
_MAX_NWORDS = 127                    # link_mode_masks_nwords is an __s8

# ETHTOOL_LINK_MODE_*_BIT (include/uapi/linux/ethtool.h) -> Mb/s, for the modes that name a speed
LINK_MODE_SPEEDS = {
    0: 10, 1: 10, 2: 100, 3: 100, 4: 1000, 5: 1000,                       # 10/100/1000baseT Half, Full
    12: 10000, 15: 2500, 17: 1000, 18: 10000, 19: 10000,                  # 10000baseT, 2500baseX, KX, KX4, KR
    21: 20000, 22: 20000,                                                 # 20000baseMLD2, KR2
    23: 40000, 24: 40000, 25: 40000, 26: 40000,                           # 40000baseKR4, CR4, SR4, LR4
    27: 56000, 28: 56000, 29: 56000, 30: 56000,                           # 56000baseKR4, CR4, SR4, LR4
    31: 25000, 32: 25000, 33: 25000,                                      # 25000baseCR, KR, SR
    34: 50000, 35: 50000, 40: 50000,                                      # 50000baseCR2, KR2, SR2
    36: 100000, 37: 100000, 38: 100000, 39: 100000,                       # 100000baseKR4, SR4, CR4, LR4_ER4
    41: 1000, 42: 10000, 43: 10000, 44: 10000, 45: 10000, 46: 10000,      # 1000baseX, 10000baseCR..ER
    47: 2500, 48: 5000,                                                   # 2500baseT, 5000baseT
    52: 50000, 53: 50000, 54: 50000, 55: 50000, 56: 50000,                # 50000baseKR, SR, CR, LR_ER_FR, DR
    57: 100000, 58: 100000, 59: 100000, 60: 100000, 61: 100000,           # 100000baseKR2 .. DR2
    62: 200000, 63: 200000, 64: 200000, 65: 200000, 66: 200000,           # 200000baseKR4 .. CR4
    67: 100, 68: 1000,                                                    # 100baseT1, 1000baseT1
    69: 400000, 70: 400000, 71: 400000, 72: 400000, 73: 400000,           # 400000baseKR8 .. CR8
    75: 100000, 76: 100000, 77: 100000, 78: 100000, 79: 100000,           # 100000baseKR .. DR
    80: 200000, 81: 200000, 82: 200000, 83: 200000, 84: 200000,           # 200000baseKR2 .. CR2
    85: 400000, 86: 400000, 87: 400000, 88: 400000, 89: 400000,           # 400000baseKR4 .. CR4
    90: 100, 91: 100, 92: 10,                                             # 100baseFX Half, Full; 10baseT1L
    93: 800000, 94: 800000, 95: 800000, 96: 800000, 97: 800000, 98: 800000,  # 800000baseCR8 .. VR8
    99: 10, 100: 10, 101: 10,                                             # 10baseT1S Full, Half, P2MP_Half
}


def speed_of_link_modes(bits) -> Optional[int]:
    """The highest speed (Mb/s) among link-mode bit numbers; None when none names a speed."""
    speeds = [LINK_MODE_SPEEDS[bit] for bit in bits if bit in LINK_MODE_SPEEDS]
    return max(speeds) if speeds else None


def supported_link_modes(name):
    """The bit numbers of the interface's supported link modes (ETHTOOL_GLINKSETTINGS). OSError when the
    kernel or the driver does not say (no such interface, no ethtool support), ValueError for a name no
    interface can have."""
    encoded = name.encode("utf-8", "surrogateescape")
    if not encoded or len(encoded) >= IFNAMSIZ or b"\0" in encoded:
        raise ValueError(f"not an interface name: {name!r}")
    settings = ctypes.create_string_buffer(_LINK_SETTINGS.size + 3 * 4 * _MAX_NWORDS)
    request = bytearray(struct.pack("16sP", encoded, ctypes.addressof(settings)).ljust(_IFREQ_SIZE, b"\0"))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        nwords = 0
        for _attempt in range(2):    # first with 0 words: the kernel answers -N, the words it uses; then N
            ctypes.memset(settings, 0, ctypes.sizeof(settings))
            struct.pack_into("=I", settings, 0, ETHTOOL_GLINKSETTINGS)
            struct.pack_into("=b", settings, _NWORDS_OFFSET, nwords)
            fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)
            fields = _LINK_SETTINGS.unpack_from(settings)
            answered = fields[9]
            if answered > 0 and answered == nwords:
                words = struct.unpack_from(f"={nwords}I", settings, _LINK_SETTINGS.size)   # map_supported
                return [32 * index + bit for index, word in enumerate(words) for bit in range(32) if word >> bit & 1]
            if answered >= 0 or -answered > _MAX_NWORDS:
                break
            nwords = -answered
    raise OSError(errno.EPROTO, "ETHTOOL_GLINKSETTINGS: no agreement on the size of the link-mode masks")


def link_speed_max_mbps(name, root=SYSFS_ROOT) -> Optional[int]:
    """The most (Mb/s) the interface's supported link modes allow; None when the root is not the real
    /sys, when the kernel or the driver does not say, or when no supported mode names a speed (a veth)."""
    if os.path.normpath(root) != SYSFS_ROOT:
        return None
    try:
        return speed_of_link_modes(supported_link_modes(name))
    except (OSError, ValueError):
        return None


# ---- RDMA ports -----------------------------------------------------------------------------------
_PORT_STATE = re.compile(r"\A\d+\s*:\s*(\S.*)\Z")
_RATE = re.compile(r"\A(\d+(?:\.\d+)?)\s*Gb/sec")


def rdma_dir(root=SYSFS_ROOT):
    return os.path.join(root, "class", "infiniband")


def parse_port_state(text) -> Optional[str]:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp' (a text without the number is kept as it is)."""
    if text is None:
        return None
    match = _PORT_STATE.match(text)
    return match.group(1).strip() if match else text


def parse_rate_gbps(text) -> Optional[float]:
    """'100 Gb/sec (4X EDR)' -> 100.0, '2.5 Gb/sec (1X SDR)' -> 2.5; None when it says no rate."""
    match = _RATE.match(text or "")
    return float(match.group(1)) if match else None


def list_rdma_ports(root=SYSFS_ROOT, limit=MAX_RDMA_PORTS) -> Listing:
    """The RDMA ports to read, as (device, port) by device name and port number: empty when the node has
    none (/sys/class/infiniband is absent); OSError when it is there and cannot be listed. A device that
    goes away meanwhile is skipped."""
    try:
        devices = sorted(os.listdir(rdma_dir(root)))
    except FileNotFoundError:
        return Listing((), 0)
    ports = []
    for device in devices:
        try:
            numbers = sorted(int(entry) for entry in os.listdir(os.path.join(rdma_dir(root), device, "ports"))
                             if entry.isdigit() and len(entry) <= 5)
        except OSError:
            continue
        ports.extend((device, number) for number in numbers)
    return Listing(tuple(ports[:limit]), len(ports))


def rdma_port_netdev(device, port, root=SYSFS_ROOT) -> Optional[str]:
    """The network interface on an RDMA port: the port's GID 0 netdev (RoCE), else the device's only
    interface (or the one whose dev_port is port - 1, IPoIB on a dual-port device); None when not said."""
    netdev = read_text(os.path.join(rdma_dir(root), device, "ports", str(port), "gid_attrs", "ndevs", "0"))
    if netdev:
        return netdev
    net = os.path.join(rdma_dir(root), device, "device", "net")
    try:
        names = sorted(os.listdir(net))[:MAX_NETDEVS_LISTED]
    except OSError:
        return None
    if len(names) == 1:
        return printable_name(names[0])
    for name in names:
        if read_int(os.path.join(net, name, "dev_port")) == port - 1:
            return printable_name(name)
    return None


def read_rdma_port(device, port, root=SYSFS_ROOT) -> RdmaPortSample:
    """One RDMA port's state, rate and counters."""
    base = os.path.join(rdma_dir(root), device, "ports", str(port))
    sample = RdmaPortSample(printable_name(device), int(port))
    sample.netdev = rdma_port_netdev(device, port, root)
    sample.state = parse_port_state(read_text(os.path.join(base, "state")))
    sample.phys_state = parse_port_state(read_text(os.path.join(base, "phys_state")))
    sample.rate_gbps = parse_rate_gbps(read_text(os.path.join(base, "rate")))
    sample.link_layer = read_text(os.path.join(base, "link_layer"))
    for counter in RDMA_COUNTERS:
        setattr(sample, counter, read_int(os.path.join(base, "counters", counter)))
    return sample
