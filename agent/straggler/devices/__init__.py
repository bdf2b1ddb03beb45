"""The devices' own word: what the GPUs (NVML) and the kernel's Xid errors say, for the agent.

When every rank waits in synchronize and NCCL only enqueues, a slow GPU (throttled, a degraded PCIe or
NVLink link, ECC row remapping, about to fall off the bus) slows all ranks alike: only the device can
name itself. This package reads it:
  nvml.py      the GPUs through NVIDIA's management library (nvidia-ml-py, optional: `straggler[gpu]`)
  xid.py       the driver's Xid lines in the kernel log (/dev/kmsg), parsed, read without blocking
  procmap.py   which /dev/nvidiaN files a process holds open
  monitor.py   the agent's device thread: the three above into gpus, gpu_samples, gpu_processes, gpu_errors
Tables and units: store/schema.py and docs/devices.md.

Layer: above store.schema (whose column order it writes), below the agent. It must not import BCC or
the probes, and prints nothing (the agent says what it returns).
"""
