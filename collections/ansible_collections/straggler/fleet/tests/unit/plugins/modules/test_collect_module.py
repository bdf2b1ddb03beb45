# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collect module's host side: a consistent snapshot with the real agent CLI, in a temporary
directory, with its checksum; nothing left behind when it fails."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat

from ansible_collections.straggler.fleet.plugins.modules import collect


def test_snapshot_lands_in_a_temporary_directory_with_its_checksum(run_module, node_db, straggler_bin, tmp_path):
    scratch = tmp_path / 'scratch'
    scratch.mkdir()
    code, result = run_module(collect.main, dict(dest='/controller/dir', db=node_db, straggler_bin=straggler_bin,
                                                 snapshot_dir=str(scratch)))
    assert code == 0, result
    assert result['changed'] is True
    path = result['remote_path']
    assert os.path.dirname(path) == result['remote_dir'] and os.path.dirname(result['remote_dir']) == str(scratch)
    with open(path, 'rb') as handle:
        assert result['checksum'] == hashlib.sha256(handle.read()).hexdigest()
    assert result['size'] == os.path.getsize(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute('SELECT count(*) FROM events').fetchone()[0] == 3
    finally:
        conn.close()


def test_check_mode_snapshots_nothing(run_module, node_db, straggler_bin, tmp_path):
    scratch = tmp_path / 'scratch'
    scratch.mkdir()
    code, result = run_module(collect.main, dict(dest='/x', db=node_db, straggler_bin=straggler_bin,
                                                 snapshot_dir=str(scratch), _ansible_check_mode=True))
    assert code == 0, result
    assert result['changed'] is True and 'remote_path' not in result
    assert result['size'] == os.path.getsize(node_db)
    assert os.listdir(scratch) == []


def test_missing_database_fails_and_leaves_nothing(run_module, straggler_bin, tmp_path):
    scratch = tmp_path / 'scratch'
    scratch.mkdir()
    code, result = run_module(collect.main, dict(dest='/x', db=str(tmp_path / 'none.db'), straggler_bin=straggler_bin,
                                                 snapshot_dir=str(scratch)))
    assert code == 1
    assert 'none.db' in result['msg']
    assert os.listdir(scratch) == []


def test_failed_snapshot_removes_its_temporary_directory(run_module, node_db, tmp_path):
    scratch = tmp_path / 'scratch'
    scratch.mkdir()
    fake = tmp_path / 'straggler'
    fake.write_text('#!/bin/sh\necho "straggler snapshot: error: disk full; free some space" >&2\nexit 2\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    code, result = run_module(collect.main, dict(dest='/x', db=node_db, straggler_bin=str(fake), snapshot_dir=str(scratch)))
    assert code == 1
    assert result['msg'] == 'disk full; free some space'
    assert os.listdir(scratch) == []
