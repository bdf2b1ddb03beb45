# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attributes shared by the actions that run once per play on the controller (aggregate,
fleet_query, merge, explain, watch, export); each module still states its own check_mode."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""
