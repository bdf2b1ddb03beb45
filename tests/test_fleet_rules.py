"""The two rules every face shares (CLI, modules, action plugins), as pure functions: how the
hosts' answers to one SQL become one table (straggler.fleet.combine), and how an inventory host
becomes its agent's address (straggler.fleet.inventory). No database, no network.

That the SSH path (query + aggregate) and the HTTPS path (fleet_query) give the same table by
this rule is tested with real agents in the collection's unit tests (test_same_table.py)."""
import textwrap

import pytest

from test_api_helpers import REPO  # noqa: F401  (puts agent/ on sys.path)

from straggler.errors import StragglerError
from straggler.fleet.combine import combine_answers
from straggler.fleet.inventory import agent_address, parse_nodes


# ---------------------------------------------------------------- combining the hosts' answers

@pytest.mark.parametrize("answers, columns, rows, notes", [
    pytest.param([], [], [], [], id="nobody-answered"),
    pytest.param([("n1", ["op", "n"], [["x", 1]]), ("n2", ["op", "n"], [["y", 2]])],
                 ["node", "op", "n"], [["n1", "x", 1], ["n2", "y", 2]], ["", ""], id="same-columns"),
    pytest.param([("n1", ["op", "n"], []), ("n2", ["op", "n"], [["y", 2]])],
                 ["node", "op", "n"], [["n2", "y", 2]], ["", ""], id="an-empty-answer-still-sets-the-columns"),
    pytest.param([("n1", ["a", "b"], [[1, 2]]), ("n2", ["b", "c"], [[3, 4]])],
                 ["node", "a", "b", "c"], [["n1", 1, 2, None], ["n2", None, 3, 4]],
                 ["", "columns differ: lacks a (null in its rows); adds c"], id="union-in-first-seen-order"),
    pytest.param([("n1", ["a", "b"], [[1, 2]]), ("n2", ["a", "b", "extra"], [[3, 4, 5]]), ("n3", ["a"], [[6]])],
                 ["node", "a", "b", "extra"], [["n1", 1, 2, None], ["n2", 3, 4, 5], ["n3", 6, None, None]],
                 ["", "columns differ: adds extra", "columns differ: lacks b (null in its rows)"],
                 id="newer-and-older-schema"),
    pytest.param([("n1", ["a", "b"], [[1, 2]]), ("n2", ["b", "a"], [[4, 3]])],
                 ["node", "a", "b"], [["n1", 1, 2], ["n2", 3, 4]],
                 ["", "columns differ: same columns in another order (lined up by name)"], id="another-order"),
    pytest.param([("n1", ["a", "a"], [[1, 2]]), ("n2", ["a", "a"], [[3, 4]])],
                 ["node", "a", "a"], [["n1", 1, 2], ["n2", 3, 4]], ["", ""], id="repeated-names-stay-apart"),
    pytest.param([("n1", ["node", "n"], [["x", 1]]), ("n2", ["node", "n"], [["y", 2]])],
                 ["node", "n"], [["x", 1], ["y", 2]], ["", ""], id="selected-node-column-not-doubled"),
    pytest.param([("n1", ["n", "node"], [[1, "x"]]), ("n2", ["n"], [[2]])],
                 ["n", "node"], [[1, "x"], [2, "n2"]], ["", "columns differ: lacks node (its node name is used)"],
                 id="a-host-without-the-selected-node-column-gets-its-name"),
    pytest.param([("n1", ["a", "b"], [[1]])], ["node", "a", "b"], [["n1", 1, None]], [""], id="short-row-padded"),
])
def test_combine_answers(answers, columns, rows, notes):
    assert combine_answers(answers) == (columns, rows, notes)


def test_combine_answers_keeps_every_host_and_does_not_change_its_input():
    first_rows = [[1, 2]]
    answers = [("n1", ["a", "b"], first_rows), ("n2", ["c"], [[3]])]
    columns, rows, notes = combine_answers(answers)
    assert first_rows == [[1, 2]] and answers[1] == ("n2", ["c"], [[3]])
    assert {row[0] for row in rows} == {"n1", "n2"} and notes[1].startswith("columns differ")


