"""The Ansible collection straggler.fleet, as a user meets it on one machine: its unit tests,
`ansible-test sanity`, the ad hoc query, and a playbook over three inventory hosts (local
connections, each with its own node database) plus one unreachable host, through query,
aggregate, clock_facts, collect, merge, explain and export, with the summary callback beside the default,
a JSON and the JUnit callbacks; the watch action against agents serving a running synthetic job,
and explain's tuning options.

The hosts' Python here is Debian's /usr/bin/python3, which cannot import the straggler package:
the modules must work through the agent CLI alone. The multi-host SSH path is in
tests/test_collection_testbed.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from xml.etree import ElementTree
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COLLECTION = REPO / "collections" / "ansible_collections" / "straggler" / "fleet"
VENV_BIN = Path(sys.executable).parent
STRAGGLER_BIN = VENV_BIN / "straggler"
HOST_PYTHON = "/usr/bin/python3"
NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03"]

# A stdout callback that prints one JSON document, the way ansible.posix.json does (that collection
# is not installed here): the summary must not end up inside it.
JSON_STDOUT_CALLBACK = '''
from __future__ import annotations
DOCUMENTATION = """
name: json
type: stdout
short_description: test stand-in for ansible.posix.json
description: [Prints the play results as one JSON document.]
"""
import json
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'stdout'
    CALLBACK_NAME = 'json'

    def __init__(self, display=None):
        super().__init__(display)
        self.results = []

    def v2_runner_on_ok(self, result):
        self.results.append(dict(host=result._host.get_name(), task=result._task.get_name(), ok=True))

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self.results.append(dict(host=result._host.get_name(), task=result._task.get_name(), ok=False))

    def v2_runner_on_unreachable(self, result):
        self.results.append(dict(host=result._host.get_name(), task=result._task.get_name(), ok=False))

    def v2_playbook_on_stats(self, stats):
        self._display.display(json.dumps(dict(plays=self.results), indent=2))
'''


def run(argv, env, cwd, timeout=240):
    return subprocess.run([str(a) for a in argv], env=env, cwd=str(cwd), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def shown(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def sanity_run(tmp_path_factory):
    """`ansible-test sanity` started in the background by the first test (it is the slowest part,
    and mostly single-threaded), so the playbook tests run meanwhile; finished and checked by
    test_ansible_test_sanity_passes, the module's last test; stopped (by its pid) if still running
    when the module's tests end."""
    log = tmp_path_factory.mktemp("sanity") / "sanity.log"
    with open(log, "w") as handle:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "sanity.sh")], cwd=str(REPO), stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    yield dict(proc=proc, log=log)
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def test_collection_unit_tests_pass(sanity_run):
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", COLLECTION / "tests" / "unit"],
               env=dict(os.environ), cwd=REPO, timeout=300)
    assert proc.returncode == 0, shown(proc)
    assert " passed" in proc.stdout and " failed" not in proc.stdout


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three node databases (a synthetic job whose second node straggles), an inventory of three
    local hosts and one unreachable one, and an ansible.cfg of their own."""
    from straggler_lab import synth
    base = tmp_path_factory.mktemp("fleet")
    facts = synth.write_nodes(str(base / "nodes"), synth.SynthSpec(nodes=3, events=6000, scenario="io_cpu", straggler=1))
    dbs = {Path(entry["path"]).stem: entry["path"] for entry in facts["files"]}
    assert sorted(dbs) == NODES
    lines = ["[gpu]"]
    for name in NODES:
        lines.append(f"{name} ansible_connection=local ansible_python_interpreter={HOST_PYTHON} straggler_db={dbs[name]}")
    # nothing listens on port 1 of the loopback address: refused at once
    lines.append("gpu-node-04 ansible_host=127.0.0.1 ansible_port=1 ansible_connection=ssh straggler_db=/nowhere")
    (base / "inventory.ini").write_text("\n".join(lines) + "\n")
    (base / "callbacks").mkdir()
    (base / "callbacks" / "json.py").write_text(JSON_STDOUT_CALLBACK)
    (base / "ansible.cfg").write_text(textwrap.dedent(f"""\
        [defaults]
        inventory = {base / 'inventory.ini'}
        collections_path = {REPO / 'collections'}
        callback_plugins = {base / 'callbacks'}
        callbacks_enabled = straggler.fleet.summary
        host_key_checking = False
        retry_files_enabled = False
        timeout = 5
        forks = 4
        local_tmp = {base / 'ansible-tmp'}
        [ssh_connection]
        retries = 0
        """))
    env = dict(os.environ, ANSIBLE_CONFIG=str(base / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}", STRAGGLER_SUMMARY_OUTPUT="auto")
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    return dict(base=base, env=env, dbs=dbs, truth=facts)


PLAYBOOK = """
- name: ask every node
  hosts: gpu
  gather_facts: false
  tasks:
    - name: events per node
      straggler.fleet.query:
        sql: SELECT count(*) AS events, max(duration) AS longest_ns FROM events
        db: "{{{{ straggler_db }}}}"
        straggler_bin: {bin}
      register: straggler_query
      ignore_unreachable: true

    - name: one table
      straggler.fleet.aggregate:
        dest: "{{{{ out }}}}/events.{{{{ fmt }}}}"

    - name: clock offsets
      straggler.fleet.clock_facts:
        samples: 4

    - name: fetch the databases
      straggler.fleet.collect:
        dest: "{{{{ out }}}}/collected"
        db: "{{{{ straggler_db }}}}"
        straggler_bin: {bin}
        snapshot_dir: "{{{{ out }}}}/host-tmp"

