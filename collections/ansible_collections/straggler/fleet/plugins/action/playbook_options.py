# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.playbook_options: the first task of each of the collection's
playbooks. It reads the playbook's options as people type them (plugin_utils/extra_vars.py: the
short names on the command line, the prefixed names anywhere, SQL with spaces and '=' whole),
checks them against their types and choices, and says which `-e` variables the playbook does not
read. It must not decide what a playbook does with its options."""

from __future__ import annotations

from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import ControllerAction, plain
from ansible_collections.straggler.fleet.plugins.plugin_utils.extra_vars import (
    RAW_WORDS,
    ExtraVarsError,
    command_line_vars,
    resolve,
    unread,
    unread_message,
)

OPTION_KEYS = ('default', 'type', 'choices')


def option_spec(name, spec):
    """One option of the task's `options` (a default, or a dict of default/type/choices) as an
    argument spec entry."""
    if not hasattr(spec, 'get'):
        spec = dict(default=spec)
    extra = sorted(set(spec) - set(OPTION_KEYS))
    if extra:
        raise AnsibleActionFail('option %s: unknown keys %s (it takes %s)' % (name, ', '.join(extra), ', '.join(OPTION_KEYS)))
    entry = dict(type=spec.get('type', 'raw'))
    if spec.get('choices') is not None:
        entry['choices'] = list(spec['choices'])
    return entry, spec.get('default')


class ActionModule(ControllerAction):

    ARGUMENT_SPEC = dict(
        playbook=dict(type='str', required=True),
        options=dict(type='dict', required=True),
        accept=dict(type='list', elements='str', default=[]),
        report=dict(type='bool', default=True),
    )

    def run_task(self, args, task_vars, result):
        specs, defaults = {}, {}
        for name, spec in args['options'].items():
            specs[name], defaults[name] = option_spec(name, plain(spec))
        try:
            cli_vars = command_line_vars(context.CLIARGS.get('extra_vars', ()), self._loader)
            values, sources = resolve(defaults, cli_vars, task_vars)
        except ExtraVarsError as exc:
            raise AnsibleActionFail(str(exc)) from None
        values = dict((name, plain(value)) for name, value in values.items())
        checked = ArgumentSpecValidator(specs).validate(values)
        if checked.error_messages:
            wrong = [name for name in values if any(name in message for message in checked.error_messages)]
            where = ', '.join('%s from %s' % (name, sources[name]) for name in wrong)
            raise AnsibleActionFail('%s: %s%s' % (args['playbook'], '; '.join(checked.error_messages),
                                                  ' (%s)' % where if where else ''))
        not_read = unread(cli_vars, defaults, args['accept'])
        loose = cli_vars.get(RAW_WORDS)
        if args['report'] and (not_read or loose):
            result.setdefault('warnings', []).append(unread_message(args['playbook'], not_read, defaults, loose))
        result.update(changed=False, options=checked.validated_parameters, sources=sources,
                      not_read=[name for name, dummy in not_read],
                      msg='; '.join('%s=%s (%s)' % (name, checked.validated_parameters[name], sources[name])
                                    for name in defaults if sources[name] != 'default') or 'all defaults')
        return result
