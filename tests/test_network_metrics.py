"""/metrics for the network (straggler.api.metrics): from the newest net_samples row per interface and the
newest rdma_samples row per RDMA port, the series node_exporter's netdev, netclass and infiniband
collectors export, with their names, types, units and labels (device; device and port), plus node, so the
network dashboards and alerts already written for node_exporter read them.

Stores are written by the store's own writer (StoreWriter, the writer's insert statements) and read back
through render(), parsed by prometheus-client's own text parser. Every time is given (at_ns): nothing here
depends on this machine's clock. A value the interface does not report (NULL) leaves its series out (never
NaN); a store from before the network tables, or without rows in them, has none of the families."""
import re
import sqlite3

import pytest
from prometheus_client.parser import text_string_to_metric_families

from straggler.api import metrics
from straggler.store import schema
from straggler.store.writer import StoreWriter

SECOND = 1_000_000_000
T = 5_000 * SECOND               # the newest sample's time (CLOCK_MONOTONIC of the store's node)
NET_PREFIXES = ("node_network_", "node_infiniband_", "straggler_network_")


def net_row(ts, iface, **values):
    row = dict.fromkeys(schema.NET_SAMPLE_COLUMNS)
    row.update(node="n1", ts=ts, iface=iface, **values)
    return tuple(row[c] for c in schema.NET_SAMPLE_COLUMNS)


def rdma_row(ts, device, port, **values):
    row = dict.fromkeys(schema.RDMA_SAMPLE_COLUMNS)
    row.update(node="n1", ts=ts, device=device, port=port, **values)
    return tuple(row[c] for c in schema.RDMA_SAMPLE_COLUMNS)


def write(db, **tables):
    writer = StoreWriter(db, "n1")
    writer.start()
    for table, rows in tables.items():
        writer.submit(table, rows)
    assert writer.flush()
    writer.stop()


# a 100 Gb/s NIC that took errors; the newest of three rows is what /metrics shows
NIC = dict(operstate="up", carrier=1, speed_mbps=25_000, speed_max_mbps=100_000, duplex="full", mtu=9000,
           carrier_changes=6, rx_bytes=9_000_000_000_123, tx_bytes=7_000_000_000_456, rx_packets=8_000_001,
           tx_packets=7_000_002, rx_errors=41, tx_errors=3, rx_dropped=17, tx_dropped=2, rx_crc_errors=39,
           rx_missed_errors=5, tx_carrier_errors=1)
# a virtual interface: no speed, no carrier changes, no CRC or missed counters (NULL: not reported)
BRIDGE = dict(operstate="unknown", carrier=1, mtu=1500, rx_bytes=1000, tx_bytes=2000, rx_packets=10, tx_packets=20,
              rx_errors=0, tx_errors=0, rx_dropped=0, tx_dropped=0)
HCA = dict(netdev="ib0", state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0, link_layer="InfiniBand",
           port_xmit_data=2_500_000_000, port_rcv_data=3_000_000_000, port_xmit_packets=60_000,
           port_rcv_packets=70_000, port_xmit_wait=123_456, port_xmit_discards=4, port_rcv_errors=2,
           port_rcv_remote_physical_errors=1, symbol_error=77, link_error_recovery=3, link_downed=1,
           local_link_integrity_errors=6, excessive_buffer_overrun_errors=8)


@pytest.fixture
def net_store(tmp_path):
    db = str(tmp_path / "net.db")
    write(db,
          net_samples=[net_row(T - 2 * SECOND, "ens1f0", **dict(NIC, rx_bytes=1, tx_bytes=1, carrier_changes=2,
                                                                   speed_mbps=100_000)),
                       net_row(T - SECOND, "ens1f0", **dict(NIC, rx_bytes=2, tx_bytes=2, operstate="down", carrier=0)),
                       net_row(T, "ens1f0", **NIC),
                       net_row(T - SECOND, "docker0", **dict(BRIDGE, rx_bytes=500)),
                       net_row(T, "docker0", **BRIDGE)],
          rdma_samples=[rdma_row(T - SECOND, "mlx5_0", 1, **dict(HCA, port_rcv_data=1, symbol_error=0)),
                        rdma_row(T, "mlx5_0", 1, **HCA),
                        rdma_row(T, "mlx5_1", 1, **dict(HCA, state="DOWN", phys_state="Polling", rate_gbps=10.0,
                                                        port_rcv_data=0, port_xmit_data=0))])
    return db


def series(body):
    """({(sample name, frozenset of labels): value}, {family name: type}) of an exposition."""
    text = body if isinstance(body, str) else body.decode()
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in values, f"two series {key}"
            values[key] = s.value
    return values, types


