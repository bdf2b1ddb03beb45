#!/usr/bin/env python3
"""A multi-host test bed on one machine: N real SSH hosts in network namespaces, plus dead ones.

Used by the tests (tests/conftest.py's `testbed` fixture), by `make demo` and by anyone who needs
"several nodes" without several machines. Each live host is a network namespace with a veth into a
private bridge, its own address, hostname and private state directories, and its own sshd that
accepts the test bed's key as root. A dead host has an address whose TCP port 22 silently drops
packets, so a connection hangs until the client's ConnectTimeout.

    python -m straggler_lab.testbed up --hosts 4 --dead 1 [--id N] [--prefix gpu-node-] [--state-dir DIR]
    python -m straggler_lab.testbed status [--id N]
    python -m straggler_lab.testbed exec [--id N] gpu-node-01 -- hostname
    python -m straggler_lab.testbed down [--id N]

As a module: `up(...) -> Testbed`, `load(...) -> Testbed`, `down(...)`, `exec_in_host(name, argv, ...)`.

What it must not do: touch anything outside its own names (bridge `stb<id>`, links `stb<id>v*`,
namespaces `stb<id>-*`, subnet 10.213.<id>.0/24, its state dir, its lock dir), route beyond the test
subnet (hosts have no default route), touch /root/.ssh, or kill a process it did not start (it kills
the sshd pids it recorded and processes living inside its own namespaces). Every wait is bounded.
The only traces it leaves outside its state dir: empty mount-point directories for the private
paths (/var/lib/straggler, /etc/straggler, /opt/straggler, /var/log/straggler, /run/straggler,
/run/systemd/nspawn) when the machine lacked them, a tiny lock file per id under
/tmp/straggler-testbed-locks/, and the cached systemd root file system under
/var/cache/straggler-testbed/ (built once by debootstrap, only when a systemd host is asked for).

Systemd hosts (`up(..., systemd_hosts=[NAME])`, CLI `--systemd-host NAME`): a Debian bookworm minbase
root file system with systemd, sshd and python3, booted by systemd-nspawn (volatile overlay: the
cache stays pristine) inside a test-bed network namespace, in its own cgroup; PID 1 is systemd and
sshd accepts the same key. No BPF inside (nspawn drops the capabilities) and no packages beyond
ROOTFS_PACKAGES (no route to a mirror).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

ENV_ID = "STRAGGLER_TESTBED_ID"
DEFAULT_PREFIX = "gpu-node-"
STATE_FILE = "testbed.json"
LOCK_DIR = Path("/tmp/straggler-testbed-locks")
SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
HOST_PYTHON = "/usr/bin/python3"
ANSIBLE_TIMEOUT_S = 3
FIRST_HOST_OCTET = 11

# Paths each live host sees privately (bind mounts inside its own mount namespace).
PRIVATE_DIRS = ("/var/lib/straggler", "/etc/straggler", "/opt/straggler", "/var/log/straggler",
                "/run/straggler", "/srv", "/var/tmp")
PRIVATE_FILES = ("/etc/hosts", "/etc/resolv.conf")

REPO_ROOT = Path(__file__).resolve().parents[2]


class TestbedError(RuntimeError):
    """An expected failure of the test bed, with a one-line message: what failed; what to do."""

    __test__ = False  # not a pytest test class


# --------------------------------------------------------------------------- naming

def resolve_id(testbed_id: int | None = None) -> int:
    """The test bed id: the argument, else $STRAGGLER_TESTBED_ID, else 0."""
    if testbed_id is None:
        raw = os.environ.get(ENV_ID, "0")
        try:
            testbed_id = int(raw)
        except ValueError:
            raise TestbedError(f"{ENV_ID}={raw!r} is not a number: use 0..255") from None
    if not 0 <= testbed_id <= 255:
        raise TestbedError(f"test bed id {testbed_id} out of range: use 0..255")
    return testbed_id


def default_state_dir(testbed_id: int) -> Path:
    return Path(f"/tmp/straggler-testbed-{testbed_id}")


def bridge_name(testbed_id: int) -> str:
    return f"stb{testbed_id}"


def veth_prefix(testbed_id: int) -> str:
    return f"stb{testbed_id}v"


def netns_prefix(testbed_id: int) -> str:
    return f"stb{testbed_id}-"


def subnet_address(testbed_id: int, last_octet: int) -> str:
    return f"10.213.{testbed_id}.{last_octet}"


def _lock_path(testbed_id: int) -> Path:
    return LOCK_DIR / f"{testbed_id}.lock"


def _state_pointer(testbed_id: int) -> Path:
    """Where `up` notes a non-default state dir so that `down --id N` finds it."""
    return LOCK_DIR / f"{testbed_id}.state-dir"


# --------------------------------------------------------------------------- small helpers

def _run(argv: list[str], *, input_text: str | None = None, check: bool = True,
         timeout: float = 20.0) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, input=input_text, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} not found: run 'make setup' (needs iproute2, nftables, openssh-server, util-linux)") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{' '.join(argv[:4])} … did not finish within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise TestbedError(f"{' '.join(argv)} failed: {detail[-1] if detail else 'exit ' + str(proc.returncode)}")
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes (it holds no namespace); reap it if it is our child.
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            _reap(pid)
            return False
    except (OSError, IndexError):
        return False
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _pid_is_sshd(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").startswith(SSHD)
    except OSError:
        return False


def _kill_and_wait(pids: list[int], timeout_s: float = 3.0) -> list[int]:
    """TERM the pids, wait (bounded), KILL what is left, wait again. Returns pids still alive."""
    pids = [p for p in set(pids) if p > 1 and p != os.getpid()]
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, timeout_s)):
        alive = [p for p in pids if _pid_alive(p)]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while alive and time.monotonic() < deadline:
            for pid in alive:
                _reap(pid)
            alive = [p for p in alive if _pid_alive(p)]
            if alive:
                time.sleep(0.02)
        pids = alive
        if not pids:
            break
    return pids


def _netns_list() -> list[str]:
    proc = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _netns_pids(netns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", netns], check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def _link_names() -> list[str]:
    proc = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in proc.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _our_links(testbed_id: int) -> list[str]:
    bridge, vprefix = bridge_name(testbed_id), veth_prefix(testbed_id)
    return [n for n in _link_names() if n == bridge or n.startswith(vprefix)]


def _our_netns(testbed_id: int) -> list[str]:
    prefix = netns_prefix(testbed_id)
    return [n for n in _netns_list() if n.startswith(prefix)]


def _tcp_open(address: str, port: int, timeout_s: float = 0.3) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- the test bed object

@dataclass
class Testbed:
    """A running test bed, as recorded in <state_dir>/testbed.json.

    hosts: live host name -> address; dead: dead host name -> address; systemd_hosts: name -> address
    of hosts that boot real systemd; netns: every host name -> network namespace; pids: live host
    name -> sshd pid (its mount+uts+net namespaces are the host's); systemd_pids: systemd host name ->
    {"nspawn": pid, "init": pid of the container's PID 1}.
    """

    __test__ = False

    id: int
    state_dir: Path
    prefix: str
    bridge: str
    controller_address: str
    hosts: dict[str, str]
    dead: dict[str, str]
    netns: dict[str, str]
    pids: dict[str, int]
    private_key: Path
    inventory: Path
    ansible_cfg: Path
    ssh_config: Path
    systemd_hosts: dict[str, str] = field(default_factory=dict)
    systemd_pids: dict[str, dict] = field(default_factory=dict)

    # ----- construction / persistence
    @classmethod
    def from_json(cls, path: Path) -> "Testbed":
        data = json.loads(Path(path).read_text())
        return cls(
            id=data["id"], state_dir=Path(data["state_dir"]), prefix=data["prefix"], bridge=data["bridge"],
            controller_address=data["controller_address"], hosts=data["hosts"], dead=data["dead"],
            netns=data["netns"], pids={k: int(v) for k, v in data["pids"].items()},
            private_key=Path(data["private_key"]), inventory=Path(data["inventory"]),
            ansible_cfg=Path(data["ansible_cfg"]), ssh_config=Path(data["ssh_config"]),
            systemd_hosts=data.get("systemd_hosts", {}), systemd_pids=data.get("systemd_pids", {}),
        )

    def to_dict(self) -> dict:
        return {
            "id": self.id, "state_dir": str(self.state_dir), "prefix": self.prefix, "bridge": self.bridge,
            "subnet": f"10.213.{self.id}.0/24", "controller_address": self.controller_address,
            "hosts": self.hosts, "dead": self.dead, "systemd_hosts": self.systemd_hosts,
            "netns": self.netns, "pids": self.pids, "systemd_pids": self.systemd_pids,
            "private_key": str(self.private_key), "inventory": str(self.inventory),
            "ansible_cfg": str(self.ansible_cfg), "ssh_config": str(self.ssh_config),
            "host_dirs": {name: str(self.host_dir(name)) for name in self.hosts},
        }

    def save(self) -> None:
        path = self.state_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)

    # ----- views
    @property
    def all_hosts(self) -> dict[str, str]:
        """Every host in the inventory (live, systemd and dead): name -> address."""
        return {**self.hosts, **self.systemd_hosts, **self.dead}

    def host_dir(self, name: str) -> Path:
        """The controller-side directory that backs a live host's private paths, e.g.
        host_dir(n) / "var/lib/straggler" is what host n sees as /var/lib/straggler."""
        return self.state_dir / "hosts" / name / "root"

    def ansible_env(self, base: dict | None = None) -> dict:
        """An environment for running ansible/ansible-playbook against this test bed."""
        env = dict(os.environ if base is None else base)
        env["ANSIBLE_CONFIG"] = str(self.ansible_cfg)
        env.setdefault("ANSIBLE_NOCOLOR", "1")
        return env

    def ssh_argv(self, name: str, *command: str) -> list[str]:
        """argv for `ssh` to a host as root with the test bed's key (no known_hosts writes)."""
        return ["ssh", "-F", str(self.ssh_config), name, *command]

    def nsenter_argv(self, name: str, argv: list[str], cwd: str | None = None) -> list[str]:
        """argv that runs `argv` inside host `name` (its mount, uts and net namespaces)."""
        if name in self.pids:
            pid = self.pids[name]
            if not _pid_alive(pid):
                raise TestbedError(f"host {name}: its sshd (pid {pid}) is gone: run 'python -m straggler_lab.testbed up' again")
            wd = cwd or os.getcwd()
            return ["nsenter", f"--target={pid}", "--mount", "--uts", "--net", f"--wd={wd}", "--", *argv]
        if name in self.systemd_hosts:  # all of the container's namespaces, via its PID 1
            init = (self.systemd_pids.get(name) or {}).get("init") or _container_init_pid(self.netns[name])
            if not init or not _pid_alive(init):
                raise TestbedError(f"systemd host {name} is not running: run 'python -m straggler_lab.testbed up --systemd-host {name}' again")
            # no --wd: nsenter would open it on the controller's file system; entering the
            # container's mount namespace leaves us in its "/" (cwd is ignored here)
            return ["nsenter", f"--target={init}", "--mount", "--uts", "--ipc", "--net", "--pid", "--", *argv]
        if name in self.netns:  # a dead host: network namespace only
            return ["ip", "netns", "exec", self.netns[name], *argv]
        raise TestbedError(f"no host {name!r} in test bed {self.id}: hosts are {', '.join(self.netns)}")

    def exec(self, name: str, argv: list[str], *, check: bool = False, timeout: float = 60.0,
             **run_kwargs) -> subprocess.CompletedProcess:
        """Run argv inside a host and wait (bounded); text output captured unless overridden."""
        run_kwargs.setdefault("capture_output", True)
        run_kwargs.setdefault("text", True)
        cwd = run_kwargs.pop("cwd", None)
        return subprocess.run(self.nsenter_argv(name, list(argv), cwd=cwd and str(cwd)),
                              check=check, timeout=timeout, **run_kwargs)

    def popen(self, name: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Start argv inside a host in the background. `down` kills it (it lives in the host's netns)."""
        cwd = popen_kwargs.pop("cwd", None)
        return subprocess.Popen(self.nsenter_argv(name, list(argv), cwd=cwd and str(cwd)), **popen_kwargs)

    def down(self) -> None:
        down(self.id, state_dir=self.state_dir)


# --------------------------------------------------------------------------- locking

class TestbedLock:
    """An advisory lock on a test bed id, held by a test session for its whole run so that a
    second session (or `testbed.py up/down`) does not tear its hosts away."""

    __test__ = False

    def __init__(self, testbed_id: int):
        self.testbed_id = testbed_id
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(_lock_path(self.testbed_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        try:
            return _lock_path(self.testbed_id).read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "TestbedLock":
        if not self.try_acquire():
            raise TestbedError(f"test bed id {self.testbed_id} is in use by a running session (pid {self.holder()}): "
                               f"pick another id (--id N or {ENV_ID}=N)")
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# --------------------------------------------------------------------------- down

_children: dict[int, subprocess.Popen] = {}


def _close_control_sockets(state_dir: Path) -> None:
    cp_dir = state_dir / "cp"
    if not cp_dir.is_dir():
        return
    for sock in cp_dir.iterdir():
        try:
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "testbed"],
                           capture_output=True, timeout=3)
        except (subprocess.TimeoutExpired, OSError):
            pass


def _teardown(testbed_id: int, state_dir: Path | None) -> None:
    """Remove everything of test bed `testbed_id`, from its records and from its naming scheme."""
    recorded_pids: list[int] = []
    if state_dir is not None and (state_dir / STATE_FILE).exists():
        try:
            bed = Testbed.from_json(state_dir / STATE_FILE)
            recorded_pids = [p for p in bed.pids.values() if _pid_is_sshd(p) or p in _children]
        except (OSError, ValueError, KeyError):
            pass
    if state_dir is not None:
        _close_control_sockets(state_dir)
    # systemd hosts first: their nspawn must get TERM and time to shut down cleanly.
    _systemd_teardown(testbed_id, state_dir)

    namespaces = _our_netns(testbed_id)
    ns_pids: list[int] = []
    for ns in namespaces:
        ns_pids += _netns_pids(ns)
    survivors = _kill_and_wait(recorded_pids + ns_pids)
    for pid in recorded_pids:
        child = _children.pop(pid, None)
        if child is not None:
            with suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1)
    if survivors:
        raise TestbedError(f"processes {survivors} of test bed {testbed_id} survived SIGKILL: check 'ps -p {survivors[0]}'")
    for ns in namespaces:
        _run(["ip", "netns", "del", ns], check=False)
    if bridge_name(testbed_id) in _link_names():
        _run(["ip", "link", "del", bridge_name(testbed_id)], check=False)
    # Namespace deletion is asynchronous: the root-side veth ends vanish a little later.
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        left = _our_links(testbed_id)
        if not left:
            break
        for name in left:
            _run(["ip", "link", "del", name], check=False)
        time.sleep(0.05)
    else:
        raise TestbedError(f"links {_our_links(testbed_id)} of test bed {testbed_id} did not disappear within 10 s")
    if state_dir is not None and state_dir.exists():
        if (state_dir / STATE_FILE).exists() or (state_dir / ".straggler-testbed").exists():
            shutil.rmtree(state_dir, ignore_errors=True)
    with suppress(OSError):
        pointer = _state_pointer(testbed_id)
        if pointer.exists() and state_dir is not None and pointer.read_text().strip() == str(state_dir):
            pointer.unlink()


def _state_dir_for(testbed_id: int, state_dir: str | Path | None) -> Path:
    if state_dir is not None:
        return Path(state_dir).resolve()
    try:
        noted = _state_pointer(testbed_id).read_text().strip()
        if noted:
            return Path(noted)
    except OSError:
        pass
    return default_state_dir(testbed_id)


def down(testbed_id: int | None = None, state_dir: str | Path | None = None, *, force: bool = False,
         _lock_held: bool = False) -> None:
    """Tear down test bed `testbed_id`: ssh control sockets, sshd and every process in its
    namespaces, the namespaces, the bridge, the state dir. Idempotent; bounded."""
    _require_root()
    testbed_id = resolve_id(testbed_id)
    lock = TestbedLock(testbed_id)
    if not _lock_held and not force and not lock.try_acquire():
        raise TestbedError(f"test bed id {testbed_id} is in use by a running session (pid {lock.holder()}): "
                           "let it finish, or use --force")
    try:
        _teardown(testbed_id, _state_dir_for(testbed_id, state_dir))
    finally:
        lock.release()


# --------------------------------------------------------------------------- up

def _require_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("the test bed needs root (network namespaces, bind mounts): run as root")


def _check_tools() -> None:
    for tool in ("ip", "nft", "unshare", "nsenter", "ssh", "ssh-keygen", SSHD, "hostname", "mount"):
        if shutil.which(tool) is None:
            raise TestbedError(f"{tool} not found: run 'make setup' (iproute2, nftables, util-linux, openssh)")


def _sshd_config(state_dir: Path, name: str, address: str, host_key: Path, log_level: str = "INFO") -> str:
    return "\n".join([
        f"# sshd of test-bed host {name} (written by straggler_lab.testbed)",
        f"ListenAddress {address}",
        "Port 22",
        f"HostKey {host_key}",
        "PidFile none",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        f"AuthorizedKeysFile {state_dir / 'authorized_keys'}",
        "MaxStartups 200",
        "MaxSessions 200",
        "PrintMotd no",
        "AcceptEnv LANG LC_*",
        f"Subsystem sftp {SFTP_SERVER}",
        f"LogLevel {log_level}",
        "",
    ])


def _etc_hosts(bed_hosts: dict[str, str], own_name: str | None, controller_address: str) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{controller_address}\ttestbed-controller"]
    lines += [f"{addr}\t{name}" for name, addr in bed_hosts.items()]
    return "\n".join(lines) + "\n"


def _keygen(path: Path, comment: str) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _start_host_sshd(bed: Testbed, name: str, address: str, netns: str) -> subprocess.Popen:
    host_root = bed.host_dir(name)
    host_meta = host_root.parent
    mounts = []
    for target in PRIVATE_DIRS:
        src = host_root / target.lstrip("/")
        src.mkdir(parents=True, exist_ok=True)
        Path(target).mkdir(parents=True, exist_ok=True)  # mount point on the machine (empty if we made it)
        mounts.append((src, target))
    (host_root / "etc").mkdir(parents=True, exist_ok=True)
    (host_root / "etc/hosts").write_text(_etc_hosts(bed.all_hosts, name, bed.controller_address))
    (host_root / "etc/resolv.conf").write_text("")
    for target in PRIVATE_FILES:
        mounts.append((host_root / target.lstrip("/"), target))
    host_key = host_meta / "ssh_host_ed25519_key"
    _keygen(host_key, f"root@{name}")
    config = host_meta / "sshd_config"
    config.write_text(_sshd_config(bed.state_dir, name, address, host_key))
    log = host_meta / "sshd.log"
    script = ["set -e", f"hostname {shlex.quote(name)}"]
    script += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for src, dst in mounts]
    script.append(f"exec {SSHD} -D -f {shlex.quote(str(config))} -E {shlex.quote(str(log))}")
    argv = ["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--propagation", "private",
            "sh", "-c", "\n".join(script)]
    errlog = open(host_meta / "start.log", "wb")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog,
                                start_new_session=True, close_fds=True)
    finally:
        errlog.close()
    _children[proc.pid] = proc
    return proc


def _write_ansible_files(bed: Testbed) -> None:
    cp_dir = bed.state_dir / "cp"
    cp_dir.mkdir(exist_ok=True)
    common = (f"-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
              f"-o ControlMaster=auto -o ControlPersist=60s -o ControlPath={cp_dir}/%C")
    lines = ["# test bed %d: written by straggler_lab.testbed; removed by 'python -m straggler_lab.testbed down'" % bed.id, "[gpu]"]
    for name, addr in bed.all_hosts.items():
        lines.append(f"{name} ansible_host={addr}")
    lines += ["", "[live]"] + list(bed.hosts)
    if bed.systemd_hosts:
        lines += ["", "[systemd]"] + list(bed.systemd_hosts)
    lines += ["", "[dead]"] + list(bed.dead)
    lines += ["", "[all:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={bed.private_key}",
              f"ansible_ssh_common_args='{common}'", f"ansible_python_interpreter={HOST_PYTHON}", ""]
    bed.inventory.write_text("\n".join(lines))
    collections = f"{REPO_ROOT / 'collections'}:~/.ansible/collections:/usr/share/ansible/collections"
    bed.ansible_cfg.write_text("\n".join([
        "# ansible.cfg for tests against test bed %d (ANSIBLE_CONFIG=this file)" % bed.id,
        "[defaults]",
        f"inventory = {bed.inventory}",
        "host_key_checking = False",
        f"timeout = {ANSIBLE_TIMEOUT_S}",
        "forks = 8",
        f"interpreter_python = {HOST_PYTHON}",
        "retry_files_enabled = False",
        f"local_tmp = {bed.state_dir / 'ansible-tmp'}",
        f"collections_path = {collections}",
        f"roles_path = {REPO_ROOT / 'roles'}",
        "",
        "[ssh_connection]",
        "retries = 0",
        "pipelining = True",
        f"control_path_dir = {cp_dir}",
        "ssh_args = -C -o ControlMaster=auto -o ControlPersist=60s",
        "",
    ]))
    ssh_lines = []
    for name, addr in bed.all_hosts.items():
        ssh_lines += [f"Host {name}", f"  HostName {addr}"]
    ssh_lines += ["Host *", "  User root", f"  IdentityFile {bed.private_key}", "  IdentitiesOnly yes",
                  "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR",
                  f"  ConnectTimeout {ANSIBLE_TIMEOUT_S}", "  BatchMode yes", ""]
    bed.ssh_config.write_text("\n".join(ssh_lines))


def _add_namespace(testbed_id: int, netns: str, veth: str, address: str) -> None:
    _run(["ip", "netns", "add", netns])
    _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    _run(["ip", "link", "set", veth, "master", bridge_name(testbed_id), "up"])
    _run(["ip", "-n", netns, "-batch", "-"], input_text="\n".join([
        "link set lo up",
        f"addr add {address}/24 dev eth0",
        "link set eth0 up",
    ]) + "\n")


def up(hosts: int = 4, dead: int = 1, testbed_id: int | None = None, prefix: str = DEFAULT_PREFIX,
       state_dir: str | Path | None = None, dead_name: str | None = None,
       systemd_hosts: list[str] | tuple[str, ...] = (), ready_timeout_s: float = 15.0,
       _lock_held: bool = False) -> Testbed:
    """Bring up test bed `testbed_id` (cleaning leftovers of an earlier run with that id first).

    Returns the Testbed; its JSON, inventory.ini, ansible.cfg and ssh_config are in its state dir."""
    _require_root()
    _check_tools()
    testbed_id = resolve_id(testbed_id)
    if not 1 <= hosts + dead + len(systemd_hosts) <= 240:
        raise TestbedError(f"{hosts} live + {dead} dead hosts do not fit a /24: use at most 240 in all")
    lock = TestbedLock(testbed_id)
    if not _lock_held and not lock.try_acquire():
        raise TestbedError(f"test bed id {testbed_id} is in use by a running session (pid {lock.holder()}): "
                           f"pick another id (--id N or {ENV_ID}=N)")
    try:
        state = Path(state_dir).resolve() if state_dir is not None else default_state_dir(testbed_id)
        previous = _state_dir_for(testbed_id, None)  # where an earlier run of this id kept its state
        if previous != state:
            _teardown(testbed_id, previous)
        _teardown(testbed_id, state)
        return _build(testbed_id, hosts, dead, prefix, state, dead_name, list(systemd_hosts), ready_timeout_s,
                      record_pointer=state != default_state_dir(testbed_id))
    finally:
        lock.release()


def _build(testbed_id: int, n_hosts: int, n_dead: int, prefix: str, state: Path, dead_name: str | None,
           systemd_names: list[str], ready_timeout_s: float, record_pointer: bool) -> Testbed:
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)
    (state / ".straggler-testbed").write_text(f"test bed {testbed_id}\n")
    if record_pointer:
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        _state_pointer(testbed_id).write_text(f"{state}\n")
    bridge = bridge_name(testbed_id)
    controller = subnet_address(testbed_id, 1)
    live_names = [f"{prefix}{i:02d}" for i in range(1, n_hosts + 1)]
    if n_dead == 1:
        dead_names = [dead_name or f"{prefix}dead"]
    else:
        dead_names = [f"{dead_name or prefix + 'dead'}{i}" for i in range(1, n_dead + 1)]
    names = live_names + list(systemd_names) + dead_names
    if len(set(names)) != len(names):
        raise TestbedError(f"host names repeat ({', '.join(names)}): choose another --prefix or --dead-name")
    octet = iter(range(FIRST_HOST_OCTET, 255))
    addresses = {name: subnet_address(testbed_id, next(octet)) for name in names}
    bed = Testbed(
        id=testbed_id, state_dir=state, prefix=prefix, bridge=bridge, controller_address=controller,
        hosts={n: addresses[n] for n in live_names}, dead={n: addresses[n] for n in dead_names},
        systemd_hosts={n: addresses[n] for n in systemd_names},
        netns={n: f"{netns_prefix(testbed_id)}{n}" for n in names}, pids={},
        private_key=state / "id_ed25519", inventory=state / "inventory.ini",
        ansible_cfg=state / "ansible.cfg", ssh_config=state / "ssh_config",
    )
    try:
        _keygen(bed.private_key, f"straggler-testbed-{testbed_id}")
        shutil.copyfile(f"{bed.private_key}.pub", state / "authorized_keys")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{controller}/24", "dev", bridge])
        _run(["ip", "link", "set", bridge, "up"])
        for index, name in enumerate(names, start=1):
            _add_namespace(testbed_id, bed.netns[name], f"{veth_prefix(testbed_id)}{index}", addresses[name])
        for name in dead_names:
            _run(["ip", "netns", "exec", bed.netns[name], "nft", "-f", "-"], input_text=(
                "table inet straggler_testbed {\n"
                "  chain input { type filter hook input priority 0; policy accept; tcp dport 22 drop; }\n"
                "}\n"))
        _write_ansible_files(bed)
        procs = {name: _start_host_sshd(bed, name, addresses[name], bed.netns[name]) for name in live_names}
        bed.pids = {name: proc.pid for name, proc in procs.items()}
        bed.save()
        if systemd_names:
            _systemd_up(bed, systemd_names)
            bed.save()
        _wait_ready(bed, procs, ready_timeout_s)
        bed.save()
        return bed
    except BaseException:
        _teardown(testbed_id, state)
        raise


