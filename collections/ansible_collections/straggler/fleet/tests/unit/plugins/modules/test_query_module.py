# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""straggler.fleet.query against a real node database through the real agent CLI."""

from __future__ import annotations

import os
import stat

from ansible_collections.straggler.fleet.plugins.modules import query


def test_query_returns_columns_rows_and_the_node_name(run_module, node_db, straggler_bin):
    code, result = run_module(query.main, dict(sql='SELECT op, duration FROM events ORDER BY seq', db=node_db,
                                               straggler_bin=straggler_bin))
    assert code == 0, result
    assert result['changed'] is False
    assert result['columns'] == ['op', 'duration']
    assert result['rows'] == [['cuLaunchKernel', 5000], ['ncclAllReduce', 800000], ['offcpu', 250000]]
    assert result['row_count'] == 3
    assert result['node'] == 'node-a'
    assert result['truncated'] is False
    assert isinstance(result['elapsed_ms'], (int, float))


def test_limit_truncates_and_says_so(run_module, node_db, straggler_bin):
    code, result = run_module(query.main, dict(sql='SELECT seq FROM events ORDER BY seq', db=node_db, limit=2,
                                               straggler_bin=straggler_bin))
    assert code == 0, result
    assert result['rows'] == [[1], [2]]
    assert result['truncated'] is True


def test_sql_starting_with_a_comment_is_not_taken_for_an_option(run_module, node_db, straggler_bin):
    code, result = run_module(query.main, dict(sql='-- how many\nSELECT count(*) AS n FROM events', db=node_db,
                                               straggler_bin=straggler_bin))
    assert code == 0, result
    assert result['rows'] == [[3]]


def test_a_write_is_rejected_with_one_line_and_the_database_is_unchanged(run_module, node_db, straggler_bin):
    code, result = run_module(query.main, dict(sql='DELETE FROM events', db=node_db, straggler_bin=straggler_bin))
    assert code == 1
    assert result['failed'] is True
    assert '\n' not in result['msg'] and 'read-only' in result['msg']
    assert not result['msg'].startswith('straggler query: error:')
    code, result = run_module(query.main, dict(sql='SELECT count(*) FROM events', db=node_db, straggler_bin=straggler_bin))
    assert result['rows'] == [[3]]


def test_query_runs_in_check_mode(run_module, node_db, straggler_bin):
    code, result = run_module(query.main, dict(sql='SELECT count(*) FROM events', db=node_db,
                                               straggler_bin=straggler_bin, _ansible_check_mode=True))
    assert code == 0, result
    assert result['rows'] == [[3]] and result['changed'] is False


def test_a_missing_database_fails_with_what_to_do(run_module, tmp_path, straggler_bin):
    code, result = run_module(query.main, dict(sql='SELECT 1', db=str(tmp_path / 'nope.db'), straggler_bin=straggler_bin))
    assert code == 1
    assert 'nope.db' in result['msg'] and '\n' not in result['msg']
    # what to do in the module's words (its option, the host's variable), not the command line's (--db PATH)
    assert "db option" in result['msg'] and 'straggler_agent_db' in result['msg'] and '--db' not in result['msg']


def test_a_missing_agent_cli_fails_naming_the_option(run_module, node_db, tmp_path):
    code, result = run_module(query.main, dict(sql='SELECT 1', db=node_db, straggler_bin=str(tmp_path / 'straggler')))
    assert code == 1
    assert 'straggler_bin' in result['msg']


def test_an_agent_that_prints_no_json_fails_clearly(run_module, node_db, tmp_path):
    fake = tmp_path / 'straggler'
    fake.write_text('#!/bin/sh\necho not json\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    code, result = run_module(query.main, dict(sql='SELECT 1', db=node_db, straggler_bin=str(fake)))
    assert code == 1
    assert 'no valid JSON' in result['msg']


def test_non_positive_limit_and_timeout_are_refused(run_module, node_db, straggler_bin):
    code, result = run_module(query.main, dict(sql='SELECT 1', db=node_db, limit=0, straggler_bin=straggler_bin))
    assert code == 1 and 'limit' in result['msg']
    code, result = run_module(query.main, dict(sql='SELECT 1', db=node_db, timeout=0, straggler_bin=straggler_bin))
    assert code == 1 and 'timeout' in result['msg']


def test_cli_arguments_keep_sql_a_positional():
    arguments = query.build_query_arguments('/db', '-x', 5, 2.5)
    assert arguments[-2:] == ['--', '-x']
    assert arguments[:2] == ['query', '--db'] and '--json' in arguments
    assert os.path.basename(arguments[2]) == 'db'


def test_a_user_without_the_privilege_gets_one_line_saying_become(run_module, tmp_path, straggler_bin):
    """The agent's database lies in a root-only directory: the module, run by another user (setpriv, nobody),
    says in one line that it needs root and how; run by root, the same check finds nothing."""
    import subprocess
    import sys
    private = tmp_path / 'private'
    private.mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    db = private / 'straggler.db'
    db.write_bytes(b'')
    agent_cli = os.path.join(os.path.dirname(query.__file__), '..', 'module_utils')
    code = ('import sys; sys.path.insert(0, %r); import agent_cli; print(agent_cli.privilege_problem(%r))'
            % (os.path.abspath(agent_cli), str(db)))
    proc = subprocess.run(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', sys.base_prefix + '/bin/python3',
                           '-c', code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("cannot read %s as uid 65534: the agent's database is root's; run the task as root "
                                   "with become (ansible -b, or become: true in the play)" % db)
    code, result = run_module(query.main, dict(sql='SELECT 1', db=str(db), straggler_bin=straggler_bin))
    assert 'become' not in result.get('msg', '')          # root reads it: no privilege problem
