# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The playbooks' options as people type them (plugin_utils/extra_vars.py): the raw -e arguments
Ansible's CLI keeps, read once more so that SQL with spaces and '=' arrives whole."""

from __future__ import annotations

import pytest

from ansible.parsing.dataloader import DataLoader

from ansible_collections.straggler.fleet.plugins.plugin_utils.extra_vars import (
    RAW_WORDS,
    ExtraVarsError,
    command_line_vars,
    resolve,
    unread,
)

OPTIONS = {'sql': 'SELECT 1', 'transport': 'ssh', 'limit': 10000}


@pytest.mark.parametrize('argument, expected', [
    ("sql=SELECT node, count(*) AS n FROM events WHERE rank=1 AND op='x' GROUP BY node",
     {'sql': "SELECT node, count(*) AS n FROM events WHERE rank=1 AND op='x' GROUP BY node"}),
    ('straggler_sql="SELECT a, b FROM t WHERE x = 1"', {'straggler_sql': 'SELECT a, b FROM t WHERE x = 1'}),
    ('transport=https straggler_limit=5', {'transport': 'https', 'straggler_limit': '5'}),
    ('out=/tmp/my results', {'out': '/tmp/my results'}),
    ('{"sql": "SELECT 2", "limit": 3}', {'sql': 'SELECT 2', 'limit': 3}),
])
def test_each_argument_is_read_whole_where_ansible_would_split_it(argument, expected):
    assert command_line_vars([argument], DataLoader()) == expected


def test_later_arguments_win_and_loose_words_are_kept_to_report():
    found = command_line_vars(['transport=ssh', 'transport=https out=/a b'], DataLoader())
    assert found['transport'] == 'https' and found[RAW_WORDS] == 'b'


def test_the_command_line_wins_short_names_count_only_there_and_disagreement_is_an_error():
    values, sources = resolve(OPTIONS, {'sql': 'SELECT 9'}, {'straggler_sql': 'SELECT inventory', 'transport': 'https'})
    assert values == {'sql': 'SELECT 9', 'transport': 'ssh', 'limit': 10000}     # `transport` in play vars: ignored
    assert sources == {'sql': '-e sql', 'transport': 'default', 'limit': 'default'}
    values, sources = resolve(OPTIONS, {'limit': '5'}, {'straggler_transport': 'https'})
    assert values['limit'] == 10000 and values['transport'] == 'https' and sources['transport'] == 'straggler_transport'
    with pytest.raises(ExtraVarsError, match='disagree'):
        resolve(OPTIONS, {'sql': 'SELECT 1', 'straggler_sql': 'SELECT 2'}, {})


def test_unread_names_get_a_suggestion_and_the_collections_own_are_not_reported():
    given = {'sqll': 1, 'limit': 5, 'straggler_out': 'x', 'straggler_agent_port': 1, 'ansible_user': 'u', 'awx_job_id': 3,
             'transport': 'ssh', 'mine': 1, 'extra': 2}
    assert unread(given, OPTIONS, accept=['extra']) == [('limit', None), ('mine', None), ('sqll', 'sql')]
