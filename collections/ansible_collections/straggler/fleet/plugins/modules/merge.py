# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: straggler.fleet.merge is an action plugin (plugins/action/merge.py)
# that runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: merge
short_description: Merge node databases into one clock-aligned cluster database on the controller
version_added: 0.1.0
description:
  - Merges the node databases fetched by M(straggler.fleet.collect) (or any straggler databases) into one cluster
    database with the core's merge (C(straggler merge)). Every table is copied node-aware, nothing is dropped,
    and C(events.ts_aligned) puts every node's events on one timeline.
  - "Clock alignment: each node's monotonic timestamps are mapped to its wall clock with its own clock pairs, then
    corrected by the node's measured offset to the controller: from O(offsets), from the C(straggler_clock) facts of
    O(offsets_from_hosts) (see M(straggler.fleet.clock_facts)), else the input's own latest C(clock_offsets) row,
    else 0 (reported in RV(offset_unknown))."
  - The output is written to a temporary file and renamed into place; on failure nothing is left behind.
    It is mode 0600 (the nodes' process command lines are in it).
  - Reports C(changed) only when the output changed - an existing O(dest) that already holds exactly the rows this
    merge would write (every table compared, leaving out the time stamps of the merge itself) is left as it is.
  - "The inputs are treated as untrusted (they come from the hosts): an input is refused, with a one-line message
    naming it, when an object the merge reads (C(meta) or a node table) is a view, a virtual table or has a
    generated column, when it holds a trigger, when a C(meta) value the merge uses has the wrong type (for
    example a schema version that is not an integer or a node name with control characters), or when it holds
    another node than the host it was collected from (O(expect_nodes_from_hosts), O(expect_nodes))."
  - Runs once per play on the controller (like C(run_once)), whatever the play's hosts, and contacts no host.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller.
options:
  src:
    description:
      - Node databases to merge, as files or directories (a directory contributes its C(*.db) files, sorted by name).
    type: list
    elements: path
    required: true
  dest:
    description:
      - The cluster database to write (replaced if it exists). Its directory is created if missing.
    type: path
    required: true
  offsets:
    description:
      - Measured clock offsets, node name to C({offset_ns, uncertainty_ns}) (or C([offset_ns, uncertainty_ns])),
        node realtime minus reference realtime in ns.
      - Entries here win over those from O(offsets_from_hosts).
    type: dict
  offsets_from_hosts:
    description:
      - Inventory hostnames whose C(straggler_clock) facts (from M(straggler.fleet.clock_facts)) give their offsets.
        The inventory hostname is taken as the node name (the agent role's default node name).
      - Hosts without the fact are listed in RV(hosts_without_offsets) and fall back to their database's own offsets.
    type: list
    elements: str
  rename:
    description:
      - "What to do when two inputs hold the same node name: V(false) refuses to merge, V(true) renames later
        duplicates C(NODE-2), C(NODE-3), and a mapping C({old: new}) renames node C(old) in the later input that
        repeats it."
    type: raw
    default: false
  expect_nodes_from_hosts:
    description:
      - Inventory hostnames whose collected file C(<inventory_hostname>.db) (as M(straggler.fleet.collect) names
        it) must hold exactly the host's node, which is its C(straggler_agent_node) variable, else its inventory hostname.
        An input holding another node is refused.
      - Every input must then be one of these hosts' files or be named in O(expect_nodes); another input is refused
        (the node it holds could not be checked), before anything is merged.
    type: list
    elements: str
  expect_nodes:
    description:
      - Input database path to the node name it must hold; added to those from O(expect_nodes_from_hosts).
    type: dict
  deadline:
    description:
      - Seconds the merge may take; past them it stops, writes nothing and fails.
    type: float
    default: 1800.0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - straggler.fleet.attributes
  - straggler.fleet.attributes.controller
attributes:
  check_mode:
    support: full
    details: Lists the inputs and offsets; writes nothing.
notes:
  - Privileges - it runs on the controller as the user who runs Ansible and contacts no host; no C(become) needed.
seealso:
  - module: straggler.fleet.collect
  - module: straggler.fleet.clock_facts
  - module: straggler.fleet.explain
"""

EXAMPLES = r"""
- name: Measure offsets, fetch databases
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Clock offsets to the controller
      straggler.fleet.clock_facts:
    - name: Fetch each host's database
      straggler.fleet.collect:
        dest: results/collected

- name: Merge on the controller
  hosts: localhost
  gather_facts: false
  tasks:
    - name: One clock-aligned cluster database
      straggler.fleet.merge:
        src: results/collected
        dest: results/cluster.db
        offsets_from_hosts: "{{ groups['gpu'] }}"
        expect_nodes_from_hosts: "{{ groups['gpu'] }}"

    - name: With offsets given by hand
      straggler.fleet.merge:
        src: [a.db, b.db]
        dest: cluster.db
        offsets:
          node-a: {offset_ns: 0, uncertainty_ns: 1000000}
          node-b: {offset_ns: -2500000, uncertainty_ns: 1000000}
"""

RETURN = r"""
dest:
  description: The cluster database.
  returned: always
  type: str
  sample: /home/me/straggler/results/cluster.db
inputs:
  description: The input databases, in merge order.
  returned: always
  type: list
  sample: [results/nodes/gpu-node-01.db, results/nodes/gpu-node-02.db]
  elements: str
offsets:
  description: The offsets passed to the merge (node to C({offset_ns, uncertainty_ns})).
  returned: always
  type: dict
  sample: {gpu-node-01: 0, gpu-node-02: -1520000}
hosts_without_offsets:
  description: Hosts of O(offsets_from_hosts) that had no C(straggler_clock) fact.
  returned: always
  type: list
  sample: [gpu-node-04]
  elements: str
nodes:
  description: Node names in the cluster database.
  returned: success, not in check mode
  type: list
  elements: str
  sample: [gpu-node-01, gpu-node-02]
unaligned:
  description: Nodes without clock pairs (their C(ts_aligned) is NULL).
  returned: success, not in check mode
  type: list
  sample: []
  elements: str
offset_unknown:
  description: Nodes with no measured offset (their wall clock is taken as correct).
  returned: success, not in check mode
  type: list
  sample: []
  elements: str
summary:
  description: The core merge's full summary (inputs, renames, rows per table, clock alignment per node, seconds taken).
  returned: success, not in check mode
  type: dict
  sample: {changed: true, nodes: [gpu-node-01, gpu-node-02], rows: 104000}
msg:
  description: One line saying what was merged, and which nodes lack clock data.
  returned: always
  type: str
  sample: 'merged 2 databases (2 nodes) into results/cluster.db'
"""
