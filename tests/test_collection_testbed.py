"""straggler.fleet over real SSH on the multi-host test bed (four live hosts, one dead): the query
module on every host in parallel with the dead host reported, clock offsets measured over the SSH
connections, each host's database fetched with collect (and its temporary snapshot removed on the
host), merged with the measured offsets and explained.

Each host gets a synthetic node database (one node straggles) in its private /var/tmp, so this
test does not touch the agent's own /var/lib/straggler that the playbook tests deploy on the same
test bed. The hosts run Debian's /usr/bin/python3, which cannot import straggler: the modules go
through the agent CLI, here the repository .venv's (visible inside the hosts' namespaces).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
STRAGGLER_BIN = VENV_BIN / "straggler"
HOST_DIR = "/var/tmp/straggler-collection-test"   # private to each test-bed host

PLAYBOOK = """
- name: every host over SSH
  hosts: gpu
  gather_facts: false
  tasks:
    - name: events per node
      straggler.fleet.query:
        sql: SELECT count(*) AS events FROM events
        db: {host_dir}/node.db
        straggler_bin: {bin}
      register: straggler_query
      ignore_unreachable: true

    - name: one table
      straggler.fleet.aggregate:
        dest: "{{{{ out }}}}/events.json"

    - name: clock offsets over the SSH connection
      straggler.fleet.clock_facts:
        samples: 6

    - name: fetch the databases
      straggler.fleet.collect:
        dest: "{{{{ out }}}}/collected"
        db: {host_dir}/node.db
        straggler_bin: {bin}
        snapshot_dir: {host_dir}/tmp

- name: on the controller
  hosts: localhost
  gather_facts: false
  tasks:
    - name: merge with the measured offsets
      straggler.fleet.merge:
        src: "{{{{ out }}}}/collected"
        dest: "{{{{ out }}}}/cluster.db"
        offsets_from_hosts: "{{{{ groups['live'] }}}}"
      register: straggler_merge

    - name: explain
      straggler.fleet.explain:
        db: "{{{{ out }}}}/cluster.db"
        junit: "{{{{ out }}}}/junit.xml"
      register: straggler_report

    - name: keep what the tasks returned
      ansible.builtin.copy:
        dest: "{{{{ out }}}}/results.json"
        content: >-
          {{{{ dict(merge=straggler_merge, report=straggler_report,
                    clock=dict(groups['live'] | zip(groups['live'] | map('extract', hostvars, ['ansible_facts', 'straggler_clock'])))) | to_json }}}}
"""


def shown(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def test_collection_over_ssh_on_the_test_bed(testbed, tmp_path):
    from straggler_lab import synth
    live = sorted(testbed.hosts)
    spec = synth.SynthSpec(nodes=len(live), events=8000, scenario="io_cpu", straggler=2, prefix=testbed.prefix)
    assert [spec.node_name(i) for i in range(len(live))] == live
    steps = synth.plan_steps(spec)
    for index, name in enumerate(live):
        host_dir = testbed.host_dir(name) / HOST_DIR.lstrip("/")
        (host_dir / "tmp").mkdir(parents=True, exist_ok=True)
        synth.write_node(str(host_dir / "node.db"), spec, index, steps)

    out = tmp_path / "out"
    out.mkdir()
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(PLAYBOOK.format(host_dir=HOST_DIR, bin=STRAGGLER_BIN))
    env = testbed.ansible_env()
    env.update(ANSIBLE_CALLBACKS_ENABLED="straggler.fleet.summary",
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"))
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), str(playbook), "-e", f"out={out}"],
                          env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 4, shown(proc)   # the dead host was unreachable; everything else ran

    dead = sorted(testbed.dead)
    table = json.loads((out / "events.json").read_text())
    statuses = {entry["host"]: entry["status"] for entry in table["hosts"]}
    assert statuses == {**{name: "ok" for name in live}, **{name: "unreachable" for name in dead}}, table["hosts"]
    assert [row[0] for row in table["rows"]] == live and table["missing"] == dead
    assert f"missing hosts: {', '.join(dead)}" in proc.stdout   # the summary callback's table

    results = json.loads((out / "results.json").read_text())
    for name in live:
        clock = results["clock"][name]
        assert clock["method"] == "ssh" and clock["probe"] == "command" and clock["samples"] == 6, clock
        # the hosts share this machine's clock: the true offset is 0 and must lie within the reported bound
        assert abs(clock["offset_ns"]) <= clock["uncertainty_ns"], clock
        assert clock["uncertainty_ns"] == (clock["rtt_ns"] + 1) // 2

    assert sorted(os.listdir(out / "collected")) == [f"{name}.db" for name in live]
    for name in live:
        left = os.listdir(testbed.host_dir(name) / HOST_DIR.lstrip("/") / "tmp")
        assert left == [], f"{name}: collect left {left} behind"

    assert sorted(results["merge"]["nodes"]) == live
    assert all(results["merge"]["summary"]["clock_alignment"][name]["source"] == "given" for name in live)
    assert results["report"]["straggler"] == spec.straggler_name() == live[2]
    assert ElementTree.parse(str(out / "junit.xml")).getroot().get("failures") == "1"
