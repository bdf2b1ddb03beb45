# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the TLS options shared by the actions that talk to the agents over HTTPS
(fleet_query, explain live, watch); their argument spec is TLS_ARGUMENT_SPEC in
plugins/plugin_utils/agents.py."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  ca:
    description:
      - The fleet CA certificate on the controller.
      - Default as for the agent CLI's C(--ca) (C(/etc/straggler/tls/ca.crt)).
    type: path
  cert:
    description:
      - The controller's client certificate, signed by the fleet CA.
      - Default as for the agent CLI's C(--cert) (C(/etc/straggler/tls/node.crt)).
    type: path
  key:
    description:
      - The private key of O(cert).
      - Default as for the agent CLI's C(--key) (C(/etc/straggler/tls/node.key)).
    type: path
  server_name:
    description:
      - Verify each agent's certificate against this name instead of the address connected to
        (the agent CLI's C(--tls-server-name)).
    type: str
  no_tls:
    description:
      - Plain HTTP without certificates (only for agents started with C(--no-tls), for tests).
    type: bool
    default: false
"""
