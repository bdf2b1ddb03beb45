# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_query: the core fleet client against real agent API servers on loopback (plain HTTP,
--no-tls, loopback only), one of them dead; results, node statuses, offsets, failure rules."""

from __future__ import annotations

import json
import socket

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.action.fleet_query import ActionModule, fleet_result_dict
from ansible_collections.straggler.fleet.plugins.plugin_utils.controller import default_nodes
from ansible_collections.straggler.fleet.tests.unit.helpers import make_node_db


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.fixture
def agents(tmp_path):
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    handles = []
    try:
        for name in ('node-a', 'node-b'):
            db = make_node_db(tmp_path / ('%s.db' % name), node=name)
            handles.append(start_background(db, node=name, listen='127.0.0.1:0', tls=TLSOptions(no_tls=True)))
        yield ['127.0.0.1:%d' % handle.port for handle in handles]
    finally:
        for handle in handles:
            handle.stop()


def run(action_factory, args, task_vars=None, check_mode=False):
    return action_factory(ActionModule, args, check_mode=check_mode).run(task_vars=task_vars or {})


def test_every_node_answers_in_one_table_with_offsets(action_factory, agents, tmp_path):
    dest = tmp_path / 'out' / 'fleet.json'
    result = run(action_factory, dict(sql='SELECT count(*) AS events FROM events', nodes=agents, no_tls=True,
                                      dest=str(dest), clock_samples=3))
    assert not result.get('failed'), result
    assert result['columns'] == ['node', 'events']
    assert sorted(result['rows']) == [['node-a', 3], ['node-b', 3]]
    assert [entry['status'] for entry in result['nodes']] == ['ok', 'ok']
    assert set(result['offsets']) == {'node-a', 'node-b'}
    assert all(abs(value['offset_ns']) <= value['uncertainty_ns'] + 1_000_000 for value in result['offsets'].values())
    assert result['failed_nodes'] == [] and result['exit_code'] == 0
    assert result['changed'] is True
    written = json.loads(dest.read_text())
    assert written['sql'].startswith('SELECT count(*)') and sorted(written['rows']) == sorted(result['rows'])


def test_a_dead_node_is_listed_and_the_task_still_succeeds(action_factory, agents):
    dead = '127.0.0.1:%d' % free_port()
    result = run(action_factory, dict(sql='SELECT 1 AS one', nodes=agents + [dead], no_tls=True, timeout=2, deadline=5))
    assert not result.get('failed'), result
    assert result['failed_nodes'] == [dead]
    statuses = dict((entry['address'], entry) for entry in result['nodes'])
    assert statuses[dead]['status'] in ('refused', 'unreachable') and statuses[dead]['message']
    assert result['exit_code'] == 3
    assert 'failed: %s' % dead in result['msg']


def test_fail_on_partial_fails_the_task(action_factory, agents):
    dead = '127.0.0.1:%d' % free_port()
    result = run(action_factory, dict(sql='SELECT 1', nodes=agents + [dead], no_tls=True, timeout=2, deadline=5,
                                      fail_on_partial=True))
    assert result['failed'] is True and result['msg'].startswith('fail_on_partial')


def test_no_node_answering_fails_the_task(action_factory):
    dead = '127.0.0.1:%d' % free_port()
    result = run(action_factory, dict(sql='SELECT 1', nodes=[dead], no_tls=True, timeout=2, deadline=5))
    assert result['failed'] is True and result['msg'].startswith('no node answered')


def test_sql_error_is_a_node_status(action_factory, agents):
    result = run(action_factory, dict(sql='DELETE FROM events', nodes=agents, no_tls=True))
    assert result['failed'] is True
    assert set(entry['status'] for entry in result['nodes']) == {'sql-error'}
    assert 'read-only' in result['nodes'][0]['message']


def test_nodes_default_to_the_play_hosts_at_ansible_host_and_the_cores_port():
    from straggler.defaults import AGENT_PORT
    task_vars = dict(hostvars=dict(a=dict(ansible_host='10.0.0.1'), b={}, c=dict(ansible_host='fd00::5')))
    nodes, host_of_address = default_nodes(task_vars, ['a', 'b', 'c'])
    assert nodes == ['10.0.0.1:%d' % AGENT_PORT, 'b:%d' % AGENT_PORT, '[fd00::5]:%d' % AGENT_PORT]
    assert host_of_address['b:%d' % AGENT_PORT] == 'b'


def test_a_hosts_straggler_agent_port_wins_over_the_port_option():
    """The core's one rule (straggler.fleet.inventory.agent_address), the same as `straggler fleet --nodes INVENTORY`."""
    from straggler.fleet.inventory import agent_address
    hostvars = dict(a=dict(ansible_host='10.0.0.1', straggler_agent_port=9000), b=dict(straggler_agent_port='9001'), c={})
    nodes, dummy = default_nodes(dict(hostvars=hostvars), ['a', 'b', 'c'], 7500)
    assert nodes == ['10.0.0.1:9000', 'b:9001', 'c:7500']
    assert nodes == [agent_address(host, hostvars[host], 7500) for host in ('a', 'b', 'c')]


