"""Integration tests of the roles (straggler_agent, straggler_pki) and the playbooks on the multi-host test bed: real
SSH, real agents with eBPF (scope netns: the test bed's hosts share one kernel), real mutual TLS.
They run as a user of the collection would: the tarball `make collection` builds, installed with
ansible-galaxy, `ansible-playbook straggler.fleet.<name>` from a directory outside the repository
with a controller that has only ansible-core plus what the collection declares (the agent role
installs the wheel the collection carries). The repository's own playbooks/ paths run in
tests/test_acceptance.py (the demo).

The fleet here is two of the test bed's live hosts, gpu-node-01 and gpu-node-02, and its dead one,
gpu-node-dead (SSH hangs until the timeout): an inventory of their own with the test bed's connection
settings (two hosts show every behaviour of a fleet that four do, in half the time; the four-host
deployment is tests/test_acceptance.py's, as `make demo` runs it). What a user would notice is asserted: the playbooks finish with the live hosts'
results, list the dead host, exit with the documented status (playbooks/README.md: 4 when a host
was unreachable, 2 when one answered with an error or a straggler was found, 0 when complete), a
second deployment changes nothing, and the deployed hosts look right from the outside
(pytest-testinfra over the test bed's inventory, TLS handshakes from the controller).

Typed as users type them, too: the second deployment is the README's first command on the README's
inventory ("From zero to a first fleet query", as written, in the walkthrough's fresh home), and its
second, the fleet query, follows; a rebuild redeploys with `-e target=live` (a short name on the
command line), fleet_query gets `-e sql="..."` with spaces and '=', check mode on the set-up controller
leaves its directories byte-identical, a second controller that brings the same CA (and nothing else)
changes nothing on the hosts, whose agents keep running, and the inventory plugin straggler.fleet.jobs
groups the hosts by the job running on them (a two-rank job on the stand-in CUDA libraries, which the
agents trace), so that `-l job_<id>` targets exactly those nodes.

The tests of this module run in order and share one deployment (module-scoped fixtures); the last
one removes it. The controller's home is the walkthrough's, a fresh one under /tmp (its
~/.local/share/straggler holds the README's results); nothing is written into the real home or the
checkout: everything else the playbooks write goes to a temporary directory.
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import sqlite3
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pftrace_replay import Replay  # tests/pftrace_replay.py
from straggler_lab import procs
from straggler_lab.standin import LIBRARIES as STANDIN_LIBS

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
LIVE = ["gpu-node-01", "gpu-node-02"]
DEAD = "gpu-node-dead"
AGENT_PORT = 7433
PLAYBOOK_TIMEOUT_S = 600
RECAP_RE = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                      r"\s+rescued=(\d+)\s+ignored=(\d+)", re.M)

# Deploying compiles the BPF programs on the hosts at once: minutes on a busy 2-core machine.
pytestmark = [pytest.mark.bpf, pytest.mark.timeout(1800)]


@dataclass
class PlaybookRun:
    argv: list
    rc: int
    stdout: str
    stderr: str
    recap: dict = field(default_factory=dict)   # host -> {ok, changed, unreachable, failed, ...}

    def explain(self) -> str:
        return f"$ {' '.join(map(str, self.argv))}\nrc={self.rc}\n{self.stdout[-6000:]}\n{self.stderr[-3000:]}"


def parse_recap(stdout: str) -> dict:
    keys = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
    return {m.group(1): dict(zip(keys, map(int, m.groups()[1:]))) for m in RECAP_RE.finditer(stdout)}


@pytest.fixture(scope="module")
def work(tmp_path_factory, testbed, installed_collection):
    from straggler_lab.standin import build_standin
    root = collection_work(tmp_path_factory.mktemp("playbooks"), testbed, installed_collection, hosts=LIVE + [DEAD])
    build_standin(root / "standin")     # a job's stand-in CUDA/NCCL, visible from the hosts (under /tmp)
    return root


def collection_work(root: Path, testbed, user: dict, hosts: list | None = None) -> Path:
    """A work directory for run_playbook: the collection as a user has it (conftest's
    installed_collection: built from the sources, installed with ansible-galaxy, run by a controller
    venv that has only ansible-core plus what the collection declares, from a directory outside the
    repository: no ansible.cfg of ours, no roles_path, the roles come from the collection), with the
    test bed's connection settings (`hosts`: only these of its hosts, in an inventory of their own), and
    private PKI, wheel cache and results under root."""
    env = testbed.ansible_env(user["env"])
    # nothing that would find the repository's collection or roles
    env["ANSIBLE_COLLECTIONS_PATH"] = str(user["path"].parents[2])
    env["ANSIBLE_ROLES_PATH"] = str(root / "no-roles")
    env["ANSIBLE_CALLBACKS_ENABLED"] = "straggler.fleet.summary"
    (root / "logs").mkdir()
    inventory = testbed.inventory
    if hosts is not None:
        inventory = root / "inventory.ini"
        inventory.write_text("".join(line for line in testbed.inventory.read_text().splitlines(True)
                                     if line.split(" ", 1)[0].strip() not in set(testbed.all_hosts) - set(hosts)))
    WORK_ENV[str(root)] = (env, user, inventory)
    return root


WORK_ENV: dict = {}   # work dir -> (environment, installed collection, inventory) for run_playbook


def playbook_vars(work: Path, pki: str = "pki", **extra) -> str:
    data = {"straggler_pki_dir": str(work / pki), "straggler_agent_wheel_cache": str(work / "wheels"),
            "straggler_results_dir": str(work / "results"), "straggler_agent_scope": "netns",
            "straggler_agent_start_timeout": 240}
    if (work / "standin").is_dir():     # the agents trace a job's stand-in libraries (the jobs inventory)
        data["straggler_agent_cuda_libs"] = [str(work / "standin" / lib) for lib in STANDIN_LIBS]
    data.update(extra)
    return json.dumps(data)


def run_playbook(testbed, work: Path, name: str, *args: str, limit: str | None = None, **extra) -> PlaybookRun:
    """ansible-playbook straggler.fleet.<name> from the installed collection, outside the repository."""
    env, user, inventory = WORK_ENV[str(work)]
    argv = [str(user["venv"] / "bin" / "ansible-playbook"), "-i", str(inventory),
            f"straggler.fleet.{Path(name).stem}", "-e", playbook_vars(work, **extra)]
    if limit:
        argv += ["--limit", limit]
    argv += list(args)
    proc = subprocess.run(argv, cwd=user["root"], env=env, capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    logs = work / "logs"
    (logs / f"{len(list(logs.iterdir())):02d}-{name}.log").write_text(proc.stdout + proc.stderr)
    return PlaybookRun(argv, proc.returncode, proc.stdout, proc.stderr, parse_recap(proc.stdout))


def ansible(testbed, work: Path, tool: str, *args: str):
    """An Ansible tool of the collection users' controller, typed as users type it (no variables added)."""
    env, user, inventory = WORK_ENV[str(work)]
    argv = [str(user["venv"] / "bin" / tool), "-i", str(inventory), *map(str, args)]
    proc = subprocess.run(argv, cwd=user["root"], env=env, capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    logs = work / "logs"
    (logs / f"{len(list(logs.iterdir())):02d}-{tool}.log").write_text(" ".join(argv) + "\n" + proc.stdout + proc.stderr)
    return proc


def shown(proc) -> str:
    return f"$ {' '.join(proc.args)}\nexit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"


def snapshot(*roots: Path) -> dict:
    """Every file and directory under roots: path -> (mode, inode, sha256 of the content or None)."""
    found = {}
    for root in roots:
        for path in sorted([root, *root.rglob("*")]) if root.exists() else []:
            st = path.lstat()
            found[str(path)] = (st.st_mode, st.st_ino,
                                hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None)
    return found


def host_tls(testbed, hosts) -> dict:
    """Each host's TLS files: name -> 'file inode sha256' lines."""
    script = "cd /etc/straggler/tls && for f in ca.crt crl.pem node.crt node.key; do echo $f $(stat -c %i $f) " \
             "$(sha256sum < $f | cut -c1-64); done"
    return {name: testbed.exec(name, ["sh", "-c", script], timeout=60).stdout for name in hosts}


def host_side_changes(stdout: str) -> list:
    """The 'changed: [host]' lines of tasks that ran on a host (not delegated to the controller)."""
    return [line for line in stdout.splitlines() if line.startswith("changed: [") and "-> localhost" not in line]


@pytest.fixture(scope="module")
def deployed(testbed, work):
    """trace.yml twice: for real, and again as typed (check mode on hosts without the agent is
    tests/test_playbooks_local.py's, on this machine)."""
    for name in LIVE:  # a fresh start even if an earlier test file deployed agents here
        testbed.exec(name, ["sh", "-c", "[ -x /opt/straggler/bin/straggler-agentctl ] && "
                                        "/usr/bin/python3 /opt/straggler/bin/straggler-agentctl stop; "
                                        "rm -rf /opt/straggler/venv /etc/straggler/agent.yml /etc/straggler/tls"],
                     timeout=60)
    first = run_playbook(testbed, work, "trace.yml")
    second = readme_command(testbed, work, "straggler.fleet.trace")
    return {"first": first, "second": second}


def readme_command(testbed, work: Path, playbook: str) -> PlaybookRun:
    """The README's first command that runs `playbook` ("From zero to a first fleet query"), as written, in
    ~/fleet of the walkthrough's fresh home, with the venv its install block made active and nothing else
    of ours (no ANSIBLE_* variable: Ansible's defaults). ~/fleet/inventory.ini is the README's, each host's
    address the test bed's, with the test bed's connection settings added as [all:vars]; what a site keeps
    in group_vars/gpu.yml is this module's (its CA, wheel cache, the agents' netns scope), not the results
    directory: the table goes to the default one, under that home."""
    from galaxy_helpers import activated, readme_walkthrough
    _, user, _ = WORK_ENV[str(work)]
    walkthrough = readme_walkthrough()
    place = user["home"] / "fleet"
    inventory = walkthrough["inventory"]
    for name in LIVE:
        inventory, found = re.subn(rf"^{name} ansible_host=\S+", f"{name} ansible_host={testbed.all_hosts[name]}",
                                   inventory, flags=re.M)
        assert found == 1, f"the README's inventory has no line for {name}:\n{walkthrough['inventory']}"
    # the test bed's connection settings, pipelining too (its ansible.cfg's, which this run does not read)
    connection = testbed.inventory.read_text().split("[all:vars]", 1)[1].rstrip("\n") + "\nansible_pipelining=true\n"
    (place / "inventory.ini").write_text(f"{inventory}\n[all:vars]{connection}")
    site = json.loads(playbook_vars(work))
    del site["straggler_results_dir"]
    (place / "group_vars").mkdir(exist_ok=True)
    (place / "group_vars" / "gpu.yml").write_text(json.dumps(site, indent=1) + "\n")
    [command] = [c for c in walkthrough["first"] if playbook in c.split()]
    env = activated(user["newcomer_env"], user["venv"])
    proc = subprocess.run(["bash", "-c", command], cwd=place, env=env, capture_output=True, text=True,
                          timeout=PLAYBOOK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    logs = work / "logs"
    (logs / f"{len(list(logs.iterdir())):02d}-readme-{playbook}.log").write_text(command + "\n" + proc.stdout + proc.stderr)
    return PlaybookRun(["bash", "-c", command], proc.returncode, proc.stdout, proc.stderr, parse_recap(proc.stdout))


@pytest.fixture(scope="module")
def hosts(testbed, deployed):
    """testinfra hosts over SSH with the test bed's ssh_config (one ssh command per check, the
    connection kept open: the ansible backend costs a module run per check), by name."""
    testinfra = pytest.importorskip("testinfra")
    return {name: testinfra.get_host(f"ssh://{name}", ssh_config=str(testbed.ssh_config),
                                     controlpath=str(testbed.state_dir / "cp" / f"testinfra-{name}"))
            for name in LIVE}


def process_gone(pid: int) -> bool:
    """True when pid no longer runs (gone, or a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def agent_status(testbed, name: str) -> dict:
    proc = testbed.exec(name, ["/usr/bin/python3", "/opt/straggler/bin/straggler-agentctl", "status"], timeout=60)
    return json.loads(proc.stdout or "{}")


def tls_handshake(address: str, work: Path, max_version: ssl.TLSVersion) -> str:
    """Handshake with the agent as the fleet's controller would; returns the TLS version."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(work / "pki" / "ca.crt"))
    ctx.load_cert_chain(str(work / "pki" / "controller.crt"), str(work / "pki" / "controller.key"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.maximum_version = max_version
    with socket.create_connection((address, AGENT_PORT), timeout=15) as sock:
        with ctx.wrap_socket(sock, server_hostname=address) as tls:
            return tls.version()


# --------------------------------------------------------------------------- trace.yml

def test_trace_deploys_and_starts_agents_and_lists_the_dead_host(deployed, testbed):
    run = deployed["first"]
    assert run.rc == 4, "a partial run (one host unreachable) exits 4\n" + run.explain()
    for name in LIVE:
        assert run.recap[name]["failed"] == 0 and run.recap[name]["unreachable"] == 0, run.explain()
    assert run.recap[DEAD]["unreachable"] == 1, run.explain()
    assert "2 of 3 hosts tracing" in run.stdout and "Missing (unreachable or failed): gpu-node-dead" in run.stdout, \
        run.explain()
    for name in LIVE:
        status = agent_status(testbed, name)
        assert status.get("running") and status.get("current_config"), (name, status)


def test_the_readmes_trace_as_written_on_its_inventory_changes_nothing(deployed):
    run = deployed["second"]
    assert run.rc == 0, "the README's inventory: the live hosts alone, all reached\n" + run.explain()
    assert sorted(run.recap) == LIVE, run.explain()
    assert "[WARNING]" not in run.stdout + run.stderr, run.explain()
    for name in LIVE:
        assert run.recap[name]["changed"] == 0 and run.recap[name]["failed"] == 0, \
            f"{name} changed on the second run\n" + run.explain()


def test_a_rebuilt_collection_reinstalled_changes_and_restarts_nothing(deployed, testbed, work, tmp_path):
    """Rebuild the collection from the same sources, install it over the installed one (as a user upgrading
    does), run trace.yml again: the agent wheel is byte for byte the one the hosts run, so no host changes
    and no agent restarts (its supervisor's and agent's pids are the ones from before)."""
    from galaxy_helpers import build_collection
    env, user, _ = WORK_ENV[str(work)]
    before = {name: agent_status(testbed, name) for name in LIVE}
    assert all(b.get("running") and b.get("agent_pid") for b in before.values()), before
    built = build_collection(tmp_path / "dist", user["venv"] / "bin" / "python")   # the same build tools
    assert built["collection"] != user["built"]["collection"], "a second build, not the first tarball"
    proc = subprocess.run([str(user["venv"] / "bin" / "ansible-galaxy"), "collection", "install", "--force",
                           built["collection"], "-p", str(user["path"].parents[2])], cwd=user["root"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = run_playbook(testbed, work, "trace.yml", "-e", "target=live")
    assert run.rc == 0, run.explain()
    for name in LIVE:
        assert run.recap[name]["changed"] == 0, f"{name} changed after a rebuild\n" + run.explain()
    after = {name: agent_status(testbed, name) for name in LIVE}
    assert {n: (a["supervisor_pid"], a["agent_pid"]) for n, a in after.items()} == \
        {n: (b["supervisor_pid"], b["agent_pid"]) for n, b in before.items()}, "no agent restarted"


def test_check_mode_on_the_set_up_controller_leaves_its_directories_byte_identical(deployed, testbed, work):
    controller = [work / "pki", work / "wheels", work / "results"]
    before = snapshot(*controller)
    assert before, "the deployment made the fleet CA"
    run = run_playbook(testbed, work, "trace.yml", "--check", "-e", "target=live", limit=LIVE[0])   # one host says it
    assert run.rc == 0, run.explain()
    assert snapshot(*controller) == before
    assert host_side_changes(run.stdout) == [], run.explain()       # nothing would change: it is all in place


@pytest.mark.parametrize("name", LIVE)
def test_deployed_files_have_their_owners_and_modes(hosts, name):
    host = hosts[name]
    expected = {
        "/etc/straggler/tls": (0o750, True), "/etc/straggler/tls/ca.crt": (0o644, False),
        "/etc/straggler/tls/node.crt": (0o644, False), "/etc/straggler/tls/node.key": (0o600, False),
        "/etc/straggler/agent.yml": (0o644, False), "/opt/straggler/bin/straggler-agentctl": (0o755, False),
        "/opt/straggler/venv/bin/straggler": (None, False), "/var/lib/straggler": (0o750, True),
    }
    # one stat over SSH for all of them (a testinfra File asks once per attribute)
    out = host.run("stat -c '%n|%a|%U|%G|%F' " + " ".join(expected)).stdout
    seen = {path: (int(mode, 8), user, group, kind == "directory")
            for path, mode, user, group, kind in (line.split("|") for line in out.splitlines())}
    for path, (mode, is_dir) in expected.items():
        assert path in seen, f"{name}: {path} missing"
        have, user, group, have_dir = seen[path]
        assert user == "root" and group == "root", f"{name}: {path} owned by {user}:{group}"
        if mode is not None:
            assert have == mode, f"{name}: {path} has mode {oct(have)}, expected {oct(mode)}"
        assert have_dir == is_dir, f"{name}: {path} is{'' if have_dir else ' not'} a directory"
    config = json.loads("".join(line for line in host.file("/etc/straggler/agent.yml").content_string.splitlines(True)
                                if not line.startswith("#")))
    assert config["node"] == name and config["scope"] == "netns" and config["port"] == AGENT_PORT
    assert config["argv"][:2] == ["/opt/straggler/venv/bin/straggler", "trace"]
    # the venv sees the system's BCC, and the agent package came from the wheel (no network)
    assert host.run("/opt/straggler/venv/bin/python -c 'import bcc, straggler.agent'").rc == 0


@pytest.mark.parametrize("name", LIVE)
def test_agent_process_runs_and_its_port_listens(hosts, testbed, name):
    host = hosts[name]
    status = agent_status(testbed, name)
    agent = host.process.get(pid=status["agent_pid"])
    assert "straggler trace" in agent.args and f"--node {name}" in agent.args and "--scope netns" in agent.args
    # no systemd on the test bed: the supervisor marks the agent to be killed first under memory pressure
    assert host.file(f"/proc/{status['agent_pid']}/oom_score_adj").content_string.strip() == "1000"
    assert host.file("/run/straggler/agent.pid").content_string.strip() == str(status["supervisor_pid"])
    assert host.socket(f"tcp://0.0.0.0:{AGENT_PORT}").is_listening
    assert "tracing" in host.file("/var/log/straggler/agent.log").content_string


@pytest.mark.parametrize("name", LIVE)
def test_agent_port_speaks_tls13_only(deployed, testbed, work, name):
    address = testbed.hosts[name]
    assert tls_handshake(address, work, ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        tls_handshake(address, work, ssl.TLSVersion.TLSv1_2)


# --------------------------------------------------------------------------- fleet_query.yml

def _results(work: Path, run: PlaybookRun) -> dict:
    match = re.search(r"rows from \d+ of \d+ hosts in (\S+\.json)", run.stdout)
    assert match, run.explain()
    path = Path(match.group(1))
    assert path.parent == work / "results", path
    return json.loads(path.read_text())


SQL = "SELECT count(*) AS probes FROM probes"


def test_fleet_query_over_ssh_returns_each_hosts_rows_and_lists_the_dead_host(deployed, testbed, work):
    run = run_playbook(testbed, work, "fleet_query.yml", straggler_sql=SQL)
    assert run.rc == 4, run.explain()
    results = _results(work, run)
    assert results["columns"] == ["node", "probes"], results
    by_node = {row[0]: row[1] for row in results["rows"]}
    assert sorted(by_node) == LIVE, results
    assert all(count > 0 for count in by_node.values()), results    # each agent attached its probes
    statuses = {h["host"]: h["status"] for h in results["hosts"]}
    assert statuses[DEAD] == "unreachable" and results["missing"] == [DEAD], results
    assert sorted(results["offsets"]) == LIVE
    assert all("offset_ns" in o and "uncertainty_ns" in o for o in results["offsets"].values()), results
    assert "gpu-node-dead" in run.stdout and "Missing: gpu-node-dead" in run.stdout


def test_fleet_query_over_https_asks_every_agent_and_lists_the_dead_host(deployed, testbed, work):
    run = run_playbook(testbed, work, "fleet_query.yml", straggler_sql=SQL, straggler_transport="https")
    assert run.rc == 2, "(https) an agent that does not answer fails the run at the end\n" + run.explain()
    results = _results(work, run)
    assert sorted(row[0] for row in results["rows"]) == LIVE, results
    assert results["missing"] == [DEAD], results
    assert "no rows from gpu-node-dead" in run.stdout, run.explain()


def test_the_readmes_fleet_query_as_written_answers_from_every_host_into_the_default_results(deployed, testbed, work):
    """The README's second command, on its inventory: every host answers (exit 0), the table is printed and
    written, 0600, under the fresh home's ~/.local/share/straggler/results/, with the README's columns."""
    run = readme_command(testbed, work, "straggler.fleet.fleet_query")
    assert run.rc == 0, run.explain()
    match = re.search(r"rows from 2 of 2 hosts in (\S+\.json)", run.stdout)
    assert match, run.explain()
    path = Path(match.group(1))
    _, user, _ = WORK_ENV[str(work)]
    assert path.parent == user["home"] / ".local" / "share" / "straggler" / "results", path
    assert path.stat().st_mode & 0o777 == 0o600
    results = json.loads(path.read_text())
    assert results["columns"] == ["node", "source", "cnt", "avg_us"] and results["missing"] == [], results
    assert sorted({row[0] for row in results["rows"]}) == LIVE, results
    assert "node | source | cnt | avg_us" in run.stdout, run.explain()


TYPED_SQL = "SELECT node, count(*) AS n FROM probes WHERE 1=1 AND node = node GROUP BY node"


def test_fleet_query_as_typed_runs_the_sql_on_every_live_host_and_exits_0(deployed, testbed, work):
    proc = ansible(testbed, work, "ansible-playbook", "straggler.fleet.fleet_query", "-e", f"sql={TYPED_SQL}",
                   "-e", "target=live", "-e", f"straggler_results_dir={work / 'results'}")
    assert proc.returncode == 0, shown(proc)
    path = Path(re.search(r"rows from \d+ of \d+ hosts in (\S+\.json)", proc.stdout).group(1))
    results = json.loads(path.read_text())
    assert results["sql"] == TYPED_SQL and results["columns"] == ["node", "n"], results
    assert sorted(row[0] for row in results["rows"]) == LIVE and all(row[1] > 0 for row in results["rows"]), results
    assert results["missing"] == [], results
    assert path.stat().st_mode & 0o777 == 0o600


def test_explain_live_over_https_asks_the_agents_and_names_nobody_without_a_job(deployed, testbed, work):
    out = work / "explained"
    run = run_playbook(testbed, work, "explain.yml", limit="live", straggler_transport="https",
                       straggler_out=str(out))
    assert run.rc == 0, run.explain()
    report = json.loads((out / "report.json").read_text())
    assert report["straggler"] is None, report          # tracing, but no job: nobody to name
    assert (out / "report.md").read_text().strip(), run.explain()


# --------------------------------------------------------------------------- collect, diagnose

def test_collect_produces_a_cluster_db_of_the_live_nodes_and_a_pftrace(deployed, testbed, work):
    out = work / "collected"
    run = run_playbook(testbed, work, "collect.yml", straggler_out=str(out))
    assert run.rc == 4, run.explain()
    assert sorted(p.stem for p in (out / "nodes").glob("*.db")) == LIVE
    with sqlite3.connect(f"file:{out / 'cluster.db'}?mode=ro", uri=True) as db:
        nodes = {row[0] for row in db.execute("SELECT DISTINCT node FROM probes")}
    assert sorted(nodes) == LIVE, nodes
    trace = Replay(str(out / "trace.pftrace"))          # Perfetto's native format, read back with its protos
    assert sorted(d.process.process_name.split()[0] for d in trace.processes()) == LIVE
    assert trace.unclosed == 0 and not trace.backwards
    assert "trace.pftrace" in run.stdout and "Missing: gpu-node-dead" in run.stdout, run.explain()


@pytest.mark.parametrize("scenario,expected_rc", [("io_cpu", 2), ("clean", 0)])
def test_diagnose_exits_2_only_when_a_straggler_is_found_and_writes_junit_and_markdown(
        testbed, work, tmp_path, scenario, expected_rc):
    from straggler_lab import synth
    db = tmp_path / "cluster.db"
    synth.write_cluster(str(db), synth.SynthSpec(scenario=scenario, events=20_000), work_dir=str(tmp_path))
    out = tmp_path / "diagnose"
    run = run_playbook(testbed, work, "diagnose.yml", straggler_cluster_db=str(db), straggler_out=str(out))
    assert run.rc == expected_rc, run.explain()
    junit = (out / "junit.xml").read_text()
    assert "<testsuite" in junit
    assert ("<failure" in junit) == (expected_rc == 2)
    assert (out / "report.md").read_text().strip()


# --------------------------------------------------------------------------- a second controller, the jobs inventory

def test_a_second_controller_with_the_same_ca_changes_nothing_on_the_hosts(deployed, testbed, work):
    hosts = LIVE
    tls_before = host_tls(testbed, hosts)
    pids = {name: agent_status(testbed, name)["agent_pid"] for name in hosts}
    second = work / "pki-second-controller"
    run = run_playbook(testbed, work, "trace.yml", "-e", "target=live", pki="pki-second-controller",
                       limit=",".join(hosts), straggler_pki_ca_cert_file=str(work / "pki" / "ca.crt"),
                       straggler_pki_ca_key_file=str(work / "pki" / "ca.key"))
    assert run.rc == 0, run.explain()
    assert sorted(run.recap) == hosts and host_side_changes(run.stdout) == [], run.explain()
    assert host_tls(testbed, hosts) == tls_before
    assert {name: agent_status(testbed, name)["agent_pid"] for name in hosts} == pids       # no restart
    assert (second / "ca.crt").read_bytes() == (work / "pki" / "ca.crt").read_bytes()
    assert (second / "controller.crt").exists()


JOB_PORT = 29517


def test_the_jobs_inventory_groups_the_hosts_running_a_job_and_limit_targets_them(deployed, testbed, work):
    hosts = LIVE[:1]                    # a two-rank job on the first host; the second runs none
    root = f"{testbed.hosts[hosts[0]]}:{JOB_PORT}"
    stop = work / "job" / "STOP"
    stop.parent.mkdir()
    ranks = [testbed.popen(name, [sys.executable, "-m", "straggler_lab.demo.syncjob", "--rank", str(rank), "--world", "2",
                                  "--root", root, "--standin-dir", str(work / "standin"), "--seconds", "300",
                                  "--stop-file", str(stop), "--log", str(work / "job" / f"steps-{rank}.csv")],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
             for rank, name in enumerate(hosts * 2)]
    source = work / "jobs.straggler.yml"
    source.write_text(f"plugin: straggler.fleet.jobs\ngroup: gpu\npki_dir: {work / 'pki'}\ntimeout: 5\n")
    job = "job_" + re.sub(r"[^A-Za-z0-9]", "_", root)
    try:
        deadline = time.monotonic() + 180                  # the agents record the ranks once they trace their calls
        while True:
            proc = ansible(testbed, work, "ansible-inventory", "-i", source, "--list")
            assert proc.returncode == 0, shown(proc)
            data = json.loads(proc.stdout)
            if job in data or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert sorted(data.get(job, {}).get("hosts", [])) == hosts, shown(proc)
        assert "gpu-node-dead" in proc.stderr and "did not answer" in proc.stderr, shown(proc)
        ranks_of = {name: data["_meta"]["hostvars"][name].get("straggler_ranks") for name in LIVE}
        assert ranks_of == {LIVE[0]: [0, 1], LIVE[1]: None}, ranks_of

        proc = ansible(testbed, work, "ansible-playbook", "-i", source, "straggler.fleet.fleet_query", "-l", job,
                       "-e", "sql=SELECT node, count(*) AS n FROM processes WHERE rank IS NOT NULL GROUP BY node",
                       "-e", f"straggler_results_dir={work / 'results'}")
        assert proc.returncode == 0, shown(proc)
        assert sorted(parse_recap(proc.stdout)) == hosts, shown(proc)
    finally:
        stop.write_text("stop\n")
        procs.end(ranks, sig=None, wait_s=60, kill_wait_s=30)       # they stop at the stop file


# --------------------------------------------------------------------------- stop and remove (last)

def test_stopped_then_absent_cleans_up(deployed, testbed, work):
    pids = {name: agent_status(testbed, name)["agent_pid"] for name in LIVE}
    stopped = run_playbook(testbed, work, "trace.yml", limit=f"{LIVE[0]},{DEAD}", straggler_agent_state="stopped")
    assert stopped.rc == 4, stopped.explain()
    assert agent_status(testbed, LIVE[1]).get("running"), "a host outside --limit was stopped"
    for name in LIVE[:1]:
        assert process_gone(pids[name]), f"{name}: agent pid {pids[name]} still runs after the play"
        assert agent_status(testbed, name).get("running") is False
        with pytest.raises(OSError):
            socket.create_connection((testbed.hosts[name], AGENT_PORT), timeout=5).close()
        assert testbed.exec(name, ["test", "-x", "/opt/straggler/venv/bin/straggler"]).returncode == 0

    absent = run_playbook(testbed, work, "trace.yml", straggler_agent_state="absent", straggler_agent_remove_data=True)
    assert absent.rc == 4, absent.explain()
    for name in LIVE:
        for path in ("/opt/straggler/venv", "/opt/straggler/bin", "/etc/straggler/agent.yml", "/etc/straggler/tls",
                     "/var/lib/straggler/straggler.db", "/run/straggler/agent.pid"):
            assert testbed.exec(name, ["test", "-e", path]).returncode != 0, f"{name}: {path} left behind"
