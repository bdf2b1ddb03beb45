# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""export: a synthetic cluster exported as a Perfetto timeline by the core; options passed
through; missing inputs; check mode."""

from __future__ import annotations

import json

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.action.export import ActionModule, export_arguments
from ansible_collections.straggler.fleet.tests.unit.helpers import make_node_db


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    from straggler_lab import synth
    path = tmp_path_factory.mktemp('export') / 'cluster.db'
    synth.write_cluster(str(path), synth.SynthSpec(nodes=3, events=3000, scenario='io_cpu', straggler=1))
    return str(path)


def trace_nodes(path):
    events = json.loads(path.read_text())['traceEvents']
    names = set(event['args']['name'] for event in events if event.get('ph') == 'M' and event.get('name') == 'process_name')
    return events, names


def test_the_cluster_becomes_a_perfetto_trace(action_factory, cluster, tmp_path):
    dest = tmp_path / 'out' / 'trace.json'
    result = action_factory(ActionModule, dict(db=cluster, dest=str(dest))).run(task_vars={})
    assert result['changed'] is True and result['size'] == dest.stat().st_size
    events, names = trace_nodes(dest)
    assert len(names) == 3 and all(any(node in name for name in names) for node in ('gpu-node-01', 'gpu-node-02', 'gpu-node-03'))
    assert any(event.get('ph') == 'X' for event in events)


def test_node_and_time_cuts_reach_the_core(action_factory, cluster, tmp_path):
    whole, cut = tmp_path / 'whole.json', tmp_path / 'cut.json'
    action_factory(ActionModule, dict(db=cluster, dest=str(whole), node=['gpu-node-02'], findings=False)).run(task_vars={})
    action_factory(ActionModule, dict(db=cluster, dest=str(cut), node=['gpu-node-02'], findings=False,
                                      until='0.5')).run(task_vars={})
    whole_events, names = trace_nodes(whole)
    cut_events, dummy = trace_nodes(cut)
    assert len(names) == 1 and 'gpu-node-02' in names.pop()
    slices = [event for event in whole_events if event.get('ph') == 'X']
    assert 0 < len([event for event in cut_events if event.get('ph') == 'X']) < len(slices)


def test_an_unknown_node_fails_with_the_cores_message(action_factory, cluster, tmp_path):
    with pytest.raises(AnsibleActionFail, match='not in'):
        action_factory(ActionModule, dict(db=cluster, dest=str(tmp_path / 't.json'), node=['nope'])).run(task_vars={})


def test_only_the_given_cuts_reach_the_core():
    assert export_arguments(dict(since=None, until='', node=None)) == {}
    assert export_arguments(dict(since=5, until=9, node=['a'], findings=False)) == dict(since=5, until=9, nodes=['a'], findings=False)


def test_a_missing_database_fails_and_is_skipped_in_check_mode(action_factory, tmp_path):
    args = dict(db=str(tmp_path / 'none.db'), dest=str(tmp_path / 'trace.json'))
    with pytest.raises(AnsibleActionFail, match='no such database'):
        action_factory(ActionModule, args).run(task_vars={})
    result = action_factory(ActionModule, args, check_mode=True).run(task_vars={})
    assert result['skipped'] is True


def test_check_mode_writes_nothing(action_factory, tmp_path):
    db = make_node_db(tmp_path / 'cluster.db')
    dest = tmp_path / 'trace.json'
    result = action_factory(ActionModule, dict(db=db, dest=str(dest)), check_mode=True).run(task_vars={})
    assert result['changed'] is True and not dest.exists()


def test_a_pftrace_dest_gets_the_native_format_and_the_cut_is_reported(action_factory, cluster, tmp_path):
    dest = tmp_path / 'trace.pftrace'
    result = action_factory(ActionModule, dict(db=cluster, dest=str(dest), around_findings=0.5)).run(task_vars={})
    assert result['format'] == 'perfetto' and result['changed'] is True
    head = dest.read_bytes()[:64]
    assert head[:1] == b'\x0a' and b'traceEvents' not in head         # a protobuf Trace (field 1: packets), not JSON
    assert 'more than 0.5 s from a finding' in result['msg'] and result['summary']['skipped']
    assert export_arguments(dict(format='json', around_findings=2.0)) == dict(fmt='json', around_findings=2.0)


def test_only_perfetto_and_json_are_offered(action_factory, tmp_path):
    with pytest.raises(AnsibleActionFail, match='format'):
        action_factory(ActionModule, dict(db='x', dest='y', format='csv')).run(task_vars={})