def _wait_ready(bed: Testbed, procs: dict[str, subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = dict(bed.hosts)
    while waiting:
        for name in list(waiting):
            proc = procs[name]
            if proc.poll() is not None:
                meta = bed.host_dir(name).parent
                why = ((meta / "start.log").read_text(errors="replace") + (meta / "sshd.log").read_text(errors="replace")
                       if (meta / "sshd.log").exists() else (meta / "start.log").read_text(errors="replace"))
                last = why.strip().splitlines()[-1] if why.strip() else f"exit {proc.returncode}"
                raise TestbedError(f"sshd of {name} exited at start: {last}")
            if _tcp_open(waiting[name], 22):
                del waiting[name]
        if waiting and time.monotonic() > deadline:
            raise TestbedError(f"sshd of {', '.join(waiting)} not listening after {timeout_s:.0f} s: see {bed.state_dir}/hosts/*/sshd.log")
        if waiting:
            time.sleep(0.02)
    for name, proc in procs.items():
        if not _pid_is_sshd(proc.pid):
            raise TestbedError(f"pid {proc.pid} of {name} is not sshd: the start chain did not exec")


# --------------------------------------------------------------------------- systemd hosts

class RootfsUnavailable(TestbedError):
    """The systemd host's root file system cannot be built here (no debootstrap/systemd-nspawn, or
    the Debian mirror cannot be reached). Tests skip on this, with its message as the reason."""


ROOTFS_CACHE = Path("/var/cache/straggler-testbed")
ROOTFS_SUITE = "bookworm"
ROOTFS_PACKAGES = ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
                   "iproute2", "procps")
ROOTFS_STAMP = ".straggler-rootfs"
SYSTEMD_BOOT_TIMEOUT_S = 60.0
SYSTEMD_STOP_TIMEOUT_S = 20.0


def _debian_mirror() -> str:
    """The Debian mirror configured for apt on this machine (deb822 or one-line format)."""
    apt = Path("/etc/apt")
    for path in sorted(apt.glob("sources.list.d/*.sources")):
        for stanza in path.read_text(errors="replace").split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#"))
            uris, suites = fields.get("URIs", "").split(), fields.get("Suites", "").split()
            if uris and ROOTFS_SUITE in suites and "security" not in uris[0]:
                return uris[0].strip()
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == ROOTFS_SUITE:
                    return next(p for p in parts[1:] if not p.startswith("["))
    return "http://deb.debian.org/debian"


def _rootfs_stamp() -> str:
    return f"{ROOTFS_SUITE} minbase {','.join(ROOTFS_PACKAGES)}\n"


def systemd_rootfs(cache_dir: Path = ROOTFS_CACHE) -> Path | None:
    """The cached systemd root file system, or None if it has not been built (yet)."""
    rootfs = cache_dir / "rootfs"
    try:
        return rootfs if (rootfs / ROOTFS_STAMP).read_text() == _rootfs_stamp() else None
    except OSError:
        return None


def ensure_systemd_rootfs(cache_dir: Path = ROOTFS_CACHE, mirror: str | None = None,
                          timeout_s: float = 900.0) -> Path:
    """Build (once; ~1 minute, ~320 MB) and cache a Debian minbase root file system with systemd,
    sshd and python3 for systemd hosts. Raises RootfsUnavailable when it cannot be built here."""
    _require_root()
    for tool in ("debootstrap", "systemd-nspawn"):
        if shutil.which(tool) is None:
            raise RootfsUnavailable(f"{tool} not installed: run 'make setup' (packages debootstrap, systemd-container)")
    ready = systemd_rootfs(cache_dir)
    if ready:
        return ready
    cache_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(cache_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:  # another session may be building it: wait for that (bounded)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TestbedError(f"another process holds {cache_dir}/.lock for over {timeout_s:.0f} s: is a debootstrap stuck?") from None
                time.sleep(0.5)
        ready = systemd_rootfs(cache_dir)
        if ready:
            return ready
        return _build_rootfs(cache_dir, mirror or _debian_mirror(), max(60.0, deadline - time.monotonic()))
    finally:
        os.close(lock_fd)


def _build_rootfs(cache_dir: Path, mirror: str, timeout_s: float) -> Path:
    build = cache_dir / f"rootfs.build-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    for old in cache_dir.glob("rootfs.build-*"):
        shutil.rmtree(old, ignore_errors=True)
    log = cache_dir / "debootstrap.log"
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}", ROOTFS_SUITE, str(build), mirror]
    try:
        with open(log, "wb") as out:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        shutil.rmtree(build, ignore_errors=True)
        raise RootfsUnavailable(f"debootstrap from {mirror} did not finish within {timeout_s:.0f} s: see {log}") from None
    if proc.returncode != 0:
        text = log.read_text(errors="replace")
        shutil.rmtree(build, ignore_errors=True)
        last = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit {proc.returncode}"]
        network = any(word in text for word in ("Failed getting release file", "Couldn't download", "Temporary failure",
                                                  "Could not resolve", "Connection refused", "Network is unreachable",
                                                  "Failed to connect", "Unable to fetch"))
        cls = RootfsUnavailable if network else TestbedError
        raise cls(f"debootstrap {ROOTFS_SUITE} from {mirror} failed: {last[0].strip()} (see {log})")
    # Make it a template: each boot gets its own machine id and the hostname nspawn gives it.
    (build / "etc/machine-id").write_text("")
    (build / "etc/hostname").unlink(missing_ok=True)
    ssh_dir = build / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").touch(mode=0o600)  # a bind-mount target: each test bed binds its key
    (build / ROOTFS_STAMP).write_text(_rootfs_stamp())
    rootfs = cache_dir / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    build.rename(rootfs)
    return rootfs


def _cgroup_roots() -> list[Path]:
    """The cgroup hierarchies systemd-nspawn uses: cgroup2 (unified) and v1 name=systemd."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # pure cgroup v2
        return [base]
    return [p for p in (base / "unified", base / "systemd") if (p / "cgroup.procs").exists()]


def _cgroup_name(testbed_id: int, host: str) -> str:
    return f"straggler-testbed-{testbed_id}-{host}"


def _our_cgroups(testbed_id: int) -> list[Path]:
    prefix = f"straggler-testbed-{testbed_id}-"
    return [p for root in _cgroup_roots() for p in root.glob(prefix + "*") if p.is_dir()]


def _cgroup_pids(cgroup: Path) -> list[int]:
    pids = []
    for procs in cgroup.rglob("cgroup.procs"):
        try:
            pids += [int(tok) for tok in procs.read_text().split()]
        except (OSError, ValueError):
            pass
    return pids


def _remove_cgroup(cgroup: Path) -> None:
    for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with suppress(OSError):
            sub.rmdir()
    with suppress(OSError):
        cgroup.rmdir()


def _container_init_pid(netns: str) -> int | None:
    """PID (in our pid namespace) of the container's PID 1 running in `netns`."""
    for pid in _netns_pids(netns):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(nspid) >= 2 and nspid[-1] == "1":
            return pid
    return None


def _systemd_up(bed: Testbed, names: list[str]) -> None:
    rootfs = ensure_systemd_rootfs()
    Path("/run/systemd/nspawn").mkdir(parents=True, exist_ok=True)  # mount point for a private tmpfs
    nspawns: dict[str, subprocess.Popen] = {}
    for name in names:
        host_meta = bed.host_dir(name).parent
        (host_meta / "root/etc").mkdir(parents=True, exist_ok=True)
        hosts_file = host_meta / "root/etc/hosts"
        hosts_file.write_text(_etc_hosts(bed.all_hosts, name, bed.controller_address))
        cgroups = []
        for root in _cgroup_roots():
            cgroup = root / _cgroup_name(bed.id, name)
            cgroup.mkdir(exist_ok=True)
            cgroups.append(cgroup)
        nspawn = ["systemd-nspawn", "-D", str(rootfs), "-b", "--register=no", "--keep-unit", "--resolv-conf=off",
                  f"--network-namespace-path=/run/netns/{bed.netns[name]}", "--console=pipe",
                  f"--machine={name}", f"--hostname={name}", "--volatile=overlay", "--link-journal=no",
                  f"--bind-ro={bed.state_dir / 'authorized_keys'}:/root/.ssh/authorized_keys",
                  f"--bind-ro={hosts_file}:/etc/hosts"]
        script = [f"echo $$ > {shlex.quote(str(cg / 'cgroup.procs'))}" for cg in cgroups]
        script += ["mount -t tmpfs -o mode=0755 tmpfs /run/systemd/nspawn",
                   "exec " + " ".join(shlex.quote(a) for a in nspawn)]
        console = open(host_meta / "console.log", "wb")
        try:
            proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
                                    stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        finally:
            console.close()
        _children[proc.pid] = proc
        nspawns[name] = proc
        bed.systemd_pids[name] = {"nspawn": proc.pid, "init": None}
        bed.save()
    deadline = time.monotonic() + SYSTEMD_BOOT_TIMEOUT_S
    waiting = set(names)
    while waiting:
        for name in list(waiting):
            proc = nspawns[name]
            if proc.poll() is not None:
                text = (bed.host_dir(name).parent / "console.log").read_text(errors="replace").strip().splitlines()
                raise TestbedError(f"systemd host {name}: systemd-nspawn exited ({proc.returncode}): {text[-1] if text else ''}")
            if _tcp_open(bed.systemd_hosts[name], 22):
                bed.systemd_pids[name]["init"] = _container_init_pid(bed.netns[name])
                waiting.discard(name)
        if waiting and time.monotonic() > deadline:
            raise TestbedError(f"systemd host(s) {', '.join(sorted(waiting))} did not answer on port 22 within "
                               f"{SYSTEMD_BOOT_TIMEOUT_S:.0f} s: see {bed.state_dir}/hosts/*/console.log")
        if waiting:
            time.sleep(0.1)


def _systemd_teardown(testbed_id: int, state_dir: Path | None) -> None:
    """Stop systemd hosts cleanly (TERM to systemd-nspawn makes the container power off), then
    kill whatever is left in their cgroups and remove the cgroups nspawn leaves behind."""
    nspawn_pids: list[int] = []
    if state_dir is not None and (state_dir / STATE_FILE).exists():
        with suppress(OSError, ValueError, KeyError):
            bed = Testbed.from_json(state_dir / STATE_FILE)
            nspawn_pids = [p["nspawn"] for p in bed.systemd_pids.values() if p.get("nspawn")]
    cgroups = _our_cgroups(testbed_id)
    in_cgroups = {pid for cg in cgroups for pid in _cgroup_pids(cg)}
    nspawn_pids = [p for p in nspawn_pids if p in in_cgroups or p in _children]
    for pid in nspawn_pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + SYSTEMD_STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(_pid_alive(p) for p in nspawn_pids):
        time.sleep(0.05)
    leftovers = [pid for cg in cgroups for pid in _cgroup_pids(cg)] + nspawn_pids
    _kill_and_wait(leftovers)
    for pid in nspawn_pids:
        child = _children.pop(pid, None)
        if child is not None:
            with suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1)
    for cgroup in cgroups:
        deadline = time.monotonic() + 5.0
        while cgroup.exists() and time.monotonic() < deadline:
            _remove_cgroup(cgroup)
            if cgroup.exists():
                time.sleep(0.05)


