"""The node's network, as the kernel counts it: the interfaces and the RDMA ports, for the agent.

A rank on a node whose link trained down (a 400 Gb/s port at 100), flaps, or drops and retransmits
waits longer in every collective, and so does every rank that waits for it: the call timings say
*that* a node is late, the link's own counters say *why*. This package reads them:
  sysfs.py     pure readers of /sys/class/net and /sys/class/infiniband (and the interfaces' link modes
               through ethtool), bounded, never raising for a file it cannot read
  monitor.py   the agent's network thread: the readers into net_samples and rdma_samples
Tables and units: store/schema.py and docs/network.md.

Layer: above store.schema (whose column orders it writes), below the agent. It must not import BCC or
the probes, and prints nothing (the agent says what it returns).
"""
