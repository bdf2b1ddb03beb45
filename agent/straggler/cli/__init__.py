"""The `straggler` command line: the faces' layer. Arguments in, library calls, rendering out.

One module per command (straggler.cli.<command>), each exposing `add_arguments(parser)` and
`run(args) -> int`: argument parsing and rendering over the libraries (store, api, fleet, analysis,
pki), which hold no argparse and print nothing. This file only wires them up, importing a module
when its command runs (so `straggler query` never imports BCC).
"""
import argparse
import importlib
import sys

from .. import __version__
from ..errors import StragglerError
from ..text import safe_text

# name: (module, one-line help)
COMMANDS = {
    "trace": ("straggler.cli.trace", "trace CUDA/NCCL calls, scheduling and block I/O into the node's SQLite store (root)"),
    "status": ("straggler.cli.status", "the agent's probes, events/s, lost events, DB size and own CPU use"),
    "query": ("straggler.cli.query", "run read-only SQL against a node's database"),
    "snapshot": ("straggler.cli.snapshot", "write a consistent copy of a node's database (for collect/merge)"),
    "serve": ("straggler.cli.serve", "serve the node's database over HTTPS (mutual TLS) for the fleet client"),
    "fleet": ("straggler.cli.fleet", "run one SQL on every node at once, with clock offsets"),
    "pki": ("straggler.cli.pki", "create a fleet CA and issue node/client certificates"),
    "explain": ("straggler.cli.explain", "name the straggler node and the cause, with evidence and SQL"),
    "watch": ("straggler.cli.watch", "live: name the straggler and its cause seconds after it starts, while the "
                                    "job runs (polls every agent; alerts, JSON lines, --exec hooks)"),
    "merge": ("straggler.cli.merge", "merge node databases into one clock-aligned cluster database"),
    "export": ("straggler.cli.export", "export a database as a Perfetto timeline (native .pftrace, or Chrome JSON)"),
}


def build_parser(only=None):
    parser = argparse.ArgumentParser(prog="straggler", description="straggler: find the one slow node of a distributed GPU training job, and say why.")
    parser.add_argument("--version", action="version", version=f"straggler {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (modname, helptext) in COMMANDS.items():
        p = sub.add_parser(name, help=helptext, description=helptext)
        if only is None or name == only:
            mod = importlib.import_module(modname)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=only or "")
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except StragglerError as exc:
        print(f"straggler {args.command}: error: {safe_text(exc)}", file=sys.stderr)   # may quote what a node sent
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0

