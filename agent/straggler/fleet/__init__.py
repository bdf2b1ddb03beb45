"""The fleet client: one SQL on every node's agent at once, with clock offsets and a status per node.
See client.py (library) and cli.py (`straggler fleet`)."""
