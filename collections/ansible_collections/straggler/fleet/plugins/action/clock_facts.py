# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.clock_facts: times round trips to the host over the task's own
connection and turns them into the host's clock offset to the controller with the core's
straggler.clock.estimate_offset (NTP style: shortest round trip, uncertainty = half of it).

Round trips (`samples` in all): one run of the clock_facts module (which also returns a
monotonic/realtime pair), then raw `date +%s%N` commands, which cost one command over the existing connection
instead of a whole module run; where `date` cannot print nanoseconds, more module runs instead.
This plugin must not do the offset arithmetic itself: estimate_offset does."""

from __future__ import annotations

import re
import time

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import StragglerAction, import_core

MODULE_NAME = 'straggler.fleet.clock_facts'
PROBE_COMMAND = 'date +%s%N'
_NANOSECONDS = re.compile(r'^\d{19,}$')


def parse_probe_output(stdout):
    """The host's realtime in ns from `date +%s%N` output, or None when date printed no
    nanoseconds (busybox and BSD date print a literal N or %N)."""
    text = (stdout or '').strip()
    return int(text) if _NANOSECONDS.match(text) else None


def connection_method(transport):
    """How the round trips travelled, for the fact's `method` ('ssh' for every SSH connection plugin)."""
    name = (transport or 'unknown').rsplit('.', 1)[-1]
    return 'ssh' if name in ('ssh', 'paramiko_ssh', 'paramiko', 'libssh') else name


def clock_fact(timed_samples, pair, estimate_offset, probe, method):
    """The straggler_clock fact from (t_send, host_real, t_recv) samples and the module's pair."""
    offset_ns, uncertainty_ns = estimate_offset(timed_samples)
    fastest = min(timed_samples, key=lambda sample: sample[2] - sample[0])
    return dict(
        offset_ns=int(offset_ns),
        uncertainty_ns=int(uncertainty_ns),
        rtt_ns=int(fastest[2] - fastest[0]),
        measured_at_ns=int((fastest[0] + fastest[2]) // 2),
        mono_ns=int(pair['mono_ns']),
        real_ns=int(pair['real_ns']),
        pair_uncertainty_ns=int(pair.get('pair_uncertainty_ns') or 0),
        samples=len(timed_samples),
        probe=probe,
        method=method,
    )


class ActionModule(StragglerAction):

    TRANSFERS_FILES = False
    _supports_check_mode = True

    ARGUMENT_SPEC = dict(
        samples=dict(type='int', default=5),
        reads=dict(type='int', default=5),
    )

    def _timed_module_run(self, task_vars, reads):
        sent = time.time_ns()
        answer = self._execute_module(module_name=MODULE_NAME, module_args=dict(reads=reads), task_vars=task_vars)
        received = time.time_ns()
        return sent, answer, received

    def _timed_probe(self):
        sent = time.time_ns()
        answer = self._low_level_execute_command(PROBE_COMMAND, sudoable=False)
        received = time.time_ns()
        host_real = parse_probe_output(answer.get('stdout')) if answer.get('rc') == 0 else None
        return sent, host_real, received

    def run_task(self, args, task_vars, result):
        if args['samples'] < 1 or args['reads'] < 1:
            raise AnsibleActionFail('samples and reads must be at least 1')
        estimate_offset = import_core('clock').estimate_offset

        try:
            sent, answer, received = self._timed_module_run(task_vars, args['reads'])
            if answer.get('failed') or answer.get('unreachable') or 'real_ns' not in answer:
                result.update(answer)
                result.setdefault('failed', True)
                result.setdefault('msg', 'the clock_facts module returned no clock reading')
                return result
            pair = answer
            timed_samples = [(sent, int(answer['real_ns']), received)]
            probe = 'command'
            while len(timed_samples) < args['samples']:
                sent, host_real, received = self._timed_probe()
                if host_real is None:
                    probe = 'module'
                    break
                timed_samples.append((sent, host_real, received))
            if probe == 'module':
                while len(timed_samples) < args['samples']:
                    sent, answer, received = self._timed_module_run(task_vars, args['reads'])
                    if answer.get('failed') or 'real_ns' not in answer:
                        break
                    timed_samples.append((sent, int(answer['real_ns']), received))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        if len(timed_samples) == 1:
            probe = 'module'  # samples=1: the module run was the only round trip

        fact = clock_fact(timed_samples, pair, estimate_offset, probe, connection_method(self._connection.transport))
        facts = dict(pair.get('ansible_facts') or {})
        facts['straggler_clock'] = fact
        result.update(
            changed=False,
            ansible_facts=facts,
            mono_ns=fact['mono_ns'],
            real_ns=fact['real_ns'],
            msg='offset %.3f ms +/- %.3f ms (%d round trips over %s, %s)' % (
                fact['offset_ns'] / 1e6, fact['uncertainty_ns'] / 1e6, fact['samples'], fact['method'], probe),
        )
        return result
