"""Authorization by certificate (roles as subject OU attributes) and revocation (a CRL signed by
the fleet CA), over real TLS 1.3 handshakes on loopback: `straggler pki issue --role`,
`straggler pki revoke`, `straggler.tls.peer_roles` and `straggler.tls.ServerContextCache`.

The server here is a minimal one (a thread, plain ssl/socket) that takes each new connection's
context from ServerContextCache(opts).current(), completes the handshake and answers with
peer_roles(getpeercert()) as JSON; what a CRL that cannot be read does is seen through the agent's
own server (api/server.py), as a client sees it. Every socket has a timeout and every wait a hang
guard; no assertion judges how fast a change is picked up."""
import argparse
import datetime
import http.client
import json
import logging
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_api_helpers import REPO, make_node_db, venv_env, wait_until

from straggler import pki
from straggler.api.server import start_background
from straggler.cli.common import add_tls_arguments, tls_options
from straggler.tls import (DEFAULT_CRL, ROLE_OU_PREFIX, ROLE_QUERY, ROLE_SNAPSHOT, ROLES, ServerContextCache,
                           TLSError, TLSOptions, client_context, peer_roles)

ADDRESS = "127.0.0.1"
IO_TIMEOUT_S = 5.0
REVOCATION_GUARD_S = 30.0   # a new or unreadable CRL is looked for once a second: how long a test waits, never judged


# ---------------------------------------------------------------- a CA, a host, some clients

