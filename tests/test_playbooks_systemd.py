"""The agent role's systemd path, on a test-bed host that boots real systemd (systemd-nspawn from a
cached Debian root file system): trace.yml installs the hardened unit, systemd runs it, and the
API answers over mutual TLS 1.3; straggler_agent_state=absent removes the unit.

A labelled stand-in: systemd-nspawn drops the BPF capabilities and the container has no BCC, so
the unit here runs the agent's API half, `straggler serve` (over a database made from the real
schema), instead of `straggler trace`: the command line is the only thing replaced (through the
role's internal __straggler_agent_argv); the unit, its hardening, the venv, the offline wheel, the
TLS files and the restart handling are the role's own. BCC and kernel headers are not installed
(no package mirror inside), and the role's BCC check is turned off for the same reason.

Slower than tests/test_playbooks.py (the container boots); marked `systemd`.
"""
from __future__ import annotations

import sqlite3
import ssl
from pathlib import Path

import pytest

from test_playbooks import AGENT_PORT, collection_work, run_playbook, tls_handshake

pytestmark = pytest.mark.systemd

HOST = "gpu-node-systemd"
VENV = "/opt/straggler/venv"
DB = "/var/lib/straggler/straggler.db"


@pytest.fixture(scope="module")
def work(tmp_path_factory, systemd_testbed, installed_collection):
    return collection_work(tmp_path_factory.mktemp("playbooks-systemd"), systemd_testbed, installed_collection)


def serve_argv(name: str) -> list:
    return [f"{VENV}/bin/straggler", "serve", "--db", DB, "--node", name, "--listen", f"0.0.0.0:{AGENT_PORT}",
            "--ca", "/etc/straggler/tls/ca.crt", "--cert", "/etc/straggler/tls/node.crt",
            "--key", "/etc/straggler/tls/node.key"]


def put_store(bed, tmp_path: Path) -> None:
    """An empty store made with the real schema, where the agent would have written it."""
    from straggler.store import schema
    local = tmp_path / "store.db"
    with sqlite3.connect(local) as conn:
        schema.create(conn, node=HOST)
    bed.exec(HOST, ["sh", "-c", f"mkdir -p {Path(DB).parent} && cat > {DB}"], input=local.read_bytes(), text=False,
             check=True)


def systemctl_show(bed, *props: str) -> dict:
    out = bed.exec(HOST, ["systemctl", "show", "straggler-agent.service", "-p", ",".join(props)]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_role_runs_the_agent_as_a_hardened_systemd_unit(systemd_testbed, work, tmp_path):
    bed = systemd_testbed
    put_store(bed, tmp_path)
    stand_in = {"straggler_agent_install_packages": False, "straggler_agent_verify_bcc": False,
                "__straggler_agent_argv": serve_argv(HOST)}
    run = run_playbook(bed, work, "trace.yml", limit=HOST, **stand_in)
    assert run.rc == 0 and run.recap[HOST]["failed"] == 0, run.explain()

    state = systemctl_show(bed, "ActiveState", "SubState", "UnitFileState", "NRestarts", "ExecMainPID",
                           "CapabilityBoundingSet", "ProtectSystem", "StateDirectory", "Restart")
    assert state["ActiveState"] == "active" and state["SubState"] == "running", state
    assert state["UnitFileState"] == "enabled" and state["Restart"] == "on-failure", state
    assert state["ProtectSystem"] == "strict" and state["StateDirectory"] == "straggler", state
    assert "cap_sys_admin" in state["CapabilityBoundingSet"] and "cap_net_admin" not in state["CapabilityBoundingSet"]
    cmdline = bed.exec(HOST, ["cat", f"/proc/{state['ExecMainPID']}/cmdline"]).stdout.split("\0")
    assert cmdline[1:3] == [f"{VENV}/bin/straggler", "serve"] or cmdline[0:2] == [f"{VENV}/bin/straggler", "serve"], cmdline
    assert tls_handshake(bed.systemd_hosts[HOST], work, ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        tls_handshake(bed.systemd_hosts[HOST], work, ssl.TLSVersion.TLSv1_2)

    again = run_playbook(bed, work, "trace.yml", limit=HOST, **stand_in)
    assert again.rc == 0 and again.recap[HOST]["changed"] == 0, again.explain()
    assert systemctl_show(bed, "ExecMainPID")["ExecMainPID"] == state["ExecMainPID"], "restarted without a change"

    absent = run_playbook(bed, work, "trace.yml", limit=HOST, straggler_agent_state="absent", **stand_in)
    assert absent.rc == 0, absent.explain()
    gone = systemctl_show(bed, "LoadState", "ActiveState")
    assert gone["LoadState"] == "not-found" and gone["ActiveState"] == "inactive", gone
    for path in (VENV, "/etc/systemd/system/straggler-agent.service", "/etc/straggler/agent.yml", "/etc/straggler/tls"):
        assert bed.exec(HOST, ["test", "-e", path]).returncode != 0, f"{path} left behind"
