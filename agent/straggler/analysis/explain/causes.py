"""explain's words, in one leaf module: the cause classes a finding can name, the GPU's own kinds of
evidence and their words, and the recommendation of each class — what findings.py, devices.py and
timeline.py share (they import this, never each other for it). Nothing here decides or reads anything."""

CAUSE_CLASSES = ("cpu-contention", "self-contention", "host-compute", "gpu-slow", "cuda-calls", "io-self",
                 "io-other", "more-work", "gpu-throttled", "gpu-link", "gpu-errors", "net-link", "net-congestion",
                 "unknown")
MORE_WORK_RECOMMENDATION = (
    "balance the work, not the hardware — this node is healthy, do not drain it: even out the pipeline stages "
    "(move layers off this rank's stage), pack or bucket sequences so every rank's batch holds as many tokens, "
    "size batches by tokens rather than by samples; look at what this rank computes that the others do not")
DEVICE_KINDS = ("gpu-errors", "gpu-link", "gpu-throttled")   # a GPU's own word, gravest first
DEVICE_WORDS = {"gpu-throttled": "GPU throttled", "gpu-link": "GPU link degraded", "gpu-errors": "GPU errors"}

DEVICE_RECOMMENDATION = {
    "gpu-throttled": ("cooling or power: check the GPU's temperature and fans (nvidia-smi -q -d TEMPERATURE,"
                      "PERFORMANCE), its power cap (nvidia-smi -q -d POWER; a lowered limit), the node's airflow; "
                      "drain it if it stays throttled"),
    "gpu-link": ("reseat or replace: its PCIe link trained below its generation/width (a loose riser or cable, a "
                 "bad slot) or its NVLinks report errors (nvidia-smi nvlink -e); drain the node and service it"),
    "gpu-errors": ("drain the node and reset the GPU (nvidia-smi -r, or a reboot); service it if the errors come "
                   "back (Xid meanings: docs/devices.md)"),
}

NET_WORDS = {"net-link": "link degraded", "net-congestion": "network congested"}
NET_RECOMMENDATION = {
    "net-link": ("check that link: its cable or optic and the switch port (ethtool IFACE for speed and duplex, "
                 "ethtool -S IFACE for its error counters, ip -s link; on InfiniBand ibstat and perfquery); reseat "
                 "or replace the cable, move the node off the port, drain it if the link keeps flapping"),
    "net-congestion": ("look at the path, not the GPU: the node's uplink and its switch port (congestion counters, "
                       "ECN/PFC pauses), other traffic on that node (ss -ti for its connections' round trips and "
                       "retransmissions, a backup or a data loader pulling over the same link), the job's NCCL "
                       "traffic class; move the node to another leaf if it stays"),
}


# excess component -> (cause class, summary, recommendation): the classes that need no more evidence
SIMPLE_CAUSES = {
    "host": ("host-compute",
             "host compute on {node}: its calling thread computes on the CPU outside CUDA/NCCL calls more than the others "
             "— {grew} vs {others} "
             "(data loading, preprocessing, Python, GC)",
             "profile the step's host side on that node (py-spy top --pid PID): data loading (more DataLoader workers, "
             "pinned memory), preprocessing, GC pauses (gc.freeze / gc.disable)"),
    "sync": ("gpu-slow",
             "slow GPU on {node}: it spends more time in synchronize (waiting for its own device) than the others, its "
             "host side does not — {grew} vs {others}; no host process is to blame",
             "check that GPU: nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE (throttling, clocks), ECC/XID errors in "
             "dmesg, its PCIe/NVLink link width; drain the node if it persists"),
    "work": ("cuda-calls",
             "CUDA calls slower on {node}: more on-CPU time inside launch/alloc/copy calls than the others — {grew} vs "
             "{others}",
             "look at the driver side: allocator churn (cudaMalloc in the loop), pageable copies (pin host memory), "
             "a contended driver lock"),
}

# the class a straggler's excess component is evidence of (runq and io are split further by the evidence)
COMPONENT_CAUSE = {component: cause for component, (cause, _, _) in SIMPLE_CAUSES.items()}

# a job-level cause: no node's fault, the job's own (steps.py)
IMBALANCE_RECOMMENDATION = (
    "balance each step's work across the ranks, not the nodes (they are healthy: do not drain any): bucket or pack "
    "sequences by length so every rank's batch holds as many tokens, size micro-batches by tokens, balance the "
    "pipeline stages; where a rank's own pauses or data loading stall it at random, see its host compute")
# ... where it fell on one rank most (one rank late at most sync points, though no episode names it)
ONE_RANK_RECOMMENDATION = (
    "look at what that rank does each step that the others do not: its work (kernels launched and their sizes, its "
    "batch, its pipeline stage), its host compute, its GPU; rebalance the work where it has more, and drain its node "
    "only where its GPU's own word (clock-event reasons, Xid) says it is at fault")

