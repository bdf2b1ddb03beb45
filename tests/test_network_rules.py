"""explain's rules for a node's links (analysis/explain/network.py), over rows as its SQL returns them.

What a user would notice: the node whose link is slow is the one named — the spoke of a star whose own
connection is slow, the hub whose every connection is, the node whose link trained down or flaps —
and nobody is named where every node looks alike or the two ends of one slow connection cannot be
told apart. The whole path (agents, a real job, a throttled link) is tests/test_diagnosis_network.py."""
from straggler.analysis.explain import network

NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
ADDR = {n: f"10.0.0.{11 + i}" for i, n in enumerate(NODES)}


def flow(node, peer, srtt_us, best_us=None, retransmits=0, recoveries=0, iface="eth0", nbytes=400_000):
    return dict(node=node, peer_addr=ADDR[peer], local_addr=ADDR[node], iface=iface, bytes=nbytes,
                tx_bytes=nbytes // 2, retransmits=retransmits, recoveries=recoveries, rtt_samples=50, srtt_us=srtt_us,
                srtt_max_us=srtt_us * 2,
                best_us=best_us if best_us is not None else srtt_us)


def iface(node, name="eth0", speed=10000, speed_max=None, carrier_changes=0, errors=0, drops=0, nbytes=1_000_000):
    return dict(node=node, iface=name, samples=20, span_ns=19_000_000_000, bytes=nbytes,
                carrier_changes=carrier_changes, carrier_min=1, down_samples=0, speed_mbps=speed,
                speed_max_mbps=speed_max, errors=errors, crc_errors=errors, drops=drops)


def star(slow_spoke=None, slow_hub=False, rtt=60, slow_rtt=20_000):
    """A star through gpu-node-01 (the stand-in NCCL's shape): each spoke's one connection, and the hub's three.
    A slow connection is slow at both of its ends."""
    hub, rows = NODES[0], []
    for spoke in NODES[1:]:
        slow = slow_hub or spoke == slow_spoke
        r = slow_rtt if slow else rtt
        rows.append(flow(spoke, hub, r, best_us=rtt))
        rows.append(flow(hub, spoke, r, best_us=rtt))
    return rows


def judged(flows, ifaces=None, rdma=()):
    ifaces = ifaces if ifaces is not None else [iface(n) for n in NODES]
    return network.judge(ifaces, list(rdma), flows)


def test_the_spoke_whose_own_connection_is_slow_is_named_not_the_hub():
    evidence, ambiguous = judged(star(slow_spoke="gpu-node-03"))
    named = network.standing_out(evidence)
    assert [ev.node for ev in named] == ["gpu-node-03"] and not ambiguous
    ev = named[0]
    assert ev.kind == "net-congestion" and ev.link == "eth0" and ev.peers == ["gpu-node-01"]
    assert "round trips of 20.0 ms to gpu-node-01" in ev.detail


def test_a_star_whose_every_connection_is_slow_names_nobody_by_its_round_trips():
    """A slow hub and a fabric slow everywhere look alike from the round trips of a star (every
    connection has the hub at one end): nobody is named by them, and the pairs are said."""
    evidence, ambiguous = judged(star(slow_hub=True))
    assert network.standing_out(evidence) == []
    assert ambiguous == [("gpu-node-01", n) for n in NODES[1:]]


def test_the_end_common_to_the_slow_connections_is_named_where_other_connections_are_fast():
    """Every connection of gpu-node-01 slow (each against its own best: the median of all says nothing)
    while the others' connections between themselves are fast: gpu-node-01 is the one."""
    flows = star(slow_hub=True) + [flow("gpu-node-02", "gpu-node-03", 60), flow("gpu-node-03", "gpu-node-02", 60)]
    evidence, _ = judged(flows)
    assert [ev.node for ev in network.standing_out(evidence)] == ["gpu-node-01"]
    assert evidence["gpu-node-01"].peers == ["gpu-node-02", "gpu-node-03", "gpu-node-04"]


def test_a_ring_names_the_node_between_its_two_slow_connections():
    ring = []
    for i, node in enumerate(NODES):
        for peer in (NODES[(i + 1) % 4], NODES[(i - 1) % 4]):
            slow = "gpu-node-02" in (node, peer)
            ring.append(flow(node, peer, 15_000 if slow else 80, best_us=80))
    evidence, _ = judged(ring)
    assert [ev.node for ev in network.standing_out(evidence)] == ["gpu-node-02"]


