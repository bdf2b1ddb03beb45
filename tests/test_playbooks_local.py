"""The playbooks and roles on this machine alone (local connection, check mode, no test bed): what
they read from the inventory and how the role checks its arguments. Fast; the real deployments are
in tests/test_playbooks.py (the multi-host test bed)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
HOST_PYTHON = "/usr/bin/python3"


def ansible_playbook(*args, cwd=REPO, timeout=300, **more_env):
    # the repository's ansible.cfg (roles_path, collections_path), as a user runs them
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}", **more_env)
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), *map(str, args)], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def shown(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def trace_check_vars(tmp_path, **more):
    """trace.yml's variables for a check-mode run on this machine: a stand-in wheel (nothing is installed, and no
    fleet CA is made), everything under tmp_path."""
    wheel = tmp_path / "straggler-0.0.0-py3-none-any.whl"
    wheel.write_bytes(b"stand-in: check mode installs nothing")
    return dict(straggler_pki_dir=str(tmp_path / "pki"), straggler_pki_tls_dir=str(tmp_path / "host" / "tls"),
                straggler_agent_wheel=str(wheel), straggler_agent_venv=str(tmp_path / "host" / "venv"),
                straggler_agent_db=str(tmp_path / "host" / "straggler.db"), straggler_agent_install_packages=False,
                straggler_agent_mount_tracefs=False, straggler_agent_verify_bcc=False,
                straggler_agent_service_mode="supervised", **more)


def test_unprefixed_inventory_variables_do_not_change_what_trace_yml_does(tmp_path):
    """An inventory whose group sets `state=absent` (and other short names the playbooks once read)
    still gets the agent installed and started: trace.yml reads only straggler_* variables. In check
    mode on this machine, with a stand-in wheel (nothing is installed, and no fleet CA is made)."""
    (tmp_path / "inventory.ini").write_text(textwrap.dedent(f"""\
        [gpu]
        localhost ansible_connection=local ansible_python_interpreter={HOST_PYTHON}
        [gpu:vars]
        state=absent
        duration=5x
        scope=bogus
        target=nowhere
        """))
    extra = trace_check_vars(tmp_path, straggler_agent_duration="5m")
    proc = ansible_playbook("-i", tmp_path / "inventory.ini", "playbooks/trace.yml", "--check", "-e", json.dumps(extra))
    assert proc.returncode == 0, shown(proc)
    out = proc.stdout
    assert "present.yml for localhost" in out, shown(proc)          # the agent role's install path
    assert "absent.yml for localhost" not in out and "stop.yml for localhost" not in out, shown(proc)
    assert "TASK [straggler_pki : Issue the host's certificate" in out, shown(proc)
    assert re.search(r"TASK \[straggler_pki : Remove the TLS files from the host\] \**\nskipping: \[localhost\]", out), \
        shown(proc)
    assert re.search(r"TASK \[Remove the TLS files\] \**\nskipping: \[localhost\]", out), shown(proc)
    assert "Check mode, nothing changed: a run would leave 1 of 1 hosts tracing" in out, shown(proc)
    assert not (tmp_path / "pki").exists()                         # check mode writes nothing on the controller
    assert not (tmp_path / "host").exists()                        # nor on the host


def agent_role_playbook(tmp_path, play_name):
    """A playbook that includes the straggler_agent role on localhost."""
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(textwrap.dedent(f"""\
        - name: {play_name}
          hosts: localhost
          gather_facts: false
          tasks:
            - name: include the role
              ansible.builtin.include_role:
                name: straggler_agent
        """))
    return playbook


def test_the_agent_role_refuses_a_duration_the_agent_cannot_read(tmp_path):
    playbook = agent_role_playbook(tmp_path, "the role's argument check only")
    proc = ansible_playbook(playbook, "-i", "localhost,", "-c", "local", "--check",
                            "-e", json.dumps(dict(straggler_agent_duration="5 minutes")), "-e", f"ansible_python_interpreter={HOST_PYTHON}")
    assert proc.returncode == 2, shown(proc)
    assert "TASK [straggler_agent : Check straggler_agent_duration" in proc.stdout, shown(proc)
    assert "straggler_agent_duration \\\"5 minutes\\\": give seconds (300)" in proc.stdout \
        or 'straggler_agent_duration "5 minutes": give seconds (300)' in proc.stdout, shown(proc)


def test_the_agent_role_installs_the_wheel_bundled_with_it(tmp_path):
    """As in the built collection: files/wheels/straggler-*.whl inside the role is used, nothing is built
    on the controller (the source directory given does not exist), and no BPF source is copied file by
    file (the wheel carries them)."""
    roles = tmp_path / "roles"
    shutil.copytree(REPO / "roles" / "straggler_agent", roles / "straggler_agent")
    (roles / "straggler_agent" / "files" / "wheels").mkdir()
    (roles / "straggler_agent" / "files" / "wheels" / "straggler-9.9.9-py3-none-any.whl").write_bytes(b"stand-in")
    playbook = agent_role_playbook(tmp_path, "the role with bundled files")
    extra = dict(straggler_agent_source_dir=str(tmp_path / "no-checkout"), straggler_agent_wheel_cache=str(tmp_path / "wheels"),
                 straggler_agent_venv=str(tmp_path / "host" / "venv"), straggler_agent_db=str(tmp_path / "host" / "s.db"),
                 straggler_agent_install_packages=False, straggler_agent_mount_tracefs=False,
                 straggler_agent_verify_bcc=False, straggler_agent_service_mode="supervised", straggler_agent_tls=False,
                 ansible_python_interpreter=HOST_PYTHON)
    proc = ansible_playbook(playbook, "-i", "localhost,", "-c", "local", "--check", "-e", json.dumps(extra),
                            ANSIBLE_ROLES_PATH=str(roles))
    assert proc.returncode == 0, shown(proc)
    out = proc.stdout
    assert re.search(r"TASK \[straggler_agent : Build the agent wheel[^\n]*\nskipping: \[localhost\]", out), shown(proc)
    assert "TASK [straggler_agent : Use a ready wheel (bundled with the role)]" in out, shown(proc)
    assert re.search(r"TASK \[straggler_agent : Copy the agent wheel\] \**\nchanged: \[localhost\]", out), shown(proc)
    assert "BPF sources" not in out.split("TASK [straggler_agent : Check that the agent's Python imports BCC")[0], shown(proc)
    assert not (tmp_path / "wheels").exists() and not (tmp_path / "host").exists()


def test_tls_files_writes_the_four_files_atomically_once_and_only_what_changed(tmp_path):
    """straggler.fleet.tls_files (what the pki role installs a host's TLS files with, one module run):
    check mode on a missing directory writes nothing; then the four files with their modes; a second
    run changes nothing; a new CRL rewrites crl.pem alone (the others keep their inode); the key is
    never shown."""
    pem = {name: f"-----BEGIN {name.upper()}-----\n{name} of this test\n-----END {name.upper()}-----\n"
           for name in ("ca", "crl", "cert", "key")}
    src = tmp_path / "src"
    src.mkdir()
    for name, text in pem.items():
        (src / name).write_text(text)
    dest = tmp_path / "tls"
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(textwrap.dedent(f"""\
        - name: tls_files
          hosts: localhost
          gather_facts: false
          tasks:
            - name: write them
              straggler.fleet.tls_files:
                dest: {dest}
                ca: "{{{{ lookup('ansible.builtin.file', '{src}/ca', rstrip=false) }}}}"
                crl: "{{{{ lookup('ansible.builtin.file', '{src}/crl', rstrip=false) }}}}"
                cert: "{{{{ lookup('ansible.builtin.file', '{src}/cert', rstrip=false) }}}}"
                key: "{{{{ lookup('ansible.builtin.file', '{src}/key', rstrip=false) }}}}"
              register: out
            - name: show
              ansible.builtin.debug:
                msg: "RESULT {{{{ out.changed }}}} {{{{ out.changed_files | join(',') }}}}"
        """))

    def run(*args):
        proc = ansible_playbook("-i", "localhost,", "-c", "local", playbook, "-v", *args,
                                "-e", json.dumps({"ansible_python_interpreter": HOST_PYTHON}))
        assert proc.returncode == 0, shown(proc)
        assert "key of this test" not in proc.stdout + proc.stderr, shown(proc)     # no_log on the key
        return re.search(r"RESULT (\w+) ([\w.,]*)", proc.stdout).groups()

    assert run("--check") == ("True", "ca.crt,crl.pem,node.crt,node.key") and not dest.exists()
    dest.mkdir()
    assert run() == ("True", "ca.crt,crl.pem,node.crt,node.key")
    files = {"ca.crt": "ca", "crl.pem": "crl", "node.crt": "cert", "node.key": "key"}
    for name, option in files.items():
        assert (dest / name).read_text() == pem[option]
        assert (dest / name).stat().st_mode & 0o777 == (0o600 if name == "node.key" else 0o644), name
    inodes = {name: (dest / name).stat().st_ino for name in files}
    assert run() == ("False", "")
    (src / "crl").write_text(pem["crl"].replace("of this test", "revoking one"))
    assert run("--check") == ("True", "crl.pem") and "of this test" in (dest / "crl.pem").read_text()
    assert run() == ("True", "crl.pem") and "revoking one" in (dest / "crl.pem").read_text()
    assert {n: (dest / n).stat().st_ino for n in files if n != "crl.pem"} == {n: i for n, i in inodes.items()
                                                                             if n != "crl.pem"}
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]          # no temporary left
    (dest / "node.key").chmod(0o644)                                          # a mode drifted: put back
    assert run() == ("True", "node.key") and (dest / "node.key").stat().st_mode & 0o777 == 0o600


def test_collect_in_check_mode_says_what_it_would_write_and_writes_nothing(tmp_path):
    """Before, `collect.yml --check` ended by saying it had written cluster.db, trace.pftrace and explain.md."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_api_helpers import make_node_db
    make_node_db(tmp_path / "node.db", "localhost", 0)
    out = tmp_path / "out"
    proc = ansible_playbook("-i", "localhost,", "-c", "local", "playbooks/collect.yml", "--check",
                            "-e", json.dumps(dict(target="localhost", out=str(out), straggler_agent_db=str(tmp_path / "node.db"),
                                                  straggler_agent_venv=str(VENV_BIN.parent),
                                                  ansible_python_interpreter=HOST_PYTHON)))
    assert proc.returncode == 0, shown(proc)
    assert f"Check mode, nothing written: a run would merge 1 of 1 hosts into {out}/cluster.db" in proc.stdout, shown(proc)
    assert "merged into" not in proc.stdout and not out.exists()


def test_a_word_of_the_sql_never_retargets_the_play(tmp_path):
    """Ansible splits `-e sql=...` at spaces and makes `target='x'` in the SQL a variable of its own: the
    play's hosts were read from it (no host matched, nothing ran, exit 0). The hosts now come from the
    options as typed (straggler.fleet.playbook_option), the SQL whole."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_api_helpers import make_node_db
    make_node_db(tmp_path / "node.db", "localhost", 0)
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"[gpu]\nlocalhost ansible_connection=local ansible_python_interpreter={HOST_PYTHON}\n")
    sql = "WITH t(target) AS (SELECT 'y') SELECT count(*) AS n FROM t WHERE target='x' OR 1"
    proc = ansible_playbook("-i", inventory, "playbooks/fleet_query.yml", "-e", f"sql={sql}",
                            "-e", json.dumps(dict(straggler_agent_db=str(tmp_path / "node.db"),
                                                  straggler_agent_venv=str(VENV_BIN.parent),
                                                  straggler_results_dir=str(tmp_path / "results"))))
    assert proc.returncode == 0, shown(proc)
    assert "1 rows from 1 of 1 hosts" in proc.stdout, shown(proc)
    (written,) = (tmp_path / "results").iterdir()
    assert json.loads(written.read_text())["sql"] == sql


def test_fleet_query_reads_and_checks_its_options_under_tags_always(tmp_path):
    """`--tags always` runs the options' reading and check (a bad option fails), `--tags query` the query."""
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"[gpu]\nlocalhost ansible_connection=local ansible_python_interpreter={HOST_PYTHON}\n")
    proc = ansible_playbook("-i", inventory, "playbooks/fleet_query.yml", "--tags", "always", "-e", "straggler_limit=0")
    assert proc.returncode == 2 and "straggler_limit at least 1" in proc.stdout, shown(proc)
    proc = ansible_playbook("-i", inventory, "playbooks/fleet_query.yml", "--list-tasks", "--tags", "query")
    assert proc.returncode == 0 and "Query every host over SSH" in proc.stdout, shown(proc)
    assert "Write the results file" in proc.stdout, shown(proc)


