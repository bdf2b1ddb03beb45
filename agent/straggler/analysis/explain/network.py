"""Whose link: what each node's network said about itself over a time (the agent's interface and RDMA
port samples, and the TCP connections of the job's processes). In a synchronous job a slow link makes
every rank wait in its collectives alike: the calls cannot tell whose link it is, the links can.

The kinds of evidence, each a cause class of its own:
  net-link        the link itself: its carrier lost or flapping, its speed below what it can do or below
                  the other nodes' links, errors growing (receive/transmit errors, bad checksums, lost
                  carrier; on an RDMA port: symbol errors, link downs and retrainings, integrity and
                  receive errors), an RDMA port not ACTIVE or at a lower rate than the others
  net-congestion  waits without errors: its connections' round trips far above their own best or the
                  other connections' (to most of its peers), retransmissions in loss recoveries (a
                  retransmission the kernel did not follow with a recovery was a tail-loss probe sent
                  because the peer was slow to acknowledge: the peer's doing, not the link's), packets
                  dropped, an RDMA port waiting for credit (port_xmit_wait) far more than the others
A node is named only when its evidence stands out: the nodes must not all look alike (a fabric-wide
condition names nobody). Only a link at work is evidence: an interface the job's connections leave by,
or one whose traffic grew; an RDMA port whose data counters grew. A connection between two of the job's
nodes is timed by both its ends, and its round trip is the lower of their readings (slow_pairs: a
receiver's held-back acknowledgements inflate one end's only). Its slowness is shared by its two ends:
the node named is the end common to the slow connections while connections between other nodes are
fast (one rank of a ring), or the end slow to all its peers where the other end is fast to the rest of
its own (a spoke of a star); ends that cannot be told apart (a two-node job, a star's every connection)
name nobody. Pure rules over rows, with the SQL beside them; nothing here writes.
"""
import statistics
from dataclasses import dataclass, field

from . import evidence as evidence_rule
from .sql import values_cte

RTT_FACTOR = 3.0               # a connection is slow when its round trip is this many times the others' ...
RTT_MIN_US = 1000              # ... (or its own best's) and at least this much longer
ERRORS_MIN = 10                # errors of a link (or an RDMA port) over the time: fewer are noise
DROPS_MIN = 100                # packets dropped over the time
RETRANS_MIN = 10               # retransmitted packets over the time ...
RETRANS_SHARE = 0.02           # ... and this share of the segments it sent (its bytes over a full segment's) ...
RECOVERIES_MIN = 3             # ... in at least this many loss recoveries (else tail-loss probes, not losses)
SEGMENT_BYTES = 1448           # a full TCP segment's payload (an Ethernet MTU's)
STANDS_OUT = 3.0               # retransmissions, drops or transmit waits: this many times the other nodes' median
SPEED_DROP = 0.75              # a link below this share of what it can do, or of the other nodes' links
MAX_ALIKE = 0.5                # more than this share of the nodes with the same kind: they all look alike
KINDS = ("net-link", "net-congestion")   # gravest first

NET_TABLES = """
SELECT COUNT(*) AS tables FROM pragma_table_list WHERE name IN ('net_samples', 'rdma_samples', 'net_flows')"""


def has_net_tables(runner):
    """Whether every store has the network tables (schema 5; an older agent's has none: then network
    evidence is left out, never an error)."""
    rows = runner.rows(NET_TABLES)
    return bool(rows) and all(int(r["tables"] or 0) == 3 for r in rows)


@dataclass
class LinkEvidence:
    node: str
    link: str = ""                 # the interface ('eth0') or RDMA port ('mlx5_0 port 1') that says it
    kind: str = None               # one of KINDS, the gravest it shows; None: nothing
    detail: str = ""               # what it said, in words
    peers: list = field(default_factory=list)   # the peers it is slow to (node names, else addresses)
    numbers: dict = field(default_factory=dict)

    @property
    def key(self):
        return self.node


def _ranges_cte(ranges):
    return values_cte("tw", ("node", "lo", "hi"), sorted(ranges))


def _grew(column):
    return f"COALESCE(MAX(s.{column}) - MIN(s.{column}), 0)"