def _legacy_client_cert(directory: Path, name: str):
    """A client certificate as `straggler pki` issued them before roles existed: no OU at all."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                              serialization.PrivateFormat.PKCS8,
                                                              serialization.NoEncryption()))


class Fleet:
    """DIR: the controller's pki directory. host/: the agent's TLS directory as the pki role fills it
    (ca.crt, crl.pem, node.crt, node.key). clients/: copies of the client certificates as their
    holders keep them (a revoked certificate is moved aside in DIR, the leaked copy stays)."""

    def __init__(self, root: Path):
        self.dir = root / "pki"
        self.host = root / "host"
        self.clients = root / "clients"
        self.host.mkdir()
        self.clients.mkdir()
        assert pki.init_ca(str(self.dir))["changed"]
        pki.issue(str(self.dir), "agent", [ADDRESS], kind="server")
        pki.issue(str(self.dir), "controller", [], kind="client")                     # default: every role
        pki.issue(str(self.dir), "reader", [], kind="client", roles=[ROLE_QUERY])
        pki.issue(str(self.dir), "laptop", [], kind="client", roles=[ROLE_QUERY, ROLE_SNAPSHOT])
        _legacy_client_cert(self.dir, "legacy")
        for name in ("controller", "reader", "laptop", "legacy"):
            for ext in ("crt", "key"):
                shutil.copy(self.dir / f"{name}.{ext}", self.clients / f"{name}.{ext}")
        shutil.copy(self.dir / "agent.crt", self.host / "node.crt")
        shutil.copy(self.dir / "agent.key", self.host / "node.key")
        self.distribute()

    def distribute(self):
        """What the pki role does on the host: ca.crt and crl.pem, each replaced atomically."""
        for name in ("ca.crt", "crl.pem"):
            tmp = self.host / f".{name}.tmp"
            shutil.copy(self.dir / name, tmp)
            os.replace(tmp, self.host / name)

    def server_options(self, *extra) -> TLSOptions:
        """The agent's options from its command line, as the agent role writes it (no --crl: crl.pem
        beside --ca)."""
        parser = argparse.ArgumentParser()
        add_tls_arguments(parser)
        args = parser.parse_args(["--ca", str(self.host / "ca.crt"), "--cert", str(self.host / "node.crt"),
                                  "--key", str(self.host / "node.key"), *extra])
        return tls_options(args)

    def client(self, name) -> TLSOptions:
        return TLSOptions(ca=str(self.dir / "ca.crt"), cert=str(self.clients / f"{name}.crt"),
                          key=str(self.clients / f"{name}.key"))


@pytest.fixture()
def fleet(tmp_path):
    return Fleet(tmp_path)


class RoleServer:
    """Accepts one connection at a time; each handshake uses cache.current(); answers
    {"roles": [...]} and closes. Handshake errors are kept in .errors."""

    def __init__(self, cache: ServerContextCache):
        self.cache = cache
        self.errors = []
        self.handshakes = 0
        self._stop = threading.Event()
        self._sock = socket.create_server((ADDRESS, 0))
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="role-server", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=IO_TIMEOUT_S + 2)
        self._sock.close()
        assert not self._thread.is_alive(), "the test server thread did not end"

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(IO_TIMEOUT_S)
            try:
                with self.cache.current().wrap_socket(conn, server_side=True) as tls:
                    self.handshakes += 1
                    tls.sendall(json.dumps({"roles": sorted(peer_roles(tls.getpeercert()))}).encode() + b"\n")
            except (ssl.SSLError, OSError) as exc:
                self.errors.append(str(exc))
            finally:
                conn.close()


def ask_roles(port, options: TLSOptions):
    """Handshake as `options`' certificate and read the server's answer: the set of roles it saw.
    A certificate the server refuses raises ssl.SSLError (in TLS 1.3 the client learns it from the
    server's alert, on its first read)."""
    context = client_context(options)
    with socket.create_connection((ADDRESS, port), timeout=IO_TIMEOUT_S) as sock:
        with context.wrap_socket(sock, server_hostname=ADDRESS) as tls:
            data = b""
            deadline = time.monotonic() + IO_TIMEOUT_S
            while not data.endswith(b"\n") and time.monotonic() < deadline:
                chunk = tls.recv(4096)
                if not chunk:
                    break
                data += chunk
    return set(json.loads(data)["roles"])


def _refused(port, options):
    try:
        ask_roles(port, options)
    except ssl.SSLError as exc:
        return str(exc)
    return None


def _cli(*argv):
    out = subprocess.run([sys.executable, "-m", "straggler.cli", "pki", *argv], capture_output=True, text=True,
                         timeout=60, env=venv_env(), cwd=REPO)
    return out


# ---------------------------------------------------------------- tests

def test_peer_roles_reads_the_role_ous_of_a_getpeercert_dict():
    def cert(*ous):
        # getpeercert()'s subject: a tuple of RDNs, each a tuple of (name, value) pairs
        return {"subject": ((("commonName", "x"),),) + tuple((("organizationalUnitName", ou),) for ou in ous)}
    assert ROLES == ("query", "snapshot") and ROLE_OU_PREFIX == "straggler:"
    assert peer_roles(cert("straggler:query", "straggler:snapshot")) == {ROLE_QUERY, ROLE_SNAPSHOT}
    assert peer_roles(cert("straggler:snapshot")) == {ROLE_SNAPSHOT}
    assert peer_roles(cert("straggler:query", "straggler:admin")) == {ROLE_QUERY}      # unknown: ignored
    assert peer_roles(cert("straggler:admin")) == frozenset()                          # roles named, none known
    assert peer_roles(cert()) == {ROLE_QUERY}                                          # before roles: read-only
    assert peer_roles(cert("Engineering")) == {ROLE_QUERY}                             # not a role OU
    assert peer_roles({}) == frozenset() and peer_roles(None) == frozenset()           # no certificate


def test_roles_are_read_from_each_certificate_at_the_handshake(fleet):
    opts = fleet.server_options()
    assert opts.crl is None and opts.crl_path == str(fleet.host / "crl.pem")
    with RoleServer(ServerContextCache(opts)) as server:
        assert ask_roles(server.port, fleet.client("controller")) == {"query", "snapshot"}
        assert ask_roles(server.port, fleet.client("reader")) == {"query"}
        assert ask_roles(server.port, fleet.client("laptop")) == {"query", "snapshot"}
        assert ask_roles(server.port, fleet.client("legacy")) == {"query"}
    assert server.errors == [] and server.handshakes == 4


def test_a_revoked_certificate_fails_at_the_handshake_and_the_others_still_work(fleet):
    summary = pki.revoke(str(fleet.dir), names=["laptop"])
    assert summary["changed"] and summary["revoked"][0]["name"] == "laptop"
    fleet.distribute()
    with RoleServer(ServerContextCache(fleet.server_options())) as server:
        error = _refused(server.port, fleet.client("laptop"))
        assert error is not None and "revoked" in error, error
        assert ask_roles(server.port, fleet.client("controller")) == {"query", "snapshot"}
        assert ask_roles(server.port, fleet.client("reader")) == {"query"}
    assert any("revoked" in e for e in server.errors), server.errors


def test_revoking_after_the_server_started_takes_effect_without_a_restart(fleet):
    with RoleServer(ServerContextCache(fleet.server_options())) as server:
        assert ask_roles(server.port, fleet.client("laptop")) == {"query", "snapshot"}
        pki.revoke(str(fleet.dir), names=["laptop"])
        fleet.distribute()
        # the cache looks at the files at most once a second: a hang guard far beyond that, never a measure
        error = wait_until(lambda: _refused(server.port, fleet.client("laptop")), REVOCATION_GUARD_S, interval_s=0.1)
        assert error is not None and "revoked" in error, \
            f"the new CRL was not picked up in {REVOCATION_GUARD_S:g} s (the server was not restarted)"
        assert ask_roles(server.port, fleet.client("controller")) == {"query", "snapshot"}


def test_an_unreadable_crl_refuses_every_client_with_one_warning_until_a_readable_one_is_back(fleet, tmp_path,
                                                                                              caplog):
    """Fail closed, on the agent's own server: while its crl.pem cannot be read, every client,
    whatever its roles, is answered 503 with one line naming the file (the handshake still
    completes with the previous context, so the client learns why); the log says so once, not at
    every look (the server looks once a second; the cache below looks at every call); once a
    readable CRL is back they are served again, without a restart."""
    db = tmp_path / "node.db"
    make_node_db(db, "gpu-node-01", 0)
    clients = ("controller", "reader", "laptop")

    def ask(port, name):
        conn = http.client.HTTPSConnection(ADDRESS, port, context=client_context(fleet.client(name)),
                                           timeout=IO_TIMEOUT_S)
        try:
            conn.request("POST", "/api/v1/query", body=json.dumps({"sql": "SELECT 1"}),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    with caplog.at_level(logging.WARNING, logger="straggler.tls"), \
            start_background(str(db), listen=f"{ADDRESS}:0", tls=fleet.server_options()) as agent:
        before = {name: ask(agent.port, name)[0] for name in clients}
        (fleet.host / ".crl.tmp").write_text("not a CRL\n")
        os.replace(fleet.host / ".crl.tmp", fleet.host / "crl.pem")
        # the agent looks at its TLS files at most once a second: a hang guard far beyond that
        refusing = wait_until(lambda: ask(agent.port, "controller")[0] == 503, REVOCATION_GUARD_S, interval_s=0.1)
        refused = {name: ask(agent.port, name) for name in clients}
        fleet.distribute()                                 # a good CRL again
        serving = wait_until(lambda: ask(agent.port, "controller")[0] == 200, REVOCATION_GUARD_S, interval_s=0.1)
        after = {name: ask(agent.port, name)[0] for name in clients}
    assert before == {name: 200 for name in clients}
    assert refusing, f"clients were still served {REVOCATION_GUARD_S:g} s after the CRL became unreadable"
    for name, (code, answer) in refused.items():
        assert code == 503 and answer["kind"] == "crl", (name, code, answer)
        assert "refuses every client" in answer["error"] and "crl.pem" in answer["error"], answer
        assert "\n" not in answer["error"] and "Traceback" not in answer["error"], answer
    warnings = [r.getMessage() for r in caplog.records if r.name == "straggler.tls" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "crl.pem" in warnings[0] and "every client is refused" in warnings[0], warnings
    assert serving and after == {name: 200 for name in clients}, after
    # five looks at the unreadable file, one warning; every look refuses
    caplog.clear()
    cache = ServerContextCache(fleet.server_options(), check_interval_s=0.0)
    (fleet.host / ".crl.tmp").write_text("not a CRL\n")
    os.replace(fleet.host / ".crl.tmp", fleet.host / "crl.pem")
    with caplog.at_level(logging.WARNING, logger="straggler.tls"):
        refusals = []
        for _ in range(5):
            cache.current()
            refusals.append(cache.refusal(None))
    assert all(r is not None and r[0] == 503 for r in refusals), refusals
    warnings = [r.getMessage() for r in caplog.records if r.name == "straggler.tls" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "every client is refused" in warnings[0], warnings


def test_reissuing_with_other_roles_changes_the_certificate_and_the_cli_says_so(tmp_path):
    directory = str(tmp_path / "p")
    assert _cli("init", "--dir", directory, "--json").returncode == 0
    assert os.path.exists(os.path.join(directory, "crl.pem"))            # one exists after init
    issue = ["issue", "--dir", directory, "--name", "alice", "--client", "--json"]
    runs = []
    for roles in (["--role", "query"], ["--role", "query"], ["--role", "query", "--role", "snapshot"],
                  ["--role", "snapshot", "--role", "query"], []):
        out = _cli(*issue, *roles)
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        runs.append((summary["changed"], tuple(summary["roles"]), summary["serial"]))
    # without --role: query only, never both (the both-roles certificate is re-issued with less)
    assert [r[:2] for r in runs] == [(True, ("query",)), (False, ("query",)), (True, ("query", "snapshot")),
                                     (False, ("query", "snapshot")), (True, ("query",))]
    assert runs[0][2] == runs[1][2] != runs[2][2] == runs[3][2] != runs[4][2]
    text = _cli("issue", "--dir", directory, "--client", "alice", "--role", "query")     # --client NAME: the same
    assert text.returncode == 0 and text.stdout.startswith("unchanged: client certificate") and "roles query)" in text.stdout
    server_role = _cli("issue", "--dir", directory, "--name", "n1", "--san", ADDRESS, "--role", "query")
    assert server_role.returncode != 0 and len(server_role.stderr.strip().splitlines()) == 1


def test_a_client_certificate_without_a_role_may_query_only_and_the_command_says_so(tmp_path, fleet):
    """`straggler pki issue --client NAME` without --role: a certificate that queries and cannot copy a
    store (before: both roles), with a one-line note saying how to get more."""
    directory = str(tmp_path / "p")
    assert _cli("init", "--dir", directory).returncode == 0
    text = _cli("issue", "--dir", directory, "--client", "dave")
    assert text.returncode == 0 and text.stderr == "", text.stderr
    lines = text.stdout.strip().splitlines()
    assert len(lines) == 2 and "roles query)" in lines[0], lines
    assert lines[1] == ("note: no --role given: dave may query only; add --role snapshot for a certificate that "
                        "copies whole stores (collect)")
    summary = json.loads(_cli("issue", "--dir", directory, "--client", "erin", "--json").stdout)
    assert summary["roles"] == ["query"] and summary["note"].startswith("note: no --role given: erin may query only")
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(Path(directory, "dave.crt").read_bytes())
    assert [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATIONAL_UNIT_NAME)] == \
        [ROLE_OU_PREFIX + ROLE_QUERY]
    server = _cli("issue", "--dir", directory, "--name", "n2", "--san", ADDRESS)     # a server certificate: no note
    assert server.returncode == 0 and "note" not in server.stdout


def test_the_pki_directory_is_0700_its_keys_0600_and_looser_modes_are_tightened(tmp_path):
    """The controller's pki directory holds the CA key and every node's key: made 0700 (keys 0600)
    whatever the umask; a directory left 0755 by an older version, a revoked/ folder 0755 and a key
    0644 are tightened by the next action, which says so; a run with nothing to tighten says nothing."""
    directory = tmp_path / "p"
    old_umask = os.umask(0)
    try:
        assert _cli("init", "--dir", str(directory)).returncode == 0
        assert _cli("issue", "--dir", str(directory), "--name", "n1", "--san", ADDRESS).returncode == 0
        assert _cli("issue", "--dir", str(directory), "--client", "frank").returncode == 0
        assert _cli("revoke", "--dir", str(directory), "frank").returncode == 0
    finally:
        os.umask(old_umask)
    mode = lambda path: stat.S_IMODE(os.stat(path).st_mode)   # noqa: E731
    assert (mode(directory), mode(directory / "revoked")) == (0o700, 0o700)
    assert {p.name: mode(p) for p in directory.glob("*.key")} == {"ca.key": 0o600, "n1.key": 0o600}
    os.chmod(directory, 0o755)
    os.chmod(directory / "revoked", 0o755)
    os.chmod(directory / "n1.key", 0o644)
    out = _cli("crl", "--dir", str(directory))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == [f"fixed mode: {directory}: 0755 -> 0700",
                                           f"fixed mode: {directory / 'revoked'}: 0755 -> 0700",
                                           f"fixed mode: {directory / 'n1.key'}: 0644 -> 0600"]
    assert (mode(directory), mode(directory / "revoked"), mode(directory / "n1.key")) == (0o700, 0o700, 0o600)
    again = json.loads(_cli("crl", "--dir", str(directory), "--json").stdout)
    assert again["modes_fixed"] == [] and again["changed"] is False
    os.chmod(directory / "ca.key", 0o640)
    issued = json.loads(_cli("issue", "--dir", str(directory), "--name", "n1", "--san", ADDRESS, "--json").stdout)
    assert issued["modes_fixed"] == [f"{directory / 'ca.key'}: 0640 -> 0600"]
    assert (issued["changed"], issued["written"]) == (True, False)       # the certificate itself is kept


def test_revoke_is_idempotent_and_a_new_issue_replaces_the_certificate(tmp_path):
    directory = str(tmp_path / "p")
    assert _cli("init", "--dir", directory).returncode == 0
    first_cert = pki.issue(directory, "bob", [], kind="client", roles=[ROLE_QUERY])
    runs = []
    for _ in range(2):
        out = _cli("revoke", "--dir", directory, "bob", "--json")
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout))
    assert [r["changed"] for r in runs] == [True, False]
    assert runs[1]["revoked_serials"] == [first_cert["serial"]]
    again = _cli("revoke", "--dir", directory, "bob")
    assert again.returncode == 0 and again.stdout.startswith("unchanged:"), again.stdout
    assert not os.path.exists(os.path.join(directory, "bob.key"))
    # the next issue makes a new certificate (the CLI's way to replace a leaked one)
    second = pki.issue(directory, "bob", [], kind="client", roles=[ROLE_QUERY])
    assert second["changed"] and second["serial"] != first_cert["serial"]
    assert not pki.issue(directory, "bob", [], kind="client", roles=[ROLE_QUERY])["changed"]
    # by serial: idempotent too; check mode writes nothing
    crl_before = Path(directory, "crl.pem").read_bytes()
    checked = pki.revoke(directory, serials=[second["serial"]], check=True)
    assert checked["changed"] and Path(directory, "crl.pem").read_bytes() == crl_before
    assert pki.revoke(directory, serials=[second["serial"]])["changed"]
    assert not pki.revoke(directory, serials=[second["serial"]])["changed"]
    crl = _cli("crl", "--dir", directory, "--json")
    assert crl.returncode == 0 and json.loads(crl.stdout)["changed"] is False
    assert len(json.loads(crl.stdout)["revoked_serials"]) == 2
    unknown = _cli("revoke", "--dir", directory, "nobody")
    assert unknown.returncode != 0 and len(unknown.stderr.strip().splitlines()) == 1


def test_the_crl_is_renewed_before_next_update_and_rebuilt_when_lost(tmp_path, monkeypatch):
    directory = str(tmp_path / "p")
    monkeypatch.setattr(pki, "CRL_DAYS", 100)                # a CRL signed long ago: 100 days left
    pki.init_ca(directory)
    gone = pki.issue(directory, "gone", [], kind="client")
    short = pki.revoke(directory, names=["gone"])
    monkeypatch.setattr(pki, "CRL_DAYS", 365)
    renewed = pki.write_crl(directory)
    assert renewed["changed"] and renewed["next_update"] > short["next_update"]
    assert renewed["revoked_serials"] == [gone["serial"]]
    assert not pki.write_crl(directory)["changed"] and not pki.init_ca(directory)["changed"]
    # crl.pem lost: init writes a new one, with the certificates revoked before (from revoked/)
    os.unlink(os.path.join(directory, "crl.pem"))
    again = pki.init_ca(directory)
    assert again["changed"] and pki.write_crl(directory)["revoked_serials"] == [gone["serial"]]


def test_a_missing_crl_given_with_dash_dash_crl_is_one_line(fleet, tmp_path):
    missing = str(tmp_path / "missing" / "crl.pem")
    opts = fleet.server_options("--crl", missing)
    with pytest.raises(TLSError) as caught:
        ServerContextCache(opts)
    message = str(caught.value)
    assert "\n" not in message and missing in message and "--crl" in message
    # without --crl a missing crl.pem beside the CA is fine (no CRL), and a present one is loaded
    os.unlink(fleet.host / "crl.pem")
    plain = ServerContextCache(fleet.server_options()).current()
    assert not plain.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
    explicit = ServerContextCache(fleet.server_options("--crl", str(fleet.dir / "crl.pem"))).current()
    assert explicit.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
    assert TLSOptions().crl_path == DEFAULT_CRL


def test_the_pki_commands_reach_the_user_without_a_warning(tmp_path):
    """Every action, each run twice (the second reads what the first wrote: the CA's and a
    certificate's expiry, the CRL's nextUpdate and its entries' revocation dates), with every
    warning an error: cryptography's deprecated naive-datetime properties (a
    CryptographyDeprecationWarning, a UserWarning) or any DeprecationWarning would fail it."""
    directory = str(tmp_path / "p")
    steps = [("init",), ("issue", "--name", "agent", "--san", ADDRESS), ("issue", "--client", "laptop"),
             ("revoke", "laptop"), ("crl",), ("crl", "--force", "--json")]
    for action, *rest in steps + steps:
        out = subprocess.run([sys.executable, "-W", "error", "-m", "straggler.cli", "pki", action, "--dir", directory,
                              *rest], capture_output=True, text=True, timeout=60, env=venv_env(), cwd=REPO)
        assert out.returncode == 0 and out.stderr == "", (action, rest, out.stderr[-2000:])
        assert out.stdout.strip()


def test_dates_from_a_cryptography_without_the_utc_properties_are_read_as_utc():
    """cryptography before 42 has only the naive properties (in UTC): pki reads them as aware UTC."""
    import types
    naive = datetime.datetime(2030, 1, 2, 3, 4, 5)
    older = types.SimpleNamespace(not_valid_after=naive, next_update=None)
    assert pki._utc_time(older, "not_valid_after") == naive.replace(tzinfo=datetime.timezone.utc)
    assert pki._utc_time(older, "next_update") is None
    newer = types.SimpleNamespace(not_valid_after_utc=naive.replace(tzinfo=datetime.timezone.utc))
    assert pki._utc_time(newer, "not_valid_after").tzinfo is datetime.timezone.utc


# ---------------------------------------------------------------- a revocation is never undone

def _crl_state(directory):
    from cryptography import x509
    crl = x509.load_pem_x509_crl((Path(directory) / "crl.pem").read_bytes())
    number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    return number, {e.serial_number for e in crl}


def test_the_newest_revocation_list_wins_and_lists_that_revoked_apart_are_joined(tmp_path):
    """`straggler pki crl --adopt`: an older list (the controller's own or a host's) never wins; another
    CA's is left out and named; two controllers that each revoked a certificate from the same list end
    with both revoked, under a number above either."""
    a, b, other = tmp_path / "a", tmp_path / "b", tmp_path / "other"
    pki.init_ca(str(a))
    pki.init_ca(str(other))
    for name in ("laptop", "runner"):
        pki.issue(str(a), name, [], kind="client")
    shutil.copytree(a, b)
    pki.revoke(str(a), ["laptop"])                   # A: number 2, laptop
    pki.revoke(str(b), ["runner"])                   # B, apart: number 2, runner
    newest_a = (a / "crl.pem").read_bytes()
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "straggler"), "pki", "crl", "--dir", str(b), "--json",
                           "--adopt", str(a / "crl.pem"), "--adopt", str(other / "crl.pem")],
                          capture_output=True, text=True, timeout=120, env=venv_env())
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["joined"] and summary["foreign"] == ["crl"] and summary["changed"]
    number, revoked = _crl_state(b)
    assert number == 3 and len(revoked) == 2
    # an older list offered back to A is not adopted: A keeps its own, and says the other is behind
    shutil.copy(a / "crl.pem", tmp_path / "a-now.pem")
    before = pki.adopt_crls(str(a), [("old-host", str(tmp_path / "a-now.pem"))])
    assert before["changed"] is False and (a / "crl.pem").read_bytes() == newest_a
    older = tmp_path / "older.pem"                   # this CA's, number 1 (rebuilt from A's revoked/: laptop)
    shutil.copytree(a, tmp_path / "a-copy")
    (tmp_path / "a-copy" / "crl.pem").unlink()
    pki.write_crl(str(tmp_path / "a-copy"))
    shutil.copy(tmp_path / "a-copy" / "crl.pem", older)
    assert _crl_state(tmp_path / "a-copy")[0] == 1
    summary = pki.adopt_crls(str(a), [("h1", str(older)), ("h2", str(b / "crl.pem"))])
    assert summary["adopted_from"] == "h2" and _crl_state(a) == (3, revoked)
    assert summary["behind"] == ["h1"]


