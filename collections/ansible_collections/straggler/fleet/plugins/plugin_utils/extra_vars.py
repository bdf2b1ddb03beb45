# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A playbook's options as people type them: `-e sql="SELECT node, count(*) AS n FROM events GROUP BY
node"` (the short names), `-e straggler_sql=...` (the prefixed, inventory-safe names), `-e @file`,
`-e '{"sql": ...}'`, inventory and play variables. Used by the action straggler.fleet.playbook_options.

Ansible splits a `-e key=value` argument at spaces and turns every word holding '=' into a variable
of its own, so SQL given that way arrives in pieces. The raw arguments are still there, unsplit, in
the command line Ansible parsed (ansible.context.CLIARGS['extra_vars']): they are read here once
more, by Ansible's own rules except one: `-e sql=REST` (or `straggler_sql=REST`) takes all of REST,
spaces and '=' included, as the SQL; and `-e NAME=REST` where Ansible's split would leave loose
words behind takes all of REST too (a path with a space).

Short names are read from the command line only (an inventory is shared, and a group variable
called `target` or `out` may mean something else there); the prefixed names from anywhere.

No straggler logic and no I/O beyond reading a `-e @file` through Ansible's loader.
"""

from __future__ import annotations

import difflib
import re

from ansible.module_utils.common.text.converters import to_text
from ansible.parsing.splitter import parse_kv

PREFIX = 'straggler_'
# The short names a playbook option may also be given by, on the command line only.
SHORT_NAMES = ('sql', 'target', 'transport', 'out')
# Options whose value is free text: `-e NAME=...` takes everything after the first '='.
TEXT_OPTIONS = ('sql',)
# Every prefixed variable the collection's playbooks read (tests/test_playbooks_typed.py checks this
# list against the playbooks), and the families of the roles' variables: one of these given to a
# playbook that does not read it is no typo, and is not reported.
COLLECTION_VARIABLES = (
    'straggler_target', 'straggler_sql', 'straggler_transport', 'straggler_limit', 'straggler_results_dir',
    'straggler_out', 'straggler_cluster_db', 'straggler_diagnose_watch', 'straggler_pki_dir',
    'straggler_pki_client_name', 'straggler_since', 'straggler_until', 'straggler_serial',
)
ROLE_PREFIXES = ('straggler_agent_', 'straggler_pki_')
# Variables Ansible itself, AWX/AAP and ansible-runner put among the extra vars, or that mean
# something to Ansible everywhere: never reported.
FOREIGN_PREFIXES = ('ansible_', 'awx_', 'tower_', 'runner_')
_ASSIGNMENT = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$', re.S)
RAW_WORDS = '_raw_params'


class ExtraVarsError(Exception):
    """A -e argument that cannot be read; the message is one line."""


def _unquoted(text):
    """`"a b"` or `'a b'` -> `a b` (one level of matching quotes around the whole value)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in '"\'':
        return text[1:-1]
    return text


def _text_option(name):
    return name in TEXT_OPTIONS or (name.startswith(PREFIX) and name[len(PREFIX):] in TEXT_OPTIONS)


def parse_assignment(argument):
    """One `-e` argument in key=value form -> dict, by Ansible's rules except the two above."""
    match = _ASSIGNMENT.match(argument)
    if match and _text_option(match.group(1)):
        return {match.group(1): _unquoted(match.group(2))}
    try:
        parsed = parse_kv(argument)
    except Exception as exc:  # Ansible's own parser: unbalanced quotes or Jinja
        raise ExtraVarsError('cannot read -e %s: %s' % (argument, to_text(exc).splitlines()[0]))
    if match and RAW_WORDS in parsed and len(parsed) == 2 and match.group(1) in parsed:
        return {match.group(1): _unquoted(match.group(2))}
    return dict(parsed)


