"""Any controller, on this machine alone (the role straggler_pki on a local host whose TLS directory is
a temporary one): a fleet set up by one controller, then a second controller that brings the same CA
(as variables, the key Vault-encrypted) and has nothing else changes nothing on the host; a brought
CA that is not usable fails in one line; check mode writes nothing on the controller (its directories
byte-identical) yet reports what a run would change. The same on the multi-host test bed with real
agents (the CA from files) is tests/test_playbooks.py."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
HOST_PYTHON = "/usr/bin/python3"


def shown(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def snapshot(*roots: Path) -> dict:
    """Every file and directory under roots: path -> (mode, sha256 of the content or None)."""
    found = {}
    for root in roots:
        if not root.exists():
            continue
        for path in sorted([root, *root.rglob("*")]):
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
            found[str(path)] = (st.st_mode, digest, st.st_ino)
    return found


def pki_playbook(tmp_path):
    """A playbook that runs the role straggler_pki on every host of its inventory."""
    playbook = tmp_path / "pki.yml"
    playbook.write_text(textwrap.dedent("""\
        - name: the fleet's TLS files
          hosts: all
          gather_facts: false
          tasks:
            - name: pki
              ansible.builtin.include_role:
                name: straggler_pki
        """))
    return playbook


@pytest.fixture
def pki_play(tmp_path):
    playbook = pki_playbook(tmp_path)

    def run(pki_dir: Path, *args: str, vault_password: Path | None = None, **extra):
        variables = dict(straggler_pki_dir=str(pki_dir), straggler_pki_tls_dir=str(tmp_path / "host" / "tls"),
                         straggler_pki_owner=str(os.getuid()), straggler_pki_group=str(os.getgid()),
                         ansible_python_interpreter=HOST_PYTHON, **extra)
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   PATH=f"{VENV_BIN}:{os.environ['PATH']}")
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", "gpu-node-01,", "-c", "local", str(playbook),
                "-e", json.dumps(variables), *args]
        if vault_password:
            argv += ["--vault-password-file", str(vault_password)]
        proc = subprocess.run(argv, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        return proc

    return run, tmp_path / "host" / "tls"


def recap_changed(proc) -> int:
    match = re.search(r"gpu-node-01\s*:\s*ok=\d+\s+changed=(\d+)", proc.stdout)
    assert match, shown(proc)
    return int(match.group(1))


def task_status(proc, task: str) -> str:
    match = re.search(r"TASK \[straggler_pki : " + re.escape(task) + r"[^\n]*\n(\w+):", proc.stdout)
    assert match, f"no task {task!r}\n" + shown(proc)
    return match.group(1)


def test_a_second_controller_with_the_same_ca_changes_nothing_on_the_host(pki_play, tmp_path):
    run, tls = pki_play
    first = tmp_path / "controller-a"
    proc = run(first)
    assert proc.returncode == 0, shown(proc)
    host_before = snapshot(tls)
    assert {Path(p).name for p in host_before} >= {"ca.crt", "crl.pem", "node.crt", "node.key"}

    # a second controller that brings the CA as variables, its key Vault-encrypted, and nothing else (the CA
    # from files, on real hosts with their agents: tests/test_playbooks.py)
    password = tmp_path / "vault-password"
    password.write_text("correct horse battery staple\n")
    encrypted = subprocess.run([str(VENV_BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password),
                                "--stdin-name", "straggler_pki_ca_key"], input=(first / "ca.key").read_text(),
                               capture_output=True, text=True, timeout=120)
    assert encrypted.returncode == 0, encrypted.stderr
    vars_file = tmp_path / "vault-vars.yml"
    vars_file.write_text(encrypted.stdout + "straggler_pki_ca_cert: |\n"
                         + textwrap.indent((first / "ca.crt").read_text(), "  "))
    second = tmp_path / "controller-b"
    proc = run(second, "-e", f"@{vars_file}", vault_password=password)
    assert proc.returncode == 0, shown(proc)
    assert task_status(proc, "Install the CA certificate") == "ok", shown(proc)
    assert snapshot(tls) == host_before, shown(proc)         # same bytes, same inodes: nothing rewritten
    assert (second / "ca.key").read_bytes() == (first / "ca.key").read_bytes()
    assert (second / "ca.crt").read_bytes() == (first / "ca.crt").read_bytes()
    assert (second / "gpu-node-01.crt").read_bytes() == (first / "gpu-node-01.crt").read_bytes()
    assert (second / "controller.crt").exists() and (second / "ca.key").stat().st_mode & 0o777 == 0o600
    assert "BEGIN PRIVATE KEY" not in proc.stdout + proc.stderr

    # and once more on the second controller: nothing at all changes
    proc = run(second, "-e", f"@{vars_file}", vault_password=password)
    assert proc.returncode == 0 and recap_changed(proc) == 0, shown(proc)


def test_a_brought_ca_that_is_not_usable_fails_in_one_line(pki_play, tmp_path):
    run, tls = pki_play
    good, other = tmp_path / "a", tmp_path / "b"
    for directory in (good, other):
        subprocess.run([str(VENV_BIN / "straggler"), "pki", "init", "--dir", str(directory)], check=True,
                       capture_output=True, timeout=120)
    proc = run(tmp_path / "c", straggler_pki_ca_cert_file=str(good / "ca.crt"), straggler_pki_ca_key_file=str(other / "ca.key"))
    assert proc.returncode == 2, shown(proc)
    assert "straggler_pki_ca_cert/straggler_pki_ca_key are not a usable CA" in proc.stdout, shown(proc)
    assert not tls.exists()
    proc = run(tmp_path / "d", straggler_pki_ca_cert_file=str(good / "ca.crt"))
    assert proc.returncode == 2 and "bring the fleet CA's certificate and its key together" in proc.stdout, shown(proc)


def _expired_ca(directory: Path):
    """A self-signed CA certificate and key whose validity ended yesterday."""
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old fleet CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=400))
            .not_valid_after(now - datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))
    directory.mkdir(mode=0o700)
    (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "ca.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return directory


def test_a_wrong_or_expired_ca_brought_to_a_controller_with_the_fleet_ca_writes_nothing(pki_play, tmp_path):
    """Before, the right certificate with the wrong key replaced ca.key, ca.crt and crl.pem with a new CA, no
    backup, and then failed 'in one line'. Now the brought pair is checked before anything is written."""
    run, tls = pki_play
    fleet, other = tmp_path / "fleet", tmp_path / "other"
    proc = run(fleet)
    assert proc.returncode == 0, shown(proc)
    subprocess.run([str(VENV_BIN / "straggler"), "pki", "init", "--dir", str(other)], check=True, capture_output=True,
                   timeout=120)
    before, host_before = snapshot(fleet), snapshot(tls)
    proc = run(fleet, straggler_pki_ca_cert_file=str(fleet / "ca.crt"), straggler_pki_ca_key_file=str(other / "ca.key"))
    assert proc.returncode == 2, shown(proc)
    assert "not a usable CA (the key does not belong to the certificate); nothing was written" in proc.stdout, shown(proc)
    assert snapshot(fleet) == before and snapshot(tls) == host_before
    expired = _expired_ca(tmp_path / "expired")
    proc = run(fleet, straggler_pki_ca_cert_file=str(expired / "ca.crt"), straggler_pki_ca_key_file=str(expired / "ca.key"))
    assert proc.returncode == 2 and "not a usable CA (it expired on" in proc.stdout, shown(proc)
    assert snapshot(fleet) == before and snapshot(tls) == host_before
    assert "BEGIN PRIVATE KEY" not in proc.stdout + proc.stderr


def test_a_brought_ca_that_replaces_another_keeps_the_old_one_and_check_mode_leaves_no_key_behind(pki_play, tmp_path,
                                                                                                  monkeypatch):
    run, tls = pki_play
    fleet, new = tmp_path / "fleet", tmp_path / "new"
    assert run(fleet).returncode == 0
    old_key = (fleet / "ca.key").read_bytes()
    subprocess.run([str(VENV_BIN / "straggler"), "pki", "init", "--dir", str(new)], check=True, capture_output=True,
                   timeout=120)
    proc = run(fleet, straggler_pki_ca_cert_file=str(new / "ca.crt"), straggler_pki_ca_key_file=str(new / "ca.key"))
    assert proc.returncode == 0, shown(proc)
    assert (fleet / "ca.key").read_bytes() == (new / "ca.key").read_bytes()
    kept = [p for p in fleet.iterdir() if p.name.startswith("ca.key.")]
    assert len(kept) == 1 and kept[0].read_bytes() == old_key and kept[0].stat().st_mode & 0o777 == 0o600, kept
    # a check-mode run that fails half way (a name never issued) leaves no copy of the CA directory in TMPDIR
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    proc = run(fleet, "--check", straggler_pki_revoke="never-issued")
    assert proc.returncode == 2, shown(proc)
    assert not [p for p in scratch.rglob("*") if p.name.startswith("straggler-pki-")], list(scratch.rglob("*"))
    assert not list(scratch.rglob("ca.key"))


def test_check_mode_writes_nothing_on_the_controller_and_reports_what_would_change(pki_play, tmp_path):
    run, tls = pki_play
    fresh = tmp_path / "fresh"
    proc = run(fresh, "--check")
    assert proc.returncode == 0, shown(proc)
    assert not fresh.exists() and not tls.exists(), shown(proc)
    assert task_status(proc, "Install the CA certificate") == "changed", shown(proc)

    controller = tmp_path / "controller"
    assert run(controller).returncode == 0
    before = snapshot(controller, tls)
    leftovers = set(Path("/tmp").glob("straggler-pki-check-*"))
    proc = run(controller, "--check")
    assert proc.returncode == 0 and recap_changed(proc) == 0, shown(proc)
    proc = run(controller, "--check", straggler_pki_extra_sans=["10.9.9.9"])   # would re-issue the host's
    assert proc.returncode == 0, shown(proc)
    assert task_status(proc, "Issue the host's certificate") == "changed", shown(proc)
    assert task_status(proc, "Install the CA certificate") == "changed", shown(proc)
    assert snapshot(controller, tls) == before                              # byte-identical, same inodes
    assert set(Path("/tmp").glob("straggler-pki-check-*")) == leftovers     # its private copy is gone too


def test_check_mode_builds_no_wheel_on_the_controller(tmp_path):
    """The agent role from a checkout builds its wheel on the controller: not in check mode, which says it would."""
    playbook = tmp_path / "agent.yml"
    playbook.write_text(textwrap.dedent("""\
        - name: the agent role in check mode
          hosts: all
          gather_facts: false
          tasks:
            - name: agent
              ansible.builtin.include_role:
                name: straggler_agent
        """))
    cache = tmp_path / "wheels"
    extra = dict(straggler_agent_source_dir=str(REPO), straggler_agent_wheel_cache=str(cache),
                 straggler_agent_venv=str(tmp_path / "host" / "venv"), straggler_agent_db=str(tmp_path / "host" / "s.db"),
                 straggler_agent_install_packages=False, straggler_agent_mount_tracefs=False,
                 straggler_agent_verify_bcc=False, straggler_agent_service_mode="supervised", straggler_agent_tls=False,
                 ansible_python_interpreter=HOST_PYTHON)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook), "--check",
                           "-e", json.dumps(extra)], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, shown(proc)
    assert "would build the agent wheel from" in proc.stdout, shown(proc)
    assert not cache.exists() and not (tmp_path / "host").exists()


# ---------------------------------------------------------------- a revocation stays revoked

@pytest.fixture
def pki_fleet(tmp_path):
    """The pki role on two local hosts (each its own TLS directory): run(controller_dir, *args, **vars)."""
    playbook = pki_playbook(tmp_path)
    hosts = {name: tmp_path / name / "tls" for name in ("gpu-node-01", "gpu-node-02")}
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("".join(f"{name} ansible_connection=local straggler_pki_tls_dir={tls}\n"
                                 for name, tls in hosts.items()))

    def run(pki_dir: Path, **extra):
        variables = dict(straggler_pki_dir=str(pki_dir), straggler_pki_owner=str(os.getuid()),
                         straggler_pki_group=str(os.getgid()), ansible_python_interpreter=HOST_PYTHON, **extra)
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   PATH=f"{VENV_BIN}:{os.environ['PATH']}")
        return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(playbook),
                               "-e", json.dumps(variables)], cwd=str(REPO), env=env, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)

    return run, hosts


def _revoked(path: Path) -> set:
    from cryptography import x509
    return {e.serial_number for e in x509.load_pem_x509_crl(path.read_bytes())}


def _serial(path: Path) -> int:
    from cryptography import x509
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_a_controller_with_an_older_copy_of_the_pki_never_brings_a_revoked_client_back(pki_fleet, tmp_path):
    """Controller A revokes a client; controller B, with a copy of A's directory from before (a CI runner,
    a colleague's laptop), runs the role: every host keeps the revocation, and B adopts it."""
    run, hosts = pki_fleet
    a = tmp_path / "controller-a"
    proc = run(a)
    assert proc.returncode == 0, shown(proc)
    subprocess.run([str(VENV_BIN / "straggler"), "pki", "issue", "--dir", str(a), "--client", "laptop"], check=True,
                   capture_output=True, timeout=120)
    laptop = _serial(a / "laptop.crt")
    b = tmp_path / "controller-b"
    subprocess.run(["cp", "-a", str(a), str(b)], check=True)          # B's copy: laptop not revoked
    proc = run(a, straggler_pki_revoke="laptop")
    assert proc.returncode == 0, shown(proc)
    assert all(laptop in _revoked(tls / "crl.pem") for tls in hosts.values())
    before = snapshot(*hosts.values())

    proc = run(b)
    assert proc.returncode == 0, shown(proc)
    assert all(laptop in _revoked(tls / "crl.pem") for tls in hosts.values()), shown(proc)
    assert snapshot(*hosts.values()) == before, shown(proc)     # the hosts held the newest: nothing rewritten
    assert laptop in _revoked(b / "crl.pem")                        # and B has it now


