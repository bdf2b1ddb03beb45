"""Analysis over the store: explain (which node is the straggler, and why), merge (node
databases into one clock-aligned cluster database), export (Perfetto timeline), and synth
(synthetic databases for tests and benchmarks).

Everything here reads the store through SQL written against store/schema.py; it must not
reach back into the agent, the probes or the API server.
"""
