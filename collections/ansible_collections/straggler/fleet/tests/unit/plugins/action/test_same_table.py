# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One SQL, two paths, one table: over Ansible's connection (the query module on each host
through the agent CLI, then aggregate on the controller) and over HTTPS with mutual TLS
(fleet_query, the core's fleet client, against real agents on loopback) the same node databases
give the same columns and rows, also when one host's answer has other columns (a newer and an
older schema): both combine by the core's rule (straggler.fleet.combine), keep that host's rows
and say that its columns differ."""

from __future__ import annotations

import sqlite3

import pytest

from ansible_collections.straggler.fleet.plugins.action.aggregate import ActionModule as AggregateAction
from ansible_collections.straggler.fleet.plugins.action.fleet_query import ActionModule as FleetQueryAction
from ansible_collections.straggler.fleet.plugins.modules import query
from ansible_collections.straggler.fleet.tests.unit.helpers import make_node_db

NODES = ('node-a', 'node-b', 'node-c')
# a table whose columns differ between the nodes, as between agents of different versions
JOB_INFO = {
    'node-a': ('rank INTEGER, world INTEGER', [(0, 3)]),
    'node-b': ('rank INTEGER, world INTEGER, gpu TEXT', [(1, 3, 'H100'), (1, 3, 'H100-2')]),
    'node-c': ('world INTEGER, rank INTEGER', [(3, 2)]),
}
SQL_SAME = 'SELECT op, duration FROM events ORDER BY seq'
SQL_DIFFERENT = 'SELECT * FROM job_info ORDER BY rank'


@pytest.fixture(scope='module')
def fleet_dbs(tmp_path_factory):
    base = tmp_path_factory.mktemp('same-table')
    dbs = {}
    for name in NODES:
        dbs[name] = make_node_db(base / ('%s.db' % name), node=name)
        columns, rows = JOB_INFO[name]
        conn = sqlite3.connect(dbs[name])
        try:
            conn.execute('CREATE TABLE job_info (%s)' % columns)
            conn.executemany('INSERT INTO job_info VALUES (%s)' % ', '.join('?' * len(rows[0])), rows)
            conn.commit()
        finally:
            conn.close()
    return base, dbs


@pytest.fixture(scope='module')
def https_agents(fleet_dbs):
    """An agent per database on 127.0.0.1, mutual TLS with the fleet's certificates; yields
    (addresses in NODES order, the controller's TLS options as task arguments)."""
    from straggler import pki
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    base, dbs = fleet_dbs
    ca_dir = str(base / 'pki')
    pki.init_ca(ca_dir)
    pki.issue(ca_dir, 'agent', ['127.0.0.1'], kind='server')
    pki.issue(ca_dir, 'controller', [], kind='client')
    server_tls = TLSOptions(ca=ca_dir + '/ca.crt', cert=ca_dir + '/agent.crt', key=ca_dir + '/agent.key')
    handles = []
    try:
        for name in NODES:
            handles.append(start_background(dbs[name], node=name, listen='127.0.0.1:0', tls=server_tls))
        yield (['127.0.0.1:%d' % handle.port for handle in handles],
               dict(ca=ca_dir + '/ca.crt', cert=ca_dir + '/controller.crt', key=ca_dir + '/controller.key'))
    finally:
        for handle in handles:
            handle.stop()


def over_ssh(sql, dbs, run_module, straggler_bin, action_factory):
    """The query module on every host (each host's own database), then aggregate of the registered results."""
    hostvars = {}
    for name in NODES:
        code, registered = run_module(query.main, dict(sql=sql, db=dbs[name], straggler_bin=straggler_bin))
        assert code == 0, registered
        hostvars['host-' + name] = dict(straggler_query=registered, straggler_agent_node=name)   # as the agent role sets it
    task_vars = dict(hostvars=hostvars, ansible_play_hosts_all=list(hostvars), ansible_play_hosts=list(hostvars))
    return action_factory(AggregateAction, {}).run(task_vars=task_vars)


def over_https(sql, https_agents, action_factory):
    addresses, tls_args = https_agents
    return action_factory(FleetQueryAction, dict(sql=sql, nodes=addresses, clock_samples=0, **tls_args)).run(task_vars={})


@pytest.mark.parametrize('sql', [SQL_SAME, SQL_DIFFERENT], ids=['same-columns', 'one-host-has-other-columns'])
def test_the_same_sql_gives_the_same_table_over_ssh_and_https(sql, fleet_dbs, https_agents, run_module,
                                                              straggler_bin, action_factory):
    dummy, dbs = fleet_dbs
    ssh = over_ssh(sql, dbs, run_module, straggler_bin, action_factory)
    https = over_https(sql, https_agents, action_factory)
    assert not ssh.get('failed') and not https.get('failed'), (ssh, https)
    assert [entry['status'] for entry in https['nodes']] == ['ok'] * 3, https['nodes']
    assert ssh['missing'] == [] and https['failed_nodes'] == []
    assert ssh['columns'] == https['columns']
    assert ssh['rows'] == https['rows']
    ssh_notes = [entry['message'] for entry in ssh['hosts']]
    https_notes = [entry['message'] for entry in https['nodes']]
    if sql == SQL_SAME:
        assert ssh['columns'] == ['node', 'op', 'duration'] and len(ssh['rows']) == 9
        assert not any('columns differ' in note for note in ssh_notes + https_notes)
        return
    # the rule: node, then the union of the columns in first-seen order; a host's missing column is null
    assert ssh['columns'] == ['node', 'rank', 'world', 'gpu']
    assert ssh['rows'] == [['node-a', 0, 3, None], ['node-b', 1, 3, 'H100'], ['node-b', 1, 3, 'H100-2'],
                           ['node-c', 2, 3, None]]
    for notes in (ssh_notes, https_notes):
        assert 'columns differ' not in notes[0]
        assert 'columns differ: adds gpu' in notes[1]
        assert 'columns differ: same columns in another order' in notes[2]