def interfaces_sql(ranges):
    """Each interface's samples over per-node time ranges [(node, lo, hi)] on its clock: what grew, its
    lowest speed, whether its carrier dropped."""
    errors = " + ".join(_grew(c) for c in ("rx_errors", "tx_errors", "rx_crc_errors", "tx_carrier_errors"))
    drops = " + ".join(_grew(c) for c in ("rx_dropped", "tx_dropped", "rx_missed_errors"))
    return f"""
WITH {_ranges_cte(ranges)}
SELECT s.node, s.iface, COUNT(*) AS samples, MAX(s.ts) - MIN(s.ts) AS span_ns,
       {_grew("rx_bytes")} + {_grew("tx_bytes")} AS bytes,
       {_grew("carrier_changes")} AS carrier_changes, MIN(s.carrier) AS carrier_min,
       SUM(s.operstate IS NOT NULL AND s.operstate NOT IN ('up', 'unknown')) AS down_samples,
       MIN(s.speed_mbps) AS speed_mbps, MAX(s.speed_max_mbps) AS speed_max_mbps,
       {errors} AS errors, {_grew("rx_crc_errors")} AS crc_errors, {drops} AS drops
FROM tw JOIN net_samples s ON s.node = tw.node AND s.ts >= tw.lo AND s.ts < tw.hi
WHERE s.iface != 'lo'
GROUP BY s.node, s.iface
ORDER BY s.node, s.iface"""


def rdma_sql(ranges):
    """Each RDMA port's samples over the same ranges."""
    errors = " + ".join(_grew(c) for c in ("symbol_error", "link_error_recovery", "link_downed",
                                           "local_link_integrity_errors", "port_rcv_errors",
                                           "port_rcv_remote_physical_errors"))
    return f"""
WITH {_ranges_cte(ranges)}
SELECT s.node, s.device, s.port, COUNT(*) AS samples, MAX(s.ts) - MIN(s.ts) AS span_ns,
       {_grew("port_xmit_data")} + {_grew("port_rcv_data")} AS data_words,
       {_grew("port_xmit_wait")} AS xmit_wait, {_grew("link_downed")} AS link_downed, {errors} AS errors,
       SUM(s.state IS NOT NULL AND s.state != 'ACTIVE') AS not_active, MIN(s.rate_gbps) AS rate_gbps
FROM tw JOIN rdma_samples s ON s.node = tw.node AND s.ts >= tw.lo AND s.ts < tw.hi
GROUP BY s.node, s.device, s.port
ORDER BY s.node, s.device, s.port"""


def flows_sql(ranges, spans):
    """The job's TCP connections over the same ranges, per node and peer: bytes, retransmissions, the
    round trip (mean over its readings), and the best round trip of that peer over the span explain reads
    (`spans`, per node like `ranges`: the measure of a connection slow all through the time, a hub every
    connection of which is slow)."""
    return f"""
WITH {_ranges_cte(ranges)},
{values_cte("sp", ("node", "lo", "hi"), sorted(spans))},
best AS (SELECT f.node, f.peer_addr, MIN(f.srtt_us) AS best_us
         FROM sp JOIN net_flows f ON f.node = sp.node AND f.ts >= sp.lo AND f.ts < sp.hi
         WHERE f.rtt_samples > 0 AND f.srtt_us IS NOT NULL GROUP BY f.node, f.peer_addr)
SELECT f.node, f.peer_addr, MIN(f.local_addr) AS local_addr, MIN(f.iface) AS iface,
       SUM(f.tx_bytes + f.rx_bytes) AS bytes, SUM(f.tx_bytes) AS tx_bytes, SUM(f.retransmits) AS retransmits,
       SUM(f.recoveries) AS recoveries, SUM(f.rtt_samples) AS rtt_samples,
       SUM(f.srtt_us * f.rtt_samples) * 1.0 / NULLIF(SUM(CASE WHEN f.srtt_us IS NOT NULL THEN f.rtt_samples END), 0)
         AS srtt_us,
       MAX(f.srtt_max_us) AS srtt_max_us, MIN(b.best_us) AS best_us
FROM tw JOIN net_flows f ON f.node = tw.node AND f.ts >= tw.lo AND f.ts < tw.hi
LEFT JOIN best b ON b.node = f.node AND b.peer_addr = f.peer_addr
WHERE f.peer_addr IS NOT NULL
GROUP BY f.node, f.peer_addr
ORDER BY f.node, f.peer_addr"""


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _stands_out(value, others, minimum):
    """value is at least `minimum` and STANDS_OUT times the others' median."""
    if value is None or value < minimum:
        return False
    ref = _median(others)
    return ref is None or value >= STANDS_OUT * max(ref, 1e-9)


