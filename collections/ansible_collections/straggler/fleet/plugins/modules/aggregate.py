# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: straggler.fleet.aggregate is an action plugin (plugins/action/aggregate.py)
# that runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: aggregate
short_description: Combine every host's query result into one table, unreachable and failed hosts included
version_added: 0.1.0
description:
  - Gathers the result a previous M(straggler.fleet.query) task registered on each host of the play
    (O(results)) into one table with a C(node) column, and a status per host.
  - Covers every host of the play, including those that failed or were unreachable (C(ansible_play_hosts_all));
    they appear in RV(hosts) with their status and message and in RV(missing), and contribute no rows.
    Unreachable hosts never make this task fail.
  - Works under C(serial) - in each batch the table holds the hosts that have run so far, and the hosts of later
    batches are RV(pending), not missing; the last batch's table holds them all.
  - Runs once per play on the controller, whatever the play's hosts (like C(run_once)), and contacts no host.
  - Writes the table to O(dest) as JSON, CSV or Markdown when asked; the file is rewritten only when its
    content changes, and then the task reports a change.
  - The table is combined by the same rule as M(straggler.fleet.fleet_query) (the core's C(straggler.fleet.combine)),
    so the same SQL gives the same table over either path. Its columns are C(node) (unless the query selected one)
    and the union of the hosts' columns in first-seen order; a host whose columns differ keeps its rows, with
    null for the columns it lacks, and its RV(hosts[].message) says how (C(columns differ) and which).
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller.
options:
  results:
    description:
      - Name of the variable each host registered from M(straggler.fleet.query).
    type: str
    default: straggler_query
  hosts:
    description:
      - Inventory hostnames to gather from, in the order their rows appear.
      - Defaults to every host of the play (C(ansible_play_hosts_all)). Set it when aggregating from a
        different play, for example C("{{ groups['gpu'] }}") in a play on localhost.
    type: list
    elements: str
  dest:
    description:
      - File on the controller to write the table to (parent directories are created).
    type: path
  format:
    description:
      - Format of O(dest). C(json) writes RV(columns), RV(rows), RV(hosts) and RV(missing); C(csv) the table;
        C(markdown) the table, the per-host status and the missing hosts.
      - Defaults to the extension of O(dest) (C(.csv), C(.md)), else C(json).
    type: str
    choices: [json, csv, markdown]
  check_nodes:
    description:
      - A host answers only for itself, by the same rule as M(straggler.fleet.fleet_query) over HTTPS. The node its
        agent records must be the one the inventory says it is (the host's C(straggler_agent_node), by default its
        inventory hostname), every value of a C(node) column it returns must be that name, and two hosts that name one
        node are both refused. A refused host has status C(wrong-node), no rows, and a message saying why.
      - Set V(false) only where agents record other names than the inventory says (started by hand with their own
        C(--node)); a C(node) column of another node and two hosts naming one node are still refused.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - straggler.fleet.attributes
  - straggler.fleet.attributes.controller
attributes:
  check_mode:
    support: full
    details: Builds the table; reports whether O(dest) would change without writing it.
  diff_mode:
    support: full
    details: Shows how O(dest) changes (its text) with C(--diff).
  platform:
    platforms: all
notes:
  - Privileges - it runs on the controller as the user who runs Ansible and contacts no host; no C(become) needed.
  - "Host statuses: C(ok) (rows), C(empty) (answered with no rows), C(failed), C(unreachable), C(skipped),
    C(missing) (no registered result: the host left the play earlier, or the task did not run on it),
    C(pending) (under C(serial): the host is in a later batch and has not run yet; the aggregate of the last batch
    holds every batch's rows), C(invalid) (the variable is not a query result), C(wrong-node) (it answered as
    another node, or for another: see O(check_nodes))."
seealso:
  - module: straggler.fleet.query
  - module: straggler.fleet.fleet_query
"""

EXAMPLES = r"""
- name: The same SQL on every GPU host
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Count events
      straggler.fleet.query:
        sql: SELECT count(*) AS events FROM events
      register: straggler_query
      ignore_unreachable: true
      ignore_errors: true

    - name: One table, with the hosts that did not answer
      straggler.fleet.aggregate:
        results: straggler_query
        dest: results/events.json
      register: straggler_table

- name: Aggregate from a later play on the controller
  hosts: localhost
  gather_facts: false
  tasks:
    - name: One Markdown table for the GPU hosts
      straggler.fleet.aggregate:
        hosts: "{{ groups['gpu'] }}"
        dest: results/events.md
"""

RETURN = r"""
columns:
  description: Column names; C(node) first unless the query selected a C(node) column itself, then the union of
    the hosts' columns in first-seen order.
  returned: success
  type: list
  elements: str
  sample: [node, events]
rows:
  description: Every answering host's rows, in host order, each a list in the order of RV(columns) (null where
    the host lacks a column).
  returned: success
  type: list
  elements: list
  sample: [[gpu-node-01, 52000], [gpu-node-02, 51874]]
row_count:
  description: Number of rows in RV(rows).
  returned: success
  type: int
  sample: 2
hosts:
  description: One status per host, in host order.
  returned: success
  type: list
  elements: dict
  contains:
    host:
      description: Inventory hostname.
      type: str
      sample: gpu-node-01
    node:
      description: The node name the agent reported (the inventory hostname when there was no answer).
      type: str
      sample: gpu-node-01
    status:
      description: One of C(ok), C(empty), C(failed), C(unreachable), C(skipped), C(missing), C(pending), C(invalid).
      type: str
      sample: ok
    answered:
      description: Whether the host answered (RV(hosts[].status) C(ok) or C(empty), the rule of the core's fleet client).
      type: bool
      sample: true
    message:
      description: Why the host has no rows (the task's own message, as one line), empty when it answered.
      type: str
      sample: ''
    row_count:
      description: Rows the host returned.
      type: int
      sample: 1
    truncated:
      description: Whether the host had more rows than the query's limit.
      type: bool
      sample: false
    elapsed_ms:
      description: Milliseconds the query took on the host.
      type: float
      sample: 1.2
  sample:
    - {host: gpu-node-01, node: gpu-node-01, status: ok, answered: true, message: '', row_count: 1, truncated: false,
       elapsed_ms: 1.2}
    - {host: gpu-node-05, node: gpu-node-05, status: unreachable, answered: false,
       message: 'Failed to connect to the host via ssh', row_count: 0, truncated: false, elapsed_ms: null}
missing:
  description: Hosts whose rows are not in the table (those that did not answer, RV(hosts[].answered) false), except
    the RV(pending) ones.
  returned: success
  type: list
  elements: str
  sample: [gpu-node-05]
pending:
  description: Under C(serial), the hosts of later batches, which have not run yet (empty without C(serial)).
  returned: success
  type: list
  elements: str
  sample: [gpu-node-07, gpu-node-08]
dest:
  description: The file written, when O(dest) was given.
  returned: when O(dest) is set
  type: str
  sample: results/events.json
format:
  description: The format O(dest) was written in.
  returned: when O(dest) is set
  type: str
  sample: json
msg:
  description: One line saying how many hosts answered and which are missing.
  returned: always
  type: str
  sample: '4 of 5 hosts answered, 4 rows; missing: gpu-node-05'
"""
