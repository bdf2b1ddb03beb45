"""Which processes are traced and in scope, read from /proc (user-space side of targeting).

The kernel side (bpf/sched.c, bpf/cuda.c) follows forks and exits and, in the default mode,
adopts an in-scope process the moment it calls a traced function. This module does what the
kernel cannot: match --comm patterns, expand --pid to existing descendants, find processes
that map a CUDA library but have not called it yet, decide the network-namespace scope by
/proc/PID/ns/net, and read a process's torchrun identity (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) from /proc/PID/environ.

It must not import BCC or SQLite: it returns sets and records; the agent applies them.
"""
import fnmatch
import os

from . import symbols

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def list_pids():
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            pids.append(int(name))
    return pids


def netns_inode(pid="self"):
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def read_stat(pid):
    """(comm, ppid, start time in ns since boot) or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    left, right = data.find(b"("), data.rfind(b")")
    comm = data[left + 1:right].decode("utf-8", "replace")
    fields = data[right + 2:].split()
    try:
        ppid = int(fields[1])
        start_ns = int(fields[19]) * 1_000_000_000 // CLOCK_TICKS
    except (IndexError, ValueError):
        return None
    return comm, ppid, start_ns


def read_torchrun_env(pid):
    """{RANK: ..., LOCAL_RANK: ...} (only the torchrun keys present) from /proc/PID/environ."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode("ascii", "replace") in TORCHRUN_ENV:
            env[key.decode()] = value.decode("utf-8", "replace")
    return env


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class ProcessInfo:
    """What the store keeps about a traced process (table `processes`)."""
    __slots__ = ("pid", "ppid", "comm", "cmdline", "rank", "local_rank", "world_size", "master_addr",
                 "master_port", "first_seen", "last_seen", "exited", "dirty")

    @classmethod
    def read(cls, pid, now_ns):
        """From /proc, or None if the process is gone already."""
        stat = read_stat(pid)
        if stat is None:
            return None
        info = cls()
        info.pid = pid
        info.comm, info.ppid, start_ns = stat
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                info.cmdline = f.read().replace(b"\0", b" ").strip().decode("utf-8", "replace")[:4096]
        except OSError:
            info.cmdline = None
        env = read_torchrun_env(pid)
        info.rank = _int_or_none(env.get("RANK"))
        info.local_rank = _int_or_none(env.get("LOCAL_RANK"))
        info.world_size = _int_or_none(env.get("WORLD_SIZE"))
        info.master_addr = env.get("MASTER_ADDR")
        info.master_port = _int_or_none(env.get("MASTER_PORT"))
        # the process's start (boot-based ticks): stable across agent restarts, so one row per process
        info.first_seen = start_ns
        info.last_seen = now_ns
        info.exited = None
        info.dirty = True
        return info

    def row(self, node):
        return (node, self.pid, self.ppid, self.comm, self.cmdline, self.rank, self.local_rank, self.world_size,
                self.master_addr, self.master_port, self.first_seen, self.last_seen, self.exited)


def thread_ids(pid):
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
    except OSError:
        return []


class TargetFinder:
    """Decides, from /proc, which processes are in scope and which are targets.

    targets: explicit pids (and their descendants), processes whose comm (or argv[0] basename)
    matches a --comm glob, or -- when neither is given -- every process mapping a CUDA library.
    """

    def __init__(self, pids=(), comm_patterns=(), scope="host", self_pid=None):
        self.explicit_pids = set(pids)
        self.comm_patterns = list(comm_patterns)
        self.scope = scope
        self.self_pid = self_pid or os.getpid()
        self.own_netns = netns_inode("self")
        self.by_maps = not self.explicit_pids and not self.comm_patterns

    def in_scope(self, pid):
        return self.scope == "host" or netns_inode(pid) == self.own_netns

    def _comm_matches(self, pid, comm):
        names = [comm]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0].decode("utf-8", "replace")
            if argv0:
                names.append(os.path.basename(argv0))
        except OSError:
            pass
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.comm_patterns for name in names)

    def scan(self, known_targets=()):
        """One pass over /proc: (scope set or None for host, targets set, {library path: pid})."""
        scope = set() if self.scope == "netns" else None
        targets, libraries = set(), {}
        parents = {}
        comms = {}
        for pid in list_pids():
            if pid == self.self_pid:
                continue
            if scope is not None:
                if netns_inode(pid) != self.own_netns:
                    continue
                scope.add(pid)
            stat = read_stat(pid)
            if stat is None:
                continue
            comms[pid], parents[pid] = stat[0], stat[1]
            if self.by_maps:
                # default mode: every process mapping a CUDA library is a target
                libs = symbols.libraries_in_maps(pid)
                for path in libs:
                    libraries.setdefault(path, pid)
                if libs:
                    targets.add(pid)
            elif self.comm_patterns and self._comm_matches(pid, stat[0]):
                targets.add(pid)
        if self.explicit_pids:
            # the given pids and every descendant alive now (later forks: the kernel follows them)
            wanted = {pid for pid in self.explicit_pids if pid in parents}
            changed = True
            while changed:
                changed = False
                for pid, ppid in parents.items():
                    if ppid in wanted and pid not in wanted:
                        wanted.add(pid)
                        changed = True
            targets |= wanted
        if not self.by_maps:
            # explicit targets: their libraries (and those of targets the kernel added since)
            for pid in targets | set(known_targets):
                for path in symbols.libraries_in_maps(pid):
                    libraries.setdefault(path, pid)
        # every target's executable: one with the CUDA runtime linked in is attached like a library
        # (the loader reads each file's symbols once, by identity)
        for pid in targets | set(known_targets):
            exe = symbols.executable_of(pid)
            if exe is not None:
                libraries.setdefault(exe, pid)
        return scope, targets, libraries