def test_trace_yml_deploys_batch_by_batch_with_straggler_serial(tmp_path):
    """-e straggler_serial=1: a rolling deploy, one host at a time (in check mode, a stand-in wheel)."""
    (tmp_path / "inventory.ini").write_text(textwrap.dedent(f"""\
        [gpu]
        node-a ansible_connection=local ansible_python_interpreter={HOST_PYTHON}
        node-b ansible_connection=local ansible_python_interpreter={HOST_PYTHON}
        """))
    extra = trace_check_vars(tmp_path, straggler_serial=1)
    proc = ansible_playbook("-i", tmp_path / "inventory.ini", "playbooks/trace.yml", "--check", "-e", json.dumps(extra))
    assert proc.returncode == 0, shown(proc)
    batches = re.findall(r"TASK \[Read the options[^\n]*\n\w+: \[([^\]]+)\]", proc.stdout)
    assert batches == ["node-a", "node-b"], shown(proc)              # one batch per host, in order
    assert "not read" not in proc.stdout and "straggler_serial" not in proc.stderr, shown(proc)


def test_the_target_option_may_be_a_template_as_a_variable_may(tmp_path):
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"[gpu]\n[other]\nlocalhost ansible_connection=local ansible_python_interpreter={HOST_PYTHON}\n")
    playbook = tmp_path / "target.yml"
    playbook.write_text(textwrap.dedent("""\
        - name: target
          hosts: "{{ lookup('straggler.fleet.playbook_option', 'target', default='gpu') }}"
          gather_facts: false
          tasks:
            - name: say
              ansible.builtin.debug:
                msg: TARGETED
        """))
    proc = ansible_playbook("-i", inventory, playbook, "-e", "target={{ 'oth' ~ 'er' }}")
    assert proc.returncode == 0 and '"msg": "TARGETED"' in proc.stdout, shown(proc)
