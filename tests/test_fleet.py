"""The fleet client (fleet/client.py, `straggler fleet query`) against real agents: TLS 1.3 with
mutual certificates, each agent on its own loopback address with its own database.

What a user would notice: every node's rows come back under the node's own name; nodes that are
stopped, hung or unreachable are listed with their status while the others still answer; the
call ends by its deadline; a node whose wall clock is 2.5 s ahead is measured as 2.5 s ahead (to
within the uncertainty the measure states). No assertion judges a speed: a node's timeout or the
call's deadline is told apart by the status message it produces."""
import json
import select
import subprocess
import sys
import textwrap
import time

import pytest

from test_api_helpers import (AGENT_ADDRESSES, EXTRA_ADDRESSES, REPO, SKEWED_ADDRESS, DroppingPeer, Pki,
                              SilentPeer, make_node_db, venv_env)

from straggler.api.server import start_background
from straggler.clock import estimate_offset, mono_to_real, offset_of_pairs
from straggler.errors import StragglerError
from straggler.fleet.client import (EXIT_ALL_ANSWERED, EXIT_NONE_ANSWERED, EXIT_PARTIAL, LiveFeed, fleet_query,
                                    offset_is_flagged, parse_nodes)
from straggler_lab import procs

NODE_NAMES = [f"gpu-node-{i + 1:02d}" for i in range(len(AGENT_ADDRESSES))]
NODE_TIMEOUT_S = 4.0   # per node: far above what a loopback agent takes, so only the hung and dropped peers reach it
COUNT_SQL = "SELECT op, count(*) AS n FROM events GROUP BY op ORDER BY op"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("fleet-pki"))


@pytest.fixture(scope="module")
def fleet(certs, tmp_path_factory):
    """Four agents, 127.0.0.11-14, databases with different data. Yields (addresses, expected)."""
    work = tmp_path_factory.mktemp("fleet")
    handles, addresses, expected = [], [], {}
    try:
        for index, (address, name) in enumerate(zip(AGENT_ADDRESSES, NODE_NAMES)):
            db = work / f"{name}.db"
            expected[name] = make_node_db(db, name, index)
            handle = start_background(str(db), listen=f"{address}:0", tls=certs.server(address))
            handles.append(handle)
            addresses.append(f"{address}:{handle.port}")
        yield addresses, expected
    finally:
        for handle in handles:
            handle.stop()


def _by_node(result):
    table = {}
    node_col = result.columns.index("node")
    for row in result.rows:
        rest = [v for i, v in enumerate(row) if i != node_col]
        table.setdefault(row[node_col], {})[rest[0]] = rest[1]
    return table


def test_one_query_returns_every_nodes_rows_under_its_own_name(certs, fleet):
    addresses, expected = fleet
    result = fleet_query(",".join(addresses), COUNT_SQL, certs.client(), timeout_s=10, deadline_s=20)
    assert result.columns == ["node", "op", "n"]
    assert _by_node(result) == expected
    assert [n.status for n in result.nodes] == ["ok"] * 4
    assert [n.node for n in result.nodes] == NODE_NAMES
    assert [n.address for n in result.nodes] == addresses
    assert result.exit_code == EXIT_ALL_ANSWERED
    # offsets measured for every node; same machine, same clock: near zero, none flagged
    assert set(result.offsets) == set(NODE_NAMES)
    for node in result.nodes:
        assert abs(node.offset_ns) <= max(node.uncertainty_ns, 1_000_000)
        assert not node.offset_flagged


def test_a_query_that_selects_node_gets_no_second_node_column(certs, fleet):
    addresses, _ = fleet
    result = fleet_query(addresses, "SELECT node, count(*) AS n FROM events GROUP BY node", certs.client(),
                         clock_samples=0)
    assert result.columns == ["node", "n"]
    assert sorted(result.rows) == [[name, 6 * (i + 1)] for i, name in enumerate(NODE_NAMES)]


