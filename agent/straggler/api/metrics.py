"""Prometheus metrics of one node: the step-time model of its ranks over the last seconds, what
the agent lost and what it costs. Rendered by prometheus-client (the standard text exposition
format), served on the API port under /metrics (mutual TLS) and, optionally, on a plain
loopback-only port (`--metrics-listen`) for a local Prometheus agent or node exporter.

Every number comes from the node's store (thread_time, lost_events, agent_cost), computed at
scrape time with the step-time model explain reads too (straggler.store.steptime): no second copy of its rules.
A node cannot tell by itself whether it is the straggler (that needs its peers: `straggler
watch`, or a PromQL rule across nodes, see README), so it exports what the rule compares:

  straggler_rank_wait_ratio{node,rank,pid,wait}         share of wall time the rank waited for its peers
                                                        (wait="blocking": collectives + blocked;
                                                        wait="enqueue": + synchronize)
  straggler_rank_component_ratio{node,rank,pid,component}  its calling thread's step time by component
                                                        (work, sync, coll, runq, io, blocked, host)
  straggler_rank_runq_thief_ratio{node,rank,pid,kind,thief_pid,thief}  run-queue wait by who held the
                                                        CPU (top 3), share of wall time
  straggler_rank_calls_per_second{node,rank,pid}        traced calls of its calling thread
  straggler_window_seconds{node}                        the window the ratios are over
  straggler_summary_age_seconds{node}                   age of the newest summary (agent liveness)
  straggler_lost_events_total{node,probe}               events lost (ring buffer, writer queue)
  straggler_agent_cpu_ratio{node}                       the agent's CPU over its last interval (cores)
  straggler_agent_rss_bytes{node}

and, on a node whose agent reads its GPUs (NVML), one series per GPU from the newest gpu_samples row,
named and labelled as NVIDIA's dcgm-exporter names them where it has an equivalent (DCGM_FI_DEV_SM_CLOCK,
DCGM_FI_DEV_GPU_TEMP, ...; labels gpu, UUID, pci_bus_id, device, modelName, Hostname, node), so existing
GPU dashboards and alerts read them, plus straggler_gpu_* for what it has not (the list and the mapping:
docs/devices.md, "On /metrics"). A node without GPUs has none of these families, not even empty ones.

Likewise, from the newest net_samples row per interface and rdma_samples row per RDMA port, the series
node_exporter's netdev, netclass and infiniband collectors export, with their names, types, units and labels
(node_network_receive_bytes_total{device}, node_network_speed_bytes, node_network_up, ...,
node_infiniband_port_data_received_bytes_total{device,port}, ...; plus node), so network dashboards read
them (the list: docs/network.md). A NULL value leaves its series out; a store without the tables, none.

This module reads the store and never writes it; it does not know the HTTPS server (server.py
serves render() as a route; the plain port here shares only the host:port rule of straggler.addresses).
"""
import json
import sqlite3
import time

from .. import defaults
from ..addresses import format_address, is_loopback, parse_listen
from ..errors import StragglerError
from ..devices.nvml import CLOCK_EVENTS
from ..store import steptime
from ..store.schema import GPU_SAMPLE_COLUMNS, NET_SAMPLE_COLUMNS, RDMA_SAMPLE_COLUMNS
from ..store.query import reading
from ..text import one_line

DEFAULT_WINDOW_S = 10.0
DEFAULT_TIMEOUT_S = 5.0                 # one scrape's reads; SQLite is interrupted at it
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsUnavailable(Exception):
    """prometheus-client is not installed on this node."""


def _prometheus():
    try:
        import prometheus_client  # noqa: F401
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.exposition import generate_latest
        from prometheus_client.registry import CollectorRegistry
    except ImportError:
        raise MetricsUnavailable("prometheus-client is not installed on this node: install python3-prometheus-client "
                                 "(Debian/Ubuntu) or `pip install prometheus-client` into the agent's environment") from None
    return CounterMetricFamily, GaugeMetricFamily, generate_latest, CollectorRegistry


# ---------------------------------------------------------------- the GPUs (gpu_samples)

