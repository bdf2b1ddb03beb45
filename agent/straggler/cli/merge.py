"""`straggler merge`: arguments in, straggler.analysis.merge.merge, its summary out (a table of each
node's clock alignment, the rows copied, warnings for nodes without clock pairs or a measured
offset; or JSON). Holds no merge logic."""
from .. import render
from ..analysis.merge import DEFAULT_DEADLINE_S, MergeError, load_offsets, merge, parse_expected, parse_renames

OFFSET_SOURCES = {"given": "--offsets", "input": "input's clock_offsets", "none": "unknown (0 assumed)"}


def add_arguments(parser):
    parser.add_argument("inputs", nargs="+", metavar="DB", help="node databases (from `straggler snapshot` or a node's store)")
    parser.add_argument("-o", "--output", required=True, help="the cluster database to write (replaced atomically)")
    parser.add_argument("--offsets", metavar="JSON", help="measured clock offsets: {NODE: [offset_ns, uncertainty_ns]}")
    parser.add_argument("--rename", action="append", metavar="OLD=NEW", default=[],
                        help="rename node OLD to NEW in the later input that repeats it (repeatable)")
    parser.add_argument("--auto-rename", action="store_true", help="rename repeated nodes NODE-2, NODE-3, …")
    parser.add_argument("--expect", action="append", metavar="PATH=NODE", default=[],
                        help="input PATH must hold node NODE, the host it was collected from (repeatable)")
    parser.add_argument("--deadline", type=float, metavar="S", default=DEFAULT_DEADLINE_S,
                        help=f"stop (writing nothing) when the merge takes longer than S seconds "
                             f"(default {DEFAULT_DEADLINE_S:g})")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args):
    offsets = load_offsets(args.offsets) if args.offsets else None
    rename = True if args.auto_rename else parse_renames(args.rename)
    if args.auto_rename and args.rename:
        raise MergeError("use either --rename OLD=NEW or --auto-rename, not both")
    summary = merge(args.inputs, args.output, offsets=offsets, rename=rename, deadline_s=args.deadline,
                    expected_nodes=parse_expected(args.expect))
    if args.json:
        print(render.to_json(summary), end="")
        return 0
    print(summary_text(summary), end="")
    return 0


def summary_text(summary):
    """The merge's summary as the text `straggler merge` prints."""
    rows = []
    for node, a in summary["clock_alignment"].items():
        unc = "" if a["uncertainty_ns"] is None else f"±{a['uncertainty_ns'] / 1e6:.3f}"
        rows.append((node, a["clock_pairs"], f"{a['offset_ns'] / 1e6:.3f}", unc, OFFSET_SOURCES[a["source"]]))
    lines = [render.table_text(["node", "clock pairs", "offset ms", "uncertainty ms", "offset from"], rows,
                               title=f"merged {len(summary['inputs'])} databases into {summary['output']}")]
    lines.append("rows: " + ", ".join(f"{t} {n}" for t, n in summary["rows"].items()) + f"  ({summary['elapsed_s']} s)\n")
    lines += [f"warning: {node} has no clock pairs: its ts_aligned is NULL\n" for node in summary["unaligned"]]
    lines += [f"note: no measured offset for {node}: its realtime clock is taken as correct\n"
              for node in summary["offset_unknown"]]
    return "".join(lines)
