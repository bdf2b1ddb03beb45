"""The playbooks as people type them, on this machine alone (local connections, no test bed):
`cd playbooks && ansible-playbook fleet_query.yml -e sql="SELECT ... WHERE rank = 1"` (the shell hands
Ansible one argument with spaces and '=', which Ansible itself would split), the same from the
repository root as playbooks/fleet_query.yml, the prefixed names, a name the playbook does not read,
a wrong choice, the inventory's short names ignored, one row limit for both transports, tags, the
ad hoc query's table, `serial` under aggregate, and results files only the controller's user reads.

The hosts' "database" is a real node database made with the core's schema, read through the agent
CLI of the repository's .venv (straggler_agent_venv), exactly as on a deployed host."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent
HOST_PYTHON = "/usr/bin/python3"
EXTRA_VARS = REPO / "collections/ansible_collections/straggler/fleet/plugins/plugin_utils/extra_vars.py"
SQL = "SELECT node, count(*) AS n FROM events WHERE seq=2 OR op = 'cuLaunchKernel' GROUP BY node"


def shown(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Two local hosts, each with its own node database; their group sets short names that must not count."""
    from straggler.store import schema
    import sqlite3
    base = tmp_path_factory.mktemp("typed")
    lines = ["[gpu]"]
    for name in ("node-a", "node-b"):
        db = base / f"{name}.db"
        with sqlite3.connect(db) as conn:
            schema.create(conn, node=name)
            conn.executemany("INSERT INTO events(seq, node, source, op, ts, duration) VALUES (?, ?, ?, ?, ?, ?)",
                             [(1, name, "cuda", "cuLaunchKernel", 1000, 5000), (2, name, "nccl", "ncclAllReduce", 9000, 8),
                              (3, name, "sched", "offcpu", 12000, 250)])
        lines.append(f"{name} ansible_connection=local ansible_python_interpreter={HOST_PYTHON} "
                     f"straggler_agent_db={db}")
    lines += ["[gpu:vars]", f"straggler_agent_venv={VENV}", "target=nowhere", "sql=SELECT 1 AS inventory",
              "transport=https", "ansible_become=false"]
    (base / "inventory.ini").write_text("\n".join(lines) + "\n")
    return base


