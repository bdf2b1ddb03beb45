"""The one host:port rule (straggler.addresses) and the places that take an address through it:
`straggler serve --listen`, the plain metrics port, `--nodes` of the fleet client and the
inventory's ansible_host. Good forms give the host and port a user expects; bad ones one line that
names what was given, and nothing is bound."""
import re
import socket
import subprocess
import sys

import pytest

from test_api_helpers import REPO, make_node_db, venv_env

from straggler.addresses import (Address, format_address, is_loopback, is_wildcard, parse_address, parse_host,
                                 parse_listen, parse_port)
from straggler.errors import StragglerError
from straggler.fleet.inventory import agent_address, parse_nodes

STRAGGLER = [sys.executable, "-m", "straggler.cli"]


# ---------------------------------------------------------------- the rule

@pytest.mark.parametrize("text, host, port", [
    ("gpu-1:9000", "gpu-1", 9000),
    ("gpu-1", "gpu-1", 7433),                       # the caller's default port
    ("  gpu-1:9000 ", "gpu-1", 9000),
    ("10.0.0.1:1", "10.0.0.1", 1),
    ("10.0.0.1:65535", "10.0.0.1", 65535),
    ("10.0.0.1:007433", "10.0.0.1", 7433),
    ("[fd00::5]:9000", "fd00::5", 9000),
    ("[fd00::5]", "fd00::5", 7433),
    ("fd00::5", "fd00::5", 7433),                   # a bare IPv6 address has no port in it
    ("::1", "::1", 7433),
    ("[fe80::1%eth0]:80", "fe80::1%eth0", 80),
])
def test_good_addresses_give_their_host_and_port(text, host, port):
    assert parse_address(text, 7433, what="node") == Address(host, port)


@pytest.mark.parametrize("text, why", [
    ("", "no host"),
    (":9000", "no host"),
    ("9000", "no host"),                            # a port alone names no node
    ("[]:9000", "no host"),
    ("gpu-1:", "port '' is not a port number (1-65535)"),
    ("gpu-1:http", "port 'http' is not a port number (1-65535)"),
    ("gpu-1:0", "port '0' is not a port number (1-65535)"),
    ("gpu-1:65536", "port '65536' is not a port number (1-65535)"),
    ("gpu-1:-1", "port '-1' is not a port number (1-65535)"),
    ("gpu-1:٣", "port '٣' is not a port number (1-65535)"),   # a digit, but not an ASCII one
    ("gpu-1:9000:1", "a host with colons must be an IPv6 address"),
    ("[gpu-1]:9000", "only an IPv6 address goes in brackets"),
    ("[fd00::5", "no closing ']'"),
    ("[fd00::5]9000", "'9000' after ']'"),
    ("[fd00::5]:http", "port 'http' is not a port number (1-65535)"),
])
def test_bad_addresses_are_one_line_naming_the_input_and_the_form(text, why):
    with pytest.raises(StragglerError) as caught:
        parse_address(text, 7433, what="node")
    message = str(caught.value)
    assert message == f"node {text.strip()!r}: {why}; use HOST:PORT, or [IPv6]:PORT"
    assert "\n" not in message


@pytest.mark.parametrize("text, host, port", [
    ("", "0.0.0.0", 7433),                          # every address, the default port
    ("9000", "0.0.0.0", 9000),
    (":9000", "0.0.0.0", 9000),
    ("127.0.0.1", "127.0.0.1", 7433),
    ("127.0.0.1:0", "127.0.0.1", 0),                # any free port
    ("[::]:9000", "::", 9000),
    ("::", "::", 7433),
])
def test_a_listen_address_defaults_to_every_address_and_may_take_any_free_port(text, host, port):
    assert parse_listen(text, 7433) == Address(host, port)


@pytest.mark.parametrize("text, why", [
    ("127.0.0.1:http", "port 'http' is not a port number (0-65535)"),
    ("127.0.0.1:70000", "port '70000' is not a port number (0-65535)"),
    (":", "port '' is not a port number (0-65535)"),
    ("[localhost]:80", "only an IPv6 address goes in brackets"),
    ("a:b:c", "a host with colons must be an IPv6 address"),
])
def test_bad_listen_addresses_are_one_line(text, why):
    with pytest.raises(StragglerError, match="^" + re.escape(f"--listen {text!r}: {why};")):
        parse_listen(text, 7433)


@pytest.mark.parametrize("value, port", [(1, 1), ("9000", 9000), (" 65535 ", 65535)])
def test_port_numbers(value, port):
    assert parse_port(value, "p") == port


