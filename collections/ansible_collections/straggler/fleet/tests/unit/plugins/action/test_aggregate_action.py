# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""aggregate: every host of the play in one table, with a status for each, unreachable ones included."""

from __future__ import annotations

import csv
import io
import json

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.action.aggregate import ActionModule
from ansible_collections.straggler.fleet.plugins.plugin_utils.aggregation import aggregate, host_status

OK_A = dict(changed=False, node='node-a', columns=['op', 'n'], rows=[['x', 1], ['y', 2]], truncated=False, elapsed_ms=1.5)
OK_B = dict(changed=False, node='node-b', columns=['op', 'n'], rows=[['x', 7]], truncated=True, elapsed_ms=2.0)
EMPTY_C = dict(changed=False, node='node-c', columns=['op', 'n'], rows=[])
UNREACHABLE = dict(changed=False, unreachable=True, msg='Failed to connect to the host via ssh: Connection refused')
FAILED = dict(changed=False, failed=True, msg='DELETE is not allowed: queries are read-only\nsecond line')


def test_rows_get_the_node_column_and_every_host_a_status():
    table = aggregate(['a', 'b', 'c', 'd', 'e', 'f'],
                      dict(a=OK_A, b=OK_B, c=EMPTY_C, d=UNREACHABLE, e=FAILED), active_hosts={'a', 'b', 'c', 'e'})
    assert table['columns'] == ['node', 'op', 'n']
    assert table['rows'] == [['node-a', 'x', 1], ['node-a', 'y', 2], ['node-b', 'x', 7]]
    assert table['row_count'] == 3
    statuses = dict((entry['host'], entry) for entry in table['hosts'])
    assert [entry['host'] for entry in table['hosts']] == ['a', 'b', 'c', 'd', 'e', 'f']
    assert statuses['a']['status'] == 'ok' and statuses['a']['row_count'] == 2
    assert statuses['b']['truncated'] is True
    assert statuses['c']['status'] == 'empty'
    assert statuses['d']['status'] == 'unreachable' and 'Connection refused' in statuses['d']['message']
    # the core's one-line rule (straggler.text.one_line): the message's lines folded into one
    assert statuses['e']['status'] == 'failed'
    assert statuses['e']['message'] == 'DELETE is not allowed: queries are read-only second line'
    assert [entry['answered'] for entry in table['hosts']] == [True, True, True, False, False, False]
    assert statuses['f']['status'] == 'missing' and 'left the play' in statuses['f']['message']
    assert table['missing'] == ['d', 'e', 'f']


def test_a_selected_node_column_is_not_duplicated():
    result = dict(node='node-a', columns=['n', 'node'], rows=[[1, 'node-a']])
    table = aggregate(['a'], dict(a=result))
    assert table['columns'] == ['n', 'node']
    assert table['rows'] == [[1, 'node-a']]


def test_hosts_with_different_columns_line_up_by_name():
    first = dict(node='n1', columns=['a', 'b'], rows=[[1, 2]])
    second = dict(node='n2', columns=['b', 'c'], rows=[[3, 4]])
    table = aggregate(['h1', 'h2'], dict(h1=first, h2=second))
    assert table['columns'] == ['node', 'a', 'b', 'c']
    assert table['rows'] == [['n1', 1, 2, None], ['n2', None, 3, 4]]
    # the core's rule (straggler.fleet.combine): the host is kept, ok, and says how its columns differ
    assert [entry['status'] for entry in table['hosts']] == ['ok', 'ok'] and table['missing'] == []
    assert table['hosts'][0]['message'] == ''
    assert table['hosts'][1]['message'] == 'columns differ: lacks a (null in its rows); adds c'


@pytest.mark.parametrize('registered, status', [
    (dict(skipped=True, skip_reason='Conditional result was False'), 'skipped'),
    (dict(changed=False, stdout='hello'), 'invalid'),
    (dict(changed=False, results=[OK_A, OK_B]), 'invalid'),
    ('a string', 'invalid'),
    (None, 'missing'),
])
def test_other_registered_values_get_a_status(registered, status):
    assert host_status('h', registered)['status'] == status


