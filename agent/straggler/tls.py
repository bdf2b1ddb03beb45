"""TLS settings shared by the agent's API server and the fleet client: one set of words
(--ca, --cert, --key, --no-tls, --no-tls-any-address) and one set of files serves both sides.

TLS 1.3 only, mutual: the server presents a certificate from the fleet CA and refuses every
client without a certificate signed by that CA; the client verifies the server against the
same CA, including the host name or IP address it connected to (the certificate's SAN).
Plain HTTP only with an explicit --no-tls, which warns, and a server then binds to loopback
only unless --no-tls-any-address is given too.

Authorization is by certificate: a client certificate names its roles (`peer_roles`), and the
server refuses certificates that the fleet CA's revocation list (CRL, --crl) names: OpenSSL at the
handshake, and the server at every request of an open connection (`ServerContextCache.refusal`,
from the serials `read_crl` finds in the same file). `ServerContextCache` rebuilds the server's
context when the files change, so a new CRL takes effect without a restart. A CRL in use that goes
missing or cannot be read fails closed: every client is refused, with one log line, until it is
back. `crl_status` says how long a CRL has left (`straggler status`, /api/v1/health).

This module builds ssl contexts and checks files; it must not open sockets.
"""
import base64
import datetime
import logging
import os
import re
import ssl
import threading
import time
from dataclasses import dataclass
from typing import FrozenSet, Optional

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
# A CRL this close to its nextUpdate is reported loudly (status, health, the server's log): past it,
# OpenSSL refuses every client. `straggler pki` (and the pki role) re-sign it when less than 185 days
# are left, so a fleet whose role runs at least every six months never comes near this.
CRL_WARN_DAYS = 60

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


class CRLError(TLSError):
    """The revocation list is missing, unreadable or not a PEM CRL."""


# ---------------------------------------------------------------- the CRL's contents (DER, standard library)

@dataclass(frozen=True)
class CrlInfo:
    """What the server needs of a CRL: the revoked serial numbers and its validity."""
    revoked: FrozenSet[int]
    this_update: Optional[datetime.datetime]
    next_update: Optional[datetime.datetime]


_PEM_CRL = re.compile(rb"-----BEGIN X509 CRL-----(.+?)-----END X509 CRL-----", re.S)


def _der_elements(data, start, end):
    """(tag, content start, content end) of each DER element in data[start:end]."""
    pos = start
    while pos < end:
        if pos + 2 > end:
            raise ValueError("truncated DER element")
        tag, first = data[pos], data[pos + 1]
        pos += 2
        if tag & 0x1F == 0x1F:
            raise ValueError("a multi-byte DER tag (not in a CRL)")
        if first < 0x80:
            length = first
        else:
            count = first & 0x7F
            if not 1 <= count <= 4 or pos + count > end:
                raise ValueError("a bad DER length")
            length = int.from_bytes(data[pos:pos + count], "big")
            pos += count
        if pos + length > end:
            raise ValueError("a DER element longer than its parent")
        yield tag, pos, pos + length
        pos += length


def _der_time(tag, raw):
    text = raw.decode("ascii")
    if tag == 0x17:      # UTCTime YYMMDDHHMMSSZ
        year, rest = int(text[:2]), text[2:]
        year += 2000 if year < 50 else 1900
    elif tag == 0x18:    # GeneralizedTime YYYYMMDDHHMMSS[.f]Z
        year, rest = int(text[:4]), text[4:]
    else:
        raise ValueError(f"a time of DER tag {tag:#x}")
    if not rest.endswith("Z") or len(rest) < 11:
        raise ValueError(f"time {text!r} is not in UTC")
    return datetime.datetime(year, int(rest[0:2]), int(rest[2:4]), int(rest[4:6]), int(rest[6:8]), int(rest[8:10]),
                             tzinfo=datetime.timezone.utc)


def _parse_der_crl(der):
    """CrlInfo of one DER CertificateList (RFC 5280 5.1); ValueError when it is not one. The
    signature is not checked here: OpenSSL checks it at each handshake with the same file."""
    outer = list(_der_elements(der, 0, len(der)))
    if len(outer) != 1 or outer[0][0] != 0x30:
        raise ValueError("not a DER SEQUENCE")
    parts = list(_der_elements(der, outer[0][1], outer[0][2]))
    if len(parts) != 3 or parts[0][0] != 0x30:
        raise ValueError("not a CertificateList")
    fields = list(_der_elements(der, parts[0][1], parts[0][2]))
    index = 1 if fields and fields[0][0] == 0x02 else 0          # version
    index += 2                                                    # signature algorithm, issuer
    if len(fields) <= index or fields[index][0] not in (0x17, 0x18):
        raise ValueError("no thisUpdate")
    this_update = _der_time(fields[index][0], der[fields[index][1]:fields[index][2]])
    index += 1
    next_update = None
    if index < len(fields) and fields[index][0] in (0x17, 0x18):
        next_update = _der_time(fields[index][0], der[fields[index][1]:fields[index][2]])
        index += 1
    revoked = set()
    if index < len(fields) and fields[index][0] == 0x30:
        for tag, start, end in _der_elements(der, fields[index][1], fields[index][2]):
            entry = list(_der_elements(der, start, end))
            if tag != 0x30 or not entry or entry[0][0] != 0x02:
                raise ValueError("a revoked entry without a serial number")
            revoked.add(int.from_bytes(der[entry[0][1]:entry[0][2]], "big", signed=True))
    return CrlInfo(frozenset(revoked), this_update, next_update)


