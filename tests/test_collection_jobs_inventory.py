"""The inventory plugin straggler.fleet.jobs against real agents' APIs on this machine: two `straggler serve`
over mutual TLS on loopback addresses, each serving a node database whose processes table holds the ranks
of the jobs its node runs (what the agent writes from torchrun's environment). What a user notices:
`ansible-inventory -i hosts.ini -i jobs.straggler.yml` groups the hosts by job with their ranks, a playbook
limited to one job's group runs on exactly its nodes, an agent that does not answer is named in a warning,
a node's single-node job (a loopback rendezvous) stays that node's own, and exited processes count only
when asked. The test bed runs it against agents tracing a real job (tests/test_playbooks.py)."""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
NODES = {"node-a": "127.0.0.21", "node-b": "127.0.0.22"}
# node -> processes rows: (pid, rank, local_rank, world_size, master_addr, master_port, exited)
PROCESSES = {
    "node-a": [(101, 0, 0, 4, "10.0.12.11", 29500, None), (102, 1, 1, 4, "10.0.12.11", 29500, None),
               (103, 0, 0, 1, "127.0.0.1", 29400, None), (104, 0, 0, 2, "10.0.12.11", 29600, 5)],
    "node-b": [(201, 2, 0, 4, "10.0.12.11", 29500, None), (202, 3, 1, 4, "10.0.12.11", 29500, None),
               (203, 0, 0, 1, "127.0.0.1", 29400, None), (204, 1, 0, 2, "10.0.12.11", 29600, 7)],
}


