# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: straggler.fleet.export is an action plugin (plugins/action/export.py)
# that runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: export
short_description: Export a straggler database as a Perfetto timeline, on the controller
version_added: 0.1.0
description:
  - Writes a database, usually the cluster database from M(straggler.fleet.merge), as a timeline for the Perfetto UI
    (U(https://ui.perfetto.dev), Open trace file) with the core's export, C(straggler export), as Perfetto's native
    protobuf trace (C(.pftrace)), or Chrome Trace Event JSON for tools that need it.
  - One process per node, named after the node and its rank, all nodes on the aligned timeline; calls, off-CPU
    intervals, run-queue waits and block I/O as slices; counters per node and rank; explain's findings as instant
    events.
  - Runs once per play on the controller (like C(run_once)), whatever the play's hosts, and contacts no host.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller.
  - The perfetto Python package on the controller for O(format=perfetto) (C(pip install perfetto)).
options:
  db:
    description:
      - The database to export.
    type: path
    required: true
  dest:
    description:
      - The trace file to write (replaced if it exists). Its directory is created if missing.
    type: path
    required: true
  format:
    description:
      - V(perfetto) writes Perfetto's native protobuf trace; V(json) writes Chrome Trace Event JSON.
      - By default, V(json) when O(dest) ends in C(.json), else V(perfetto).
    type: str
    choices: [perfetto, json]
  since:
    description:
      - Leave out what happened before this time, in seconds from the trace's start (for example V(30)) or as an
        ISO-8601 time (as C(straggler export --since)).
    type: raw
  until:
    description:
      - Leave out what happened after this time, in seconds from the trace's start or as an ISO-8601 time
        (as C(straggler export --until)).
    type: raw
  node:
    description:
      - Export only these nodes.
    type: list
    elements: str
  findings:
    description:
      - Run explain on the database and add its findings to the timeline as instant events.
    type: bool
    default: true
  around_findings:
    description:
      - Keep only what happened within this many seconds either side of each of explain's findings (as
        C(straggler export --around-findings)); the result says how many events were left out.
      - Fails when explain finds nothing with a time to cut around.
    type: float
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - straggler.fleet.attributes
  - straggler.fleet.attributes.controller
attributes:
  check_mode:
    support: full
    details: Reports what it would write; writes nothing.
notes:
  - Privileges - it runs on the controller as the user who runs Ansible and contacts no host; no C(become) needed.
seealso:
  - module: straggler.fleet.merge
  - module: straggler.fleet.explain
"""

EXAMPLES = r"""
- name: A timeline of the whole cluster, in Perfetto's native format
  straggler.fleet.export:
    db: results/cluster.db
    dest: results/trace.pftrace

- name: Ten seconds either side of each finding, as Chrome JSON
  straggler.fleet.export:
    db: results/cluster.db
    dest: results/findings.json
    around_findings: 10

- name: Only two nodes
  straggler.fleet.export:
    db: results/cluster.db
    dest: results/trace-two.json
    node: [gpu-node-01, gpu-node-03]
    since: 30
    until: 90
"""

RETURN = r"""
dest:
  description: The trace file.
  returned: always
  type: str
  sample: /home/me/straggler/results/trace.pftrace
db:
  description: The database exported.
  returned: always
  type: str
  sample: /home/me/straggler/results/cluster.db
format:
  description: The format written (V(perfetto) or V(json)).
  returned: always
  type: str
  sample: perfetto
size:
  description: Size of the trace file in bytes.
  returned: success, not in check mode
  type: int
  sample: 310429
summary:
  description: What the core's export reported (slices, counter samples, findings, nodes, events skipped per reason).
  returned: when the core returns a summary
  type: dict
  sample: {nodes: 4, slices: 52000, counters: 1200, findings: 3}
msg:
  description: One line saying what was written.
  returned: always
  type: str
  sample: 'exported results/cluster.db to results/trace.pftrace (perfetto); open it at https://ui.perfetto.dev'
"""
