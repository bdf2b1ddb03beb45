"""The Ansible user's path on the multi-host test bed, from a fresh controller: the collection built,
installed with `ansible-galaxy collection install` into a venv that had ansible-core alone, then
`pip install -r <collection>/requirements.txt` (conftest's installed_collection), and the playbooks run
as `straggler.fleet.NAME` from a directory outside the repository, typed as users type them (short
`-e` names, SQL with spaces and '='). Real SSH, real agents with eBPF, real mutual TLS.

What a user would notice: check mode on a set-up controller leaves its directories byte-identical
(a fresh one: tests/test_playbooks_controllers.py); `-e target=live` deploys the live hosts; `-e sql="..."` runs that SQL on
each; a second controller that brings the same CA (and nothing else) changes nothing on the hosts,
whose agents keep running; the inventory plugin straggler.fleet.jobs groups the hosts by the job
running on them (a two-rank job on the stand-in CUDA libraries), and `-l job_<id>` targets exactly
those nodes. The module's tests run in order and share one deployment; the last one removes it.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_playbooks import LIVE, PLAYBOOK_TIMEOUT_S, WORK_ENV, agent_status, collection_work, parse_recap

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(2400)]
SQL = "SELECT node, count(*) AS n FROM probes WHERE 1=1 AND node = node GROUP BY node"
JOB_PORT = 29517


@pytest.fixture(scope="module")
def user(tmp_path_factory, testbed, installed_collection):
    from straggler_lab.standin import build_standin
    root = collection_work(tmp_path_factory.mktemp("user"), testbed, installed_collection)
    standin = root / "standin"
    build_standin(standin)          # the job's stand-in CUDA/NCCL, visible from the hosts (under /tmp)
    return root


def controller_vars(work: Path, pki: str = "pki", **extra) -> list:
    data = {"straggler_pki_dir": str(work / pki), "straggler_agent_wheel_cache": str(work / "wheels"),
            "straggler_results_dir": str(work / "results"), "straggler_agent_scope": "netns",
            "straggler_agent_start_timeout": 240,
            "straggler_agent_cuda_libs": [str(work / "standin" / lib) for lib in
                                          ("libcuda.so.1", "libcudart.so.12", "libnccl.so.2")]}
    data.update(extra)
    return ["-e", json.dumps(data)]


def ansible(testbed, work: Path, tool: str, *args: str):
    env, user = WORK_ENV[str(work)]
    argv = [str(user["venv"] / "bin" / tool), "-i", str(testbed.inventory), *map(str, args)]
    proc = subprocess.run(argv, cwd=user["root"], env=env, capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    logs = work / "logs"
    (logs / f"{len(list(logs.iterdir())):02d}-{tool}.log").write_text(" ".join(argv) + "\n" + proc.stdout + proc.stderr)
    return proc


def shown(proc) -> str:
    return f"$ {' '.join(proc.args)}\nexit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"


def snapshot(*roots: Path) -> dict:
    found = {}
    for root in roots:
        for path in sorted([root, *root.rglob("*")]) if root.exists() else []:
            st = path.lstat()
            found[str(path)] = (st.st_mode, st.st_ino,
                                hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None)
    return found


def host_tls(testbed) -> dict:
    """Each live host's TLS files: name -> {file: (inode, sha256)}."""
    script = "cd /etc/straggler/tls && for f in ca.crt crl.pem node.crt node.key; do echo $f $(stat -c %i $f) " \
             "$(sha256sum < $f | cut -c1-64); done"
    return {name: testbed.exec(name, ["sh", "-c", script], timeout=60).stdout for name in LIVE}


def host_side_changes(stdout: str) -> list:
    """The 'changed: [host]' lines of tasks that ran on a host (not delegated to the controller)."""
    return [line for line in stdout.splitlines() if line.startswith("changed: [") and "-> localhost" not in line]


@pytest.fixture(scope="module")
def deployed(testbed, user):
    for name in LIVE:  # a fresh start even if an earlier test file deployed agents here
        testbed.exec(name, ["sh", "-c", "[ -x /opt/straggler/bin/straggler-agentctl ] && "
                                        "/usr/bin/python3 /opt/straggler/bin/straggler-agentctl stop; "
                                        "rm -rf /opt/straggler/venv /etc/straggler/agent.yml /etc/straggler/tls"],
                     timeout=60)
    # (check mode on a fresh controller is tests/test_playbooks_controllers.py's, on this machine: cheaper)
    first = ansible(testbed, user, "ansible-playbook", "straggler.fleet.trace", "-e", "target=live", *controller_vars(user))
    return dict(first=first)


def test_trace_with_the_short_target_deploys_the_live_hosts(deployed, testbed):
    first = deployed["first"]
    assert first.returncode == 0, shown(first)
    assert "[WARNING]" not in first.stdout + first.stderr, shown(first)
    for name in LIVE:
        status = agent_status(testbed, name)
        assert status.get("running"), (name, status)


