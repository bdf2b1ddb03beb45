"""Where the Ansible faces must still write the core's defaults as literals, they agree with it.

The core defines once where a node listens and keeps things (straggler.defaults: the agent's port,
the store's path, the TLS file layout). The controller-side plugins read it and the playbooks pass
`default(omit)`; what remains is text that cannot import the core: documentation strings, the
roles' defaults and argument specs, the modules and scripts that run on the hosts (their Python
need not have straggler), and the docs. This test reads each of those places and fails, naming the
file, when one says something else than straggler.defaults; and it fails when the core's values
turn up in a file of the faces that is not one of those places (a new copy: read the core or
pass default(omit) instead).

It must not import the collection or run Ansible: it reads files.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from straggler import defaults

REPO = Path(__file__).resolve().parent.parent
COLLECTION = Path("collections/ansible_collections/straggler/fleet")
FACES = [COLLECTION, Path("roles"), Path("playbooks"), Path("inventory.example.ini"), Path("ansible.cfg")]
TLS_FILES = {"ca": defaults.CA_FILE, "cert": defaults.CERT_FILE, "key": defaults.KEY_FILE}


def text(path):
    return (REPO / path).read_text()


def yaml_of(path):
    return yaml.safe_load(text(path))


def python_constant(path, name):
    """The value of a module-level assignment NAME = <literal> in a Python file (not imported)."""
    for node in ast.parse(text(path)).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path}: no {name} = ... at module level")


def doc_yaml(path, name="DOCUMENTATION"):
    """A plugin's DOCUMENTATION/EXAMPLES/RETURN string as YAML (doc fragments: the class attribute)."""
    tree = ast.parse(text(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
            return yaml.safe_load(ast.literal_eval(node.value))
    raise AssertionError(f"{path}: no {name}")


def found(path, pattern):
    """Every group(1) of `pattern` in the file; at least one (a reworded file must be looked at again)."""
    values = re.findall(pattern, text(path))
    assert values, f"{path}: nothing matches {pattern!r} any more: update tests/test_defaults_agree.py"
    return values


def role_option_defaults(role):
    options = yaml_of(Path("roles") / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    return {name: spec.get("default") for name, spec in options.items()}


# (file, what it says, the value it holds, the core's value); each place is read the way it is written
def places():
    agent_defaults = yaml_of("roles/straggler_agent/defaults/main.yml")
    agent_spec = role_option_defaults("straggler_agent")
    pki_defaults = yaml_of("roles/straggler_pki/defaults/main.yml")
    pki_spec = role_option_defaults("straggler_pki")
    plugins = COLLECTION / "plugins"
    checks = []
    for source, values in (("roles/straggler_agent/defaults/main.yml", agent_defaults),
                           ("roles/straggler_agent/meta/argument_specs.yml", agent_spec)):
        checks += [(source, "straggler_agent_port", values["straggler_agent_port"], defaults.AGENT_PORT),
                   (source, "straggler_agent_db", values["straggler_agent_db"], defaults.DB_PATH)]
        checks += [(source, f"straggler_agent_tls_{name}", values[f"straggler_agent_tls_{name}"], path)
                   for name, path in TLS_FILES.items()]
    checks += [("roles/straggler_pki/defaults/main.yml", "straggler_pki_tls_dir", pki_defaults["straggler_pki_tls_dir"],
                defaults.TLS_DIR),
               ("roles/straggler_pki/meta/argument_specs.yml", "straggler_pki_tls_dir", pki_spec["straggler_pki_tls_dir"],
                defaults.TLS_DIR)]
    agent_cli = plugins / "module_utils" / "agent_cli.py"
    checks.append((agent_cli, "DEFAULT_DB", python_constant(agent_cli, "DEFAULT_DB"), defaults.DB_PATH))
    for module in ("collect", "query"):
        path = plugins / "modules" / f"{module}.py"
        checks.append((path, "option db's default", doc_yaml(path)["options"]["db"]["default"], defaults.DB_PATH))
        checks.append((path, "RETURN db's sample", doc_yaml(path, "RETURN")["db"]["sample"], defaults.DB_PATH))
    agents = plugins / "doc_fragments" / "agents.py"
    checks.append((agents, "option port's default", doc_yaml(agents)["options"]["port"]["default"], defaults.AGENT_PORT))
    checks += [(agents, "port of a node without one", int(port), defaults.AGENT_PORT)
               for port in found(agents, r"C\(host:port\); (\d+) when left out")]
    tls = doc_yaml(plugins / "doc_fragments" / "tls.py")["options"]
    checks += [(plugins / "doc_fragments" / "tls.py", f"option {name}'s default",
                re.search(r"C\((/[^)]*)\)", " ".join(tls[name]["description"])).group(1), path)
               for name, path in TLS_FILES.items()]
    tls_files = plugins / "modules" / "tls_files.py"
    checks.append((tls_files, "FILES (the names it writes)", sorted(name for name, _, _ in python_constant(tls_files, "FILES")),
                   sorted([defaults.CA_FILE_NAME, defaults.CRL_FILE_NAME, defaults.CERT_FILE_NAME, defaults.KEY_FILE_NAME])))
    checks.append((tls_files, "EXAMPLES dest", doc_yaml(tls_files, "EXAMPLES")[0]["straggler.fleet.tls_files"]["dest"],
                   defaults.TLS_DIR))
    checks += [(COLLECTION / "README.md", "the port option's default", int(port), defaults.AGENT_PORT)
               for port in found(COLLECTION / "README.md", r"the task's `port`\s+option \((\d+)\)")]
    agentctl = "roles/straggler_agent/files/straggler-agentctl"       # runs on the host, standard library only
    checks += [(agentctl, "the port it waits for without one in the config", int(port), defaults.AGENT_PORT)
               for port in found(agentctl, r'config\.get\("port"\) or (\d+)')]
    checks += [("inventory.example.ini", "straggler_agent_port", int(port), defaults.AGENT_PORT)
               for port in found("inventory.example.ini", r"straggler_agent_port=(\d+)")]
    checks += [("playbooks/README.md", "the host's TLS directory", directory, defaults.TLS_DIR)
               for directory in found("playbooks/README.md", r"`(/[^`{]*)/\{ca\.crt")]
    return [(str(path), what, value, expected) for path, what, value, expected in checks]


PLACES = places()


@pytest.mark.parametrize("path, what, value, expected", PLACES, ids=[f"{p}:{w}" for p, w, _, _ in PLACES])
def test_each_place_says_what_straggler_defaults_says(path, what, value, expected):
    assert value == expected, (f"{path}: {what} is {value!r}, but straggler.defaults says {expected!r}: "
                               f"change it to {expected!r}")


def files_of_the_faces():
    for face in FACES:
        root = REPO / face
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in candidates:
            relative = path.relative_to(REPO)
            if path.is_file() and "__pycache__" not in relative.parts and "tests" not in relative.parts[len(face.parts):]:
                yield relative


def test_no_other_file_of_the_faces_holds_the_cores_defaults():
    """The core's values in any other file of the collection, roles or playbooks are a new copy."""
    checked = {Path(path) for path, _, _, _ in PLACES}
    literals = [re.compile(r"(?<![\d.])%d(?![\d.])" % defaults.AGENT_PORT), re.compile(re.escape(defaults.DB_PATH)),
                re.compile(re.escape(defaults.TLS_DIR))]
    copies = []
    for path in files_of_the_faces():
        if path in checked:
            continue
        try:
            content = (REPO / path).read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(content.splitlines(), 1):
            if any(literal.search(line) for literal in literals):
                copies.append(f"{path}:{number}: {line.strip()}")
    assert not copies, ("the core's defaults written again (read straggler.defaults on the controller, pass "
                        "default(omit) in playbooks, or add the place to tests/test_defaults_agree.py):\n"
                        + "\n".join(copies))
