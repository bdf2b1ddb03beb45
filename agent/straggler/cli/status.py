"""`straggler status`: what the node's agent is doing (straggler.store.status.collect_status), as
tables for people or JSON, and how the node's revocation list stands (tls.crl_status: a CRL near or
past its expiry, or missing, is said loudly, on stderr too).

This module must hold no reading of the store (store/status.py does)."""
import json
import sys

from .. import render
from ..store.status import collect_status
from ..text import fmt_bytes
from ..tls import DEFAULT_CRL, crl_status
from .common import add_db_argument

LOUD_CRL_STATES = ("expiring", "expired", "missing", "unreadable")


def status_rows(status):
    """The status dict as [label, value] rows for people."""
    def show(value, fmt="{}"):
        return "-" if value is None else fmt.format(value)
    lines = [
        ("node", show(status["node"])),
        ("ranks", ", ".join(str(r) for r in status["ranks"]) or "-"),
        ("agent version", show(status["agent_version"])),
        ("schema version", f"{show(status['schema_version'])} (this straggler reads {status['schema_version_supported']})"),
        ("probes attached", str(status["probes_attached"])),
        ("events/s", show(status["events_per_s"])),
        ("probe hits/s", show(status["probe_hits_per_s"])),
        ("agent CPU", show(status["agent_cpu_percent"], "{}% of one core (probes, writer, summaries, API)")),
        ("step-time summaries", "-" if status.get("summary_interval_s") is None else
         f"every {status['summary_interval_s']:g} s" + ("" if status.get("summary_age_s") is None else
                                                       f", newest {status['summary_age_s']:g} s old")
         + ("" if status.get("summary_cpu_percent") is None else
            f", {status['summary_cpu_percent']:g}% of one core to make")),
        ("GPUs", gpus_line(status.get("devices"))),
        ("agent RSS", fmt_bytes(status["agent_rss_bytes"])),
        ("lost events", f"{status['lost_events_total']} total, {status['lost_events_recent']} in the last minute"),
        ("DB size", f"{fmt_bytes(status['db_size_bytes'])} (WAL {fmt_bytes(status['wal_bytes'])})"),
    ]
    if status.get("crl"):
        lines.append(("CRL", status["crl"]["message"]))
    return [list(row) for row in lines]


def gpus_line(devices):
    """Whether the agent reads the GPUs and the Xid errors, in one line (status['devices'])."""
    if not devices or devices.get("read") is None:
        return "-"
    if not devices["read"]:
        return f"not read: {devices['why_not'] or '?'}"
    text = f"{devices['gpus']} read through NVML" + (
        f" every {devices['interval_s']:g} s" if devices.get("interval_s") else "") + (
        f" (driver {devices['driver']})" if devices.get("driver") else "")
    if devices.get("xid_read"):
        return text + f"; Xid errors from the kernel log: {devices.get('xid_errors') or 0}"
    return text + f"; Xid errors not read: {devices.get('xid_why_not') or '?'}"


def add_arguments(parser):
    add_db_argument(parser)
    parser.add_argument("--crl", default=DEFAULT_CRL, metavar="FILE",
                        help=f"the revocation list the agent uses, to say how long it has left (default {DEFAULT_CRL})")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args):
    status = collect_status(args.db)
    status["crl"] = crl_status(args.crl, expected=False)
    if status["crl"]["state"] in LOUD_CRL_STATES:
        print(f"straggler status: WARNING: the CRL {args.crl}: {status['crl']['message']}", file=sys.stderr)
    if args.json:
        sys.stdout.write(json.dumps(status, indent=2) + "\n")
        return 0
    render.print_table(["", "value"], status_rows(status), title=f"straggler status: {args.db}")
    if status["probes"]:
        render.print_table(["probe", "library"], [[p["name"], p["library"] or ""] for p in status["probes"]])
    if status["libraries"]:
        render.print_table(["library", "functions attached", "expected but missing"],
                           [[lib, str(len(v["attached"])), ", ".join(v["missing"]) or "-"]
                            for lib, v in sorted(status["libraries"].items())],
                           title="traced libraries")
    return 0
