# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.fleet_query: the core's fleet client
(straggler.fleet.client.fleet_query) run once on the controller, fanning one SQL out to every
agent over HTTPS with mutual TLS. It translates options into the client's arguments and the
FleetResult into task results; it must not query, time or judge anything itself."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.plugin_utils.agents import agent_argument_spec, agent_nodes, tls_options
from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    ControllerAction,
    core_error_types,
    import_core,
    write_if_changed,
)


def fleet_result_dict(fleet_result, host_of_address=None):
    """Task results from the core's FleetResult.to_dict() (sql, columns, rows, nodes, offsets,
    exit_code, ...), with each node's inventory host and whether it answered (the core's rule,
    NodeStatus.answered), the row count, and the nodes that did not answer (failed_nodes: the
    inventory host where known, else the node's name or its address)."""
    result = fleet_result.to_dict()
    for status, entry in zip(fleet_result.nodes, result['nodes']):
        entry['host'] = (host_of_address or {}).get(entry.get('address'))
        entry['answered'] = bool(status.answered)
    result['rows'] = [list(row) for row in result['rows']]
    result['row_count'] = len(result['rows'])
    result['failed_nodes'] = [entry['host'] or entry.get('node') or entry.get('address')
                              for entry in result['nodes'] if not entry['answered']]
    return result


class ActionModule(ControllerAction):

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
    MUTUALLY_EXCLUSIVE = (('nodes', 'hosts'),)

    def run_task(self, args, task_vars, result):
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
            result['changed'] = write_if_changed(args['dest'], render.to_json(document), check_mode=self._task.check_mode,
                                                 diff=self._diff_list(result))
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