def test_a_host_that_brings_back_an_older_list_and_a_revoked_certificate_is_overruled(pki_fleet, tmp_path):
    """A compromised host puts back the revocation list from before its own certificate was revoked, and
    that certificate with its key; a CI controller bringing only the CA (no list, no certificates) takes
    the newest list from the other host, never the revoked certificate: the host gets a new one, and
    every host the list that revokes the old."""
    run, hosts = pki_fleet
    a = tmp_path / "controller-a"
    proc = run(a)
    assert proc.returncode == 0, shown(proc)
    h1 = hosts["gpu-node-01"]
    old = {name: (h1 / name).read_bytes() for name in ("crl.pem", "node.crt", "node.key")}
    old_serial = _serial(h1 / "node.crt")
    subprocess.run([str(VENV_BIN / "straggler"), "pki", "revoke", "--dir", str(a), "gpu-node-01"], check=True,
                   capture_output=True, timeout=120)                # a leaked key: revoked, then re-issued
    proc = run(a)
    assert proc.returncode == 0, shown(proc)
    assert _serial(h1 / "node.crt") != old_serial
    assert old_serial in _revoked(hosts["gpu-node-02"] / "crl.pem")
    for name, data in old.items():                                  # the host puts the old ones back
        (h1 / name).write_bytes(data)
    assert old_serial not in _revoked(h1 / "crl.pem")

    c = tmp_path / "controller-c"
    c.mkdir(mode=0o700)
    for name in ("ca.crt", "ca.key"):
        (c / name).write_bytes((a / name).read_bytes())
    proc = run(c, straggler_pki_ca_cert_file=str(c / "ca.crt"), straggler_pki_ca_key_file=str(c / "ca.key"))
    assert proc.returncode == 0, shown(proc)
    for tls in hosts.values():
        assert old_serial in _revoked(tls / "crl.pem"), shown(proc)
    assert _serial(h1 / "node.crt") != old_serial, shown(proc)
    assert (h1 / "node.key").read_bytes() != old["node.key"]
    assert "older or different on: gpu-node-01" in proc.stdout, shown(proc)