def free_port(address):
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def shown(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    from straggler import pki
    from straggler.store import schema
    base = tmp_path_factory.mktemp("jobs")
    pki_dir = base / "pki"
    pki.init_ca(str(pki_dir))
    pki.issue(str(pki_dir), "controller", [], kind="client", roles=["query"])
    servers, lines = [], ["[gpu]"]
    try:
        for node, address in NODES.items():
            pki.issue(str(pki_dir), node, [address], kind="server")
            db = base / f"{node}.db"
            with sqlite3.connect(db) as conn:
                schema.create(conn, node=node)
                conn.executemany("INSERT INTO processes(node, pid, comm, rank, local_rank, world_size, master_addr, "
                                 "master_port, first_seen, exited) VALUES (?, ?, 'python3', ?, ?, ?, ?, ?, 1, ?)",
                                 [(node, *row) for row in PROCESSES[node]])
            port = free_port(address)
            servers.append(subprocess.Popen(
                [str(VENV_BIN / "straggler"), "serve", "--db", str(db), "--listen", f"{address}:{port}",
                 "--ca", str(pki_dir / "ca.crt"), "--cert", str(pki_dir / f"{node}.crt"), "--key", str(pki_dir / f"{node}.key")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True))
            lines.append(f"{node} ansible_host={address} straggler_agent_port={port} ansible_connection=local")
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection((address, port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline and servers[-1].poll() is None, servers[-1].stderr.read()
                    time.sleep(0.2)
        # a host whose agent is gone: nothing listens on its port
        lines.append(f"node-c ansible_host=127.0.0.23 straggler_agent_port={free_port('127.0.0.23')} ansible_connection=local")
        (base / "hosts.ini").write_text("\n".join(lines) + "\n")
        (base / "jobs.straggler.yml").write_text(f"plugin: straggler.fleet.jobs\ngroup: gpu\npki_dir: {pki_dir}\ntimeout: 5\n")
        yield base
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=30)


def loaded(text):
    """ansible-inventory's JSON, the strings the agents sent (marked unsafe: never templated) as plain strings."""
    return json.loads(text, object_hook=lambda d: d.get("__ansible_unsafe", d) if len(d) == 1 else d)


def run(tool, *args, cwd):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    return subprocess.run([str(VENV_BIN / tool), *map(str, args)], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_hosts_are_grouped_by_the_jobs_their_agents_see_with_their_ranks(agents):
    proc = run("ansible-inventory", "-i", agents / "hosts.ini", "-i", agents / "jobs.straggler.yml", "--list", cwd=agents)
    assert proc.returncode == 0, shown(proc)
    data = loaded(proc.stdout)
    job = "job_10_0_12_11_29500"
    assert sorted(data["straggler_jobs"]["children"]) == [job, "job_node_a_127_0_0_1_29400", "job_node_b_127_0_0_1_29400"]
    assert sorted(data[job]["hosts"]) == ["node-a", "node-b"]
    hostvars = data["_meta"]["hostvars"]
    assert hostvars["node-a"]["straggler_ranks"] == [0, 1] and hostvars["node-b"]["straggler_ranks"] == [0, 2, 3]
    assert hostvars["node-b"]["straggler_jobs"]["10_0_12_11_29500"] == {"ranks": [2, 3], "local_ranks": [0, 1],
                                                                      "pids": [201, 202], "world_size": 4}
    assert "straggler_jobs" not in hostvars.get("node-c", {})
    assert "node-c" in proc.stderr and "did not answer" in proc.stderr, shown(proc)     # named in one warning
    assert "job_10_0_12_11_29600" not in data                                           # exited: not counted


def test_a_playbook_limited_to_a_job_runs_on_exactly_its_nodes_and_the_job_is_a_group_variable(agents):
    (agents / "show.yml").write_text(
        "- name: one job\n  hosts: all\n  gather_facts: false\n  tasks:\n    - name: say\n"
        "      ansible.builtin.debug:\n        msg: \"JOB RANKS {{ straggler_jobs['10_0_12_11_29500'].ranks | join(',') }}\"\n")
    proc = run("ansible-playbook", "-i", agents / "hosts.ini", "-i", agents / "jobs.straggler.yml", "show.yml",
               "-l", "job_10_0_12_11_29500", cwd=agents)
    assert proc.returncode == 0, shown(proc)
    assert "ok: [node-a]" in proc.stdout and "ok: [node-b]" in proc.stdout and "node-c" not in proc.stdout.split("PLAY [")[1]
    assert '"msg": "JOB RANKS 0,1"' in proc.stdout and '"msg": "JOB RANKS 2,3"' in proc.stdout, shown(proc)
    proc = run("ansible-inventory", "-i", agents / "hosts.ini", "-i", agents / "jobs.straggler.yml", "--list", "--export",
               cwd=agents)
    job = loaded(proc.stdout)["job_10_0_12_11_29500"]["vars"]["straggler_job"]
    assert job == {"id": "10_0_12_11_29500", "master_addr": "10.0.12.11", "master_port": 29500, "world_size": 4,
                   "ranks": [0, 1, 2, 3], "complete": True}, job


def test_exited_processes_count_when_asked_and_agents_by_address_name_their_hosts(agents):
    source = agents / "all.straggler.yml"
    source.write_text(f"plugin: straggler.fleet.jobs\ninclude_exited: true\npki_dir: {agents / 'pki'}\nnodes:\n"
                      + "".join(f"  - {line.split()[1].split('=')[1]}:{line.split()[2].split('=')[1]}\n"
                                for line in (agents / "hosts.ini").read_text().splitlines()[1:3]))
    proc = run("ansible-inventory", "-i", source, "--list", cwd=agents)
    assert proc.returncode == 0, shown(proc)
    data = loaded(proc.stdout)
    assert sorted(data["job_10_0_12_11_29600"]["hosts"]) == ["node-a", "node-b"]
    assert data["_meta"]["hostvars"]["node-a"]["ansible_host"] == NODES["node-a"]


def test_ports_from_host_vars_certificates_as_content_keyed_groups_and_a_cache(agents, tmp_path):
    """What the other inventory plugins do: the hosts' variables from host_vars/ (before, only the inventory
    file's own were read: every agent 'did not answer' on the default port), the certificates as PEM text
    (an AWX credential's environment variables), keyed_groups over the job variables, and a cache that a
    later run reads instead of asking the agents."""
    inventory = tmp_path / "inventory"
    (inventory / "host_vars").mkdir(parents=True)
    (inventory / "group_vars").mkdir()
    lines = ["[gpu]"]
    for line in (agents / "hosts.ini").read_text().splitlines()[1:3]:
        name, host, port = line.split()[:3]
        lines.append(f"{name} {host}")
        (inventory / "host_vars" / f"{name}.yml").write_text(f"{port.replace('=', ': ')}\n")
    (inventory / "group_vars" / "gpu.yml").write_text("ansible_connection: local\n")
    (inventory / "hosts.ini").write_text("\n".join(lines) + "\n")
    pki_dir = agents / "pki"
    source = tmp_path / "jobs.straggler.yml"
    source.write_text(f"plugin: straggler.fleet.jobs\ngroup: gpu\npki_dir: {tmp_path / 'no-pki-here'}\ntimeout: 5\n"
                      f"strict: true\nkeyed_groups:\n  - key: straggler_ranks | length | string\n    prefix: ranks\n"
                      f"cache: true\ncache_plugin: ansible.builtin.jsonfile\ncache_connection: {tmp_path / 'cache'}\n"
                      f"cache_timeout: 3600\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(TMPDIR=str(scratch), STRAGGLER_CA_CONTENT=(pki_dir / "ca.crt").read_text(),
               STRAGGLER_CERT_CONTENT=(pki_dir / "controller.crt").read_text(),
               STRAGGLER_KEY_CONTENT=(pki_dir / "controller.key").read_text())
    os.environ.update(env)
    try:
        proc = run("ansible-inventory", "-i", inventory, "-i", source, "--list", cwd=tmp_path)
    finally:
        for name in env:
            os.environ.pop(name)
    assert proc.returncode == 0 and "did not answer" not in proc.stderr, shown(proc)
    data = loaded(proc.stdout)
    assert sorted(data["job_10_0_12_11_29500"]["hosts"]) == ["node-a", "node-b"], shown(proc)
    assert data["ranks_2"]["hosts"] == ["node-a"] and data["ranks_3"]["hosts"] == ["node-b"], shown(proc)
    assert list((tmp_path / "cache").iterdir())
    assert not list(scratch.glob("straggler-jobs-*"))       # the key's file is gone
    # the cache answers the next run: no certificate at all now, and the same groups
    proc = run("ansible-inventory", "-i", inventory, "-i", source, "--list", cwd=tmp_path)
    assert proc.returncode == 0, shown(proc)
    assert sorted(loaded(proc.stdout)["job_10_0_12_11_29500"]["hosts"]) == ["node-a", "node-b"], shown(proc)
