"""`straggler trace`: the node agent's command. Parses the arguments into an AgentOptions, runs the
Agent (straggler.agent) and renders what it reports as lines on stderr, among them the ready
signal, printed once every probe is attached:

    straggler: tracing (N probes) node=NODE db=PATH

This module must hold no tracing logic (agent.py does; it loads BCC only when the agent starts).
"""
import argparse
import sys

from ..agent import Agent, AgentEvents, AgentOptions
from ..durations import parse_duration
from ..network.monitor import NOUNS
from ..probes import RECORD_RULE
from ..store.writer import parse_size
from .common import add_metrics_arguments, add_tls_arguments, tls_options

# The ready signal (a test, a role or a script waits for it); api= is added when --listen serves.
READY_LINE = "straggler: tracing ({probes} probes) node={node} db={db}"
DEFAULT_MAX_DB = "1G"


def add_arguments(parser):
    defaults = AgentOptions   # the options' defaults are the command's
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (RECORD_RULE + "\n\nReady signal: once every probe is attached, one line on stderr:\n"
                     "  " + READY_LINE.format(probes="N", node="NODE", db="PATH") + "\n"
                     "SIGTERM/SIGINT: flush and exit 0. Needs root.")
    parser.add_argument("--node", help="node name stamped on every event (default: the hostname; no ':')")
    parser.add_argument("--db", default=defaults.db, help=f"SQLite database (default {defaults.db})")
    parser.add_argument("--duration", metavar="TIME",
                        help="stop after this long: seconds (300) or with a unit (90s, 5m, 1h, 2d) "
                             "(default: until SIGTERM/SIGINT)")
    parser.add_argument("--pid", type=int, action="append", default=[], metavar="PID",
                        help="trace this process and its children (repeatable)")
    parser.add_argument("--comm", action="append", default=[], metavar="PATTERN",
                        help="trace processes whose name matches this glob (repeatable). Default without --pid/--comm: "
                             "every process that maps a CUDA library")
    parser.add_argument("--cuda-lib", action="append", default=[], metavar="PATH",
                        help="also attach to this CUDA/NCCL library (repeatable); libraries mapped by processes and in "
                             "the usual install paths (with --scope host) are found without it")
    parser.add_argument("--scope", choices=["host", "netns"], default=defaults.scope,
                        help="host: every process (default); netns: only processes in the agent's network namespace")
    parser.add_argument("--record-all", action="store_true", help="a row for every call (see below)")
    parser.add_argument("--no-collective-rows", dest="collective_rows", action="store_false",
                        help="no row for every collective and synchronize call (by default each one gets a row, so "
                             "that explain can line up the ranks step by step: the time the job loses to imbalance "
                             "that moves)")
    parser.add_argument("--sample", type=int, default=defaults.sample, metavar="N",
                        help=f"also record a random 1 in N of the other calls (default {defaults.sample}; 0: none)")
    parser.add_argument("--slow-factor", type=float, default=defaults.slow_factor, metavar="F",
                        help=f"a call >= F x the running median of its op is slow (default {defaults.slow_factor:g})")
    parser.add_argument("--slow-floor-us", type=float, default=defaults.slow_floor_us, metavar="US",
                        help=f"a call >= US microseconds is always slow (default {defaults.slow_floor_us:g})")
    parser.add_argument("--interval", type=float, default=defaults.interval_s, metavar="S",
                        help="aggregation / cost / clock-pair interval, and the unit of retention "
                             f"(default {defaults.interval_s:g})")
    parser.add_argument("--summary-interval", type=float, default=defaults.summary_interval_s, metavar="S",
                        help="the step-time model's summaries (thread_time: what explain, watch and /metrics read) "
                             f"every S seconds (default {defaults.summary_interval_s:g})")
    parser.add_argument("--rescan", type=float, default=defaults.rescan_s, metavar="S",
                        help=f"look for new processes and libraries every S seconds (default {defaults.rescan_s:g})")
    parser.add_argument("--max-db", default=DEFAULT_MAX_DB, metavar="BYTES",
                        help="keep the database (with its WAL) under this size, dropping the oldest whole intervals "
                             f"(default {DEFAULT_MAX_DB}; K/M/G suffixes; 0: no limit)")
    parser.add_argument("--max-age", metavar="TIME", help="drop data older than this: seconds or 90s, 5m, 1h, 2d")
    parser.add_argument("--ringbuf-kb", type=int, default=defaults.ringbuf_kb, metavar="KB",
                        help=f"size of the ring buffer for calls (default {defaults.ringbuf_kb})")
    parser.add_argument("--sys-ringbuf-kb", type=int, default=defaults.sys_ringbuf_kb, metavar="KB",
                        help="size of the ring buffer for scheduling, block I/O and process events "
                             f"(default {defaults.sys_ringbuf_kb})")
    parser.add_argument("--gpu-interval", type=float, default=defaults.gpu_interval_s, metavar="S",
                        help="read every GPU through NVML (nvidia-ml-py) every S seconds into gpu_samples "
                             f"(default {defaults.gpu_interval_s:g}); docs/devices.md")
    parser.add_argument("--no-gpu", action="store_true",
                        help="read neither the GPUs (NVML) nor the kernel's Xid errors")
    parser.add_argument("--net-interval", type=float, default=defaults.net_interval_s, metavar="S",
                        help="read every network interface and RDMA port (sysfs) every S seconds into net_samples and "
                             f"rdma_samples (default {defaults.net_interval_s:g}); docs/network.md")
    parser.add_argument("--no-net", action="store_true", help="read neither the network interfaces nor the RDMA ports")
    parser.add_argument("--sysfs-root", default=defaults.sysfs_root, metavar="DIR",
                        help=f"where sysfs is, for a stand-in tree in tests (default {defaults.sysfs_root})")
    parser.add_argument("--no-net-flows", action="store_true",
                        help="do not trace the traced processes' TCP connections (net_flows: bytes, RTT, retransmits "
                             "per connection, from tracepoints)")
    parser.add_argument("--listen", metavar="ADDR:PORT",
                        help="also serve the database's API while tracing (as `straggler serve`)")
    add_tls_arguments(parser)
    add_metrics_arguments(parser)


