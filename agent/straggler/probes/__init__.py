"""The agent's probes: BCC loading, CUDA/NCCL symbol resolution, attaching, draining.

  symbols.py  which functions are traced, under which symbol names, where the libraries are
  loader.py   compile bpf/*.c as one BCC program, attach, read and write its maps
  records.py  decode the kernel's fixed-size records into store rows
  targets.py  /proc: targets (--pid, --comm, or every process mapping a CUDA library), scope, rank
  net.py      the TCP flows' counters (bpf/net.c) as net_flows rows: addresses, route iface, RTT in us

Which calls get a row in `events` (RECORD_RULE, also shown by `straggler trace --help`):
every call is counted in `aggregates` (per interval, process and op: count, sum, max and a
log2 histogram, computed in the kernel). A call gets its own row when ANY of these holds:
  1. --record-all;
  2. it was slow: duration >= --slow-floor-us, or >= --slow-factor x the running median of
     that op on this node (the median comes from the kernel's histograms, updated each interval);
  3. its thread was switched out (preempted or blocked) while the call was in progress;
  4. it is in the random 1-in---sample sample (0 disables the sample);
  5. it returned an error (a non-zero cudaError_t / CUresult / ncclResult_t, in `events.ret`);
  6. it set up an NCCL communicator (ncclCommInitRank*, ncclCommSplit): rare, and what explain
     groups the collectives by.
`events.detail` says which ("why": ["slow", "offcpu", "sample", "error", "setup"]) unless --record-all.
Scheduling and block I/O events are always recorded (and aggregated per interval too).

This package must not touch SQLite: the agent passes rows to store/writer.py.
"""

RECORD_RULE = """which calls get a row in `events`: every call is counted in `aggregates` (per
interval, process and op: count, sum, max, log2 histogram; computed in the kernel). A call also
gets its own row when ANY of: (1) --record-all; (2) it was slow: duration >= --slow-floor-us, or
>= --slow-factor x the running median of its op; (3) its thread went off CPU during the call;
(4) it falls in the random 1-in---sample sample; (5) it returned an error (ret != 0); (6) it set up an
NCCL communicator (ncclCommInitRank, ncclCommSplit). events.detail says which ("why"). Scheduling (offcpu, runq) and block I/O events are always
recorded."""