- name: analyse on the controller
  hosts: localhost
  gather_facts: false
  tasks:
    - name: merge
      straggler.fleet.merge:
        src: "{{{{ out }}}}/collected"
        dest: "{{{{ out }}}}/cluster.db"
        offsets_from_hosts: "{{{{ groups['gpu'] }}}}"
      register: straggler_merge

    - name: explain
      straggler.fleet.explain:
        db: "{{{{ out }}}}/cluster.db"
        junit: "{{{{ out }}}}/explain-junit.xml"
        markdown: "{{{{ out }}}}/explain.md"
        fail_on_straggler: "{{{{ fail_on_straggler | default(false) | bool }}}}"
      register: straggler_report

    - name: export a timeline
      straggler.fleet.export:
        db: "{{{{ out }}}}/cluster.db"
        dest: "{{{{ out }}}}/trace.json"

    - name: keep what the tasks returned
      ansible.builtin.copy:
        dest: "{{{{ out }}}}/results.json"
        content: "{{{{ dict(merge=straggler_merge, report=straggler_report,
                      clock=dict(live | zip(live | map('extract', hostvars, ['ansible_facts', 'straggler_clock'])))) | to_json }}}}"
      vars:
        live: [gpu-node-01, gpu-node-02, gpu-node-03]
"""


def run_playbook(fleet, out, extra_env=None, fmt="json", extra_vars=None, extra_args=()):
    out.mkdir(parents=True, exist_ok=True)
    (out / "host-tmp").mkdir(exist_ok=True)
    playbook = out / "playbook.yml"
    playbook.write_text(PLAYBOOK.format(bin=STRAGGLER_BIN))
    env = dict(fleet["env"], **(extra_env or {}))
    args = ["-e", f"out={out}", "-e", f"fmt={fmt}"]
    for key, value in (extra_vars or {}).items():
        args += ["-e", f"{key}={value}"]
    return run([VENV_BIN / "ansible-playbook", playbook, *args, *extra_args], env=env, cwd=fleet["base"])


def test_adhoc_query_runs_on_every_host_and_reports_the_unreachable_one(fleet):
    proc = run([VENV_BIN / "ansible", "gpu", "-m", "straggler.fleet.query",
                "-a", f"sql='SELECT count(*) FROM events' straggler_bin={STRAGGLER_BIN} db={fleet['dbs']['gpu-node-02']}"],
               env=fleet["env"], cwd=fleet["base"])
    assert proc.returncode == 4, shown(proc)  # ansible's exit code when a host was unreachable
    for name in NODES:
        assert f"{name} | SUCCESS" in proc.stdout, shown(proc)
    assert "gpu-node-04 | UNREACHABLE!" in proc.stdout, shown(proc)
    assert proc.stdout.count('"row_count": 1') == 3


def test_playbook_from_query_to_explain_with_an_unreachable_host(fleet):
    out = fleet["base"] / "run1"
    # facts are read from ansible_facts: this works without the top-level copies that ansible-core
    # stops injecting (INJECT_FACTS_AS_VARS)
    proc = run_playbook(fleet, out, extra_vars=dict(fail_on_straggler="false"),
                        extra_env=dict(ANSIBLE_INJECT_FACT_VARS="False"))
    # the unreachable host leaves the play; everything else finishes (ansible exits 4 for it)
    assert proc.returncode == 4, shown(proc)

    table = json.loads((out / "events.json").read_text())
    assert table["columns"] == ["node", "events", "longest_ns"]
    assert [row[0] for row in table["rows"]] == NODES
    statuses = {entry["host"]: entry["status"] for entry in table["hosts"]}
    assert statuses == {"gpu-node-01": "ok", "gpu-node-02": "ok", "gpu-node-03": "ok", "gpu-node-04": "unreachable"}
    assert table["missing"] == ["gpu-node-04"]

    assert sorted(os.listdir(out / "collected")) == [f"{name}.db" for name in NODES]
    assert os.listdir(out / "host-tmp") == [], "collect left snapshots on the host"

    results = json.loads((out / "results.json").read_text())
    clock = results["clock"]
    for name in NODES:  # local connections: the host clock is the controller's, within the uncertainty
        assert abs(clock[name]["offset_ns"]) <= clock[name]["uncertainty_ns"] + 1_000_000, clock[name]
        assert clock[name]["samples"] == 4 and clock[name]["method"] == "local"
    merge = results["merge"]
    assert sorted(merge["nodes"]) == NODES
    assert all(merge["summary"]["clock_alignment"][name]["source"] == "given" for name in NODES)
    report = results["report"]
    assert report["straggler"] == fleet["truth"]["straggler"] == "gpu-node-02"
    assert report["msg"].startswith("straggler: gpu-node-02")
    suite = ElementTree.parse(str(out / "explain-junit.xml")).getroot()
    assert suite.get("failures") == "1"
    trace = json.loads((out / "trace.json").read_text())
    processes = [event["args"]["name"] for event in trace["traceEvents"] if event.get("name") == "process_name"]
    assert all(any(name in process for process in processes) for name in NODES), processes

    # after the recap, on stdout beside the default callback, the summary callback printed the
    # table with every host's status, then explain's verdict
    summary = proc.stdout[proc.stdout.index("PLAY RECAP"):]
    assert "ask every node: one table" in summary, shown(proc)
    assert "missing hosts: gpu-node-04" in summary and "unreachable" in summary
    assert all(name in summary for name in NODES)
    assert "analyse on the controller: explain: straggler: gpu-node-02" in summary


def test_json_stdout_stays_json_junit_is_written_and_a_straggler_fails_the_run(fleet):
    out = fleet["base"] / "run-json"
    junit_dir = out / "junit"
    proc = run_playbook(fleet, out, fmt="csv", extra_vars=dict(fail_on_straggler="true"), extra_env=dict(
        ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CALLBACKS_ENABLED="straggler.fleet.summary,ansible.builtin.junit",
        JUNIT_OUTPUT_DIR=str(junit_dir)))
    assert proc.returncode != 0, shown(proc)
    document = json.loads(proc.stdout)  # nothing but the JSON document on stdout
    tasks = {(entry["host"], entry["task"]): entry["ok"] for entry in document["plays"]}
    assert tasks[("gpu-node-01", "one table")] is True
    assert tasks[("localhost", "explain")] is False  # fail_on_straggler: the straggler fails the task
    assert "missing hosts: gpu-node-04" in proc.stderr, shown(proc)
    assert "explain: straggler: gpu-node-02" in proc.stderr
    reports = list(junit_dir.glob("*.xml"))
    assert reports, "the junit callback wrote nothing"
    for report in reports:
        ElementTree.parse(str(report))
    assert (out / "events.csv").read_text().splitlines()[0] == "node,events,longest_ns"
    assert (out / "explain-junit.xml").exists() and (out / "explain.md").exists()  # written before failing


def test_check_mode_runs_through_and_writes_nothing(fleet):
    out = fleet["base"] / "run-check"
    proc = run_playbook(fleet, out, extra_args=["--check"])
    assert proc.returncode == 4, shown(proc)
    assert "would merge" in proc.stdout or "skipping" in proc.stdout, shown(proc)
    assert not (out / "events.json").exists()
    assert not (out / "collected").exists() and not (out / "cluster.db").exists()
    assert os.listdir(out / "host-tmp") == []


@pytest.fixture
def watched_agents(tmp_path):
    """Four agents (straggler serve --no-tls, in this process) on a synthetic job whose second node
    straggles (a CPU hog), running now: what straggler.fleet.watch watches."""
    from straggler_lab import synth
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    facts = synth.write_nodes(str(tmp_path), synth.SynthSpec(scenario="cpu_hog", events=48000, straggler=1,
                                                                     interference_start=0.7))
    synth.shift_to_now([entry["path"] for entry in facts["files"]])
    handles = [start_background(entry["path"], node=entry["node"], listen="127.0.0.1:0", tls=TLSOptions(no_tls=True))
               for entry in facts["files"]]
    try:
        yield dict(nodes=",".join(f"127.0.0.1:{handle.port}" for handle in handles), truth=facts)
    finally:
        for handle in handles:
            handle.stop()


def adhoc_result(proc, host="localhost"):
    """The task result the ad hoc command printed for `host` (`host | STATUS => {...}`)."""
    head = f"{host} | "
    start = proc.stdout.index(head)
    return json.loads(proc.stdout[proc.stdout.index("{", start):])


def test_watch_fails_the_task_at_the_straggler_and_check_mode_skips(fleet, watched_agents):
    assert watched_agents["truth"]["straggler"] == "gpu-node-02"
    out = fleet["base"] / "watch"
    args = (f"nodes={watched_agents['nodes']} no_tls=true duration=60 interval=0.5 window=5 "
            f"dest={out / 'watch.jsonl'}")
    proc = run([VENV_BIN / "ansible", "localhost", "-m", "straggler.fleet.watch", "-a", args],
               env=fleet["env"], cwd=fleet["base"], timeout=120)
    assert proc.returncode == 2, shown(proc)          # the task failed: ansible's exit status for it
    assert "localhost | FAILED!" in proc.stdout, shown(proc)
    result = adhoc_result(proc)
    assert result["straggler"] == "gpu-node-02", result["msg"]
    assert result["msg"].startswith("straggler: gpu-node-02 rank 1: "), result["msg"]
    finding = result["finding"]
    assert finding["event"] == "onset" and finding["node"] == "gpu-node-02" and finding["cause"], finding
    assert result["lost"] == [] and result["changed"] is True
    # stopped at the onset, long before the 60 s: the last event ends the watch for the straggler
    assert result["events"][-1]["event"] == "end" and result["events"][-1]["reason"] == "straggler"
    assert result["events"][-1]["watch_s"] < 30
    # the job's time lost over the last window: this synthetic job's collective calls do not line up (a sample of
    # them), so it is not measured, and the task says why
    assert result["time_lost"] == result["events"][-1]["window"], result["time_lost"]
    assert result["time_lost"]["measured"] is False and "line up" in result["time_lost"]["why"], result["time_lost"]
    lines = [json.loads(line) for line in (out / "watch.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == [e["event"] for e in result["events"]]

    # check mode: nothing is watched (it would only read, for `duration` seconds), the task is skipped
    env = dict(fleet["env"], ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    args = f"nodes={watched_agents['nodes']} no_tls=true duration=600 dest={out / 'check.jsonl'}"
    proc = run([VENV_BIN / "ansible", "localhost", "-m", "straggler.fleet.watch", "-a", args, "--check", "-v"],
               env=env, cwd=fleet["base"], timeout=60)
    assert proc.returncode == 0, shown(proc)
    assert "skipping: [localhost]" in proc.stdout and "check mode: not watching" in proc.stdout, shown(proc)
    assert not (out / "check.jsonl").exists()


def test_explain_takes_min_gap_and_last_and_refuses_the_old_k(fleet):
    from straggler_lab import synth
    cluster = fleet["base"] / "explain-options" / "cluster.db"
    cluster.parent.mkdir()
    synth.write_cluster(str(cluster), synth.SynthSpec(nodes=3, events=6000, scenario="io_cpu", straggler=1))
    proc = run([VENV_BIN / "ansible", "localhost", "-m", "straggler.fleet.explain",
                "-a", f"db={cluster} min_gap=0.02 baseline_fraction=0.3"], env=fleet["env"], cwd=fleet["base"])
    assert proc.returncode == 0, shown(proc)
    result = adhoc_result(proc)
    assert result["report"]["options"]["min_gap"] == 0.02, result["report"]["options"]   # it reached the core
    assert result["straggler"] == "gpu-node-02"
    cause = result["cause"]   # the straggler's main cause, named in the one line
    assert cause["node"] == "gpu-node-02" and result["msg"].startswith(f"straggler: gpu-node-02: {cause['cause']} ("), result

    proc = run([VENV_BIN / "ansible", "localhost", "-m", "straggler.fleet.explain",
                "-a", f"db={cluster} last=2"], env=fleet["env"], cwd=fleet["base"])
    assert proc.returncode == 0, shown(proc)
    assert adhoc_result(proc)["report"]["options"]["recent_s"] == 2.0

    proc = run([VENV_BIN / "ansible", "localhost", "-m", "straggler.fleet.explain", "-a", f"db={cluster} k=3"],
               env=fleet["env"], cwd=fleet["base"])
    assert proc.returncode == 2, shown(proc)
    message = adhoc_result(proc)["msg"]
    assert message.startswith("Unsupported parameters") and " module: k. " in message, shown(proc)


def test_ansible_test_sanity_passes(sanity_run):
    proc = sanity_run["proc"]
    try:
        returncode = proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("ansible-test sanity did not finish within 600 s")
    output = sanity_run["log"].read_text()
    assert returncode == 0, output[-8000:]
    assert "FATAL" not in output and 'Running sanity test "validate-modules"' in output
