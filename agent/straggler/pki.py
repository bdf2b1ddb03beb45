"""A small PKI for the fleet: one CA, server certificates for the agents, client certificates
for the people and playbooks that query them, and a revocation list. Files live in one directory:

    DIR/ (0700)  DIR/ca.crt  DIR/ca.key (0600)  DIR/crl.pem  DIR/NAME.crt  DIR/NAME.key (0600)
    DIR/revoked/ (0700)  DIR/revoked/NAME/SERIAL.crt   (revoked certificates, moved aside; keys deleted)

DIR holds every node's key and the CA's: every action (init, issue, revoke, crl) makes DIR and
DIR/revoked 0700 and every DIR/*.key 0600, tightening looser modes it finds (older versions made
DIR 0755) and saying which in its summary (`modes_fixed`; `changed` then, while `written` says
whether the certificate, CA or CRL itself was written).

A client certificate carries its roles (straggler.tls.ROLES) as subject OU attributes
"straggler:<role>"; server certificates carry none. `straggler pki issue --client` without --role
asks for DEFAULT_CLIENT_ROLES (query only: read, never copy whole stores), and says so.

Idempotent: `init_ca` keeps a valid CA (and writes or refreshes its CRL), `issue` keeps a
certificate that this CA signed, with the same SANs, kind and roles, not revoked, not close to
expiry; `revoke` and `write_crl` change the CRL only when needed. Each reports changed /
unchanged (the Ansible pki role relies on that). Uses the `cryptography` package (controller side).

Times are timezone-aware (UTC) throughout. This module must not be imported by the agent core at
start-up (only by `straggler pki`, straggler.cli.pki, which renders what it returns); it holds no
argparse and prints nothing.
"""
import datetime
import ipaddress
import os
import re
import stat
import tempfile

from .errors import StragglerError
from .tls import CRL_FILE_NAME, ROLE_OU_PREFIX, ROLES

CA_DAYS = 3650
DIR_MODE = 0o700
KEY_MODE = 0o600
DEFAULT_CLIENT_ROLES = ("query",)   # the command's roles for a client certificate when none is asked for
CERT_DAYS = 825
RENEW_BEFORE_DAYS = 30
# The CRL's nextUpdate: an agent refuses every client once its CRL is past nextUpdate, so `init`,
# `crl` and `revoke` (and so the pki role) re-sign it when less than CRL_RENEW_BEFORE_DAYS are
# left: any run in the second half of its year renews it (run the role at least every six months).
CRL_DAYS = 365
CRL_RENEW_BEFORE_DAYS = 185
KINDS = ("server", "client")
REVOKED_DIR = "revoked"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class PKIError(StragglerError):
    pass


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise PKIError("the Python package `cryptography` is missing; install it "
                       "(pip install cryptography) on the machine that runs `straggler pki`") from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def _utc_time(obj, name):
    """obj.<name> (a certificate's not_valid_after, a CRL's next_update, a revoked entry's
    revocation_date) as an aware UTC datetime, or None: cryptography's `<name>_utc` (42 and later;
    the naive properties are deprecated there), else the naive value, which is UTC."""
    try:
        return getattr(obj, name + "_utc")
    except AttributeError:
        value = getattr(obj, name)
        return value.replace(tzinfo=datetime.timezone.utc) if value is not None else None


def _not_after(cert):
    return _utc_time(cert, "not_valid_after")


def _write_atomic(path, data: bytes, mode: int):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _paths(directory, name):
    return os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")


def _load_cert(path):
    x509 = _crypto()[0]
    try:
        with open(path, "rb") as fh:
            return x509.load_pem_x509_certificate(fh.read())
    except (OSError, ValueError):
        return None


def _load_key(path):
    serialization = _crypto()[2]
    try:
        with open(path, "rb") as fh:
            return serialization.load_pem_private_key(fh.read(), password=None)
    except (OSError, ValueError, TypeError):
        return None


def _new_key():
    ec = _crypto()[3]
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key):
    serialization = _crypto()[2]
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert):
    serialization = _crypto()[2]
    return cert.public_bytes(serialization.Encoding.PEM)


