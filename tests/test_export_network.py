"""export: the network on the timeline. Per node and interface (net_samples) a receive and a transmit
bytes/s counter track, and an errors+drops/s track once any occurred; per RDMA port (rdma_samples) its
bytes/s (the counters count 4-byte words) and transmit-wait ticks/s. Each rate is the difference of two
consecutive cumulative rows over their distance, placed at the first; a counter that went backwards (a
reset) gives no point for that pair.

A small synthetic two-node cluster gets network rows through the writer's insert statements, is exported
as Perfetto's protobuf trace and read back with the perfetto package's own protobuf classes
(tests/pftrace_replay.py); expected times come from the export's own clock alignment (Plan)."""
import sqlite3

import pytest

from straggler_lab import synth
from straggler.analysis.export import export_perfetto
from straggler.analysis.export.plan import Plan, open_ro
from straggler.store import schema
from straggler.store.writer import TABLE_INSERTS

pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2",
                    reason="the perfetto package is not installed (make setup installs it)")
from pftrace_replay import Replay  # noqa: E402  (tests/pftrace_replay.py)

STEP = 250_000_000                    # the sampling interval here, ns
NODES = ("gpu-node-01", "gpu-node-02")


def row(columns, **values):
    r = dict.fromkeys(columns)
    r.update(values)
    return tuple(r[c] for c in columns)


