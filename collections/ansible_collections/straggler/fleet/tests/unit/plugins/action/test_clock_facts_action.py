# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""clock_facts (action): round trips timed on the controller, the offset from the core's
estimate_offset, the shortest round trip deciding the uncertainty."""

from __future__ import annotations

import pytest

from ansible_collections.straggler.fleet.plugins.action import clock_facts as action_module
from ansible_collections.straggler.fleet.plugins.action.clock_facts import (
    ActionModule,
    connection_method,
    parse_probe_output,
)

HOST_AHEAD_NS = 1_500_000_000  # the simulated host's wall clock is 1.5 s ahead of the controller's
MS = 1_000_000


class SimulatedHost:
    """A controller clock that only moves when the simulated network and host take time."""

    def __init__(self, probe_delays, date_output=None):
        self.now = 1_700_000_000_000_000_000
        self.probe_delays = list(probe_delays)  # (out_ns, back_ns) per raw command
        self.date_output = date_output
        self.module_runs = 0
        self.commands = []

    def time_ns(self):
        return self.now

    def execute_module(self, module_name, module_args, task_vars):
        assert module_name == 'straggler.fleet.clock_facts'
        self.module_runs += 1
        self.now += 60 * MS
        real_ns = self.now + HOST_AHEAD_NS
        self.now += 40 * MS
        return dict(changed=False, mono_ns=123_456_789, real_ns=real_ns, pair_uncertainty_ns=80,
                    ansible_facts=dict(discovered_interpreter_python='/usr/bin/python3'))

    def low_level(self, command, sudoable=True):
        self.commands.append((command, sudoable))
        out_ns, back_ns = self.probe_delays.pop(0) if self.probe_delays else (5 * MS, 5 * MS)
        self.now += out_ns
        stdout = self.date_output if self.date_output is not None else '%d\n' % (self.now + HOST_AHEAD_NS)
        self.now += back_ns
        return dict(rc=0, stdout=stdout, stderr='')


def run_action(action_factory, monkeypatch, host, args=None):
    action = action_factory(ActionModule, args or {})
    action._connection.transport = 'ssh'
    monkeypatch.setattr(action_module.time, 'time_ns', host.time_ns)
    monkeypatch.setattr(action, '_execute_module', host.execute_module)
    monkeypatch.setattr(action, '_low_level_execute_command', host.low_level)
    monkeypatch.setattr(action, '_remove_tmp_path', lambda path: None)
    return action.run(task_vars={})


def test_offset_comes_from_the_shortest_round_trip(action_factory, monkeypatch):
    # four raw probes: the third is the fastest (1 ms out, 1 ms back) and asymmetric ones are slower
    host = SimulatedHost([(10 * MS, 2 * MS), (3 * MS, 9 * MS), (1 * MS, 1 * MS), (4 * MS, 4 * MS)])
    result = run_action(action_factory, monkeypatch, host, dict(samples=5))
    fact = result['ansible_facts']['straggler_clock']
    assert fact['offset_ns'] == HOST_AHEAD_NS
    assert fact['uncertainty_ns'] == 1 * MS and fact['rtt_ns'] == 2 * MS
    assert fact['samples'] == 5 and host.module_runs == 1
    assert fact['probe'] == 'command' and fact['method'] == 'ssh'
    assert (fact['mono_ns'], fact['real_ns']) == (123_456_789, result['real_ns'])
    assert result['ansible_facts']['discovered_interpreter_python'] == '/usr/bin/python3'
    assert result['changed'] is False
    assert host.commands == [('date +%s%N', False)] * 4


def test_true_offset_lies_within_the_reported_uncertainty(action_factory, monkeypatch):
    host = SimulatedHost([(7 * MS, 1 * MS), (2 * MS, 6 * MS)])
    fact = run_action(action_factory, monkeypatch, host, dict(samples=3))['ansible_facts']['straggler_clock']
    assert fact['offset_ns'] != HOST_AHEAD_NS  # asymmetric round trips: the estimate is off ...
    assert abs(fact['offset_ns'] - HOST_AHEAD_NS) <= fact['uncertainty_ns']  # ... but never by more than it says


def test_without_nanosecond_date_the_module_is_timed_instead(action_factory, monkeypatch):
    host = SimulatedHost([], date_output='1700000000N\n')
    fact = run_action(action_factory, monkeypatch, host, dict(samples=4))['ansible_facts']['straggler_clock']
    assert fact['probe'] == 'module'
    assert host.module_runs == 4 and fact['samples'] == 4
    assert fact['offset_ns'] == HOST_AHEAD_NS + 10 * MS  # module runs: 60 ms there, 40 ms back
    assert fact['uncertainty_ns'] == 50 * MS


def test_one_sample_is_the_module_run(action_factory, monkeypatch):
    host = SimulatedHost([])
    fact = run_action(action_factory, monkeypatch, host, dict(samples=1))['ansible_facts']['straggler_clock']
    assert fact['samples'] == 1 and fact['probe'] == 'module' and host.commands == []
    assert fact['uncertainty_ns'] == 50 * MS


def test_an_unreachable_host_is_passed_through(action_factory, monkeypatch):
    host = SimulatedHost([])
    host.execute_module = lambda **kwargs: dict(unreachable=True, msg='Failed to connect')
    result = run_action(action_factory, monkeypatch, host)
    assert result['unreachable'] is True and 'ansible_facts' not in result


def test_samples_below_one_are_refused(action_factory, monkeypatch):
    from ansible.errors import AnsibleActionFail
    with pytest.raises(AnsibleActionFail, match='at least 1'):
        run_action(action_factory, monkeypatch, SimulatedHost([]), dict(samples=0))


@pytest.mark.parametrize('output, expected', [
    ('1732870000123456789\n', 1732870000123456789),
    ('1732870000N', None),
    ('1732870000%N', None),
    ('', None),
])
def test_date_output_is_parsed_only_with_nanoseconds(output, expected):
    assert parse_probe_output(output) == expected


@pytest.mark.parametrize('transport, method', [('ssh', 'ssh'), ('ansible.builtin.ssh', 'ssh'),
                                               ('paramiko_ssh', 'ssh'), ('local', 'local'), (None, 'unknown')])
def test_method_names_the_connection(transport, method):
    assert connection_method(transport) == method
