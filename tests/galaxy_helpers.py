"""The built collection as a user installs it, for tests: build the tarball (scripts/build_collection.py),
make a fresh controller venv with nothing but ansible-core (the version of the repository's .venv), and
there run the two documented commands: `ansible-galaxy collection install <tarball>` into an empty
collections path outside the repository, then `pip install -r <installed collection>/requirements.txt`
(which finds the straggler core in the wheel the collection ships, offline)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLLECTION_SRC = REPO / "collections" / "ansible_collections" / "straggler" / "fleet"
PLAYBOOKS = ("trace", "fleet_query", "explain", "collect", "diagnose")


def build_collection(out_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "build_collection.py"), "--output-dir", str(out_dir)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ansible_core_version() -> str:
    import ansible.release
    return ansible.release.__version__


def fresh_venv(path: Path) -> Path:
    """A new venv (no system site packages) with ansible-core alone: a controller before the collection."""
    for argv in ([sys.base_prefix + "/bin/python3", "-m", "venv", str(path)],
                 [str(path / "bin" / "python"), "-m", "pip", "install", "-q", f"ansible-core=={ansible_core_version()}"]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return path


def install_collection(tarball: Path, root: Path) -> dict:
    """Install as the collection's README says, into root/collections with a fresh venv (root/venv),
    outside the repository. Returns the environment to run Ansible with."""
    root.mkdir(parents=True, exist_ok=True)
    venv = fresh_venv(root / "venv")
    collections = root / "collections"
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_ROLES_PATH=str(root / "no-roles"), ANSIBLE_NOCOLOR="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", ANSIBLE_LOCAL_TEMP=str(root / "tmp"),
               HOME=env.get("HOME", str(root)))
    proc = subprocess.run([str(venv / "bin" / "ansible-galaxy"), "collection", "install", str(tarball), "-p",
                           str(collections)], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = collections / "ansible_collections" / "straggler" / "fleet"
    # the second documented step, from another directory: pip reads --find-links relative to the file
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r",
                           str(installed / "requirements.txt")], cwd=str(root), env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"env": env, "path": installed, "venv": venv, "root": root}
