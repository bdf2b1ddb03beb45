"""TLS settings shared by the agent's API server and the fleet client: one set of words
(--ca, --cert, --key, --no-tls, --no-tls-any-address) and one set of files serves both sides.

TLS 1.3 only, mutual: the server presents a certificate from the fleet CA and refuses every
client without a certificate signed by that CA; the client verifies the server against the
same CA, including the host name or IP address it connected to (the certificate's SAN).
Plain HTTP only with an explicit --no-tls, which warns, and a server then binds to loopback
only unless --no-tls-any-address is given too.

Authorization is by certificate: a client certificate names its roles (`peer_roles`), and the
server refuses certificates that the fleet CA's revocation list (CRL, --crl) names, at the
handshake. `ServerContextCache` rebuilds the server's context when the files change, so a new
CRL takes effect for new connections without a restart.

This module builds ssl contexts and checks files; it must not open sockets.
"""
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import defaults
from .errors import StragglerError
from .text import one_line

log = logging.getLogger("straggler.tls")

DEFAULT_TLS_DIR = defaults.TLS_DIR
DEFAULT_CA = defaults.CA_FILE
DEFAULT_CERT = defaults.CERT_FILE
DEFAULT_KEY = defaults.KEY_FILE
# The fleet CA's certificate revocation list, distributed by the pki role beside ca.crt. Without
# --crl the server uses crl.pem in the directory of the CA certificate (this file, for the default
# --ca) when it exists, and picks it up when it appears later (ServerContextCache).
DEFAULT_CRL = defaults.CRL_FILE
CRL_FILE_NAME = defaults.CRL_FILE_NAME

# Roles a client certificate can carry, as subject organizationalUnitName attributes
# "straggler:<role>" (written by `straggler pki issue --client --role ROLE`).
ROLE_QUERY = "query"          # read-only SQL, clock, health, live, metrics
ROLE_SNAPSHOT = "snapshot"    # the whole store (GET /api/v1/snapshot)
ROLES = (ROLE_QUERY, ROLE_SNAPSHOT)
ROLE_OU_PREFIX = "straggler:"

NO_TLS_WARNING = ("TLS is off (--no-tls): requests and answers travel in plain text and any local "
                  "process can query the database")


class TLSError(StragglerError):
    """TLS files missing, unreadable or not matching."""


@dataclass
class TLSOptions:
    """Where the TLS files are, and whether TLS is off.

    server_name: verify the server's certificate against this name instead of the address
    connected to (e.g. connect by IP, verify by node name); client side only.
    crl: the fleet CA's revocation list (PEM), server side only. None (the default): crl.pem
    beside the CA certificate (DEFAULT_CRL for the default --ca), used when that file exists;
    a path given here (--crl FILE) must exist.
    """
    ca: Optional[str] = DEFAULT_CA
    cert: Optional[str] = DEFAULT_CERT
    key: Optional[str] = DEFAULT_KEY
    no_tls: bool = False
    any_address: bool = False
    server_name: Optional[str] = None
    crl: Optional[str] = None

    @property
    def scheme(self):
        return "http" if self.no_tls else "https"

    @property
    def crl_path(self) -> Optional[str]:
        """The CRL file the server uses when it exists: --crl, else crl.pem beside the CA certificate."""
        if self.crl:
            return self.crl
        if not self.ca:
            return None
        return os.path.join(os.path.dirname(os.path.abspath(self.ca)), CRL_FILE_NAME)


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
        raise TLSError(f"cannot load CA certificate {opts.ca}: {one_line(exc)}; is it a PEM certificate?") from None
    try:
        context.load_cert_chain(certfile=opts.cert, keyfile=opts.key)
    except ssl.SSLError as exc:
        raise TLSError(f"cannot load {side} certificate {opts.cert} with key {opts.key}: {one_line(exc)}; "
                       f"do the certificate and key belong together?") from None
    except OSError as exc:
        raise TLSError(f"cannot read {side} certificate {opts.cert} / key {opts.key}: {one_line(exc)}") from None