def hostvars_task_vars(**registered):
    # each host's agent records the node its inventory says (straggler_agent_node), as the agent role sets it
    hostvars = dict((host, dict(straggler_query=value,
                                straggler_agent_node=(value.get('node') if isinstance(value, dict) else None) or host))
                    for host, value in registered.items())
    hostvars['ghost'] = {}
    hosts = list(registered) + ['ghost']
    return dict(hostvars=hostvars, ansible_play_hosts_all=hosts, ansible_play_hosts=list(registered))


def test_a_host_answering_as_another_node_or_for_one_is_refused_with_its_reason():
    impostor = dict(OK_B, node='node-a')
    table = aggregate(['a', 'b'], dict(a=OK_A, b=impostor), expected_nodes=dict(a='node-a', b='node-b'))
    statuses = dict((entry['host'], entry) for entry in table['hosts'])
    assert table['rows'] == [['node-a', 'x', 1], ['node-a', 'y', 2]]            # only a's own rows
    assert statuses['b']['status'] == 'wrong-node' and statuses['b']['row_count'] == 0
    assert statuses['b']['message'] == ("host b answered as node 'node-a', but it is node-b; refusing its answer: a "
                                        "node cannot answer as another")
    assert table['missing'] == ['b']
    forged = dict(node='node-b', columns=['node', 'n'], rows=[['node-b', 1], ['node-a', 2]])
    table = aggregate(['a', 'b'], dict(a=OK_A, b=forged), expected_nodes=dict(a='node-a', b='node-b'))
    assert table['rows'] == [['node-a', 'x', 1], ['node-a', 'y', 2]]
    assert table['hosts'][1]['status'] == 'wrong-node' and "rows of node 'node-a'" in table['hosts'][1]['message']


def test_two_hosts_naming_one_node_are_both_refused():
    """Without the inventory's word (expected_nodes None) a host is taken at its own, but never two at one name."""
    table = aggregate(['a', 'b', 'c'], dict(a=OK_A, b=dict(OK_B, node='node-a'), c=EMPTY_C))
    statuses = [(entry['host'], entry['status']) for entry in table['hosts']]
    assert statuses == [('a', 'wrong-node'), ('b', 'wrong-node'), ('c', 'empty')]
    assert table['rows'] == [] and table['missing'] == ['a', 'b']
    assert table['hosts'][0]['message'] == ('host a, host b all answered as node node-a; refusing each: a node cannot '
                                            'answer as another (give each agent its own --node, or say which node '
                                            'each address is)')


def test_the_action_checks_each_host_against_its_inventory_node_unless_told(action_factory):
    task_vars = hostvars_task_vars(a=OK_A, b=OK_B)
    task_vars['hostvars']['b']['straggler_agent_node'] = 'node-z'        # the inventory says b is node-z
    result = action_factory(ActionModule, {}).run(task_vars=task_vars)
    assert result['rows'] == [['node-a', 'x', 1], ['node-a', 'y', 2]] and result['missing'] == ['b', 'ghost']
    assert [h['status'] for h in result['hosts']][:2] == ['ok', 'wrong-node']
    result = action_factory(ActionModule, dict(check_nodes=False)).run(task_vars=task_vars)
    assert result['missing'] == ['ghost'] and len(result['rows']) == 3


def test_action_gathers_every_host_of_the_play(action_factory):
    action = action_factory(ActionModule, {})
    result = action.run(task_vars=hostvars_task_vars(a=OK_A, b=UNREACHABLE))
    assert result['changed'] is False
    assert result['rows'] == [['node-a', 'x', 1], ['node-a', 'y', 2]]
    assert result['missing'] == ['b', 'ghost']
    assert result['msg'] == '1 of 3 hosts answered, 2 rows; missing: b, ghost'
    assert not result.get('failed')


