# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A controller without the straggler core: every controller-side plugin fails with one line that
names the one command to run (the collection's requirements.txt, into the Python running Ansible)."""

from __future__ import annotations

import os
import sys

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.plugin_utils import controller


def test_a_missing_core_module_fails_with_one_line_naming_the_pip_command():
    with pytest.raises(AnsibleActionFail) as failed:
        controller.import_core('no_such_module_of_the_core')
    message = str(failed.value.message)
    requirements = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(controller.__file__))), 'requirements.txt')
    assert '\n' not in message
    assert message.startswith('cannot import straggler.no_such_module_of_the_core on the controller')
    assert message.endswith('run %s -m pip install -r %s' % (sys.executable, requirements))
    assert os.path.isfile(requirements)