def test_a_host_certificate_is_adopted_only_when_this_ca_signed_it_and_it_is_not_revoked(tmp_path):
    a, other = tmp_path / "a", tmp_path / "other"
    pki.init_ca(str(a))
    pki.init_ca(str(other))
    pki.issue(str(a), "n1", ["10.0.0.1"])
    pki.issue(str(other), "n1", ["10.0.0.1"])
    held = (a / "n1.crt").read_text() + (a / "n1.key").read_text()
    foreign = (other / "n1.crt").read_text() + (other / "n1.key").read_text()
    controller = tmp_path / "controller"
    shutil.copytree(a, controller)
    for name in ("n1.crt", "n1.key"):
        (controller / name).unlink()
    assert pki.adopt_certificate(str(controller), "n1", foreign)["reason"] == "not signed by this CA"
    assert not (controller / "n1.crt").exists()
    mixed = (a / "n1.crt").read_text() + (other / "n1.key").read_text()
    assert pki.adopt_certificate(str(controller), "n1", mixed)["reason"] == "the key is not the certificate's"
    assert pki.adopt_certificate(str(controller), "n1", held)["adopted"] is True
    assert (controller / "n1.crt").read_text() == (a / "n1.crt").read_text()
    pki.revoke(str(controller), ["n1"])
    summary = pki.adopt_certificate(str(controller), "n1", held)
    assert summary["reason"] == "revoked" and not summary["adopted"] and not (controller / "n1.crt").exists()