def net_rows(node, t0, iface, **series):
    """One row per sample k at t0 + k·STEP with series[column][k]."""
    n = len(next(iter(series.values())))
    return [row(schema.NET_SAMPLE_COLUMNS, node=node, ts=t0 + k * STEP, iface=iface, operstate="up",
                **{c: v[k] for c, v in series.items()}) for k in range(n)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("netexport")
    db = str(base / "cluster.db")
    synth.write_cluster(db, synth.SynthSpec(nodes=2, events=2000, straggler=1))
    conn = sqlite3.connect(db)
    t0 = {n: conn.execute("SELECT MIN(ts) FROM events WHERE node = ?", (n,)).fetchone()[0] + 100_000_000
          for n in NODES}
    zeros = [0] * 6
    samples = (
        # 100 MB/s, 200 MB/s, then the counter restarts (reset: no point), 10 MB/s twice; transmit 1 MB/s
        net_rows("gpu-node-01", t0["gpu-node-01"], "ens1f0",
                 rx_bytes=[1000, 25_001_000, 75_001_000, 4_000, 2_504_000, 5_004_000],
                 tx_bytes=[0, 250_000, 500_000, 750_000, 1_000_000, 1_250_000],
                 rx_errors=[0, 0, 0, 2, 2, 2], tx_errors=zeros, rx_dropped=[0, 0, 0, 0, 1, 1], tx_dropped=zeros)
        + net_rows("gpu-node-01", t0["gpu-node-01"], "docker0", rx_bytes=[0, 500, 1000], tx_bytes=[0, 500, 1000],
                   rx_errors=[0] * 3, tx_errors=[0] * 3, rx_dropped=[0] * 3, tx_dropped=[0] * 3)
        # another node's interface of the same name, its counters higher: never paired with the one above
        + net_rows("gpu-node-02", t0["gpu-node-02"], "ens1f0",
                   rx_bytes=[10**10, 10**10 + 1_250_000, 10**10 + 2_500_000], tx_bytes=[7 * 10**9] * 3,
                   rx_errors=[9] * 3, rx_dropped=[9] * 3))
    conn.executemany(TABLE_INSERTS["net_samples"], samples)
    ports = [row(schema.RDMA_SAMPLE_COLUMNS, node="gpu-node-02", ts=t0["gpu-node-02"] + k * STEP, device="mlx5_0",
                 port=1, state="ACTIVE", port_rcv_data=rcv, port_xmit_data=xmit, port_xmit_wait=wait)
             for k, (rcv, xmit, wait) in enumerate([(0, 0, 0), (2_500_000, 1_000_000, 500),
                                                    (5_000_000, 1_000_000, 2_000)])]
    conn.executemany(TABLE_INSERTS["rdma_samples"], ports)
    conn.commit()
    conn.close()
    out = str(base / "trace.pftrace")
    export_perfetto(db, out, findings=False, jobs=1)
    ro = open_ro(db)
    try:
        plan = Plan(ro, db, None, None, None, False, None)
    finally:
        ro.close()
    return dict(db=db, base=base, t0=t0, trace=Replay(out), at=lambda node, k: plan.align[node](t0[node] + k * STEP))


def counter_points(trace):
    """{(node, track name): [(ts, value)]} of the trace's counter tracks."""
    out = {}
    for c in trace.counters:
        key = (trace.node_of(c["track"]), trace.tracks[c["track"]].name)
        out.setdefault(key, []).append((c["ts"], c["value"]))
    return out


def test_each_interface_has_receive_and_transmit_throughput_from_consecutive_samples(cluster):
    got, at = counter_points(cluster["trace"]), cluster["at"]
    n1 = "gpu-node-01"
    # the counter restarted between samples 2 and 3: no receive point for that pair, the others are rates
    assert got[(n1, "net ens1f0 receive bytes/s")] == [(at(n1, 0), 100_000_000), (at(n1, 1), 200_000_000),
                                                       (at(n1, 3), 10_000_000), (at(n1, 4), 10_000_000)]
    assert got[(n1, "net ens1f0 transmit bytes/s")] == [(at(n1, k), 1_000_000) for k in range(5)]
    assert got[(n1, "net docker0 receive bytes/s")] == [(at(n1, 0), 2000), (at(n1, 1), 2000)]
    n2 = "gpu-node-02"
    assert got[(n2, "net ens1f0 receive bytes/s")] == [(at(n2, 0), 5_000_000), (at(n2, 1), 5_000_000)]
    assert got[(n2, "net ens1f0 transmit bytes/s")] == [(at(n2, 0), 0), (at(n2, 1), 0)]
    receive = next(d for d in cluster["trace"].tracks.values() if d.name == "net ens1f0 receive bytes/s")
    assert receive.counter.unit == receive.counter.UNIT_SIZE_BYTES          # Perfetto shows it as KB/MB/GB


def test_errors_and_drops_get_a_track_only_where_they_occurred(cluster):
    got, at = counter_points(cluster["trace"]), cluster["at"]
    n1 = "gpu-node-01"
    # 2 receive errors in 250 ms, then 1 drop, then none: the track starts at the first and comes back to 0
    assert got[(n1, "net ens1f0 errors+drops/s")] == [(at(n1, 2), 8.0), (at(n1, 3), 4.0), (at(n1, 4), 0.0)]
    names = {name for _, name in got}
    assert "net docker0 errors+drops/s" not in names
    assert ("gpu-node-02", "net ens1f0 errors+drops/s") not in got


def test_each_rdma_port_has_its_throughput_in_bytes_and_its_transmit_waits(cluster):
    got, at = counter_points(cluster["trace"]), cluster["at"]
    n2 = "gpu-node-02"
    assert got[(n2, "rdma mlx5_0 port 1 receive bytes/s")] == [(at(n2, 0), 40_000_000), (at(n2, 1), 40_000_000)]
    assert got[(n2, "rdma mlx5_0 port 1 transmit bytes/s")] == [(at(n2, 0), 16_000_000), (at(n2, 1), 0)]
    assert got[(n2, "rdma mlx5_0 port 1 transmit wait ticks/s")] == [(at(n2, 0), 2000.0), (at(n2, 1), 6000.0)]
    assert not [k for k in got if k[0] == "gpu-node-01" and k[1].startswith("rdma")]


def test_a_store_without_the_network_tables_exports_without_them(cluster, tmp_path):
    db = str(tmp_path / "old.db")
    synth.write_cluster(db, synth.SynthSpec(nodes=2, events=2000, straggler=1))
    conn = sqlite3.connect(db)
    conn.executescript("DROP TABLE net_samples; DROP TABLE rdma_samples; DROP TABLE net_flows;")
    conn.close()
    out = str(tmp_path / "old.pftrace")
    summary = export_perfetto(db, out, findings=False, jobs=1)
    names = {d.name for d in Replay(out).tracks.values()}
    assert summary["counters"] > 0 and "calls/s" in names
    assert not [n for n in names if n.startswith(("net ", "rdma "))]