def test_two_nodes_whose_one_connection_is_slow_name_nobody_and_say_which_pair():
    flows = [flow("gpu-node-01", "gpu-node-02", 20_000, best_us=60), flow("gpu-node-02", "gpu-node-01", 20_000,
                                                                          best_us=60)]
    evidence, ambiguous = judged(flows, [iface("gpu-node-01"), iface("gpu-node-02")])
    assert network.standing_out(evidence) == []
    assert ambiguous == [("gpu-node-01", "gpu-node-02")]


def test_steady_round_trips_name_nobody():
    evidence, ambiguous = judged(star())
    assert network.standing_out(evidence) == [] and not ambiguous
    assert all(ev.kind is None for ev in evidence.values())


def test_a_link_that_trained_down_or_flaps_is_net_link_and_graver_than_congestion():
    ifaces = [iface(n) for n in NODES]
    ifaces[2] = iface("gpu-node-03", speed=1000, speed_max=10000)
    ifaces[3] = iface("gpu-node-04", carrier_changes=4)
    evidence, _ = judged(star(slow_spoke="gpu-node-03"), ifaces)
    named = {ev.node: ev for ev in network.standing_out(evidence)}
    assert set(named) == {"gpu-node-03", "gpu-node-04"}
    assert named["gpu-node-03"].kind == "net-link" and "at 1000 of 10000 Mb/s" in named["gpu-node-03"].detail
    assert "round trips" in named["gpu-node-03"].detail, "the congestion it causes is said with it"
    assert named["gpu-node-04"].kind == "net-link" and "carrier changed 4 time(s)" in named["gpu-node-04"].detail


def test_a_link_slower_than_the_other_nodes_links_is_net_link_without_a_known_maximum():
    ifaces = [iface(n) for n in NODES]
    ifaces[1] = iface("gpu-node-02", speed=25000)
    ifaces = [dict(r, speed_mbps=100000) if r["node"] != "gpu-node-02" else r for r in ifaces]
    evidence, _ = judged(star(), ifaces)
    assert [(ev.node, ev.kind) for ev in network.standing_out(evidence)] == [("gpu-node-02", "net-link")]
    assert "25000 Mb/s vs 100000 on the other nodes" in evidence["gpu-node-02"].detail


def test_every_link_alike_names_nobody():
    ifaces = [iface(n, speed=1000, speed_max=10000) for n in NODES]
    evidence, _ = judged(star(), ifaces)
    assert network.standing_out(evidence) == []
    assert [ev.node for ev in network.alike(evidence)["net-link"]] == NODES


def test_an_idle_interface_is_no_evidence():
    """A spare port that trained down and carries none of the job's traffic says nothing of the job."""
    ifaces = [iface(n) for n in NODES] + [iface("gpu-node-02", name="eth1", speed=100, speed_max=10000, nbytes=0)]
    evidence, _ = judged(star(), ifaces)
    assert network.standing_out(evidence) == []


def test_errors_and_retransmissions_count_only_above_their_noise():
    ifaces = [iface(n) for n in NODES]
    ifaces[0] = iface("gpu-node-01", errors=3)
    flows = star()
    flows[2] = dict(flows[2], retransmits=2)
    evidence, _ = judged(flows, ifaces)
    assert network.standing_out(evidence) == []
    flows[2] = dict(flows[2], retransmits=16, tx_bytes=3_000_000)     # 16 of some 2,000 segments: noise
    evidence, _ = judged(flows, ifaces)
    assert network.standing_out(evidence) == []
    ifaces[0] = iface("gpu-node-01", errors=500)
    flows[2] = dict(flows[2], retransmits=300, recoveries=40)   # gpu-node-03's connection, in as much traffic
    evidence, _ = judged(flows, ifaces)
    named = {ev.node: ev for ev in network.standing_out(evidence)}
    assert named["gpu-node-01"].kind == "net-link" and "500 errors" in named["gpu-node-01"].detail
    assert named["gpu-node-03"].kind == "net-congestion" and "300 packets retransmitted" in named["gpu-node-03"].detail
    assert "40 loss recoveries" in named["gpu-node-03"].detail


def test_retransmissions_the_kernel_never_recovered_from_are_the_peers_slow_acknowledgements():
    """A rank that reaches each collective first sends to peers still at their own work; they hold their
    acknowledgements back and its kernel probes the tail again (tail-loss probes, retransmissions that the
    peer's duplicate-SACK shows spurious: no recovery follows). Its many retransmissions are its peers'
    doing, not its link's: it is not named. The same count in loss recoveries is its link's."""
    ifaces = [iface(n) for n in NODES]
    flows = star()
    flows[2] = dict(flows[2], retransmits=109, tx_bytes=60_000)
    evidence, _ = judged(flows, ifaces)
    assert network.standing_out(evidence) == []
    flows[2] = dict(flows[2], recoveries=2)             # a spurious timeout or two: still not the link
    evidence, _ = judged(flows, ifaces)
    assert network.standing_out(evidence) == []
    flows[2] = dict(flows[2], recoveries=12)
    evidence, _ = judged(flows, ifaces)
    assert [ev.node for ev in network.standing_out(evidence)] == ["gpu-node-03"]


