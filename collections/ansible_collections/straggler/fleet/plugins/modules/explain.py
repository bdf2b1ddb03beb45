# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: straggler.fleet.explain is an action plugin (plugins/action/explain.py)
# that runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: explain
short_description: Name the straggler node of a training job and say why, on the controller
version_added: 0.1.0
description:
  - Runs the core's explain (C(straggler explain)) on a database, usually the cluster database from
    M(straggler.fleet.merge), or live on the agents over HTTPS (mutual TLS) with O(nodes) or O(hosts).
    O(port) and the TLS options (O(ca), O(cert), O(key), O(server_name), O(no_tls)) are used only live.
  - Returns the report, ranked findings, each with its numbers, the SQL behind them and a recommendation, and the
    straggler's node name (null when there is none).
  - Writes the report as JSON (O(dest)), Markdown (O(markdown)) and JUnit XML (O(junit)) when asked. With
    O(fail_on_straggler) the task fails when a straggler is found, after writing them, which makes a CI
    pipeline red.
  - Runs once per play on the controller (like C(run_once)), whatever the play's hosts. It only reads.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller.
options:
  db:
    description:
      - The database to explain (a merged cluster database, or one node's store).
      - Mutually exclusive with O(nodes) and O(hosts). Without any of the three, the play's hosts' agents are asked live.
    type: path
  nodes:
    description:
      - Explain live, asking these agents (C(host:port)).
    type: list
    elements: str
  hosts:
    description:
      - Explain live, asking the agents of these inventory hosts (at C(ansible_host) and C(straggler_agent_port),
        else O(port)).
    type: list
    elements: str
  timeout:
    description:
      - Seconds each query may take (default 300 on a database, 30 live).
    type: float
  deadline:
    description:
      - Seconds one fan-out to the agents may take (live explain).
    type: float
  baseline_fraction:
    description:
      - The first part of each rank's window that serves as its own baseline (the core's default when not set, 0.25).
      - Not used with O(last).
    type: float
  last:
    description:
      - The recent part is each rank's last this many seconds, and what came before it its baseline
        (C(straggler explain --last)), instead of O(baseline_fraction).
    type: float
  since:
    description:
      - Judge only the trace from this time on the fleet's timeline (the report's, UTC), as an ISO-8601 time (UTC when
        it names no zone) or in seconds from the trace's start (for example V(3600)); each node is cut at that time
        through its own clock (as C(straggler explain --since)).
    type: raw
  until:
    description:
      - Judge only the trace before this time, in the forms of O(since) (as C(straggler explain --until)).
      - A span that is not after O(since) or holds no rank's calls fails the task in one line.
    type: raw
  min_gap:
    description:
      - The straggler waits for its peers at least this share of its time less than the other ranks' median
        (C(straggler explain --min-gap); the core's default when not set).
    type: float
  fail_on_straggler:
    description:
      - Fail the task when a straggler is found (after writing O(dest), O(markdown) and O(junit)).
    type: bool
    default: false
  junit:
    description:
      - Write the report as JUnit XML here (one test case per node, failing for the straggler and for missing nodes).
    type: path
  markdown:
    description:
      - Write the report as Markdown here.
    type: path
  dest:
    description:
      - Write the report as JSON here.
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
    support: full
    details: Explains (read-only) and reports whether the files would change without writing them.
  diff_mode:
    support: full
    details: Shows how O(dest), O(markdown) and O(junit) change with C(--diff).
notes:
  - Privileges - it runs on the controller as the user who runs Ansible and contacts no host; no C(become) needed.
seealso:
  - module: straggler.fleet.merge
  - module: straggler.fleet.fleet_query
"""

EXAMPLES = r"""
- name: Explain the merged cluster database; fail the pipeline on a straggler
  straggler.fleet.explain:
    db: results/cluster.db
    fail_on_straggler: true
    junit: results/straggler-junit.xml
    markdown: results/straggler.md
  register: straggler_report

- name: Explain what happened between 02:00 and 03:00 UTC of a day-long trace
  straggler.fleet.explain:
    db: results/cluster.db
    since: "2026-01-01T02:00:00"
    until: "2026-01-01T03:00:00"

- name: Explain live on the agents of the gpu group
  straggler.fleet.explain:
    hosts: "{{ groups['gpu'] }}"
    ca: ~/.local/share/straggler/pki/ca.crt
    cert: ~/.local/share/straggler/pki/controller.crt
    key: ~/.local/share/straggler/pki/controller.key
"""

RETURN = r"""
straggler:
  description: The straggler's node name, or null when there is none.
  returned: success
  type: str
  sample: gpu-node-03
cause:
  description:
    - The finding of the cause (one of the core's cause classes, such as cpu-contention, io-self or gpu-slow) that
      explains the largest share of the straggler's excess, or null when there is no straggler or no cause.
    - The same keys as each of RV(findings).
  returned: success
  type: dict
  sample: {node: gpu-node-03, cause: cpu-contention, severity: critical, share: 0.74, summary: 'CPU contention on gpu-node-03: ...'}
findings:
  description: Ranked findings (severity, node, cause, summary, numbers, sql, sources, recommendation, share).
  returned: success
  type: list
  sample: [{node: gpu-node-03, cause: straggler, severity: critical, share: 1.0, summary: 'gpu-node-03 (rank 2) is the straggler: ...'}]
  elements: dict
missing:
  description: Nodes that could not be asked (live explain), each with node, status and message.
  returned: success
  type: list
  sample: [{node: gpu-node-05, status: unreachable, message: 'connection refused'}]
  elements: dict
report:
  description: The whole report (straggler, findings, per-node summary rows, missing nodes, source, options, seconds;
    span, the span judged, with O(since) or O(until)).
  returned: success
  type: dict
  sample: {straggler: gpu-node-03, stragglers: [gpu-node-03], findings: [], nodes: [], missing: []}
written:
  description: The files written (O(dest), O(markdown), O(junit)) whose content changed.
  returned: success
  type: list
  sample: [results/report.json, results/report.md]
  elements: str
msg:
  description: One line naming the straggler and the cause that explains most of its excess, or saying that there is none.
  returned: always
  type: str
  sample: 'straggler: gpu-node-03: io-self (91% of its excess): ...'
"""
