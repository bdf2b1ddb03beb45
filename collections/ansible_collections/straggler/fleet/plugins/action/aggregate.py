# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.aggregate: gathers every host's registered
straggler.fleet.query result into one table with a per-host status, on the controller, once per
play. The fan-in rules live in plugin_utils/aggregation.py; rendering comes from the core
(straggler.render). It must not contact the hosts."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.plugin_utils.aggregation import (
    HOST_STATUS_COLUMNS,
    aggregate,
    host_status_rows,
)
from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    ControllerAction,
    SUPPORTED_FORMATS,
    guess_format,
    hostvar,
    import_core,
    plain,
    play_hosts,
    write_if_changed,
)


def render_aggregate(table, output_format, render):
    """The text written to `dest` for one aggregated table; `render` is straggler.render, whose
    escaping rules (to_csv, to_markdown's cells, md_text) every value the hosts sent goes through."""
    if output_format == 'csv':
        return render.to_csv(table['columns'], table['rows'])
    if output_format == 'markdown':
        text = render.to_markdown(table['columns'], table['rows'])
        text += '\n' + render.to_markdown(HOST_STATUS_COLUMNS, host_status_rows(table['hosts']))
        if table['missing']:
            text += '\nMissing hosts: %s\n' % ', '.join(render.md_text(host) for host in table['missing'])
        return text
    return render.to_json(dict(columns=table['columns'], rows=table['rows'], hosts=table['hosts'], missing=table['missing']))


class ActionModule(ControllerAction):

    ARGUMENT_SPEC = dict(
        results=dict(type='str', default='straggler_query'),
        hosts=dict(type='list', elements='str'),
        dest=dict(type='path'),
        format=dict(type='str', choices=list(SUPPORTED_FORMATS)),
        check_nodes=dict(type='bool', default=True),
    )

    def run_task(self, args, task_vars, result):
        hosts = play_hosts(task_vars, args['hosts'])
        if not hosts:
            raise AnsibleActionFail('no hosts to aggregate: the play has none; set hosts')
        active = task_vars.get('ansible_play_hosts')
        active_hosts = set(str(host) for host in active) if active is not None and not args['hosts'] else None
        # under `serial`, the hosts of later batches have not run yet: pending, not missing
        batch = task_vars.get('ansible_play_batch')
        batch_hosts = set(str(host) for host in batch) if batch is not None and active_hosts is not None else None
        if batch_hosts is not None and active_hosts <= batch_hosts:
            batch_hosts = None
        registered = dict((host, plain(hostvar(task_vars, host, args['results']))) for host in hosts)
        expected = None
        if args['check_nodes']:
            expected = dict((host, str(hostvar(task_vars, host, 'straggler_agent_node') or host)) for host in hosts)
        table = aggregate(hosts, registered, active_hosts, batch_hosts, expected_nodes=expected)

        result.update(table)
        result['changed'] = False
        if args['dest']:
            output_format = guess_format(args['dest'], args['format'])
            text = render_aggregate(table, output_format, import_core('render'))
            result['changed'] = write_if_changed(args['dest'], text, check_mode=self._task.check_mode,
                                                 diff=self._diff_list(result))
            result['dest'] = args['dest']
            result['format'] = output_format
        asked = len(hosts) - len(table['pending'])
        answered = asked - len(table['missing'])
        result['msg'] = '%d of %d hosts answered, %d rows' % (answered, asked, table['row_count'])
        if table['missing']:
            result['msg'] += '; missing: %s' % ', '.join(table['missing'])
        if table['pending']:
            result['msg'] += '; %d in later batches (serial): %s' % (len(table['pending']), ', '.join(table['pending']))
        return result
