# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attributes the collection's actions share, once. Every action: straggler.fleet.attributes; then
straggler.fleet.attributes.controller for those that run once per play on the controller (aggregate,
fleet_query, merge, explain, watch, export), or straggler.fleet.attributes.host for those whose module
runs on each host (clock_facts, collect). Each module still states its own check_mode."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
attributes:
  action:
    support: full
  async:
    support: none
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

    CONTROLLER = r"""
attributes:
  bypass_host_loop:
    support: full
"""

    HOST = r"""
attributes:
  bypass_host_loop:
    support: none
"""
