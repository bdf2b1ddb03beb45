# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Inventory plugin straggler.fleet.jobs: asks the straggler agents (their API's read-only query route,
over mutual TLS, through the core's fleet client) which training jobs run on their nodes, and groups
the hosts by job. What a job is comes from the agents' `processes` table (the torchrun identity each
agent reads from a traced process's environment); the plugin only turns those rows into groups and
variables. It must not judge SQL, talk HTTP itself or decide anything about stragglers."""

from __future__ import annotations

DOCUMENTATION = r"""
name: jobs
short_description: Group hosts by the training jobs their straggler agents see
version_added: 0.1.0
description:
  - Asks every straggler agent (the hosts of O(group) from an earlier inventory source, or the agents of O(nodes)) which
    training processes it traces, with one read-only SQL over the agents' HTTPS API (mutual TLS, the core's fleet
    client, as M(straggler.fleet.fleet_query)), and groups the hosts by job.
  - A job is the processes that share a rendezvous endpoint, C(MASTER_ADDR:MASTER_PORT) of torchrun's environment
    (a loopback address is one job per node). Each job becomes the group C(job_<id>) (C(<id>) is the endpoint with
    every character that is not a letter or digit written C(_), the node's name first for a loopback endpoint; for
    example C(job_10_0_12_11_29500)), a child of the group C(straggler_jobs), with the group variable C(straggler_job)
    (C(id), C(master_addr), C(master_port), C(world_size), C(ranks) - the ranks seen, C(complete) - whether every rank
    of C(world_size) was seen).
  - Each host gets C(straggler_jobs) (by job id - C(ranks), C(local_ranks), C(world_size), C(pids)) and C(straggler_ranks)
    (the ranks it runs, every job together). A host in several jobs sees the group variable C(straggler_job) of one of
    them only (Ansible merges group variables); C(straggler_jobs[id]) is each job's there.
  - So C(ansible-playbook straggler.fleet.explain -l job_<id>) targets exactly the nodes of one job.
  - Only running processes count unless O(include_exited). Agents that do not answer are named in one warning and get
    no job.
  - Use it after the inventory of the hosts, for example C(ansible-playbook -i inventory.ini -i jobs.straggler.yml ...);
    the source file's name must end in C(straggler.yml) or C(straggler.yaml).
  - Each host's agent address, port and node come from the host's variables as the inventory and its C(group_vars/)
    and C(host_vars/) set them (O(use_vars_plugins)), as for a play.
  - Like the other inventory plugins, it takes O(compose), O(groups) and O(keyed_groups) over each host's variables
    (the job variables above included), and a cache (O(cache)) so that a later run does not ask the agents again.
author:
  - The straggler project (!UNKNOWN)
