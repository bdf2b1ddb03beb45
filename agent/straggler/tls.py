"""TLS settings shared by the agent's API server and the fleet client: one set of words
(--ca, --cert, --key, --no-tls, --no-tls-any-address) and one set of files serves both sides.

TLS 1.3 only, mutual: the server presents a certificate from the fleet CA and refuses every
client without a certificate signed by that CA; the client verifies the server against the
same CA, including the host name or IP address it connected to (the certificate's SAN).
Plain HTTP only with an explicit --no-tls, which warns, and a server then binds to loopback
only unless --no-tls-any-address is given too.

This module builds ssl contexts and checks files; it must not open sockets.
"""
import logging
import os
import ssl
from dataclasses import dataclass
from typing import Optional

from .errors import StragglerError

log = logging.getLogger("straggler.tls")

DEFAULT_TLS_DIR = "/etc/straggler/tls"
DEFAULT_CA = os.path.join(DEFAULT_TLS_DIR, "ca.crt")
DEFAULT_CERT = os.path.join(DEFAULT_TLS_DIR, "node.crt")
DEFAULT_KEY = os.path.join(DEFAULT_TLS_DIR, "node.key")

NO_TLS_WARNING = ("TLS is off (--no-tls): requests and answers travel in plain text and any local "
                  "process can query the database")


class TLSError(StragglerError):
    """TLS files missing, unreadable or not matching."""


@dataclass
class TLSOptions:
    """Where the TLS files are, and whether TLS is off.

    server_name: verify the server's certificate against this name instead of the address
    connected to (e.g. connect by IP, verify by node name); client side only.
    """
    ca: Optional[str] = DEFAULT_CA
    cert: Optional[str] = DEFAULT_CERT
    key: Optional[str] = DEFAULT_KEY
    no_tls: bool = False
    any_address: bool = False
    server_name: Optional[str] = None

    @classmethod
    def from_args(cls, args):
        return cls(
            ca=getattr(args, "ca", None) or DEFAULT_CA,
            cert=getattr(args, "cert", None) or DEFAULT_CERT,
            key=getattr(args, "key", None) or DEFAULT_KEY,
            no_tls=bool(getattr(args, "no_tls", False)),
            any_address=bool(getattr(args, "no_tls_any_address", False)),
            server_name=getattr(args, "tls_server_name", None),
        )

    @property
    def scheme(self):
        return "http" if self.no_tls else "https"


def add_tls_arguments(parser):
    """Add --ca --cert --key --no-tls --no-tls-any-address (and --tls-server-name) to a parser."""
    group = parser.add_argument_group("TLS (mutual, TLS 1.3 only)")
    group.add_argument("--ca", default=DEFAULT_CA, metavar="FILE",
                       help=f"the fleet CA certificate that signs every node and client certificate (default {DEFAULT_CA})")
    group.add_argument("--cert", default=DEFAULT_CERT, metavar="FILE",
                       help=f"this side's certificate, signed by the fleet CA (default {DEFAULT_CERT})")
    group.add_argument("--key", default=DEFAULT_KEY, metavar="FILE",
                       help=f"this side's private key (default {DEFAULT_KEY})")
    group.add_argument("--no-tls", action="store_true",
                       help="plain HTTP, no certificates (a server then binds to loopback only)")
    group.add_argument("--no-tls-any-address", action="store_true",
                       help="with --no-tls: let the server bind to a non-loopback address anyway")
    group.add_argument("--tls-server-name", default=None, metavar="NAME",
                       help="client: verify the server's certificate against NAME instead of the address connected to")
    return group


def _check_readable(path, what, flag):
    if not path:
        raise TLSError(f"no {what} file given; pass {flag} FILE (or --no-tls for plain HTTP)")
    if not os.path.exists(path):
        raise TLSError(f"{what} file {path} does not exist; pass {flag} FILE, create one with "
                       f"`straggler pki`, or use --no-tls")
    if not os.path.isfile(path):
        raise TLSError(f"{what} file {path} is not a regular file; pass {flag} FILE")
    if not os.access(path, os.R_OK):
        raise TLSError(f"{what} file {path} is not readable by this user; run as its owner or fix its mode")


def _one_line(exc):
    text = " ".join(str(exc).split())
    return text or exc.__class__.__name__


def _tls13_only(context):
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3


def _load(context, opts, side):
    _check_readable(opts.ca, "CA certificate", "--ca")
    _check_readable(opts.cert, f"{side} certificate", "--cert")
    _check_readable(opts.key, f"{side} private key", "--key")
    try:
        context.load_verify_locations(cafile=opts.ca)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TLSError(f"cannot load CA certificate {opts.ca}: {_one_line(exc)}; is it a PEM certificate?") from None
    try:
        context.load_cert_chain(certfile=opts.cert, keyfile=opts.key)
    except ssl.SSLError as exc:
        raise TLSError(f"cannot load {side} certificate {opts.cert} with key {opts.key}: {_one_line(exc)}; "
                       f"do the certificate and key belong together?") from None
    except OSError as exc:
        raise TLSError(f"cannot read {side} certificate {opts.cert} / key {opts.key}: {_one_line(exc)}") from None


def server_context(opts: TLSOptions) -> ssl.SSLContext:
    """An ssl context for the agent's API: TLS 1.3 only, client certificate from the fleet CA required."""
    if opts.no_tls:
        raise TLSError("server_context called with no_tls set; serve plain HTTP instead")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _tls13_only(context)
    _load(context, opts, "server")
    context.verify_mode = ssl.CERT_REQUIRED
    # every fleet request is a fresh connection and nothing resumes sessions: skip the two
    # TLS 1.3 session tickets OpenSSL would otherwise make and send after each handshake
    context.num_tickets = 0
    return context


def client_context(opts: TLSOptions) -> ssl.SSLContext:
    """An ssl context for the fleet client: TLS 1.3 only, presents its certificate, verifies the server
    against the fleet CA and the host name / IP address (SAN)."""
    if opts.no_tls:
        raise TLSError("client_context called with no_tls set; use plain HTTP instead")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _tls13_only(context)
    _load(context, opts, "client")
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    return context


def warn_no_tls(logger=None):
    (logger or log).warning(NO_TLS_WARNING)
