# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: straggler.fleet.playbook_options is an action plugin (plugins/action/playbook_options.py)
# that runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: playbook_options
short_description: Read a playbook's options as people type them on the command line
version_added: 0.1.0
description:
  - The first task of each of the collection's playbooks. Returns the value of each of the playbook's O(options),
    from, in this order, the command line's C(-e straggler_NAME=VALUE), its short C(-e NAME=VALUE) (for
    C(sql), C(target), C(transport) and C(out) only), the variable C(straggler_NAME) from anywhere else (inventory,
    play), else the option's default.
  - "Reads the command line's C(-e) arguments as Ansible's CLI received them, so that C(-e sql=\"SELECT node, count(*)
    AS n FROM events WHERE rank = 1\") gives the whole SQL: Ansible itself splits a C(key=value) argument at spaces
    and makes every word holding C(=) a variable of its own. C(-e sql=REST) takes all of REST; C(-e NAME=REST) takes all
    of REST where Ansible's split would leave loose words; C(@FILE) and inline YAML/JSON are read as Ansible reads them."
  - Short names are read from the command line only; in an inventory only the prefixed names count, so a group
    variable called C(target) or C(out) that means something else there changes nothing.
  - Checks each value against the option's C(type) and C(choices) and fails with one line naming the option and where
    its value came from.
  - Warns, in one line, about every variable given with C(-e) that the playbook does not read (with the nearest
    name it does read), and about loose words; variables of the collection's other playbooks and roles
    (C(straggler_agent_*), C(straggler_pki_*)) and Ansible's, AWX's and ansible-runner's own are not reported.
  - Runs once per play on the controller and changes nothing.
author:
  - The straggler project (!UNKNOWN)
options:
  playbook:
    description:
      - The playbook's name, for messages.
    type: str
    required: true
  options:
    description:
      - The playbook's options, by name without the C(straggler_) prefix, each a default value or a dict with
        C(default), C(type) (as in an argument spec; default C(raw)) and C(choices).
    type: dict
    required: true
  accept:
    description:
      - More variable names the playbook passes on (a trailing C(*) matches a prefix); not reported when given.
    type: list
    elements: str
    default: []
  report:
    description:
      - Warn about the C(-e) variables the playbook does not read. Off for a play whose playbook reports them in
        another play.
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
    details: Reads and checks; changes nothing.
notes:
  - Privileges - it runs on the controller as the user who runs Ansible and contacts no host; no C(become) needed.
seealso:
  - module: straggler.fleet.fleet_query
"""

EXAMPLES = r"""
- name: Read the options (ansible-playbook this.yml -e sql="SELECT node, count(*) AS n FROM events GROUP BY node")
  straggler.fleet.playbook_options:
    playbook: this.yml
    options:
      sql: SELECT count(*) AS events FROM events
      transport: {default: ssh, choices: [ssh, https]}
      limit: {default: 10000, type: int}
  register: __options

- name: Use them
  ansible.builtin.debug:
    msg: "{{ __options.options.sql }} over {{ __options.options.transport }}"
"""

RETURN = r"""
options:
  description: The value of each option, converted to its type.
  returned: success
  type: dict
  sample: {sql: 'SELECT node, count(*) AS n FROM events GROUP BY node', transport: ssh, limit: 10000}
sources:
  description: Where each option's value came from (C(-e NAME), C(straggler_NAME) or C(default)).
  returned: success
  type: dict
  sample: {sql: -e sql, transport: default, limit: default}
not_read:
  description: The variables given with C(-e) that the playbook does not read (also in the task's warning).
  returned: success
  type: list
  elements: str
  sample: [sqll]
msg:
  description: One line with the options that are not at their defaults and where each came from.
  returned: success
  type: str
  sample: 'sql=SELECT node, count(*) AS n FROM events GROUP BY node (-e sql)'
"""
