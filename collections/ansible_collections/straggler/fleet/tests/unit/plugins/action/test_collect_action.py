# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""collect (action): the snapshot fetched to <dest>/<inventory_hostname>.db, checked, written only
when new, and the host's temporary directory removed whatever happens."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.action.collect import ActionModule, local_dest
from ansible_collections.straggler.fleet.plugins.module_utils.agent_cli import DEFAULT_DB


class FakeHost:
    """The host side: a snapshot file in a 'remote' directory, fetched by copying."""

    def __init__(self, tmp_path, content=b'SQLite format 3\x00 snapshot'):
        self.remote_dir = tmp_path / 'remote' / 'straggler-collect-1'
        self.remote_dir.mkdir(parents=True)
        self.remote_path = self.remote_dir / 'snapshot.db'
        self.remote_path.write_bytes(content)
        self.checksum = hashlib.sha256(content).hexdigest()
        self.commands = []
        self.module_args = None

    def execute_module(self, module_name, module_args, task_vars):
        assert module_name == 'straggler.fleet.collect'
        self.module_args = module_args
        return dict(changed=True, db=module_args.get('db', DEFAULT_DB), remote_path=str(self.remote_path), remote_dir=str(self.remote_dir),
                    checksum=self.checksum, size=self.remote_path.stat().st_size)

    def low_level(self, command, sudoable=True):
        self.commands.append(command)
        return dict(rc=0, stdout='', stderr='')


def run(action_factory, monkeypatch, host, args, check_mode=False, hostname='gpu-node-01', fetch=None):
    action = action_factory(ActionModule, args, check_mode=check_mode)
    action._connection.fetch_file = fetch or shutil.copyfile
    action._connection._shell.remove = lambda path, recurse=False: 'rm -rf %s' % path
    monkeypatch.setattr(action, '_execute_module', host.execute_module)
    monkeypatch.setattr(action, '_low_level_execute_command', host.low_level)
    monkeypatch.setattr(action, '_remove_tmp_path', lambda path: None)
    monkeypatch.setattr(action, '_make_tmp_path', lambda *a, **k: None)
    return action.run(task_vars=dict(inventory_hostname=hostname))


def test_snapshot_is_fetched_as_the_inventory_hostname_and_the_host_cleaned(action_factory, monkeypatch, tmp_path):
    host = FakeHost(tmp_path)
    dest = tmp_path / 'collected'
    result = run(action_factory, monkeypatch, host, dict(dest=str(dest)))
    target = dest / 'gpu-node-01.db'
    assert result['changed'] is True and result['dest'] == str(target)
    assert target.read_bytes() == host.remote_path.read_bytes()
    assert host.commands == ['rm -rf %s' % host.remote_dir]
    assert sorted(os.listdir(dest)) == ['gpu-node-01.db']  # no temporary file left
    # options left unset reach the module unset: its own defaults (the agent's store path) apply
    assert host.module_args == dict(dest=str(dest)) and result['db'] == DEFAULT_DB


def test_same_content_again_reports_no_change(action_factory, monkeypatch, tmp_path):
    dest = tmp_path / 'collected'
    run(action_factory, monkeypatch, FakeHost(tmp_path), dict(dest=str(dest)))
    shutil.rmtree(tmp_path / 'remote')
    result = run(action_factory, monkeypatch, FakeHost(tmp_path), dict(dest=str(dest)))
    assert result['changed'] is False


def test_a_corrupt_fetch_fails_and_leaves_no_file_but_cleans_the_host(action_factory, monkeypatch, tmp_path):
    host = FakeHost(tmp_path)
    dest = tmp_path / 'collected'

    def corrupt_fetch(remote, local):
        with open(local, 'wb') as handle:
            handle.write(b'truncated')
    with pytest.raises(AnsibleActionFail, match='corrupt'):
        run(action_factory, monkeypatch, host, dict(dest=str(dest)), fetch=corrupt_fetch)
    assert os.listdir(dest) == []
    assert host.commands == ['rm -rf %s' % host.remote_dir]


def test_check_mode_fetches_nothing(action_factory, monkeypatch, tmp_path):
    host = FakeHost(tmp_path)
    host.execute_module = lambda module_name, module_args, task_vars: dict(changed=True, db='/var/lib/straggler/straggler.db',
                                                                           size=10, msg='would snapshot')
    dest = tmp_path / 'collected'
    result = run(action_factory, monkeypatch, host, dict(dest=str(dest)), check_mode=True)
    assert result['changed'] is True and result['dest'] == str(dest / 'gpu-node-01.db')
    assert not dest.exists() and host.commands == []


def test_a_failing_module_is_passed_through(action_factory, monkeypatch, tmp_path):
    host = FakeHost(tmp_path)
    host.execute_module = lambda module_name, module_args, task_vars: dict(failed=True, msg='no database at /x')
    result = run(action_factory, monkeypatch, host, dict(dest=str(tmp_path / 'c')))
    assert result['failed'] is True and result['msg'] == 'no database at /x'


@pytest.mark.parametrize('name', ['', '../x', 'a/b', '..'])
def test_hostnames_that_are_not_file_names_are_refused(name):
    with pytest.raises(AnsibleActionFail):
        local_dest('/tmp', name)
