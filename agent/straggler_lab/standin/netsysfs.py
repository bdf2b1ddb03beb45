"""A STAND-IN sysfs tree for the network readers (straggler.network), for machines without the links
to test (tests, the demo): plain files under a directory, laid out as the kernel lays out
/sys/class/net/IFACE (operstate, carrier, speed, duplex, mtu, carrier_changes, statistics/*) and
/sys/class/infiniband/DEVICE/ports/PORT (state, phys_state, rate, link_layer, counters/*,
gid_attrs/ndevs/0), with the texts the kernel writes ('4: ACTIVE', '100 Gb/sec (4X EDR)').

It is not the kernel: nothing in it moves by itself. A test drives it, as it drives the stand-in NVML
through control files: add an interface or a port, set a speed, pull a cable (carrier down, one more
carrier change), add to the counters, make a file unreadable (a directory in its place: reading it
fails, as the kernel's EINVAL does for the speed of a down link). Every file is replaced atomically,
so a reader never sees half a value. Pass its `root` as the readers' sysfs root (the agent's
--sysfs-root); the link modes (ethtool) are never asked of a stand-in tree.

This module must not import anything from straggler: it writes what the kernel would, by its names.
"""
import os
import shutil
from pathlib import Path

NET_STATISTICS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped",
                  "tx_dropped", "rx_crc_errors", "rx_missed_errors", "tx_carrier_errors", "collisions",
                  "multicast")
RDMA_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait",
                 "port_xmit_discards", "port_rcv_errors", "port_rcv_remote_physical_errors", "symbol_error",
                 "link_error_recovery", "link_downed", "local_link_integrity_errors",
                 "excessive_buffer_overrun_errors", "VL15_dropped", "port_rcv_constraint_errors",
                 "port_xmit_constraint_errors")
PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
PHYS_STATES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5,
               "LinkErrorRecovery": 6, "Phy Test": 7}


class NetSysfs:
    """A stand-in sysfs tree under `root` (created): class/net and, once a port is added, class/infiniband."""

    def __init__(self, root):
        self.root = str(root)
        self.net = Path(self.root, "class", "net")
        self.infiniband = Path(self.root, "class", "infiniband")
        self.net.mkdir(parents=True, exist_ok=True)

    # ---- files ------------------------------------------------------------------------------------
    @staticmethod
    def _write(path, text):
        path = Path(path)
        if path.is_dir() and not path.is_symlink():   # was made unreadable: readable again
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{text}\n")
        os.replace(tmp, path)

    @staticmethod
    def _add(path, delta):
        try:
            value = int(Path(path).read_text().strip())
        except (OSError, ValueError):
            value = 0
        NetSysfs._write(path, value + int(delta))

    def unreadable(self, relative):
        """Make the file at `relative` (under the root, e.g. 'class/net/eth0/speed') fail to read."""
        path = Path(self.root, relative)
        if path.is_dir():
            return
        if path.exists() or path.is_symlink():
            path.unlink()
        path.mkdir(parents=True)

    def remove(self, relative):
        """Remove a file or a whole directory (an interface, a device, class/infiniband)."""
        path = Path(self.root, relative)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()

    # ---- interfaces -------------------------------------------------------------------------------
    def add_interface(self, name, speed_mbps=100000, operstate="up", carrier=1, duplex="full", mtu=9000,
                      physical=True):
        """An interface with zeroed counters. speed_mbps=None: its speed file fails to read (a virtual
        link); -1: it says SPEED_UNKNOWN. physical: it has a device (a NIC), not a veth or a bridge."""
        base = self.net / name
        base.mkdir(parents=True, exist_ok=True)
        self.set_operstate(name, operstate)
        self._write(base / "carrier", int(carrier))
        self._write(base / "carrier_changes", 0 if carrier else 1)
        self.set_speed(name, speed_mbps)
        if duplex is None:
            self.unreadable(f"class/net/{name}/duplex")
        else:
            self._write(base / "duplex", duplex)
        self._write(base / "mtu", mtu)
        for counter in NET_STATISTICS:
            self._write(base / "statistics" / counter, 0)
        if physical:
            (base / "device").mkdir(exist_ok=True)
        return base

    def set_speed(self, name, mbps):
        """The negotiated speed, Mb/s (None: the file fails to read, -1: SPEED_UNKNOWN)."""
        if mbps is None:
            self.unreadable(f"class/net/{name}/speed")
        else:
            self._write(self.net / name / "speed", int(mbps))

    def set_operstate(self, name, state):
        self._write(self.net / name / "operstate", state)

    def set_carrier(self, name, up):
        """Plug (up=True) or pull the cable: carrier, operstate, and one more carrier change."""
        self._write(self.net / name / "carrier", 1 if up else 0)
        self.set_operstate(name, "up" if up else "down")
        self._add(self.net / name / "carrier_changes", 1)

    def add_counters(self, name, **deltas):
        """Add to the interface's statistics, e.g. add_counters('eth0', rx_bytes=1 << 20, rx_crc_errors=3)."""
        for counter, delta in deltas.items():
            if counter not in NET_STATISTICS:
                raise KeyError(f"no statistics/{counter} on a network interface")
            self._add(self.net / name / "statistics" / counter, delta)

    # ---- RDMA ports -------------------------------------------------------------------------------
    def add_rdma_port(self, device, port=1, state="ACTIVE", phys_state="LinkUp", rate="100 Gb/sec (4X EDR)",
                      link_layer="InfiniBand", netdev=None, netdev_by="ndevs"):
        """A port with zeroed counters. netdev: the interface on it, said by the port's GID 0
        (netdev_by='ndevs', RoCE) or as the device's interface (netdev_by='device', IPoIB)."""
        base = self.infiniband / device / "ports" / str(port)
        base.mkdir(parents=True, exist_ok=True)
        self.set_rdma_state(device, port, state, phys_state)
        self._write(base / "rate", rate)
        self._write(base / "link_layer", link_layer)
        for counter in RDMA_COUNTERS:
            self._write(base / "counters" / counter, 0)
        (base / "gid_attrs" / "ndevs").mkdir(parents=True, exist_ok=True)
        if netdev is not None and netdev_by == "ndevs":
            self._write(base / "gid_attrs" / "ndevs" / "0", netdev)
        elif netdev is not None:
            self._write(self.infiniband / device / "device" / "net" / netdev / "dev_port", int(port) - 1)
        return base

    def set_rdma_state(self, device, port, state, phys_state=None):
        """The port's logical state ('ACTIVE', 'DOWN', ...) and physical state ('LinkUp', 'Polling', ...),
        written as the kernel does: '4: ACTIVE', '5: LinkUp'."""
        base = self.infiniband / device / "ports" / str(port)
        self._write(base / "state", f"{PORT_STATES.get(state, 0)}: {state}")
        if phys_state is not None:
            self._write(base / "phys_state", f"{PHYS_STATES.get(phys_state, 0)}: {phys_state}")

    def set_rdma_rate(self, device, port, rate):
        self._write(self.infiniband / device / "ports" / str(port) / "rate", rate)

    def add_rdma_counters(self, device, port, **deltas):
        """Add to the port's counters, e.g. add_rdma_counters('mlx5_0', 1, port_xmit_wait=5000)."""
        for counter, delta in deltas.items():
            if counter not in RDMA_COUNTERS:
                raise KeyError(f"no counters/{counter} on an RDMA port")
            self._add(self.infiniband / device / "ports" / str(port) / "counters" / counter, delta)
