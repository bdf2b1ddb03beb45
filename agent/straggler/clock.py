"""Clock math: reading (monotonic, realtime) pairs, NTP-style offset estimation between a node
and a reference clock, mapping a node's CLOCK_MONOTONIC timestamps to wall-clock time, and the
fleet timeline merge and export put every node on (clock_segments, Aligner).

Everything here is a pure function of its arguments except `read_clock_pair`, which reads the
local clocks, and an Aligner, which holds the segments it was given. This module must not do I/O
beyond reading clocks, and must not import anything else from straggler: the agent, the API, the
fleet client, merge and export all share it.

Conventions: all times are integer nanoseconds. An *offset* is node realtime minus reference
realtime (positive: the node's wall clock is ahead). The *fleet timeline* of a node's monotonic
ts is its realtime (by its clock pairs) minus its offset.
"""
import bisect
import math
import time

__all__ = ["read_clock_pair", "estimate_offset", "mono_to_real", "offset_of_pairs", "as_int_ns",
           "clock_segments", "Aligner"]


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


def as_int_ns(value):
    """A stored time as int: an int as it is, a finite REAL truncated; None for anything else (text,
    a blob, NULL, inf or NaN: a database from elsewhere may hold them)."""
    if type(value) is int:
        return value
    if type(value) is float and math.isfinite(value):
        return int(value)
    return None


def clock_segments(pairs):
    """Piecewise-linear mono -> realtime from a node's clock pairs: mono_to_real at every pair's
    monotonic time (a repeated one takes the pair with the lower realtime, as mono_to_real does),
    linear between them, rate 1 before the first and after the last. One sort: O(n log n).

    Returns rows (lo_mono, knot_mono, base, slope_minus_1): for lo_mono <= ts < the next row's lo,
    real = ts + base + (ts - knot_mono) * slope_minus_1. No pairs: no rows.
    """
    knots = []                                 # (mono, real): the first pair of each distinct mono
    for mono, real in sorted((int(m), int(r)) for m, r in pairs):
        if not knots or knots[-1][0] != mono:
            knots.append((mono, real))
    if not knots:
        return []
    first_mono, first_real = knots[0]
    segs = [(-(1 << 62), first_mono, first_real - first_mono, 0.0)]   # before the first pair: rate 1
    for (m0, r0), (m1, r1) in zip(knots, knots[1:]):
        segs.append((m0, m0, r0 - m0, (r1 - r0) / (m1 - m0) - 1.0))
    last_mono, last_real = knots[-1]
    segs.append((last_mono, last_mono, last_real - last_mono, 0.0))  # after the last pair: rate 1
    return segs


class Aligner:
    """Each node's monotonic ts on the fleet timeline: its clock segments (clock_segments) minus its
    offset; within 1 ns of mono_to_real(pairs, ts) - offset. Merge registers one as the SQL function
    straggler_aligned_ts(node, ts) (4x faster there than a correlated subquery per row). None for a
    node without segments, a ts that is no integer time (as_int_ns), or an answer outside int64."""

    def __init__(self):
        self.nodes = {}

    def clear(self):
        self.nodes.clear()

    def set_node(self, node, segs, offset_ns):
        """The node's segments (clock_segments) and the offset to subtract; no segments: not aligned."""
        if segs:
            self.nodes[node] = ([s[0] for s in segs], [(k, b - int(offset_ns), m) for _, k, b, m in segs])

    def __call__(self, node, ts):
        entry = self.nodes.get(node)
        if type(ts) is not int:
            ts = as_int_ns(ts)
        if entry is None or ts is None:
            return None
        los, segs = entry
        knot, base, slope = segs[bisect.bisect_right(los, ts) - 1]
        aligned = ts + base + int((ts - knot) * slope)
        return aligned if -(1 << 63) <= aligned < (1 << 63) else None
