# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side helpers shared by the collection's action plugins: their common run (argument
check, then the plugin's own work), importing the straggler core, reading other hosts'
variables, writing result files. It must not hold any straggler logic
(how SQL is judged, how an offset is estimated, how databases merge): that lives in the core
package, and the action plugins only translate arguments and results.

It runs only on the controller and never travels to managed hosts.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.action import ActionBase

SUPPORTED_FORMATS = ('json', 'csv', 'markdown')
# The files the actions write on the controller (tables, reports, databases, traces) hold what the nodes
# recorded, command lines included: for the controller's user only.
RESULT_FILE_MODE = 0o600
# the installed collection's root (plugins/plugin_utils/ is two levels down): where its wheel and requirements are
_COLLECTION_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StragglerAction(ActionBase):
    """An action plugin of the collection: run() checks the task's arguments against ARGUMENT_SPEC
    (with MUTUALLY_EXCLUSIVE) and hands them to run_task(args, task_vars, result), which returns
    the task's result."""

    ARGUMENT_SPEC = {}
    MUTUALLY_EXCLUSIVE = ()

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(StragglerAction, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC,
                                                  mutually_exclusive=[list(names) for names in self.MUTUALLY_EXCLUSIVE])
        return self.run_task(args, task_vars, result)

    def run_task(self, args, task_vars, result):
        raise NotImplementedError

    def _diff_list(self, result):
        """The list a file's diff goes into (result['diff']) when the task runs with --diff, else None."""
        return result.setdefault('diff', []) if self._task.diff else None


class ControllerAction(StragglerAction):
    """An action that runs once per play on the controller (like run_once) and uses no connection
    to the hosts; it supports check mode."""

    BYPASS_HOST_LOOP = True
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True


def install_command():
    """The one command that gives the Python running Ansible what the controller-side plugins import."""
    return '%s -m pip install -r %s' % (sys.executable, os.path.join(_COLLECTION_DIR, 'requirements.txt'))


def import_core(module_name):
    """Import `straggler.<module_name>` from the controller's Python, or fail the task with the fix."""
    full_name = 'straggler.' + module_name
    try:
        return importlib.import_module(full_name)
    except ImportError as exc:
        raise AnsibleActionFail('cannot import %s on the controller (%s): run %s'
                                % (full_name, exc, install_command())) from None


def core_error_types():
    """The core's expected-failure exception (StragglerError) plus ValueError/OSError, for except clauses."""
    try:
        errors = importlib.import_module('straggler.errors')
        return (errors.StragglerError, ValueError, OSError)
    except ImportError:
        return (ValueError, OSError)


def plain(value):
    """A deep copy of `value` made of plain dict/list/str/int/float/bool/None, so results that came
    through Ansible's variable system (lazy containers, tagged values) serialise everywhere."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return to_text(value, errors='surrogate_or_replace')
    if isinstance(value, dict) or hasattr(value, 'items'):
        return dict((to_text(key), plain(item)) for key, item in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(item) for item in value]
    return to_text(value)


def play_hosts(task_vars, requested=None):
    """The inventory hostnames a fan-in task covers: `requested` if given, else every host of the
    play (ansible_play_hosts_all: including the ones that failed or were unreachable)."""
    if requested:
        return [to_text(host) for host in requested]
    return [to_text(host) for host in (task_vars.get('ansible_play_hosts_all') or [])]


def hostvars_of(task_vars, host):
    """The variables of another host (an empty dict when the inventory does not know it)."""
    hostvars = task_vars.get('hostvars') or {}
    try:
        found = hostvars[host]
    except (KeyError, TypeError):
        return {}
    return found if found is not None else {}


def hostvar(task_vars, host, name, default=None):
    """One variable of another host, templated, or `default` when it is not defined."""
    variables = hostvars_of(task_vars, host)
    try:
        value = variables.get(name, default)
    except Exception:  # an undefined or broken template in someone else's variable: treat as missing
        return default
    return default if value is None else value


def default_nodes(task_vars, hosts, port=None):
    """`address:port` of the agent on each host, by the core's one rule
    (straggler.fleet.inventory.agent_address: ansible_host else the inventory hostname, port
    straggler_agent_port from the host's variables else `port`, else the core's default port
    straggler.defaults.AGENT_PORT), and the inventory hostname each address belongs to."""
    inventory = import_core('fleet.inventory')
    default_port = dict(default_port=port) if port else {}
    nodes = []
    host_of_address = {}
    for host in hosts:
        host_vars = dict((name, hostvar(task_vars, host, name))
                         for name in (inventory.HOST_VARIABLE, inventory.PORT_VARIABLE))
        try:
            node = inventory.agent_address(to_text(host), plain(host_vars), **default_port)
        except core_error_types() as exc:
            raise AnsibleActionFail(to_text(exc)) from None
        nodes.append(node)
        host_of_address[node] = host
    return nodes, host_of_address


def guess_format(dest, requested):
    """The output format: `requested`, else from the file name (.csv, .md), else json."""
    if requested:
        return requested
    lowered = (dest or '').lower()
    if lowered.endswith('.csv'):
        return 'csv'
    if lowered.endswith(('.md', '.markdown')):
        return 'markdown'
    return 'json'


def write_if_changed(path, text, check_mode=False, diff=None):
    """Write `text` to `path` atomically (creating parent directories), mode RESULT_FILE_MODE, unless
    it already holds exactly that. Returns True when the file was (or, in check mode, would be) written.
    diff: a list to append Ansible's diff of the file to (--diff), or None."""
    path = os.path.abspath(os.path.expanduser(path))
    data = to_bytes(text)
    before = None
    try:
        with open(path, 'rb') as existing:
            before = existing.read()
            if before == data:
                return False
    except OSError:
        pass
    if diff is not None:
        diff.append(dict(before_header=path, after_header=path, after=to_text(data, errors='surrogate_or_replace'),
                         before=to_text(before, errors='surrogate_or_replace') if before is not None else ''))
    if check_mode:
        return True
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temp_path = tempfile.mkstemp(prefix='.%s.' % os.path.basename(path), dir=directory)
        try:
            with os.fdopen(fd, 'wb') as handle:
                handle.write(data)
            os.chmod(temp_path, RESULT_FILE_MODE)
            os.replace(temp_path, path)
        except BaseException:
            if os.path.exists(temp_path):
                os.unlink(temp_path)
            raise
    except OSError as exc:
        raise AnsibleActionFail('cannot write %s: %s; check that its directory is writable' % (path, exc)) from None
    return True


# A module option the host's agent variables give when a task leaves it unset (the roles install the agent by
# them): option -> (host variable, how the option is made of it). An ad hoc command reads what a playbook reads.
AGENT_DEFAULTS = (
    ('db', 'straggler_agent_db', lambda value: value),
    ('straggler_bin', 'straggler_agent_venv', lambda value: value.rstrip('/') + '/bin/straggler'),
)


def with_agent_defaults(args, host_value):
    """The module's arguments: `args`, and for each option of AGENT_DEFAULTS left unset, the host's variable
    (host_value(name) -> its value, or None) made into it."""
    args = dict(args)
    for option, variable, make in AGENT_DEFAULTS:
        if args.get(option) in (None, ''):
            value = host_value(variable)
            if value not in (None, ''):
                args[option] = make(str(value))
    return args


def host_value_of(task_vars, templar):
    """host_value(name) for with_agent_defaults: the host's variable templated, None when unset or broken."""
    def host_value(name):
        if name not in task_vars:
            return None
        try:
            return templar.template(task_vars[name])
        except Exception:  # an undefined or broken variable: as if unset (the module's default applies)
            return None
    return host_value