requirements:
  - The straggler package importable by the Python that runs Ansible on the controller (the collection's requirements.txt).
options:
  plugin:
    description: The name of this plugin.
    type: str
    required: true
    choices: [straggler.fleet.jobs]
  group:
    description:
      - The inventory group whose hosts' agents to ask (hosts added by an earlier inventory source). Each host's agent is
        at its C(ansible_host) (else its name) and C(straggler_agent_port) (else O(port)), the rule of the collection's
        other plugins; the node an agent must answer as is the host's C(straggler_agent_node), else its name.
    type: str
    default: all
  nodes:
    description:
      - Agents to ask instead, as C(host:port); each answering agent becomes a host named by its node, with
        C(ansible_host) and C(straggler_agent_port) set.
    type: list
    elements: str
    default: []
  port:
    description: The agents' port where a host sets no C(straggler_agent_port); unset, the straggler core's default.
    type: int
  pki_dir:
    description: The fleet CA directory on the controller (as the role M(straggler.fleet.straggler_pki)'s C(straggler_pki_dir)).
    type: path
    default: ~/.local/share/straggler/pki
    env:
      - name: STRAGGLER_PKI_DIR
  client_name:
    description: The controller's client certificate in O(pki_dir) (C(NAME.crt), C(NAME.key)).
    type: str
    default: controller
  ca:
    description: The CA certificate to check the agents with (default C(ca.crt) in O(pki_dir)).
    type: path
  cert:
    description: The client certificate (default O(client_name)C(.crt) in O(pki_dir)).
    type: path
  key:
    description: The client certificate's key (default O(client_name)C(.key) in O(pki_dir)).
    type: path
  ca_content:
    description:
      - The CA certificate itself (PEM), instead of a file; for example from an AWX credential that injects it as an
        environment variable. It takes the place of O(ca).
    type: str
    env:
      - name: STRAGGLER_CA_CONTENT
  cert_content:
    description: The client certificate itself (PEM), instead of O(cert).
    type: str
    env:
      - name: STRAGGLER_CERT_CONTENT
  key_content:
    description:
      - The client certificate's key itself (PEM), instead of O(key). It is written to a private temporary file (0600)
        for the TLS handshake and removed once the agents have answered.
    type: str
    env:
      - name: STRAGGLER_KEY_CONTENT
  use_vars_plugins:
    description:
      - Read each host's variables as a play would, C(group_vars/) and C(host_vars/) beside the inventory included (the
        vars plugins); V(false) reads only the variables the inventory sources themselves set.
    type: bool
    default: true
  server_name:
    description: The name to check in every agent's certificate instead of its address.
    type: str
  no_tls:
    description: Plain HTTP, for agents started with C(--no-tls) on a trusted network only.
    type: bool
    default: false
  timeout:
    description: Seconds each agent may take to answer.
    type: float
    default: 5
  include_exited:
    description: Count processes that have exited too (jobs that ran while the agents traced).
    type: bool
    default: false
  group_prefix:
    description: The prefix of the jobs' group names.
    type: str
    default: job_
extends_documentation_fragment:
  - ansible.builtin.constructed
  - ansible.builtin.inventory_cache
"""

EXAMPLES = r"""
# jobs.straggler.yml, after the inventory of the GPU hosts:
#   ansible-inventory -i inventory.ini -i jobs.straggler.yml --graph straggler_jobs
#   ansible-playbook -i inventory.ini -i jobs.straggler.yml straggler.fleet.explain -l job_10_0_12_11_29500
plugin: straggler.fleet.jobs
group: gpu

# With the certificates from an AWX credential (environment variables), a group per job size, and a cache:
# plugin: straggler.fleet.jobs
# group: gpu
# keyed_groups:
#   - key: straggler_ranks | length | string
#     prefix: ranks
# cache: true
# cache_plugin: ansible.builtin.jsonfile
# cache_connection: ~/.cache/straggler-jobs
# cache_timeout: 300
#   (STRAGGLER_CA_CONTENT, STRAGGLER_CERT_CONTENT and STRAGGLER_KEY_CONTENT hold the PEM texts)

# Or without another inventory, the agents by address:
# plugin: straggler.fleet.jobs
# nodes: [10.0.12.11, 10.0.12.12]     # host or host:port; the port unset: the agents' default
# pki_dir: /etc/straggler-fleet-pki
"""

import os
import re
import shutil
import tempfile

from ansible.errors import AnsibleParserError
from ansible.inventory.helpers import get_group_vars
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible.utils.vars import combine_vars
from ansible.vars.plugins import get_vars_from_inventory_sources

from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import install_command

JOBS_GROUP = 'straggler_jobs'
# the running (or every) trained process each agent traces, with torchrun's identity
JOBS_SQL = ("SELECT rank, local_rank, world_size, master_addr, master_port, pid FROM processes "
            "WHERE rank IS NOT NULL AND master_addr IS NOT NULL AND master_port IS NOT NULL{running} "
            "ORDER BY master_addr, master_port, rank, pid")
LOOPBACK = re.compile(r'^(127\.|::1$|localhost$|\[::1\]$)', re.I)


def job_id(node, master_addr, master_port):
    """The id of a job from its rendezvous endpoint: letters and digits kept, the rest '_'; a loopback
    endpoint is a job of that node alone, so the node's name comes first."""
    parts = ([node] if LOOPBACK.match(str(master_addr)) else []) + [str(master_addr), str(master_port)]
    return re.sub(r'[^A-Za-z0-9]', '_', '_'.join(parts))


def jobs_of(rows, columns, host_of_node):
    """{job id: {master_addr, master_port, world_size, hosts: {host: {ranks, local_ranks, pids}}}} from the
    combined table of every agent's answer (its `node` column names the agent)."""
    jobs = {}
    for row in rows:
        record = dict(zip(columns, row))
        host = host_of_node.get(record.get('node'))
        if host is None:
            continue
        identity = job_id(record['node'], record['master_addr'], record['master_port'])
        job = jobs.setdefault(identity, dict(master_addr=record['master_addr'], master_port=int(record['master_port']),
                                             world_size=record.get('world_size'), hosts={}))
        if record.get('world_size') is not None:
            job['world_size'] = max(job['world_size'] or 0, int(record['world_size']))
        entry = job['hosts'].setdefault(host, dict(ranks=[], local_ranks=[], pids=[]))
        for name, key in (('ranks', 'rank'), ('local_ranks', 'local_rank'), ('pids', 'pid')):
            value = record.get(key)
            if value is not None and int(value) not in entry[name]:
                entry[name].append(int(value))
    for job in jobs.values():
        for entry in job['hosts'].values():
            for name in entry:
                entry[name].sort()
    return jobs


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):

    NAME = 'straggler.fleet.jobs'

    def verify_file(self, path):
        return super(InventoryModule, self).verify_file(path) and path.endswith(('straggler.yml', 'straggler.yaml'))

    def _core(self):
        try:
            from straggler.fleet import client, inventory
            from straggler.tls import TLSOptions
        except ImportError as exc:
            raise AnsibleParserError('straggler.fleet.jobs cannot import the straggler core (%s): run %s'
                                     % (exc, install_command()))
        return client, inventory, TLSOptions

    def _tls(self, TLSOptions, scratch):
        """The TLS options: files from the options or pki_dir, or the PEM texts of the *_content options
        written into `scratch` (a private directory the caller removes)."""
        pki_dir = os.path.expanduser(self.get_option('pki_dir'))
        name = self.get_option('client_name')
        files = dict(ca=self.get_option('ca') or os.path.join(pki_dir, 'ca.crt'),
                     cert=self.get_option('cert') or os.path.join(pki_dir, name + '.crt'),
                     key=self.get_option('key') or os.path.join(pki_dir, name + '.key'))
        files = dict((k, os.path.expanduser(v)) for k, v in files.items())
        for kind in ('ca', 'cert', 'key'):
            content = self.get_option(kind + '_content')
            if content:
                path = os.path.join(scratch, kind + '.pem')
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 'w') as handle:
                    handle.write(content if content.endswith('\n') else content + '\n')
                files[kind] = path
        return TLSOptions(no_tls=bool(self.get_option('no_tls')), server_name=self.get_option('server_name') or None,
                          **files)

    def _host_vars(self, host):
        """A host's variables as a play sees them: the inventory's, and (use_vars_plugins) group_vars/ and host_vars/."""
        variables = combine_vars(get_group_vars(host.get_groups()), host.get_vars())
        if self.get_option('use_vars_plugins'):
            sources = getattr(self.inventory, 'processed_sources', [])
            variables = combine_vars(variables, get_vars_from_inventory_sources(self.loader, sources, host.get_groups(),
                                                                                'all'))
            variables = combine_vars(variables, get_vars_from_inventory_sources(self.loader, sources, [host], 'all'))
        return variables

    def _agents(self, inventory_rules):
        """[(address, inventory host or None, expected node or None)] of the agents to ask."""
        port = self.get_option('port')
        default_port = dict(default_port=port) if port else {}
        if self.get_option('nodes'):
            return [(inventory_rules.normalize_address(node, **default_port), None, None) for node in self.get_option('nodes')]
        group = self.get_option('group')
        if group not in self.inventory.groups:
            raise AnsibleParserError('straggler.fleet.jobs: no group %r in the inventory: give the inventory of the hosts '
                                     'first (-i inventory.ini -i %s) or set nodes' % (group, os.path.basename(self._path)))
        agents = []
        for host in self.inventory.groups[group].get_hosts():
            variables = self._host_vars(host)
            picked = dict((name, variables.get(name)) for name in (inventory_rules.HOST_VARIABLE,
                                                                   inventory_rules.PORT_VARIABLE))
            address = inventory_rules.agent_address(host.name, picked, **default_port)
            agents.append((address, host.name, str(variables.get('straggler_agent_node') or host.name)))
        return agents

    def parse(self, inventory, loader, path, cache=True):
        super(InventoryModule, self).parse(inventory, loader, path, cache)
        self._path = path
        self._read_config_data(path)
        client, inventory_rules, TLSOptions = self._core()
        agents = self._agents_or_fail(inventory_rules)
        if not agents:
            return
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option('cache') and cache
        answer = None
        if use_cache:
            try:
                answer = self._cache[cache_key]
            except KeyError:
                answer = None
            if answer is not None and answer.get('agents') != [list(agent) for agent in agents]:
                answer = None                   # the hosts or their addresses changed: ask again
        if answer is None:
            answer = self._ask(client, TLSOptions, agents)
            if self.get_option('cache'):
                self._cache[cache_key] = answer
        self._populate(answer, inventory_rules)

    def _agents_or_fail(self, inventory_rules):
        try:
            return self._agents(inventory_rules)
        except AnsibleParserError:
            raise
        except Exception as exc:   # the core's one-line errors: a bad address
            raise AnsibleParserError('straggler.fleet.jobs: %s' % exc)

    def _ask(self, client, TLSOptions, agents):
        """Every agent's answer, as plain data (what the cache keeps): the agents asked, each one's status,
        the combined table."""
        scratch = tempfile.mkdtemp(prefix='straggler-jobs-')
        try:
            expected = dict((address, node) for address, dummy, node in agents if node)
            sql = JOBS_SQL.format(running='' if self.get_option('include_exited') else ' AND exited IS NULL')
            result = client.fleet_query([address for address, dummy, dummy_node in agents], sql,
                                        self._tls(TLSOptions, scratch), timeout_s=self.get_option('timeout'),
                                        deadline_s=self.get_option('timeout') * 3, clock_samples=0,
                                        expected_nodes=expected or None)
        except Exception as exc:   # the core's one-line errors: unusable TLS files
            raise AnsibleParserError('straggler.fleet.jobs: %s' % exc)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return dict(agents=[list(agent) for agent in agents], columns=list(result.columns),
                    rows=[list(row) for row in result.rows],
                    nodes=[dict(address=s.address, node=s.node, answered=bool(s.answered), status=s.status,
                                message=s.message) for s in result.nodes])

    def _populate(self, answer, inventory_rules):
        host_of_address = dict((address, host) for address, host, dummy in answer['agents'])
        host_of_node = {}
        silent = []
        for status in answer['nodes']:
            if not status['answered']:
                silent.append('%s (%s: %s)' % (host_of_address.get(status['address']) or status['address'],
                                               status['status'], status['message']))
                continue
            host = host_of_address.get(status['address'])
            if host is None:                            # nodes: a host named by the node the agent answers as
                host = self.inventory.add_host(status['node'])
                address, port = inventory_rules.split_address(status['address'])
                self.inventory.set_variable(host, 'ansible_host', address.strip('[]'))
                self.inventory.set_variable(host, 'straggler_agent_port', port)
            host_of_node[status['node']] = host
        if silent:
            self.display.warning('straggler.fleet.jobs: %d agents did not answer, their hosts get no job: %s'
                                 % (len(silent), '; '.join(silent)))
        self._add_jobs(jobs_of(answer['rows'], answer['columns'], host_of_node))
        self._construct(sorted(set(host_of_node.values())))

    def _construct(self, hosts):
        """compose, groups and keyed_groups over each host's variables (Constructable), as the other
        inventory plugins do."""
        strict = self.get_option("strict")
        for name in hosts:
            host = self.inventory.get_host(name)
            if host is None:
                continue
            variables = self._host_vars(host)
            self._set_composite_vars(self.get_option('compose'), variables, name, strict=strict)
            variables = self._host_vars(host)
            self._add_host_to_composed_groups(self.get_option('groups'), variables, name, strict=strict)
            self._add_host_to_keyed_groups(self.get_option('keyed_groups'), variables, name, strict=strict)

    def _add_jobs(self, jobs):
        self.inventory.add_group(JOBS_GROUP)
        per_host = {}
        for identity, job in sorted(jobs.items()):
            group = self.inventory.add_group(self.get_option('group_prefix') + identity)
            self.inventory.add_child(JOBS_GROUP, group)
            ranks = sorted(rank for entry in job['hosts'].values() for rank in entry['ranks'])
            self.inventory.set_variable(group, 'straggler_job', dict(
                id=identity, master_addr=job['master_addr'], master_port=job['master_port'],
                world_size=job['world_size'], ranks=ranks,
                complete=job['world_size'] is not None and sorted(set(ranks)) == list(range(job['world_size']))))
            for host, entry in sorted(job['hosts'].items()):
                self.inventory.add_host(host, group=group)
                per_host.setdefault(host, {})[identity] = dict(entry, world_size=job['world_size'])
        for host, host_jobs in per_host.items():
            self.inventory.set_variable(host, 'straggler_jobs', host_jobs)
            self.inventory.set_variable(host, 'straggler_ranks',
                                        sorted(set(rank for entry in host_jobs.values() for rank in entry['ranks'])))
