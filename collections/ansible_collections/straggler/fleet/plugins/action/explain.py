# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.explain: the core's straggler.analysis.explain on the
controller, once per play, on a database (a merged cluster.db) or live on the agents. It writes
the report's own JSON/Markdown/JUnit renderings where asked and fails the task on a straggler
when told to; finding the straggler is the core's job and must not be second-guessed here."""

from __future__ import annotations

import json
import os

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.plugin_utils.agents import agent_argument_spec, agent_nodes, tls_options
from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    ControllerAction,
    core_error_types,
    import_core,
    plain,
    write_if_changed,
)


def explain_options(args):
    """The core's explain options from the task's (unset ones keep the core's defaults)."""
    options = {}
    for name, keyword in (('baseline_fraction', 'baseline_fraction'), ('min_gap', 'min_gap'), ('last', 'recent_s'),
                          ('timeout', 'timeout_s'), ('since', 'since'), ('until', 'until')):
        if args.get(name) not in (None, ''):
            options[keyword] = args[name]
    return options


class ActionModule(ControllerAction):

    ARGUMENT_SPEC = agent_argument_spec(
        db=dict(type='path'),
        timeout=dict(type='float'),
        deadline=dict(type='float'),
        baseline_fraction=dict(type='float'),
        last=dict(type='float'),
        min_gap=dict(type='float'),
        since=dict(type='raw'),
        until=dict(type='raw'),
        fail_on_straggler=dict(type='bool', default=False),
        junit=dict(type='path'),
        markdown=dict(type='path'),
        dest=dict(type='path'),
    )
    MUTUALLY_EXCLUSIVE = (('db', 'nodes', 'hosts'),)

    def _run_explain(self, args, task_vars):
        explain = import_core('analysis.explain')
        options = explain_options(args)
        if args['db']:
            db = os.path.abspath(os.path.expanduser(args['db']))
            if not os.path.isfile(db):
                raise AnsibleActionFail('%s: no such database; collect and merge first, or give nodes' % db)
            return explain.explain_db(db, **options)
        nodes, dummy = agent_nodes(task_vars, args)
        if not nodes:
            raise AnsibleActionFail('no nodes to explain: give db, nodes or hosts')
        if args['deadline'] is not None:
            options['deadline_s'] = args['deadline']
        return explain.explain_fleet(nodes, tls_options(args), **options)

    def run_task(self, args, task_vars, result):
        if args['last'] is not None and args['last'] <= 0:
            raise AnsibleActionFail('last must be > 0 seconds')
        if self._task.check_mode and args['db'] and not os.path.exists(os.path.expanduser(args['db'])):
            result.update(skipped=True, changed=False,
                          msg='check mode: %s does not exist yet (the tasks that make it did not run)' % args['db'])
            return result
        try:
            report = self._run_explain(args, task_vars)
        except core_error_types() as exc:
            raise AnsibleActionFail('explain failed: %s' % exc) from None

        report_dict = plain(json.loads(json.dumps(report.to_dict(), default=str)))
        explain = import_core('analysis.explain')
        top = explain.top_cause(report, report.straggler) if report.straggler else None  # the core's choice
        cause = plain(json.loads(json.dumps(top.to_dict(), default=str))) if top is not None else None
        render_report = import_core('render.report')
        outputs = []
        for name, render in (('dest', lambda: json.dumps(report_dict, indent=2) + '\n'),
                             ('markdown', lambda: render_report.to_markdown(report)),
                             ('junit', lambda: render_report.to_junit(report))):
            if args[name]:
                if write_if_changed(args[name], render(), check_mode=self._task.check_mode,
                                    diff=self._diff_list(result)):
                    outputs.append(args[name])
        result.update(
            changed=bool(outputs),
            written=outputs,
            report=report_dict,
            straggler=report_dict.get('straggler'),
            findings=report_dict.get('findings', []),
            missing=report_dict.get('missing', []),
            cause=cause,
            msg=render_report.report_verdict(report),
        )
        if args['fail_on_straggler'] and result['straggler']:
            result['failed'] = True
        return result
