"""Clock math: reading (monotonic, realtime) pairs, NTP-style offset estimation between a node
and a reference clock, and mapping a node's CLOCK_MONOTONIC timestamps to wall-clock time.

Everything here is a pure function of its arguments except `read_clock_pair`, which reads the
local clocks. This module must not do I/O beyond reading clocks, and must not import anything
else from straggler: the agent, the API, the fleet client, merge and export all share it.

Conventions: all times are integer nanoseconds. An *offset* is node realtime minus reference
realtime (positive: the node's wall clock is ahead).
"""
import bisect
import time

__all__ = ["read_clock_pair", "estimate_offset", "mono_to_real", "offset_of_pairs"]


def read_clock_pair(tries: int = 3):
    """(mono_ns, real_ns) read back to back: CLOCK_MONOTONIC and CLOCK_REALTIME at (nearly) the same instant.

    Reads monotonic, realtime, monotonic `tries` times and keeps the read with the tightest
    bracket, reporting the monotonic midpoint; so a preemption between the two reads does not
    skew the pair.
    """
    best = None
    for _ in range(max(1, tries)):
        mono_before = time.monotonic_ns()
        real_ns = time.time_ns()
        mono_after = time.monotonic_ns()
        width = mono_after - mono_before
        if best is None or width < best[0]:
            best = (width, (mono_before + mono_after) // 2, real_ns)
    return best[1], best[2]


def estimate_offset(samples):
    """NTP-style offset of a node's realtime clock against the reference clock.

    `samples`: iterable of (t_send_ns, node_real_ns, t_recv_ns): t_send/t_recv read on the
    reference clock just before sending the request and just after receiving the answer,
    node_real read by the node while answering. The sample with the smallest round trip wins:
    offset = node_real - (t_send + t_recv) / 2, uncertainty = round trip / 2 (the node read its
    clock somewhere inside the round trip). Returns (offset_ns, uncertainty_ns), integers.
    Raises ValueError when no sample is usable (empty, or t_recv before t_send).
    """
    best = None
    for sample in samples:
        t_send, node_real, t_recv = (int(v) for v in sample)
        rtt = t_recv - t_send
        if rtt < 0:
            continue
        if best is None or rtt < best[0]:
            best = (rtt, t_send, node_real, t_recv)
    if best is None:
        raise ValueError("no usable clock sample (need at least one with t_recv >= t_send)")
    rtt, t_send, node_real, t_recv = best
    # (t_send + t_recv) / 2 without float rounding: ns since 1970 exceed float's exact range.
    midpoint_x2 = t_send + t_recv
    offset_ns = (2 * node_real - midpoint_x2) // 2
    uncertainty_ns = (rtt + 1) // 2
    return offset_ns, uncertainty_ns


def _sorted_pairs(pairs):
    cleaned = sorted((int(m), int(r)) for m, r in pairs)
    if not cleaned:
        raise ValueError("no clock pairs: cannot map monotonic time to realtime")
    return cleaned


def mono_to_real(pairs, mono_ns):
    """Realtime ns for a monotonic timestamp, from (mono_ns, real_ns) pairs read on the same node.

    Between two pairs: linear interpolation (absorbs NTP slewing between samples). Before the
    first or after the last pair: the nearest pair's offset (the clocks tick at the same rate
    there as far as we know). `pairs` need not be sorted.
    """
    ordered = _sorted_pairs(pairs)
    mono_ns = int(mono_ns)
    monos = [m for m, _ in ordered]
    index = bisect.bisect_left(monos, mono_ns)
    if index < len(ordered) and monos[index] == mono_ns:
        return ordered[index][1]
    if index == 0:
        m0, r0 = ordered[0]
        return r0 + (mono_ns - m0)
    if index == len(ordered):
        m1, r1 = ordered[-1]
        return r1 + (mono_ns - m1)
    (m0, r0), (m1, r1) = ordered[index - 1], ordered[index]
    # integer interpolation: exact for ns-sized numbers
    return r0 + ((mono_ns - m0) * (r1 - r0)) // (m1 - m0)


def offset_of_pairs(pairs, mono_ns=None):
    """realtime - monotonic (ns) at `mono_ns` (default: the latest pair): the value to add to a ts."""
    ordered = _sorted_pairs(pairs)
    if mono_ns is None:
        mono_ns = ordered[-1][0]
    return mono_to_real(ordered, mono_ns) - int(mono_ns)