def test_an_rdma_port_down_or_waiting_for_credit_stands_out():
    rdma = [dict(node=n, device="mlx5_0", port=1, samples=20, span_ns=19_000_000_000, data_words=10**9,
                 xmit_wait=1000, link_downed=0, errors=0, not_active=0, rate_gbps=400.0) for n in NODES]
    rdma[1] = dict(rdma[1], xmit_wait=5_000_000)
    rdma[3] = dict(rdma[3], link_downed=2, not_active=3)
    evidence, _ = judged([], [], rdma)
    named = {ev.node: ev for ev in network.standing_out(evidence)}
    assert named["gpu-node-02"].kind == "net-congestion" and named["gpu-node-02"].link == "mlx5_0 port 1"
    assert "port_xmit_wait" in named["gpu-node-02"].detail
    assert named["gpu-node-04"].kind == "net-link" and "went down 2 time(s)" in named["gpu-node-04"].detail
    assert set(named) == {"gpu-node-02", "gpu-node-04"}


def test_one_ends_slow_readings_are_its_peers_held_back_acknowledgements_not_a_slow_link():
    """A hub that answers a spoke only once its slowest rank's data is in holds that spoke's
    acknowledgements back: the spoke's readings grow (20 ms), the hub's of the same connection do not.
    A slow link slows both ends' readings: this is no evidence of a link, all along or not."""
    flows = star()
    flows = [dict(r, srtt_us=20_000) if (r["node"], r["peer_addr"]) == ("gpu-node-04", ADDR["gpu-node-01"]) else r
             for r in flows]
    evidence, ambiguous = judged(flows)
    assert network.standing_out(evidence) == [] and not ambiguous


def test_a_connection_to_a_server_outside_the_job_is_no_evidence():
    """Only one end of it is timed, and a server answers after its own work (a request's round trip is
    not the link's)."""
    outside = dict(flow("gpu-node-02", "gpu-node-01", 50_000), peer_addr="192.0.2.50")
    evidence, ambiguous = judged(star() + [outside])
    assert network.standing_out(evidence) == [] and not ambiguous


def test_a_connection_timed_by_one_end_only_is_no_evidence():
    """gpu-node-01's readings of its connection to gpu-node-04 are missing (its agent lost them): the
    other end's alone could be held-back acknowledgements."""
    flows = [r for r in star(slow_spoke="gpu-node-04")
             if (r["node"], r["peer_addr"]) != ("gpu-node-01", ADDR["gpu-node-04"])]
    evidence, ambiguous = judged(flows)
    assert network.standing_out(evidence) == [] and not ambiguous


def test_every_rank_waiting_alike_behind_a_fabric_slow_everywhere_points_at_the_links_not_the_gpus():
    """Collectives that only enqueue, every link slow alike: every rank's synchronize grows alike (the
    device-wide warning, which alone would send the operator to the GPUs) and every node's links say the
    same (a fabric warning). The device-wide warning then says the links are why and points there first;
    a link's warning that is no fabric's (the job did not slow down) changes nothing."""
    from straggler.analysis.explain import findings

    grown = [("gpu-node-01", 0.40, 0.62), ("gpu-node-02", 0.41, 0.63)]
    ev = network.LinkEvidence(node="gpu-node-01", link="eth0", kind="net-congestion", detail="round trips of 9 ms")
    alone = findings.device_wide_warning(grown, "SELECT 1")
    assert alone.recommendation.startswith("compare the GPUs directly") and "links" not in alone.summary
    quiet = findings.device_wide_warning(grown, "SELECT 1", [findings.link_warning(ev, {}, "while the job did not slow down")])
    assert (quiet.summary, quiet.recommendation, quiet.numbers) == (alone.summary, alone.recommendation, alone.numbers)
    wide = findings.device_wide_warning(grown, "SELECT 1",
                                        [findings.link_warning(ev, {}, "as on 3 other node(s) alike", fabric=True)])
    assert wide.summary.count("the links say why") == 1 and "not of one GPU" in wide.summary
    assert wide.recommendation.startswith("look at the path, not the GPU")
    assert wide.recommendation.endswith("only then the GPUs: " + alone.recommendation)
    assert wide.numbers["fabric"] == "net-congestion"
