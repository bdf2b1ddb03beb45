# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""merge: sources expanded, offsets gathered from clock_facts facts, the core merge run for real."""

from __future__ import annotations

import sqlite3

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.action.merge import (
    ActionModule,
    expand_sources,
    offsets_from_clock_facts,
    rename_argument,
)
from ansible_collections.straggler.fleet.tests.unit.helpers import make_node_db


@pytest.fixture
def collected(tmp_path):
    directory = tmp_path / 'collected'
    directory.mkdir()
    make_node_db(directory / 'gpu1.db', node='gpu1')
    make_node_db(directory / 'gpu2.db', node='gpu2')
    (directory / 'notes.txt').write_text('not a database')
    return directory


def test_a_directory_contributes_its_db_files_sorted(collected, tmp_path):
    extra = make_node_db(tmp_path / 'extra.db', node='x')
    assert expand_sources([str(collected), extra]) == [str(collected / 'gpu1.db'), str(collected / 'gpu2.db'), extra]
    with pytest.raises(AnsibleActionFail, match='does not exist'):
        expand_sources([str(tmp_path / 'nothing')])
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(AnsibleActionFail, match='no \\*.db files'):
        expand_sources([str(empty)])


def test_offsets_come_from_each_hosts_clock_fact():
    task_vars = dict(hostvars=dict(
        gpu1=dict(straggler_clock=dict(offset_ns=2_000_000, uncertainty_ns=500_000)),
        gpu2=dict(ansible_facts=dict(straggler_clock=dict(offset_ns=-3, uncertainty_ns=4))),
        gpu3=dict()))
    offsets, without = offsets_from_clock_facts(task_vars, ['gpu1', 'gpu2', 'gpu3'])
    assert offsets == dict(gpu1=dict(offset_ns=2_000_000, uncertainty_ns=500_000), gpu2=dict(offset_ns=-3, uncertainty_ns=4))
    assert without == ['gpu3']


@pytest.mark.parametrize('value, expected', [(False, False), (True, True), ('yes', True), ({'a': 'b'}, {'a': 'b'})])
def test_rename_takes_a_bool_or_a_mapping(value, expected):
    assert rename_argument(value) == expected


def test_rename_refuses_anything_else():
    with pytest.raises(AnsibleActionFail):
        rename_argument(['a'])


def test_merge_aligns_with_the_measured_offsets(action_factory, collected, tmp_path):
    dest = tmp_path / 'out' / 'cluster.db'
    task_vars = dict(hostvars=dict(gpu1=dict(straggler_clock=dict(offset_ns=1_000_000, uncertainty_ns=10)),
                                   gpu2=dict()))
    result = action_factory(ActionModule, dict(src=[str(collected)], dest=str(dest), offsets_from_hosts=['gpu1', 'gpu2'],
                                               offsets=dict(gpu2=dict(offset_ns=-2_000_000, uncertainty_ns=20)))
                            ).run(task_vars=task_vars)
    assert result['changed'] is True, result
    assert sorted(result['nodes']) == ['gpu1', 'gpu2']
    assert result['offsets'] == dict(gpu1=dict(offset_ns=1_000_000, uncertainty_ns=10),
                                     gpu2=dict(offset_ns=-2_000_000, uncertainty_ns=20))
    assert result['hosts_without_offsets'] == ['gpu2']
    conn = sqlite3.connect(str(dest))
    try:
        rows = dict(conn.execute("SELECT node, ts_aligned FROM events WHERE seq = 1").fetchall())
    finally:
        conn.close()
    # same monotonic ts and clock pairs on both nodes: the aligned times differ by the offsets' difference
    assert rows['gpu2'] - rows['gpu1'] == 3_000_000


def test_duplicate_nodes_fail_with_the_cores_message_unless_renamed(action_factory, tmp_path):
    first = make_node_db(tmp_path / 'a.db', node='same')
    second = make_node_db(tmp_path / 'b.db', node='same')
    with pytest.raises(AnsibleActionFail, match='both hold node same'):
        action_factory(ActionModule, dict(src=[first, second], dest=str(tmp_path / 'c.db'))).run(task_vars={})
    result = action_factory(ActionModule, dict(src=[first, second], dest=str(tmp_path / 'c.db'), rename=True)).run(task_vars={})
    assert result['nodes'] == ['same', 'same-2']


def test_check_mode_merges_nothing(action_factory, collected, tmp_path):
    dest = tmp_path / 'cluster.db'
    result = action_factory(ActionModule, dict(src=[str(collected)], dest=str(dest)), check_mode=True).run(task_vars={})
    assert result['changed'] is True and len(result['inputs']) == 2 and not dest.exists()


def test_merge_reports_changed_only_when_the_output_changed(action_factory, collected, tmp_path):
    dest = tmp_path / 'cluster.db'
    args = dict(src=[str(collected)], dest=str(dest), offsets=dict(gpu1=dict(offset_ns=5, uncertainty_ns=1)))
    first = action_factory(ActionModule, dict(args)).run(task_vars={})
    assert first['changed'] is True and dest.exists()
    stat = dest.stat()
    again = action_factory(ActionModule, dict(args)).run(task_vars={})
    assert again['changed'] is False, again
    assert 'unchanged' in again['msg']
    assert (dest.stat().st_ino, dest.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)   # not rewritten
    assert not [p for p in tmp_path.iterdir() if p.name.endswith('.tmp')]                       # no temporary left
    # another offset changes ts_aligned: written again
    other = dict(args, offsets=dict(gpu1=dict(offset_ns=7, uncertainty_ns=1)))
    assert action_factory(ActionModule, other).run(task_vars={})['changed'] is True
    # new rows in an input: written again
    make_node_db(collected / 'gpu3.db', node='gpu3')
    assert action_factory(ActionModule, dict(other)).run(task_vars={})['changed'] is True
    assert action_factory(ActionModule, dict(other)).run(task_vars={})['changed'] is False


def test_with_the_hosts_named_every_file_merged_is_one_of_theirs_or_named(action_factory, collected, tmp_path):
    """A file no host of expect_nodes_from_hosts is known for could hold any node: refused, not merged unchecked."""
    stray = make_node_db(tmp_path / 'stray.db', node='gpu9')
    dest = tmp_path / 'cluster.db'
    args = dict(src=[str(collected), str(stray)], dest=str(dest), expect_nodes_from_hosts=['gpu1', 'gpu2'])
    with pytest.raises(AnsibleActionFail, match='stray.db: no host of expect_nodes_from_hosts is known for it'):
        action_factory(ActionModule, args).run(task_vars={})
    assert not dest.exists()
    result = action_factory(ActionModule, dict(args, expect_nodes={str(stray): 'gpu9'})).run(task_vars={})
    assert sorted(result['nodes']) == ['gpu1', 'gpu2', 'gpu9']
    impostor = make_node_db(tmp_path / 'gpu3.db', node='gpu1-copy')
    with pytest.raises(AnsibleActionFail, match='gpu3'):
        action_factory(ActionModule, dict(src=[str(collected), str(impostor)], dest=str(tmp_path / 'c2.db'),
                                          expect_nodes_from_hosts=['gpu1', 'gpu2', 'gpu3'])).run(task_vars={})
