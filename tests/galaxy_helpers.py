"""The built collection as a user installs it, for tests: build the tarball (scripts/build_collection.py),
install it with the collection users' controller venv (only ansible-core plus the collection's
requirements.txt; scripts/setup.sh makes it) into an empty collections path outside the repository,
and install the agent wheel it carries into that venv."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COLLECTION_SRC = REPO / "collections" / "ansible_collections" / "straggler" / "fleet"
GALAXY_VENV = Path(os.environ.get("STRAGGLER_GALAXY_VENV", Path.home() / ".cache" / "straggler" / "galaxy-venv"))
PLAYBOOKS = ("trace", "fleet_query", "explain", "collect", "diagnose")


def galaxy_venv():
    if not (GALAXY_VENV / "bin" / "ansible-playbook").exists():
        pytest.fail(f"{GALAXY_VENV} has no ansible-core: run `make setup` (scripts/setup.sh creates it)")
    return GALAXY_VENV


def build_collection(out_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "build_collection.py"), "--output-dir", str(out_dir)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def install_collection(tarball: Path, root: Path) -> dict:
    """Install into root/collections with the users' venv, outside the repository, and install the
    agent wheel the collection carries into that venv (the one documented command). Returns the
    environment to run Ansible with."""
    venv = galaxy_venv()
    root.mkdir(parents=True, exist_ok=True)
    collections = root / "collections"
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_ROLES_PATH=str(root / "no-roles"), ANSIBLE_NOCOLOR="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", ANSIBLE_LOCAL_TEMP=str(root / "tmp"),
               HOME=env.get("HOME", str(root)))
    proc = subprocess.run([str(venv / "bin" / "ansible-galaxy"), "collection", "install", str(tarball), "-p",
                           str(collections), "--force"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = collections / "ansible_collections" / "straggler" / "fleet"
    wheels = sorted(installed.glob("roles/*/files/wheels/straggler-*.whl"))
    assert len(wheels) == 1, wheels
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                           str(wheels[0])], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"env": env, "path": installed, "venv": venv, "root": root}
