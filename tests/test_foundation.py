"""Foundation tests: the multi-host test bed over real SSH and Ansible, BCC on this machine, and
`make setup` (idempotent; one clear line when it cannot work).

These guard what every other part stands on. They must not leave anything behind: the session
test bed is torn down by its fixture, and the teardown test uses its own test bed id.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from straggler_lab import testbed as testbed_lib

REPO_ROOT = Path(__file__).resolve().parent.parent
ANSIBLE = REPO_ROOT / ".venv" / "bin" / "ansible"
TESTBED_CLI = [sys.executable, "-m", "straggler_lab.testbed"]


def _kernel_connect_give_up_s() -> float:
    """How long the kernel tries a TCP connect to a silent host: SYN retries with the timeout doubling
    from 1 s (net.ipv4.tcp_syn_retries, 6 by default: 127 s)."""
    retries = int(Path("/proc/sys/net/ipv4/tcp_syn_retries").read_text())
    return float(2 ** (retries + 1) - 1)


# A dead host must fail after ssh's ConnectTimeout (the test bed's ansible.cfg says 3 s), not when the
# kernel gives up (about 2 minutes). Half of the kernel's time tells the two apart with ample headroom
# for a loaded 2-core machine (Ansible's own start-up is ~1 s); it is not a speed assertion.
DEAD_HOST_BOUND_S = _kernel_connect_give_up_s() / 2

_RESULT_HEADER = re.compile(r"^(?P<host>\S+) \| (?P<status>SUCCESS|CHANGED|FAILED|UNREACHABLE)!?(?P<rest>.*)$")


def run_ansible(testbed, pattern: str, *module_args: str, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the real `ansible` ad-hoc command against the test bed; return the process and
    {host: (status without "!", text after the header)} parsed from the default callback's output."""
    proc = subprocess.run([str(ANSIBLE), pattern, *module_args], env=testbed.ansible_env(),
                          capture_output=True, text=True, timeout=timeout, cwd=testbed.state_dir)
    results: dict[str, tuple[str, str]] = {}
    current = None
    for line in proc.stdout.splitlines():
        match = _RESULT_HEADER.match(line)
        if match:
            current = match["host"]
            results[current] = (match["status"], match["rest"])
        elif current is not None:
            status, text = results[current]
            results[current] = (status, text + "\n" + line)
    return proc, results


def test_ansible_ping_answers_from_live_hosts_and_dead_host_is_unreachable_after_timeout(testbed):
    started = time.monotonic()
    proc, results = run_ansible(testbed, "all", "-m", "ping")
    elapsed = time.monotonic() - started

    assert set(results) == set(testbed.hosts) | set(testbed.dead), proc.stdout + proc.stderr
    for name in testbed.hosts:
        status, text = results[name]
        assert status == "SUCCESS" and '"pong"' in text, f"{name}: {status} {text}"
    (dead_name,) = testbed.dead
    status, text = results[dead_name]
    assert status == "UNREACHABLE", text
    assert "timed out" in text, f"the dead host should hang until ConnectTimeout, got: {text}"
    assert proc.returncode == 4, f"ansible exits 4 when a host is unreachable, got {proc.returncode}"
    assert elapsed < DEAD_HOST_BOUND_S, f"ping of all hosts took {elapsed:.1f} s: ssh ConnectTimeout not in effect?"


def test_each_host_reports_its_own_hostname(testbed):
    proc, results = run_ansible(testbed, "live", "-m", "command", "-a", "hostname")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reported = {name: text.split(">>", 1)[1].strip() for name, (status, text) in results.items()}
    assert reported == {name: name for name in testbed.hosts}
    # the same through exec (nsenter into the sshd's namespaces)
    assert testbed.exec("gpu-node-03", ["hostname"]).stdout.strip() == "gpu-node-03"
    assert os.uname().nodename not in testbed.hosts  # the controller keeps its own name


