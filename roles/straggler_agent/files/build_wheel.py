#!/usr/bin/env python3
"""Build the straggler agent's wheel on the controller, once per change of its sources.

Run by the Ansible role `straggler_agent` (run_once, on the controller) as
    python build_wheel.py --source REPO --cache DIR
It hashes the files that make the package (pyproject.toml, setup.cfg/setup.py/MANIFEST.in if any,
agent/straggler/ and bpf/), and when DIR/<hash>/ holds no wheel yet it copies those files to a private
temporary directory and runs `pip wheel --no-deps --no-build-isolation -w OUT .` there, then moves
the wheel into DIR/<hash>/ with an atomic rename. Prints one JSON line:
{"changed": bool, "wheel": path, "sha256": hex, "source_hash": hex}. The wheel carries the BPF sources
(pyproject.toml's data files: share/straggler/bpf); one built without them is refused.
With --check (Ansible's check mode) it writes nothing: it prints whether a wheel would be built
({"changed": true, "wheel": null, "sha256": null, ...} when none is cached for these sources).

Reproducible: the same sources build the same wheel byte for byte, wherever and whenever they are
built (its files' times are SOURCE_DATE_EPOCH, REPRODUCIBLE_EPOCH unless the environment sets one, and
their modes 0644, or 0755 for an executable, whatever the checkout's umask), so a rebuilt collection
carries the same wheel and the role reinstalls and restarts nothing.

What it must not do: use the network (no build isolation, no dependencies), write into the
source tree (parallel builds and developers' build/ or *.egg-info stay untouched), or leave a
half-written wheel where another run could pick it up.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

TOP_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md", "LICENSE")
TREES = ("agent/straggler", "bpf")   # the product only: agent/straggler_lab (the lab) never ships
SKIP_DIRS = {"__pycache__", "build", "dist", ".pytest_cache"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o")
REPRODUCIBLE_EPOCH = 315532800      # 1980-01-01, the earliest time a zip entry holds


def package_files(source):
    """Relative paths of the files that go into the wheel, sorted."""
    found = [name for name in TOP_FILES if os.path.isfile(os.path.join(source, name))]
    for tree in TREES:
        for root, dirs, files in os.walk(os.path.join(source, tree)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            for name in files:
                if not name.endswith(SKIP_SUFFIXES):
                    found.append(os.path.relpath(os.path.join(root, name), source))
    return sorted(found)


def source_hash(source, files):
    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(source, rel), "rb") as fh:
            digest.update(hashlib.sha256(fh.read()).digest())
    return digest.hexdigest()


def file_sha256(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def existing_wheel(directory):
    try:
        wheels = sorted(n for n in os.listdir(directory) if n.endswith(".whl"))
    except OSError:
        return None
    return os.path.join(directory, wheels[0]) if wheels else None


def bpf_in_wheel(wheel):
    """Whether the wheel carries the BPF sources (its data files, installed to <prefix>/share/straggler/bpf)."""
    with zipfile.ZipFile(wheel) as archive:
        return any(name.endswith("/data/share/straggler/bpf/cuda.c") for name in archive.namelist())


def describe(wheel, digest, changed):
    return {"changed": changed, "wheel": wheel, "sha256": file_sha256(wheel), "source_hash": digest}


def build(source, cache, python, check=False):
    if not os.path.isfile(os.path.join(source, "pyproject.toml")):
        raise SystemExit(f"build_wheel: {source} has no pyproject.toml: set straggler_agent_source_dir to the "
                         "straggler repository (or straggler_agent_wheel to a built wheel)")
    files = package_files(source)
    digest = source_hash(source, files)
    target = os.path.join(cache, digest[:16])
    wheel = existing_wheel(target)
    if wheel:
        return describe(wheel, digest, False)
    if check:
        return {"changed": True, "wheel": None, "sha256": None, "source_hash": digest}
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=cache) as work:
        tree = os.path.join(work, "src")
        epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or REPRODUCIBLE_EPOCH)
        for rel in files:
            os.makedirs(os.path.dirname(os.path.join(tree, rel)) or tree, exist_ok=True)
            copied = os.path.join(tree, rel)
            shutil.copyfile(os.path.join(source, rel), copied)
            executable = os.stat(os.path.join(source, rel)).st_mode & 0o100
            os.chmod(copied, 0o755 if executable else 0o644)
            os.utime(copied, (epoch, epoch))
        out = os.path.join(work, "out")
        cmd = [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "-q", "-w", out, "."]
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), PYTHONHASHSEED="0")
        proc = subprocess.run(cmd, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300, check=False, env=env,
                              preexec_fn=lambda: os.umask(0o022))     # the build's copies: 0644 whatever the caller's
        built = existing_wheel(out)
        if proc.returncode != 0 or not built:
            tail = "\n".join(proc.stdout.splitlines()[-20:])
            raise SystemExit(f"build_wheel: `{' '.join(cmd)}` failed (status {proc.returncode}); the build needs "
                             f"setuptools and wheel in {python}:\n{tail}")
        if not bpf_in_wheel(built):
            raise SystemExit(f"build_wheel: {os.path.basename(built)} lacks the BPF sources (share/straggler/bpf): "
                             f"{source}/pyproject.toml must list bpf/ under [tool.setuptools.data-files]")
        staged = os.path.join(work, "staged")
        os.makedirs(staged)
        shutil.move(built, os.path.join(staged, os.path.basename(built)))
        try:
            os.rename(staged, target)  # atomic; fails if a parallel run got there first
        except OSError:
            if not existing_wheel(target):
                raise
    return describe(existing_wheel(target), digest, True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="the straggler repository (holds pyproject.toml)")
    parser.add_argument("--cache", required=True, help="directory for built wheels, one subdirectory per source hash")
    parser.add_argument("--python", default=sys.executable, help="Python whose pip builds the wheel")
    parser.add_argument("--check", action="store_true", help="write nothing: say whether a wheel would be built")
    args = parser.parse_args(argv)
    result = build(os.path.abspath(args.source), os.path.abspath(args.cache), args.python, check=args.check)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
