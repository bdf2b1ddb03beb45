# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of how the controller-side actions that talk to the agents (fleet_query,
explain live, watch) find an inventory host's agent: the O(port) option and the rule
(straggler.fleet.inventory.agent_address of the core, the same as C(straggler fleet --nodes INVENTORY))."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  port:
    description:
      - The agents' API port for inventory hosts that do not set C(straggler_agent_port) (the variable the
        agent role listens on).
      - Not used for O(nodes), which carry their own ports (C(host:port); 7433 when left out).
    type: int
    default: 7433
notes:
  - "An inventory host's agent is at C(ansible_host) (else its inventory hostname; IPv6 addresses get brackets),
    port C(straggler_agent_port) from its variables (host, group or C(all) vars) else O(port): the same rule as
    C(straggler fleet query --nodes INVENTORY) of the agent CLI."
"""
