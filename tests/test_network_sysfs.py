"""The network readers and sampler (straggler.network: sysfs readers + NetMonitor) against the STAND-IN
sysfs tree (straggler_lab.standin.netsysfs: class/net and class/infiniband as plain files), written
into a real store (StoreWriter, SQLite): each test changes the tree as a link would change (a pulled
cable, a slower speed, errors on the wire) and checks what the rows and meta say. Then the real /sys of
the machine the tests run on, read once (whatever its links are), and the command's flags.
No BPF, no root, no network traffic."""
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from straggler.network import sysfs
from straggler.network.monitor import NetMonitor
from straggler.store.schema import NET_SAMPLE_COLUMNS, RDMA_SAMPLE_COLUMNS
from straggler.store.writer import StoreWriter
from straggler_lab.standin.netsysfs import NetSysfs

SECOND = 1_000_000_000
ETHTOOL_HEADER = Path("/usr/include/linux/ethtool.h")


def query(db, sql, params=()):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def net_rows(db, iface):
    rows = query(db, f"SELECT {', '.join(NET_SAMPLE_COLUMNS)} FROM net_samples WHERE iface = ? ORDER BY ts", (iface,))
    return [dict(zip(NET_SAMPLE_COLUMNS, row)) for row in rows]


def rdma_rows(db, device, port):
    rows = query(db, f"SELECT {', '.join(RDMA_SAMPLE_COLUMNS)} FROM rdma_samples WHERE device = ? AND port = ? "
                     "ORDER BY ts", (device, port))
    return [dict(zip(RDMA_SAMPLE_COLUMNS, row)) for row in rows]


def meta(db):
    return dict(query(db, "SELECT key, value FROM meta"))


@pytest.fixture
def tree(tmp_path):
    """A node with two 400G NICs, a bridge, lo, and one InfiniBand port (mlx5_0:1, its IPoIB ib0)."""
    tree = NetSysfs(tmp_path / "sys")
    tree.add_interface("lo", speed_mbps=None, duplex=None, mtu=65536, physical=False)
    tree.add_interface("ens1f0", speed_mbps=400000)
    tree.add_interface("ens1f1", speed_mbps=400000)
    tree.add_interface("docker0", speed_mbps=None, operstate="down", carrier=0, duplex=None, mtu=1500,
                       physical=False)
    tree.add_rdma_port("mlx5_0", 1, rate="400 Gb/sec (4X NDR)", netdev="ib0", netdev_by="device")
    return tree


@pytest.fixture
def store(tmp_path):
    db = str(tmp_path / "s.db")
    writer = StoreWriter(db, "n1")
    writer.start()
    writer.db = db
    yield writer
    writer.stop()


def started(tree, store, **kwargs):
    monitor = NetMonitor("n1", store.submit, store.set_meta, interval_ns=SECOND, sysfs_root=tree.root, **kwargs)
    monitor.notices = monitor.start(now_ns=0, thread=False)
    return monitor


# ---- the readers ----------------------------------------------------------------------------------
def test_an_interface_is_read_with_its_state_speed_mtu_and_counters(tree):
    tree.add_counters("ens1f0", rx_bytes=5 << 30, tx_bytes=3 << 30, rx_packets=1000, rx_crc_errors=7,
                      rx_missed_errors=2, tx_carrier_errors=1)
    sample = sysfs.read_interface("ens1f0", tree.root)
    assert (sample.iface, sample.operstate, sample.carrier, sample.speed_mbps, sample.duplex, sample.mtu) == (
        "ens1f0", "up", 1, 400000, "full", 9000)
    assert (sample.rx_bytes, sample.tx_bytes, sample.rx_packets, sample.tx_packets) == (5 << 30, 3 << 30, 1000, 0)
    assert (sample.rx_crc_errors, sample.rx_missed_errors, sample.tx_carrier_errors) == (7, 2, 1)
    assert sample.carrier_changes == 0
    assert sample.speed_max_mbps is None       # a stand-in tree's names are not this node's: ethtool not asked