def slow_pairs(flow_rows):
    """The slow connections between the job's nodes: {frozenset((a, b)): (rtt_us, usual_us)}, with each
    node's peers {node: {peer}}. A connection's round trip is the lower of its two ends' readings: each
    end times its data to the other's acknowledgement, and a receiver that holds its acknowledgement back
    until it has data of its own to send (delayed ACKs: a hub waiting for its slowest rank before it
    answers the others) inflates one end's readings only, while a slow link slows both. So a connection
    is judged only where both ends are the job's (a server outside it answers after its own work). A
    connection is slow when that round trip is RTT_FACTOR times the median of all connections' (and
    RTT_MIN_US longer), or RTT_FACTOR times its own best over the span."""
    node_of = {r["local_addr"]: r["node"] for r in flow_rows if r["local_addr"]}
    views = {}                         # pair -> {end: (rtt, best)}
    for r in flow_rows:
        if r["srtt_us"] is None or not r["rtt_samples"]:
            continue
        peer = node_of.get(r["peer_addr"])
        if peer is None or peer == r["node"]:
            continue
        rtt, best = float(r["srtt_us"]), r["best_us"]
        best = float(best) if best is not None else rtt
        old = views.setdefault(frozenset((r["node"], peer)), {}).get(r["node"])
        views[frozenset((r["node"], peer))][r["node"]] = (max(rtt, old[0]), min(best, old[1])) if old else (rtt, best)
    per_pair, peers = {}, {}
    for pair, ends in views.items():
        if len(ends) < 2:
            continue
        per_pair[pair] = (min(rtt for rtt, _ in ends.values()), min(best for _, best in ends.values()))
        a, b = tuple(pair)
        peers.setdefault(a, set()).add(b)
        peers.setdefault(b, set()).add(a)
    usual = _median([rtt for rtt, _ in per_pair.values()])
    slow = {}
    for pair, (rtt, best) in per_pair.items():
        if usual is not None and rtt >= RTT_FACTOR * usual and rtt - usual >= RTT_MIN_US:
            slow[pair] = (rtt, usual)
        elif best and rtt >= RTT_FACTOR * best and rtt - best >= RTT_MIN_US:
            slow[pair] = (rtt, best)
    return slow, peers


def slow_end(slow, peers):
    """(node, its slow peers) that the slow connections point to, or (None, pairs) when their ends cannot
    be told apart: the end common to all of two or more slow connections, where a connection between two
    other nodes is measured and fast (the others' links are fine: in a star, every connection of a slow
    hub is as slow as every connection of a fabric slow everywhere); else, of one slow connection, the end
    slow to all its peers while the other end is fast to most of its own."""
    if not slow:
        return None, []
    pairs = list(slow)
    common = set.intersection(*(set(p) for p in pairs))
    if len(pairs) >= 2 and len(common) == 1:
        node = next(iter(common))
        measured = {frozenset((a, b)) for a, bs in peers.items() for b in bs}
        if any(node not in p and p not in slow for p in measured):
            return node, sorted({x for p in pairs for x in p if x != node})
        return None, sorted(tuple(sorted(p)) for p in pairs)
    share = {n: sum(1 for p in pairs if n in p) / max(1, len(peers.get(n, ()))) for p in pairs for n in p}
    whole = [n for n, s in share.items() if s >= 1.0]
    if len(whole) == 1 and all(share[n] <= 0.5 for n in share if n != whole[0]):
        node = whole[0]
        return node, sorted({x for p in pairs if node in p for x in p if x != node})
    return None, sorted(tuple(sorted(p)) for p in pairs)