def test_empty_answers_and_sql_errors_are_statuses(certs, fleet):
    addresses, _ = fleet
    empty = fleet_query(addresses, "SELECT * FROM events WHERE op = 'none'", certs.client(), clock_samples=0)
    assert {n.status for n in empty.nodes} == {"empty"} and empty.exit_code == EXIT_ALL_ANSWERED
    refused = fleet_query(addresses, "DELETE FROM events", certs.client(), clock_samples=0)
    assert {n.status for n in refused.nodes} == {"sql-error"}
    assert all("read-only" in n.message for n in refused.nodes)
    assert refused.exit_code == EXIT_NONE_ANSWERED


def test_stopped_hung_and_unreachable_nodes_get_their_status_and_the_rest_answer(certs, fleet, tmp_path):
    addresses, expected = fleet
    stopped_db = tmp_path / "stopped.db"
    make_node_db(stopped_db, "gpu-node-stopped", 0)
    stopped = start_background(str(stopped_db), listen=f"{EXTRA_ADDRESSES[0]}:0", tls=certs.server(EXTRA_ADDRESSES[0]))
    stopped_address = f"{EXTRA_ADDRESSES[0]}:{stopped.port}"
    stopped.stop()
    hung = SilentPeer(EXTRA_ADDRESSES[1])
    dropping = DroppingPeer(EXTRA_ADDRESSES[2])
    try:   # each node's own timeout ends the failures, well before the whole call's deadline
        result = fleet_query(addresses + [stopped_address, hung.address, dropping.address], COUNT_SQL,
                             certs.client(), timeout_s=NODE_TIMEOUT_S, deadline_s=6 * NODE_TIMEOUT_S)
    finally:
        hung.close()
        dropping.close()
    status = {n.address: n for n in result.nodes}
    assert _by_node(result) == expected, "the answering nodes' rows all came back"
    assert status[stopped_address].status == "refused"
    assert status[hung.address].status == "timeout"
    assert status[dropping.address].status == "unreachable"
    # the hung node is told apart by its own timeout, not left for the whole call's deadline
    assert f"did not complete the TLS handshake within {NODE_TIMEOUT_S:g} s" in status[hung.address].message
    for failed in (stopped_address, hung.address, dropping.address):
        assert status[failed].message and status[failed].latency_ms is not None
        assert status[failed].node is None
        assert "whole call's deadline" not in status[failed].message, status[failed].message
    assert result.exit_code == EXIT_PARTIAL


def test_the_whole_call_ends_by_its_deadline_even_if_a_peer_never_answers(certs, fleet):
    """A peer's own timeout (60 s) far beyond the call's deadline (4 s): only the deadline can end the
    call early, and the hung peer's status says it was the deadline. How long the call takes is not
    judged: a call that waited for the peer would end at its timeout, with another message."""
    addresses, _ = fleet
    hung = SilentPeer(EXTRA_ADDRESSES[3])
    try:
        result = fleet_query([addresses[0], hung.address], COUNT_SQL, certs.client(), timeout_s=60, deadline_s=4)
    finally:
        hung.close()
    hung_status = result.nodes[1]
    assert hung_status.status == "timeout", hung_status
    assert hung_status.message == f"no answer from {hung.address} within the whole call's deadline of 4 s"
    assert result.nodes[0].status == "ok", result.nodes[0]
    assert result.exit_code == EXIT_PARTIAL


def test_no_node_answering_is_exit_code_4(certs):
    dropping = DroppingPeer("127.0.0.1")
    try:
        result = fleet_query([dropping.address], "SELECT 1", certs.client(), timeout_s=0.5, deadline_s=3,
                             clock_samples=0)
    finally:
        dropping.close()
    assert result.nodes[0].status == "unreachable"
    assert result.exit_code == EXIT_NONE_ANSWERED
    assert result.columns == [] and result.rows == []


# ---------------------------------------------------------------- clock offset