def _server_crl(opts):
    """The CRL file to load, or None: an explicit --crl must exist, the default one may be absent."""
    path = opts.crl_path
    if not opts.crl and (path is None or not os.path.exists(path)):
        return None
    if not os.path.exists(path):
        raise TLSError(f"CRL file {path} does not exist; pass --crl with the fleet CA's revocation list "
                       f"(`straggler pki crl --dir DIR` writes DIR/crl.pem), or leave --crl out")
    _check_readable(path, "CRL", "--crl")
    return path


def server_context(opts: TLSOptions) -> ssl.SSLContext:
    """An ssl context for the agent's API: TLS 1.3 only, client certificate from the fleet CA required,
    and not revoked when there is a CRL (opts.crl_path): a revoked certificate fails at the handshake."""
    if opts.no_tls:
        raise TLSError("server_context called with no_tls set; serve plain HTTP instead")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _tls13_only(context)
    _load(context, opts, "server")
    context.verify_mode = ssl.CERT_REQUIRED
    crl = _server_crl(opts)
    if crl:
        try:
            context.load_verify_locations(cafile=crl)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise TLSError(f"cannot load CRL {crl}: {one_line(exc)}; is it a PEM CRL "
                           f"(`straggler pki crl` writes one)?") from None
        # the CRL must be the fleet CA's: with this flag a client certificate whose issuer has no CRL
        # in the context fails too
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
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


def _file_state(path):
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ServerContextCache:
    """The server's ssl context, rebuilt when the CA, certificate, key or CRL file changes.

    `current()` returns the context for a new connection. At most once per `check_interval_s` it
    compares the files' (mtime_ns, size, inode) with those of the last build and, when they differ,
    builds a new context: a new CRL (the pki role distributes one) then takes effect for new
    connections without a restart; open connections keep theirs. When the rebuild fails (a key that
    does not match the new certificate yet, a CRL that is not PEM), the previous context stays in
    use and one warning is logged per changed state of the files. The first build happens here and raises
    TLSError like server_context. Thread-safe.
    """

    def __init__(self, opts: TLSOptions, check_interval_s: float = 1.0, logger=None):
        self.opts = opts
        self.check_interval_s = check_interval_s
        self._log = logger or log
        self._lock = threading.Lock()
        state = self._state()
        self._context = server_context(opts)
        self._built_state = state
        self._failed_state = None
        self._checked = time.monotonic()

    def _paths(self):
        return (self.opts.ca, self.opts.cert, self.opts.key, self.opts.crl_path)

    def _state(self):
        return tuple(_file_state(path) for path in self._paths())

    def current(self) -> ssl.SSLContext:
        if time.monotonic() - self._checked < self.check_interval_s:
            return self._context
        with self._lock:
            now = time.monotonic()
            if now - self._checked < self.check_interval_s:
                return self._context
            self._checked = now
            state = self._state()
            if state == self._built_state or state == self._failed_state:
                return self._context
            try:
                context = server_context(self.opts)
            except TLSError as exc:
                self._failed_state = state
                self._log.warning("TLS files changed but cannot be loaded (%s); new connections keep the "
                                  "previous certificates and CRL", exc)
                return self._context
            self._context, self._built_state, self._failed_state = context, state, None
            self._log.info("TLS files changed: new connections use the new certificates and CRL")
            return self._context


def peer_roles(peercert: dict) -> frozenset:
    """The roles (ROLES) a client certificate grants, from a verified `SSLSocket.getpeercert()` dict.

    A role is a subject organizationalUnitName attribute "straggler:<role>"; roles this version does
    not know are ignored. A certificate without any "straggler:" OU (issued before roles existed)
    gets ROLE_QUERY only (least privilege); one whose "straggler:" OUs are all unknown gets none.
    No certificate (None or an empty dict: not verified) gets none.
    """
    if not peercert:
        return frozenset()
    named = set()
    for rdn in peercert.get("subject", ()):
        for attribute in rdn:
            if len(attribute) != 2:
                continue
            key, value = attribute
            if key == "organizationalUnitName" and isinstance(value, str) and value.startswith(ROLE_OU_PREFIX):
                named.add(value[len(ROLE_OU_PREFIX):])
    if not named:
        return frozenset({ROLE_QUERY})
    return frozenset(named & set(ROLES))


def warn_no_tls(logger=None):
    (logger or log).warning(NO_TLS_WARNING)
