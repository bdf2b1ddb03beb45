"""explain's report as data: findings (severity, node, cause, summary, numbers, the SQL behind each
number, recommendation, share of the straggler's excess), per-rank rows, missing nodes; to_dict() for
JSON. Nothing here decides anything, and nothing here renders (straggler.render.report does)."""
from dataclasses import asdict, dataclass, field

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass
class Finding:
    severity: str                    # critical | warning | info
    node: str                        # the node it is about (None for fleet-wide)
    cause: str                       # straggler | cpu-contention | io-wait | blocked | block-io | waiters | missing-nodes | data-loss | cuda-errors | communicators | no-straggler
    summary: str
    numbers: dict = field(default_factory=dict)     # name -> value
    sql: dict = field(default_factory=dict)         # query name -> SQL text
    sources: dict = field(default_factory=dict)     # number name -> {"sql": query name, "match": {col: value}, "column": col}
    recommendation: str = ""
    share: float = 0.0                              # share of the slowdown it explains (ranking)
    at_ns: int = None                               # the node's CLOCK_MONOTONIC ns where the evidence begins
                                                    # (a straggler: its first slice of the recent window
                                                    # in which it waited less than the others)
    window_ns: list = None                          # [from, to): the node's window the numbers cover

    def to_dict(self):
        return asdict(self)


@dataclass
class Report:
    straggler: str = None                           # the node of the first straggler
    stragglers: list = field(default_factory=list)  # every straggler node, ranked
    findings: list = field(default_factory=list)
    nodes: list = field(default_factory=list)       # per-node summary rows
    missing: list = field(default_factory=list)     # [{"node", "status", "message"}]
    source: str = ""
    options: dict = field(default_factory=dict)
    elapsed_s: float = 0.0
    episodes: list = field(default_factory=list)    # every straggle episode (dicts), the costliest first
    timeline: dict = None                           # the trace's span and bins on the fleet timeline
    span: dict = None                               # --since/--until: the span judged (fleet time, UTC) and each
                                                    # node's bounds on its own clock (span.Cut.to_dict)
    whatif: dict = None                             # the job's time lost at its sync points, split by what lost it
                                                    # (steps.py); {"measured": false, "why": ...} when it is not

    def to_dict(self):
        return dict(straggler=self.straggler, stragglers=self.stragglers, findings=[f.to_dict() for f in self.findings], nodes=self.nodes,
                    missing=self.missing, source=self.source, options=self.options, elapsed_s=self.elapsed_s,
                    episodes=self.episodes, timeline=self.timeline, span=self.span, whatif=self.whatif)