SKEW_RUNNER = textwrap.dedent("""
    import runpy, sys, time
    import _time_machine, time_machine
    SKEW_NS = 2_500_000_000
    def skew_now():
        # the travelled clock read, then the real one: time between the two reads (a preemption on a
        # busy machine) only makes the difference smaller, so the largest of many is the skew
        return max(time.time_ns() - _time_machine.original_time_ns() for _ in range(500))
    with time_machine.travel(time.time() + SKEW_NS / 1e9, tick=True) as traveller:
        time.time_ns()   # starts the clock ticking
        traveller.shift((SKEW_NS - skew_now()) / 1e9)
        print(f"skew_ns={skew_now()}", file=sys.stderr, flush=True)
        sys.argv = ["straggler"] + sys.argv[1:]
        runpy.run_module("straggler.cli", run_name="__main__")
""")


def _read_until(proc, marker, timeout_s):
    """Lines of the child's stderr until one contains marker (bounded)."""
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if marker in line:
                return lines
        elif proc.poll() is not None:
            break
    raise AssertionError(f"no {marker!r} from the agent within {timeout_s} s: {''.join(lines)}")


def test_an_agent_whose_wall_clock_is_2_5s_ahead_is_measured_so_within_the_stated_uncertainty(certs, fleet, tmp_path):
    """The offset comes with its uncertainty (half the shortest round trip): the true skew lies
    within it, whatever the machine's load makes the round trips; the node is flagged."""
    addresses, _ = fleet
    db = tmp_path / "skewed.db"
    make_node_db(db, "gpu-node-skewed", 0)
    runner = tmp_path / "skewed_agent.py"
    runner.write_text(SKEW_RUNNER)
    proc = subprocess.Popen([sys.executable, str(runner), "serve", "--db", str(db), "--listen", f"{SKEWED_ADDRESS}:0",
                             "--log-level", "WARNING"] + certs.tls_args(certs.server(SKEWED_ADDRESS)),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=venv_env(), cwd=REPO)
    try:
        lines = _read_until(proc, "straggler serve: https://", 60)
        skew_line = next(l for l in lines if l.startswith("skew_ns="))
        assert abs(int(skew_line.split("=")[1]) - 2_500_000_000) < 50_000, "the test's own skew is set"
        port = int(lines[-1].split("https://", 1)[1].split()[0].rsplit(":", 1)[1])
        # only the skewed agent: the in-process agents would compete with the client for this process's GIL
        result = fleet_query([f"{SKEWED_ADDRESS}:{port}"], "SELECT count(*) AS n FROM events",
                             certs.client(), timeout_s=10, deadline_s=20, clock_samples=12)
    finally:
        procs.end(proc, wait_s=10)
    skewed = result.nodes[0]
    assert skewed.status == "ok" and skewed.node == "gpu-node-skewed"
    offset_ns, uncertainty_ns = result.offsets["gpu-node-skewed"]
    # the skew as set is exact to 50 us (checked above); the measure is exact to its uncertainty
    assert abs(offset_ns - 2_500_000_000) <= uncertainty_ns + 50_000, f"offset {offset_ns} ns ± {uncertainty_ns}"
    assert 0 < uncertainty_ns < 1_000_000_000
    assert skewed.offset_flagged, "2.5 s is above the 5 ms threshold"


# ---------------------------------------------------------------- a node cannot answer as another

@pytest.fixture
def impostor(certs, fleet, tmp_path):
    """An agent on another address that names itself `gpu-node-01` (the fleet's first node) over a
    store of its own (gpu-node-07's rows). Yields its address."""
    db = tmp_path / "impostor.db"
    make_node_db(db, "gpu-node-07", 3)
    handle = start_background(str(db), node="gpu-node-01", listen=f"{EXTRA_ADDRESSES[1]}:0",
                              tls=certs.server(EXTRA_ADDRESSES[1]))
    try:
        yield f"{EXTRA_ADDRESSES[1]}:{handle.port}"
    finally:
        handle.stop()


