"""Foundation test for the systemd host: a test-bed host that boots real systemd (systemd-nspawn
from a cached Debian root file system) and is reachable over SSH with the test bed's key, so the
Ansible role's systemd path can be tested on a machine whose own PID 1 is not systemd.

Skipped, with the reason, where the root file system cannot be built (no Debian mirror).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from straggler_lab import testbed as testbed_lib

pytestmark = pytest.mark.systemd

REPO_ROOT = Path(__file__).resolve().parent.parent
ANSIBLE = REPO_ROOT / ".venv" / "bin" / "ansible"
HOST = "gpu-node-systemd"


def test_systemd_host_runs_systemd_as_pid1_over_ssh(systemd_testbed):
    ssh = systemd_testbed.ssh_argv(HOST, "ps -p 1 -o comm=; hostname; systemctl is-system-running --wait")
    proc = subprocess.run(ssh, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    pid1, hostname, state = (proc.stdout.splitlines() + ["", "", ""])[:3]
    assert pid1 == "systemd", proc.stdout + proc.stderr
    assert hostname == HOST
    failed = systemd_testbed.exec(HOST, ["systemctl", "--failed", "--no-legend", "--plain"]).stdout
    assert state == "running", f"system state {state!r}; failed units: {failed}"


def test_ansible_sees_systemd_as_service_manager_on_the_systemd_host_only(systemd_testbed):
    proc = subprocess.run([str(ANSIBLE), "all", "-m", "setup", "-a", "filter=ansible_service_mgr"],
                          env=systemd_testbed.ansible_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blocks = dict(re.findall(r"^(\S+) \| SUCCESS => \{(.*?)^\}", proc.stdout, re.M | re.S))
    assert '"ansible_service_mgr": "systemd"' in blocks[HOST], proc.stdout
    assert '"ansible_service_mgr": "systemd"' not in blocks["gpu-node-01"], proc.stdout
    unit = subprocess.run([str(ANSIBLE), HOST, "-m", "ansible.builtin.systemd", "-a", "name=ssh"],
                          env=systemd_testbed.ansible_env(), capture_output=True, text=True, timeout=120)
    assert unit.returncode == 0 and '"ActiveState": "active"' in unit.stdout, unit.stdout + unit.stderr


def test_systemd_host_down_leaves_no_container_cgroup_or_namespace(root_required):
    try:
        testbed_lib.ensure_systemd_rootfs()
    except testbed_lib.RootfsUnavailable as exc:
        pytest.skip(f"systemd host unavailable: {exc}")
    spare_id = 208
    bed = testbed_lib.up(hosts=0, dead=0, testbed_id=spare_id, systemd_hosts=["sd-teardown"])
    try:
        nspawn = bed.systemd_pids["sd-teardown"]["nspawn"]
        init = bed.systemd_pids["sd-teardown"]["init"]
        assert init and testbed_lib._pid_alive(init)
        assert testbed_lib._our_cgroups(spare_id), "expected the container's cgroups while it runs"
    finally:
        testbed_lib.down(spare_id)
    assert not testbed_lib._pid_alive(nspawn) and not testbed_lib._pid_alive(init)
    assert testbed_lib._our_cgroups(spare_id) == []
    assert testbed_lib._our_netns(spare_id) == [] and testbed_lib._our_links(spare_id) == []
    assert not bed.state_dir.exists()
