"""The one host:port rule: how an address is written, read and checked, for every place that
takes one (the API's --listen, the plain metrics port's --metrics-listen, the fleet client's node
addresses and the inventory's agent addresses).

The rule (parse_address):
  - HOST:PORT; an IPv6 address in brackets, [ADDR]:PORT, or bare without a port (fd00::5);
    only an IPv6 address goes in brackets, and a host with a colon must be one (parse_host);
  - HOST alone takes the caller's default port;
  - where the caller has a default host (a server's listen address, parse_listen: every
    address), ':PORT', 'PORT' alone and an empty text take it; elsewhere the host is required;
  - the port is a whole number 1-65535 (0, "any free port", only where the caller allows it).
Bad input is one StragglerError line that names what was given and the form to use.

format_address writes an address (brackets for IPv6); is_loopback and is_wildcard tell what a
host is.

Pure functions of their arguments: no sockets, no name resolution, no imports from straggler
beyond its errors.
"""
import ipaddress
from typing import NamedTuple

from .errors import StragglerError

MAX_PORT = 65535
ANY_ADDRESS = "0.0.0.0"
WILDCARD_HOSTS = ("", ANY_ADDRESS, "::", "*")
FORM = "use HOST:PORT, or [IPv6]:PORT"


class Address(NamedTuple):
    """A host (an IPv6 address without brackets) and a port; str() writes it as HOST:PORT."""
    host: str
    port: int

    def __str__(self):
        return format_address(self.host, self.port)


def format_address(host, port):
    """'host:port', or '[v6]:port' for an IPv6 address."""
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def _port(value, allow_zero):
    """A port number (int or text) as an int, or None when it is not one."""
    text = str(value).strip()
    if isinstance(value, bool) or not (text.isascii() and text.isdigit()):
        return None
    port = int(text)
    return port if (0 if allow_zero else 1) <= port <= MAX_PORT else None


def _port_range(allow_zero):
    return f"{0 if allow_zero else 1}-{MAX_PORT}"


def parse_port(value, what, allow_zero=False):
    """A port number (int or text) -> int in 1-65535 (0-65535 with allow_zero); StragglerError
    '<what> is not a port number (1-65535)' otherwise."""
    port = _port(value, allow_zero)
    if port is None:
        raise StragglerError(f"{what} is not a port number ({_port_range(allow_zero)})")
    return port


def _is_ipv6(text):
    try:
        ipaddress.IPv6Address(text)
        return True
    except ValueError:
        return False


def _host_problem(host, bracketed):
    """Why `host` (brackets removed) cannot be one, or None."""
    if not host:
        return "no host"
    if bracketed and not _is_ipv6(host):
        return "only an IPv6 address goes in brackets"
    if ":" in host and not _is_ipv6(host):
        return "a host with colons must be an IPv6 address"
    return None


def parse_host(text, what):
    """A host alone (a name, an IPv4 address, an IPv6 address with or without brackets) -> the host
    without brackets; StragglerError '<what> <text>: <why>' otherwise."""
    given = str(text).strip()
    bracketed = given.startswith("[") and given.endswith("]")
    host = given[1:-1] if bracketed else given
    problem = _host_problem(host, bracketed)
    if problem:
        raise StragglerError(f"{what} {given!r}: {problem}")
    return host


def parse_address(text, default_port, what="address", default_host=None, allow_zero=False) -> Address:
    """'HOST:PORT', '[v6]:PORT', 'HOST', 'v6', '[v6]' (and, with a default_host, ':PORT', 'PORT'
    and '') -> Address(host, port). See the module docstring for the rule; `what` names the
    input in errors (e.g. "--listen", "node")."""
    given = str(text).strip()

    def bad(problem):
        return StragglerError(f"{what} {given!r}: {problem}; {FORM}")

    def port_of(port_text):
        port = _port(port_text, allow_zero)
        if port is None:
            raise bad(f"port {port_text!r} is not a port number ({_port_range(allow_zero)})")
        return port

    if not given or given.isdigit() or given.startswith(":") and given.count(":") == 1:
        if default_host is None:
            raise bad("no host")
        if not given:
            return Address(default_host, int(default_port))
        return Address(default_host, port_of(given[1:] if given.startswith(":") else given))
    if given.startswith("["):
        host, closed, rest = given[1:].partition("]")
        if not closed:
            raise bad("no closing ']'")
        if rest and not rest.startswith(":"):
            raise bad(f"{rest!r} after ']'")
        port = port_of(rest[1:]) if rest else int(default_port)
        bracketed = True
    elif given.count(":") > 1:   # a bare IPv6 address: no port in it
        host, port, bracketed = given, int(default_port), False
    elif ":" in given:
        host, _, port_text = given.rpartition(":")
        port, bracketed = port_of(port_text), False
    else:
        host, port, bracketed = given, int(default_port), False
    problem = _host_problem(host, bracketed)
    if problem:
        raise bad(problem)
    return Address(host, port)


def parse_listen(text, default_port, what="--listen") -> Address:
    """Where a server listens: parse_address with every address (0.0.0.0) as the default host, so
    ':PORT', 'PORT' and '' are accepted, and port 0 (any free port) allowed."""
    return parse_address(text, default_port, what=what, default_host=ANY_ADDRESS, allow_zero=True)


def is_loopback(host):
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def is_wildcard(host):
    """True for a host that means every address of the machine ('', 0.0.0.0, ::, *)."""
    return host in WILDCARD_HOSTS