MIB = 1 << 20
MAX_GPU_ROWS = 256              # gpus rows one scrape reads (a node has a few GPUs; a swapped one adds a row)
STALE_INTERVALS = 3             # a GPU's values are shown while its newest sample is younger than this many
                                # sampling intervals (and at least the window); its age is shown always

# (metric, help, gpu_samples column, scale): gauges named as dcgm-exporter names the same DCGM field (its
# default-counters.csv and DCGM's field list), with its units. dcgm-exporter types the cumulative ones
# (ECC, NVLink errors, remapped rows) as counters; prometheus-client names every counter NAME_total, so
# they are gauges here: the series name is what dashboards and alerts match, and rate() reads either.
DCGM_GAUGES = (
    ("DCGM_FI_DEV_SM_CLOCK", "The SM clock now, MHz.", "sm_clock_mhz", 1),
    ("DCGM_FI_DEV_MAX_SM_CLOCK", "The most the SM clock can run at, MHz.", "sm_clock_max_mhz", 1),
    ("DCGM_FI_DEV_MEM_CLOCK", "The memory clock now, MHz.", "mem_clock_mhz", 1),
    ("DCGM_FI_DEV_MAX_MEM_CLOCK", "The most the memory clock can run at, MHz.", "mem_clock_max_mhz", 1),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Why the clocks are held down: NVML's clock-event (throttle) reasons "
     "bitmask (straggler_gpu_clock_event names them).", "clock_events", 1),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU die temperature, degrees C.", "temperature_c", 1),
    ("DCGM_FI_DEV_POWER_USAGE", "Power the board draws, W.", "power_mw", 1e-3),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "The power limit the driver enforces, W.", "power_limit_mw", 1e-3),
    ("DCGM_FI_DEV_GPU_UTIL", "Percent of the last sample period a kernel ran.", "util_gpu_pct", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Percent of the last sample period device memory was read or written.", "util_mem_pct", 1),
    ("DCGM_FI_DEV_FB_USED", "Device memory in use, MiB.", "mem_used_bytes", MIB),
    ("DCGM_FI_DEV_FB_FREE", "Device memory not in use, MiB.", "mem_free_bytes", MIB),
    ("DCGM_FI_DEV_FB_TOTAL", "Device memory, MiB.", "mem_total_bytes", MIB),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "The PCIe link's generation now.", "pcie_gen", 1),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "The highest PCIe generation this GPU and slot can do.", "pcie_gen_max", 1),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "The PCIe link's lanes now.", "pcie_width", 1),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "The most PCIe lanes this GPU and slot can do.", "pcie_width_max", 1),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink data-link replays, all links, since the driver "
     "loaded.", "nvlink_replay_errors", 1),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink link recoveries, all links, since the driver loaded.",
     "nvlink_recovery_errors", 1),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Corrected ECC errors since the driver loaded.", "ecc_corrected", 1),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Uncorrected ECC errors since the driver loaded.",
     "ecc_uncorrected", 1),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Memory rows remapped after correctable errors.",
     "remapped_rows_corrected", 1),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Memory rows remapped after uncorrectable errors.",
     "remapped_rows_uncorrected", 1),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "1: a row remap waits for the GPU's reset.",
     "remap_pending", 1),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1: a row remap failed (the GPU needs service).", "remap_failure", 1),
    ("DCGM_FI_DEV_XID_ERRORS", "The code of the GPU's last Xid error in this node's store (0: none).",
     "last_xid", 1),
)
# what dcgm-exporter has no equal for (DCGM_FI_DEV_PCIE_TX_THROUGHPUT is a counter of KB there; NVLink CRC
# errors are two fields there, flit and data, summed here)
OWN_GAUGES = (
    ("straggler_gpu_pcie_tx_kb_per_second", "PCIe transmit throughput, KB/s as NVML measures it (over 20 ms).",
     "pcie_tx_kb_s", 1),
    ("straggler_gpu_pcie_rx_kb_per_second", "PCIe receive throughput, KB/s as NVML measures it (over 20 ms).",
     "pcie_rx_kb_s", 1),
    ("straggler_gpu_nvlink_links_up", "NVLinks up (no series: the GPU has no NVLink).", "nvlink_links", 1),
    ("straggler_gpu_nvlink_crc_errors", "NVLink receive CRC errors, flit + data, all links, since the driver loaded.",
     "nvlink_crc_errors", 1),
)
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "node"]

