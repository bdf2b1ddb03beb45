# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attributes shared by the actions whose module runs on each host (clock_facts, collect): an
action plugin on the controller around a module on the host, once per host; each module still
states its own check_mode and what else it supports."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  diff_mode:
    support: none
  platform:
    platforms: posix
"""
