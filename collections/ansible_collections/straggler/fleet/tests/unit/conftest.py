# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures for the collection's unit tests, run with plain pytest from the repository's .venv
(tests/test_collection.py does that): the collection is made importable as
ansible_collections.straggler.fleet, and real node databases are built with the straggler core."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ansible.module_utils.testing import patch_module_args
from ansible.plugins.loader import init_plugin_loader

COLLECTIONS_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', '..'))
# Ansible's collection loader, as ansible-test units and ansible-playbook install it: every
# ansible_collections.* import (tests, plugins, the plugin loader's) then resolves the same way.
init_plugin_loader([COLLECTIONS_ROOT])

from ansible_collections.straggler.fleet.tests.unit.helpers import make_node_db  # noqa: E402


@pytest.fixture
def node_db(tmp_path):
    return make_node_db(tmp_path / 'straggler.db')


@pytest.fixture
def straggler_bin():
    """The real agent CLI of the .venv running the tests."""
    path = os.path.join(os.path.dirname(sys.executable), 'straggler')
    if not os.access(path, os.X_OK):
        pytest.fail('%s not found: run the unit tests with the repository .venv (make setup)' % path)
    return path


@pytest.fixture
def run_module(capsys):
    """Run a module's main() with the given arguments (2.19 style); returns (exit code, result dict)."""
    def run(main, args):
        with patch_module_args(args):
            with pytest.raises(SystemExit) as exit_info:
                main()
        captured = capsys.readouterr()
        return exit_info.value.code, json.loads(captured.out)
    return run


def make_action(action_class, args, check_mode=False, connection=None, diff=False):
    """An action plugin instance around a stand-in task (what the task executor would build)."""
    from unittest import mock
    task = mock.MagicMock()
    task.args = dict(args)
    task.check_mode = check_mode
    task.diff = diff
    task.async_val = 0
    task.action = 'straggler.fleet.test'
    if connection is None:
        connection = mock.MagicMock()
        connection._shell.tmpdir = None
        connection.become = False
    return action_class(task, connection, mock.MagicMock(), loader=None, templar=None, shared_loader_obj=None)


@pytest.fixture
def action_factory():
    return make_action