_GPU_VALUE_COLUMNS = [c for c in GPU_SAMPLE_COLUMNS[3:] if c != "read_error"]
_GPU_NAMES = ("gpu", "uuid", "name", "bus", "minor", "ts", *_GPU_VALUE_COLUMNS, "read_error", "last_xid",
              "interval_ns")
# The newest sample of each GPU the agent lists: per GPU its MAX(ts) and its last Xid through the
# (node, gpu, ts) indexes, so a scrape costs a few index look-ups per GPU however long the store is.
_GPU_SQL = (
    "SELECT g.gpu, g.uuid, g.name, g.pci_bus_id, g.minor, s.ts, "
    + ", ".join(f"s.{c}" for c in _GPU_VALUE_COLUMNS) + ", s.read_error, "
    "(SELECT e.xid FROM gpu_errors e WHERE e.node = g.node AND e.gpu = g.gpu ORDER BY e.ts DESC LIMIT 1), "
    "(SELECT value FROM meta WHERE key = 'devices_interval_ns') "
    "FROM gpus g JOIN gpu_samples s ON s.node = g.node AND s.gpu = g.gpu "
    "AND s.ts = (SELECT MAX(m.ts) FROM gpu_samples m WHERE m.node = g.node AND m.gpu = g.gpu) "
    "ORDER BY g.gpu, s.ts DESC, g.last_seen DESC LIMIT ?")


def nvml_bus_id(pci_bus_id):
    """'0000:3b:00.0' (the store's) as NVML and dcgm-exporter write it: '00000000:3B:00.0'."""
    if not pci_bus_id or ":" not in pci_bus_id:
        return pci_bus_id or ""
    domain, rest = pci_bus_id.split(":", 1)
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return pci_bus_id


def newest_per_gpu(rows):
    """One row per GPU index: the newest sample (and, of the gpus rows at that index, the last seen)."""
    out = {}
    for row in rows:            # ordered by gpu, sample ts, last_seen, newest first
        out.setdefault(row["gpu"], row)
    return [out[g] for g in sorted(out)]


