"""ansible-lint's production profile on the roles, the playbooks and the collection: no violation,
with the repository's .ansible-lint (which skips only galaxy[no-repository]: no public repository yet). ansible-lint comes from
requirements-dev.txt (`make setup`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TARGETS = ["roles", "playbooks", "collections/ansible_collections/straggler/fleet"]


def test_ansible_lint_production_profile_finds_nothing():
    lint = VENV_BIN / "ansible-lint"
    assert lint.exists(), f"{lint} missing: ansible-lint is in requirements-dev.txt, run 'make setup'"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), NO_COLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(lint), "--profile", "production", "--offline", "--format=pep8", *TARGETS], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    shown = f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, shown
    assert proc.stdout.strip() == "", shown      # pep8 format: one line per violation
    assert "Passed" in proc.stderr and "0 failure(s), 0 warning(s)" in proc.stderr, shown
