"""`straggler pki`: the fleet's CA and certificates (straggler.pki), one summary line per action for
people or JSON with 'changed' for programs (the Ansible pki role reads it).

This module must hold no certificate logic (pki.py does)."""
import json

import os
import sys

from ..pki import (DEFAULT_CLIENT_ROLES, PKIError, adopt_certificate, adopt_crls, check_ca, init_ca, issue, revoke,
                   write_crl)
from ..tls import ROLES


def add_arguments(parser):
    sub = parser.add_subparsers(dest="pki_command", metavar="ACTION")
    p_init = sub.add_parser("init", help="create the fleet CA (DIR/ca.crt, DIR/ca.key) unless a valid one exists")
    p_init.add_argument("--dir", required=True, help="directory for the CA and certificates")
    p_init.add_argument("--name", default="straggler fleet CA", help="the CA's common name")
    p_init.add_argument("--force", action="store_true", help="replace an existing CA (every certificate must be reissued)")
    p_init.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")
    p_issue = sub.add_parser("issue", help="issue DIR/NAME.crt and DIR/NAME.key signed by DIR's CA")
    p_issue.add_argument("--dir", required=True, help="directory holding ca.crt and ca.key")
    p_issue.add_argument("--name", help="certificate name: the node name, or e.g. 'controller'")
    p_issue.add_argument("--san", action="append", default=[], metavar="IP|DNS",
                         help="subject alternative name (repeat, or comma-separated): the addresses clients connect to")
    p_issue.add_argument("--client", nargs="?", const=True, default=False, metavar="NAME",
                         help="a client certificate (fleet client) instead of a server one; `--client NAME` is "
                              "short for `--name NAME --client`")
    p_issue.add_argument("--role", action="append", choices=ROLES, default=None, dest="roles",
                         help="client certificate: a role it grants (repeat): 'query' (read-only SQL, clock, health, "
                              f"live, metrics), 'snapshot' (the whole store); default {', '.join(DEFAULT_CLIENT_ROLES)} "
                              f"only. A certificate with other roles is re-issued")
    p_issue.add_argument("--force", action="store_true", help="reissue even if a matching certificate exists")
    p_issue.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")
    p_revoke = sub.add_parser("revoke", help="revoke certificates: add them to DIR/crl.pem (signed by DIR's CA)")
    p_revoke.add_argument("--dir", required=True, help="directory holding ca.crt and ca.key")
    p_revoke.add_argument("names", nargs="*", metavar="NAME", help="certificate name (DIR/NAME.crt); repeatable")
    p_revoke.add_argument("--serial", action="append", default=[], metavar="HEX",
                          help="revoke by serial number (hexadecimal, as `openssl x509 -noout -serial` prints it)")
    p_revoke.add_argument("--check", action="store_true", help="only report whether anything would change")
    p_revoke.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")
    p_crl = sub.add_parser("crl", help="(re)write DIR/crl.pem, the CA's revocation list, when missing or near nextUpdate")
    p_crl.add_argument("--dir", required=True, help="directory holding ca.crt and ca.key")
    p_crl.add_argument("--force", action="store_true", help="re-sign even if the current CRL is fine")
    p_crl.add_argument("--adopt", action="append", default=[], metavar="FILE",
                       help="a revocation list a host holds (repeatable): the one of this CA with the highest CRL "
                            "number wins (DIR's own included); lists that revoke serials it lacks are joined; an "
                            "older one is never adopted")
    p_crl.add_argument("--adopt-dir", metavar="DIR", help="every *.pem in DIR as --adopt (named by file name)")
    p_crl.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")
    p_check = sub.add_parser("check-ca", help="check a CA certificate and its key (PEM on stdin) before it is brought: "
                                              "the pair matches, a CA's, not expiring; writes nothing")
    p_check.add_argument("--json", action="store_true", help="print a JSON summary with 'ok' and 'reason'")
    p_adopt = sub.add_parser("adopt", help="keep the certificate and key a host holds (PEM on stdin) as DIR/NAME.crt "
                                           "and .key, only when this CA signed it and it is not revoked")
    p_adopt.add_argument("--dir", required=True, help="directory holding ca.crt, ca.key and crl.pem")
    p_adopt.add_argument("--name", required=True, help="the certificate's name (the node name)")
    p_adopt.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")


def _verb(summary):
    return "created" if summary.get("written", summary["changed"]) else "unchanged"


def _issued_name(args):
    """The certificate's name from --name and/or `--client NAME` (which must agree)."""
    name = args.name
    if isinstance(args.client, str):
        if name and name != args.client:
            raise PKIError(f"--client {args.client} and --name {name} disagree; give the name once")
        name = args.client
    if not name:
        raise PKIError("say which certificate: --name NAME (or --client NAME for a client certificate)")
    return name