def test_check_mode_on_the_set_up_controller_leaves_its_directories_byte_identical(deployed, testbed, user):
    controller = [user / "pki", user / "wheels", user / "results"]
    before = snapshot(*controller)
    assert before, "the deployment made the fleet CA"
    proc = ansible(testbed, user, "ansible-playbook", "straggler.fleet.trace", "--check", "-e", "target=live",
                   *controller_vars(user))
    assert proc.returncode == 0, shown(proc)
    assert snapshot(*controller) == before
    assert host_side_changes(proc.stdout) == [], shown(proc)       # nothing would change: it is all in place


def test_fleet_query_as_typed_runs_the_sql_on_every_live_host(deployed, testbed, user):
    proc = ansible(testbed, user, "ansible-playbook", "straggler.fleet.fleet_query", "-e", f"sql={SQL}",
                   "-e", "target=live", "-e", f"straggler_results_dir={user / 'results'}")
    assert proc.returncode == 0, shown(proc)
    path = Path(re.search(r"rows from \d+ of \d+ hosts in (\S+\.json)", proc.stdout).group(1))
    results = json.loads(path.read_text())
    assert results["sql"] == SQL and results["columns"] == ["node", "n"], results
    assert sorted(row[0] for row in results["rows"]) == LIVE and all(row[1] > 0 for row in results["rows"]), results
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_second_controller_with_the_same_ca_changes_nothing_on_the_hosts(deployed, testbed, user):
    tls_before = host_tls(testbed)
    pids = {name: agent_status(testbed, name)["agent_pid"] for name in LIVE}
    second = user / "pki-second-controller"
    proc = ansible(testbed, user, "ansible-playbook", "straggler.fleet.trace", "-e", "target=live",
                   *controller_vars(user, pki="pki-second-controller",
                                    straggler_pki_ca_cert_file=str(user / "pki" / "ca.crt"),
                                    straggler_pki_ca_key_file=str(user / "pki" / "ca.key")))
    assert proc.returncode == 0, shown(proc)
    assert host_side_changes(proc.stdout) == [], shown(proc)
    assert host_tls(testbed) == tls_before
    assert {name: agent_status(testbed, name)["agent_pid"] for name in LIVE} == pids       # no restart
    assert (second / "ca.crt").read_bytes() == (user / "pki" / "ca.crt").read_bytes()
    assert (second / "controller.crt").exists()


def test_the_jobs_inventory_groups_the_hosts_running_a_job_and_limit_targets_them(deployed, testbed, user):
    hosts = LIVE[:2]
    root = f"{testbed.hosts[hosts[0]]}:{JOB_PORT}"
    stop = user / "job" / "STOP"
    stop.parent.mkdir()
    ranks = [testbed.popen(name, [sys.executable, "-m", "straggler_lab.demo.syncjob", "--rank", str(rank), "--world", "2",
                                  "--root", root, "--standin-dir", str(user / "standin"), "--seconds", "300",
                                  "--stop-file", str(stop), "--log", str(user / "job" / f"steps-{rank}.csv")],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
             for rank, name in enumerate(hosts)]
    source = user / "jobs.straggler.yml"
    source.write_text(f"plugin: straggler.fleet.jobs\ngroup: gpu\npki_dir: {user / 'pki'}\ntimeout: 5\n")
    job = "job_" + re.sub(r"[^A-Za-z0-9]", "_", root)
    try:
        deadline = time.monotonic() + 180                  # the agents record the ranks once they trace their calls
        while True:
            proc = ansible(testbed, user, "ansible-inventory", "-i", source, "--list")
            assert proc.returncode == 0, shown(proc)
            data = json.loads(proc.stdout)
            if job in data or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert sorted(data.get(job, {}).get("hosts", [])) == hosts, shown(proc)
        assert "gpu-node-dead" in proc.stderr and "did not answer" in proc.stderr, shown(proc)
        ranks_of = {name: data["_meta"]["hostvars"][name].get("straggler_ranks") for name in LIVE}
        assert ranks_of == {hosts[0]: [0], hosts[1]: [1], LIVE[2]: None, LIVE[3]: None}, ranks_of

        proc = ansible(testbed, user, "ansible-playbook", "-i", source, "straggler.fleet.fleet_query", "-l", job,
                       "-e", "sql=SELECT node, count(*) AS n FROM processes WHERE rank IS NOT NULL GROUP BY node",
                       "-e", f"straggler_results_dir={user / 'results'}")
        assert proc.returncode == 0, shown(proc)
        assert sorted(parse_recap(proc.stdout)) == hosts, shown(proc)
    finally:
        stop.write_text("stop\n")
        for popen in ranks:
            try:
                popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=30)


def test_absent_removes_the_agents(deployed, testbed, user):
    proc = ansible(testbed, user, "ansible-playbook", "straggler.fleet.trace", "-e", "target=live",
                   *controller_vars(user, straggler_agent_state="absent", straggler_agent_remove_data=True))
    assert proc.returncode == 0, shown(proc)
    for name in LIVE:
        assert testbed.exec(name, ["test", "-e", "/opt/straggler/venv"]).returncode != 0
