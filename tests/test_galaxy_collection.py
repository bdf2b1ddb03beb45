"""The collection as a user installs it: `make collection` builds straggler-fleet-<version>.tar.gz,
`ansible-galaxy collection install` puts it in an empty collections path, and a fresh controller venv
that had only ansible-core gets everything else from one `pip install -r <collection>/requirements.txt`
(the straggler core from the wheel the collection carries), and uses it from a directory outside the
repository; an execution environment's build context comes from `ansible-builder create`.

What a user would notice: everything is in the tarball (plugins, both roles, the playbooks, the
agent wheel with the BPF sources inside, LICENSE, changelog, runtime and execution-environment metadata), and
nothing in it drifts from the repository's sources; `ansible-doc` documents every plugin and both
roles; the playbooks parse as `straggler.fleet.<name>`. (Running them against hosts is
tests/test_playbooks.py, which uses the same installed collection.)"""
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from galaxy_helpers import COLLECTION_SRC, PLAYBOOKS, REPO, build_collection  # tests/


@pytest.fixture(scope="module")
def built(installed_collection):
    return installed_collection["built"]


@pytest.fixture(scope="module")
def installed(installed_collection):
    return installed_collection


def _source_files(top: Path):
    # playbooks/ansible.cfg serves the checkout only, and stays out of the tarball
    return {str(p.relative_to(top)) for p in top.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc") and p.name != "ansible.cfg"}


def test_the_tarball_holds_everything_a_user_needs_and_matches_the_sources(built):
    with tarfile.open(built["collection"]) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        for name in ("LICENSE", "CHANGELOG.md", "README.md", "requirements.txt", "bindep.txt", "meta/runtime.yml",
                     "meta/execution-environment.yml", "MANIFEST.json", "FILES.json"):
            assert name in members, name
        # nothing drifts: every source file of the plugins, roles and playbooks is in it, byte for byte
        for prefix, top in (("plugins", COLLECTION_SRC / "plugins"), ("roles", REPO / "roles"),
                            ("playbooks", REPO / "playbooks")):
            for rel in sorted(_source_files(top)):
                member = f"{prefix}/{rel}"
                assert member in members, f"{member} missing from the tarball"
                assert tar.extractfile(member).read() == (top / rel).read_bytes(), f"{member} differs from {top / rel}"
        wheels = [n for n in members if n.endswith(".whl")]
        assert not [n for n in members if "/files/bpf/" in n]          # the wheel carries them
        with zipfile.ZipFile(io.BytesIO(tar.extractfile(wheels[0]).read())) as whl:
            bpf = {Path(n).name: whl.read(n) for n in whl.namelist() if "/data/share/straggler/bpf/" in n}
        manifest = json.loads(tar.extractfile("MANIFEST.json").read())
    version = [line.split("=", 1)[1].strip().strip('"') for line in (REPO / "pyproject.toml").read_text().splitlines()
               if line.startswith("version")][0]
    assert len(wheels) == 1 and Path(wheels[0]).name == f"straggler-{version}-py3-none-any.whl", wheels
    assert bpf == {p.name: p.read_bytes() for p in [*(REPO / "bpf").glob("*.c"), *(REPO / "bpf").glob("*.h")]}
    assert manifest["collection_info"]["license"] == ["GPL-3.0-or-later"]
    assert not [n for n in members if n.startswith("tests/") or "/__pycache__/" in n or n.endswith("ansible.cfg")]


def test_the_same_sources_build_the_same_tarball_and_wheel_byte_for_byte(built, installed, tmp_path):
    """Rebuilt later from the repository by the Python that built the installed collection (the README's
    venv), under another umask: the same bytes (before, the wheel's dist-info times and the
    tarball's member and gzip times changed with every build, and every host reinstalled and restarted its
    agent after a rebuild of the collection)."""
    import hashlib
    again = Path(build_collection(tmp_path, installed["venv"] / "bin" / "python",
                                  preexec_fn=lambda: os.umask(0o002))["collection"])
    first = Path(built["collection"])
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(first.read_bytes()).hexdigest()


def test_ansible_doc_documents_every_plugin_and_both_roles_from_outside_the_repository(installed):
    env, root, venv = installed["env"], installed["root"], installed["venv"]
    doc = str(venv / "bin" / "ansible-doc")
    kinds = {"module": sorted(p.stem for p in (installed["path"] / "plugins" / "modules").glob("*.py")),
             "callback": ["summary"]}
    for kind, names in kinds.items():
        proc = subprocess.run([doc, "-t", kind, "--json"] + [f"straggler.fleet.{n}" for n in names], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        docs = json.loads(proc.stdout)
        for name in names:
            entry = docs[f"straggler.fleet.{name}"]["doc"]
            assert entry.get("short_description") and entry.get("description"), (kind, name)
    roles = sorted(p.name for p in (installed["path"] / "roles").iterdir())
    assert len(roles) == 2, roles
    for role in roles:
        proc = subprocess.run([doc, "-t", "role", f"straggler.fleet.{role}"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and re.search(r"ENTRY POINT: \W*main\W", proc.stdout), proc.stdout + proc.stderr


def test_the_playbooks_parse_as_collection_playbooks_and_the_controller_imports_the_core(installed):
    env, root, venv = installed["env"], installed["root"], installed["venv"]
    inventory = root / "inventory.ini"
    inventory.write_text("[gpu]\nnode-a ansible_host=192.0.2.1\n")
    for name in PLAYBOOKS:
        proc = subprocess.run([str(venv / "bin" / "ansible-playbook"), "-i", str(inventory), "--syntax-check",
                               f"straggler.fleet.{name}"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (name, proc.stdout + proc.stderr)
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", "import straggler.pki, straggler.analysis.export, "
                           "straggler.fleet.client; print(straggler.__file__)"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and str(venv) in proc.stdout, proc.stderr


def test_one_pip_install_after_galaxy_gives_the_core_at_the_collections_version_from_its_wheel(installed, built):
    """The fixture made the venv from ansible-core alone and ran `pip install -r requirements.txt` of the
    installed collection: the core came from the wheel inside it, at the version the requirements name."""
    venv = installed["venv"]
    requirements = (installed["path"] / "requirements.txt").read_text()
    assert "--find-links roles/straggler_agent/files/wheels" in requirements
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", "-f", "straggler"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"Version: {built['version']}" in proc.stdout or f"Version: {built['wheel'].split('-')[1]}" in proc.stdout
    assert re.search(rf"^straggler\[export\]=={re.escape(built['wheel'].split('-')[1])}\b", requirements, re.M)
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", "import perfetto, cryptography, yaml"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_ansible_builder_makes_the_ee_build_context_whose_pip_finds_the_core(installed, built, tmp_path):
    """docs/ee/execution-environment.yml with the built tarball: `ansible-builder create` (v3 schema checked
    by ansible-builder) writes the build context; its introspection of the installed collection (the
    script the image build runs) lists the core and the system packages, and pip resolves that list with
    the build's PIP_FIND_LINKS, offline for the core. (Building the image needs a container runtime.)"""
    builder = Path(sys.executable).with_name("ansible-builder")
    assert builder.exists(), f"{builder} missing: ansible-builder is in requirements-dev.txt, run 'make setup'"
    definition = (REPO / "docs" / "ee" / "execution-environment.yml").read_text()
    tarball = Path(built["collection"]).name
    assert f"galaxy/{tarball}" in definition and f"src: {tarball}" in definition, "the EE definition names another version"
    (tmp_path / "execution-environment.yml").write_text(definition)
    shutil.copy(built["collection"], tmp_path / tarball)
    proc = subprocess.run([str(builder), "create", "-f", "execution-environment.yml", "-c", "context",
                           "--output-filename", "Containerfile"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    context = tmp_path / "context"
    containerfile = (context / "Containerfile").read_text()
    assert (context / "_build" / "galaxy" / tarball).is_file()
    wheels = "/usr/share/ansible/collections/ansible_collections/straggler/fleet/roles/straggler_agent/files/wheels"
    assert containerfile.count(f"ENV PIP_FIND_LINKS={wheels}") == 2, containerfile
    out = tmp_path / "introspected"
    proc = subprocess.run([sys.executable, str(context / "_build" / "scripts" / "introspect.py"), "introspect",
                           str(installed["path"].parents[2]), f"--write-pip={out}/requirements.txt",
                           f"--write-bindep={out}/bindep.txt"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    python_reqs = (out / "requirements.txt").read_text()
    version = built["wheel"].split("-")[1]
    assert f"straggler[export]=={version}  # from collection straggler.fleet" in python_reqs, python_reqs
    assert "openssh-client [platform:dpkg]  # from collection straggler.fleet" in (out / "bindep.txt").read_text()
    env = dict(os.environ, PIP_FIND_LINKS=str(installed["path"] / "roles" / "straggler_agent" / "files" / "wheels"))
    proc = subprocess.run([str(installed["venv"] / "bin" / "python"), "-m", "pip", "install", "--dry-run",
                           "--ignore-installed", "--report", str(tmp_path / "report.json"), "-q", "-r",
                           str(out / "requirements.txt")], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    resolved = {item["metadata"]["name"]: item for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert resolved["straggler"]["metadata"]["version"] == version
    assert resolved["straggler"]["download_info"]["url"].startswith("file://"), resolved["straggler"]["download_info"]
