"""`straggler pki`: the fleet's CA and certificates (straggler.pki), one summary line per action for
people or JSON with 'changed' for programs (the Ansible pki role reads it).

This module must hold no certificate logic (pki.py does)."""
import json

from ..pki import DEFAULT_CLIENT_ROLES, PKIError, init_ca, issue, revoke, write_crl
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
    p_crl.add_argument("--json", action="store_true", help="print a JSON summary with 'changed'")


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
    return summary, _modes_lines(summary) + [f"{_verb(summary)}: CA {summary['ca_cert']}, valid until "
                                             f"{summary['not_after']}"]


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
    summary = write_crl(args.dir, force=args.force)
    return summary, _modes_lines(summary) + [f"{_verb(summary)}: CRL {summary['crl']} "
                                             f"({len(summary['revoked_serials'])} revoked), valid until "
                                             f"{summary['next_update']}"]


ACTIONS = {"init": _run_init, "issue": _run_issue, "revoke": _run_revoke, "crl": _run_crl}


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
