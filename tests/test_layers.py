"""The product's layers, read from its source: every module of agent/straggler is parsed with `ast`
(nothing is imported or run) and mapped to its layer, low to high:

    errors, text, defaults, durations, addresses -> clock, probes -> store -> devices -> tls, pki
    -> api, fleet -> agent (the trace daemon) -> analysis -> render -> cli

A module may import its own layer and the ones below it. The check fails, naming the module, the
line and the import, when a module imports a higher layer (imports inside functions count too),
when the API imports the analysis, when anything in the product imports the lab (straggler_lab),
when a module outside cli builds an argument parser (argparse is the cli's: libraries take
arguments, they do not parse a command line), when a module has no layer, or when modules import
each other at module level (a cycle).

It must not be widened to let a module through: a move in progress is listed in PENDING, once,
and leaves the list when it lands.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "agent" / "straggler"

# Low to high; a name is the first part of the module's name below `straggler`.
LAYERS = (
    ("errors", "text", "defaults", "durations", "addresses"),
    ("clock", "probes"),
    ("store",),
    ("devices", "network"),         # the GPUs', the kernel's and the links' word, written into the store's tables
    ("tls", "pki"),
    ("api", "fleet"),
    ("agent",),                     # the trace daemon
    ("analysis",),
    ("render",),
    ("cli",),
)
LAB = "straggler_lab"
PARSER = "argparse"
PARSER_CALLS = {"add_argument", "add_argument_group", "add_mutually_exclusive_group", "add_subparsers", "add_parser"}

# Moves in progress: each entry a (module, what) key of check() that today's tree still holds and
# that goes away when its module moves; the test fails on an entry that no longer occurs (remove it).
# Never add one for new code. Empty: the restructuring of the command line out of the libraries has
# landed (agent, api.server, fleet.cli, pki, store.query, status, analysis.merge/export were the last).
PENDING = set()


def modules_of(root):
    """{dotted name: (path, is_package)} of every module under the package directory `root`."""
    found = {}
    for path in sorted(Path(root).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join([Path(root).name, *parts])] = (path, is_package)
    return found


def layer_of(name):
    """The index in LAYERS of a module of the package (the package itself: the lowest), or None."""
    parts = name.split(".")
    if len(parts) == 1:
        return 0
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index
    return None


def layer_name(index):
    return ", ".join(LAYERS[index])


def _resolve(name, modules):
    """The longest prefix of `name` that is a module of the package (`name` itself when outside it)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return name


def imports_of(name, path, is_package, modules):
    """[(imported module, line, at module level)] of one module: relative imports resolved, and
    `from P import x` taken as P.x when that is a module, else P."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    package = name if is_package else name.rpartition(".")[0]
    found = []

    def visit(node, top_level):
        for child in ast.iter_child_nodes(node):
            inside = top_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append((_resolve(alias.name, modules), child.lineno, top_level))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                for alias in child.names:
                    target = f"{source}.{alias.name}"
                    found.append((target if target in modules else _resolve(source, modules), child.lineno, top_level))
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) \
                    and child.func.attr in PARSER_CALLS:
                found.append((PARSER, child.lineno, top_level))
            visit(child, inside)

    visit(tree, True)
    return found


def check(root):
    """{(module, what): one line} of every breach of the layering in the package at `root`; `what`
    is the imported module, PARSER, or None (a module with no layer); a cycle is
    ("cycle", its modules)."""
    modules = modules_of(root)
    breaches = {}
    graph = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        layer = layer_of(name)
        rel = Path(path).relative_to(Path(root).parent)
        if layer is None:
            breaches[(name, None)] = f"{rel}: {name} has no layer: place it in LAYERS (tests/test_layers.py)"
            continue
        for target, line, top_level in imports_of(name, path, is_package, modules):
            where = f"{rel}:{line}: {name}"
            if target == LAB or target.startswith(LAB + "."):
                breaches[(name, target)] = f"{where} imports {target}: the product never imports the lab"
            elif target == PARSER or target.startswith(PARSER + "."):
                if LAYERS[layer] != ("cli",):
                    breaches[(name, PARSER)] = (f"{where} builds an argument parser (argparse): only cli/ parses a "
                                                f"command line; the library takes its arguments")
            elif target in modules:
                if top_level and target != name:
                    graph[name].add(target)
                target_layer = layer_of(target)
                if target_layer is None:
                    continue                            # reported as a module with no layer
                if LAYERS[layer] == ("api", "fleet") and name.split(".")[1] == "api" and LAYERS[target_layer] == ("analysis",):
                    breaches[(name, target)] = f"{where} imports {target}: the API must not import the analysis"
                elif target_layer > layer:
                    breaches[(name, target)] = (f"{where} imports {target}: {layer_name(target_layer)} is above "
                                                f"{layer_name(layer)}")
    for cycle in cycles(graph):
        breaches[("cycle", cycle)] = "import cycle at module level: " + " -> ".join(cycle + (cycle[0],))
    return breaches


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each as a tuple that
    starts at its smallest name and follows imports."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(_ordered(component, graph))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def _ordered(component, graph):
    """A cycle's modules from its smallest name, each followed by one it imports within the cycle."""
    path = [min(component)]
    while True:
        following = sorted(graph[path[-1]] & component)
        nxt = next((name for name in following if name not in path), None)
        if nxt is None:
            return tuple(path)
        path.append(nxt)


