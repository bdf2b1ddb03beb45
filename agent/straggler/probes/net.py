"""The TCP flows of the traced processes as `net_flows` rows (store/schema.py NET_FLOW_COLUMNS).

bpf/net.c counts, per connection and process, what the process sent and received, the kernel's RTT
readings, retransmits, opens and closes; loader.Probes.read_net_flows hands one interval's counters
over as NetCounters. This module turns them into rows: addresses as text (an IPv4-mapped IPv6
address is shown as the IPv4 address it maps), the interface the route to the peer leaves by, the
RTT in microseconds, and the rank of the process.

The interface is looked up in the routing tables of the process's own network namespace
(/proc/PID/net/route and ipv6_route: longest prefix, then lowest metric), re-read at most every
ROUTE_REFRESH_S per namespace. A peer on loopback, or one of the namespace's own addresses, is
'lo'. A process that is gone before its first row, or a peer no route covers, has no interface.

This module reads /proc only: no BPF maps, no SQLite.
"""
import ipaddress
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple, Union

from .loader import AF_INET, AF_INET6, NetCounters

ROUTE_REFRESH_S = 10.0
RTF_UP = 0x0001
RTF_REJECT = 0x0200
RTF_LOCAL = 0x80000000     # an address of the namespace's own: reached through lo, whatever iface it names


def parse_route_v4(text) -> List[Tuple[ipaddress.IPv4Network, int, str]]:
    """/proc/net/route -> [(network, metric, iface)] of the routes that are up. Destination and mask
    are the kernel's u32 in hex, in the host's byte order."""
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            iface, dest, flags, metric, mask = fields[0], int(fields[1], 16), int(fields[3], 16), int(fields[6]), \
                int(fields[7], 16)
            network = ipaddress.IPv4Network((dest.to_bytes(4, sys.byteorder),
                                             bin(mask).count("1")), strict=False)
        except ValueError:
            continue
        if flags & RTF_UP and not flags & RTF_REJECT:
            routes.append((network, metric, iface))
    return routes


def parse_route_v6(text) -> List[Tuple[ipaddress.IPv6Network, int, str]]:
    """/proc/net/ipv6_route -> [(network, metric, iface)] of the routes that are up and not reject
    routes (it lists the local table too: an own address is 'lo'). Fields: dest, prefix length (hex),
    source, its length, next hop, metric, refcnt, use, flags, iface."""
    routes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            network = ipaddress.IPv6Network((bytes.fromhex(fields[0]), int(fields[1], 16)), strict=False)
            metric, flags, iface = int(fields[5], 16), int(fields[8], 16), fields[9]
        except ValueError:
            continue
        if flags & RTF_UP and not flags & RTF_REJECT:
            routes.append((network, metric, "lo" if flags & RTF_LOCAL else iface))
    return routes


def parse_local_v4(fib_trie) -> set:
    """The namespace's own IPv4 addresses: in /proc/net/fib_trie, a leaf followed by '/32 host LOCAL'."""
    own, last = set(), None
    for line in fib_trie.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last = stripped[3:].strip()
        elif stripped.startswith("/32 host LOCAL") and last:
            try:
                own.add(ipaddress.IPv4Address(last))
            except ValueError:
                pass
    return own


def route_iface(routes, address) -> Optional[str]:
    """The iface of the longest prefix covering `address` (the lowest metric among equals), or None."""
    best = None
    for network, metric, iface in routes:
        if address in network and (best is None or (network.prefixlen, -metric) > (best[0], -best[1])):
            best = (network.prefixlen, metric, iface)
    return best[2] if best else None


def address_of(family, raw) -> Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
    """The kernel's raw address as an ipaddress object (IPv4-mapped IPv6 as IPv4); None if unknown."""
    try:
        if family == AF_INET and len(raw) == 4:
            return ipaddress.IPv4Address(raw)
        if family == AF_INET6 and len(raw) == 16:
            address = ipaddress.IPv6Address(raw)
            return address.ipv4_mapped or address
    except ValueError:
        pass
    return None


class RouteTable:
    """Which interface the route to a peer leaves by, in a process's network namespace."""

    def __init__(self, proc_root="/proc", refresh_s=ROUTE_REFRESH_S, clock: Callable[[], float] = time.monotonic):
        self.proc_root = proc_root
        self.refresh_s = refresh_s
        self.clock = clock
        self._tables: Dict[int, tuple] = {}     # netns inode -> (read at, v4 routes, v6 routes, own v4 addresses)
        self._netns: Dict[int, int] = {}        # pid -> its netns inode, as last seen

    def _namespace(self, pid):
        try:
            inode = os.stat(f"{self.proc_root}/{pid}/ns/net").st_ino
        except OSError:
            return self._netns.get(pid), None
        if len(self._netns) > 50000:
            self._netns.clear()
        self._netns[pid] = inode
        return inode, f"{self.proc_root}/{pid}/net"

    def _table(self, pid):
        inode, net_dir = self._namespace(pid)
        if inode is None:
            return None
        table = self._tables.get(inode)
        now = self.clock()
        if net_dir is not None and (table is None or now - table[0] >= self.refresh_s):
            table = (now, parse_route_v4(_read(f"{net_dir}/route")), parse_route_v6(_read(f"{net_dir}/ipv6_route")),
                     parse_local_v4(_read(f"{net_dir}/fib_trie")))
            self._tables[inode] = table
        return table

    def iface(self, pid, peer, local=None) -> Optional[str]:
        """The interface toward `peer` (an ipaddress object) for process `pid`; None if not known."""
        if peer is None:
            return None
        if peer.is_loopback or (local is not None and peer == local):
            return "lo"
        table = self._table(pid)
        if table is None:
            return None
        _at, v4, v6, own_v4 = table
        if peer.version == 4:
            return "lo" if peer in own_v4 else route_iface(v4, peer)
        return route_iface(v6, peer)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class NetFlows:
    """Turns each interval's NetCounters into net_flows rows (NET_FLOW_COLUMNS' order)."""

    def __init__(self, node, rank_of: Callable[[int], Optional[int]], routes: Optional[RouteTable] = None):
        self.node = node
        self.rank_of = rank_of
        self.routes = routes or RouteTable()

    def rows(self, interval_start, interval_ns, flows: List[NetCounters]):
        out = []
        for flow in sorted(flows, key=lambda f: (f.tgid, f.local_port, f.peer_port, f.sk)):
            local, peer = address_of(flow.family, flow.local_addr), address_of(flow.family, flow.peer_addr)
            family = (peer or local).version if (peer or local) is not None else None
            srtt = round(flow.srtt_sum_us / flow.rtt_samples) if flow.rtt_samples else None
            out.append((self.node, interval_start, interval_ns, flow.tgid, self.rank_of(flow.tgid), family,
                        str(local) if local is not None else None, flow.local_port if local is not None else None,
                        str(peer) if peer is not None else None, flow.peer_port if peer is not None else None,
                        self.routes.iface(flow.tgid, peer, local),
                        flow.tx_bytes, flow.rx_bytes, flow.tx_calls, flow.rx_calls, flow.tx_ns, flow.rx_ns,
                        flow.retransmits, flow.recoveries, flow.rtt_samples, srtt,
                        flow.srtt_max_us if flow.rtt_samples else None,
                        flow.cwnd_min or None, flow.opened, flow.closed, flow.errors))
        return out