def judge(iface_rows, rdma_rows, flow_rows):
    """{node: LinkEvidence} for every node with a link at work over the time: its gravest kind (or None),
    and the nodes whose connections say nothing alone (`ambiguous`: slow connections whose ends cannot be
    told apart) -> (evidence, ambiguous pairs)."""
    job_ifaces = {(r["node"], r["iface"]) for r in flow_rows if r["iface"] and r["iface"] != "lo"}
    nodes_with_flows = {n for n, _ in job_ifaces}
    ifaces = [r for r in iface_rows
              if ((r["node"], r["iface"]) in job_ifaces)
              or (r["node"] not in nodes_with_flows and int(r["bytes"] or 0) > 0)]
    ports = [r for r in rdma_rows if int(r["data_words"] or 0) > 0]
    out = {}
    for r in ifaces:
        out.setdefault(r["node"], LinkEvidence(r["node"]))
    for r in ports:
        out.setdefault(r["node"], LinkEvidence(r["node"]))
    for r in flow_rows:
        if r["iface"] != "lo" and int(r["bytes"] or 0) > 0:
            out.setdefault(r["node"], LinkEvidence(r["node"]))
    found = {node: [] for node in out}          # node -> [(kind, link, words, numbers)]

    speeds = {(r["node"], r["iface"]): r["speed_mbps"] for r in ifaces if r["speed_mbps"]}
    for r in ifaces:
        key = (r["node"], r["iface"])
        words, numbers = [], {}
        changes = int(r["carrier_changes"] or 0)
        if changes or r["carrier_min"] == 0 or int(r["down_samples"] or 0):
            words.append(f"its carrier changed {changes} time(s)" if changes else "its link was down")
            numbers["carrier_changes"] = changes
        if int(r["errors"] or 0) >= ERRORS_MIN:
            words.append(f"{r['errors']} errors ({r['crc_errors']} bad checksums)")
            numbers["errors"] = int(r["errors"])
        speed, top = r["speed_mbps"], r["speed_max_mbps"]
        others = [v for k, v in speeds.items() if k[0] != r["node"]]
        if speed and top and speed < SPEED_DROP * top:
            words.append(f"at {speed} of {top} Mb/s")
            numbers.update(speed_mbps=speed, speed_max_mbps=top)
        elif speed and others and speed < SPEED_DROP * _median(others):
            words.append(f"at {speed} Mb/s vs {_median(others):.0f} on the other nodes")
            numbers.update(speed_mbps=speed, others_speed_mbps=_median(others))
        if words:
            found[r["node"]].append(("net-link", r["iface"], "; ".join(words), numbers))
    rates = {(r["node"], r["device"], r["port"]): r["rate_gbps"] for r in ports if r["rate_gbps"]}
    waits = {(r["node"], r["device"], r["port"]): _per_s(r["xmit_wait"], r["span_ns"]) for r in ports}
    for r in ports:
        key = (r["node"], r["device"], r["port"])
        link = f"{r['device']} port {r['port']}"
        words, numbers = [], {}
        if int(r["not_active"] or 0) or int(r["link_downed"] or 0):
            words.append(f"went down {r['link_downed'] or 0} time(s)" if r["link_downed"] else "not ACTIVE")
            numbers["link_downed"] = int(r["link_downed"] or 0)
        if int(r["errors"] or 0) >= ERRORS_MIN:
            words.append(f"{r['errors']} port errors (symbol, integrity, receive, retraining)")
            numbers["errors"] = int(r["errors"])
        others = [v for k, v in rates.items() if k[0] != r["node"]]
        if r["rate_gbps"] and others and r["rate_gbps"] < SPEED_DROP * _median(others):
            words.append(f"at {r['rate_gbps']:g} Gb/s vs {_median(others):g} on the other nodes")
            numbers.update(rate_gbps=r["rate_gbps"], others_rate_gbps=_median(others))
        if words:
            found[r["node"]].append(("net-link", link, "; ".join(words), numbers))
            continue
        wait = waits[key]
        if _stands_out(wait, [v for k, v in waits.items() if k[0] != r["node"]], 1.0):
            found[r["node"]].append(("net-congestion", link, f"waited for credit to send {wait:.0f} ticks/s "
                                     f"(port_xmit_wait) vs {_median([v for k, v in waits.items() if k[0] != r['node']]) or 0:.0f} "
                                     f"on the other ports", dict(xmit_wait_per_s=round(wait, 1))))
    drops = {r["node"]: 0 for r in ifaces}
    for r in ifaces:
        drops[r["node"]] += int(r["drops"] or 0)
    for node, n in drops.items():
        if _stands_out(n, [v for k, v in drops.items() if k != node], DROPS_MIN):
            found[node].append(("net-congestion", _iface_of(ifaces, node), f"{n} packets dropped", dict(drops=n)))
    retrans, recoveries, sent = {}, {}, {}
    for r in flow_rows:
        retrans[r["node"]] = retrans.get(r["node"], 0) + int(r["retransmits"] or 0)
        recoveries[r["node"]] = recoveries.get(r["node"], 0) + int(r["recoveries"] or 0)
        sent[r["node"]] = sent.get(r["node"], 0) + int(r["tx_bytes"] or 0)
    for node, n in retrans.items():
        floor = max(RETRANS_MIN, RETRANS_SHARE * sent[node] / SEGMENT_BYTES)   # a few in much traffic is noise
        others = [v for k, v in retrans.items() if k != node]
        if (node in found and _stands_out(n, others, floor)
                and _stands_out(recoveries[node], [v for k, v in recoveries.items() if k != node], RECOVERIES_MIN)):
            found[node].append(("net-congestion", _iface_of(ifaces, node, flow_rows),
                                f"{n} packets retransmitted in {recoveries[node]} loss recoveries vs "
                                f"{_median(others):.0f} retransmitted on the other nodes",
                                dict(retransmits=n, recoveries=recoveries[node])))
    slow, peers = slow_pairs(flow_rows)
    node, who = slow_end(slow, peers)
    ambiguous = []
    if node is not None and node in found:
        rtts = [slow[frozenset((node, p))] for p in who if frozenset((node, p)) in slow]
        rtt, usual = max(rtts) if rtts else (None, None)
        found[node].append(("net-congestion", _iface_of(ifaces, node, flow_rows),
                            f"round trips of {rtt / 1000:.1f} ms to {_peer_words(who)} vs {usual / 1000:.2f} ms usual",
                            dict(rtt_ms=round(rtt / 1000, 2), usual_rtt_ms=round(usual / 1000, 3))))
        out[node].peers = who
    elif node is None and who:
        ambiguous = who
    for node, items in found.items():
        if not items:
            continue
        items.sort(key=lambda it: KINDS.index(it[0]))
        ev = out[node]
        ev.kind, ev.link = items[0][0], items[0][1]
        ev.detail = "; ".join(f"{link}: {words}" if link else words for _, link, words, _ in items)
        for _, _, _, numbers in reversed(items):
            ev.numbers.update(numbers)
    return out, ambiguous