@pytest.mark.parametrize("value", ["http", 0, "0", 65536, "-1", "", True, 9000.5])
def test_not_port_numbers(value):
    with pytest.raises(StragglerError, match=r"^p is not a port number \(1-65535\)$"):
        parse_port(value, "p")


@pytest.mark.parametrize("host, port, text", [("gpu-1", 9000, "gpu-1:9000"), ("fd00::5", 1, "[fd00::5]:1"),
                                              ("10.0.0.1", "80", "10.0.0.1:80")])
def test_an_address_is_written_so_that_it_reads_back(host, port, text):
    assert format_address(host, port) == text
    assert parse_address(text, 7433) == Address(host, int(port))
    assert str(Address(host, int(port))) == text


@pytest.mark.parametrize("text, host", [("gpu-1", "gpu-1"), ("[fd00::5]", "fd00::5"), ("fd00::5", "fd00::5")])
def test_a_host_alone(text, host):
    assert parse_host(text, "h") == host


@pytest.mark.parametrize("text", ["", "[gpu-1]", "gpu-1:22", "[]"])
def test_not_a_host_alone(text):
    with pytest.raises(StragglerError, match=r"^h "):
        parse_host(text, "h")


@pytest.mark.parametrize("host, loopback, wildcard", [
    ("127.0.0.1", True, False), ("127.3.4.5", True, False), ("::1", True, False), ("localhost", True, False),
    ("0.0.0.0", False, True), ("::", False, True), ("", False, True), ("*", False, True),
    ("10.0.0.1", False, False), ("gpu-1", False, False), ("fd00::5", False, False),
])
def test_loopback_and_wildcard_hosts(host, loopback, wildcard):
    assert is_loopback(host) is loopback
    assert is_wildcard(host) is wildcard


# ---------------------------------------------------------------- its callers

def test_nodes_and_inventory_hosts_follow_the_rule():
    assert parse_nodes("gpu-1, [fd00::5]:9000 fd00::6", default_port=7500) == [
        "gpu-1:7500", "[fd00::5]:9000", "[fd00::6]:7500"]
    with pytest.raises(StragglerError, match=r"^node 'gpu-1:http': port 'http' is not a port number"):
        parse_nodes("gpu-0:7433,gpu-1:http")
    with pytest.raises(StragglerError, match=r"^node 'gpu-1:0': port '0'"):
        parse_nodes("gpu-1:0")
    with pytest.raises(StragglerError, match=r"^host gpu-1: ansible_host 'gpu-1:22': a host with colons must be"):
        agent_address("gpu-1", {"ansible_host": "gpu-1:22"})


def test_the_servers_refuse_a_bad_listen_address_before_binding_anything(tmp_path):
    from straggler.api import metrics
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    db = tmp_path / "node.db"
    make_node_db(db, "gpu-node-00", 0)
    for listen in ("127.0.0.1:70000", "[127.0.0.1]:0", "127.0.0.1:http"):
        with pytest.raises(StragglerError, match=r"^--listen "):
            start_background(str(db), listen=listen, tls=TLSOptions(no_tls=True))
    pytest.importorskip("prometheus_client")
    with pytest.raises(StragglerError, match=r"^--metrics-listen '127.0.0.1:70000': port '70000'"):
        metrics.start_plain_server(str(db), "n", "127.0.0.1:70000")


def test_serve_takes_an_ipv6_listen_address_and_says_where_it_listens(tmp_path):
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    from straggler.api.server import start_background
    from straggler.tls import TLSOptions
    db = tmp_path / "node.db"
    make_node_db(db, "gpu-node-00", 0)
    with start_background(str(db), listen="[::1]:0", tls=TLSOptions(no_tls=True)) as handle:
        assert handle.host == "::1" and handle.url == f"http://[::1]:{handle.port}"
        with socket.create_connection(("::1", handle.port), timeout=5) as conn:
            conn.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert conn.recv(64).startswith(b"HTTP/1.1 200 ")


def test_straggler_serve_with_a_bad_listen_address_says_so_in_one_line(tmp_path):
    db = tmp_path / "node.db"
    make_node_db(db, "gpu-node-00", 0)
    proc = subprocess.run(STRAGGLER + ["serve", "--db", str(db), "--no-tls", "--listen", "127.0.0.1:99999"],
                          capture_output=True, text=True, timeout=60, env=venv_env(), cwd=str(REPO))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "straggler serve: error: --listen '127.0.0.1:99999': port '99999' is not a port number (0-65535); "
        "use HOST:PORT, or [IPv6]:PORT"]
