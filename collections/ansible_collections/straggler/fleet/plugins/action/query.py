# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin straggler.fleet.query: runs the module on the host with the options a play's roles
would give it. A task (or an ad hoc command: `ansible gpu -b -m straggler.fleet.query -a "sql=..."`)
that leaves O(db) or O(straggler_bin) unset gets the host's own straggler_agent_db and
straggler_agent_venv, the variables the role straggler_agent installs by; unset there too, the
module's defaults apply. Nothing else is changed: the module does the query."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import host_value_of, with_agent_defaults


class ActionModule(ActionBase):

    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # tmp no longer has any effect

        args = with_agent_defaults(self._task.args, host_value_of(task_vars, self._templar))
        result.update(self._execute_module(module_name='straggler.fleet.query', module_args=args, task_vars=task_vars))
        return result
