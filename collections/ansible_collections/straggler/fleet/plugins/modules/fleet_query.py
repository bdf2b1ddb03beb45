# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: straggler.fleet.fleet_query is an action plugin (plugins/action/fleet_query.py)
# that runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_query
short_description: Run one SQL on every agent at once over HTTPS (mutual TLS), from the controller
version_added: 0.1.0
description:
  - Runs O(sql) on every node's agent in one task, from the controller, through the straggler fleet client
    (C(straggler.fleet.client.fleet_query) of the core package, the same as C(straggler fleet query)); the
    requests go out in parallel over HTTPS with mutual TLS 1.3 to each agent's API port.
  - Returns one table (the fleet client adds the node column), a status per node, and each node's clock
    offset to the controller measured over the same connections.
  - The table is combined by the same rule as M(straggler.fleet.aggregate) (the core's C(straggler.fleet.combine)),
    so the same SQL gives the same table over either path. Its columns are C(node) (unless the SQL selected one)
    and the union of the nodes' columns in first-seen order; a node whose columns differ keeps its rows, with
    null for the columns it lacks, and its RV(nodes[].message) says how (C(columns differ) and which).
  - This is the fast path when the agents' port is reachable from the controller; M(straggler.fleet.query)
    with M(straggler.fleet.aggregate) is the path that needs nothing but Ansible's own connection.
  - Runs once per play on the controller (like C(run_once)), whatever the play's hosts.
  - The task fails only when no node answered, or, with O(fail_on_partial), when any node did not. Nodes
    that answered with an SQL error, timed out, refused or were unreachable are listed in RV(failed_nodes)
    with their status and message in RV(nodes).
  - The query is read-only (the agents enforce it), so it runs in check mode too; only O(dest) is not written.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller.
options:
  sql:
    description:
      - The SQL to run on every node (one read-only statement).
    type: str
    required: true
  nodes:
    description:
      - The agents to query, as C(host:port) (C([v6addr]:port) for IPv6).
      - Defaults to every host of the play (C(ansible_play_hosts_all), or O(hosts)), each at its C(ansible_host)
        (else its inventory hostname) and its C(straggler_agent_port) (else O(port)).
    type: list
    elements: str
  hosts:
    description:
      - Inventory hostnames whose agents to query, instead of the play's hosts (for a play on localhost).
      - Mutually exclusive with O(nodes).
    type: list
    elements: str
  timeout:
    description:
      - Seconds each node may take to answer.
    type: float
    default: 5
  deadline:
    description:
      - Seconds the whole fan-out may take; nodes that have not answered by then are reported as timed out.
    type: float
    default: 15
  limit:
    description:
      - The most rows each node returns.
    type: int
    default: 10000
  concurrency:
    description:
      - The most nodes queried at the same time.
    type: int
    default: 32
  clock_samples:
    description:
      - Clock exchanges per node for the offset estimate (the shortest round trip wins).
    type: int
    default: 5
  dest:
    description:
      - A JSON file on the controller to write the results to (RV(columns), RV(rows), RV(nodes), RV(offsets),
        RV(failed_nodes) and the SQL). Parent directories are created.
    type: path
  fail_on_partial:
    description:
      - Fail the task when any node did not answer (by default it fails only when none answered).
    type: bool
    default: false
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
    details: Queries (read-only) and reports whether O(dest) would change without writing it.
  diff_mode:
    support: full
    details: Shows how O(dest) changes with C(--diff).
notes:
  - Privileges - it runs on the controller and asks the agents over HTTPS with the controller's client certificate; no C(become) needed.
  - "Node statuses: C(ok), C(empty) (answered, no rows), C(sql-error), C(tls-error), C(forbidden) (the client
    certificate lacks the role), C(refused), C(timeout), C(truncated) (the answer ended short), C(unreachable)."
  - Offsets are node realtime minus controller realtime, in ns, with half the shortest round trip as uncertainty.
seealso:
  - module: straggler.fleet.query
  - module: straggler.fleet.aggregate
