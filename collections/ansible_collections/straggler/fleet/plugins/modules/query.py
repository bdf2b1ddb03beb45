#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module straggler.fleet.query: one read-only SQL against the host's straggler database,
through the agent's own CLI (`straggler query --json`). It must not open the database itself
nor judge the SQL: the agent enforces read-only access, and this module reports its answer."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: query
short_description: Run one read-only SQL query against a host's straggler database
version_added: 0.1.0
description:
  - Runs O(sql) against the straggler agent's SQLite database on the managed host and returns the
    columns and rows.
  - The query runs through the agent's own command line (C(straggler query --json)), which opens the
    database read-only and rejects any statement that would write, attach or change settings. This
    module never opens the database itself, so the host's Python needs nothing but the standard library.
  - Run it on a group (C(hosts=gpu)) to run the same SQL on every host in parallel (over forks);
    then M(straggler.fleet.aggregate) combines the per-host results into one table. This path needs
    nothing but Ansible's own connection; M(straggler.fleet.fleet_query) is the faster path over the
    agents' HTTPS API.
  - The query is read-only, so it runs in check mode too, and never reports a change.
author:
  - The straggler project (!UNKNOWN)
options:
  sql:
    description:
      - The SQL to run. One statement; read-only (SELECT, WITH, read-only PRAGMA).
      - The tables and views are described by the straggler schema (C(events), C(aggregates),
        C(clock_pairs), C(processes), C(lost_events), C(agent_cost), C(probes), views C(calls),
        C(offcpu), C(block_io)). Times are nanoseconds.
    type: str
    required: true
  db:
    description:
      - Path of the agent's database on the host.
      - Unset, the host's C(straggler_agent_db) (the variable the role that installs the agent uses), else
        the default below; so an ad hoc command reads the same database as the playbooks.
    type: path
    default: /var/lib/straggler/straggler.db
  limit:
    description:
      - The most rows to return. RV(truncated) says whether more rows were there.
      - The same default as M(straggler.fleet.fleet_query)'s O(straggler.fleet.fleet_query#module:limit), so that the same
        SQL gives the same table over either path.
    type: int
    default: 10000
  timeout:
    description:
      - Seconds the query may run before the agent interrupts it.
    type: float
    default: 10
  straggler_bin:
    description:
      - Path of the agent's C(straggler) executable on the host.
      - Unset, C(bin/straggler) in the host's C(straggler_agent_venv) (the role's install path variable), else the
        agent's default install path C(/opt/straggler/venv/bin/straggler); if that is missing, a C(straggler) beside
        the Python running the module, then one on E(PATH).
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The query is read-only and runs in check mode as well.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - "Privileges - the agent's database is root's: run the task as root with C(become) (C(-b) ad hoc, C(become: true)
    in a play); without it the task fails saying so."
  - A rejected query (a write, an C(ATTACH), a syntax error, a timeout) fails the task with the agent's
    one-line reason as the task's message.
  - Rows are lists in the order of RV(columns). Integers stay integers (nanosecond timestamps included).
seealso:
  - module: straggler.fleet.aggregate
  - module: straggler.fleet.fleet_query
"""

EXAMPLES = r"""
- name: Count the events every host recorded
  straggler.fleet.query:
    sql: SELECT count(*) AS events FROM events
  register: straggler_query

- name: Slowest NCCL all-reduce per rank on every host
  straggler.fleet.query:
    sql: >-
      SELECT rank, max(duration) / 1e6 AS max_ms, count(*) AS calls
      FROM calls WHERE op = 'ncclAllReduce' GROUP BY rank
    limit: 100
  register: straggler_query

- name: Combine the per-host results into one table, unreachable hosts included
  straggler.fleet.aggregate:
    results: straggler_query
    dest: results/allreduce.md
    format: markdown

# Ad hoc, the same SQL on every host of the group, as root (the agent's database is root's); the host's
# straggler_agent_db and straggler_agent_venv apply as in the playbooks:
#   ansible gpu -b -m straggler.fleet.query -a "sql='SELECT count(*) FROM events'"
"""

RETURN = r"""
columns:
  description: Column names of the result, in order.
  returned: success
  type: list
  elements: str
  sample: [rank, max_ms, calls]
rows:
  description: The rows, each a list of values in the order of RV(columns).
  returned: success
  type: list
  elements: list
  sample: [[0, 12.5, 400], [1, 81.0, 400]]
row_count:
  description: Number of rows returned (at most O(limit)).
  returned: success
  type: int
  sample: 2
node:
  description: The node name the agent records in this database (its C(--node), by default the inventory hostname).
  returned: success
  type: str
  sample: gpu-node-01
truncated:
  description: Whether the query had more rows than O(limit).
  returned: success
  type: bool
  sample: false
elapsed_ms:
  description: Milliseconds the query took on the host.
  returned: success
  type: float
  sample: 3.2
db:
  description: The database the query ran against.
  returned: always
  type: str
  sample: /var/lib/straggler/straggler.db
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.straggler.fleet.plugins.module_utils.agent_cli import (
    DEFAULT_DB,
    AgentCliError,
    find_straggler_bin,
    parse_json_output,
    privilege_problem,
    run_agent_cli,
)


def build_query_arguments(db, sql, limit, timeout):
    """The agent CLI's arguments for one query (`--` keeps SQL starting with '-' a positional)."""
    return ['query', '--db', db, '--json', '--limit', limit, '--timeout', timeout, '--', sql]


def query_result(answer, db):
    """Translate the CLI's JSON answer into the module's return values."""
    columns = list(answer.get('columns') or [])
    rows = [list(row) for row in (answer.get('rows') or [])]
    return dict(
        changed=False,
        db=db,
        node=answer.get('node'),
        columns=columns,
        rows=rows,
        row_count=len(rows),
        truncated=bool(answer.get('truncated', False)),
        elapsed_ms=answer.get('elapsed_ms'),
    )


def run_query(module):
    params = module.params
    if params['limit'] < 1:
        module.fail_json(msg='limit must be at least 1', db=params['db'])
    if params['timeout'] <= 0:
        module.fail_json(msg='timeout must be more than 0 seconds', db=params['db'])
    problem = privilege_problem(params['db'])
    if problem:
        raise AgentCliError(problem)
    if not os.path.exists(params['db']):
        raise AgentCliError('no database at %s on this host: is the agent tracing here (playbooks/trace.yml)? Set the '
                            'task\'s db option, or the host\'s straggler_agent_db' % params['db'])
    straggler_bin = find_straggler_bin(module, params['straggler_bin'])
    stdout, dummy = run_agent_cli(module, straggler_bin,
                                  build_query_arguments(params['db'], params['sql'], params['limit'], params['timeout']))
    return query_result(parse_json_output(stdout, 'straggler query --json'), params['db'])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sql=dict(type='str', required=True),
            db=dict(type='path', default=DEFAULT_DB),
            limit=dict(type='int', default=10000),
            timeout=dict(type='float', default=10.0),
            straggler_bin=dict(type='path'),
        ),
        supports_check_mode=True,
    )
    try:
        result = run_query(module)
    except AgentCliError as exc:
        module.fail_json(msg=str(exc), db=module.params['db'], rc=exc.rc, stderr=exc.stderr)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