def _per_s(count, span_ns):
    return None if count is None or not span_ns else int(count) / (int(span_ns) / 1e9)


def _iface_of(ifaces, node, flow_rows=()):
    named = sorted({r["iface"] for r in flow_rows if r["node"] == node and r["iface"] and r["iface"] != "lo"})
    return named[0] if named else next((r["iface"] for r in ifaces if r["node"] == node), "")


def _peer_words(peers):
    return ", ".join(peers) if len(peers) <= 4 else f"{', '.join(peers[:4])} and {len(peers) - 4} more"


def standing_out(evidence):
    """The nodes whose evidence stands out: its kind is on at most MAX_ALIKE of the nodes seen (every node's
    links alike, a fabric-wide condition, names nobody)."""
    return evidence_rule.standing_out(evidence, MAX_ALIKE, lambda ev: (KINDS.index(ev.kind), ev.node))


def alike(evidence):
    """The kinds more than MAX_ALIKE of the nodes show alike: {kind: [LinkEvidence]}."""
    return evidence_rule.alike(evidence, MAX_ALIKE)


def over(runner, series, lo_bin, hi_bin):
    """Every node's link evidence over bins [lo_bin, hi_bin) of the series (each node's clock) ->
    ({node: LinkEvidence}, ambiguous pairs, {"net_samples": sql, "rdma_samples": sql, "net_flows": sql})."""
    def per_node(lo, hi):
        return [(node, series.to_node(node, series.bin_start(lo)), series.to_node(node, series.bin_start(hi)))
                for node in sorted(series.clocks)]
    ranges = per_node(lo_bin, hi_bin)
    texts = {"net_samples": interfaces_sql(ranges), "rdma_samples": rdma_sql(ranges),
             "net_flows": flows_sql(ranges, per_node(0, series.n_bins))}
    evidence, ambiguous = judge(runner.rows(texts["net_samples"]), runner.rows(texts["rdma_samples"]),
                                runner.rows(texts["net_flows"]))
    return evidence, ambiguous, texts