def test_action_reads_the_named_variable_and_the_given_hosts(action_factory):
    task_vars = dict(hostvars=dict(a=dict(other=OK_B, straggler_agent_node='node-b')), ansible_play_hosts_all=['localhost'])
    result = ActionModule.run(action_factory(ActionModule, dict(results='other', hosts=['a'])), task_vars=task_vars)
    assert result['rows'] == [['node-b', 'x', 7]] and result['missing'] == []


@pytest.mark.parametrize('name, check', [
    ('table.csv', lambda text: list(csv.reader(io.StringIO(text))) == [['node', 'op', 'n'], ['node-a', 'x', '1'],
                                                                       ['node-a', 'y', '2']]),
    ('table.md', lambda text: '| node-a | x | 1 |' in text and 'Missing hosts: b, ghost' in text and '| b | b | unreachable' in text),
    ('table.json', lambda text: json.loads(text)['missing'] == ['b', 'ghost'] and json.loads(text)['rows'][0] == ['node-a', 'x', 1]),
])
def test_dest_is_written_in_the_format_of_its_name_and_only_when_it_changes(action_factory, tmp_path, name, check):
    dest = tmp_path / 'sub' / name
    task_vars = hostvars_task_vars(a=OK_A, b=UNREACHABLE)
    result = action_factory(ActionModule, dict(dest=str(dest))).run(task_vars=task_vars)
    assert result['changed'] is True and dest.exists()
    assert check(dest.read_text())
    again = action_factory(ActionModule, dict(dest=str(dest))).run(task_vars=task_vars)
    assert again['changed'] is False


def test_check_mode_writes_nothing(action_factory, tmp_path):
    dest = tmp_path / 'table.json'
    result = action_factory(ActionModule, dict(dest=str(dest)), check_mode=True).run(task_vars=hostvars_task_vars(a=OK_A))
    assert result['changed'] is True
    assert not dest.exists()


def test_bad_format_and_no_hosts_are_refused(action_factory):
    with pytest.raises(AnsibleActionFail):
        action_factory(ActionModule, dict(format='xml')).run(task_vars=hostvars_task_vars(a=OK_A))
    with pytest.raises(AnsibleActionFail, match='no hosts'):
        action_factory(ActionModule, {}).run(task_vars=dict(hostvars={}, ansible_play_hosts_all=[]))


def test_diff_shows_the_table_before_and_after_and_the_file_is_for_its_owner_only(action_factory, tmp_path):
    dest = tmp_path / 'table.csv'
    first = action_factory(ActionModule, dict(dest=str(dest)), diff=True).run(task_vars=hostvars_task_vars(a=OK_A))
    assert first['diff'] == [dict(before_header=str(dest), after_header=str(dest), before='', after=dest.read_text())]
    assert dest.stat().st_mode & 0o777 == 0o600
    second = action_factory(ActionModule, dict(dest=str(dest)), diff=True, check_mode=True).run(
        task_vars=hostvars_task_vars(a=OK_B))
    assert second['changed'] and 'node-a' in second['diff'][0]['before'] and 'node-b' in second['diff'][0]['after']
    assert 'node-a' in dest.read_text()                   # check mode: shown, not written
    unchanged = action_factory(ActionModule, dict(dest=str(dest)), diff=True).run(task_vars=hostvars_task_vars(a=OK_A))
    assert not unchanged['changed'] and 'diff' not in unchanged or unchanged['diff'] == []


def test_under_serial_later_batches_are_pending_not_missing(action_factory):
    task_vars = hostvars_task_vars(a=OK_A, b=None, c=None)
    task_vars.update(ansible_play_hosts=['a', 'b', 'c'], ansible_play_batch=['a'])
    result = action_factory(ActionModule, {}).run(task_vars=task_vars)
    assert result['pending'] == ['b', 'c'] and result['missing'] == ['ghost']     # ghost: left the play earlier
    assert result['msg'] == '1 of 2 hosts answered, 2 rows; missing: ghost; 2 in later batches (serial): b, c'
