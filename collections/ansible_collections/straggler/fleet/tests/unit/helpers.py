# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test data for the collection's unit tests: real straggler node databases built with the core's schema."""

from __future__ import annotations

import sqlite3

EVENTS = [
    # seq, source, op, ts, duration
    (1, 'cuda', 'cuLaunchKernel', 1000, 5000),
    (2, 'nccl', 'ncclAllReduce', 9000, 800000),
    (3, 'sched', 'offcpu', 12000, 250000),
]


def make_node_db(path, node='node-a', events=None):
    """A straggler node database (the real schema) with a few events and clock pairs."""
    from straggler.store import schema
    events = EVENTS if events is None else events
    conn = sqlite3.connect(path)
    try:
        schema.create(conn, node=node)
        conn.executemany('INSERT INTO events(seq, node, source, op, ts, duration) VALUES (?, ?, ?, ?, ?, ?)',
                         [(seq, node, source, op, ts, duration) for seq, source, op, ts, duration in events])
        conn.executemany('INSERT INTO clock_pairs(node, mono_ns, real_ns) VALUES (?, ?, ?)',
                         [(node, 0, 1_700_000_000_000_000_000), (node, 10_000_000_000, 1_700_000_010_000_000_000)])
        conn.commit()
    finally:
        conn.close()
    return str(path)