# ---------------------------------------------------------------- inventory host -> agent address

@pytest.mark.parametrize("name, host_vars, default_port, address", [
    ("gpu-1", {}, 7433, "gpu-1:7433"),
    ("gpu-1", None, 7433, "gpu-1:7433"),
    ("gpu-1", {"ansible_host": "10.0.0.1"}, 7433, "10.0.0.1:7433"),
    ("gpu-1", {"ansible_host": "10.0.0.1", "straggler_agent_port": 9000}, 7433, "10.0.0.1:9000"),
    ("gpu-1", {"straggler_agent_port": "9001"}, 7433, "gpu-1:9001"),
    ("gpu-1", {"straggler_agent_port": ""}, 7500, "gpu-1:7500"),
    ("gpu-1", {}, 7500, "gpu-1:7500"),
    ("gpu-1", {"ansible_host": "fd00::5"}, 7433, "[fd00::5]:7433"),
    ("gpu-1", {"ansible_host": "[fd00::5]", "straggler_agent_port": 1}, 7433, "[fd00::5]:1"),
    ("gpu-1", {"straggler_api_port": 9999}, 7433, "gpu-1:7433"),   # not a variable of this project
])
def test_agent_address(name, host_vars, default_port, address):
    assert agent_address(name, host_vars, default_port) == address


@pytest.mark.parametrize("port", ["http", 0, 70000, "-1"])
def test_agent_address_refuses_a_port_that_is_not_one(port):
    with pytest.raises(StragglerError, match="straggler_agent_port"):
        agent_address("gpu-1", {"straggler_agent_port": port})


def test_ini_inventory_group_vars_are_honoured_parents_first(tmp_path):
    ini = tmp_path / "inventory.ini"
    ini.write_text(textwrap.dedent("""
        gpu-node-00

        [gpu]
        gpu-node-01 ansible_host=10.0.0.1
        gpu-node-02 ansible_host=10.0.0.2 straggler_agent_port=9999
        gpu-node-[03:04]

        [fast]
        gpu-node-03

        [cluster:children]
        gpu
        fast

        [all:vars]
        straggler_agent_port=6000

        [cluster:vars]
        straggler_agent_port=7000

        [gpu:vars]
        straggler_agent_port=8000

        [fast:vars]
        straggler_agent_port="8100"
    """))
    # gpu-node-00: [all:vars]; 01, 04: [gpu:vars] over [cluster:vars]; 02: its own; 03: in gpu and
    # fast, both children of cluster (same depth): the later by name (gpu) wins, as in Ansible
    assert parse_nodes(str(ini)) == ["gpu-node-00:6000", "10.0.0.1:8000", "10.0.0.2:9999", "gpu-node-03:8000",
                                     "gpu-node-04:8000"]
    assert parse_nodes(str(ini), default_port=1234)[0] == "gpu-node-00:6000"


def test_ini_inventory_without_the_port_variable_uses_the_default_port(tmp_path):
    ini = tmp_path / "hosts"
    ini.write_text("[gpu]\ngpu-node-01 ansible_host=10.0.0.1\n[gpu:vars]\nansible_user=root\n")
    assert parse_nodes(str(ini)) == ["10.0.0.1:7433"]
    assert parse_nodes(str(ini), default_port=7500) == ["10.0.0.1:7500"]


def test_yaml_inventory_group_vars_deeper_group_wins(tmp_path):
    yml = tmp_path / "inventory.yml"
    yml.write_text(textwrap.dedent("""
        all:
          vars: {straggler_agent_port: 6000}
          hosts:
            lone: {ansible_host: 10.0.0.9}
          children:
            cluster:
              vars: {straggler_agent_port: 7000}
              children:
                gpu:
                  vars: {straggler_agent_port: 8000}
                  hosts:
                    gpu-node-01: {ansible_host: 10.0.0.1}
                    gpu-node-02: {straggler_agent_port: 9999}
              hosts:
                head: {}
    """))
    assert parse_nodes(str(yml)) == ["10.0.0.9:6000", "head:7000", "10.0.0.1:8000", "gpu-node-02:9999"]
