"""The fleet timeline of straggler.clock: a node's monotonic ts through its clock pairs
(clock_segments) minus its offset (Aligner), as merge writes events.ts_aligned and export places
every slice. Pure: small series written out by hand, and a week of pairs as a node's agent keeps
them (one every 5 s), checked against mono_to_real."""
import random

import pytest

from straggler.clock import Aligner, as_int_ns, clock_segments, mono_to_real

BEFORE_ALL = -(1 << 62)
REAL0 = 1_767_225_600_000_000_000          # 2026-01-01 in ns since the epoch


def aligned(pairs, offset_ns, ts, node="n1"):
    aligner = Aligner()
    aligner.set_node(node, clock_segments(pairs), offset_ns)
    return aligner(node, ts)


def test_a_step_in_the_rate_bends_the_timeline_at_that_pair():
    # rate 1 from mono 1000 to 2000, then the wall clock runs twice as fast until mono 3000
    pairs = [(1_000, REAL0), (2_000, REAL0 + 1_000), (3_000, REAL0 + 3_000)]
    assert clock_segments(pairs) == [
        (BEFORE_ALL, 1_000, REAL0 - 1_000, 0.0),          # before the first pair: rate 1
        (1_000, 1_000, REAL0 - 1_000, 0.0),
        (2_000, 2_000, REAL0 - 1_000, 1.0),               # slope 2: slope_minus_1 1
        (3_000, 3_000, REAL0, 0.0),                        # after the last pair: rate 1
    ]
    assert aligned(pairs, 0, 1_500) == REAL0 + 500
    assert aligned(pairs, 0, 2_500) == REAL0 + 2_000       # half-way through the fast part
    assert aligned(pairs, 0, 4_000) == REAL0 + 4_000       # rate 1 again after the last pair
    assert aligned(pairs, 0, 0) == REAL0 - 1_000           # and before the first
    assert aligned(pairs, 700, 2_500) == REAL0 + 2_000 - 700   # the offset is subtracted
    for ts in (0, 1_000, 1_234, 2_000, 2_999, 3_000, 9_999):
        assert abs(aligned(pairs, 700, ts) - (mono_to_real(pairs, ts) - 700)) <= 1


def test_pairs_out_of_order_give_the_same_segments_and_a_repeated_mono_its_lower_realtime():
    pairs = [(1_000, REAL0), (2_000, REAL0 + 1_000), (3_000, REAL0 + 3_000), (5_000, REAL0 + 4_000)]
    shuffled = [pairs[2], pairs[0], pairs[3], pairs[1]]
    assert clock_segments(shuffled) == clock_segments(pairs)
    # the same mono read twice: the lower realtime counts, as mono_to_real reads it
    repeated = shuffled + [(2_000, REAL0 + 1_500)]
    assert clock_segments(repeated) == clock_segments(pairs)
    assert aligned(repeated, 0, 2_000) == mono_to_real(repeated, 2_000) == REAL0 + 1_000


def test_the_segments_are_mono_to_real_at_every_pair_on_random_series():
    rng = random.Random(7)
    for _ in range(200):
        pairs = [(rng.randrange(0, 50_000), REAL0 + rng.randrange(0, 80_000)) for _ in range(rng.randrange(1, 40))]
        pairs += rng.sample(pairs, min(3, len(pairs)))            # some repeated
        offset = rng.randrange(-10_000, 10_000)
        probes = {m for m, _ in pairs} | {rng.randrange(-20_000, 70_000) for _ in range(30)}
        for ts in probes:
            assert abs(aligned(pairs, offset, ts) - (mono_to_real(pairs, ts) - offset)) <= 1, (pairs, ts)


def test_one_pair_is_a_constant_offset_everywhere():
    pairs = [(5_000, REAL0 + 5_000 + 42)]
    assert clock_segments(pairs) == [(BEFORE_ALL, 5_000, REAL0 + 42, 0.0), (5_000, 5_000, REAL0 + 42, 0.0)]
    for ts in (0, 4_999, 5_000, 10 ** 12):
        assert aligned(pairs, 2, ts) == ts + REAL0 + 40


def test_no_pairs_no_segments_and_the_node_is_not_aligned():
    assert clock_segments([]) == []
    aligner = Aligner()
    aligner.set_node("no-pairs", clock_segments([]), 0)
    aligner.set_node("n1", clock_segments([(0, REAL0)]), 0)
    assert aligner("no-pairs", 1_000) is None and "no-pairs" not in aligner.nodes
    assert aligner("never-set", 1_000) is None
    assert aligner("n1", 1_000) == REAL0 + 1_000
    with pytest.raises(ValueError):
        mono_to_real([], 1)


def test_a_stored_time_that_is_no_integer_is_not_aligned():
    aligner = Aligner()
    aligner.set_node("n1", clock_segments([(0, REAL0)]), 0)
    assert aligner("n1", 1_000.9) == REAL0 + 1_000          # a REAL: truncated
    assert aligner("n1", "1000") is None and aligner("n1", b"\x01") is None and aligner("n1", None) is None
    assert aligner("n1", float("inf")) is None and aligner("n1", float("nan")) is None
    assert aligner("n1", (1 << 63) - 1) is None                # past int64 once aligned
    assert [as_int_ns(v) for v in (7, 7.9, -7.9, "7", None, float("inf"))] == [7, 7, -7, None, None, None]


def test_a_week_of_pairs_every_5_s_is_aligned_within_1_ns():
    """One pair every 5 s for a week (120,961), the wall clock slewed by NTP (a rate that wanders by
    tens of ppm) and read with jitter, the pairs in no order: every pair lands exactly on its
    realtime less the offset, every point between two pairs on the straight line between them, and
    random points agree with mono_to_real within 1 ns."""
    rng = random.Random(20260101)
    step, count, offset = 5_000_000_000, 7 * 24 * 720 + 1, 1_234_567
    pairs, real, ppm = [], REAL0, 0.0
    for k in range(count):
        mono = 3_600_000_000_000 + k * step + rng.randrange(-20_000, 20_000)
        pairs.append((mono, real))
        ppm = max(-50.0, min(50.0, ppm + rng.uniform(-2.0, 2.0)))
        real += step + int(step * ppm * 1e-6) + rng.randrange(-5_000, 5_000)
    ordered = sorted(pairs)
    rng.shuffle(pairs)
    segs = clock_segments(pairs)
    assert len(segs) == count + 1
    aligner = Aligner()
    aligner.set_node("gpu-node-07", segs, offset)
    for mono, real in ordered:
        assert aligner("gpu-node-07", mono) == real - offset
    for (m0, r0), (m1, r1) in zip(ordered, ordered[1:]):
        mid = (m0 + m1) // 2
        assert abs(aligner("gpu-node-07", mid) - (r0 + (mid - m0) * (r1 - r0) // (m1 - m0) - offset)) <= 1
    first, last = ordered[0], ordered[-1]
    assert aligner("gpu-node-07", first[0] - step) == first[1] - step - offset
    assert aligner("gpu-node-07", last[0] + step) == last[1] + step - offset
    for ts in [rng.randrange(first[0] - step, last[0] + step) for _ in range(8)]:
        assert abs(aligner("gpu-node-07", ts) - (mono_to_real(ordered, ts) - offset)) <= 1
