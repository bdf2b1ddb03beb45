# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""query's action: an ad hoc command or a task without db/straggler_bin gets the host's own
straggler_agent_db and straggler_agent_venv, as the playbooks' tasks do; what is given stays."""

from __future__ import annotations

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import with_agent_defaults as with_host_defaults


def test_unset_options_take_the_hosts_agent_variables():
    host = dict(straggler_agent_db='/data/straggler/s.db', straggler_agent_venv='/srv/straggler/venv/')
    args = with_host_defaults(dict(sql='SELECT 1'), host.get)
    assert args == dict(sql='SELECT 1', db='/data/straggler/s.db', straggler_bin='/srv/straggler/venv/bin/straggler')


def test_given_options_stay_and_unset_variables_leave_the_modules_defaults():
    given = dict(sql='SELECT 1', db='/tmp/other.db', straggler_bin='/usr/bin/straggler')
    assert with_host_defaults(given, dict(straggler_agent_db='/x.db', straggler_agent_venv='/v').get) == given
    assert with_host_defaults(dict(sql='SELECT 1'), {}.get) == dict(sql='SELECT 1')