def agent_options(args):
    """The AgentOptions of parsed arguments (UsageError, one line, for a bad value)."""
    return AgentOptions(
        node=args.node, db=args.db,
        duration_s=parse_duration(args.duration, "--duration") if args.duration is not None else None,
        pids=list(args.pid), comms=list(args.comm), cuda_libs=list(args.cuda_lib), scope=args.scope,
        record_all=args.record_all, collective_rows=args.collective_rows, sample=args.sample, slow_factor=args.slow_factor,
        slow_floor_us=args.slow_floor_us, interval_s=args.interval, summary_interval_s=args.summary_interval,
        rescan_s=args.rescan, max_db_bytes=parse_size(args.max_db),
        max_age_s=parse_duration(args.max_age, "--max-age") if args.max_age is not None else None,
        ringbuf_kb=args.ringbuf_kb, sys_ringbuf_kb=args.sys_ringbuf_kb, listen=args.listen, tls=tls_options(args),
        metrics_listen=args.metrics_listen, metrics_any_address=args.metrics_any_address,
        gpu=not args.no_gpu, gpu_interval_s=args.gpu_interval,
        net=not args.no_net, net_interval_s=args.net_interval, sysfs_root=args.sysfs_root,
        net_flows=not args.no_net_flows)


def _say(line):
    print(line, file=sys.stderr, flush=True)


class StderrEvents(AgentEvents):
    """The agent's reports as lines on stderr."""

    def ready(self, probes, node, db, api_url):
        _say(READY_LINE.format(probes=probes, node=node, db=db) + (f" api={api_url}" if api_url else ""))

    def no_cuda_library(self, scope):
        where = ("none in the usual install paths" if scope == "host"
                 else "install paths are not searched with --scope netns")
        _say(f"straggler: warning: no CUDA library found yet (none mapped by a process in scope, {where}); "
             "tracing scheduling and block I/O, and attaching when a process maps one (or pass --cuda-lib PATH)")

    def attached(self, probes, library):
        _say(f"straggler: attached {probes} probes to {library}")

    def devices_not_read(self, what, why):
        _say(f"straggler: no GPU is read: {why}" if what == "gpu" else f"straggler: Xid errors are not read: {why}")

    def network_not_read(self, what, why):
        _say(f"straggler: {NOUNS.get(what, what)} not read: {why}")

    def net_flows_not_traced(self, why):
        _say(f"straggler: TCP connections not traced: {why}")


def run(args):
    return Agent(agent_options(args), StderrEvents()).run()