def command_line_vars(arguments, loader):
    """The extra vars of the command line (a list of `-e` arguments, as Ansible's CLI keeps them),
    merged in order as Ansible merges them (later wins); words Ansible could not place are listed
    under RAW_WORDS. `loader` reads `@file` and inline YAML/JSON the way Ansible does."""
    merged = {}
    for argument in arguments or ():
        argument = to_text(argument, errors='surrogate_or_strict')
        if not argument:
            continue
        if argument.startswith('@'):
            data = loader.load_from_file(argument[1:])
        elif argument[0] in '[{':
            data = loader.load(argument)
        else:
            data = parse_assignment(argument)
        if not hasattr(data, 'items'):
            raise ExtraVarsError('-e %s is not a set of variables (give NAME=VALUE, a YAML/JSON mapping or @FILE)'
                                 % argument)
        for key, value in data.items():
            if key == RAW_WORDS and RAW_WORDS in merged:
                merged[key] = '%s %s' % (merged[key], value)
            else:
                merged[to_text(key)] = value
    return merged


def split_by_ansible(arguments):
    """The names Ansible's own split of the `-e` key=value arguments made variables of (a word of
    `-e sql=... target='x'` among them), for telling those apart from the names typed as options."""
    names = set()
    for argument in arguments or ():
        argument = to_text(argument, errors='surrogate_or_strict')
        if not argument or argument[0] in '@[{':
            continue
        try:
            names.update(to_text(key) for key in parse_kv(argument) if key != RAW_WORDS)
        except Exception:  # unreadable: command_line_vars says so
            continue
    return names


def option_names(options):
    """{name given: option} for every name an option of the playbook is read by."""
    names = {}
    for option in options:
        names[PREFIX + option] = option
        if option in SHORT_NAMES:
            names[option] = option
    return names


def resolve(options, cli_vars, play_vars):
    """The value of each option and where it came from.

    options: {name: default}. cli_vars: command_line_vars(). play_vars: the task's variables
    (inventory, play, and Ansible's own reading of -e). Order: the command line's prefixed name,
    its short name, the prefixed variable from anywhere else, the default. Raises ExtraVarsError when
    the short and the prefixed name disagree on the command line."""
    values, sources = {}, {}
    for option, default in options.items():
        prefixed = PREFIX + option
        given = [(name, cli_vars[name]) for name in (prefixed, option)
                 if name in cli_vars and (name == prefixed or option in SHORT_NAMES)]
        if len(given) == 2 and given[0][1] != given[1][1]:
            raise ExtraVarsError('-e %s and -e %s disagree: give one of them' % (given[0][0], given[1][0]))
        if given:
            values[option], sources[option] = given[0][1], '-e %s' % given[0][0]
        elif play_vars.get(prefixed) is not None:
            values[option], sources[option] = play_vars[prefixed], prefixed
        else:
            values[option], sources[option] = default, 'default'
    return values, sources


def _known_elsewhere(name, accept):
    if name in COLLECTION_VARIABLES or name.startswith(ROLE_PREFIXES + FOREIGN_PREFIXES):
        return True
    return any(name == item or (item.endswith('*') and name.startswith(item[:-1])) for item in accept or ())


def unread(cli_vars, options, accept=()):
    """The names given with -e that this playbook does not read, each with a suggestion or None."""
    names = option_names(options)
    found = []
    for name in sorted(cli_vars):
        if name == RAW_WORDS or name in names or _known_elsewhere(name, accept):
            continue
        close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.75)
        found.append((name, close[0] if close else None))
    return found


def unread_message(playbook, unread_names, options, loose_words=None):
    """One line saying what was given and not read, and what the playbook reads."""
    parts = []
    for name, close in unread_names:
        parts.append('-e %s%s' % (name, ' (did you mean %s?)' % close if close else ''))
    if loose_words:
        parts.append('the words "%s"' % loose_words)
    readable = ', '.join('%s%s' % (option, ' (-e %s)' % option if option in SHORT_NAMES else '')
                         for option in options)
    return ('%s does not read %s: it reads %s, each as -e %sNAME=VALUE%s; nothing else given with -e changes '
            'what it does' % (playbook, ', '.join(parts), readable, PREFIX,
                              ' (or the short name shown)' if any(o in SHORT_NAMES for o in options) else ''))
