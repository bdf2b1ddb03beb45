# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""export: options passed to the core's Perfetto export; missing inputs; check mode."""

from __future__ import annotations

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.action.export import ActionModule, export_arguments
from ansible_collections.straggler.fleet.tests.unit.helpers import make_node_db


def test_only_the_given_cuts_reach_the_core():
    assert export_arguments(dict(since=None, until='', node=None)) == {}
    assert export_arguments(dict(since=5, until=9, node=['a'])) == dict(since=5, until=9, nodes=['a'])


def test_a_missing_database_fails_and_is_skipped_in_check_mode(action_factory, tmp_path):
    args = dict(db=str(tmp_path / 'none.db'), dest=str(tmp_path / 'trace.json'))
    with pytest.raises(AnsibleActionFail, match='no such database'):
        action_factory(ActionModule, args).run(task_vars={})
    result = action_factory(ActionModule, args, check_mode=True).run(task_vars={})
    assert result['skipped'] is True


def test_check_mode_writes_nothing(action_factory, tmp_path):
    db = make_node_db(tmp_path / 'cluster.db')
    dest = tmp_path / 'trace.json'
    result = action_factory(ActionModule, dict(db=db, dest=str(dest)), check_mode=True).run(task_vars={})
    assert result['changed'] is True and not dest.exists()


def test_only_perfetto_is_offered(action_factory, tmp_path):
    with pytest.raises(AnsibleActionFail, match='format'):
        action_factory(ActionModule, dict(db='x', dest='y', format='csv')).run(task_vars={})