# --------------------------------------------------------------------------- module API

def load(testbed_id: int | None = None, state_dir: str | Path | None = None) -> Testbed:
    """The running test bed `testbed_id` (from its testbed.json)."""
    testbed_id = resolve_id(testbed_id)
    path = _state_dir_for(testbed_id, state_dir) / STATE_FILE
    if not path.exists():
        raise TestbedError(f"test bed {testbed_id} is not up ({path} missing): run 'python -m straggler_lab.testbed up --id {testbed_id}'")
    return Testbed.from_json(path)


def exec_in_host(name: str, argv: list[str], testbed_id: int | None = None, state_dir: str | Path | None = None,
                 **run_kwargs) -> subprocess.CompletedProcess:
    """Run argv inside host `name` of test bed `testbed_id` (mount+uts+net namespaces of its sshd)."""
    return load(testbed_id, state_dir).exec(name, argv, **run_kwargs)


def status(testbed_id: int | None = None, state_dir: str | Path | None = None) -> dict:
    """What is running: per host its address, netns, sshd pid and whether port 22 answers."""
    testbed_id = resolve_id(testbed_id)
    result = {"id": testbed_id, "up": False, "netns": _our_netns(testbed_id), "links": _our_links(testbed_id)}
    try:
        bed = load(testbed_id, state_dir)
    except TestbedError:
        return result
    result.update(up=True, state_dir=str(bed.state_dir), inventory=str(bed.inventory), hosts={})
    for name, addr in bed.all_hosts.items():
        pid = bed.pids.get(name) or (bed.systemd_pids.get(name) or {}).get("init")
        kind = "live" if name in bed.hosts else "systemd" if name in bed.systemd_hosts else "dead"
        result["hosts"][name] = {
            "address": addr, "kind": kind, "netns": bed.netns[name], "pid": pid,
            "pid_alive": bool(pid and _pid_alive(pid)),
            "ssh_port_open": _tcp_open(addr, 22) if kind != "dead" else False,
        }
    return result


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testbed.py", description="Several SSH hosts on one machine, in network namespaces.")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--id", type=int, default=None, help=f"test bed id 0..255 (default ${ENV_ID} or 0)")
        p.add_argument("--state-dir", default=None, help="default /tmp/straggler-testbed-<id>")

    p_up = sub.add_parser("up", help="bring up (replacing leftovers of the same id); prints the inventory path")
    add_common(p_up)
    p_up.add_argument("--hosts", type=int, default=4)
    p_up.add_argument("--dead", type=int, default=1)
    p_up.add_argument("--prefix", default=DEFAULT_PREFIX)
    p_up.add_argument("--dead-name", default=None, help="name of the dead host (default <prefix>dead)")
    p_up.add_argument("--systemd-host", action="append", default=[], metavar="NAME",
                      help="add a host that boots real systemd (systemd-nspawn); repeatable")
    p_down = sub.add_parser("down", help="tear down; idempotent")
    add_common(p_down)
    p_down.add_argument("--force", action="store_true", help="even if a test session holds the id")
    p_status = sub.add_parser("status", help="print the test bed's state as JSON")
    add_common(p_status)
    p_exec = sub.add_parser("exec", help="run a command inside a host: exec NAME -- CMD …")
    add_common(p_exec)
    p_exec.add_argument("name")
    p_exec.add_argument("cmd", nargs=argparse.REMAINDER)

    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            started = time.monotonic()
            bed = up(args.hosts, args.dead, args.id, args.prefix, args.state_dir, args.dead_name,
                     systemd_hosts=args.systemd_host)
            print(f"testbed {bed.id}: {len(bed.hosts)} live, {len(bed.systemd_hosts)} systemd, {len(bed.dead)} dead "
                  f"host(s) up in {time.monotonic() - started:.2f} s; ANSIBLE_CONFIG={bed.ansible_cfg}", file=sys.stderr)
            print(bed.inventory)
        elif args.command == "down":
            down(args.id, args.state_dir, force=args.force)
        elif args.command == "status":
            print(json.dumps(status(args.id, args.state_dir), indent=2))
        elif args.command == "exec":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                raise TestbedError("exec needs a command: testbed.py exec NAME -- CMD …")
            bed = load(args.id, args.state_dir)
            full = bed.nsenter_argv(args.name, cmd)
            os.execvp(full[0], full)
    except TestbedError as exc:
        print(f"testbed: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
