"""Which GPUs a process holds open: the /dev/nvidiaN device files among its file descriptors.

A CUDA process opens /dev/nvidiaN (N: the GPU's minor number) for every GPU it uses, besides
/dev/nvidiactl and /dev/nvidia-uvm (not GPUs, ignored). This reads /proc/PID/fd (its links, never the
files), a bounded number of entries per process; a process that is gone or not ours yields nothing.

This module must not import pynvml, BCC or the store, and prints nothing.
"""
import os
import re

NVIDIA_DEVICE = re.compile(r"\A/dev/nvidia(\d{1,4})\Z")
MAX_FDS_PER_PROCESS = 65536


def nvidia_minors_open(pid, proc_root="/proc", max_fds=MAX_FDS_PER_PROCESS):
    """The minor numbers N of the /dev/nvidiaN files process `pid` has open (a set; empty when none, when
    the process is gone, or when its fds cannot be read)."""
    minors = set()
    fd_dir = os.path.join(proc_root, str(int(pid)), "fd")
    try:
        entries = os.scandir(fd_dir)
    except OSError:
        return minors
    with entries:
        for count, entry in enumerate(entries):
            if count >= max_fds:
                break
            try:
                target = os.readlink(entry.path)
            except OSError:              # closed meanwhile
                continue
            match = NVIDIA_DEVICE.match(target)
            if match:
                minors.add(int(match.group(1)))
    return minors
