# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Running the straggler agent's command line on a managed host, for the collection's modules.

This file travels to every host with the modules that use it, so it stays small and imports
only the standard library and ansible.module_utils. It must not import the straggler package:
the host's Python need not have it; the agent's own virtual environment does, and is reached
through its `straggler` executable.
"""

from __future__ import annotations

import json
import os
import re
import sys

DEFAULT_STRAGGLER_BIN = '/opt/straggler/venv/bin/straggler'
DEFAULT_DB = '/var/lib/straggler/straggler.db'
_CLI_ERROR_PREFIX = re.compile(r'^straggler [\w-]+(?: [\w-]+)?: error: ')


class AgentCliError(Exception):
    """The agent CLI could not be run or answered with an error; the message is one line."""

    def __init__(self, message, rc=None, stdout='', stderr=''):
        super(AgentCliError, self).__init__(message)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr


def find_straggler_bin(module, requested=None):
    """Path of the agent CLI: `requested` if given (it must exist), else the agent's default
    install path, else a `straggler` beside the Python running this module, else one on PATH."""
    if requested:
        path = os.path.expanduser(requested)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise AgentCliError(
            'straggler_bin %s is not an executable file: deploy the agent on this host or correct straggler_bin' % requested)
    candidates = [DEFAULT_STRAGGLER_BIN, os.path.join(os.path.dirname(sys.executable), 'straggler')]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = module.get_bin_path('straggler')
    if found:
        return found
    raise AgentCliError(
        'the straggler agent CLI was not found (looked at %s, beside %s and on PATH): '
        'deploy the agent on this host (role straggler_agent) or set straggler_bin' % (DEFAULT_STRAGGLER_BIN, sys.executable))


def privilege_problem(db):
    """One line when `db` cannot be read for lack of privilege (the agent's database and its directory are
    root's), with the fix; None otherwise (a missing database is for the caller to report)."""
    try:
        os.stat(db)
    except PermissionError:            # a directory on the way that this user may not enter
        pass
    except OSError:                    # missing: not a question of privilege
        return None
    else:
        if os.access(db, os.R_OK):
            return None
    return ('cannot read %s as uid %d: the agent\'s database is root\'s; run the task as root with become '
            '(ansible -b, or become: true in the play)' % (db, os.geteuid()))


def error_line(stderr, stdout=''):
    """The one line worth showing from a failed CLI run: the last non-empty stderr line
    (the CLI prints `straggler CMD: error: WHAT; WHAT TO DO`; the prefix is dropped), else the
    last stdout line."""
    for text in (stderr, stdout):
        lines = [line.strip() for line in (text or '').splitlines() if line.strip()]
        if lines:
            return _CLI_ERROR_PREFIX.sub('', lines[-1])
    return ''


def run_agent_cli(module, straggler_bin, arguments):
    """Run `straggler ARGUMENTS...` (a list, never a shell string) and return (stdout, stderr).

    Raises AgentCliError with the CLI's own one-line error when it exits non-zero."""
    command = [straggler_bin] + [str(arg) for arg in arguments]
    rc, stdout, stderr = module.run_command(command, check_rc=False, environ_update={'LC_ALL': 'C.UTF-8'})
    if rc != 0:
        reason = error_line(stderr, stdout) or 'exit code %d and no message' % rc
        raise AgentCliError(reason, rc=rc, stdout=stdout, stderr=stderr)
    return stdout, stderr


def parse_json_output(stdout, what):
    """The JSON object the CLI printed, or AgentCliError naming what was expected."""
    try:
        value = json.loads(stdout)
    except ValueError as exc:
        raise AgentCliError('%s printed no valid JSON (%s): is the agent on this host a matching version?' % (what, exc),
                            stdout=stdout)
    if not isinstance(value, dict):
        raise AgentCliError('%s printed JSON that is not an object: is the agent on this host a matching version?' % what,
                            stdout=stdout)
    return value