def test_two_addresses_answering_as_one_node_are_both_refused(certs, fleet, impostor):
    """Which of the two is gpu-node-01 cannot be told from their answers: neither's rows are taken,
    each says why in one line, the other nodes answer as before (before: both sets of rows came back
    as gpu-node-01's, with a note)."""
    addresses, expected = fleet
    result = fleet_query(addresses + [impostor], COUNT_SQL, certs.client(), timeout_s=10, deadline_s=20)
    status = {n.address: n for n in result.nodes}
    for address in (addresses[0], impostor):
        assert status[address].status == "wrong-node" and status[address].node is None
        assert status[address].message == (f"{addresses[0]}, {impostor} all answered as node gpu-node-01; refusing "
                                           f"each: a node cannot answer as another (give each agent its own --node, "
                                           f"or say which node each address is)")
    assert _by_node(result) == {name: expected[name] for name in NODE_NAMES[1:]}
    assert "gpu-node-01" not in result.offsets
    assert result.exit_code == EXIT_PARTIAL


def test_an_answer_naming_another_node_than_the_address_is_refused(certs, fleet, impostor):
    """Told which node each address is (an inventory's names), the impostor alone is refused and
    the real gpu-node-01 answers."""
    addresses, expected = fleet
    result = fleet_query(addresses + [impostor], COUNT_SQL, certs.client(), clock_samples=0,
                         expected_nodes={impostor: "gpu-node-07", addresses[0]: "gpu-node-01"})
    refused = result.nodes[-1]
    assert (refused.status, refused.node) == ("wrong-node", None)
    assert refused.message == (f"{impostor} answered as node 'gpu-node-01', but it is gpu-node-07; refusing its "
                               f"answer: a node cannot answer as another")
    assert _by_node(result) == expected
    # the watch's feed: the node an address is, given or first answered, is the node it stays
    assert LiveFeed(impostor, certs.client(), expected_node="gpu-node-07").get()[0].status == "wrong-node"
    feed = LiveFeed(impostor, certs.client())
    assert (feed.get()[0].status in ("ok", "empty"), feed.node) == (True, "gpu-node-01")
    with pytest.raises(StragglerError, match="a node is expected at 127.0.0.99:1 but it is not one of the nodes"):
        fleet_query(addresses, COUNT_SQL, certs.client(), expected_nodes={"127.0.0.99:1": "x"})


def test_rows_of_another_node_in_an_answer_are_refused(certs, fleet, tmp_path):
    """An agent that answers as gpu-node-09 with rows whose node column says gpu-node-02."""
    addresses, expected = fleet
    db = tmp_path / "relabelled.db"
    make_node_db(db, "gpu-node-02", 1)
    handle = start_background(str(db), node="gpu-node-09", listen=f"{EXTRA_ADDRESSES[2]}:0",
                              tls=certs.server(EXTRA_ADDRESSES[2]))
    address = f"{EXTRA_ADDRESSES[2]}:{handle.port}"
    try:
        by_node = fleet_query(addresses[2:] + [address], "SELECT node, count(*) AS n FROM events GROUP BY node",
                              certs.client(), clock_samples=0)
        plain = fleet_query([address], "SELECT count(*) AS n FROM events", certs.client(), clock_samples=0)
    finally:
        handle.stop()
    refused = by_node.nodes[-1]
    assert refused.status == "wrong-node"
    assert refused.message == (f"{address} (node gpu-node-09) answered rows of node 'gpu-node-02'; refusing its "
                               f"answer: a node cannot answer for another")
    assert sorted(by_node.rows) == [["gpu-node-03", 18], ["gpu-node-04", 24]]
    assert plain.rows == [["gpu-node-09", 12]]     # no node column selected: its rows are its own


