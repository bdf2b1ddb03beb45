# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.merge: the core's straggler.analysis.merge.merge on the
controller, once per play. It expands `src` (files and directories) into the list of input
databases, gathers offsets from clock_facts facts when asked, and tells the core which node each
collected file must hold (a file `<inventory_hostname>.db` of `expect_nodes_from_hosts`: that
host's straggler_agent_node, else its inventory hostname); the merge itself (node renaming, clock
alignment, the checks of untrusted inputs, atomic output) is the core's and must not be redone here."""

from __future__ import annotations

import glob
import os

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    RESULT_FILE_MODE,
    ControllerAction,
    core_error_types,
    hostvar,
    import_core,
    plain,
)


def expand_sources(sources, absent=None):
    """Input database paths from files and directories (a directory: its *.db files, sorted).

    A source that does not exist fails, unless `absent` is a list: then it is appended there
    (check mode, where the task that would have made it did not run)."""
    inputs = []
    for source in sources:
        source = os.path.abspath(os.path.expanduser(source))
        if absent is not None and not os.path.exists(source):
            absent.append(source)
        elif os.path.isdir(source):
            found = sorted(glob.glob(os.path.join(source, '*.db')))
            if not found:
                raise AnsibleActionFail('%s holds no *.db files: collect the hosts\' databases first (straggler.fleet.collect)' % source)
            inputs.extend(found)
        elif os.path.isfile(source):
            inputs.append(source)
        else:
            raise AnsibleActionFail('src %s does not exist: give node databases or a directory of them' % source)
    return inputs


def offsets_from_clock_facts(task_vars, hosts):
    """{inventory_hostname: {offset_ns, uncertainty_ns}} from each host's straggler_clock fact
    (set by straggler.fleet.clock_facts; read from ansible_facts, else from the top-level variable
    that INJECT_FACTS_AS_VARS makes of it); hosts without the fact are left out and listed."""
    offsets = {}
    without = []
    for host in hosts:
        # ansible_facts first: the top-level copy is gone where INJECT_FACTS_AS_VARS is off
        facts = hostvar(task_vars, host, 'ansible_facts') or {}
        fact = facts.get('straggler_clock') if hasattr(facts, 'get') else None
        if not fact:
            fact = hostvar(task_vars, host, 'straggler_clock')
        if fact and hasattr(fact, 'get') and fact.get('offset_ns') is not None:
            offsets[str(host)] = dict(offset_ns=int(fact.get('offset_ns')), uncertainty_ns=int(fact.get('uncertainty_ns') or 0))
        else:
            without.append(str(host))
    return offsets, without


def expected_nodes_of(task_vars, inputs, hosts, given=None):
    """{input path: node it must hold}: an input named `<host>.db` (what straggler.fleet.collect
    writes) of one of `hosts` must hold that host's straggler_agent_node, else its inventory
    hostname; `given` ({path: node}) is added on top. With `hosts`, every input must be one of
    theirs or in `given`: a file no host is known for is refused (its node could not be checked)."""
    by_host = dict((str(host), str(hostvar(task_vars, host, 'straggler_agent_node') or host)) for host in hosts or ())
    expected = {}
    for path in inputs:
        name = os.path.basename(path)
        if name.endswith('.db') and name[:-3] in by_host:
            expected[path] = by_host[name[:-3]]
    for path, node in (given or {}).items():
        expected[os.path.abspath(os.path.expanduser(str(path)))] = str(node)
    unknown = [path for path in inputs if path not in expected and os.path.abspath(path) not in expected]
    if hosts and unknown:
        raise AnsibleActionFail('%s: no host of expect_nodes_from_hosts is known for %s (a collected file is named '
                                '<inventory_hostname>.db), so the node it holds cannot be checked; leave it out of '
                                'src or name its node in expect_nodes' % (', '.join(unknown[:3]) + (
                                    ' and %d more' % (len(unknown) - 3) if len(unknown) > 3 else ''),
                                    'it' if len(unknown) == 1 else 'them'))
    return expected


def rename_argument(value):
    """The core's `rename` from the option: a bool, or a dict {old node: new node}."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ('true', 'yes', 'false', 'no'):
        return value.lower() in ('true', 'yes')
    if hasattr(value, 'items'):
        return dict((str(old), str(new)) for old, new in value.items())
    raise AnsibleActionFail('rename must be true/false or a mapping {old node name: new node name}')


class ActionModule(ControllerAction):

    ARGUMENT_SPEC = dict(
        src=dict(type='list', elements='path', required=True),
        dest=dict(type='path', required=True),
        offsets=dict(type='dict'),
        offsets_from_hosts=dict(type='list', elements='str'),
        rename=dict(type='raw', default=False),
        expect_nodes=dict(type='dict'),
        expect_nodes_from_hosts=dict(type='list', elements='str'),
        deadline=dict(type='float', default=1800.0),
    )

    def run_task(self, args, task_vars, result):
        absent = [] if self._task.check_mode else None
        inputs = expand_sources(args['src'], absent)
        rename = rename_argument(args['rename'])

        offsets = {}
        without_offsets = []
        if args['offsets_from_hosts']:
            offsets, without_offsets = offsets_from_clock_facts(task_vars, args['offsets_from_hosts'])
        if args['offsets']:
            offsets.update(plain(args['offsets']))
        dest = os.path.abspath(os.path.expanduser(args['dest']))
        result.update(dest=dest, inputs=inputs, offsets=offsets, hosts_without_offsets=without_offsets)

        if self._task.check_mode:
            result.update(changed=True, msg='would merge %d databases into %s' % (len(inputs), dest))
            if absent:
                result['msg'] += ' (and the databases in %s, which do not exist yet)' % ', '.join(absent)
            return result
        merge = import_core('analysis.merge')
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            # changed only when the output changed: the core leaves an existing output that holds the
            # same rows as it is
            summary = merge.merge(inputs, dest, offsets=offsets or None, rename=rename, deadline_s=args['deadline'],
                                  expected_nodes=expected_nodes_of(task_vars, inputs, args['expect_nodes_from_hosts'],
                                                                   plain(args['expect_nodes'] or {})),
                                  only_if_changed=True)
        except core_error_types() as exc:
            raise AnsibleActionFail('merge failed: %s' % exc) from None
        summary = plain(summary)
        try:
            os.chmod(dest, RESULT_FILE_MODE)      # what the nodes recorded: for the controller's user only
        except OSError:
            pass
        result.update(changed=summary.get('changed') is not False, summary=summary, nodes=summary.get('nodes', []),
                      unaligned=summary.get('unaligned', []), offset_unknown=summary.get('offset_unknown', []))
        result['msg'] = 'merged %d databases (%d nodes) into %s' % (len(inputs), len(result['nodes']), dest)
        if not result['changed']:
            result['msg'] += ' (unchanged: it already held exactly these rows)'

        if result['unaligned']:
            result['msg'] += '; no clock pairs (ts_aligned NULL): %s' % ', '.join(result['unaligned'])
        if result['offset_unknown']:
            result['msg'] += '; no measured offset (0 assumed): %s' % ', '.join(result['offset_unknown'])
        return result