def by_label(values, name, label="device"):
    return {dict(labels)[label]: v for (n, labels), v in values.items() if n == name}


def test_each_interface_has_node_exporters_names_types_and_units_from_its_newest_sample(net_store):
    body = metrics.render(net_store, "gpu-node-07", at_ns=T + SECOND // 2).decode()
    values, types = series(body)
    expect = {   # name: (node_exporter's type, {device: value of the newest row})
        "node_network_receive_bytes_total": ("counter", {"ens1f0": 9_000_000_000_123, "docker0": 1000}),
        "node_network_transmit_bytes_total": ("counter", {"ens1f0": 7_000_000_000_456, "docker0": 2000}),
        "node_network_receive_packets_total": ("counter", {"ens1f0": 8_000_001, "docker0": 10}),
        "node_network_transmit_packets_total": ("counter", {"ens1f0": 7_000_002, "docker0": 20}),
        "node_network_receive_errs_total": ("counter", {"ens1f0": 41, "docker0": 0}),
        "node_network_transmit_errs_total": ("counter", {"ens1f0": 3, "docker0": 0}),
        "node_network_receive_drop_total": ("counter", {"ens1f0": 17 + 5, "docker0": 0}),   # + missed, as node_exporter
        "node_network_transmit_drop_total": ("counter", {"ens1f0": 2, "docker0": 0}),
        "node_network_receive_crc_errors_total": ("counter", {"ens1f0": 39}),
        "node_network_carrier_changes_total": ("counter", {"ens1f0": 6}),
        "node_network_up": ("gauge", {"ens1f0": 1, "docker0": 0}),          # operstate 'up' (not 'unknown')
        "node_network_carrier": ("gauge", {"ens1f0": 1, "docker0": 1}),
        "node_network_mtu_bytes": ("gauge", {"ens1f0": 9000, "docker0": 1500}),
        "node_network_speed_bytes": ("gauge", {"ens1f0": 25_000 * 125_000}),  # Mb/s as bytes/s; a bridge has none
        "straggler_network_speed_max_bytes": ("gauge", {"ens1f0": 100_000 * 125_000}),
    }
    for name, (kind, want) in expect.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        assert types.get(family) == kind, name
        assert by_label(values, name) == want, name
    assert {k: v for k, v in types.items() if k.startswith(NET_PREFIXES[0])}.keys() == \
        {n.removesuffix("_total") for n in expect if n.startswith(NET_PREFIXES[0])}
    labels = {dict(labels)["device"]: dict(labels) for (n, labels), _ in values.items() if n == "node_network_up"}
    assert labels["ens1f0"] == {"device": "ens1f0", "node": "gpu-node-07"}
    assert "NaN" not in body


def test_each_rdma_port_has_node_exporters_infiniband_names_in_bytes(net_store):
    values, types = series(metrics.render(net_store, "gpu-node-07", at_ns=T))
    expect = {
        "node_infiniband_port_data_received_bytes_total": {"mlx5_0": 3_000_000_000 * 4, "mlx5_1": 0},   # 4-byte words
        "node_infiniband_port_data_transmitted_bytes_total": {"mlx5_0": 2_500_000_000 * 4, "mlx5_1": 0},
        "node_infiniband_port_packets_received_total": {"mlx5_0": 70_000, "mlx5_1": 70_000},
        "node_infiniband_port_packets_transmitted_total": {"mlx5_0": 60_000, "mlx5_1": 60_000},
        "node_infiniband_port_transmit_wait_total": {"mlx5_0": 123_456, "mlx5_1": 123_456},
        "node_infiniband_port_discards_transmitted_total": {"mlx5_0": 4, "mlx5_1": 4},
        "node_infiniband_port_errors_received_total": {"mlx5_0": 2, "mlx5_1": 2},
        "node_infiniband_port_receive_remote_physical_errors_total": {"mlx5_0": 1, "mlx5_1": 1},
        "node_infiniband_symbol_error_total": {"mlx5_0": 77, "mlx5_1": 77},
        "node_infiniband_link_error_recovery_total": {"mlx5_0": 3, "mlx5_1": 3},
        "node_infiniband_link_downed_total": {"mlx5_0": 1, "mlx5_1": 1},
        "node_infiniband_local_link_integrity_errors_total": {"mlx5_0": 6, "mlx5_1": 6},
        "node_infiniband_excessive_buffer_overrun_errors_total": {"mlx5_0": 8, "mlx5_1": 8},
        "node_infiniband_rate_bytes_per_second": {"mlx5_0": 400 * 125_000_000, "mlx5_1": 10 * 125_000_000},
        "node_infiniband_state_id": {"mlx5_0": 4, "mlx5_1": 1},               # ACTIVE, DOWN
        "node_infiniband_physical_state_id": {"mlx5_0": 5, "mlx5_1": 2},      # LinkUp, Polling
    }
    for name, want in expect.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        assert types.get(name.removesuffix("_total")) == kind, name
        assert by_label(values, name) == want, name
    ports = {dict(labels)["device"]: dict(labels) for (n, labels), _ in values.items()
             if n == "node_infiniband_state_id"}
    assert ports["mlx5_0"] == {"device": "mlx5_0", "port": "1", "node": "gpu-node-07"}


def test_a_value_the_interface_does_not_report_leaves_its_series_out(tmp_path):
    db = str(tmp_path / "sparse.db")
    write(db, net_samples=[net_row(T, "veth1a2b", operstate="up", rx_bytes=5, speed_mbps=-1)],   # -1: unknown
          rdma_samples=[rdma_row(T, "rxe0", 1, state="4: ACTIVE", port_rcv_data=10)])
    body = metrics.render(db, "n1", at_ns=T).decode()
    values, types = series(body)
    assert by_label(values, "node_network_receive_bytes_total") == {"veth1a2b": 5}
    assert by_label(values, "node_network_up") == {"veth1a2b": 1}
    assert by_label(values, "node_infiniband_state_id") == {"rxe0": 4}              # sysfs's own spelling too
    assert by_label(values, "node_infiniband_port_data_received_bytes_total") == {"rxe0": 40}
    shown = {k for k in types if k.startswith(NET_PREFIXES)}
    assert shown == {"node_network_receive_bytes", "node_network_up", "node_infiniband_state_id",
                     "node_infiniband_port_data_received_bytes"}
    assert "NaN" not in body and "node_network_speed_bytes" not in body              # no empty family either


def test_a_stopped_sampler_shows_no_network_values(net_store):
    got = series(metrics.render(net_store, "n1", at_ns=T + 60 * SECOND))[1]          # stopped a minute ago
    assert not [n for n in got if n.startswith(NET_PREFIXES)]
    # within a few sampling intervals the values are still shown: one late sample is not a stop
    values, _ = series(metrics.render(net_store, "n1", at_ns=T + 2 * SECOND, window_s=1.0))
    assert by_label(values, "node_network_mtu_bytes") == {"ens1f0": 9000, "docker0": 1500}
    assert by_label(values, "node_infiniband_state_id") == {"mlx5_0": 4, "mlx5_1": 1}


def test_an_interface_that_went_away_is_not_shown(tmp_path):
    db = str(tmp_path / "gone.db")
    write(db, net_samples=[net_row(T - 30 * SECOND, "veth-old", operstate="up", rx_bytes=1)]
          + [net_row(T - k * SECOND, "eth0", operstate="up", rx_bytes=100 - k) for k in range(31)])
    values, _ = series(metrics.render(db, "n1", at_ns=T))
    assert by_label(values, "node_network_receive_bytes_total") == {"eth0": 100}


def test_a_store_without_network_rows_or_tables_has_no_network_families(tmp_path):
    empty = str(tmp_path / "cpu-only.db")
    write(empty, lost_events=[("n1", "kmsg", 0, SECOND, 0)])
    old = str(tmp_path / "old.db")                   # as schema 4 wrote it, served read-only: nothing creates them
    ddl = re.sub(r"CREATE TABLE IF NOT EXISTS (net_samples|rdma_samples|net_flows)\s*\(.*?\n\);\n", "", schema.DDL,
                 flags=re.S)
    ddl = re.sub(r"CREATE INDEX IF NOT EXISTS (net|rdma)_\w* ON [^;]*;\n", "", ddl)
    assert "net_samples" not in ddl and "TABLE IF NOT EXISTS gpu_samples" in ddl
    conn = sqlite3.connect(old)
    conn.executescript(ddl)
    conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '4'), ('node', 'old-node')")
    conn.execute("INSERT INTO thread_time(node, ts, interval_ns, pid, tid, calls) VALUES ('old-node', 5, 1, 7, 7, 3)")
    conn.commit()
    conn.close()
    for db in (empty, old):
        body = metrics.render(db, "n1", at_ns=T).decode()
        assert "straggler_window_seconds" in body                  # the node's metrics are served
        assert not any(p in body for p in NET_PREFIXES), db         # not even a HELP line
