"""Agent addresses: the one rule that turns an inventory host into the `host:port` of its agent,
used by `straggler fleet --nodes FILE`, explain/watch live and the collection's controller-side
actions (fleet_query, explain, watch), and the node lists those accept.

The rule (agent_address): the host is its `ansible_host`, else its inventory name (an IPv6
address gets brackets); the port is its `straggler_agent_port` (the variable the agent role
listens on), else the caller's default port (7433 unless told otherwise: `--port`, the actions'
`port` option). A host's variables are resolved as Ansible does for these inventories: `[all:vars]`,
then each group's vars (`[group:vars]` / `vars:`), parents before children (by depth, then name),
then the host's own. How an address is written and checked (IPv6 in brackets, the port range) is
the one host:port rule of straggler.addresses.

parse_nodes reads 'h:p,h2:p', lists of those, and files: one address a line, or an Ansible
inventory (INI or YAML). No network, no Ansible imports.
"""
import os
import re
import shlex

from .. import defaults
from ..addresses import format_address, parse_address, parse_host, parse_port
from ..errors import StragglerError

DEFAULT_PORT = defaults.AGENT_PORT
PORT_VARIABLE = "straggler_agent_port"
HOST_VARIABLE = "ansible_host"

_RANGE_RE = re.compile(r"\[(\d+):(\d+)\]")


def expand_range(name):
    """Ansible's host ranges: gpu-node-[01:04] -> gpu-node-01 ... gpu-node-04 (numeric only)."""
    match = _RANGE_RE.search(name)
    if not match:
        return [name]
    start, end = match.group(1), match.group(2)
    width = len(start) if start.startswith("0") else 0
    out = []
    for number in range(int(start), int(end) + 1):
        out.extend(expand_range(name[:match.start()] + str(number).zfill(width) + name[match.end():]))
    return out


def normalize_address(text, default_port=DEFAULT_PORT):
    """'h', 'h:p', '[v6]:p', 'v6' -> 'h:p' / '[v6]:p' (the host:port rule of straggler.addresses)."""
    return str(parse_address(text, default_port, what="node"))


def split_address(address):
    """'h:p' / '[v6]:p' -> (host, port)."""
    return tuple(parse_address(address, DEFAULT_PORT, what="node"))


def agent_address(name, host_vars=None, default_port=DEFAULT_PORT):
    """'host:port' of the agent on inventory host `name` with (resolved) variables `host_vars`:
    ansible_host else the name; straggler_agent_port else `default_port`. See the module docstring."""
    host_vars = host_vars or {}
    host = str(host_vars.get(HOST_VARIABLE) or name).strip()
    port = host_vars.get(PORT_VARIABLE)
    if port is None or str(port).strip() == "":
        port = default_port
    port = parse_port(port, f"host {name}: {PORT_VARIABLE}={port!r}")
    if not host:
        raise StragglerError(f"host {name!r}: no address (empty {HOST_VARIABLE})")
    return format_address(parse_host(host, f"host {name}: {HOST_VARIABLE}"), port)


# ---------------------------------------------------------------- inventories

class Inventory:
    """Hosts (first-seen order), groups with their vars and children, and each host's own vars."""

    def __init__(self):
        self.host_vars = {}     # host -> its own vars (merged over every line that lists it)
        self.groups = {}        # group -> dict(hosts=[...], children=[...], vars={...})

    def group(self, name):
        return self.groups.setdefault(name, {"hosts": [], "children": [], "vars": {}})

    def add_host(self, group, name, host_vars=None):
        self.host_vars.setdefault(name, {}).update(host_vars or {})
        members = self.group(group)["hosts"]
        if name not in members:
            members.append(name)

    def add_child(self, parent, child):
        children = self.group(parent)["children"]
        self.group(child)
        if child != parent and child not in children:
            children.append(child)

    def _parents(self):
        parents = {}
        for name, group in self.groups.items():
            for child in group["children"]:
                parents.setdefault(child, set()).add(name)
        return parents

    def _depths(self, parents):
        depths = {}

        def depth(name, visiting=()):
            if name == "all":
                return 0
            if name in depths:
                return depths[name]
            above = [p for p in parents.get(name, ()) if p not in visiting]
            value = 1 + max([depth(p, visiting + (name,)) for p in above] or [0])
            depths[name] = value
            return value

        for name in self.groups:
            depth(name)
        depths["all"] = 0
        return depths

    def resolved(self):
        """{host: variables}: [all] vars, then its groups' vars (parents first: by depth, then
        name), then the host's own."""
        parents = self._parents()
        depths = self._depths(parents)
        direct = {}
        for name, group in self.groups.items():
            for host in group["hosts"]:
                direct.setdefault(host, set()).add(name)
        out = {}
        for host, own in self.host_vars.items():
            groups, todo = {"all"}, list(direct.get(host, ()))
            while todo:
                name = todo.pop()
                if name not in groups:
                    groups.add(name)
                    todo.extend(parents.get(name, ()))
            merged = {}
            for name in sorted(groups, key=lambda g: (depths.get(g, 1), g)):
                merged.update(self.groups.get(name, {}).get("vars", {}))
            merged.update(own)
            out[host] = merged
        return out