def test_what_a_down_or_virtual_link_cannot_say_is_null_and_the_rest_is_read(tree):
    # docker0: speed and duplex unreadable (the kernel's EINVAL), carrier 0
    bridge = sysfs.read_interface("docker0", tree.root)
    assert (bridge.operstate, bridge.carrier, bridge.speed_mbps, bridge.duplex, bridge.mtu) == ("down", 0, None, None,
                                                                                                1500)
    tree.set_speed("ens1f1", -1)                                  # SPEED_UNKNOWN
    tree.unreadable("class/net/ens1f1/carrier")
    tree.remove("class/net/ens1f1/statistics/rx_crc_errors")     # a driver without it
    (Path(tree.root) / "class/net/ens1f1/duplex").write_text("unknown\n")
    (Path(tree.root) / "class/net/ens1f1/mtu").write_text("not a number\n")
    nic = sysfs.read_interface("ens1f1", tree.root)
    assert (nic.speed_mbps, nic.carrier, nic.rx_crc_errors, nic.duplex, nic.mtu) == (None, None, None, None, None)
    assert (nic.operstate, nic.rx_bytes, nic.carrier_changes) == ("up", 0, 0)
    gone = sysfs.read_interface("eth9", tree.root)                # removed between listing and reading
    assert gone.iface == "eth9" and gone.operstate is None and gone.rx_bytes is None


def test_loopback_is_not_listed_and_the_others_are_by_name(tree):
    listing = sysfs.list_interfaces(tree.root)
    assert listing.entries == ("docker0", "ens1f0", "ens1f1")
    assert (listing.total, listing.not_read) == (3, 0)


def test_at_most_256_interfaces_are_listed_physical_ones_first(tree):
    for index in range(300):                                      # a busy container host: 300 veths
        tree.add_interface(f"cali{index:04d}", speed_mbps=10000, physical=False)
    listing = sysfs.list_interfaces(tree.root)
    assert len(listing.entries) == sysfs.MAX_INTERFACES == 256
    assert listing.entries[:2] == ("ens1f0", "ens1f1")            # the NICs are never crowded out
    assert (listing.total, listing.not_read) == (303, 47)


def test_a_file_is_read_at_most_4_kib_and_a_number_out_of_range_is_null(tree):
    big = Path(tree.root) / "class/net/ens1f0/operstate"
    big.write_text("u" * (1 << 20))
    assert len(sysfs.read_text(big)) == sysfs.MAX_READ_BYTES == 4096
    counters = Path(tree.root) / "class/net/ens1f0/statistics"
    (counters / "rx_bytes").write_text(str(1 << 64) + "\n")      # beyond what an SQLite INTEGER holds
    (counters / "tx_bytes").write_text(str((1 << 63) - 1) + "\n")
    (counters / "rx_packets").write_text("1" * 5000)             # more digits than a counter has
    sample = sysfs.read_interface("ens1f0", tree.root)
    assert (sample.rx_bytes, sample.tx_bytes, sample.rx_packets) == (None, (1 << 63) - 1, None)


