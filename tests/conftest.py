"""Shared pytest fixtures and markers for all of straggler's tests.

Keep this file to what several test files share: the multi-host `testbed` fixture, the
`root_required` guard, the `bpf` / `systemd` markers and the tiers. A fixture that only one test
file needs belongs in that file. This file must not start anything at import time.

Tiers: `make test` runs everything; `make test-fast` runs `-m "not slow"` (the inner loop). A test
is marked `slow` here, at collection, never by hand: when it uses a test bed or the installed
collection (by fixture, directly or through another fixture), is marked `bpf` or `systemd`, or lives
in a file of SLOW_FILES (ansible-playbook, ansible-test or ansible-lint runs). Its reason is the
marker's `reason` (`pytest --collect-only -q -m slow` lists them).

    def test_x(testbed):                      # 4 live hosts gpu-node-01..04 + gpu-node-dead
        env = testbed.ansible_env()           # ANSIBLE_CONFIG=<state>/ansible.cfg
        testbed.exec("gpu-node-01", ["hostname"]).stdout

    def test_z(systemd_testbed): ...          # gpu-node-systemd boots real systemd (+ gpu-node-01)

    @pytest.mark.bpf                          # skipped (with the reason) where eBPF cannot work
    def test_probe(): ...

    def test_y(root_required): ...            # skipped when not root
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from straggler_lab import testbed as testbed_lib

SESSION_TESTBED_ID = 7
FALLBACK_TESTBED_IDS = range(200, 220)  # used when id 7 is held by another running session
SYSTEMD_TESTBED_ID = 207
SYSTEMD_FALLBACK_IDS = range(230, 240)
SYSTEMD_HOST = "gpu-node-systemd"


# What makes a test `slow` (minutes to set up or run on a 2-core machine): the fixtures, the
# markers, and the files whose every test runs Ansible's own tools.
SLOW_FIXTURES = {
    "testbed": "the multi-host test bed",
    "systemd_testbed": "the systemd test host",
    "installed_collection": "the collection built and installed with ansible-galaxy",
}
SLOW_MARKERS = {"bpf": "eBPF", "systemd": "the systemd test host"}
SLOW_FILES = {
    "test_collection.py": "ansible-playbook and ansible-test sanity runs",
    "test_playbooks_local.py": "ansible-playbook runs",
    "test_playbooks_typed.py": "ansible-playbook runs",
    "test_playbooks_controllers.py": "ansible-playbook runs",
    "test_collection_jobs_inventory.py": "ansible-inventory and ansible-playbook runs",
    "test_lint.py": "ansible-lint over the repository",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bpf: needs root and a kernel with BPF tracing (skipped with the reason otherwise)")
    config.addinivalue_line("markers", "systemd: needs the systemd-nspawn test host (debootstrap rootfs)")
    config.addinivalue_line("markers", "slow: set at collection (conftest.py): a test bed, eBPF, the installed "
                                       "collection or Ansible's tools; `make test-fast` deselects these")


def _slow_reason(item: pytest.Item) -> str | None:
    """Why `item` belongs to the slow tier, or None (the fast tier)."""
    for name, reason in SLOW_MARKERS.items():
        if item.get_closest_marker(name) is not None:
            return reason
    for name in getattr(item, "fixturenames", ()):   # the closure: fixtures requested through others too
        if name in SLOW_FIXTURES:
            return SLOW_FIXTURES[name]
    return SLOW_FILES.get(item.path.name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = _slow_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.slow(reason=reason))


def _bpf_unavailable_reason() -> str | None:
    """Why eBPF tests cannot run on this machine at all, or None. A missing BCC or missing kernel
    headers is NOT a reason to skip: `make setup` provides both, so tests should fail loudly."""
    if os.geteuid() != 0:
        return "needs root (loading BPF programs)"
    if not (Path("/sys/kernel/btf/vmlinux").exists() or Path("/sys/kernel/tracing/events/sched").exists()
            or Path("/sys/kernel/debug/tracing/events/sched").exists()):
        return "this kernel has no BPF tracing support (no BTF, no tracepoints)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("bpf") is not None:
        reason = _bpf_unavailable_reason()
        if reason:
            pytest.skip(f"eBPF: {reason}")


@pytest.fixture
def root_required() -> None:
    """Skip the test unless running as root."""
    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces, eBPF, packages)")


def _claim_testbed_id(env_name: str = testbed_lib.ENV_ID, preferred: int = SESSION_TESTBED_ID,
                      fallbacks: range = FALLBACK_TESTBED_IDS) -> testbed_lib.TestbedLock:
    """The id from $<env_name>, exactly; else `preferred`, or a free fallback id when another
    running session holds it. The returned lock is held until the session ends."""
    explicit = os.environ.get(env_name)
    if explicit:
        try:
            candidates = [testbed_lib.resolve_id(int(explicit))]
        except ValueError:
            pytest.fail(f"{env_name}={explicit!r} is not a number: use 0..255", pytrace=False)
    else:
        candidates = [preferred, *fallbacks]
    for candidate in candidates:
        lock = testbed_lib.TestbedLock(candidate)
        if lock.try_acquire():
            return lock
    held = testbed_lib.TestbedLock(candidates[0])
    pytest.fail(f"test bed id {candidates[0]} is held by another session (pid {held.holder()}): "
                f"set {env_name} to a free id", pytrace=False)


@pytest.fixture(scope="session")
def testbed():
    """Four live SSH hosts gpu-node-01..04 and one dead host gpu-node-dead, for the whole session.

    Yields a straggler_lab.testbed `Testbed`: .inventory, .ansible_cfg, .hosts (name -> address of the live
    hosts), .dead (name -> address), .exec(name, argv), .popen(name, argv), .ansible_env(),
    .ssh_argv(name, *cmd), .host_dir(name), .state_dir, .id, .controller_address."""
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root (network namespaces, bind mounts)")
    lock = _claim_testbed_id()
    try:
        bed = testbed_lib.up(hosts=4, dead=1, testbed_id=lock.testbed_id, _lock_held=True)
        try:
            yield bed
        finally:
            testbed_lib.down(bed.id, bed.state_dir, _lock_held=True)
    finally:
        lock.release()


@pytest.fixture(scope="session")
def systemd_testbed():
    """A test bed whose one host, gpu-node-systemd, boots real systemd (systemd-nspawn, PID 1 =
    systemd, sshd reachable with the same key), plus one plain live host gpu-node-01. Its own id
    ($STRAGGLER_SYSTEMD_TESTBED_ID or 207). Skipped, with the reason, where the Debian root file
    system cannot be built (no mirror); the first build takes a few minutes and is cached under
    /var/cache/straggler-testbed/rootfs. Yields a `Testbed`; .systemd_hosts maps name -> address,
    inventory groups: [systemd], [live], [gpu] (all)."""
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root (network namespaces, systemd-nspawn)")
    try:
        testbed_lib.ensure_systemd_rootfs()
    except testbed_lib.RootfsUnavailable as exc:
        pytest.skip(f"systemd host unavailable: {exc}")
    lock = _claim_testbed_id("STRAGGLER_SYSTEMD_TESTBED_ID", SYSTEMD_TESTBED_ID, SYSTEMD_FALLBACK_IDS)
    try:
        bed = testbed_lib.up(hosts=1, dead=0, testbed_id=lock.testbed_id, systemd_hosts=[SYSTEMD_HOST],
                             _lock_held=True)
        try:
            yield bed
        finally:
            testbed_lib.down(bed.id, bed.state_dir, _lock_held=True)
    finally:
        lock.release()


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory):
    """The collection as a user has it, once for the session: the README's from-zero install block followed
    as written (tests/galaxy_helpers.py), in a copy of the checkout and a fresh home under /tmp: a venv
    with ansible-core, `make collection` without root, `ansible-galaxy collection install`, `pip install -r`.
    A dict: env, newcomer_env, path (the installed collection), venv, home, root (a working directory),
    built (the build's summary)."""
    from galaxy_helpers import install_as_the_readme_says
    return install_as_the_readme_says(tmp_path_factory.mktemp("collection"))