def test_a_bad_straggler_agent_port_fails_the_task(action_factory):
    task_vars = dict(hostvars=dict(a=dict(straggler_agent_port='http')), ansible_play_hosts_all=['a'])
    with pytest.raises(AnsibleActionFail, match='straggler_agent_port'):
        run(action_factory, dict(sql='SELECT 1', no_tls=True), task_vars=task_vars)


def test_the_port_variable_reaches_the_agent(action_factory, agents):
    port = int(agents[1].rsplit(':', 1)[1])
    task_vars = dict(hostvars=dict(gpu2=dict(ansible_host='127.0.0.1', straggler_agent_port=port)),
                     ansible_play_hosts_all=['gpu2'])
    result = run(action_factory, dict(sql='SELECT 1 AS one', port=1, no_tls=True, clock_samples=0), task_vars=task_vars)
    assert result['nodes'][0]['node'] == 'node-b' and result['nodes'][0]['host'] == 'gpu2'


def test_play_hosts_map_back_to_inventory_names(action_factory, agents):
    port = int(agents[0].rsplit(':', 1)[1])
    task_vars = dict(hostvars=dict(gpu1=dict(ansible_host='127.0.0.1')), ansible_play_hosts_all=['gpu1'])
    result = run(action_factory, dict(sql='SELECT 1 AS one', port=port, no_tls=True), task_vars=task_vars)
    assert result['nodes'][0]['host'] == 'gpu1' and result['nodes'][0]['node'] == 'node-a'


def test_check_mode_queries_but_writes_nothing(action_factory, agents, tmp_path):
    dest = tmp_path / 'fleet.json'
    result = run(action_factory, dict(sql='SELECT 1 AS one', nodes=agents, no_tls=True, dest=str(dest)), check_mode=True)
    assert result['row_count'] == 2 and result['changed'] is True and not dest.exists()


def test_bad_arguments_are_refused(action_factory):
    with pytest.raises(AnsibleActionFail, match='timeout'):
        run(action_factory, dict(sql='SELECT 1', nodes=['x:1'], timeout=0))
    with pytest.raises(AnsibleActionFail, match='no nodes'):
        run(action_factory, dict(sql='SELECT 1'), task_vars=dict(ansible_play_hosts_all=[]))
    with pytest.raises(AnsibleActionFail, match='mutually exclusive'):
        run(action_factory, dict(sql='SELECT 1', nodes=['x:1'], hosts=['x']))


def test_result_translation_keeps_tuple_offsets_and_statuses():
    from straggler.fleet.client import FleetResult, NodeStatus
    fleet = FleetResult(columns=['node', 'n'], rows=[['a', 1]],
                        nodes=[NodeStatus(address='h1:7433', node='a', status='ok', row_count=1, offset_ns=5, uncertainty_ns=9),
                               NodeStatus(address='h2:7433', status='timeout', message='no answer')],
                        offsets={'a': (5, 9)})
    result = fleet_result_dict(fleet, {'h1:7433': 'gpu1', 'h2:7433': 'gpu2'})
    assert result['offsets'] == {'a': dict(offset_ns=5, uncertainty_ns=9, flagged=False)}
    assert result['failed_nodes'] == ['gpu2'] and result['exit_code'] == 3
    assert result['nodes'][1]['status'] == 'timeout' and result['nodes'][1]['host'] == 'gpu2'
    # the core's rule of which statuses count as answered (NodeStatus.answered), for the playbooks
    assert [entry['answered'] for entry in result['nodes']] == [True, False]
    assert result['row_count'] == 1 and result['rows'] == [['a', 1]]


def test_mutual_tls_with_the_given_certificates(action_factory, tmp_path):
    from straggler import pki
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    ca_dir = str(tmp_path / 'pki')
    pki.init_ca(ca_dir)
    pki.issue(ca_dir, 'agent', ['127.0.0.1'], kind='server')
    pki.issue(ca_dir, 'controller', [], kind='client')
    db = make_node_db(tmp_path / 'node.db', node='node-tls')
    server_tls = TLSOptions(ca=ca_dir + '/ca.crt', cert=ca_dir + '/agent.crt', key=ca_dir + '/agent.key')
    handle = start_background(db, node='node-tls', listen='127.0.0.1:0', tls=server_tls)
    try:
        node = '127.0.0.1:%d' % handle.port
        good = run(action_factory, dict(sql='SELECT count(*) AS n FROM events', nodes=[node], ca=ca_dir + '/ca.crt',
                                        cert=ca_dir + '/controller.crt', key=ca_dir + '/controller.key'))
        # the server's own certificate is no client certificate: the agent refuses it
        wrong = run(action_factory, dict(sql='SELECT 1', nodes=[node], ca=ca_dir + '/ca.crt',
                                         cert=ca_dir + '/agent.crt', key=ca_dir + '/agent.key', timeout=3, deadline=5))
        plain = run(action_factory, dict(sql='SELECT 1', nodes=[node], no_tls=True, timeout=3, deadline=5))
    finally:
        handle.stop()
    assert not good.get('failed'), good
    assert good['rows'] == [['node-tls', 3]] and good['nodes'][0]['status'] == 'ok'
    assert wrong['failed'] is True and wrong['nodes'][0]['status'] == 'tls-error', wrong['nodes']
    assert plain['failed'] is True and plain['nodes'][0]['status'] != 'ok'
