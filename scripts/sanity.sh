#!/usr/bin/env bash
# make sanity: `ansible-test sanity` on the straggler.fleet collection, working offline.
#
# ansible-test runs each sanity test in a virtual environment of its own (under
# ~/.ansible/test/venv) and bootstraps pip into it with a get-pip.py it downloads from a host
# this machine cannot reach. So before running, this script seeds ansible-test's get-pip cache
# with a stand-in that bootstraps pip from the Python's own ensurepip; the test requirements
# (pylint, voluptuous, yamllint, ...) then install with pip from the package registry as usual,
# once, and are reused from the cache on later runs.
#
# Usage: scripts/sanity.sh [ansible-test sanity options, e.g. --test pep8]
# Exit status: ansible-test's (non-zero when any test fails).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COLLECTION=$ROOT/collections/ansible_collections/straggler/fleet
PY=$ROOT/.venv/bin/python
ANSIBLE_TEST=$ROOT/.venv/bin/ansible-test
die() { printf 'sanity: error: %s\n' "$*" >&2; exit 2; }

[ -x "$ANSIBLE_TEST" ] || die "$ANSIBLE_TEST missing: run 'make setup'"
[ -f "$COLLECTION/galaxy.yml" ] || die "$COLLECTION/galaxy.yml missing"
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# --- the get-pip stand-in ------------------------------------------------------------------
PIP_VERSION=$("$PY" - <<'EOF'
import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="%d.%d" % __import__("sys").version_info[:2]))["pip"])
EOF
)
GET_PIP=$HOME/.ansible/test/cache/get_pip_${PIP_VERSION//./_}.py
if [ ! -s "$GET_PIP" ] || grep -q 'straggler sanity.sh stand-in' "$GET_PIP"; then
  mkdir -p "$(dirname "$GET_PIP")"
  cat > "$GET_PIP.tmp" <<'EOF'
"""Stand-in for get-pip.py (straggler sanity.sh stand-in): ansible-test runs it in a new, empty
virtual environment with the packages to install as arguments. It bootstraps pip from the
Python's own ensurepip, then installs the requested packages with that pip; if the requested pip
version cannot be installed, the bootstrapped pip does the job."""
import subprocess
import sys

arguments = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"],
                      stdout=subprocess.DEVNULL)
packages = [a for a in arguments if not a.startswith("-")]
if packages:
    rc = subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + packages)
    if rc != 0:
        print("get-pip stand-in: could not install %s; keeping the pip from ensurepip" % " ".join(packages),
              file=sys.stderr)
EOF
  mv "$GET_PIP.tmp" "$GET_PIP"
fi

# --- run ----------------------------------------------------------------------------------------
# Tests that find nothing to check in this collection (and so report "skipped"): shellcheck (no
# shell scripts in the collection), pslint (no PowerShell), changelog (no changelogs/ directory).
cd "$COLLECTION"
export ANSIBLE_TEST_PREFER_PODMAN=0
exec "$ANSIBLE_TEST" sanity --local --python "$PYVER" --color no "$@"