def _ini_value(text):
    """A value from `key=value`: quotes removed; an unquoted one ends at a ` #` comment."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return re.split(r"\s+#", text, maxsplit=1)[0].strip()


def parse_ini_inventory(text):
    """An Inventory from an INI inventory: [group], [group:vars], [group:children]; host ranges."""
    inventory = Inventory()
    section, kind = "ungrouped", "hosts"
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            section, _, kind = stripped[1:-1].partition(":")
            kind = kind or "hosts"
            inventory.group(section)
            continue
        if kind == "vars":
            key, sep, value = stripped.partition("=")
            if sep:
                inventory.group(section)["vars"][key.strip()] = _ini_value(value)
            continue
        try:
            tokens = shlex.split(stripped, comments=True)
        except ValueError:
            tokens = stripped.split()
        if not tokens:
            continue
        if kind == "children":
            inventory.add_child(section, tokens[0])
            continue
        if kind != "hosts":
            continue
        host_vars = {}
        for token in tokens[1:]:
            key, sep, value = token.partition("=")
            if sep:
                host_vars[key] = _ini_value(value)
        for name in expand_range(tokens[0]):
            inventory.add_host(section, name, host_vars)
    return inventory


def _walk_yaml_group(inventory, name, group):
    inventory.group(name)
    if not isinstance(group, dict):
        return
    inventory.group(name)["vars"].update(group.get("vars") or {})
    for host, host_vars in (group.get("hosts") or {}).items():
        for expanded in expand_range(str(host)):
            inventory.add_host(name, expanded, host_vars if isinstance(host_vars, dict) else {})
    for child, child_group in (group.get("children") or {}).items():
        inventory.add_child(name, str(child))
        _walk_yaml_group(inventory, str(child), child_group)


def parse_yaml_inventory(text, path="inventory"):
    """An Inventory from a YAML inventory (groups with hosts, vars, children)."""
    try:
        import yaml
    except ImportError:
        raise StragglerError(f"{path} looks like a YAML inventory but PyYAML is not installed; "
                             f"install it or list the nodes as host:port, one a line") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise StragglerError(f"{path}: not valid YAML ({' '.join(str(exc).split())[:160]})") from None
    inventory = Inventory()
    if isinstance(data, dict):
        for name, group in data.items():
            _walk_yaml_group(inventory, str(name), group)
    return inventory


def inventory_addresses(inventory, default_port=DEFAULT_PORT):
    """Every host's agent address, in the inventory's order (agent_address on resolved vars)."""
    return [agent_address(name, host_vars, default_port) for name, host_vars in inventory.resolved().items()]


def _looks_like_yaml(path, lines):
    return path.endswith((".yml", ".yaml")) or bool(lines) and (
        lines[0] in ("---", "all:") or any(l.endswith(":") and not l.startswith("[") for l in lines[:3]))


def _looks_like_ini(lines):
    return (any(l.startswith("[") and l.endswith("]") and not re.match(r"^\[[0-9a-fA-F:]+\](:\d+)?$", l) for l in lines)
            or any("ansible_host=" in l or PORT_VARIABLE + "=" in l for l in lines))


def parse_nodes(spec_or_file, default_port=DEFAULT_PORT):
    """Node addresses ('host:port', in order, without duplicates) from:
    'h:p,h2:p' | a list of those | a file: one address a line, or an Ansible inventory (INI or
    YAML; each host by agent_address, with [group:vars] honoured)."""
    if spec_or_file is None:
        raise StragglerError("no nodes given; pass --nodes host:port,… or an inventory file")
    if isinstance(spec_or_file, (list, tuple)):
        nodes = []
        for item in spec_or_file:
            nodes.extend(parse_nodes(item, default_port) if isinstance(item, str) and ("," in item or os.path.isfile(item))
                         else [normalize_address(f"{item[0]}:{item[1]}" if isinstance(item, (list, tuple)) else item,
                                                 default_port)])
    elif os.path.isfile(str(spec_or_file)):
        path = str(spec_or_file)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise StragglerError(f"cannot read node list {path}: {exc.strerror}") from None
        lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith(("#", ";"))]
        if _looks_like_yaml(path, lines):
            nodes = inventory_addresses(parse_yaml_inventory(text, path), default_port)
        elif _looks_like_ini(lines):
            nodes = inventory_addresses(parse_ini_inventory(text), default_port)
        else:
            nodes = []
            for line in lines:
                nodes.extend(normalize_address(part, default_port) for part in re.split(r"[,\s]+", line) if part)
        if not nodes:
            raise StragglerError(f"no nodes found in {path}; list host:port one a line, or give an Ansible inventory")
    else:
        nodes = [normalize_address(part, default_port) for part in re.split(r"[,\s]+", str(spec_or_file)) if part]
    seen, unique = set(), []
    for address in nodes:
        if address not in seen:
            seen.add(address)
            unique.append(address)
    if not unique:
        raise StragglerError("no nodes given; pass --nodes host:port,… or an inventory file")
    return unique
