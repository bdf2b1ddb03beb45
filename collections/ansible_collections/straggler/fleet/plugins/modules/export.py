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
  - Writes a database, usually the cluster database from M(straggler.fleet.merge), as a Chrome Trace Event JSON file that
    the Perfetto UI (U(https://ui.perfetto.dev)) and C(chrome://tracing) open, with the core's export
    (C(straggler export --format perfetto)); one process per node, all nodes on the aligned timeline.
  - Runs once per play on the controller (like C(run_once)), whatever the play's hosts, and contacts no host.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller.
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
      - The output format.
    type: str
    default: perfetto
    choices: [perfetto]
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
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: full
  check_mode:
    support: full
    details: Reports what it would write; writes nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: straggler.fleet.merge
  - module: straggler.fleet.explain
"""

EXAMPLES = r"""
- name: A timeline of the whole cluster
  straggler.fleet.export:
    db: results/cluster.db
    dest: results/trace.json

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
  sample: /home/me/straggler/results/trace.json
db:
  description: The database exported.
  returned: always
  type: str
format:
  description: The format written.
  returned: always
  type: str
  sample: perfetto
size:
  description: Size of the trace file in bytes.
  returned: success, not in check mode
  type: int
summary:
  description: What the core's export reported (events written per kind, nodes), when it reports anything.
  returned: when the core returns a summary
  type: dict
msg:
  description: One line saying what was written.
  returned: always
  type: str
"""