"""

EXAMPLES = r"""
- name: Ask every agent at once
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Slowest all-reduce per node
      straggler.fleet.fleet_query:
        sql: SELECT max(duration) / 1e6 AS max_ms FROM calls WHERE op = 'ncclAllReduce'
        ca: ~/.local/share/straggler/pki/ca.crt
        cert: ~/.local/share/straggler/pki/controller.crt
        key: ~/.local/share/straggler/pki/controller.key
        dest: results/allreduce.json
      register: straggler_fleet

- name: From a play on localhost, for the gpu group
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Count events on every GPU host
      straggler.fleet.fleet_query:
        sql: SELECT count(*) AS events FROM events
        hosts: "{{ groups['gpu'] }}"
        fail_on_partial: true
"""

RETURN = r"""
columns:
  description: Column names of the combined table; C(node) first unless the SQL selected a C(node) column itself,
    then the union of the nodes' columns in first-seen order.
  returned: success
  type: list
  elements: str
  sample: [node, max_ms]
rows:
  description: Every answering node's rows.
  returned: success
  type: list
  elements: list
  sample: [[gpu-node-01, 12.5], [gpu-node-03, 81.0]]
row_count:
  description: Number of rows in RV(rows).
  returned: success
  type: int
  sample: 2
nodes:
  description: One status per node queried, as the fleet client reports it.
  returned: success
  type: list
  elements: dict
  contains:
    address:
      description: The C(host:port) queried.
      type: str
      sample: '10.0.12.11:7500'
    host:
      description: The inventory hostname the address was built from (null when O(nodes) was given).
      type: str
      sample: gpu-node-01
    node:
      description: The node name the agent reported.
      type: str
      sample: gpu-node-01
    status:
      description: One of C(ok), C(empty), C(sql-error), C(tls-error), C(forbidden), C(refused), C(timeout), C(truncated),
        C(unreachable).
      type: str
      sample: ok
    answered:
      description: Whether the node answered (RV(nodes[].status) C(ok) or C(empty), the rule of the core's fleet client).
      type: bool
      sample: true
    message:
      description: One line saying what failed, empty when the node answered.
      type: str
      sample: ''
    latency_ms:
      description: Milliseconds the node took to answer.
      type: float
      sample: 12.4
    row_count:
      description: Rows the node returned.
      type: int
      sample: 1
    offset_ns:
      description: The node's clock offset to the controller, in ns.
      type: int
      sample: 15000
    uncertainty_ns:
      description: Uncertainty of RV(nodes[].offset_ns), in ns.
      type: int
      sample: 400000
    offset_flagged:
      description: Whether the node's clock is off by more than RV(offset_threshold_ns) even at the near edge of its
        uncertainty.
      type: bool
      sample: false
    truncated:
      description: Whether the node had more rows than O(limit) (or than the agent's answer size cap).
      type: bool
      sample: false
offsets:
  description: Clock offset and its uncertainty per answering node (node realtime minus controller realtime, ns), and
    whether it is flagged (above RV(offset_threshold_ns) even allowing for the uncertainty).
  returned: success
  type: dict
  sample: {gpu-node-01: {offset_ns: 15000, uncertainty_ns: 400000, flagged: false}}
offset_threshold_ns:
  description: The clock offset above which a node's clock is flagged, in ns.
  returned: success
  type: int
  sample: 5000000
sql:
  description: The SQL that ran.
  returned: success
  type: str
  sample: SELECT count(*) AS events FROM events
elapsed_ms:
  description: Milliseconds the whole fan-out took.
  returned: success
  type: float
  sample: 240.5
failed_nodes:
  description: The nodes that did not answer (inventory hostname where known, else node name or address).
  returned: success
  type: list
  elements: str
  sample: [gpu-node-05]
exit_code:
  description: The fleet client's exit code, 0 when every node answered, 3 when some did, 4 when none did.
  returned: success
  type: int
  sample: 3
dest:
  description: The JSON file written, when O(dest) was given.
  returned: when O(dest) is set
  type: str
  sample: results/allreduce.json
msg:
  description: One line saying how many nodes answered and which did not.
  returned: always
  type: str
  sample: '4 of 5 nodes answered, 4 rows; failed: gpu-node-05'
"""