def _same_public_key(cert, key):
    serialization = _crypto()[2]
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt)


def _ensure_dir(directory):
    try:
        os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise PKIError(f"cannot create directory {directory}: {exc.strerror}; choose another --dir") from None
    if not os.access(directory, os.W_OK):
        raise PKIError(f"directory {directory} is not writable by this user; choose another --dir or run as its owner")


def _tighten(path, mode, fixed):
    """chmod `path` to `mode` when it allows more than that (a symlink is left alone); record it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_IMODE(st.st_mode) & ~mode:
        return
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise PKIError(f"{path} is mode {stat.S_IMODE(st.st_mode):04o} and cannot be made {mode:04o} "
                       f"({exc.strerror}); fix its owner or mode, it holds private keys") from None
    fixed.append(f"{path}: {stat.S_IMODE(st.st_mode):04o} -> {mode:04o}")


def secure_modes(directory):
    """Make DIR and DIR/revoked 0700 and every DIR/*.key 0600 where they allow more. Returns what
    was changed, one 'PATH: OLD -> NEW' each (empty when all was tight)."""
    fixed = []
    _tighten(directory, DIR_MODE, fixed)
    _tighten(os.path.join(directory, REVOKED_DIR), DIR_MODE, fixed)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return fixed
    for name in names:
        if name.endswith(".key"):
            _tighten(os.path.join(directory, name), KEY_MODE, fixed)
    return fixed


def _ca_is_valid(cert, key):
    if cert is None or key is None or not _same_public_key(cert, key):
        return False
    x509 = _crypto()[0]
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return basic.ca and _not_after(cert) - _now() > datetime.timedelta(days=RENEW_BEFORE_DAYS)


def _pair_of(pem_text):
    """(certificate, private key) from PEM text holding both (in any order, other blocks ignored); either
    None when it is missing or unreadable (an encrypted key included)."""
    x509, _, serialization = _crypto()[:3]
    pems = {m.group(1): m.group(0) for m in re.finditer(r"-----BEGIN ([A-Z ]+)-----.*?-----END \1-----",
                                                         pem_text or "", re.S)}
    cert_pem = pems.get("CERTIFICATE")
    key_pem = next((text for kind, text in pems.items() if kind.endswith("PRIVATE KEY")), None)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode()) if cert_pem else None
    except ValueError:
        cert = None
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None) if key_pem else None
    except (ValueError, TypeError):
        key = None
    return cert, key


def check_ca(pem_text):
    """Whether PEM text holding a CA certificate and its private key is a usable fleet CA (the pair
    matches, the certificate is a CA's, it does not expire within RENEW_BEFORE_DAYS), without writing
    anything: a brought CA is checked before it replaces one. -> {"ok", "reason", "subject", "not_after"}."""
    x509 = _crypto()[0]
    out = {"ok": False, "reason": None, "subject": None, "not_after": None}
    cert, key = _pair_of(pem_text)
    if cert is None or key is None:
        return dict(out, reason="not a PEM certificate and its unencrypted private key")
    out.update(subject=cert.subject.rfc4514_string(), not_after=_not_after(cert).isoformat())
    if not _same_public_key(cert, key):
        return dict(out, reason="the key does not belong to the certificate")
    if not isinstance(key, _crypto()[3].EllipticCurvePrivateKey):
        # the fleet's certificates are checked as ECDSA signatures (_signed_by): with another key every
        # certificate would look foreign, be issued again on every run and its agent restarted
        return dict(out, reason="the CA's key is not an elliptic-curve key (the fleet CA signs with ECDSA; make one "
                                "with `straggler pki init`)")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        return dict(out, reason="the certificate is not a CA's (no basicConstraints CA:TRUE)")
    left = _not_after(cert) - _now()
    if left <= datetime.timedelta(days=RENEW_BEFORE_DAYS):
        return dict(out, reason=(f"it expired on {_not_after(cert).date()}" if left.total_seconds() <= 0 else
                                 f"it expires on {_not_after(cert).date()}, within {RENEW_BEFORE_DAYS} days"))
    return dict(out, ok=True, reason="a usable CA")


def _backup(directory, names):
    """Copy DIR/NAME for each of `names` that exists into DIR/backup/<UTC time>/ (0700; keys 0600) before
    they are replaced; returns that directory, or None when there was nothing to keep."""
    present = [n for n in names if os.path.exists(os.path.join(directory, n))]
    if not present:
        return None
    top = os.path.join(directory, "backup")
    os.makedirs(top, mode=DIR_MODE, exist_ok=True)
    os.chmod(top, DIR_MODE)
    # the time, and a suffix of its own: two replacements in one second keep both
    target = tempfile.mkdtemp(prefix=datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ-"), dir=top)
    for name in present:
        with open(os.path.join(directory, name), "rb") as fh:
            data = fh.read()
        _write_atomic(os.path.join(target, name), data, KEY_MODE if name.endswith(".key") else 0o644)
    return target


def init_ca(directory, common_name="straggler fleet CA", force=False):
    """Create DIR/ca.crt and DIR/ca.key (0600) unless a valid CA is there. A CA, CRL or key it replaces
    is kept first under DIR/backup/<UTC time>/ (the summary's "backup"). Returns a summary dict."""
    x509, hashes, _, _, _, NameOID = _crypto()
    _ensure_dir(directory)
    fixed = secure_modes(directory)
    cert_path, key_path = _paths(directory, "ca")
    cert, key = _load_cert(cert_path), _load_key(key_path)
    if not force and _ca_is_valid(cert, key):
        crl = _ensure_crl(directory, cert, key)
        return {"changed": crl["changed"] or bool(fixed), "written": crl["changed"], "ca_cert": cert_path,
                "ca_key": key_path, "crl": crl["crl"], "not_after": _not_after(cert).isoformat(),
                "subject": cert.subject.rfc4514_string(), "modes_fixed": fixed}
    # missing, broken, not a CA, or close to expiry: a new CA (every certificate must then be reissued,
    # which `issue` does by itself: it checks the signature against the current CA); what it replaces is
    # kept first
    backup = _backup(directory, ("ca.crt", "ca.key", CRL_FILE_NAME))
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_atomic(key_path, _key_pem(key), KEY_MODE)
    _write_atomic(cert_path, _cert_pem(cert), 0o644)
    # the old CRL (if any) is the old CA's: start an empty one, signed by this CA
    crl = _ensure_crl(directory, cert, key)
    return {"changed": True, "written": True, "ca_cert": cert_path, "ca_key": key_path, "crl": crl["crl"],
            "not_after": _not_after(cert).isoformat(), "subject": cert.subject.rfc4514_string(), "modes_fixed": fixed,
            "backup": backup}


def _parse_sans(sans):
    """['10.0.0.1', 'gpu-node-01', 'IP:…', 'DNS:…'] -> sorted list of ('ip'|'dns', value)."""
    parsed = set()
    for raw in sans or []:
        for item in str(raw).split(","):
            item = item.strip()
            if not item:
                continue
            kind = None
            if item[:3].upper() == "IP:":
                kind, item = "ip", item[3:]
            elif item[:4].upper() == "DNS:":
                kind, item = "dns", item[4:]
            try:
                address = ipaddress.ip_address(item)
                if kind == "dns":
                    raise PKIError(f"SAN DNS:{item} is an IP address; write IP:{item}")
                parsed.add(("ip", str(address)))
            except ValueError:
                if kind == "ip":
                    raise PKIError(f"SAN IP:{item} is not an IP address") from None
                if not re.match(r"^[A-Za-z0-9*]([A-Za-z0-9.*-]*[A-Za-z0-9])?$", item):
                    raise PKIError(f"SAN {item!r} is neither an IP address nor a DNS name")
                parsed.add(("dns", item.lower()))
    return sorted(parsed)


def _sans_of(cert):
    x509 = _crypto()[0]
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found = {("ip", str(v)) for v in ext.get_values_for_type(x509.IPAddress)}
    found |= {("dns", v.lower()) for v in ext.get_values_for_type(x509.DNSName)}
    return sorted(found)


def _kind_of(cert):
    x509, _, _, _, EKU, _ = _crypto()
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None
    if usages == {EKU.SERVER_AUTH}:
        return "server"
    if usages == {EKU.CLIENT_AUTH}:
        return "client"
    return None


def _parse_roles(roles, kind):
    """roles for a certificate of this kind -> sorted tuple (ROLES order). None: the default (client: all)."""
    if kind == "server":
        if roles:
            raise PKIError("roles are for client certificates (--client); a server certificate carries none")
        return ()
    if roles is None:
        return ROLES
    wanted = set()
    for role in roles:
        role = str(role).strip()
        if role.startswith(ROLE_OU_PREFIX):
            role = role[len(ROLE_OU_PREFIX):]
        if role not in ROLES:
            raise PKIError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
        wanted.add(role)
    if not wanted:
        raise PKIError(f"a client certificate needs at least one role ({', '.join(ROLES)})")
    return tuple(r for r in ROLES if r in wanted)


def _roles_of(cert):
    """Every "straggler:" OU of the certificate's subject, prefix removed, as a sorted tuple."""
    NameOID = _crypto()[5]
    found = {attr.value[len(ROLE_OU_PREFIX):]
             for attr in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
             if isinstance(attr.value, str) and attr.value.startswith(ROLE_OU_PREFIX)}
    return tuple(r for r in ROLES if r in found) + tuple(sorted(found - set(ROLES)))


def _serial_hex(serial: int) -> str:
    return format(serial, "X")


def _signed_by(cert, ca_cert):
    ec = _crypto()[3]
    if cert.issuer != ca_cert.subject:
        return False
    try:
        ca_cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                                    ec.ECDSA(cert.signature_hash_algorithm))
        return True
    except Exception:  # InvalidSignature, or a CA key of another type
        return False


def _load_ca(directory):
    cert_path, key_path = _paths(directory, "ca")
    if not os.path.exists(cert_path) or not os.path.exists(key_path):
        raise PKIError(f"no CA in {directory} (ca.crt and ca.key); run `straggler pki init --dir {directory}` first")
    cert, key = _load_cert(cert_path), _load_key(key_path)
    if cert is None or key is None:
        raise PKIError(f"cannot read the CA in {directory}: ca.crt / ca.key unreadable or not PEM; "
                       f"check permissions, or re-create with `straggler pki init --dir {directory} --force`")
    if not _same_public_key(cert, key):
        raise PKIError(f"{cert_path} and {key_path} do not belong together; restore the pair or re-create the CA")
    return cert, key


def _check_name(name):
    if not _NAME_RE.match(name or "") or name == "ca":
        raise PKIError(f"certificate name {name!r} is not usable as a file name (letters, digits, . _ -; not 'ca')")


def issue(directory, name, sans, kind="server", force=False, roles=None):
    """Issue DIR/NAME.crt and DIR/NAME.key (0600), signed by DIR's CA, unless a matching one exists.

    kind 'server' (agents: extendedKeyUsage serverAuth) or 'client' (fleet client: clientAuth).
    sans: IP addresses and DNS names (prefix IP:/DNS: optional). The name itself is always added
    as a DNS SAN for server certificates, so a client may verify by node name.
    roles: a client certificate's roles (straggler.tls.ROLES), written as subject OU attributes
    "straggler:<role>"; None gives a client certificate every role. Server certificates take none.
    An existing certificate is kept only when it matches: same SANs, kind and roles, signed by this
    CA, not in its CRL, not close to expiry; otherwise it is re-issued with a new key.
    """
    x509, hashes, _, _, EKU, NameOID = _crypto()
    if kind not in KINDS:
        raise PKIError(f"unknown certificate kind {kind!r}; use one of {', '.join(KINDS)}")
    _check_name(name)
    wanted_roles = _parse_roles(roles, kind)
    _ensure_dir(directory)
    fixed = secure_modes(directory)
    ca_cert, ca_key = _load_ca(directory)
    wanted = _parse_sans(sans)
    if kind == "server":
        if ("dns", name.lower()) not in wanted and _parse_sans([name])[0][0] == "dns":
            wanted = sorted(set(wanted) | {("dns", name.lower())})
        if not wanted:
            raise PKIError("a server certificate needs at least one --san (the address clients connect to)")
    cert_path, key_path = _paths(directory, name)
    cert, key = _load_cert(cert_path), _load_key(key_path)
    summary = {"name": name, "kind": kind, "cert": cert_path, "key": key_path, "ca_cert": _paths(directory, "ca")[0],
               "sans": [f"{t.upper()}:{v}" for t, v in wanted], "roles": list(wanted_roles), "modes_fixed": fixed}
    if (not force and cert is not None and key is not None and _same_public_key(cert, key)
            and _signed_by(cert, ca_cert) and _sans_of(cert) == wanted and _kind_of(cert) == kind
            and _roles_of(cert) == wanted_roles
            and cert.serial_number not in _revoked_serials(directory, ca_cert)
            and _not_after(cert) - _now() > datetime.timedelta(days=RENEW_BEFORE_DAYS)):
        summary.update(changed=bool(fixed), written=False, not_after=_not_after(cert).isoformat(),
                       serial=_serial_hex(cert.serial_number))
        return summary
    key = _new_key()
    now = _now()
    san_values = [x509.IPAddress(ipaddress.ip_address(v)) if t == "ip" else x509.DNSName(v) for t, v in wanted]
    subject = [x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, name)])]
    subject += [x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME,
                                                                   ROLE_OU_PREFIX + role)])
                for role in wanted_roles]
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name(subject))
               .issuer_name(ca_cert.subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(min(now + datetime.timedelta(days=CERT_DAYS), _not_after(ca_cert)))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=kind == "server", key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([EKU.SERVER_AUTH if kind == "server" else EKU.CLIENT_AUTH]),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if san_values:
        builder = builder.add_extension(x509.SubjectAlternativeName(san_values), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_atomic(key_path, _key_pem(key), KEY_MODE)
    _write_atomic(cert_path, _cert_pem(cert), 0o644)
    summary.update(changed=True, written=True, not_after=_not_after(cert).isoformat(),
                   serial=_serial_hex(cert.serial_number))
    return summary


# ---------------------------------------------------------------- revocation

def _crl_path(directory):
    return os.path.join(directory, CRL_FILE_NAME)


def _load_crl(path):
    x509 = _crypto()[0]
    try:
        with open(path, "rb") as fh:
            return x509.load_pem_x509_crl(fh.read())
    except (OSError, ValueError):
        return None


def _crl_of_ca(directory, ca_cert):
    """DIR/crl.pem when it is this CA's (issuer and signature), else None."""
    return _of_ca(_load_crl(_crl_path(directory)), ca_cert)


def _of_ca(crl, ca_cert):
    """`crl` when this CA issued and signed it, else None."""
    if crl is None or crl.issuer != ca_cert.subject:
        return None
    try:
        if not crl.is_signature_valid(ca_cert.public_key()):
            return None
    except Exception:  # a CA key of another type
        return None
    return crl


def _revoked_serials(directory, ca_cert):
    crl = _crl_of_ca(directory, ca_cert)
    return {entry.serial_number for entry in crl} if crl is not None else set()


def _crl_number(crl):
    x509 = _crypto()[0]
    try:
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        return 0


def _sign_crl(directory, ca_cert, ca_key, entries, number):
    """Write DIR/crl.pem: entries {serial: revocation date}, valid for CRL_DAYS."""
    x509, hashes = _crypto()[:2]
    now = _now()
    builder = (x509.CertificateRevocationListBuilder()
               .issuer_name(ca_cert.subject)
               # an hour back, like the certificates' notBefore: hosts whose clock lags still accept it
               .last_update(now - datetime.timedelta(hours=1))
               .next_update(min(now + datetime.timedelta(days=CRL_DAYS), _not_after(ca_cert)))
               .add_extension(x509.CRLNumber(number), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    for serial, when in sorted(entries.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build())
    crl = builder.sign(ca_key, hashes.SHA256())
    serialization = _crypto()[2]
    _write_atomic(_crl_path(directory), crl.public_bytes(serialization.Encoding.PEM), 0o644)
    return crl


def _crl_summary(directory, crl, changed):
    return {"changed": changed, "crl": _crl_path(directory),
            "revoked_serials": sorted(_serial_hex(e.serial_number) for e in crl),
            "next_update": _utc_time(crl, "next_update").isoformat()}


def _revoked_files(directory, ca_cert):
    """{serial: revocation date} of the certificates of this CA moved aside to DIR/revoked/: a CRL
    that was lost or damaged is rebuilt with them rather than silently emptied."""
    found = {}
    top = os.path.join(directory, REVOKED_DIR)
    try:
        names = os.listdir(top)
    except OSError:
        return found
    for name in names:
        folder = os.path.join(top, name)
        try:
            files = [f for f in os.listdir(folder) if f.endswith(".crt")]
        except OSError:
            continue
        for entry in files:
            path = os.path.join(folder, entry)
            cert = _load_cert(path)
            if cert is not None and _signed_by(cert, ca_cert):
                found[cert.serial_number] = datetime.datetime.fromtimestamp(
                    int(os.path.getmtime(path)), tz=datetime.timezone.utc)
    return found


def _ensure_crl(directory, ca_cert, ca_key, add=None, force=False):
    """Keep DIR/crl.pem when it is this CA's, holds every serial in `add` (and of the certificates in
    DIR/revoked/) and is not close to its nextUpdate; otherwise re-sign it with its entries plus
    those. Returns _crl_summary."""
    crl = _crl_of_ca(directory, ca_cert)
    entries = {e.serial_number: _utc_time(e, "revocation_date") for e in crl} if crl is not None else {}
    for serial, when in _revoked_files(directory, ca_cert).items():
        if serial not in entries:
            entries[serial] = when
            force = True
    missing = {serial for serial in (add or ()) if serial not in entries}
    next_update = _utc_time(crl, "next_update") if crl is not None else None
    if (not force and crl is not None and not missing and next_update is not None
            and next_update - _now() > datetime.timedelta(days=CRL_RENEW_BEFORE_DAYS)):
        return _crl_summary(directory, crl, False)
    now = _now()
    entries.update({serial: now for serial in missing})
    crl = _sign_crl(directory, ca_cert, ca_key, entries, (_crl_number(crl) + 1) if crl is not None else 1)
    return _crl_summary(directory, crl, True)


def write_crl(directory, force=False):
    """(Re)write DIR/crl.pem for DIR's CA: kept when it is this CA's and not close to nextUpdate,
    else re-signed with the same entries (an empty list the first time, or after a new CA)."""
    fixed = secure_modes(directory)
    ca_cert, ca_key = _load_ca(directory)
    summary = _ensure_crl(directory, ca_cert, ca_key, force=force)
    summary.update(changed=summary["changed"] or bool(fixed), written=summary["changed"], modes_fixed=fixed)
    return summary


def adopt_crls(directory, candidates):
    """A revocation is never undone: of DIR's own revocation list and the `candidates` ([(label, path)]:
    the lists the hosts hold), the one with the highest CRL number signed by DIR's CA wins, written as
    DIR/crl.pem byte for byte (the hosts that hold it then see no change). Lists of another CA, or
    unreadable, are left out and named. Two lists of this CA with serials the winner lacks (two
    controllers that revoked apart from one another) are joined: every serial either revoked, re-signed
    with the next number. Never an older list than DIR's own.
    -> {"changed", "crl", "crl_number", "adopted_from" (a label, or None), "joined", "behind": [labels
    whose list differs from the result: they get it when the role installs it], "foreign": [labels],
    "revoked_serials", "next_update", "modes_fixed"}."""
    fixed = secure_modes(directory)
    ca_cert, ca_key = _load_ca(directory)
    own = _crl_of_ca(directory, ca_cert)
    found, foreign = [], []
    for label, path in candidates:
        crl = _of_ca(_load_crl(path), ca_cert)
        if crl is None:
            foreign.append(label)
        else:
            found.append((label, crl))
    ranked = ([(None, own)] if own is not None else []) + found
    adopted_from, joined, changed = None, False, False
    if ranked:
        # the highest number wins; on a tie the one that revokes more, then the one most hosts hold (they
        # see no change), then DIR's own
        pem_of = {id(crl): crl.public_bytes(_crypto()[2].Encoding.PEM) for _, crl in ranked}
        held = [pem_of[id(crl)] for _, crl in found]
        label, best = max(ranked, key=lambda lc: (_crl_number(lc[1]), len(lc[1]), held.count(pem_of[id(lc[1])])))
        entries = {}
        for _, crl in ranked:
            for e in crl:
                entries.setdefault(e.serial_number, _utc_time(e, "revocation_date"))
        if set(entries) - {e.serial_number for e in best}:
            number = max(_crl_number(crl) for _, crl in ranked) + 1
            _sign_crl(directory, ca_cert, ca_key, entries, number)
            joined = changed = True
        elif label is not None and (own is None or pem_of[id(best)] != pem_of[id(own)]):
            _write_atomic(_crl_path(directory), pem_of[id(best)], 0o644)
            adopted_from, changed = label, True
    summary = _ensure_crl(directory, ca_cert, ca_key)        # the certificates in DIR/revoked/, nextUpdate
    final = _crl_of_ca(directory, ca_cert)
    pem = final.public_bytes(_crypto()[2].Encoding.PEM)
    summary.update(changed=changed or summary["changed"] or bool(fixed), written=changed or summary["changed"],
                   crl_number=_crl_number(final), adopted_from=adopted_from, joined=joined, foreign=foreign,
                   behind=[label for label, crl in found if crl.public_bytes(_crypto()[2].Encoding.PEM) != pem],
                   modes_fixed=fixed)
    return summary


def adopt_certificate(directory, name, pem_text):
    """Keep the certificate and key a host holds (`pem_text`: both PEM blocks) as DIR/NAME.crt and
    DIR/NAME.key, so that `issue` keeps them and the host sees no change, only when DIR's CA signed the
    certificate, its serial is not in DIR's revocation list, and the key is its own; otherwise write
    nothing and say why (`issue` then makes a new one). -> {"changed", "adopted", "reason", "serial"}."""
    _check_name(name)
    fixed = secure_modes(directory)
    ca_cert, _ = _load_ca(directory)
    summary = {"name": name, "changed": bool(fixed), "adopted": False, "serial": None, "modes_fixed": fixed}
    cert, key = _pair_of(pem_text)
    if cert is None or key is None:
        return dict(summary, reason="not a PEM certificate and its private key")
    summary["serial"] = _serial_hex(cert.serial_number)
    if not _signed_by(cert, ca_cert):
        return dict(summary, reason="not signed by this CA")
    if cert.serial_number in _revoked_serials(directory, ca_cert):
        return dict(summary, reason="revoked")
    if not _same_public_key(cert, key):
        return dict(summary, reason="the key is not the certificate's")
    cert_path, key_path = _paths(directory, name)
    if _load_cert(cert_path) is not None and _cert_pem(_load_cert(cert_path)) == _cert_pem(cert) \
            and _load_key(key_path) is not None:
        return dict(summary, reason="already held", adopted=True)
    _write_atomic(key_path, _key_pem(key), KEY_MODE)
    _write_atomic(cert_path, _cert_pem(cert), 0o644)
    return dict(summary, changed=True, adopted=True, reason="signed by this CA, not revoked")


def _parse_serial(text):
    raw = str(text).strip().replace(":", "")
    if raw.lower().startswith("0x"):
        raw = raw[2:]
    try:
        serial = int(raw, 16)
    except ValueError:
        raise PKIError(f"serial {text!r} is not a hexadecimal number (as `openssl x509 -noout -serial` prints it)") from None
    if serial <= 0:
        raise PKIError(f"serial {text!r} is not a certificate serial number")
    return serial


def _revoked_record(directory, name):
    folder = os.path.join(directory, REVOKED_DIR, name)
    try:
        return sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".crt"))
    except OSError:
        return []


def revoke(directory, names=(), serials=(), check=False):
    """Revoke certificates: add them to DIR/crl.pem (re-signed by DIR's CA), and move each revoked
    DIR/NAME.crt aside to DIR/revoked/NAME/SERIAL.crt (its key is deleted), so that the next
    `issue` of NAME makes a new certificate.

    names: certificate names in DIR (their current NAME.crt); a name with no NAME.crt whose
    certificate was revoked before is unchanged, one never issued is an error. serials: hexadecimal
    serial numbers (certificates issued elsewhere, or already gone). check: report what would
    change, write nothing (modes included). Returns {"changed", "crl", "revoked": [{name, serial,
    changed}], "modes_fixed", ...}.
    """
    fixed = [] if check else secure_modes(directory)
    ca_cert, ca_key = _load_ca(directory)
    revoked = set(_revoked_serials(directory, ca_cert))
    items, moves, add = [], [], set()
    for name in names or ():
        _check_name(name)
        cert_path, key_path = _paths(directory, name)
        if not os.path.exists(cert_path):
            record = _revoked_record(directory, name)
            if not record:
                raise PKIError(f"no certificate {name!r} in {directory} ({name}.crt), and none revoked by that "
                               f"name; check the name, or revoke by --serial")
            items.append({"name": name, "serial": record[-1], "changed": False})
            continue
        cert = _load_cert(cert_path)
        if cert is None:
            raise PKIError(f"cannot read {cert_path} (not a PEM certificate); revoke it by --serial instead")
        serial = cert.serial_number
        items.append({"name": name, "serial": _serial_hex(serial), "changed": serial not in revoked})
        add.add(serial)
        moves.append((name, cert_path, key_path, serial))
    for text in serials or ():
        serial = _parse_serial(text)
        if serial == ca_cert.serial_number:
            raise PKIError("that serial is the CA's own; to replace the CA run `straggler pki init --force`")
        items.append({"name": None, "serial": _serial_hex(serial), "changed": serial not in revoked})
        add.add(serial)
    if not items:
        raise PKIError("say what to revoke: `straggler pki revoke --dir D NAME` or `--serial HEX`")
    # a certificate in DIR with a revoked serial is moved aside too, whatever name it was revoked by
    by_name = {m[0] for m in moves}
    for entry in sorted(os.listdir(directory)):
        name = entry[:-4]
        if not entry.endswith(".crt") or name == "ca" or name in by_name or not _NAME_RE.match(name):
            continue
        cert = _load_cert(os.path.join(directory, entry))
        if cert is not None and cert.serial_number in add:
            moves.append((name,) + _paths(directory, name) + (cert.serial_number,))
    changed = bool(add - revoked) or bool(moves)
    if check:
        crl = _crl_of_ca(directory, ca_cert)
        summary = {"changed": changed, "crl": _crl_path(directory), "check": True}
        if crl is None:
            summary["changed"] = True
    else:
        summary = _ensure_crl(directory, ca_cert, ca_key, add=add)
        summary["changed"] = summary["changed"] or bool(moves)
        for name, cert_path, key_path, serial in moves:
            folder = os.path.join(directory, REVOKED_DIR, name)
            os.makedirs(os.path.dirname(folder), mode=DIR_MODE, exist_ok=True)   # makedirs gives parents 0777-umask
            os.makedirs(folder, mode=DIR_MODE, exist_ok=True)
            os.replace(cert_path, os.path.join(folder, _serial_hex(serial) + ".crt"))
            try:
                os.unlink(key_path)
            except FileNotFoundError:
                pass
    summary["revoked"] = items
    summary["modes_fixed"] = fixed
    summary["changed"] = summary["changed"] or bool(fixed)
    return summary

