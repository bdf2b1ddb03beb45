"""`straggler watch`: arguments in, the live watch (straggler.analysis.watch), its events out as text
lines (with a live table in a terminal) or JSON lines, and --exec hooks at each onset."""
import json
import os
import signal
import subprocess
import sys
import threading

from ..analysis.watch import (DEFAULT_BASELINE_S, DEFAULT_INTERVAL_S, DEFAULT_WINDOW_S, EXIT_NO_AGENT, watch)
from ..errors import StragglerError, UsageError
from ..fleet.client import ANSWERED
from ..render import rich_cell
from ..render.events import format_event
from .common import add_tls_arguments, tls_options

EXEC_TIMEOUT_S = 60.0


def run_exec(command, event, timeout_s=EXEC_TIMEOUT_S):
    """Run --exec's command for an onset: the event as JSON on stdin and in STRAGGLER_* variables.
    In the background (bounded); its failure is reported on stderr, never stops the watch."""
    env = dict(os.environ)
    for key in ("event", "node", "rank", "cause", "share", "summary", "step_moved_s"):
        value = event.get(key)
        env[f"STRAGGLER_{key.upper()}"] = "" if value is None else str(value)
    payload = json.dumps(event, default=str).encode()

    def runner():
        try:
            proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            print(f"straggler watch: --exec failed to start: {exc}", file=sys.stderr, flush=True)
            return
        try:
            proc.communicate(payload, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            print(f"straggler watch: --exec still running after {timeout_s:g} s: killed", file=sys.stderr, flush=True)
            return
        if proc.returncode:
            print(f"straggler watch: --exec exited with status {proc.returncode}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=runner, name="straggler-watch-exec", daemon=False)
    thread.start()
    return thread


def add_arguments(parser):
    parser.add_argument("--nodes", required=True, help="the fleet's agents: host:port,… or a file with one per line")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
                        help=f"poll every S seconds (default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, metavar="S",
                        help=f"judge each rank's last S seconds (default {DEFAULT_WINDOW_S:g})")
    parser.add_argument("--baseline", type=float, default=DEFAULT_BASELINE_S, metavar="S",
                        help=f"... against up to S seconds before them (default {DEFAULT_BASELINE_S:g})")
    parser.add_argument("--json", action="store_true", help="JSON lines, one per event (for machines)")
    parser.add_argument("--exec", dest="exec_cmd", metavar="CMD",
                        help="run CMD (a shell command) at each onset: the finding as JSON on its stdin and in "
                             "STRAGGLER_NODE, STRAGGLER_CAUSE, STRAGGLER_RANK, STRAGGLER_SUMMARY, …")
    parser.add_argument("--until-straggler", action="store_true",
                        help="stop at the first onset with exit status 1 (for CI)")
    parser.add_argument("--timeout", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    parser.add_argument("--min-gap", type=float, default=None,
                        help="explain's --min-gap (the straggler waits at least this share less than the others)")
    parser.add_argument("--metrics-listen", metavar="ADDR:PORT",
                        help="serve the verdict as Prometheus metrics at /metrics here (the episode going on: node, "
                             "rank, cause, start; nodes answering); loopback only unless --metrics-any-address")
    parser.add_argument("--metrics-any-address", action="store_true",
                        help="let --metrics-listen bind a non-loopback address (it has no TLS)")
    add_tls_arguments(parser)


def run(args):
    tls = tls_options(args)
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be > 0 seconds")
    stop = threading.Event()
    execs = []
    table = None if args.json else _LiveTable.maybe()
    state, metrics_server = _start_metrics(args)

    def on_tick(verdict, feeds):
        if table is not None:
            table.update(verdict, feeds)
        if state is not None:
            state.on_tick(verdict, feeds)

    def on_event(e):
        if state is not None:
            state.on_event(e)
        if args.json:
            sys.stdout.write(json.dumps(e, default=str) + "\n")
            sys.stdout.flush()
        elif table is not None:
            table.print(format_event(e))
        else:
            sys.stdout.write(format_event(e) + "\n")
            sys.stdout.flush()
        if e["event"] == "onset" and args.exec_cmd:
            execs.append(run_exec(args.exec_cmd, e))

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if table is not None:
            table.start()
        code, _ = watch(args.nodes, tls, interval_s=args.interval, window_s=args.window, baseline_s=args.baseline,
                        timeout_s=args.timeout, until_straggler=args.until_straggler, on_event=on_event,
                        on_tick=on_tick, stop=stop, min_gap=args.min_gap)
    finally:
        if table is not None:
            table.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for thread in execs:
        thread.join(timeout=EXEC_TIMEOUT_S + 5)
    if code == EXIT_NO_AGENT:
        raise StragglerError(f"no agent answered during the watch ({args.nodes}): check the addresses, the agents "
                             f"(straggler status on each) and the certificates")
    return code


def _start_metrics(args):
    """(WatchState, server) for --metrics-listen, or (None, None)."""
    if not args.metrics_listen:
        return None, None
    from ..addresses import is_loopback, parse_listen
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import ThreadingWSGIServer, make_server, make_wsgi_app
    except ImportError as exc:
        raise StragglerError(f"--metrics-listen needs prometheus-client ({exc}): pip install prometheus-client") from None
    from ..render.watch_metrics import WatchCollector, WatchState
    host, port = parse_listen(args.metrics_listen, 9434, "--metrics-listen")
    if not is_loopback(host) and not args.metrics_any_address:
        raise UsageError(f"--metrics-listen {args.metrics_listen}: binds loopback only (no TLS); add "
                         f"--metrics-any-address to serve it on {host}")
    state = WatchState()
    registry = CollectorRegistry()
    registry.register(WatchCollector(state))
    try:
        server = make_server(host, port, make_wsgi_app(registry), ThreadingWSGIServer)
    except OSError as exc:
        raise StragglerError(f"cannot listen on {args.metrics_listen} for metrics: {exc.strerror or exc}") from None
    threading.Thread(target=server.serve_forever, name="straggler-watch-metrics", daemon=True).start()
    print(f"straggler watch: metrics at http://{args.metrics_listen}/metrics", file=sys.stderr, flush=True)
    return state, server


class _LiveTable:
    """A live per-node table in a terminal (rich), events printed above it."""

    def __init__(self, console, live_cls):
        self.console, self._live_cls, self.live = console, live_cls, None

    @classmethod
    def maybe(cls):
        if not sys.stdout.isatty():
            return None
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:
            return None
        return cls(Console(), Live)

    def start(self):
        self.live = self._live_cls(console=self.console, refresh_per_second=2, transient=True)
        self.live.start()

    def stop(self):
        if self.live is not None:
            self.live.stop()

    def print(self, line):
        self.console.print(line, highlight=False, markup=False, emoji=False)   # a safe_text line, printed as is

    def update(self, verdict, feeds):
        from rich.table import Table
        t = Table(title="straggler watch", expand=False)
        for c in ("node", "status", "rank", "waits", "run queue", "host", "sync", "io", "offset", "role"):
            t.add_column(c)
        rows = {n["node"]: n for n in (verdict.report.nodes if verdict.report else [])}
        for f in feeds:
            n = rows.get(f.node, {})
            offset = "" if f.offset_ns is None else f"{f.offset_ns / 1e6:+.1f} ms"
            cells = (f.node or f.address, "ok" if f.status in ANSWERED else f.status, n.get("rank", ""),
                     _pct(n.get("wait_pct")), _pct(n.get("runq_pct")), _pct(n.get("host_pct")), _pct(n.get("sync_pct")),
                     _pct(n.get("io_pct")), offset, (n.get("role") or "") + (f" ({verdict.cause})" if n.get("role") else ""))
            t.add_row(*[rich_cell(c) for c in cells])   # node names, statuses: text, never markup
        self.live.update(t)


def _pct(v):
    return "" if v is None else f"{v:g}%"
