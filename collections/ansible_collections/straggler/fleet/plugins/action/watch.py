# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.watch: the core's live watch (straggler.analysis.watch.watch,
what `straggler watch` runs) on the controller, once per play, for a bounded time. It translates
options into the watch's arguments and its events into task results; polling the agents and
naming the straggler are the core's job and must not be second-guessed here."""

from __future__ import annotations

import json

from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display

from ansible_collections.straggler.fleet.plugins.plugin_utils.agents import agent_argument_spec, agent_nodes, tls_options
from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    ControllerAction,
    core_error_types,
    import_core,
    plain,
    write_if_changed,
)

display = Display()


# task option -> the watch's keyword argument (unset ones keep the core's defaults)
WATCH_OPTIONS = (('interval', 'interval_s'), ('window', 'window_s'), ('baseline', 'baseline_s'), ('min_gap', 'min_gap'))
FINDING_EVENTS = ('onset', 'cause-change')


def watch_options(args):
    """The core's watch keyword arguments from the task's."""
    options = dict((keyword, args[name]) for name, keyword in WATCH_OPTIONS if args.get(name) is not None)
    options['timeout_s'] = args['duration']
    options['until_straggler'] = bool(args['fail_on_straggler'])
    return options


def summarize(events):
    """(straggler, finding, lost) from the watch's events: the straggler named when the watch ended
    (its latest onset or cause-change event), and the nodes not answering then."""
    end = next((event for event in reversed(events) if event.get('event') == 'end'), {})
    straggler = end.get('straggler')
    finding = None
    if straggler:
        finding = next((event for event in reversed(events)
                        if event.get('event') in FINDING_EVENTS and event.get('node') == straggler), None)
    lost = []
    for event in events:
        if event.get('event') == 'lost' and event.get('node') not in lost:
            lost.append(event.get('node'))
        elif event.get('event') == 'back' and event.get('node') in lost:
            lost.remove(event.get('node'))
    return straggler, finding, lost


def watch_message(straggler, finding, lost, duration):
    """One line: the core's verdict line for the straggler and its cause (or that none was named), and
    who did not answer."""
    tail = ('; not answering: %s' % ', '.join(lost)) if lost else ''
    finding = finding or {}
    line = import_core('render.report').verdict_line(
        straggler, finding.get('cause'), finding.get('share'), finding.get('summary'), finding.get('rank'),
        none='no straggler named in %g s of watching' % duration)
    return line + tail


class ActionModule(ControllerAction):

    ARGUMENT_SPEC = agent_argument_spec(
        duration=dict(type='float', required=True),
        interval=dict(type='float'),
        window=dict(type='float'),
        baseline=dict(type='float'),
        min_gap=dict(type='float'),
        fail_on_straggler=dict(type='bool', default=True),
        dest=dict(type='path'),
    )
    MUTUALLY_EXCLUSIVE = (('nodes', 'hosts'),)

    def run_task(self, args, task_vars, result):
        if args['duration'] <= 0:
            raise AnsibleActionFail('duration must be > 0 seconds')
        if self._task.check_mode:
            result.update(skipped=True, changed=False,
                          msg='check mode: not watching (a watch takes duration seconds and only reads the agents)')
            return result
        nodes, dummy = agent_nodes(task_vars, args)
        if not nodes:
            raise AnsibleActionFail('no nodes to watch: give nodes or hosts')

        watch = import_core('analysis.watch')
        format_event = import_core('render.events').format_event
        try:
            code, events = watch.watch(nodes, tls_options(args),
                                       on_event=lambda event: display.v(format_event(event)),
                                       **watch_options(args))
        except core_error_types() as exc:
            raise AnsibleActionFail('watch failed: %s' % exc) from None

        events = plain(json.loads(json.dumps(events, default=str)))
        written = []
        if args['dest']:
            text = ''.join(json.dumps(event, sort_keys=True) + '\n' for event in events)
            if write_if_changed(args['dest'], text):
                written.append(args['dest'])
        straggler, finding, lost = summarize(events)
        end = next((event for event in reversed(events) if event.get('event') == 'end'), {})
        result.update(
            time_lost=end.get('window'),
            changed=bool(written),
            written=written,
            straggler=straggler,
            finding=finding,
            events=events,
            lost=lost,
            msg=watch_message(straggler, finding, lost, args['duration']),
        )
        if code == watch.EXIT_NO_AGENT:
            result.update(failed=True, msg='no agent answered during the watch (%s): check the addresses, the agents '
                                           '(straggler status on each) and the certificates' % ', '.join(nodes))
        elif args['fail_on_straggler'] and straggler:
            result['failed'] = True
        return result
