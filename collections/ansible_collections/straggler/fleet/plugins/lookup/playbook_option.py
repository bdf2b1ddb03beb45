# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lookup plugin straggler.fleet.playbook_option: one of a playbook's options where a play's own
keywords need it before any task runs (its `hosts`), read by the same rules as the action
straggler.fleet.playbook_options (plugin_utils/extra_vars.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: playbook_option
short_description: One of the collection's playbook options as it was typed
version_added: 0.1.0
author:
  - The straggler project (!UNKNOWN)
description:
  - Returns the value of one option of the collection's playbooks by the rules of M(straggler.fleet.playbook_options)
    (the action that reads them all once the play runs), for a play keyword that needs it before any task, such as
    its C(hosts).
  - The command line comes first, as typed - C(-e target=GROUP) or C(-e straggler_target=GROUP), where C(-e sql=REST)
    takes all of REST as the SQL, so a word of the SQL such as C(target='x') never becomes a variable of its own;
    then the prefixed variable (C(straggler_target)) where the lookup is given it (in a play's C(hosts), Ansible
    templates with the extra variables only, not the inventory's); then O(default).
  - A value holding a template (C(-e target='{{ groups.gpu[0] }}')) is templated, as a variable would be.
  - Short names are read from the command line only; an inventory's C(target) means nothing here.
options:
  _terms:
    description: The option's short name (V(target)); its prefixed name is C(straggler_) and the short name.
    required: true
    type: list
    elements: str
  default:
    description: The value when the option is given nowhere.
    type: raw
"""

EXAMPLES = r"""
- name: Run one SQL on every host
  hosts: "{{ lookup('straggler.fleet.playbook_option', 'target', default='gpu') }}"
  tasks: []
"""

RETURN = r"""
_raw:
  description: The option's value (one item).
  type: list
  elements: raw
"""

from ansible import context
from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.straggler.fleet.plugins.plugin_utils.extra_vars import (
    PREFIX,
    SHORT_NAMES,
    ExtraVarsError,
    command_line_vars,
    resolve,
    split_by_ansible,
)


def _trusted(text):
    """The command line's text as a template Ansible may render (as it trusts its own -e values); older
    ansible-core renders any string."""
    try:
        from ansible.template import trust_as_template
    except ImportError:
        return text
    return trust_as_template(text)


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1:
            raise AnsibleLookupError('playbook_option takes one option name, not %d' % len(terms))
        name = str(terms[0])
        if name not in SHORT_NAMES and not name.isidentifier():
            raise AnsibleLookupError('playbook_option: %r is no option name' % name)
        try:
            arguments = context.CLIARGS.get('extra_vars', ())
            cli_vars = command_line_vars(arguments, self._loader)
            play_vars = {}
            prefixed = PREFIX + name
            # a variable Ansible made of a word of another option's text (-e sql=... straggler_target='x') is no option
            split_off = prefixed in split_by_ansible(arguments) and prefixed not in cli_vars
            if variables and variables.get(prefixed) is not None and prefixed not in cli_vars and not split_off:
                play_vars[prefixed] = self._templar.template(variables[prefixed])
            values, dummy = resolve({name: self.get_option('default')}, cli_vars, play_vars)
        except ExtraVarsError as exc:
            raise AnsibleLookupError(str(exc)) from None
        value = values[name]
        if isinstance(value, str) and ('{{' in value or '{%' in value):
            value = self._templar.template(_trusted(value))
        return [value]