def read_crl(path) -> CrlInfo:
    """The revoked serials and validity of a PEM CRL file (every CRL in it together; the earliest
    nextUpdate). CRLError (one line) when it is missing, unreadable or holds no CRL."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(16 << 20)
    except OSError as exc:
        raise CRLError(f"cannot read the CRL {path}: {exc.strerror or exc}") from None
    blocks = _PEM_CRL.findall(data)
    if not blocks:
        raise CRLError(f"{path} holds no PEM CRL (-----BEGIN X509 CRL-----); `straggler pki crl` writes one")
    revoked, this_updates, next_updates = set(), [], []
    for block in blocks:
        try:
            info = _parse_der_crl(base64.b64decode(b"".join(block.split()), validate=True))
        except (ValueError, UnicodeDecodeError, base64.binascii.Error) as exc:
            raise CRLError(f"the CRL {path} cannot be read ({exc}); rewrite it with `straggler pki crl`") from None
        revoked |= info.revoked
        this_updates.append(info.this_update)
        if info.next_update is not None:
            next_updates.append(info.next_update)
    return CrlInfo(frozenset(revoked), max(this_updates), min(next_updates) if next_updates else None)


def crl_status(path, info=None, problem=None, expected=True, now=None) -> dict:
    """How a CRL stands, for people: {"path", "state", "next_update", "days_left", "revoked",
    "message"}; state is ok | expiring (under CRL_WARN_DAYS left) | expired | missing | unreadable
    (a CRL that should be there) | none (no CRL: revocation not checked). `info` and `problem`:
    what the caller already read (else the file is read now)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    out = {"path": path, "state": None, "next_update": None, "days_left": None, "revoked": None, "message": ""}
    if info is None and problem is None:
        if not path or not os.path.exists(path):
            problem = None if not expected else f"the CRL {path} is missing"
            if problem is None:
                out.update(state="none", message=f"no CRL at {path}: revocation is not checked (the pki role puts "
                                                 f"one there; or pass --crl FILE)")
                return out
        else:
            try:
                info = read_crl(path)
            except CRLError as exc:
                problem = str(exc)
    if info is None:
        missing = not path or not os.path.exists(path)
        out.update(state="missing" if missing else "unreadable",
                   message=f"{problem}: every client is refused until it is back (`straggler pki crl --dir DIR` "
                           f"writes one; the pki role distributes it)")
        return out
    out["revoked"] = len(info.revoked)
    if info.next_update is None:
        out.update(state="ok", message=f"no expiry; {len(info.revoked)} certificate(s) revoked")
        return out
    left = (info.next_update - now).total_seconds() / 86400.0
    out.update(next_update=info.next_update.isoformat(), days_left=round(left, 1))
    date = info.next_update.strftime("%Y-%m-%d %H:%M UTC")
    renew = ("renew it with `straggler pki crl --dir DIR` on the controller (the pki role does it on every run) "
             "and distribute it")
    if left <= 0:
        out.update(state="expired", message=f"EXPIRED on {date}: every client is refused at the handshake; {renew}")
    elif left < CRL_WARN_DAYS:
        out.update(state="expiring", message=f"EXPIRES on {date}, in {left:.0f} days: then every client is refused; "
                                             f"{renew}")
    else:
        out.update(state="ok", message=f"valid until {date} ({left:.0f} days left); "
                                       f"{len(info.revoked)} certificate(s) revoked")
    return out


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
        raise CRLError(f"CRL file {path} does not exist; pass --crl with the fleet CA's revocation list "
                       f"(`straggler pki crl --dir DIR` writes DIR/crl.pem), or leave --crl out")
    try:
        _check_readable(path, "CRL", "--crl")
    except TLSError as exc:
        raise CRLError(str(exc)) from None
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
            raise CRLError(f"cannot load CRL {crl}: {one_line(exc)}; is it a PEM CRL "
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
    """The server's ssl context and revocation list, re-read when the CA, certificate, key or CRL file
    changes.

    `current()` returns the context for a new connection. At most once per `check_interval_s` it
    compares the files' (mtime_ns, size, inode) with those of the last build and, when they differ,
    builds a new context and re-reads the CRL's serials: a new CRL (the pki role distributes one)
    takes effect without a restart, at the next handshake and (`refusal`) at the next request of
    every open connection; `generation` counts the changes, so the server can close the
    connections of a certificate that was just revoked.

    The CRL fails closed. It is expected when --crl names it, or once crl.pem beside the CA
    certificate has been seen; an expected CRL that goes missing or cannot be read makes `refusal`
    refuse every client (503, one line) with one log warning, until a readable one is back. A CRL
    past its nextUpdate is refused by OpenSSL itself at every handshake: one warning says so. When
    another file cannot be loaded (a key that does not match the new certificate yet), the previous
    context stays in use with one warning per changed state of the files. The first build happens
    here and raises TLSError like server_context. Thread-safe.
    """

    def __init__(self, opts: TLSOptions, check_interval_s: float = 1.0, logger=None):
        self.opts = opts
        self.check_interval_s = check_interval_s
        self._log = logger or log
        self._lock = threading.Lock()
        state = self._state()
        self._context = server_context(opts)
        self.crl_path = opts.crl_path
        self.crl = None
        self.crl_problem = None          # why every client is refused now (an expected CRL is missing or unreadable)
        if self.crl_path and os.path.exists(self.crl_path):
            self.crl = read_crl(self.crl_path)
        self.crl_expected = bool(opts.crl) or self.crl is not None
        if not self.crl_expected:
            self._log.warning("no CRL at %s: revocation is not checked until one appears there (the pki role puts "
                              "crl.pem beside ca.crt; or pass --crl FILE)", self.crl_path)
        self.generation = 0
        self._built_state = state
        self._failed_state = None
        self._expiry_told = None
        self._checked = time.monotonic()
        self._tell_expiry()

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
            self._tell_expiry()
            state = self._state()
            if state == self._built_state or state == self._failed_state:
                return self._context
            self._rebuild(state)
            return self._context

    def _rebuild(self, state):
        crl, problem = None, None
        if self.crl_path and os.path.exists(self.crl_path):
            try:
                crl = read_crl(self.crl_path)
            except CRLError as exc:
                problem = str(exc)
        elif self.crl_expected:
            problem = f"the CRL {self.crl_path} is missing"
        context = None
        if problem is None:
            try:
                context = server_context(self.opts)
            except CRLError as exc:
                problem = str(exc)
            except TLSError as exc:
                self._failed_state = state
                self._log.warning("TLS files changed but cannot be loaded (%s); new connections keep the "
                                  "previous certificates and CRL", exc)
                return
        if problem is not None:
            self._failed_state = state
            if problem != self.crl_problem:
                self._log.warning("%s: every client is refused until a readable CRL is back (fail closed); "
                                  "`straggler pki crl --dir DIR` writes one, the pki role distributes it", problem)
                self.crl_problem = problem
                self.generation += 1
            return
        was_refusing = self.crl_problem is not None
        self._context, self._built_state, self._failed_state = context, state, None
        self.crl, self.crl_problem = crl, None
        self.crl_expected = self.crl_expected or crl is not None
        self.generation += 1
        self._expiry_told = None
        self._tell_expiry()
        self._log.info("TLS files changed: new connections use the new certificates and CRL%s",
                       "; clients are served again" if was_refusing else "")

    def _tell_expiry(self):
        """One warning when the CRL in use is near its nextUpdate or past it (and again after a change)."""
        if self.crl is None or self.crl.next_update is None:
            return
        status = crl_status(self.crl_path, info=self.crl)
        if status["state"] in ("expiring", "expired") and status["state"] != self._expiry_told:
            self._expiry_told = status["state"]
            self._log.warning("the CRL %s %s", self.crl_path, status["message"])

    def refusal(self, serial_hex):
        """None when a client whose certificate has this serial (hex, as getpeercert gives it) may be
        served now, else (HTTP status, one line): 403 for a revoked certificate, 503 while the CRL is
        missing or unreadable."""
        problem, crl = self.crl_problem, self.crl
        if problem is not None:
            return 503, (f"this agent refuses every client: {problem} (it fails closed until the pki role or "
                         f"`straggler pki crl` puts a readable one back)")
        if crl is not None and serial_hex:
            try:
                serial = int(serial_hex, 16)
            except ValueError:
                return 403, "this client's certificate has no readable serial number"
            if serial in crl.revoked:
                return 403, f"this client's certificate (serial {serial_hex}) is revoked"
        return None

    def crl_status(self) -> dict:
        """crl_status of the CRL in use (for /api/v1/health)."""
        if self.crl_problem is not None:
            return crl_status(self.crl_path, problem=self.crl_problem)
        if self.crl is None:
            return crl_status(self.crl_path, expected=False)
        return crl_status(self.crl_path, info=self.crl)


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
