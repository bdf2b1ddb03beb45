# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: straggler.fleet.watch is an action plugin (plugins/action/watch.py)
# that runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: watch
short_description: Watch a running training job for a straggler node, for a bounded time, on the controller
version_added: 0.1.0
description:
  - Runs the core's live watch (C(straggler watch)) for O(duration) seconds. Every O(interval) seconds it asks each
    agent over HTTPS (mutual TLS) for the step-time rows since its last answer, and runs explain on the last
    O(window) seconds against the O(baseline) seconds before them.
  - A straggler is named (an C(onset) event) when explain names the same node in two polls in a row; the watch
    also reports C(cause-change), C(recovered), C(lost) and C(back) events. A node that stops answering is
    reported and the watch goes on with the others.
  - When the job loses a quarter or more of its time to a slowest rank that moves from rank to rank (no node's
    fault), the watch reports an C(imbalance) event, and C(balanced) when it no longer does; neither names a
    straggler.
  - With O(fail_on_straggler) (the default) the watch stops at the first onset and the task fails, returning the
    finding, which makes a CI pipeline red. Without it the watch runs for the whole O(duration) and the task
    reports the straggler named when it ended, if any.
  - The task fails when no agent answered during the whole watch.
  - Writes the events as JSON lines to O(dest) when asked.
  - Runs once per play on the controller (like C(run_once)), whatever the play's hosts. It only reads.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller (prometheus-client, which
    the agents use for their metrics, is not needed there).
options:
  nodes:
    description:
      - The agents to watch (C(host:port)).
      - Mutually exclusive with O(hosts). Without either, the agents of the play's hosts are watched.
    type: list
    elements: str
  hosts:
    description:
      - Watch the agents of these inventory hosts (at C(ansible_host) and C(straggler_agent_port), else O(port)).
    type: list
    elements: str
  duration:
    description:
      - Seconds to watch (the task takes this long unless a straggler stops it earlier with O(fail_on_straggler)).
    type: float
    required: true
  interval:
    description:
      - Poll the agents every this many seconds (the core's default when not set, 1).
    type: float
  window:
    description:
      - Judge each rank's last this many seconds (the core's default when not set, 10). At least three O(interval)s.
    type: float
  baseline:
    description:
      - ... against up to this many seconds before them (the core's default when not set, 50).
    type: float
  min_gap:
    description:
      - The straggler waits for its peers at least this share of its time less than the other ranks' median
        (explain's C(--min-gap); the core's default when not set).
    type: float
  fail_on_straggler:
    description:
      - Stop at the first straggler named and fail the task (after writing O(dest)).
      - When false, watch for the whole O(duration) and never fail for a straggler.
    type: bool
    default: true
  dest:
    description:
      - Write the watch's events here, one JSON object per line.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - straggler.fleet.attributes
  - straggler.fleet.attributes.controller
  - straggler.fleet.agents
  - straggler.fleet.tls
attributes:
  check_mode:
    support: none
    details: >-
      In check mode nothing is watched and the task is reported as skipped: a watch would only read the agents,
      and would take O(duration) seconds to do it. The options are still checked.
notes:
  - Privileges - it runs on the controller and asks the agents over HTTPS with the controller's client certificate; no C(become) needed.
  - Each event returned and written carries the controller's wall clock (C(time)) and monotonic clock (C(mono_ns)).
  - Run the task with C(-v) to see the events as they happen.
seealso:
  - module: straggler.fleet.explain
  - module: straggler.fleet.fleet_query
"""

EXAMPLES = r"""
- name: Watch the gpu group's agents for 5 minutes; fail the pipeline at the first straggler
  straggler.fleet.watch:
    hosts: "{{ groups['gpu'] }}"
    duration: 300
    ca: ~/.local/share/straggler/pki/ca.crt
    cert: ~/.local/share/straggler/pki/controller.crt
    key: ~/.local/share/straggler/pki/controller.key
    dest: results/watch.jsonl
  register: straggler_watch

- name: Watch for a minute and report what was seen, without failing
  straggler.fleet.watch:
    nodes:                # host:port; a host alone: the agents' default port
      - gpu-node-01
      - gpu-node-02:7500
    duration: 60
    interval: 0.5
    window: 5
    fail_on_straggler: false
  register: straggler_watch
"""

RETURN = r"""
straggler:
  description:
    - The straggler's node name, or null when there is none.
    - With O(fail_on_straggler), the first straggler named; without, the one still named when the watch ended.
  returned: success
  type: str
  sample: gpu-node-02
finding:
  description:
    - The event that named RV(straggler) with its cause (its onset, or a later cause-change), or null.
    - Keys event, node, rank, pid, cause, share (of its excess the cause explains), wait_pct, others_wait_pct,
      step_moved_s (how long ago the job's step time moved), summary, time, mono_ns, watch_s.
  returned: success
  type: dict
  sample:
    event: onset
    node: gpu-node-02
    rank: 1
    cause: cpu-contention
    share: 0.82
events:
  description:
    - Every event of the watch, in order. C(event) is one of start, onset, cause-change, recovered, imbalance,
      balanced, lost, back, end.
    - Verdict events and the end carry C(window), as RV(time_lost).
  returned: success
  type: list
  sample: [{event: onset, node: gpu-node-03, rank: 2, cause: cpu-contention, share: 0.7}]
  elements: dict
time_lost:
  description:
    - The job's time lost over the last time the watch held (its last O(baseline) + O(window) seconds) at its
      sync points, split by what lost it (explain's
      what-if, from the collective and synchronize calls the agents record), or null before the first verdict.
    - Keys measured; when measured, span_s, sync_points, waited_in (collectives, or synchronize where the
      collectives only enqueue), lost_s, lost_ratio, parts (each node's episode or pauses, with what, node,
      lost_s) and imbalance (lost_s, sync_points, slowest); when not, why.
  returned: success
  type: dict
  sample:
    measured: true
    span_s: 58.2
    lost_s: 9.1
    lost_ratio: 0.156
    parts: [{what: episode, node: gpu-node-02, lost_s: 7.4}]
    imbalance: {lost_s: 1.7, sync_points: 310, slowest: []}
lost:
  description: The nodes (their names, or their addresses when they never answered) not answering when the watch ended.
  returned: success
  type: list
  sample: []
  elements: str
written:
  description: The files written (O(dest)) whose content changed.
  returned: success
  type: list
  sample: [results/watch.jsonl]
  elements: str
msg:
  description: One line naming the straggler and its cause, or saying that none was named.
  returned: always
  type: str
  sample: 'straggler: gpu-node-02 rank 1: cpu-contention (82% of its excess): ...'
"""