def playbook(*args, cwd, timeout=300, config=None):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PATH=f"{VENV / 'bin'}:{os.environ['PATH']}")
    env.pop("ANSIBLE_CONFIG", None)
    if config:
        env["ANSIBLE_CONFIG"] = str(config)
    return subprocess.run([str(VENV / "bin" / "ansible-playbook"), *map(str, args)], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def results_of(proc, results_dir):
    match = re.search(r"rows from \d+ of \d+ hosts in (\S+\.json)", proc.stdout)
    assert match, shown(proc)
    path = Path(match.group(1))
    assert path.parent == results_dir
    return path, json.loads(path.read_text())


def test_fleet_query_from_playbooks_dir_takes_the_sql_as_typed_with_spaces_and_equals(hosts):
    results = hosts / "results-cwd"
    # what the shell hands over for: -e sql="SELECT ... WHERE seq = 2 OR op = 'cuLaunchKernel' GROUP BY node"
    proc = playbook("-i", hosts / "inventory.ini", "fleet_query.yml", "-e", f"sql={SQL}",
                    "-e", f"straggler_results_dir={results}", cwd=REPO / "playbooks")
    assert proc.returncode == 0, shown(proc)
    path, data = results_of(proc, results)
    assert data["sql"] == SQL and data["transport"] == "ssh", data        # the inventory's sql/transport: ignored
    assert data["columns"] == ["node", "n"] and sorted(data["rows"]) == [["node-a", 2], ["node-b", 2]], data
    assert path.stat().st_mode & 0o777 == 0o600 and results.stat().st_mode & 0o777 == 0o700
    assert "[WARNING]" not in proc.stdout + proc.stderr, shown(proc)
    assert "│ node-a" in proc.stdout, shown(proc)                          # the summary table (playbooks/ansible.cfg)


def test_from_the_root_the_prefixed_name_works_and_an_unread_variable_is_reported(hosts):
    results = hosts / "results-root"
    proc = playbook("-i", hosts / "inventory.ini", "playbooks/fleet_query.yml", "-e", f"straggler_sql={SQL}",
                    "-e", f"straggler_results_dir={results}", "-e", "sqll=SELECT 2", "-e", "straggler_out=/elsewhere",
                    cwd=REPO)
    assert proc.returncode == 0, shown(proc)
    assert results_of(proc, results)[1]["sql"] == SQL
    warning = re.search(r"\[WARNING\]: (fleet_query\.yml does not read .*)", proc.stdout + proc.stderr)
    assert warning and "-e sqll (did you mean sql?)" in warning.group(1), shown(proc)
    assert "straggler_out" not in warning.group(1)          # another playbook's option: no typo


def test_short_and_prefixed_names_that_disagree_and_a_wrong_choice_fail_in_one_line(hosts):
    for args, expected in ((["-e", "sql=SELECT 1", "-e", "straggler_sql=SELECT 2"],
                            "-e straggler_sql and -e sql disagree: give one of them"),
                           (["-e", "transport=carrier-pigeon"],
                            "value of transport must be one of: ssh, https, got: carrier-pigeon (transport from -e transport)")):
        proc = playbook("-i", hosts / "inventory.ini", "fleet_query.yml", *args, cwd=REPO / "playbooks")
        assert proc.returncode == 2 and expected in proc.stdout, shown(proc)
        assert "Traceback" not in proc.stdout + proc.stderr


def test_target_from_the_command_line_picks_the_hosts_and_the_limit_reaches_the_module(hosts):
    results = hosts / "results-target"
    proc = playbook("-i", hosts / "inventory.ini", "fleet_query.yml", "-e", "target=node-b", "-e", "straggler_limit=1",
                    "-e", "sql=SELECT op FROM events ORDER BY seq", "-e", f"straggler_results_dir={results}",
                    cwd=REPO / "playbooks")
    assert proc.returncode == 0, shown(proc)
    data = results_of(proc, results)[1]
    assert [h["host"] for h in data["hosts"]] == ["node-b"] and data["rows"] == [["node-b", "cuLaunchKernel"]], data
    assert data["hosts"][0]["truncated"] is True


def test_every_option_the_playbooks_read_is_known_to_the_collection():
    """extra_vars.COLLECTION_VARIABLES (what is never reported as unread) is exactly the playbooks' options."""
    tree = ast.parse(EXTRA_VARS.read_text())
    known = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "COLLECTION_VARIABLES")
    read = set()
    for path in (REPO / "playbooks").glob("*.yml"):
        for play in yaml.safe_load(path.read_text()) or []:
            for task in play.get("tasks") or []:
                if "straggler.fleet.playbook_options" in task:
                    read |= {f"straggler_{name}" for name in task["straggler.fleet.playbook_options"]["options"]}
    assert read == set(known), (sorted(read - set(known)), sorted(set(known) - read))


def test_tags_pick_a_part_of_the_roles():
    listed = {}
    for tag in ("pki", "packages", "service"):
        proc = playbook("-i", "localhost,", "playbooks/trace.yml", "--list-tasks", "--tags", tag, cwd=REPO)
        assert proc.returncode == 0, shown(proc)
        listed[tag] = proc.stdout
    assert "Issue and distribute the TLS files" in listed["pki"]
    assert "Install, start or stop the agent" not in listed["pki"]
    assert "Install, start or stop the agent" in listed["packages"] and "Issue and distribute" not in listed["service"]


