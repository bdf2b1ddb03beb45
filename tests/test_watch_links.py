"""Where the links travel: an agent's /live answer carries its TCP connections and interface samples
since the time asked (none from a store an older agent wrote), and the watch puts them into the store
explain runs on, under the node the feed answers for, whatever columns a node sends; merge carries
every node's into cluster.db. The watch and explain naming a slow link on a real job is
tests/test_diagnosis_network.py."""
import sqlite3
from types import SimpleNamespace

from straggler.analysis import watch
from straggler.store import schema
from straggler.store.live import live_summary
from straggler.store.writer import TABLE_INSERTS


def flow_row(node, ts, peer="10.0.0.11", srtt=80):
    values = dict(node=node, ts=ts, interval_ns=1_000_000_000, pid=42, rank=2, family=4, local_addr="10.0.0.13",
                  local_port=40000, peer_addr=peer, peer_port=29500, iface="eth0", tx_bytes=4096, rx_bytes=4096,
                  tx_calls=2, rx_calls=2, tx_ns=2000, rx_ns=9000, retransmits=0, rtt_samples=10, srtt_us=srtt,
                  srtt_max_us=srtt * 2, cwnd_min=10, recoveries=0, opened=0, closed=0, errors=0)
    return tuple(values[c] for c in schema.NET_FLOW_COLUMNS)


def sample_row(node, ts, iface="eth0", speed=100000):
    values = {c: None for c in schema.NET_SAMPLE_COLUMNS}
    values.update(node=node, ts=ts, iface=iface, operstate="up", carrier=1, speed_mbps=speed, rx_bytes=ts, tx_bytes=ts)
    return tuple(values[c] for c in schema.NET_SAMPLE_COLUMNS)


def store(path, node="gpu-node-03"):
    conn = sqlite3.connect(path)
    schema.create(conn, node)
    conn.executemany(TABLE_INSERTS["net_flows"], [flow_row(node, s * 1_000_000_000) for s in range(1, 6)])
    conn.executemany(TABLE_INSERTS["net_samples"], [sample_row(node, s * 1_000_000_000) for s in range(1, 6)]
                     + [sample_row(node, s * 1_000_000_000, iface="lo") for s in range(1, 6)])
    conn.commit()
    conn.close()
    return path


def test_live_answers_the_links_since_the_time_asked_and_an_old_store_answers_none(tmp_path):
    answer = live_summary(store(str(tmp_path / "node.db")), since_ns=3_000_000_000)
    flows = [dict(zip(answer["columns"]["net_flows"], r)) for r in answer["net_flows"]]
    samples = [dict(zip(answer["columns"]["net_samples"], r)) for r in answer["net_samples"]]
    assert [f["ts"] for f in flows] == [3e9, 4e9, 5e9] and flows[0]["peer_addr"] == "10.0.0.11"
    assert [(s["ts"], s["iface"]) for s in samples] == [(3e9, "eth0"), (4e9, "eth0"), (5e9, "eth0")], \
        "the loopback is no link of the job's"
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    schema.create(conn, "old")
    conn.execute("DROP TABLE net_flows")
    conn.commit()
    conn.close()
    answer = live_summary(str(old))
    assert answer["net_flows"] == [] and answer["net_samples"] == []


def test_the_watch_keeps_a_nodes_links_under_its_own_name_and_only_the_columns_it_knows(tmp_path):
    answer = live_summary(store(str(tmp_path / "node.db"), node="whatever-it-says"))
    answer.update(node="gpu-node-03", thread_time=[])
    # a node that adds a column of its own (or a hostile name) changes nothing in the watch's store
    answer["columns"]["net_flows"] = answer["columns"]["net_flows"] + ["x) VALUES (1); DROP TABLE events; --"]
    answer["net_flows"] = [r + [1] for r in answer["net_flows"]]
    feed = watch.NodeFeed(address="10.0.0.13:7433")
    feed.apply(SimpleNamespace(status="ok", message="", node="gpu-node-03"), answer, None, horizon_ns=60_000_000_000)
    feed.apply(SimpleNamespace(status="ok", message="", node="gpu-node-03"), answer, None, horizon_ns=60_000_000_000)
    conn = watch.build_store([feed])
    assert conn.execute("SELECT node, COUNT(*), SUM(tx_bytes) FROM net_flows GROUP BY node").fetchall() == \
        [("gpu-node-03", 5, 5 * 4096)], "each interval once, under the feed's node"
    assert conn.execute("SELECT COUNT(*) FROM net_samples WHERE node = 'gpu-node-03'").fetchone() == (5,)
    assert conn.execute("SELECT COUNT(*) FROM events").fetchone() == (0,)


def test_a_node_that_sends_fewer_link_columns_keeps_its_rows(tmp_path):
    """An agent of an earlier version answers without a column this one knows (here `recoveries`): its rows
    are kept, the column at its default."""
    answer = live_summary(store(str(tmp_path / "node.db"), node="gpu-node-02"))
    answer.update(thread_time=[])
    cols = answer["columns"]["net_flows"]
    keep = [i for i, c in enumerate(cols) if c != "recoveries"]
    answer["columns"]["net_flows"] = [cols[i] for i in keep]
    answer["net_flows"] = [[r[i] for i in keep] for r in answer["net_flows"]]
    feed = watch.NodeFeed(address="10.0.0.12:7433")
    feed.apply(SimpleNamespace(status="ok", message="", node="gpu-node-02"), answer, None, horizon_ns=60_000_000_000)
    conn = watch.build_store([feed])
    assert conn.execute("SELECT COUNT(*), SUM(recoveries), SUM(tx_bytes) FROM net_flows").fetchone() == (5, 0, 5 * 4096)


def test_merge_carries_every_nodes_links(tmp_path):
    from straggler.analysis.merge import merge
    paths = []
    for node in ("gpu-node-01", "gpu-node-02"):
        path = store(str(tmp_path / f"{node}.db"), node=node)
        conn = sqlite3.connect(path)
        conn.execute("INSERT INTO clock_pairs(node, mono_ns, real_ns) VALUES (?, 1, 1000)", (node,))
        conn.commit()
        conn.close()
        paths.append(path)
    merge(paths, str(tmp_path / "cluster.db"))
    conn = sqlite3.connect(tmp_path / "cluster.db")
    assert conn.execute("SELECT node, COUNT(*) FROM net_flows GROUP BY node").fetchall() == \
        [("gpu-node-01", 5), ("gpu-node-02", 5)]
    assert conn.execute("SELECT node, COUNT(*) FROM net_samples WHERE iface = 'eth0' GROUP BY node").fetchall() == \
        [("gpu-node-01", 5), ("gpu-node-02", 5)]
