# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.fleet_query: the core's fleet client
(straggler.fleet.client.fleet_query) run once on the controller, fanning one SQL out to every
agent over HTTPS with mutual TLS. It translates options into the client's arguments and the
FleetResult into task results; it must not query, time or judge anything itself."""

from __future__ import annotations

import dataclasses

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.straggler.fleet.plugins.plugin_utils.agents import agent_argument_spec, agent_nodes, tls_options
from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    core_error_types,
    import_core,
    write_if_changed,
)

ANSWERED = ('ok', 'empty')

ARGUMENT_SPEC = agent_argument_spec(
    sql=dict(type='str', required=True),
    timeout=dict(type='float', default=5.0),
    deadline=dict(type='float', default=15.0),
    limit=dict(type='int', default=10000),
    concurrency=dict(type='int', default=32),
    clock_samples=dict(type='int', default=5),
    dest=dict(type='path'),
    fail_on_partial=dict(type='bool', default=False),
)


def node_status_dict(status, host_of_address=None):
    """A NodeStatus (dataclass or object) as a plain dict, with the inventory host it belongs to."""
    if dataclasses.is_dataclass(status):
        entry = dataclasses.asdict(status)
    elif isinstance(status, dict):
        entry = dict(status)
    else:
        entry = dict((name, value) for name, value in vars(status).items() if not name.startswith('_'))
    if host_of_address is not None:
        entry['host'] = host_of_address.get(entry.get('address'))
    return entry


def fleet_result_dict(fleet_result, host_of_address=None):
    """Task results from a FleetResult: columns, rows, nodes, offsets, failed_nodes, exit_code."""
    nodes = [node_status_dict(status, host_of_address) for status in fleet_result.nodes]
    offsets = {}
    for node, value in (fleet_result.offsets or {}).items():
        if isinstance(value, dict):
            offset_ns, uncertainty_ns = value.get('offset_ns'), value.get('uncertainty_ns')
        else:
            offset_ns, uncertainty_ns = value
        offsets[str(node)] = dict(offset_ns=offset_ns, uncertainty_ns=uncertainty_ns)
    failed = [entry.get('host') or entry.get('node') or entry.get('address') for entry in nodes if entry.get('status') not in ANSWERED]
    rows = [list(row) for row in fleet_result.rows]
    return dict(
        columns=list(fleet_result.columns),
        rows=rows,
        row_count=len(rows),
        nodes=nodes,
        offsets=offsets,
        failed_nodes=failed,
        exit_code=int(getattr(fleet_result, 'exit_code', 0 if not failed else (4 if len(failed) == len(nodes) else 3))),
    )


class ActionModule(ActionBase):

    BYPASS_HOST_LOOP = True
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC,
            mutually_exclusive=[('nodes', 'hosts')],
        )
        for name in ('timeout', 'deadline'):
            if args[name] <= 0:
                raise AnsibleActionFail('%s must be more than 0 seconds' % name)
        if args['limit'] < 1 or args['concurrency'] < 1:
            raise AnsibleActionFail('limit and concurrency must be at least 1')

        nodes, host_of_address = agent_nodes(task_vars, args)
        if not nodes:
            raise AnsibleActionFail('no nodes to query: the play has no hosts; set nodes (host:port, ...)')
        client = import_core('fleet.client')
        try:
            fleet_result = client.fleet_query(
                nodes, args['sql'], tls_options(args), limit=args['limit'], timeout_s=args['timeout'],
                deadline_s=args['deadline'], concurrency=args['concurrency'], clock_samples=args['clock_samples'])
        except core_error_types() as exc:
            raise AnsibleActionFail('fleet query failed: %s' % exc) from None

        result.update(fleet_result_dict(fleet_result, host_of_address))
        result['changed'] = False
        if args['dest']:
            render = import_core('render')
            document = dict(sql=args['sql'], columns=result['columns'], rows=result['rows'], nodes=result['nodes'],
                            offsets=result['offsets'], failed_nodes=result['failed_nodes'])
            result['changed'] = write_if_changed(args['dest'], render.to_json(document), check_mode=self._task.check_mode)
            result['dest'] = args['dest']

        answered = len(result['nodes']) - len(result['failed_nodes'])
        result['msg'] = '%d of %d nodes answered, %d rows' % (answered, len(result['nodes']), result['row_count'])
        if result['failed_nodes']:
            result['msg'] += '; failed: %s' % ', '.join(str(node) for node in result['failed_nodes'])
        if answered == 0:
            result['failed'] = True
            result['msg'] = 'no node answered: ' + result['msg']
        elif result['failed_nodes'] and args['fail_on_partial']:
            result['failed'] = True
            result['msg'] = 'fail_on_partial: ' + result['msg']
        return result