def test_state_paths_are_private_to_each_host(testbed):
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    # over SSH, each host writes a file named after itself into /var/lib/straggler and lists the
    # directory: it must see its own file only
    script = f"echo written-on-$(hostname) > /var/lib/straggler/{marker}-$(hostname) && ls /var/lib/straggler"
    proc, results = run_ansible(testbed, "live", "-m", "shell", "-a", script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in testbed.hosts:
        seen = sorted(f for f in results[name][1].split() if f.startswith(marker))
        assert seen == [f"{marker}-{name}"], f"{name} sees {seen} in /var/lib/straggler"
        assert (testbed.host_dir(name) / "var/lib/straggler" / f"{marker}-{name}").read_text() == f"written-on-{name}\n"
    assert not list(Path("/var/lib/straggler").glob(f"{marker}*")), "the controller sees the hosts' private files"

    # every private path, through exec: written on one host, absent on another and on the controller
    first, second = "gpu-node-01", "gpu-node-02"
    paths = " ".join(f"{path}/{marker}" for path in testbed_lib.PRIVATE_DIRS)
    made = testbed.exec(first, ["sh", "-c", f"for f in {paths}; do echo {first} > $f || exit 1; done"])
    assert made.returncode == 0, made.stderr
    visible = testbed.exec(second, ["sh", "-c", f"for f in {paths}; do test -e $f && echo $f; done; true"]).stdout.split()
    assert visible == [], f"shared between {first} and {second}: {visible}"
    leaked = [path for path in testbed_lib.PRIVATE_DIRS if Path(path, marker).exists()]
    assert leaked == [], f"leaked onto the controller: {leaked}"

    hosts_file = testbed.exec(second, ["cat", "/etc/hosts"]).stdout
    for name, address in testbed.all_hosts.items():
        assert re.search(rf"^{re.escape(address)}\s+{re.escape(name)}$", hosts_file, re.M), hosts_file
    assert testbed.exec(second, ["cat", "/etc/resolv.conf"]).stdout == ""
    routes = testbed.exec(second, ["ip", "route"]).stdout
    assert "default" not in routes, f"a test-bed host must not route beyond its subnet: {routes}"


def test_exec_into_unknown_host_says_which_hosts_exist(testbed):
    with pytest.raises(testbed_lib.TestbedError, match="gpu-node-01"):
        testbed.exec("no-such-host", ["true"])


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_up_replaces_a_crashed_run_and_down_leaves_nothing_behind(testbed):
    spare_id = (testbed.id + 100) % 256
    state_dir = testbed_lib.default_state_dir(spare_id)
    # "crashed" run: brought up by the CLI, never brought down
    cli = subprocess.run([*TESTBED_CLI, "up", "--id", str(spare_id), "--hosts", "2", "--dead", "1"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == str(state_dir / "inventory.ini")
    old_pids = testbed_lib.load(spare_id).pids

    bed = testbed_lib.up(hosts=2, dead=1, testbed_id=spare_id)
    try:
        assert not any(testbed_lib._pid_alive(pid) for pid in old_pids.values()), "up kept the old run's sshd"
        assert all(testbed_lib._pid_is_sshd(pid) for pid in bed.pids.values())
        proc, results = run_ansible(bed, "live", "-m", "ping")  # leaves ssh control masters behind
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert list((bed.state_dir / "cp").iterdir()), "expected ssh control sockets"
        sleeper = bed.popen("gpu-node-01", ["sleep", "300"])
    finally:
        down = subprocess.run([*TESTBED_CLI, "down", "--id", str(spare_id)],
                              capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    sleeper.wait(timeout=30)   # down killed it: it is gone at once, the bound is for a busy machine

    assert testbed_lib._our_netns(spare_id) == []
    assert testbed_lib._our_links(spare_id) == []
    assert not any(testbed_lib._pid_alive(pid) for pid in bed.pids.values())
    assert _processes_mentioning(str(state_dir)) == [], "sshd or ssh control masters survived down"
    assert not state_dir.exists()
    again = subprocess.run([*TESTBED_CLI, "down", "--id", str(spare_id)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    # the session's own test bed is untouched
    assert testbed.exec("gpu-node-01", ["hostname"]).stdout.strip() == "gpu-node-01"


BCC_SCHED_SWITCH = r"""
BPF_ARRAY(switches_out, u64, 1);
TRACEPOINT_PROBE(sched, sched_switch) {
    if (args->prev_pid != TARGET_TID)
        return 0;
    int key = 0;
    u64 *count = switches_out.lookup(&key);
    if (count)
        __sync_fetch_and_add(count, 1);
    return 0;
}
"""


@pytest.mark.bpf
def test_bcc_tracepoint_probe_counts_sched_switch_of_a_sleeping_thread():
    import bcc  # from Debian's python3-bpfcc, visible through the venv's system site packages

    sleeps = 50
    counted: dict[str, int] = {}

    def sleeper(ready: threading.Event, go: threading.Event) -> None:
        counted["tid"] = threading.get_native_id()
        ready.set()
        go.wait(timeout=60)
        for _ in range(sleeps):
            time.sleep(0.002)  # each sleep switches this thread out once (at least)

    ready, go = threading.Event(), threading.Event()
    thread = threading.Thread(target=sleeper, args=(ready, go))
    thread.start()
    try:
        assert ready.wait(timeout=10)
        bpf = bcc.BPF(text=BCC_SCHED_SWITCH.replace("TARGET_TID", str(counted["tid"])).encode())
    finally:
        go.set()
        thread.join(timeout=30)
    try:
        assert bpf.num_open_tracepoints() == 1
        switches_out = bpf[b"switches_out"]
        count = switches_out[switches_out.Key(0)].value
    finally:
        bpf.cleanup()
    assert count >= sleeps, f"sched_switch counted {count} switches of a thread that slept {sleeps} times"


def _mtimes(paths: list[Path]) -> dict[str, int]:
    return {str(p): p.lstat().st_mtime_ns for p in paths if p.exists() or p.is_symlink()}


def _make_setup() -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "setup"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)


def test_make_setup_is_idempotent(root_required):
    watched = [REPO_ROOT / ".venv/bin/python", REPO_ROOT / ".venv/pyvenv.cfg", REPO_ROOT / ".venv/.straggler-reqs",
               REPO_ROOT / ".venv/bin/straggler", REPO_ROOT / ".venv/bin/ansible", REPO_ROOT / ".venv/lib"]
    before = _mtimes(watched)
    again = _make_setup()
    assert again.returncode == 0, again.stderr
    if re.search(r"installing|creating", again.stdout):
        # this machine was not set up yet (or requirements changed since): that was the first run
        before = _mtimes(watched)
        again = _make_setup()
        assert again.returncode == 0, again.stderr
    assert re.fullmatch(r"setup: ok \(.*\)\n", again.stdout), f"a repeated run should only say ok: {again.stdout!r}"
    assert "Traceback" not in again.stderr, (
        "make setup printed a traceback (a user sees it); e.g. `ansible --version | head -1` dies of "
        "BrokenPipe when head exits first:\n" + again.stderr[-2000:])
    assert not re.search(r"installing|creating", again.stdout + again.stderr), again.stdout + again.stderr
    assert _mtimes(watched) == before, "a repeated run of make setup changed the venv"


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {stderr!r}"
    return lines[0]


def test_setup_as_non_root_says_one_line_about_root_and_fails(root_required):
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           "bash", str(REPO_ROOT / "scripts/setup.sh")],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd="/")
    assert proc.returncode != 0
    assert proc.stdout == ""
    line = _one_line(proc.stderr)
    assert line.startswith("setup: error:") and "root" in line, line


def test_setup_on_a_non_debian_system_says_one_line_and_fails(root_required):
    # /etc replaced by an empty tmpfs in a private mount namespace: no /etc/debian_version there
    script = f'mount -t tmpfs none /etc && exec bash {REPO_ROOT / "scripts/setup.sh"}'
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    line = _one_line(proc.stderr)
    assert line.startswith("setup: error:") and "Debian" in line, line
