"""Planning a merge before anything is read or written: which paths are inputs and which the
output (none twice, the output no input), the node each input must hold (--expect PATH=NODE), the
output name of every node (--rename OLD=NEW, --auto-rename; two inputs may not hold one node
otherwise), and the measured clock offsets (--offsets).

Pure rules over names, paths and the offsets file; must not open a database or write anything.
"""
import json
import os

from .errors import MergeError, show
from ...text import node_name_problem


def same_file(a, b):
    """Whether two paths name one file (by path, else by inode)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_paths(inputs, output):
    """Refuse no inputs, an output that is an input, and an input given twice."""
    if not inputs:
        raise MergeError("no input databases; pass node databases to merge")
    for path in inputs:
        if same_file(path, output):
            raise MergeError(f"output {output} is also an input; choose another -o path")
    seen = []
    for path in inputs:
        for other in seen:
            if same_file(path, other):
                raise MergeError(f"{path} is given twice; pass each database once")
        seen.append(path)


def check_output_dir(output):
    """The directory the output goes to; refused when it does not exist."""
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise MergeError(f"output directory {out_dir} does not exist; create it or choose another -o path")
    return out_dir


def parse_expected(items):
    """['PATH=NODE', …] -> {path: node} (the host each input was collected from)."""
    out = {}
    for item in items or ():
        path, sep, node = item.rpartition("=")
        if not sep or not path or not node:
            raise MergeError(f"--expect {item!r}: expected PATH=NODE (an input and the node it must hold)")
        out[path] = node
    return out


def expected_per_input(inputs, expected_nodes):
    """{input path: expected node} from {path: node}, matched by file; a path that is no input is refused."""
    found = {}
    for path, node in (expected_nodes or {}).items():
        path = os.fspath(path)
        match = next((p for p in inputs if same_file(p, path)), None)
        if match is None:
            raise MergeError(f"{path}: a node is expected of it (--expect) but it is not one of the inputs")
        problem = node_name_problem(node)
        if problem:
            raise MergeError(f"--expect {path}={show(node)}: expected {problem}")
        found[match] = node
    return found


def check_expected(path, nodes, expected):
    """Refuse an input whose nodes are not exactly the one expected of it (the host it came from)."""
    if path in expected and nodes != [expected[path]]:
        held = ", ".join(nodes)
        raise MergeError(f"{path}: holds node{'s' if len(nodes) > 1 else ''} {held}, expected {expected[path]} "
                         f"(the host it was collected from); refusing it")


def parse_renames(items):
    """['OLD=NEW', …] -> [(old, new), …]."""
    out = []
    for item in items or ():
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise MergeError(f"--rename {item!r}: expected OLD=NEW (a node name and its new name)")
        out.append((old, new))
    return out


def plan_names(inputs, nodes_per_input, rename):
    """For each input, {node in file: node in output}; duplicates need a rename.

    rename: False (refuse duplicate nodes), True (rename later duplicates NODE-2, NODE-3, …), or
    [(old, new), …] / {old: new}: rename node `old` in the later input that repeats it (or in the
    only input that holds it)."""
    auto = rename is True
    queue = {}
    if isinstance(rename, dict):
        rename = list(rename.items())
    for old, new in (rename if isinstance(rename, (list, tuple)) else ()):
        problem = node_name_problem(new)
        if problem:
            raise MergeError(f"--rename {show(old)}={show(new)}: expected {problem}")
        queue.setdefault(old, []).append(new)
    holders = {}
    for nodes in nodes_per_input:
        for n in nodes:
            holders[n] = holders.get(n, 0) + 1
    taken, first_holder, plans = set(), {}, []
    for path, nodes in zip(inputs, nodes_per_input):
        plan = {}
        for n in nodes:
            new = n
            if n in taken or n in first_holder:
                if queue.get(n):
                    new = queue[n].pop(0)
                elif auto:
                    k = 2
                    while f"{n}-{k}" in taken or f"{n}-{k}" in holders:
                        k += 1
                    new = f"{n}-{k}"
                else:
                    raise MergeError(f"{first_holder[n]} and {path} both hold node {n}; rename one with "
                                     f"--rename {n}=NEW (applies to the later input) or --auto-rename")
            elif queue.get(n) and holders[n] == 1:
                new = queue[n].pop(0)
            if new in taken:
                raise MergeError(f"{path}: node {n} would be renamed to {new}, which another input already uses")
            taken.add(new)
            first_holder.setdefault(n, path)
            plan[n] = new
        plans.append(plan)
    unused = [f"{old}={new}" for old, news in queue.items() for new in news]
    if unused:
        raise MergeError(f"--rename {', '.join(unused)}: no input needs it (no such node, or no duplicate)")
    return plans


def load_offsets(path):
    """An offsets file -> {node: (offset_ns, uncertainty_ns)}.

    Accepted: {"NODE": [offset_ns, uncertainty_ns]}, {"NODE": {"offset_ns":…, "uncertainty_ns":…}},
    either wrapped as {"offsets": …} (what `straggler fleet … --json` reports), or a list of
    {"node":…, "offset_ns":…, "uncertainty_ns":…}.
    """
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise MergeError(f"--offsets {path}: cannot read JSON ({exc})")
    return normalize_offsets(data, f"--offsets {path}")


def normalize_offsets(data, where="offsets"):
    """Offsets in any form load_offsets accepts -> {node: (offset_ns, uncertainty_ns)}."""
    if isinstance(data, dict) and isinstance(data.get("offsets"), (dict, list)):
        data = data["offsets"]
    items = data.items() if isinstance(data, dict) else [(d.get("node"), d) for d in data or []]
    out = {}
    for node, value in items:
        try:
            if isinstance(value, dict):
                out[str(node)] = (int(value["offset_ns"]), int(value.get("uncertainty_ns") or 0))
            else:
                out[str(node)] = (int(value[0]), int(value[1]) if len(value) > 1 and value[1] is not None else 0)
        except (KeyError, TypeError, ValueError, IndexError):
            raise MergeError(f"{where}: entry for node {node!r} is not [offset_ns, uncertainty_ns]")
    return out