def gpu_families(Gauge, rows, node, now_ns, window_s):
    """The GPU metric families that have samples (a node without GPUs: none)."""
    rows = newest_per_gpu(rows)
    if not rows:
        return []
    newest = max(r["ts"] for r in rows)
    end = now_ns if newest <= now_ns + 1_000_000_000 else newest    # a store from another boot: its own end
    families = {}

    def add(name, doc, labels, value, extra=()):
        family = families.get(name)
        if family is None:
            family = families[name] = Gauge(name, doc, labels=GPU_LABELS + [k for k, _ in extra])
        family.add_metric(labels + [v for _, v in extra], value)

    for r in rows:
        labels = [str(r["gpu"]), r["uuid"] or "", nvml_bus_id(r["bus"]),
                  "" if r["minor"] is None else f"nvidia{r['minor']}", r["name"] or "", node, node]
        age_ns = max(0, end - r["ts"])
        add("straggler_gpu_sample_age_seconds", "Age of the newest NVML sample of this GPU (a stale sampler: "
            "its other series are gone)", labels, round(age_ns / 1e9, 3))
        interval_ns = int(r["interval_ns"]) if str(r["interval_ns"] or "").isdigit() else 1_000_000_000
        if age_ns > max(window_s * 1e9, STALE_INTERVALS * interval_ns):
            continue
        values = dict(r)
        used, total = values["mem_used_bytes"], values["mem_total_bytes"]
        values["mem_free_bytes"] = total - used if used is not None and total is not None else None
        values["last_xid"] = values["last_xid"] or 0
        for name, doc, column, scale in DCGM_GAUGES + OWN_GAUGES:
            value = values[column]
            if value is None:
                continue
            add(name, doc, labels, int(value) // scale if scale == MIB else round(value * scale, 3))
        mask = values["clock_events"]
        if mask is not None:
            for bit, reason in CLOCK_EVENTS:
                add("straggler_gpu_clock_event", "1 while this clock-event reason holds the clocks down (fault: "
                    "sw_power_cap, hw_slowdown, sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown)",
                    labels, 1 if mask & bit else 0, extra=[("reason", reason)])
        if values["read_error"]:
            add("straggler_gpu_read_error", "1: NVML failed to read values of this GPU's newest sample "
                "(e.g. GPU is lost)", labels, 1, extra=[("error", values["read_error"])])
    return list(families.values())


# ---------------------------------------------------------------- the network (net_samples, rdma_samples)

MAX_NET_ROWS = 4096             # interfaces (or RDMA ports) one scrape reads: a node with many containers has
                                # a veth each
MBPS_BYTES = 125_000            # node_exporter's speed unit: bytes per second (Mb/s × 10^6 / 8)
GBPS_BYTES = 125_000_000
IB_WORD = 4                     # the InfiniBand data counters count 4-byte words (node_exporter multiplies too)


def _plus(a, b):
    """a + b where b may be missing (node_exporter adds the missed frames to the receive drops, as
    /proc/net/dev does)."""
    return None if a is None else a + (b or 0)


def _id_of(text, names):
    """An InfiniBand state as node_exporter numbers it: 'ACTIVE' or sysfs's '4: ACTIVE' -> 4; None when
    unknown."""
    if text is None:
        return None
    head, _, name = str(text).partition(":")
    if name and head.strip().isdigit():
        return int(head)
    return names.get(str(text).replace(" ", "").lower())


IB_STATES = {"nop": 0, "nostatechange": 0, "down": 1, "init": 2, "armed": 3, "active": 4, "active_defer": 5,
             "activedefer": 5}
IB_PHYS_STATES = {"nostatechange": 0, "sleep": 1, "polling": 2, "disabled": 3, "portconfigurationtraining": 4,
                  "shift": 4, "linkup": 5, "linkerrorrecovery": 6, "phytest": 7}

# (metric, counter?, help, value of the newest net_samples row): node_exporter's netdev collector's names
# (its default, /proc/net/dev-compatible ones: receive_drop includes the missed frames) and its netclass
# collector's, in its units; a NULL (the interface does not report it) leaves the series out.
NET_SERIES = (
    ("node_network_receive_bytes_total", True, "Network device statistic receive_bytes.", lambda r: r["rx_bytes"]),
    ("node_network_transmit_bytes_total", True, "Network device statistic transmit_bytes.", lambda r: r["tx_bytes"]),
    ("node_network_receive_packets_total", True, "Network device statistic receive_packets.",
     lambda r: r["rx_packets"]),
    ("node_network_transmit_packets_total", True, "Network device statistic transmit_packets.",
     lambda r: r["tx_packets"]),
    ("node_network_receive_errs_total", True, "Network device statistic receive_errs.", lambda r: r["rx_errors"]),
    ("node_network_transmit_errs_total", True, "Network device statistic transmit_errs.", lambda r: r["tx_errors"]),
    ("node_network_receive_drop_total", True, "Network device statistic receive_drop (dropped + missed).",
     lambda r: _plus(r["rx_dropped"], r["rx_missed_errors"])),
    ("node_network_transmit_drop_total", True, "Network device statistic transmit_drop.", lambda r: r["tx_dropped"]),
    ("node_network_receive_crc_errors_total", True, "Network device statistic receive_crc_errors (a bad cable "
     "or optic).", lambda r: r["rx_crc_errors"]),
    ("node_network_carrier_changes_total", True, "Network device property: carrier_changes_total",
     lambda r: r["carrier_changes"]),
    ("node_network_up", False, "Value is 1 if operstate is 'up', 0 otherwise.",
     lambda r: None if r["operstate"] is None else int(r["operstate"] == "up")),
    ("node_network_carrier", False, "Network device property: carrier", lambda r: r["carrier"]),
    ("node_network_mtu_bytes", False, "Network device property: mtu_bytes", lambda r: r["mtu"]),
    ("node_network_speed_bytes", False, "Network device property: speed_bytes",
     lambda r: r["speed_mbps"] * MBPS_BYTES if r["speed_mbps"] is not None and r["speed_mbps"] >= 0 else None),
    ("straggler_network_speed_max_bytes", False, "The most the interface's link modes allow, bytes per second "
     "(a link negotiated below it: node_network_speed_bytes < this)",
     lambda r: r["speed_max_mbps"] * MBPS_BYTES if r["speed_max_mbps"] else None),
)
# the same for the newest rdma_samples row of each port: node_exporter's infiniband collector
RDMA_SERIES = (
    ("node_infiniband_port_data_received_bytes_total", True, "Number of data octets received on all links",
     lambda r: None if r["port_rcv_data"] is None else r["port_rcv_data"] * IB_WORD),
    ("node_infiniband_port_data_transmitted_bytes_total", True, "Number of data octets transmitted on all links",
     lambda r: None if r["port_xmit_data"] is None else r["port_xmit_data"] * IB_WORD),
    ("node_infiniband_port_packets_received_total", True, "Number of packets received on all VLs by this port "
     "(including errors)", lambda r: r["port_rcv_packets"]),
    ("node_infiniband_port_packets_transmitted_total", True, "Number of packets transmitted on all VLs from this "
     "port (including errors)", lambda r: r["port_xmit_packets"]),
    ("node_infiniband_port_transmit_wait_total", True, "Number of ticks during which the port had data to transmit "
     "but no data was sent during the entire tick", lambda r: r["port_xmit_wait"]),
    ("node_infiniband_port_discards_transmitted_total", True, "Number of outbound packets discarded by the port "
     "because the port is down or congested", lambda r: r["port_xmit_discards"]),
    ("node_infiniband_port_errors_received_total", True, "Number of packets containing an error that were "
     "received on this port", lambda r: r["port_rcv_errors"]),
    ("node_infiniband_port_receive_remote_physical_errors_total", True, "Number of packets marked with the EBP "
     "(End of Bad Packet) delimiter received on the port.", lambda r: r["port_rcv_remote_physical_errors"]),
    ("node_infiniband_symbol_error_total", True, "Number of minor link errors detected on one or more physical "
     "lanes.", lambda r: r["symbol_error"]),
    ("node_infiniband_link_error_recovery_total", True, "Number of times the link successfully recovered from an "
     "error state", lambda r: r["link_error_recovery"]),
    ("node_infiniband_link_downed_total", True, "Number of times the link failed to recover from an error state "
     "and went down", lambda r: r["link_downed"]),
    ("node_infiniband_local_link_integrity_errors_total", True, "Number of times that the count of local physical "
     "errors exceeded the threshold specified by LocalPhyErrors.", lambda r: r["local_link_integrity_errors"]),
    ("node_infiniband_excessive_buffer_overrun_errors_total", True, "Number of times that OverrunErrors "
     "consecutive flow control update periods occurred, each having at least one overrun error.",
     lambda r: r["excessive_buffer_overrun_errors"]),
    ("node_infiniband_rate_bytes_per_second", False, "Maximum signal transfer rate",
     lambda r: None if r["rate_gbps"] is None else round(r["rate_gbps"] * GBPS_BYTES)),
    ("node_infiniband_state_id", False, "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, "
     "4: active, 5: act defer)", lambda r: _id_of(r["state"], IB_STATES)),
    ("node_infiniband_physical_state_id", False, "Physical state of the InfiniBand port (0: no change, 1: sleep, "
     "2: polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)",
     lambda r: _id_of(r["phys_state"], IB_PHYS_STATES)),
)


def newest_samples(conn, table, keys, columns, now_ns, window_s):
    """The newest row of each `keys` (an interface; a device and port) of a sampled table, as dicts, when
    young enough to show: within max(window, STALE_INTERVALS sampling intervals) of the end (now, or the
    newest row of a store from another boot). A sampler that stopped shows nothing; so does an interface
    that went away. The interval is the newest row's distance to its predecessor. Reads only the recent
    rows, by the (ts) and (node, key, ts) indexes. [] for a store from before the table."""
    try:
        newest = conn.execute(f"SELECT node, {', '.join(keys)}, ts FROM {table} ORDER BY ts DESC LIMIT 1").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        return []               # a store from before schema 5 (served read-only): no network
    if newest is None:
        return []
    node, *key, ts = newest
    where = " AND ".join(f"{k} = ?" for k in keys)
    (before,) = conn.execute(f"SELECT MAX(ts) FROM {table} WHERE node = ? AND {where} AND ts < ?",
                             (node, *key, ts)).fetchone()
    interval_ns = ts - before if before is not None else 1_000_000_000
    end = now_ns if ts <= now_ns + 1_000_000_000 else ts
    horizon = max(int(window_s * 1e9), STALE_INTERVALS * interval_ns)
    if end - ts > horizon:
        return []
    # MAX(ts) with GROUP BY: SQLite takes the other columns from the row that holds the maximum
    cur = conn.execute(f"SELECT MAX(ts), {', '.join(columns)} FROM {table} WHERE ts >= ? "
                       f"GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)} LIMIT ?", (end - horizon, MAX_NET_ROWS))
    return [dict(zip(("ts",) + tuple(columns), row)) for row in cur]


def network_families(Counter, Gauge, net_rows, rdma_rows, node):
    """node_exporter's network and InfiniBand families of the interfaces and ports that have recent samples
    (none: no family, not even an empty one)."""
    families = {}

    def add(series, labels, label_values, row):
        for name, counter, doc, value_of in series:
            value = value_of(row)
            if value is None:
                continue
            family = families.get(name)
            if family is None:
                family = families[name] = (Counter if counter else Gauge)(name, doc, labels=labels)
            family.add_metric(label_values, value)

    for r in net_rows:
        add(NET_SERIES, ["device", "node"], [r["iface"], node], r)
    for r in rdma_rows:
        add(RDMA_SERIES, ["device", "port", "node"], [r["device"], str(r["port"]), node], r)
    return list(families.values())


def _read(db_path, window_s, at_ns=None, timeout_s=DEFAULT_TIMEOUT_S):
    with reading(db_path, timeout_s, "the metrics") as conn:
        newest = conn.execute("SELECT MAX(ts + interval_ns) FROM thread_time").fetchone()[0]
        now = time.monotonic_ns() if at_ns is None else int(at_ns)
        rows = []
        if newest is not None:
            # the window ends now on the node's clock: a job that ended has no rank series (as a watch
            # judges only running ranks); a store from another boot (a copy) is read up to its end
            end = now if newest <= now + 1_000_000_000 else newest
            since = end - int(window_s * 1e9)
            cur = conn.execute(
                "SELECT pid, tid, MIN(rank), MIN(comm), SUM(calls), SUM(work_ns), SUM(sync_ns), SUM(coll_ns), "
                "SUM(runq_ns), SUM(runq_work_ns), SUM(runq_sync_ns), SUM(runq_coll_ns), SUM(blocked_ns), SUM(io_ns), "
                "MIN(ts), MAX(ts + interval_ns), GROUP_CONCAT(thieves, '\x1f') "
                "FROM thread_time WHERE ts >= ? GROUP BY pid, tid", (since,))
            names = ("pid", "tid", "rank", "comm", "calls", "work_ns", "sync_ns", "coll_ns", "runq_ns", "runq_work_ns",
                     "runq_sync_ns", "runq_coll_ns", "blocked_ns", "io_ns", "t0", "t1", "thieves")
            rows = [dict(zip(names, r)) for r in cur.fetchall()]
        lost = conn.execute("SELECT probe, SUM(count) FROM lost_events GROUP BY probe").fetchall()
        cost = conn.execute("SELECT interval_ns, cpu_seconds, rss_bytes FROM agent_cost ORDER BY ts DESC LIMIT 1").fetchone()
        try:
            gpus = [dict(zip(_GPU_NAMES, r)) for r in conn.execute(_GPU_SQL, (MAX_GPU_ROWS,))]
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            gpus = []           # a store from before schema 3 (served read-only): no GPUs
        nets = newest_samples(conn, "net_samples", ("iface",), NET_SAMPLE_COLUMNS[2:], now, window_s)
        ports = newest_samples(conn, "rdma_samples", ("device", "port"), RDMA_SAMPLE_COLUMNS[2:], now, window_s)
    return newest, rows, lost, cost, now, gpus, (nets, ports)


def rank_summaries(rows, window_ns):
    """[(RankTime, thieves {(kind, pid, comm): ns})] per process with calls, from thread_time sums."""
    by_pid = {}
    for r in rows:
        by_pid.setdefault(r["pid"], []).append(r)
    out = []
    for pid, threads in sorted(by_pid.items()):
        main = steptime.calling_thread(threads)
        if main is None:
            continue
        wall = max(1, min(window_ns, max(t["t1"] for t in threads) - min(t["t0"] for t in threads)))
        rt = steptime.rank_time(pid, threads, wall, main.get("rank"), main["tid"])
        if rt is None:
            continue
        thieves = {}
        for t in threads:   # the rank's threads' run-queue wait by holder
            for blob in (t.get("thieves") or "").split("\x1f"):
                if not blob:
                    continue
                try:
                    entries = json.loads(blob)
                except ValueError:
                    continue
                for kind, tpid, comm, ns in entries:
                    key = (kind, tpid, comm)
                    thieves[key] = thieves.get(key, 0) + int(ns or 0)
        out.append((rt, thieves))
    return out


class NodeCollector:
    """A prometheus-client collector over one node's store (computed at each scrape)."""

    def __init__(self, db_path, node, window_s=DEFAULT_WINDOW_S, at_ns=None, timeout_s=DEFAULT_TIMEOUT_S):
        self.db_path, self.node, self.window_s, self.at_ns = db_path, node, float(window_s), at_ns
        self.timeout_s = timeout_s

    def collect(self):
        Counter, Gauge, _, _ = _prometheus()
        newest, rows, lost, cost, now, gpus, (nets, ports) = _read(self.db_path, self.window_s, self.at_ns,
                                                                   self.timeout_s)
        node = self.node
        wait = Gauge("straggler_rank_wait_ratio", "Share of wall time the rank's calling thread waited for its peers "
                     "(blocking: collectives + blocked; enqueue: also synchronize)", labels=["node", "rank", "pid", "wait"])
        comp = Gauge("straggler_rank_component_ratio", "The rank's step time by component (share of wall time)",
                     labels=["node", "rank", "pid", "component"])
        thief = Gauge("straggler_rank_runq_thief_ratio", "Run-queue wait of the rank's threads by who held the CPU "
                      "(top 3, share of wall time)", labels=["node", "rank", "pid", "kind", "thief_pid", "thief"])
        rate = Gauge("straggler_rank_calls_per_second", "Traced calls per second of the rank's calling thread",
                     labels=["node", "rank", "pid"])
        window_ns = int(self.window_s * 1e9)
        for rt, thieves in rank_summaries(rows, window_ns):
            labels = [node, "" if rt.rank is None else str(rt.rank), str(rt.key)]
            for name in steptime.WAIT_DEFS:
                wait.add_metric(labels + [name], round(rt.wait_share(name), 6))
            for c in steptime.COMPONENTS:
                comp.add_metric(labels + [c], round(rt.share(c), 6))
            for (kind, tpid, comm), ns in sorted(thieves.items(), key=lambda kv: -kv[1])[:3]:
                thief.add_metric(labels + [str(kind), "" if tpid is None else str(tpid), comm or ""],
                                 round(ns / rt.wall_ns, 6))
            rate.add_metric(labels, round(rt.calls / (rt.wall_ns / 1e9), 3))
        yield wait
        yield comp
        yield thief
        yield rate
        window = Gauge("straggler_window_seconds", "The window the rank ratios are computed over", labels=["node"])
        window.add_metric([node], self.window_s)
        yield window
        age = Gauge("straggler_summary_age_seconds", "Age of the newest step-time summary on this node",
                    labels=["node"])
        if newest is not None:
            age.add_metric([node], round(max(0, now - newest) / 1e9, 3))
        yield age
        lost_family = Counter("straggler_lost_events", "Events the agent lost (ring buffer overruns, writer queue)",
                              labels=["node", "probe"])
        for probe, count in lost:
            lost_family.add_metric([node, probe], int(count or 0))
        yield lost_family
        cpu = Gauge("straggler_agent_cpu_ratio", "The agent's CPU over its last interval (1.0 = one core)",
                    labels=["node"])
        rss = Gauge("straggler_agent_rss_bytes", "The agent's resident memory", labels=["node"])
        if cost is not None and cost[0]:
            cpu.add_metric([node], round(float(cost[1]) / (cost[0] / 1e9), 6))
            if cost[2] is not None:
                rss.add_metric([node], int(cost[2]))
        yield cpu
        yield rss
        yield from gpu_families(Gauge, gpus, node, now, self.window_s)
        yield from network_families(Counter, Gauge, nets, ports, node)


def render(db_path, node, window_s=DEFAULT_WINDOW_S, at_ns=None, timeout_s=DEFAULT_TIMEOUT_S):
    """The metrics of one node's store in the text exposition format (bytes). at_ns: the node's
    CLOCK_MONOTONIC the window ends at (default: now). QueryTimeout when the reads take longer than
    timeout_s."""
    _, _, generate_latest, CollectorRegistry = _prometheus()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(db_path, node, window_s, at_ns, timeout_s))
    return generate_latest(registry)