def test_a_fifo_in_the_tree_reads_as_nothing_and_never_blocks(tree):
    fifo = Path(tree.root) / "class/net/ens1f0/mtu"
    fifo.unlink()
    os.mkfifo(fifo)
    result = {}
    reader = threading.Thread(target=lambda: result.setdefault("mtu", sysfs.read_interface("ens1f0", tree.root).mtu),
                              daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and result == {"mtu": None}


def test_an_rdma_port_is_read_with_its_state_rate_netdev_and_counters(tree):
    tree.add_rdma_counters("mlx5_0", 1, port_xmit_data=1 << 40, port_rcv_data=1 << 39, port_xmit_wait=123456,
                           symbol_error=3, link_downed=1)
    tree.add_rdma_port("mlx5_1", 1, state="DOWN", phys_state="Polling", rate="10 Gb/sec (4X SDR)",
                       link_layer="Ethernet", netdev="ens1f1")            # RoCE: GID 0's netdev
    tree.add_rdma_port("mlx4_0", 1, rate="2.5 Gb/sec (1X SDR)", netdev="ib1", netdev_by="device")
    tree.add_rdma_port("mlx4_0", 2, rate="56 Gb/sec (4X FDR)", netdev="ib2", netdev_by="device")
    ib = sysfs.read_rdma_port("mlx5_0", 1, tree.root)
    assert (ib.device, ib.port, ib.netdev, ib.state, ib.phys_state, ib.rate_gbps, ib.link_layer) == (
        "mlx5_0", 1, "ib0", "ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert (ib.port_xmit_data, ib.port_rcv_data, ib.port_xmit_wait, ib.symbol_error, ib.link_downed) == (
        1 << 40, 1 << 39, 123456, 3, 1)
    assert (ib.port_rcv_errors, ib.excessive_buffer_overrun_errors) == (0, 0)
    roce = sysfs.read_rdma_port("mlx5_1", 1, tree.root)
    assert (roce.netdev, roce.state, roce.phys_state, roce.rate_gbps, roce.link_layer) == (
        "ens1f1", "DOWN", "Polling", 10.0, "Ethernet")
    # a dual-port device with an interface per port: each port's by its dev_port
    assert [sysfs.read_rdma_port("mlx4_0", port, tree.root).netdev for port in (1, 2)] == ["ib1", "ib2"]
    assert sysfs.read_rdma_port("mlx4_0", 1, tree.root).rate_gbps == 2.5
    tree.remove("class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait")   # a RoCE port lacks some
    tree.unreadable("class/infiniband/mlx5_0/ports/1/rate")
    partial = sysfs.read_rdma_port("mlx5_0", 1, tree.root)
    assert (partial.port_xmit_wait, partial.rate_gbps, partial.state, partial.symbol_error) == (None, None, "ACTIVE", 3)


@pytest.mark.parametrize("text, state", [("4: ACTIVE", "ACTIVE"), ("5: LinkUp", "LinkUp"), ("7: Phy Test", "Phy Test"),
                                         ("ACTIVE", "ACTIVE"), (None, None)])
def test_port_states_drop_their_number(text, state):
    assert sysfs.parse_port_state(text) == state


@pytest.mark.parametrize("text, gbps", [("100 Gb/sec (4X EDR)", 100.0), ("2.5 Gb/sec (1X SDR)", 2.5),
                                        ("400 Gb/sec (4X NDR)", 400.0), ("", None), (None, None), ("fast", None)])
def test_rates_are_gigabits_per_second(text, gbps):
    assert sysfs.parse_rate_gbps(text) == gbps


def test_rdma_ports_are_listed_by_device_and_port_number_at_most_64(tree):
    for device in ("mlx5_1", "mlx5_2", "mlx5_3"):
        for port in range(1, 31):
            tree.add_rdma_port(device, port)
    listing = sysfs.list_rdma_ports(tree.root)
    assert len(listing.entries) == sysfs.MAX_RDMA_PORTS == 64
    assert listing.entries[:3] == (("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_1", 2))
    assert listing.entries[9:11] == (("mlx5_1", 9), ("mlx5_1", 10))        # numbers, not text
    assert (listing.total, listing.not_read) == (91, 27)


def test_a_node_without_rdma_lists_no_ports(tmp_path):
    tree = NetSysfs(tmp_path / "sys")
    assert sysfs.list_rdma_ports(tree.root) == sysfs.Listing((), 0)


def test_the_link_speed_of_the_supported_modes_is_the_highest_named_one():
    assert sysfs.speed_of_link_modes([5, 6, 13, 12, 38]) == 100000    # 1000baseT, Autoneg, Pause, 10000baseT, 100G CR4
    assert sysfs.speed_of_link_modes([70, 50]) == 400000              # 400000baseSR8, FEC_RS
    assert sysfs.speed_of_link_modes([6, 7, 13, 49]) is None          # no mode names a speed
    assert sysfs.speed_of_link_modes([]) is None


def test_the_link_modes_are_asked_of_the_kernel_only_for_the_real_sys(tree, monkeypatch):
    monkeypatch.setattr(sysfs, "supported_link_modes", lambda name: [5, 38])
    assert sysfs.link_speed_max_mbps("ens1f0", "/sys") == sysfs.link_speed_max_mbps("ens1f0", "/sys/") == 100000
    assert sysfs.link_speed_max_mbps("ens1f0", tree.root) is None
    assert sysfs.read_interface("ens1f0", tree.root).speed_max_mbps is None


@pytest.mark.skipif(not ETHTOOL_HEADER.exists(), reason="no kernel headers (linux-libc-dev) to compare with")
def test_the_link_mode_table_agrees_with_the_kernels_header():
    """Every ETHTOOL_LINK_MODE_<speed>base..._BIT of the installed header is in the table with that speed."""
    modes = re.findall(r"ETHTOOL_LINK_MODE_(\d+)base(\w+?)_BIT\s*=\s*(\d+)", ETHTOOL_HEADER.read_text())
    speeds = [(int(speed), name, int(bit)) for speed, name, bit in modes if name.endswith(("Full", "Half"))]
    assert len(speeds) > 60                                       # 10000baseR_FEC is a FEC mode: no speed
    for speed, name, bit in speeds:
        assert sysfs.LINK_MODE_SPEEDS.get(bit) == speed, (speed, name, bit)
    assert 20 not in sysfs.LINK_MODE_SPEEDS


# ---- the monitor, into a real store ---------------------------------------------------------------
def test_every_interface_and_port_gets_a_row_each_interval(tree, store):
    monitor = started(tree, store)
    assert monitor.notices == []
    monitor.poll(0)
    tree.add_counters("ens1f0", rx_bytes=1 << 30, tx_bytes=1 << 29, rx_packets=700000)
    tree.add_rdma_counters("mlx5_0", 1, port_xmit_data=250 << 20, port_xmit_wait=9000)
    monitor.poll(SECOND // 2)                                     # not due: nothing
    monitor.poll(SECOND)
    monitor.stop()
    assert store.flush()
    rows = net_rows(store.db, "ens1f0")
    assert [(r["node"], r["ts"]) for r in rows] == [("n1", 0), ("n1", SECOND)]
    assert rows[1]["rx_bytes"] - rows[0]["rx_bytes"] == 1 << 30
    assert (rows[1]["speed_mbps"], rows[1]["carrier"], rows[1]["mtu"], rows[1]["duplex"]) == (400000, 1, 9000, "full")
    assert {r[0] for r in query(store.db, "SELECT DISTINCT iface FROM net_samples")} == {"ens1f0", "ens1f1", "docker0"}
    assert net_rows(store.db, "docker0")[0]["speed_mbps"] is None
    ports = rdma_rows(store.db, "mlx5_0", 1)
    assert [r["ts"] for r in ports] == [0, SECOND]
    assert (ports[1]["netdev"], ports[1]["state"], ports[1]["rate_gbps"]) == ("ib0", "ACTIVE", 400.0)
    assert (ports[1]["port_xmit_data"], ports[1]["port_xmit_wait"]) == (250 << 20, 9000)
    info = meta(store.db)
    assert (info["net_state"], info["net_interfaces"], info["rdma_ports"], info["net_interval_ns"]) == (
        "read", "3", "1", str(SECOND))
    assert int(info["net_cpu_ns"]) >= 0 and "net_error" not in info


def test_a_pulled_cable_and_a_slower_link_show_in_the_next_sample(tree, store):
    monitor = started(tree, store)
    monitor.poll(0)
    tree.set_carrier("ens1f1", False)
    tree.set_speed("ens1f1", None)                                # a down link's speed: EINVAL
    tree.set_speed("ens1f0", 100000)                              # trained down to 100G
    tree.add_counters("ens1f0", rx_crc_errors=12)
    tree.set_rdma_state("mlx5_0", 1, "DOWN", "Polling")
    monitor.poll(SECOND)
    monitor.stop()
    assert store.flush()
    pulled = net_rows(store.db, "ens1f1")[-1]
    assert (pulled["operstate"], pulled["carrier"], pulled["speed_mbps"], pulled["carrier_changes"]) == (
        "down", 0, None, 1)
    slow = net_rows(store.db, "ens1f0")
    assert [r["speed_mbps"] for r in slow] == [400000, 100000] and slow[-1]["rx_crc_errors"] == 12
    port = rdma_rows(store.db, "mlx5_0", 1)[-1]
    assert (port["state"], port["phys_state"]) == ("DOWN", "Polling")


def test_the_link_modes_are_asked_once_and_again_after_the_carrier_changed(tree, store, monkeypatch):
    """ethtool's answer (speed_max_mbps) is in every row; it is asked of the kernel once per interface, and
    again when its carrier changed (a new cable or optic) or it came back. Here a stand-in answers."""
    asked = []

    def link_speed_max_mbps(name, root):
        asked.append(name)
        return 400000 if name.startswith("ens") else None

    monkeypatch.setattr("straggler.network.monitor.sysfs.link_speed_max_mbps", link_speed_max_mbps)
    monitor = started(tree, store)
    for second in range(3):
        monitor.poll(second * SECOND)
    assert sorted(asked) == ["docker0", "ens1f0", "ens1f1"]
    tree.set_carrier("ens1f1", False)
    tree.remove("class/net/docker0")
    monitor.poll(3 * SECOND)
    tree.add_interface("docker0", carrier=0, physical=False)     # as it was, carrier_changes too
    monitor.poll(4 * SECOND)
    monitor.stop()
    assert sorted(asked) == ["docker0", "docker0", "ens1f0", "ens1f1", "ens1f1"]
    assert store.flush()
    assert {r["speed_max_mbps"] for r in net_rows(store.db, "ens1f0")} == {400000}
    assert {r["speed_max_mbps"] for r in net_rows(store.db, "docker0")} == {None}


def test_interfaces_that_come_and_go_are_counted_in_meta(tree, store):
    monitor = started(tree, store)
    monitor.poll(0)
    tree.add_interface("ens2f0")
    monitor.poll(SECOND)
    assert store.flush() and meta(store.db)["net_interfaces"] == "4"
    tree.remove("class/net/ens2f0")
    tree.remove("class/net/ens1f1")
    monitor.poll(2 * SECOND)
    monitor.stop()
    assert store.flush()
    assert meta(store.db)["net_interfaces"] == "2"
    assert [r["ts"] for r in net_rows(store.db, "ens2f0")] == [SECOND]


def test_a_node_without_rdma_says_so_in_meta_only(tmp_path, store):
    tree = NetSysfs(tmp_path / "sys")
    tree.add_interface("eth0")
    monitor = started(tree, store)
    assert monitor.notices == []                                   # absent hardware: nothing to say
    monitor.poll(0)
    monitor.stop()
    assert store.flush()
    info = meta(store.db)
    assert info["rdma_ports"] == "0"
    assert info["rdma_reason"] == f"no RDMA ports ({tree.root}/class/infiniband is absent)"
    assert "net_error" not in info and info["net_state"] == "read"
    assert query(store.db, "SELECT count(*) FROM rdma_samples") == [(0,)]
    assert query(store.db, "SELECT count(*) FROM net_samples") == [(1,)]


@pytest.mark.parametrize("broken, other", [("net", "rdma"), ("rdma", "net")])
def test_a_part_that_fails_is_said_once_in_meta_and_the_other_goes_on(tree, store, broken, other):
    monitor = started(tree, store)
    monitor.poll(0)
    moved = Path(tree.root, "class", "moved")
    part_dir = Path(tree.root, "class", "net" if broken == "net" else "infiniband")
    part_dir.rename(moved)
    part_dir.write_text("not a directory\n")                      # listing it fails (ENOTDIR)
    monitor.poll(SECOND)
    monitor.poll(2 * SECOND)
    assert store.flush()
    error = meta(store.db)["net_error"]
    assert error.startswith(f"{broken}: ") and "Not a directory" in error
    part_dir.unlink()
    moved.rename(part_dir)                                        # back: read again at the next interval
    monitor.poll(3 * SECOND)
    monitor.stop()
    assert store.flush()
    assert meta(store.db)["net_error"] == error                   # said once, the first failure's text
    other_ts = ([r["ts"] for r in net_rows(store.db, "ens1f0")] if other == "net"
                else [r["ts"] for r in rdma_rows(store.db, "mlx5_0", 1)])
    broken_ts = ([r["ts"] for r in net_rows(store.db, "ens1f0")] if broken == "net"
                 else [r["ts"] for r in rdma_rows(store.db, "mlx5_0", 1)])
    assert other_ts == [0, SECOND, 2 * SECOND, 3 * SECOND]
    assert broken_ts == [0, 3 * SECOND]


def test_sysfs_that_cannot_be_listed_is_said_once_at_start(tmp_path, store):
    monitor = started(NetSysfs(tmp_path / "sys"), store, enabled=True)
    monitor.stop()
    missing = NetMonitor("n1", store.submit, store.set_meta, sysfs_root=str(tmp_path / "nowhere"))
    notices = missing.start(now_ns=0, thread=False)
    missing.stop()
    assert [what for what, _why in notices] == ["net"]
    assert notices[0][1].startswith(f"cannot list {tmp_path}/nowhere/class/net (No such file or directory)")
    assert store.flush()
    info = meta(store.db)
    assert (info["net_state"], info["net_reason"]) == ("not read", notices[0][1])


def test_more_interfaces_than_the_bound_are_said_once(tree, store):
    for index in range(260):
        tree.add_interface(f"veth{index:04d}", physical=False)
    monitor = started(tree, store)
    assert monitor.notices == [("net", "7 of 263 beyond the first 256 (physical ones first, then by name)")]
    monitor.poll(0)
    monitor.poll(SECOND)
    monitor.stop()
    assert store.flush()
    assert meta(store.db)["net_not_read"] == monitor.notices[0][1]
    assert query(store.db, "SELECT count(*) FROM net_samples WHERE ts = ?", (SECOND,)) == [(256,)]
    assert net_rows(store.db, "ens1f0") and not net_rows(store.db, "veth0259")


def test_turned_off_it_reads_nothing_and_says_so_in_meta(tree, store):
    monitor = started(tree, store, enabled=False)
    monitor.poll(0)
    monitor.stop()
    assert monitor.notices == [] and monitor._thread is None
    assert store.flush()
    assert meta(store.db)["net_state"] == "turned off (--no-net)"
    assert query(store.db, "SELECT count(*) FROM net_samples") == [(0,)]


def test_the_thread_samples_on_its_own_until_stopped(tree, store):
    monitor = NetMonitor("n1", store.submit, store.set_meta, interval_ns=SECOND // 20, sysfs_root=tree.root)
    assert monitor.start() == []
    assert "straggler-net" in [t.name for t in threading.enumerate()]
    deadline = time.monotonic() + 30
    while monitor.rdma_samples_written < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    monitor.stop()
    assert monitor.rdma_samples_written >= 3 and monitor.samples_written >= 9
    assert "straggler-net" not in [t.name for t in threading.enumerate()]
    assert store.flush()
    assert len(net_rows(store.db, "ens1f0")) >= 3 and "net_cpu_ns" in meta(store.db)


def test_the_agent_starts_the_network_thread_says_what_is_not_read_and_stops_it(tmp_path):
    """Agent._start_network and its shutdown, without the probes: a writer, the options, the events."""
    from straggler.agent import Agent, AgentEvents, AgentOptions

    class Events(AgentEvents):
        def __init__(self):
            self.said = []

        def network_not_read(self, what, why):
            self.said.append((what, why))

    events = Events()
    agent = Agent(AgentOptions(node="n1", db=str(tmp_path / "a.db"), sysfs_root=str(tmp_path / "nowhere"),
                               net_interval_s=0.05), events)
    agent.writer = StoreWriter(agent.opts.db, "n1")
    agent.writer.start()
    agent._start_network()
    assert [what for what, _ in events.said] == ["net"] and "nowhere/class/net" in events.said[0][1]
    assert agent.network._thread.is_alive()                       # RDMA is looked for (none there)
    agent._shutdown()
    assert not agent.network._thread.is_alive()
    info = meta(agent.opts.db)
    assert (info["net_state"], info["net_interval_ns"]) == ("not read", str(SECOND // 20))
    assert "net_cpu_ns" in info


# ---- the real /sys --------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir("/sys/class/net"), reason="no sysfs here")
def test_the_real_sys_is_read_without_the_loopback():
    before = set(os.listdir("/sys/class/net"))
    listing = sysfs.list_interfaces()
    after = set(os.listdir("/sys/class/net"))
    read = set(listing.entries)
    assert "lo" not in read
    assert (before & after) - {"lo"} <= read <= before | after   # interfaces may come and go meanwhile
    samples = [sysfs.read_interface(name) for name in listing.entries]
    for sample in samples:
        assert sample.speed_mbps is None or sample.speed_mbps >= 0
        assert sample.speed_max_mbps is None or sample.speed_max_mbps in sysfs.LINK_MODE_SPEEDS.values()
        assert sample.carrier in (None, 0, 1) and sample.duplex in (None, "full", "half")
    still_there = [s for s in samples if s.iface in after]
    assert all(s.mtu is not None and s.rx_bytes is not None for s in still_there)
    rdma = sysfs.list_rdma_ports()
    assert (len(rdma.entries) > 0) == (os.path.isdir("/sys/class/infiniband") and rdma.total > 0)
    for device, port in rdma.entries:
        assert sysfs.read_rdma_port(device, port).port == port


# ---- the command ----------------------------------------------------------------------------------
def test_trace_help_lists_the_network_flags():
    proc = subprocess.run([sys.executable, "-m", "straggler.cli", "trace", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--net-interval S" in text and "--no-net " in text and "--sysfs-root DIR" in text
    assert "for a stand-in tree in tests (default /sys)" in text


def test_the_network_flags_make_the_agents_options(tmp_path):
    from straggler.cli import build_parser
    from straggler.cli.trace import agent_options
    from straggler.errors import StragglerError
    parse = build_parser(only="trace").parse_args
    db = str(tmp_path / "t.db")
    opts = agent_options(parse(["trace", "--node", "n1", "--db", db]))
    assert (opts.net, opts.net_interval_ns, opts.sysfs_root) == (True, SECOND, "/sys")
    opts = agent_options(parse(["trace", "--node", "n1", "--db", db, "--no-net", "--net-interval", "0.25",
                                "--sysfs-root", str(tmp_path)]))
    assert (opts.net, opts.net_interval_ns, opts.sysfs_root) == (False, SECOND // 4, str(tmp_path))
    with pytest.raises(StragglerError, match="^--net-interval 0: "):
        agent_options(parse(["trace", "--node", "n1", "--db", db, "--net-interval", "0"]))
