#!/usr/bin/env python3
"""Build the installable Ansible collection: dist/straggler-fleet-<version>.tar.gz (`make collection`).

The repository keeps the sources where the design puts them: the collection's plugins and
metadata under collections/ansible_collections/straggler/fleet/, the roles under roles/, the
playbooks under playbooks/, the agent under agent/ and bpf/. This script assembles them in a
temporary directory and runs `ansible-galaxy collection build` there:

  plugins/, meta/, README.md, CHANGELOG.md, requirements.txt,  from the collection's sources
  bindep.txt
  roles/<role>/                                                 from roles/ (as straggler.fleet.<role>)
  roles/<agent role>/files/wheels/straggler-<v>-py3-none-any.whl  the agent, built from agent/ and bpf/ (the
                                                                 BPF sources are its data files)
  playbooks/*.yml, playbooks/tasks/                             from playbooks/ (ansible-playbook straggler.fleet.trace)
  LICENSE                                                       from the repository

So an `ansible-galaxy collection install` needs no checkout: the agent role installs the bundled
wheel on the hosts, and `pip install -r <collection>/requirements.txt` installs the same wheel on the
controller (requirements.txt pins the core at the wheel's version and finds it there; checked here).
It must not write into the source tree (only --output-dir), nor use the network.
Prints one JSON line: {"collection": path, "wheel": name, "version": v, "files": n}.
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLLECTION_SRC = REPO / "collections" / "ansible_collections" / "straggler" / "fleet"
# playbooks/ansible.cfg serves the checkout only (installed, the playbooks are straggler.fleet.<name>)
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "output", ".pytest_cache", "ansible.cfg")
# what the collection's own sources contribute (its tests stay in the repository)
COLLECTION_PARTS = ("plugins", "meta", "README.md", "CHANGELOG.md", "requirements.txt", "bindep.txt", "galaxy.yml")


class BuildError(Exception):
    pass


def _galaxy_version():
    for line in (COLLECTION_SRC / "galaxy.yml").read_text().splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip().strip("'\"")
    raise BuildError(f"no version in {COLLECTION_SRC / 'galaxy.yml'}")


def check_core_requirement(wheel: Path):
    """The collection's requirements.txt names the core at the version of the wheel it ships (pip finds it
    there: one `pip install -r requirements.txt` after `ansible-galaxy collection install`)."""
    version = wheel.name.split("-")[1]
    pins = [line.split("#", 1)[0].strip() for line in (COLLECTION_SRC / "requirements.txt").read_text().splitlines()
            if line.split("#", 1)[0].strip().split("[")[0].split("=")[0].strip() == "straggler"]
    wanted = [pin for pin in pins if pin.endswith("==" + version)]
    if len(pins) != 1 or not wanted:
        raise BuildError(f"{COLLECTION_SRC / 'requirements.txt'} must name the core once as straggler[...]=={version} "
                         f"(the version of {wheel.name}), not {pins or 'nothing'}")


def agent_role_dir(roles_root: Path) -> Path:
    """The role that installs the agent: the one that carries build_wheel.py."""
    found = sorted(p.parent.parent for p in roles_root.glob("*/files/build_wheel.py"))
    if len(found) != 1:
        raise BuildError(f"expected one role with files/build_wheel.py under {roles_root}, found {found}")
    return found[0]


def build_wheel(work: Path) -> Path:
    builder = agent_role_dir(REPO / "roles") / "files" / "build_wheel.py"
    proc = subprocess.run([sys.executable, str(builder), "--source", str(REPO), "--cache", str(work / "wheel-cache")],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise BuildError(f"building the agent wheel failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return Path(json.loads(proc.stdout.strip().splitlines()[-1])["wheel"])


def assemble(stage: Path, wheel: Path):
    for part in COLLECTION_PARTS:
        source = COLLECTION_SRC / part
        if source.is_dir():
            shutil.copytree(source, stage / part, ignore=SKIP)
        elif source.is_file():
            shutil.copy2(source, stage / part)
        else:
            raise BuildError(f"{source} is missing")
    shutil.copytree(REPO / "roles", stage / "roles", ignore=SKIP)
    role = agent_role_dir(stage / "roles")
    (role / "files" / "wheels").mkdir(parents=True)
    shutil.copy2(wheel, role / "files" / "wheels" / wheel.name)
    shutil.copytree(REPO / "playbooks", stage / "playbooks", ignore=SKIP)
    shutil.copy2(REPO / "LICENSE", stage / "LICENSE")


# The tarball's members' times and the gzip header's: SOURCE_DATE_EPOCH when the environment sets it
# (reproducible-builds.org), else the wheel's fixed epoch; the same sources give the same bytes.
REPRODUCIBLE_EPOCH = 315532800
FIRST_MEMBERS = ("MANIFEST.json", "FILES.json")


def reproducible(built: Path, target: Path):
    """Write `built` (ansible-galaxy's tarball: its members carry the build's time, the files their
    checkout's times and the gzip header the build's) to `target` byte for byte reproducible: the same
    members and contents, MANIFEST.json and FILES.json first then sorted by name, every time the epoch,
    owners 0 and nameless, and the gzip header's time the epoch too."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or REPRODUCIBLE_EPOCH)
    with tarfile.open(built) as source:
        members = sorted(source.getmembers(), key=lambda m: (m.name not in FIRST_MEMBERS,
                                                              FIRST_MEMBERS.index(m.name) if m.name in FIRST_MEMBERS else 0,
                                                              m.name))
        with open(target, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=epoch) as packed, \
                tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as out:
            for member in members:
                member.mtime, member.uid, member.gid, member.uname, member.gname = epoch, 0, 0, "", ""
                member.pax_headers = {}
                out.addfile(member, source.extractfile(member) if member.isfile() else None)


def build(output_dir: Path, keep_stage: Path = None) -> dict:
    version = _galaxy_version()
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="straggler-collection-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work)
        check_core_requirement(wheel)
        stage = (keep_stage or work / "stage") / "ansible_collections" / "straggler" / "fleet"
        if stage.exists():
            shutil.rmtree(stage)
        stage.parent.mkdir(parents=True, exist_ok=True)
        assemble(stage, wheel)
        galaxy = Path(sys.executable).with_name("ansible-galaxy")
        proc = subprocess.run([str(galaxy if galaxy.exists() else "ansible-galaxy"), "collection", "build", str(stage),
                               "--output-path", str(work / "out"), "--force"],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise BuildError(f"ansible-galaxy collection build failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
        built = work / "out" / f"straggler-fleet-{version}.tar.gz"
        target = output_dir / built.name
        reproducible(built, Path(str(target) + ".tmp"))
        os.replace(str(target) + ".tmp", target)
    with tarfile.open(target) as tar:
        count = sum(1 for member in tar.getmembers() if member.isfile())
    return {"collection": str(target), "wheel": wheel.name, "version": version, "files": count}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output-dir", default=str(REPO / "dist"), help="where the tarball goes (default dist/)")
    parser.add_argument("--keep-stage", default=None, metavar="DIR",
                        help="assemble under DIR/ansible_collections/straggler/fleet and keep it (to inspect)")
    args = parser.parse_args(argv)
    try:
        summary = build(Path(args.output_dir).resolve(), Path(args.keep_stage).resolve() if args.keep_stage else None)
    except (BuildError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"build_collection: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