# ---------------------------------------------------------------- the plain loopback port

DEFAULT_METRICS_LISTEN = defaults.METRICS_LISTEN
DEFAULT_METRICS_PORT = parse_listen(DEFAULT_METRICS_LISTEN, 0).port   # for an ADDR given without one
PLAIN_MAX_CONNECTIONS = 8         # the plain port's connections at once (a thread each); past them: a 503, closed
PLAIN_CONNECTION_S = 15.0         # a connection's whole life there (a scrape takes well under a second)
PLAIN_READ_TIMEOUT_S = 5.0        # each read on it


def start_plain_server(db_path, node, listen=DEFAULT_METRICS_LISTEN, any_address=False, window_s=DEFAULT_WINDOW_S):
    """Serve GET /metrics (only) over plain HTTP in a background thread; returns (server, thread).

    Loopback only unless any_address: the metrics name processes and hosts, and this port has no
    TLS; a remote Prometheus scrapes the API port's /metrics with a client certificate instead.
    Bounded: at most PLAIN_MAX_CONNECTIONS at once (the next is answered 503 and closed), each cut
    after PLAIN_CONNECTION_S whatever it does (an idle or dribbling client holds no thread for long)."""
    import logging
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    _prometheus()   # fail at start, not at the first scrape
    host, port = parse_listen(listen, DEFAULT_METRICS_PORT, what="--metrics-listen")
    if not is_loopback(host) and not any_address:
        raise StragglerError(f"--metrics-listen {listen}: the plain metrics port binds to loopback only "
                             f"(127.0.0.1 or ::1); add --metrics-any-address to serve it on {host}, or scrape "
                             f"the API port's /metrics with a client certificate")
    log = logging.getLogger("straggler.metrics")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = PLAIN_READ_TIMEOUT_S

        def log_message(self, fmt, *args):
            log.debug("%s %s", self.address_string(), fmt % args)

        def do_GET(self):
            if self.path.split("?", 1)[0].rstrip("/") != "/metrics":
                code, body, ctype = 404, b"only /metrics here\n", "text/plain; charset=utf-8"
            else:
                try:
                    code, body, ctype = 200, render(db_path, node, window_s), CONTENT_TYPE
                except Exception as exc:  # one line, never a traceback to the scraper
                    code, body, ctype = 503, (one_line(exc) + "\n").encode(), "text/plain; charset=utf-8"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def cut(sock):
        try:
            sock.shutdown(socket.SHUT_RDWR)      # its handler's read ends; the thread closes it
        except OSError:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        slots = None

        def process_request(self, request, client_address):
            if not self.slots.acquire(blocking=False):
                try:
                    request.settimeout(1.0)
                    body = f"too many connections to the metrics port (at most {PLAIN_MAX_CONNECTIONS})\n".encode()
                    request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
                except OSError:
                    pass
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except BaseException:
                self.slots.release()
                raise

        def process_request_thread(self, request, client_address):
            timer = threading.Timer(PLAIN_CONNECTION_S, cut, (request,))
            timer.daemon = True
            timer.start()
            try:
                super().process_request_thread(request, client_address)
            finally:
                timer.cancel()
                self.slots.release()

    Server.slots = threading.BoundedSemaphore(PLAIN_MAX_CONNECTIONS)
    try:
        server = Server((host, port), Handler)
    except OSError as exc:
        raise StragglerError(f"cannot listen on {format_address(host, port)} for metrics: {exc.strerror or exc}; "
                             f"choose another --metrics-listen") from None
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name=f"straggler-metrics-{server.server_address[1]}", daemon=True)
    thread.start()
    return server, thread