def _modes_lines(summary):
    """One line per mode the action tightened in the pki directory (it holds private keys)."""
    return [f"fixed mode: {fix}" for fix in summary.get("modes_fixed") or ()]


def _run_init(args):
    summary = init_ca(args.dir, common_name=args.name, force=args.force)
    lines = _modes_lines(summary) + [f"{_verb(summary)}: CA {summary['ca_cert']}, valid until {summary['not_after']}"]
    if summary.get("backup"):
        lines.append(f"kept what it replaced in {summary['backup']}")
    return summary, lines


def _run_issue(args):
    name, roles, note = _issued_name(args), args.roles, None
    if args.client and roles is None:
        roles = list(DEFAULT_CLIENT_ROLES)
        note = (f"note: no --role given: {name} may {', '.join(roles)} only; add --role snapshot for a "
                f"certificate that copies whole stores (collect)")
    summary = issue(args.dir, name, args.san, kind="client" if args.client else "server", force=args.force,
                    roles=roles)
    if note:
        summary["note"] = note
    granted = f"; roles {', '.join(summary['roles'])}" if summary["roles"] else ""
    what = f"{summary['kind']} certificate {summary['cert']} ({', '.join(summary['sans']) or 'no SAN'}{granted})"
    return summary, _modes_lines(summary) + [f"{_verb(summary)}: {what}, valid until {summary['not_after']}"] + \
        ([note] if note else [])


def _run_revoke(args):
    summary = revoke(args.dir, names=args.names, serials=args.serial, check=args.check)
    lines = _modes_lines(summary)
    for item in summary["revoked"]:
        label = item["name"] or "certificate"
        verb = ("would revoke" if args.check else "revoked") if item["changed"] else "unchanged"
        suffix = "" if item["changed"] else " (already revoked)"
        lines.append(f"{verb}: {label} serial {item['serial']}{suffix}, CRL {summary['crl']}")
    return summary, lines


def _run_crl(args):
    candidates = [(os.path.basename(p).rsplit(".", 1)[0], p) for p in args.adopt]
    if args.adopt_dir:
        try:
            names = sorted(f for f in os.listdir(args.adopt_dir) if f.endswith(".pem"))
        except OSError as e:
            raise PKIError(f"cannot read --adopt-dir {args.adopt_dir}: {e.strerror}") from None
        candidates += [(f[:-4], os.path.join(args.adopt_dir, f)) for f in names]
    if args.adopt or args.adopt_dir:
        if args.force:
            raise PKIError("--force re-signs DIR's own list: give it without --adopt/--adopt-dir")
        summary = adopt_crls(args.dir, candidates)
        lines = _modes_lines(summary) + [
            f"{_verb(summary)}: CRL {summary['crl']} number {summary['crl_number']} "
            f"({len(summary['revoked_serials'])} revoked)"
            + (f", adopted from {summary['adopted_from']}" if summary["adopted_from"] else "")
            + (", joined from lists that revoked apart" if summary["joined"] else "")]
        if summary["behind"]:
            lines.append(f"older or different lists (they get this one when installed): {', '.join(summary['behind'])}")
        if summary["foreign"]:
            lines.append(f"not this CA's or unreadable, left out: {', '.join(summary['foreign'])}")
        return summary, lines
    summary = write_crl(args.dir, force=args.force)
    return summary, _modes_lines(summary) + [f"{_verb(summary)}: CRL {summary['crl']} "
                                             f"({len(summary['revoked_serials'])} revoked), valid until "
                                             f"{summary['next_update']}"]


def _run_adopt(args):
    summary = adopt_certificate(args.dir, args.name, sys.stdin.read(1 << 20))
    verb = "adopted" if summary["changed"] else ("kept" if summary["adopted"] else "not adopted")
    return summary, _modes_lines(summary) + [f"{verb}: {args.name} ({summary['reason']})"]


def _run_check_ca(args):
    summary = check_ca(sys.stdin.read(1 << 20))
    summary["changed"] = False
    if not summary["ok"] and not args.json:
        raise PKIError(f"not a usable CA: {summary['reason']}")
    return summary, [f"usable CA: {summary['subject']}, valid until {summary['not_after']}"]


ACTIONS = {"check-ca": _run_check_ca, "init": _run_init, "issue": _run_issue, "revoke": _run_revoke, "crl": _run_crl, "adopt": _run_adopt}


def run(args):
    action = ACTIONS.get(args.pki_command)
    if action is None:
        raise PKIError("say what to do: `straggler pki init --dir D`, `straggler pki issue --dir D --name N --san IP`, "
                       "`straggler pki revoke --dir D NAME` or `straggler pki crl --dir D`")
    summary, lines = action(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for line in lines:
            print(line)
    return 0