def _shown(breaches):
    return "\n".join(sorted(breaches.values()))


def test_every_module_imports_only_its_layer_and_below():
    breaches = check(PACKAGE)
    new = {key: line for key, line in breaches.items() if key not in PENDING}
    assert not new, "layering broken (see tests/test_layers.py for the layers):\n" + _shown(new)
    landed = sorted(PENDING - set(breaches), key=str)
    assert not landed, "moved already; remove from PENDING in tests/test_layers.py: " + ", ".join(map(str, landed))


def _copy(tmp_path):
    copy = tmp_path / "straggler"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _plant(path, line):
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_the_checker_reports_planted_breaches(tmp_path):
    """Into a copy of the package: an upward import inside a function, the API importing the
    analysis, the lab imported, a parser built outside cli, and a cycle at module level."""
    copy = _copy(tmp_path)
    before = set(check(copy))
    _plant(copy / "store" / "writer.py", "def _late():\n    from ..render import table_text\n    return table_text")
    _plant(copy / "api" / "metrics.py", "from ..analysis import export")
    _plant(copy / "text.py", "import straggler_lab.synth")
    _plant(copy / "clock.py", "def _options(parser):\n    parser.add_argument('--x')")
    _plant(copy / "durations.py", "from . import defaults")
    _plant(copy / "defaults.py", "from . import durations")
    breaches = check(copy)
    new = set(breaches) - before
    assert new == {("straggler.store.writer", "straggler.render"),
                   ("straggler.api.metrics", "straggler.analysis.export"),
                   ("straggler.text", "straggler_lab.synth"),
                   ("straggler.clock", PARSER),
                   ("cycle", ("straggler.defaults", "straggler.durations"))}, _shown(breaches)
    assert "straggler/store/writer.py:" in breaches[("straggler.store.writer", "straggler.render")]
    assert "render is above store" in breaches[("straggler.store.writer", "straggler.render")]
    assert "the API must not import the analysis" in breaches[("straggler.api.metrics", "straggler.analysis.export")]
    assert "never imports the lab" in breaches[("straggler.text", "straggler_lab.synth")]
    assert "straggler.defaults -> straggler.durations -> straggler.defaults" in \
        breaches[("cycle", ("straggler.defaults", "straggler.durations"))]


def test_a_module_without_a_layer_is_reported(tmp_path):
    copy = _copy(tmp_path)
    (copy / "gadgets.py").write_text('"""A new top-level module nobody placed."""\n')
    assert ("straggler.gadgets", None) in check(copy)
