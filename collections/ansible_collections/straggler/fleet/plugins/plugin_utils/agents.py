# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options shared by the controller-side actions that talk to the agents (fleet_query, explain
live, watch), once: their argument specs (documented by the doc fragments straggler.fleet.tls and
straggler.fleet.agents) and their translation into the core's arguments. The address of an
inventory host's agent is the core's rule (straggler.fleet.inventory.agent_address, through
controller.default_nodes); TLS is the core's TLSOptions.

It runs only on the controller and never travels to managed hosts.
"""

from __future__ import annotations

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import (
    default_nodes,
    import_core,
    play_hosts,
)

TLS_FILES = ('ca', 'cert', 'key')

TLS_ARGUMENT_SPEC = dict(
    ca=dict(type='path'),
    cert=dict(type='path'),
    key=dict(type='path', no_log=False),
    server_name=dict(type='str'),
    no_tls=dict(type='bool', default=False),
)

# nodes and hosts: the agents as host:port, or inventory hosts (by the core's address rule, with
# port); port unset: the core's default port (straggler.defaults.AGENT_PORT, documented in the
# doc fragment straggler.fleet.agents)
AGENTS_ARGUMENT_SPEC = dict(
    nodes=dict(type='list', elements='str'),
    hosts=dict(type='list', elements='str'),
    port=dict(type='int'),
)


def agent_argument_spec(**own):
    """An action's argument spec: the shared agent and TLS options plus its own (`own` wins)."""
    spec = dict(AGENTS_ARGUMENT_SPEC)
    spec.update(TLS_ARGUMENT_SPEC)
    spec.update(own)
    return spec


def tls_options(args):
    """The core's TLSOptions from the task's TLS options (unset files keep the core's defaults)."""
    tls = import_core('tls')
    files = dict((name, args[name]) for name in TLS_FILES if args.get(name))
    return tls.TLSOptions(no_tls=bool(args.get('no_tls')), server_name=args.get('server_name') or None, **files)


def agent_nodes(task_vars, args):
    """(nodes, host_of_address): O(nodes) as given (no inventory hosts known), else the agents of
    O(hosts) or the play's hosts by the core's address rule with O(port) (else the core's) as the
    default port."""
    if args.get('nodes'):
        return list(args['nodes']), {}
    return default_nodes(task_vars, play_hosts(task_vars, args.get('hosts')), args.get('port'))
