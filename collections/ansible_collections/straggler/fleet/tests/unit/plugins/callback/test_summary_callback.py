# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The summary callback: tables and statuses of aggregate/fleet_query results at the end of a
play, on stdout normally and on stderr when the stdout callback writes JSON."""

from __future__ import annotations

from unittest import mock

import pytest

from ansible_collections.straggler.fleet.plugins.callback import summary
from ansible_collections.straggler.fleet.plugins.callback.summary import (
    CallbackModule,
    plain_table,
    stdout_is_for_programs,
    summary_text,
)

AGGREGATED = dict(columns=['node', 'events'], rows=[['gpu1', 10], ['gpu2', 12]],
                  hosts=[dict(host='gpu1', node='gpu1', status='ok', row_count=1, message=''),
                         dict(host='gpu2', node='gpu2', status='ok', row_count=1, message=''),
                         dict(host='gpu5', node='gpu5', status='unreachable', row_count=0, message='Connection refused')],
                  missing=['gpu5'])


class RecordingDisplay:
    verbosity = 0

    def __init__(self):
        self.calls = []

    def display(self, msg, stderr=False, **kwargs):
        self.calls.append((msg, stderr))


def fake_result(action, payload, name='table'):
    task = mock.MagicMock()
    task.resolved_action = action
    task.get_name.return_value = name
    result = mock.MagicMock()
    result._task = task
    result._result = payload
    return result


def make_callback(output='auto', max_rows=50):
    """The callback as Ansible loads it (through the plugin loader, so its documented options apply)."""
    from ansible.plugins.loader import callback_loader
    display = RecordingDisplay()
    callback = callback_loader.get('straggler.fleet.summary', display=display)
    assert isinstance(callback, CallbackModule)
    callback.set_options(direct=dict(output=output, max_rows=max_rows))
    return callback, display


@pytest.mark.parametrize('name, expected', [('json', True), ('ansible.posix.json', True), ('ansible.posix.jsonl', True),
                                            ('default', False), ('ansible.builtin.default', False), ('yaml', False),
                                            (None, False)])
def test_json_stdout_callbacks_are_recognised(name, expected):
    assert stdout_is_for_programs(name) is expected


def test_summary_shows_rows_statuses_and_missing_hosts():
    text = summary_text('aggregate', 'play: table', AGGREGATED)
    assert 'gpu1' in text and '12' in text
    assert 'unreachable' in text and 'Connection refused' in text
    assert 'missing hosts: gpu5' in text


def test_long_tables_are_cut_and_counted():
    result = dict(columns=['n'], rows=[[i] for i in range(10)], hosts=[], missing=[])
    text = summary_text('aggregate', 't', result, max_rows=3)
    assert '... 7 more rows (10 in all)' in text


def test_fleet_query_nodes_show_offsets_and_failures():
    result = dict(columns=['node', 'one'], rows=[['a', 1]], failed_nodes=['10.0.0.9:7433'],
                  nodes=[dict(address='10.0.0.1:7433', node='a', status='ok', row_count=1, latency_ms=3.0,
                              offset_ns=2_500_000, uncertainty_ns=400_000, message=''),
                         dict(address='10.0.0.9:7433', node=None, status='refused', row_count=0, message='connection refused')])
    text = summary_text('fleet_query', 't', result)
    assert '2.500' in text and '0.400' in text
    assert 'nodes that did not answer: 10.0.0.9:7433' in text


def test_plain_table_aligns_columns():
    assert plain_table(['a', 'bb'], [[1, None], ['xyz', 2.5]]).splitlines() == ['a    bb', '---  -----', '1', 'xyz  2.500']


def test_printed_to_stdout_at_the_end_of_the_play(monkeypatch):
    monkeypatch.setattr(summary.C, 'DEFAULT_STDOUT_CALLBACK', 'default', raising=False)
    callback, display = make_callback()
    callback.v2_runner_on_ok(fake_result('straggler.fleet.aggregate', AGGREGATED))
    callback.v2_runner_on_ok(fake_result('ansible.builtin.debug', dict(msg='hi')))
    assert display.calls == []
    callback.v2_playbook_on_stats(mock.MagicMock())
    assert len(display.calls) == 1
    text, to_stderr = display.calls[0]
    assert to_stderr is False and 'gpu5' in text and 'hi' not in text


def test_printed_to_stderr_when_stdout_is_json(monkeypatch):
    monkeypatch.setattr(summary.C, 'DEFAULT_STDOUT_CALLBACK', 'ansible.posix.json', raising=False)
    callback, display = make_callback()
    callback.v2_runner_on_ok(fake_result('straggler.fleet.aggregate', AGGREGATED))
    callback.v2_playbook_on_stats(mock.MagicMock())
    assert display.calls and all(to_stderr for dummy, to_stderr in display.calls)


def test_every_play_is_printed_at_the_end_of_the_run_with_its_name(monkeypatch):
    monkeypatch.setattr(summary.C, 'DEFAULT_STDOUT_CALLBACK', 'default', raising=False)
    callback, display = make_callback()
    for name in ('query the fleet', 'analyse'):
        play = mock.MagicMock()
        play.get_name.return_value = name
        callback.v2_playbook_on_play_start(play)
        callback.v2_runner_on_failed(fake_result('straggler.fleet.fleet_query', dict(failed=True, msg='no node answered', nodes=[])))
    assert display.calls == []
    callback.v2_playbook_on_stats(mock.MagicMock())
    (text, dummy), = display.calls
    assert text.index('query the fleet: table') < text.index('analyse: table')
    assert 'no node answered' in text


def test_output_off_prints_nothing():
    callback, display = make_callback(output='off')
    callback.v2_runner_on_ok(fake_result('straggler.fleet.aggregate', AGGREGATED))
    callback.v2_playbook_on_stats(mock.MagicMock())
    assert display.calls == []


def test_forced_stderr_and_max_rows_options_apply(monkeypatch):
    monkeypatch.setattr(summary.C, 'DEFAULT_STDOUT_CALLBACK', 'default', raising=False)
    callback, display = make_callback(output='stderr', max_rows=1)
    callback.v2_runner_on_ok(fake_result('straggler.fleet.aggregate', AGGREGATED))
    callback.v2_playbook_on_stats(mock.MagicMock())
    (text, to_stderr), = display.calls
    assert to_stderr is True and '... 1 more rows (2 in all)' in text


def test_explain_verdict_and_findings_are_shown():
    result = dict(msg='straggler: gpu2: launches 3x slower', straggler='gpu2',
                  findings=[dict(severity='critical', node='gpu2', cause='straggler', summary='launches 3x slower'),
                            dict(severity='warning', node='gpu2', cause='cpu-contention', summary='ckpt-writer took the CPU')],
                  missing=[dict(node='gpu5', status='unreachable', message='timed out')])
    text = summary_text('explain', 'explain', result)
    assert text.startswith('explain: straggler: gpu2: launches 3x slower')
    assert 'cpu-contention' in text and 'ckpt-writer took the CPU' in text
    assert 'missing: gpu5 (unreachable): timed out' in text
