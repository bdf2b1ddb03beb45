"""A small PKI for the fleet: one CA, server certificates for the agents, client certificates
for the people and playbooks that query them. Files live in one directory:

    DIR/ca.crt  DIR/ca.key (0600)  DIR/NAME.crt  DIR/NAME.key (0600)

Idempotent: `init_ca` keeps a valid CA, `issue` keeps a certificate that this CA signed, with
the same SANs and kind, that is not close to expiry; each reports changed / unchanged (the
Ansible pki role relies on that). Uses the `cryptography` package (controller side).

This module must not be imported by the agent core at start-up (only by `straggler pki`).
"""
import datetime
import ipaddress
import json
import os
import re
import tempfile

from .errors import StragglerError

CA_DAYS = 3650
CERT_DAYS = 825
RENEW_BEFORE_DAYS = 30
KINDS = ("server", "client")
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


def _not_after(cert):
    value = cert.not_valid_after
    return value.replace(tzinfo=datetime.timezone.utc) if value.tzinfo is None else value


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
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise PKIError(f"cannot create directory {directory}: {exc.strerror}; choose another --dir") from None
    if not os.access(directory, os.W_OK):
        raise PKIError(f"directory {directory} is not writable by this user; choose another --dir or run as its owner")


def _ca_is_valid(cert, key):
    if cert is None or key is None or not _same_public_key(cert, key):
        return False
    x509 = _crypto()[0]
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return basic.ca and _not_after(cert) - _now() > datetime.timedelta(days=RENEW_BEFORE_DAYS)


def init_ca(directory, common_name="straggler fleet CA", force=False):
    """Create DIR/ca.crt and DIR/ca.key (0600) unless a valid CA is there. Returns a summary dict."""
    x509, hashes, _, _, _, NameOID = _crypto()
    _ensure_dir(directory)
    cert_path, key_path = _paths(directory, "ca")
    cert, key = _load_cert(cert_path), _load_key(key_path)
    if not force and _ca_is_valid(cert, key):
        os.chmod(key_path, 0o600)
        return {"changed": False, "ca_cert": cert_path, "ca_key": key_path,
                "not_after": _not_after(cert).isoformat(), "subject": cert.subject.rfc4514_string()}
    # missing, broken, not a CA, or close to expiry: a new CA (every certificate must then be reissued,
    # which `issue` does by itself: it checks the signature against the current CA)
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
    _write_atomic(key_path, _key_pem(key), 0o600)
    _write_atomic(cert_path, _cert_pem(cert), 0o644)
    return {"changed": True, "ca_cert": cert_path, "ca_key": key_path,
            "not_after": _not_after(cert).isoformat(), "subject": cert.subject.rfc4514_string()}


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


def issue(directory, name, sans, kind="server", force=False):
    """Issue DIR/NAME.crt and DIR/NAME.key (0600), signed by DIR's CA, unless a matching one exists.

    kind 'server' (agents: extendedKeyUsage serverAuth) or 'client' (fleet client: clientAuth).
    sans: IP addresses and DNS names (prefix IP:/DNS: optional). The name itself is always added
    as a DNS SAN for server certificates, so a client may verify by node name.
    """
    x509, hashes, _, _, EKU, NameOID = _crypto()
    if kind not in KINDS:
        raise PKIError(f"unknown certificate kind {kind!r}; use one of {', '.join(KINDS)}")
    if not _NAME_RE.match(name or "") or name == "ca":
        raise PKIError(f"certificate name {name!r} is not usable as a file name (letters, digits, . _ -; not 'ca')")
    _ensure_dir(directory)
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
               "sans": [f"{t.upper()}:{v}" for t, v in wanted]}
    if (not force and cert is not None and key is not None and _same_public_key(cert, key)
            and _signed_by(cert, ca_cert) and _sans_of(cert) == wanted and _kind_of(cert) == kind
            and _not_after(cert) - _now() > datetime.timedelta(days=RENEW_BEFORE_DAYS)):
        os.chmod(key_path, 0o600)
        summary.update(changed=False, not_after=_not_after(cert).isoformat())
        return summary
    key = _new_key()
    now = _now()
    san_values = [x509.IPAddress(ipaddress.ip_address(v)) if t == "ip" else x509.DNSName(v) for t, v in wanted]
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
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
    _write_atomic(key_path, _key_pem(key), 0o600)
    _write_atomic(cert_path, _cert_pem(cert), 0o644)
    summary.update(changed=True, not_after=_not_after(cert).isoformat())
    return summary


# ---------------------------------------------------------------- CLI

def add_arguments(parser):
    sub = parser.add_subparsers(dest="pki_command", metavar="ACTION")
    p_init = sub.add_parser("init", help="create the fleet CA (DIR/ca.crt, DIR/ca.key) unless a valid one exists")
    p_init.add_argument("--dir", required=True, help="directory for the CA and certificates")
    p_init.add_argument("--name", default="straggler fleet CA", help="the CA's common name")
    p_init.add_argument("--force", action="store_true", help="replace an existing CA (every certificate must be reissued)")
    p_init.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")
    p_issue = sub.add_parser("issue", help="issue DIR/NAME.crt and DIR/NAME.key signed by DIR's CA")
    p_issue.add_argument("--dir", required=True, help="directory holding ca.crt and ca.key")
    p_issue.add_argument("--name", required=True, help="certificate name: the node name, or e.g. 'controller'")
    p_issue.add_argument("--san", action="append", default=[], metavar="IP|DNS",
                         help="subject alternative name (repeat, or comma-separated): the addresses clients connect to")
    p_issue.add_argument("--client", action="store_true", help="a client certificate (fleet client) instead of a server one")
    p_issue.add_argument("--force", action="store_true", help="reissue even if a matching certificate exists")
    p_issue.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")


def run(args):
    if args.pki_command == "init":
        summary = init_ca(args.dir, common_name=args.name, force=args.force)
        what = f"CA {summary['ca_cert']}"
    elif args.pki_command == "issue":
        summary = issue(args.dir, args.name, args.san, kind="client" if args.client else "server", force=args.force)
        what = f"{summary['kind']} certificate {summary['cert']} ({', '.join(summary['sans']) or 'no SAN'})"
    else:
        raise PKIError("say what to do: `straggler pki init --dir D` or `straggler pki issue --dir D --name N --san IP`")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{'created' if summary['changed'] else 'unchanged'}: {what}, valid until {summary['not_after']}")
    return 0