def test_a_ca_that_init_replaces_is_kept_first_and_check_ca_writes_nothing(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    pki.init_ca(str(a))
    pki.init_ca(str(b))
    wrong_pair = (a / "ca.crt").read_text() + (b / "ca.key").read_text()
    assert pki.check_ca(wrong_pair)["reason"] == "the key does not belong to the certificate"
    assert pki.check_ca((a / "ca.crt").read_text() + (a / "ca.key").read_text())["ok"]
    old = {name: (a / name).read_bytes() for name in ("ca.crt", "crl.pem")}
    (a / "ca.key").write_bytes((b / "ca.key").read_bytes())           # the wrong key pasted over the right one
    summary = pki.init_ca(str(a))                                      # not a usable pair: a new CA ...
    assert summary["changed"] and summary["backup"]
    kept = Path(summary["backup"])                                      # ... and what it replaced, kept
    assert (kept / "ca.crt").read_bytes() == old["ca.crt"] and (kept / "crl.pem").read_bytes() == old["crl.pem"]
    assert (kept / "ca.key").read_bytes() == (b / "ca.key").read_bytes()
    assert stat.S_IMODE((kept / "ca.key").stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "straggler"), "pki", "check-ca"], input=wrong_pair,
                          capture_output=True, text=True, timeout=60, env=venv_env())
    assert proc.returncode != 0 and "not a usable CA: the key does not belong to the certificate" in proc.stderr


def test_an_rsa_ca_is_refused_and_two_replacements_in_one_second_keep_both(tmp_path):
    """check_ca refuses a CA whose key is not EC (its certificates would look foreign and be issued again
    on every run); init's backups of two replacements in the same second are both kept."""
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsa CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=400))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))
    pem = (cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())).decode()
    assert "not an elliptic-curve key" in pki.check_ca(pem)["reason"]
    a = tmp_path / "a"
    pki.init_ca(str(a))
    backups = []
    for _ in range(2):
        (a / "ca.key").write_text("not a key\n")
        backups.append(pki.init_ca(str(a))["backup"])
    assert len(set(backups)) == 2 and all(Path(b, "ca.key").read_text() == "not a key\n" for b in backups)
