"""Merge node databases into one clock-aligned cluster database: `straggler merge A.db B.db … -o cluster.db`.

One concern per module:
  - vetting: the inputs are untrusted (they come from the nodes): only plain tables where merge
    reads, no trigger, hardened read-only connections, every meta and clock value type-checked;
    an input holds the nodes its meta says (`node`, or `nodes` for a merged one), checked in SQL
    over every row of every node table, and its `node.<NODE>.*` meta keys are its own nodes';
  - planning: the paths, the node each input must hold (--expect), the output name of every node
    (--rename, --auto-rename), the measured offsets (--offsets);
  - values: what each copied column may hold (the store's schema: an integer, a number, text, JSON;
    NULL only where allowed), as SQL the copy filters by, and the read that names a bad row;
  - copy: ATTACH + INSERT … SELECT per input inside one read transaction, meta under
    `node.<NODE>.<key>`, the offsets used in clock_offsets (method 'merge'), the 0600 output
    written beside its place and renamed into it;
  - deadline: the time limit (--deadline) every step runs under;
  - merge() here ties them together.
Clock alignment is straggler.clock's (clock_segments, Aligner), shared with export:
`events.ts_aligned` = the node's monotonic `ts` mapped to its realtime with its own clock_pairs
(within 1 ns of clock.mono_to_real), minus the node's measured realtime offset (from `offsets`,
else the input's latest clock_offsets row, else 0, reported).

Every refusal is one MergeError line naming the file, with no output left behind: a missing,
non-SQLite, corrupt or crafted input, a newer schema, an input that says no node, a row anywhere
of a node the input does not say it holds, meta keys of another node, two inputs holding the same
node (unless renamed), an input holding another node than expected, a value of the wrong type in
any column copied (values: the table, the column, the node, the row and the value named), an output
that is an input, a merge past its deadline (clock alignment included). The package must not
modify its inputs, talk to the network, parse arguments or print (straggler.cli.merge does).
"""
import os
import time

from . import planning, vetting
from .copy import content_digest, node_meta_key, write_merged
from .deadline import DEFAULT_DEADLINE_S, PROGRESS_OPS, Deadline
from .errors import MergeError
from .planning import load_offsets, normalize_offsets, parse_expected, parse_renames
from .vetting import NODE_META_PREFIX, NODE_TABLES, READ_OBJECTS, inspect_input, node_name_problem

__all__ = ["merge", "MergeError", "Deadline", "DEFAULT_DEADLINE_S", "PROGRESS_OPS", "NODE_TABLES", "READ_OBJECTS",
           "NODE_META_PREFIX", "node_meta_key", "content_digest", "inspect_input", "node_name_problem",
           "parse_expected", "parse_renames", "load_offsets", "normalize_offsets"]


def merge(inputs, output, offsets=None, rename=False, deadline_s=DEFAULT_DEADLINE_S, expected_nodes=None,
          only_if_changed=False):
    """Merge node databases `inputs` into `output` (atomically). Returns a summary dict, whose
    `changed` says whether `output` was written.

    offsets: {node: (offset_ns, uncertainty_ns)} measured realtime offsets (node minus
    reference); nodes not in it use their input's clock_offsets, else 0 (reported).
    rename: False (refuse duplicate nodes), True (rename later duplicates NODE-2, NODE-3, …),
    or [(old, new), …] / {old: new}: rename node `old` in the later input that repeats it
    (or in the only input that holds it).
    deadline_s: seconds the whole merge may take (None: DEFAULT_DEADLINE_S); past it the merge
    stops with MergeError and writes nothing.
    expected_nodes: {input path: node name}: such an input must hold exactly that node (the
    host it was collected from), else it is refused.
    only_if_changed: when `output` exists and holds what this merge would write (content_digest:
    every row, leaving out the stamps of when a merge ran), leave it as it is (`changed` False).
    """
    started = time.monotonic()
    deadline = Deadline(deadline_s)
    inputs = [os.fspath(p) for p in inputs]
    output = os.fspath(output)
    planning.check_paths(inputs, output)
    expected = planning.expected_per_input(inputs, expected_nodes)
    out_dir = planning.check_output_dir(output)
    nodes_per_input = []
    for path in inputs:
        deadline.check()
        nodes = vetting.inspect_input(path, deadline)
        planning.check_expected(path, nodes, expected)
        nodes_per_input.append(nodes)
    plans = planning.plan_names(inputs, nodes_per_input, rename)
    offsets = normalize_offsets(offsets or {}) if offsets else {}
    summary = write_merged(inputs, plans, offsets, output, out_dir, deadline, only_if_changed)
    summary["unaligned"] = [n for n, a in summary["clock_alignment"].items() if not a["aligned"]]
    summary["offset_unknown"] = [n for n, a in summary["clock_alignment"].items() if a["source"] == "none"]
    summary["elapsed_s"] = round(time.monotonic() - started, 3)
    return summary
