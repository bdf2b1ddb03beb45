# -*- coding: utf-8 -*-
# Copyright: the straggler project
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""explain: the core's explain on synthetic jobs (one straggler, or none), the report files, and
failing the task for CI."""

from __future__ import annotations

import json
from xml.etree import ElementTree

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.straggler.fleet.plugins.action.explain import ActionModule, explain_options


def synthetic_cluster(path, scenario):
    from straggler_lab import synth
    synth.write_cluster(str(path), synth.SynthSpec(nodes=3, events=6000, scenario=scenario, straggler=1))
    return str(path)


@pytest.fixture(scope='module')
def straggling_cluster(tmp_path_factory):
    return synthetic_cluster(tmp_path_factory.mktemp('io') / 'cluster.db', 'io_cpu')


def run(action_factory, args, check_mode=False, task_vars=None):
    return action_factory(ActionModule, args, check_mode=check_mode).run(task_vars=task_vars or {})


def test_the_straggler_is_named_with_findings_and_files(action_factory, straggling_cluster, tmp_path):
    junit, markdown, dest = tmp_path / 'junit.xml', tmp_path / 'report.md', tmp_path / 'report.json'
    result = run(action_factory, dict(db=straggling_cluster, junit=str(junit), markdown=str(markdown), dest=str(dest)))
    assert not result.get('failed'), result
    assert result['straggler'] == 'gpu-node-02'
    assert result['msg'].startswith('straggler: gpu-node-02: %s (' % result['cause']['cause'])
    assert result['cause']['node'] == 'gpu-node-02' and result['cause']['share'] > 0
    assert result['findings'][0]['cause'] == 'straggler' and result['findings'][0]['sql']
    assert result['changed'] is True and sorted(result['written']) == sorted([str(dest), str(markdown), str(junit)])
    suite = ElementTree.parse(str(junit)).getroot()
    assert suite.get('failures') == '1'
    assert 'gpu-node-02' in markdown.read_text()
    assert json.loads(dest.read_text())['straggler'] == 'gpu-node-02'


def test_fail_on_straggler_fails_the_task_after_writing_the_junit(action_factory, straggling_cluster, tmp_path):
    junit = tmp_path / 'junit.xml'
    result = run(action_factory, dict(db=straggling_cluster, fail_on_straggler=True, junit=str(junit)))
    assert result['failed'] is True and result['straggler'] == 'gpu-node-02'
    assert junit.exists()


def test_a_clean_job_has_no_straggler_and_does_not_fail(action_factory, tmp_path):
    cluster = synthetic_cluster(tmp_path / 'clean.db', 'clean')
    result = run(action_factory, dict(db=cluster, fail_on_straggler=True))
    assert not result.get('failed'), result
    assert result['straggler'] is None and result['msg'] == 'no straggler found'
    assert result['changed'] is False


def test_check_mode_explains_but_writes_nothing(action_factory, straggling_cluster, tmp_path):
    junit = tmp_path / 'junit.xml'
    result = run(action_factory, dict(db=straggling_cluster, junit=str(junit)), check_mode=True)
    assert result['straggler'] == 'gpu-node-02' and result['changed'] is True and not junit.exists()


def test_live_explain_asks_the_agents(action_factory, tmp_path):
    from straggler_lab import synth
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(nodes=3, events=6000, scenario='io_cpu', straggler=1))
    handles = [start_background(entry['path'], listen='127.0.0.1:0', tls=TLSOptions(no_tls=True)) for entry in facts['files']]
    try:
        result = run(action_factory, dict(nodes=['127.0.0.1:%d' % handle.port for handle in handles], no_tls=True, timeout=30))
    finally:
        for handle in handles:
            handle.stop()
    assert result['straggler'] == 'gpu-node-02', result['msg']


def test_a_missing_database_and_conflicting_sources_are_refused(action_factory, tmp_path):
    with pytest.raises(AnsibleActionFail, match='no such database'):
        run(action_factory, dict(db=str(tmp_path / 'none.db')))
    with pytest.raises(AnsibleActionFail, match='mutually exclusive'):
        run(action_factory, dict(db='x.db', nodes=['h:1']))


def test_only_given_tuning_options_reach_the_core():
    assert explain_options(dict(min_gap=0.1, last=None, baseline_fraction=None, timeout=12.0)) == dict(min_gap=0.1, timeout_s=12.0)
    assert explain_options(dict(last=30.0)) == dict(recent_s=30.0)


def test_since_and_until_reach_the_core_and_a_bad_span_fails_in_one_line(action_factory, tmp_path):
    from straggler_lab import series
    cluster = str(tmp_path / 'two-faults.db')
    series.write_cluster(cluster, series.SeriesSpec(nodes=4, seconds=600, faults=[
        series.Fault(node=1, start_s=150, end_s=200, kind='cpu', slow=2.0),
        series.Fault(node=2, start_s=400, end_s=450, kind='host', slow=2.0)]))
    assert explain_options(dict(since='300', until='', last=None)) == dict(since='300')
    result = run(action_factory, dict(db=cluster, since='2026-01-01T00:05:00'))
    assert result['straggler'] == 'gpu-node-03' and result['report']['span']['since'].startswith('2026-01-01T00:05:00')
    result = run(action_factory, dict(db=cluster, until=300))
    assert result['straggler'] == 'gpu-node-02', result['msg']
    with pytest.raises(AnsibleActionFail, match=r"^explain failed: --since '400' is not before --until '300'") as failed:
        run(action_factory, dict(db=cluster, since='400', until='300'))
    assert '\n' not in str(failed.value)