def test_ad_hoc_query_gets_one_table_from_the_summary_callback(hosts):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               PATH=f"{VENV / 'bin'}:{os.environ['PATH']}")
    proc = subprocess.run([str(VENV / "bin" / "ansible"), "-i", str(hosts / "inventory.ini"), "gpu", "-m",
                           "straggler.fleet.query", "-a",
                           f"sql='SELECT count(*) AS n FROM events' straggler_bin={VENV / 'bin' / 'straggler'}"],
                          # no db: each host's straggler_agent_db, as in the playbooks (before, the module's default
                          # path, the same for every host)
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, shown(proc)
    table = proc.stdout.split("PLAY RECAP")[-1] if "PLAY RECAP" in proc.stdout else proc.stdout
    assert re.search(r"node\s+.*\bn\b", table) and re.search(r"node-a\s+.*\b3\b", table), shown(proc)


def test_aggregate_under_serial_lists_later_batches_as_pending_and_the_last_holds_all(hosts):
    book = hosts / "serial.yml"
    book.write_text(textwrap.dedent(f"""\
        - name: serial
          hosts: gpu
          gather_facts: false
          serial: 1
          tasks:
            - name: query
              straggler.fleet.query:
                sql: SELECT count(*) AS n FROM events
                db: "{{{{ straggler_agent_db }}}}"
                straggler_bin: {VENV / 'bin' / 'straggler'}
              register: straggler_query
            - name: table
              straggler.fleet.aggregate:
              register: table
            - name: show
              ansible.builtin.debug:
                msg: "TABLE {{{{ table.hosts | map(attribute='status') | join(',') }}}} PENDING {{{{ table.pending | join(',') }}}} MISSING {{{{ table.missing | join(',') }}}}"
        """))
    proc = playbook("-i", hosts / "inventory.ini", book, cwd=REPO, config=REPO / "ansible.cfg")
    assert proc.returncode == 0, shown(proc)
    tables = re.findall(r"TABLE (\S*) PENDING (\S*) MISSING (\S*)\"", proc.stdout)
    assert tables == [("ok,pending", "node-b", ""), ("ok,ok", "", "")], shown(proc)


@pytest.mark.parametrize("name", ["trace", "fleet_query", "explain", "collect", "diagnose"])
def test_every_playbook_runs_from_the_playbooks_directory_without_the_roots_config(name):
    """cd playbooks && ansible-playbook NAME.yml: playbooks/ansible.cfg finds the checkout's collection and roles."""
    proc = playbook("--syntax-check", f"{name}.yml", cwd=REPO / "playbooks")
    assert proc.returncode == 0, shown(proc)


def test_explain_judges_the_span_given_as_straggler_since_and_until(tmp_path):
    """-e straggler_since/straggler_until reach explain (explain.yml, diagnose.yml through it): a cut after
    the first of two faults names the second; a reversed span fails the run in one line."""
    from straggler_lab import series
    db = tmp_path / "cluster.db"
    series.write_cluster(str(db), series.SeriesSpec(nodes=4, seconds=600, faults=[
        series.Fault(node=1, start_s=150, end_s=200, kind="cpu", slow=2.0),
        series.Fault(node=2, start_s=400, end_s=450, kind="host", slow=2.0)]))
    out = tmp_path / "out"
    proc = playbook("explain.yml", "-e", f"straggler_cluster_db={db}", "-e", f"straggler_out={out}",
                    "-e", "straggler_since=2026-01-01T00:05:00", cwd=REPO / "playbooks")
    assert proc.returncode == 0 and "[WARNING]" not in proc.stdout + proc.stderr, shown(proc)
    report = json.loads((out / "report.json").read_text())
    assert report["straggler"] == "gpu-node-03" and report["span"]["since"].startswith("2026-01-01T00:05:00")
    proc = playbook("explain.yml", "-e", f"straggler_cluster_db={db}", "-e", f"straggler_out={out}",
                    "-e", "straggler_since=400", "-e", "straggler_until=300", cwd=REPO / "playbooks")
    assert proc.returncode == 2 and "explain failed: --since '400' is not before --until '300'" in proc.stdout, shown(proc)


def test_check_mode_writes_no_results_on_the_controller(hosts):
    """fleet_query.yml and collect.yml with --check: every step reports, no results directory appears."""
    out = hosts / "check-mode"
    for name, option in (("fleet_query.yml", f"straggler_results_dir={out / 'results'}"), ("collect.yml", f"out={out / 'collect'}")):
        proc = playbook("-i", hosts / "inventory.ini", name, "--check", "-e", option, cwd=REPO / "playbooks")
        assert proc.returncode == 0, shown(proc)
        assert not out.exists(), (name, sorted(str(p) for p in out.rglob("*")))