def test_a_node_named_with_markup_and_escapes_is_refused_and_shown_as_text(certs, tmp_path):
    db = tmp_path / "hostile.db"
    make_node_db(db, "gpu-node-01", 0)
    handle = start_background(str(db), node="[/bold]\x1b[2J", listen=f"{EXTRA_ADDRESSES[3]}:0",
                              tls=certs.server(EXTRA_ADDRESSES[3]))
    address = f"{EXTRA_ADDRESSES[3]}:{handle.port}"
    try:
        result = fleet_query([address], COUNT_SQL, certs.client(), clock_samples=0)
        cli = subprocess.run([sys.executable, "-m", "straggler.cli", "fleet", "query", "--nodes", address,
                              "--clock-samples", "0"] + certs.tls_args(certs.client()) + [COUNT_SQL],
                             capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
        live_status, live_answer, _ = LiveFeed(address, certs.client()).get()
    finally:
        handle.stop()
    assert result.nodes[0].status == "wrong-node" and result.rows == []
    assert result.nodes[0].message == (f"{address} answered as node '[/bold]\\x1b[2J', not a node name without "
                                       f"control characters; refusing its answer")
    assert cli.returncode == EXIT_NONE_ANSWERED and "Traceback" not in cli.stderr, cli.stderr
    assert "\x1b" not in cli.stdout and "wrong-node" in cli.stdout and "[/bold]\\x1b[2J" in cli.stdout, cli.stdout
    assert live_status.status == "wrong-node" and live_answer is None        # the watch's feed refuses it too


# ---------------------------------------------------------------- the command line

def test_fleet_cli_lists_the_nodes_that_did_not_answer_and_exits_3(certs, fleet, tmp_path):
    addresses, expected = fleet
    hung = SilentPeer("127.0.0.1")
    node_file = tmp_path / "nodes.txt"
    node_file.write_text("# the fleet\n" + "\n".join(addresses + [hung.address]) + "\n")
    base = [sys.executable, "-m", "straggler.cli", "fleet", "query", "--nodes", str(node_file),
            "--timeout", f"{NODE_TIMEOUT_S:g}", "--deadline", "30"] + certs.tls_args(certs.client())
    offsets_file = tmp_path / "offsets.json"
    try:
        as_json = subprocess.run(base + ["--json", "--offsets-out", str(offsets_file), COUNT_SQL],
                                 capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
        human = subprocess.run(base + [COUNT_SQL], capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    finally:
        hung.close()
    assert as_json.returncode == EXIT_PARTIAL, as_json.stderr
    answer = json.loads(as_json.stdout)
    assert answer["columns"] == ["node", "op", "n"]
    assert len(answer["rows"]) == 12
    assert [n["status"] for n in answer["nodes"]] == ["ok"] * 4 + ["timeout"]
    assert set(answer["offsets"]) == set(NODE_NAMES)
    assert set(json.loads(offsets_file.read_text())) == set(NODE_NAMES)
    assert human.returncode == EXIT_PARTIAL
    assert "did not answer: " + hung.address + " (timeout)" in human.stdout
    for name in NODE_NAMES:
        assert name in human.stdout


def test_fleet_cli_csv_has_the_node_column(certs, fleet):
    addresses, _ = fleet
    out = subprocess.run([sys.executable, "-m", "straggler.cli", "fleet", "query", "--nodes", ",".join(addresses[:2]),
                          "--csv", "--clock-samples", "0"] + certs.tls_args(certs.client()) +
                         ["SELECT count(*) AS n FROM events"],
                         capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
    assert out.returncode == EXIT_ALL_ANSWERED, out.stderr
    assert out.stdout.splitlines() == ["node,n", "gpu-node-01,6", "gpu-node-02,12"]


# ---------------------------------------------------------------- pure functions

@pytest.mark.parametrize("samples,expected", [
    # symmetric 2 ms round trip, node 2.5 s ahead
    ([(1_000_000_000, 3_501_000_000, 1_002_000_000)], (2_500_000_000, 1_000_000)),
    # the smallest round trip wins, whatever its position
    ([(0, 5_000_000, 10_000_000), (20_000_000, 20_100_000, 20_200_000), (30_000_000, 31_000_000, 36_000_000)],
     (0, 100_000)),
    # a node behind us
    ([(1_000, -4_000_000 + 1_500, 2_000)], (-4_000_000, 500)),
    # samples with t_recv before t_send are ignored
    ([(100, 0, 50), (0, 10, 20)], (0, 10)),
    # real epoch nanoseconds: exact integers, no float rounding
    ([(1_767_225_600_123_456_789, 1_767_225_602_623_456_790, 1_767_225_600_123_456_791)], (2_500_000_000, 1)),
])
def test_estimate_offset_picks_the_minimum_round_trip(samples, expected):
    assert estimate_offset(samples) == expected


@pytest.mark.parametrize("offset_ms,uncertainty_ms,flagged", [
    (2500, 0.1, True), (-7, 1, True), (6, 0.5, True), (4, 0.1, False), (-6, 6.7, False), (0.2, 0.1, False)])
def test_offsets_are_flagged_when_off_even_allowing_for_their_uncertainty(offset_ms, uncertainty_ms, flagged):
    assert offset_is_flagged(int(offset_ms * 1e6), int(uncertainty_ms * 1e6), 5_000_000) is flagged


def test_estimate_offset_without_usable_samples_raises():
    with pytest.raises(ValueError):
        estimate_offset([])
    with pytest.raises(ValueError):
        estimate_offset([(10, 5, 1)])


def test_mono_to_real_interpolates_between_pairs_and_extends_beyond():
    pairs = [(2_000, 1_000_002_000), (1_000, 1_000_000_000)]       # unsorted; rate 2x between them
    assert mono_to_real(pairs, 1_000) == 1_000_000_000
    assert mono_to_real(pairs, 1_500) == 1_000_001_000
    assert mono_to_real(pairs, 500) == 999_999_500                  # before the first: its offset
    assert mono_to_real(pairs, 3_000) == 1_000_003_000              # after the last: its offset
    assert offset_of_pairs(pairs) == 1_000_000_000
    with pytest.raises(ValueError):
        mono_to_real([], 1)


def test_parse_nodes_from_specs_files_and_ansible_inventories(tmp_path):
    assert parse_nodes("10.0.0.1:7433, 10.0.0.2,10.0.0.1:7433") == ["10.0.0.1:7433", "10.0.0.2:7433"]
    assert parse_nodes("[::1]:9000,::1") == ["[::1]:9000", "[::1]:7433"]
    listing = tmp_path / "nodes"
    listing.write_text("# comment\n10.0.0.5:1\n\n10.0.0.6\n")
    assert parse_nodes(str(listing)) == ["10.0.0.5:1", "10.0.0.6:7433"]
    ini = tmp_path / "inventory.ini"
    ini.write_text(textwrap.dedent("""
        [gpu]
        gpu-node-01 ansible_host=10.213.7.11
        gpu-node-02 ansible_host=10.213.7.12 straggler_agent_port=9999
        gpu-node-[03:04]

        [live]
        gpu-node-01
        gpu-node-02

        [gpu:vars]
        ansible_user=root

        [all:children]
        gpu
    """))
    # a host in several groups is one node, with its variables merged (the test bed's inventory has that shape)
    assert parse_nodes(str(ini)) == ["10.213.7.11:7433", "10.213.7.12:9999", "gpu-node-03:7433", "gpu-node-04:7433"]
    yml = tmp_path / "inventory.yml"
    yml.write_text(textwrap.dedent("""
        all:
          children:
            gpu:
              hosts:
                gpu-node-01: {ansible_host: 10.213.7.11}
                gpu-node-02:
            live:
              hosts:
                gpu-node-01:
          hosts:
            gpu-node-09: {ansible_host: 10.213.7.19, straggler_agent_port: 7500}
    """))
    assert sorted(parse_nodes(str(yml))) == ["10.213.7.11:7433", "10.213.7.19:7500", "gpu-node-02:7433"]
    with pytest.raises(StragglerError):
        parse_nodes("host:notaport")
