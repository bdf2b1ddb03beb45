"""The built collection as a user installs it, for tests: the README's from-zero walkthrough followed as
written (a venv with ansible-core, `make collection` without root, `ansible-galaxy collection install`,
`pip install -r <installed collection>/requirements.txt`, which finds the straggler core in the wheel the
collection ships, offline), in a copy of the checkout and a fresh home; and a second build of the
tarball (scripts/build_collection.py) for the tests that rebuild."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLLECTION_SRC = REPO / "collections" / "ansible_collections" / "straggler" / "fleet"
PLAYBOOKS = ("trace", "fleet_query", "explain", "collect", "diagnose")


def build_collection(out_dir: Path, python: Path | None = None, **popen) -> dict:
    """scripts/build_collection.py by `python` (this one by default): the same sources built by the same
    Python, setuptools and wheel give the same bytes; other versions of those write other metadata."""
    proc = subprocess.run([str(python or sys.executable), str(REPO / "scripts" / "build_collection.py"), "--output-dir",
                           str(out_dir)], capture_output=True, text=True, timeout=600, **popen)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


WALKTHROUGH = "### From zero to a first fleet query"
# what a checkout of the sources has, and a copy for the walkthrough leaves out: the development set-up and
# what builds, demos and tests make (.gitignore)
NOT_IN_A_CHECKOUT = {".git", ".venv", "dist", "build", "demo-output", "results", ".testbed", ".pki", ".ansible",
                     ".pytest_cache", "__pycache__", "output"}


def readme_walkthrough() -> dict:
    """The README's from-zero walkthrough as a newcomer reads it: its three code blocks in order, the
    install commands (a shell script), the inventory (ini) and the first commands (one string each, a
    continued line joined)."""
    text = (REPO / "README.md").read_text()
    assert WALKTHROUGH + "\n" in text, f"README.md has no section {WALKTHROUGH!r}"
    section = re.split(r"^##+ ", text.split(WALKTHROUGH + "\n", 1)[1], maxsplit=1, flags=re.M)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, re.M | re.S)
    assert [lang for lang, _ in blocks] == ["sh", "ini", "sh"], f"the walkthrough's blocks: {blocks}"
    install, inventory, first = (body for _, body in blocks)
    commands = [line.strip() for line in first.replace("\\\n", " ").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    return {"install": install, "inventory": inventory, "first": commands}


def newcomer_env(home: Path) -> dict:
    """This machine's environment as a newcomer's shell has it: a home of its own, and nothing of the
    development set-up (no ANSIBLE_* variable, no virtualenv active, the repository's .venv not on PATH) and no
    XDG_* directory elsewhere (caches and configuration go under that home)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANSIBLE_", "XDG_")) and key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    dev_bins = {str(REPO / ".venv" / "bin")}
    if sys.prefix != sys.base_prefix:         # the tests' own venv (not a system Python's bin, which has python3)
        dev_bins.add(str(Path(sys.prefix) / "bin"))
    env["PATH"] = os.pathsep.join(part for part in env.get("PATH", "").split(os.pathsep) if part not in dev_bins)
    env["HOME"] = str(home)
    return env


def activated(env: dict, venv: Path) -> dict:
    """env after `. VENV/bin/activate`."""
    return dict(env, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")


def install_as_the_readme_says(root: Path) -> dict:
    """Follow the README's install block as written, with bash, in a copy of the checkout (make collection
    writes its dist/ there) and a fresh home (the venv and ~/.ansible/collections are made there).
    Returns env (to run Ansible with: the venv active, the collections path and a local temp under root),
    newcomer_env (the shell's environment before the venv), path (the installed collection), venv, home,
    root (a working directory outside the repository) and built (the build's summary)."""
    def ignore(directory, names):
        return [name for name in names if name in NOT_IN_A_CHECKOUT or name.endswith(".pyc")]

    src, home, work = root / "src", root / "home", root / "user"
    shutil.copytree(REPO, src, ignore=ignore, symlinks=True)
    home.mkdir()
    work.mkdir()
    env = newcomer_env(home)
    script = readme_walkthrough()["install"] + '\nprintf "\\nwalkthrough-venv=%s\\n" "$VIRTUAL_ENV"\n'
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=src, env=env, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"the README's install block failed in {src}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    found = re.search(r"^walkthrough-venv=(\S+)$", proc.stdout, re.M)
    assert found, f"the README's install block activated no virtualenv:\n{proc.stdout[-3000:]}"
    venv = Path(found.group(1))
    assert venv.is_relative_to(home), f"the README's venv is not under the home directory: {venv}"
    summary = [line for line in proc.stdout.splitlines() if line.startswith('{"collection"')]
    assert summary, f"make collection printed no summary:\n{proc.stdout[-3000:]}"
    built = json.loads(summary[-1])
    collections = home / ".ansible" / "collections"
    installed = collections / "ansible_collections" / "straggler" / "fleet"
    assert (installed / "MANIFEST.json").is_file(), f"nothing installed at {installed}"
    run_env = dict(activated(env, venv), ANSIBLE_COLLECTIONS_PATH=str(collections),
                   ANSIBLE_ROLES_PATH=str(work / "no-roles"), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(work / "tmp"))
    return {"env": run_env, "newcomer_env": env, "path": installed, "venv": venv, "home": home, "root": work,
            "built": built}
