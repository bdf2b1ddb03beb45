"""explain's report: findings (severity, node, cause, summary, numbers, the SQL behind each number,
recommendation, share of the straggler's excess), per-rank rows, missing nodes; and its renderers
(text, JSON via to_dict, Markdown, JUnit XML for CI). Nothing here decides anything."""
import html
from dataclasses import asdict, dataclass, field

from ...text import fmt_bytes, fmt_ns as _fmt_ns


def _fmt_bytes(b):
    return fmt_bytes(b or 0)


SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
NODE_COLUMNS = ["node", "rank", "thread", "waits", "host", "run queue", "sync", "io", "role"]


def _node_row(n):
    return (n["node"], n.get("rank"), n.get("thread") or "", _fmt_pct(n.get("wait_pct")), _fmt_pct(n.get("host_pct")),
            _fmt_pct(n.get("runq_pct")), _fmt_pct(n.get("sync_pct")), _fmt_pct(n.get("io_pct")), n.get("role") or "")


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

    def to_dict(self):
        return dict(straggler=self.straggler, stragglers=self.stragglers, findings=[f.to_dict() for f in self.findings], nodes=self.nodes,
                    missing=self.missing, source=self.source, options=self.options, elapsed_s=self.elapsed_s)

    # ---- for people ----
    def to_text(self, show_sql=True, width=None):
        from ... import render
        out = [f"straggler explain — {self.source}"]
        out.append(f"straggler: {', '.join(self.stragglers or [self.straggler])}" if self.straggler
                   else "straggler: none found")
        out.append("")
        for i, f in enumerate(self.findings, 1):
            out.append(f"{i}. [{f.severity.upper()}] {f.summary}")
            if f.numbers:
                out.append("   numbers: " + ", ".join(f"{k}={_fmt_number(k, v)}" for k, v in f.numbers.items()))
            if f.recommendation:
                out.append(f"   recommendation: {f.recommendation}")
            if show_sql:
                for name, sql in f.sql.items():
                    out.append(f"   SQL ({name}):")
                    out.extend("     " + line for line in sql.strip().splitlines())
            out.append("")
        if self.nodes:
            out.append(render.table_text(NODE_COLUMNS, [_node_row(n) for n in self.nodes],
                                         title="per rank: share of the calling thread's time (recent window)",
                                         width=width))
        for m in self.missing:
            out.append(f"missing: {m['node']} ({m['status']}): {m['message']}")
        return "\n".join(out).rstrip() + "\n"

    def to_markdown(self):
        from ... import render
        out = ["# straggler explain", "", f"Source: {self.source}", "",
               f"**Straggler: {self.straggler}**" if self.straggler else "**No straggler found.**", ""]
        for i, f in enumerate(self.findings, 1):
            out.append(f"## {i}. {f.severity.upper()}: {f.cause} — {f.node or 'fleet'}")
            out.append("")
            out.append(f.summary)
            out.append("")
            if f.numbers:
                out.append(render.to_markdown(["number", "value"], [(k, _fmt_number(k, v)) for k, v in f.numbers.items()]))
            if f.recommendation:
                out.append(f"**Recommendation:** {f.recommendation}")
                out.append("")
            for name, sql in f.sql.items():
                out.append(f"<details><summary>SQL: {name}</summary>")
                out.append("")
                out.append("```sql")
                out.append(sql.strip())
                out.append("```")
                out.append("</details>")
                out.append("")
        if self.nodes:
            out.append("## Per node")
            out.append("")
            out.append(render.to_markdown(NODE_COLUMNS, [_node_row(n) for n in self.nodes]))
        if self.missing:
            out.append("## Missing nodes")
            out.append("")
            out.extend(f"- {m['node']} ({m['status']}): {m['message']}" for m in self.missing)
            out.append("")
        return "\n".join(out)

    def to_junit(self):
        """JUnit XML: one test case per node ("is not the straggler") plus "all nodes answered"."""
        cases = []
        by_node = {}
        for f in self.findings:
            by_node.setdefault(f.node, []).append(f)
        named = set(self.stragglers or ([self.straggler] if self.straggler else []))
        seen = set()
        for n in self.nodes:
            name = n["node"]
            if name in seen:       # several ranks on one node: one case per node
                continue
            seen.add(name)
            body = "\n".join(f"[{f.severity}] {f.summary}" for f in by_node.get(name, []))
            if name in named:
                main = next(f for f in self.findings if f.cause == "straggler" and f.node == name)
                cases.append(f'  <testcase classname="straggler.explain" name="{_x(name)} is not the straggler">\n'
                             f'    <failure message="{_x(main.summary)}" type="straggler">{_x(body)}</failure>\n'
                             f'  </testcase>')
            else:
                cases.append(f'  <testcase classname="straggler.explain" name="{_x(name)} is not the straggler">'
                             f'<system-out>{_x(body)}</system-out></testcase>')
        for m in self.missing:
            cases.append(f'  <testcase classname="straggler.explain" name="{_x(m["node"])} answered">\n'
                         f'    <failure message="{_x(m["node"])} {_x(m["status"])}: {_x(m["message"])}" type="missing"/>\n'
                         f'  </testcase>')
        failures = len(named) + len(self.missing)
        return ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f'<testsuite name="straggler explain" tests="{len(cases)}" failures="{failures}" errors="0" '
                f'time="{self.elapsed_s:.3f}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def _x(text):
    return html.escape(str(text), quote=True)


def _fmt_pct(p):
    return "" if p is None else f"{p:.0f}%"


def _fmt_number(name, value):
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if name.endswith("_ns"):
        return f"{text} ({_fmt_ns(value)})"
    if name.endswith("bytes"):
        return f"{text} ({_fmt_bytes(value)})"
    return text
