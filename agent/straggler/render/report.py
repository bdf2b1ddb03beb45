"""explain's report for people and for CI: text, Markdown, JUnit XML, and the one-line verdict every
face prints (the CLI, the Ansible actions, the watch). Rendering only: the report is data
(straggler.analysis.explain.report).

The report quotes what the nodes recorded (node names, process names, command lines) in its
summaries: every line is printed through straggler.text.safe_text (tables through render's
cells), so none of it can act on a terminal or forge a line. The Markdown and the JUnit XML put it
through their format's one escaping rule (render's md_text, md_cell, md_prose, md_fence, html_text,
xml_text), so none of it becomes a link, an image, HTML or markup there."""
from ..text import fmt_bytes, fmt_ns, safe_text
from . import html_text, md_fence, md_prose, md_text, table_text, to_markdown as table_markdown, xml_text

NODE_COLUMNS = ["node", "rank", "thread", "waits", "host", "run queue", "sync", "io", "role"]
EPISODE_COLUMNS = ["#", "node", "ranks", "start (UTC)", "end", "lasted", "job slower", "time lost", "cause", "pattern"]


def verdict_line(straggler, cause=None, share=None, summary=None, rank=None, none="no straggler found"):
    """The one-line verdict every face prints: 'straggler: NODE[ rank R]: CAUSE (N% of its excess):
    SUMMARY', 'straggler: NODE' without a cause, or `none` without a straggler."""
    if not straggler:
        return safe_text(none)
    head = f"straggler: {straggler}" + (f" rank {rank}" if rank is not None else "")
    if not cause:
        return safe_text(head)
    pct = f" ({round(100 * share)}% of its excess)" if share is not None else ""
    return safe_text(f"{head}: {cause}{pct}: {summary or ''}")


def report_verdict(report, none="no straggler found"):
    """verdict_line of an explain Report: its first straggler and the cause that explains most of its excess."""
    from ..analysis.explain import top_cause
    top = top_cause(report, report.straggler) if report.straggler else None
    if top is None:
        return verdict_line(report.straggler, none=none)
    return verdict_line(report.straggler, top.cause, top.share, top.summary, none=none)


def _hms(iso):
    """'2026-01-01T00:59:20.000+00:00' -> ('2026-01-01', '00:59:20')."""
    return (iso[:10], iso[11:19]) if iso else ("", "")


def span_text(span):
    """The span --since/--until cut (Report.span), as one line: 'span judged (--since/--until): 2026-01-01
    02:00:00 UTC → 2026-01-01 03:00:00 UTC; the trace: ... → ...'."""
    def when(text, open_end):
        if not text:
            return open_end
        return f"{' '.join(_hms(text))} UTC" if text[4:5] == "-" and text[10:11] == "T" else text
    return (f"span judged (--since/--until): {when(span.get('since'), 'the trace start')} → "
            f"{when(span.get('until'), 'its end')}; the trace: {when(span.get('trace_start'), '?')} → "
            f"{when(span.get('trace_end'), '?')}")


def _ranks_text(e):
    ranks = sorted(r["rank"] for r in e.get("ranks", []) if r.get("rank") is not None)
    if not ranks:
        return ""
    return ", ".join(map(str, ranks)) if len(ranks) <= 4 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"


def _pattern(e):
    p = e.get("pauses")
    if p:
        return f"pauses: {p['count']} of ~{1000 * p['length_s']:.0f} ms, one every {p['period_s']:g} s"
    i = e.get("intermittent")
    if i:
        period = f"period {i['period_s']:g} s, " if i.get("period_s") else ""
        return f"intermittent ({period}on {i['duty']:.0%})"
    return "ongoing" if e.get("ongoing") else "steady"


def _cause_text(e):
    c = max(e.get("causes") or [], key=lambda c: c["share"], default=None)
    return f"{c['cause']} {c['share']:.0%}" if c else ""


def episode_rows(report):
    """The episodes table's rows: who, when, how long, what it cost the job, why, and its pattern."""
    rows = []
    for i, e in enumerate(report.episodes, 1):
        day, start = _hms(e["start"])
        _, end = _hms(e["end"])
        slower, lost = _cost(e)
        rows.append((i, ", ".join(e.get("nodes") or [e["node"]]), _ranks_text(e), f"{day} {start}", end,
                     f"{e['duration_s']:g} s", slower, lost, _cause_text(e), _pattern(e)))
    return rows


def _cost(e):
    """(the job's slowdown, the time lost) of an episode in words: 'all along' and 'not measured' for one
    there all along (the trace has no clean time to measure it against)."""
    if e.get("slowdown") is None or e.get("lost_s") is None:
        return "all along", "not measured"
    return f"×{e['slowdown']:.2f}" + (" (est.)" if e.get("slowdown_estimated") else ""), f"{e['lost_s']:g} s"


def episode_headline(e):
    """One line for an episode: 'gpu-node-02: 00:59:20 → 00:59:34 UTC (14 s), the job ×2.05 slower'."""
    day, start = _hms(e["start"])
    _, end = _hms(e["end"])
    if e.get("slowdown") is None or e.get("lost_s") is None:
        cost = "slow all along (no clean time in the trace: the job's slowdown not measured)"
    else:
        cost = (f"the job ×{e['slowdown']:.2f} slower{' (estimated)' if e.get('slowdown_estimated') else ''}, "
                f"{e['lost_s']:g} s lost")
    return (f"{', '.join(e.get('nodes') or [e['node']])}: {day} {start} → {end} UTC ({e['duration_s']:g} s), {cost}"
            + (f"; {_pattern(e)}" if e.get("intermittent") else ""))


def whatif_lines(report):
    """The report's first lines: the job's time lost at its sync points, split by what lost it (explain's
    steps.py); one line saying why where it was not measured; none without a what-if."""
    return whatif_text(getattr(report, "whatif", None))


def whatif_text(w):
    """A what-if (explain's report.whatif, or the watch's over its window) as lines: none without one."""
    if not w:
        return []
    if not w.get("measured"):
        return [f"time lost: not measured ({w.get('why')})"]
    parts = []
    for p in w.get("parts", []):
        what = "its pauses" if p["what"] == "pauses" else "its episode" + (" (all along)" if p.get("all_along") else "")
        parts.append(f"{p['node']} ({what}) {p['lost_s']:g} s")
    imb = w.get("imbalance") or {}
    parts.append(f"imbalance and jitter {imb.get('lost_s', 0):g} s")
    where = (" (in the synchronize after each collective: the hosts' view; a GPU that falls behind while its host "
             "runs ahead is not seen there)" if w.get("waited_in") == "synchronize" else "")
    return [f"time lost: {w['lost_s']:g} s of {w['span_s']:g} s ({w['lost_ratio']:.0%}) waiting for the slowest rank at "
            f"{w['sync_points']:,} sync points{where} — " + ", ".join(parts)]


def _fmt_pct(p):
    return "" if p is None else f"{p:.0f}%"


def _node_row(n):
    return (n["node"], n.get("rank"), n.get("thread") or "", _fmt_pct(n.get("wait_pct")), _fmt_pct(n.get("host_pct")),
            _fmt_pct(n.get("runq_pct")), _fmt_pct(n.get("sync_pct")), _fmt_pct(n.get("io_pct")), n.get("role") or "")


def _lines(text):
    """Multi-line text (a finding's SQL) as safe lines."""
    return [safe_text(line) for line in str(text).strip().splitlines()]


def to_text(report, show_sql=True, width=None):
    out = []

    def line(text=""):
        out.append(safe_text(text))

    line(f"straggler explain — {report.source}")
    line(f"straggler: {', '.join(report.stragglers or [report.straggler])}" if report.straggler
         else "straggler: none found")
    cut = getattr(report, "span", None)
    if cut:
        line(span_text(cut))
    for text in whatif_lines(report):
        line(text)
    line()
    if report.episodes:
        span = report.timeline or {}
        title = (f"{len(report.episodes)} straggle episode(s) in {_hms(span.get('start'))[1]} → "
                 f"{_hms(span.get('end'))[1]} UTC of trace, the costliest first" if span else "straggle episodes")
        out.append(table_text(EPISODE_COLUMNS, episode_rows(report), title=title, width=width))
        line(f"episode 1 — {episode_headline(report.episodes[0])}:")
        line()
    for i, f in enumerate(report.findings, 1):
        line(f"{i}. [{f.severity.upper()}] {f.summary}")
        if f.numbers:
            line("   numbers: " + ", ".join(f"{k}={_fmt_number(k, v)}" for k, v in f.numbers.items()))
        if f.recommendation:
            line(f"   recommendation: {f.recommendation}")
        if show_sql:
            for name, sql in f.sql.items():
                line(f"   SQL ({name}):")
                out.extend("     " + text for text in _lines(sql))
        line()
    if report.nodes:
        out.append(table_text(NODE_COLUMNS, [_node_row(n) for n in report.nodes],
                              title="per rank: share of the calling thread's time "
                                    + ("(episode 1)" if report.episodes else "(recent window)"), width=width))
    for n, e in enumerate(report.episodes[1:], 2):
        line(f"episode {n} — {episode_headline(e)}:")
        for f in e.get("findings", []):
            if f["cause"] in ("straggler", "waiters"):
                continue
            line(f"   [{f['severity'].upper()}] {f['summary']}")
            if f.get("recommendation"):
                line(f"      recommendation: {f['recommendation']}")
        line()
    for m in report.missing:
        line(f"missing: {m['node']} ({m['status']}): {m['message']}")
    return "\n".join(out).rstrip() + "\n"


def to_markdown(report):
    """The report as Markdown (GitHub's), as a CI job posts it: every text that holds what the nodes
    recorded through md_text (md_prose for the findings' sentences, which hold `code`), tables through
    md_cell, the SQL in a fence it cannot close (md_fence) and its name as HTML (html_text)."""
    out = ["# straggler explain", "", md_text(f"Source: {report.source}"), "",
           f"**Straggler: {md_text(report.straggler)}**" if report.straggler else "**No straggler found.**", ""]
    cut = getattr(report, "span", None)
    if cut:
        out += [md_text("S" + span_text(cut)[1:] + "."), ""]
    lost = whatif_lines(report)
    if lost:
        out += ["## Time lost", ""] + [md_text(text[0].upper() + text[1:] + ".") for text in lost] + [""]
    if report.episodes:
        out += ["## Straggle episodes", "", "The costliest first; times UTC on the fleet timeline.", "",
                table_markdown(EPISODE_COLUMNS, episode_rows(report)),
                md_text(f"Episode 1: {episode_headline(report.episodes[0])}."), ""]
    for i, f in enumerate(report.findings, 1):
        out.append(f"## {i}. " + md_text(f"{f.severity.upper()}: {f.cause} — {f.node or 'fleet'}"))
        out.append("")
        out.append(md_prose(f.summary))
        out.append("")
        if f.numbers:
            out.append(table_markdown(["number", "value"], [(k, _fmt_number(k, v)) for k, v in f.numbers.items()]))
        if f.recommendation:
            out.append("**Recommendation:** " + md_prose(f.recommendation))
            out.append("")
        for name, sql in f.sql.items():
            out.append(f"<details><summary>SQL: {html_text(name)}</summary>")
            out.append("")
            out.append(md_fence(sql, "sql"))
            out.append("</details>")
            out.append("")
    if report.nodes:
        out.append("## Per node")
        out.append("")
        out.append(table_markdown(NODE_COLUMNS, [_node_row(n) for n in report.nodes]))
    if report.missing:
        out.append("## Missing nodes")
        out.append("")
        out.extend("- " + md_text(f"{m['node']} ({m['status']}): {m['message']}") for m in report.missing)
        out.append("")
    return "\n".join(out)


def to_junit(report):
    """JUnit XML: one test case per node ("is not the straggler") plus "all nodes answered"."""
    cases = []
    by_node = {}
    for f in report.findings:
        by_node.setdefault(f.node, []).append(f)
    named = set(report.stragglers or ([report.straggler] if report.straggler else []))
    seen = set()
    for n in report.nodes:
        name = n["node"]
        if name in seen:       # several ranks on one node: one case per node
            continue
        seen.add(name)
        episodes = [e for e in report.episodes if name in (e.get("nodes") or [e["node"]])]
        body = "\n".join(xml_text(part) for part in [f"episode: {episode_headline(e)}" for e in episodes]
                         + [f"[{f.severity}] {f.summary}" for f in by_node.get(name, [])])
        if name in named:
            main = next((f.summary for f in report.findings if f.cause == "straggler" and f.node == name),
                        None) or (episode_headline(episodes[0]) if episodes else f"{name} is a straggler")
            cases.append(f'  <testcase classname="straggler.explain" name="{xml_text(name)} is not the straggler">\n'
                         f'    <failure message="{xml_text(main)}" type="straggler">{body}</failure>\n'
                         f'  </testcase>')
        else:
            cases.append(f'  <testcase classname="straggler.explain" name="{xml_text(name)} is not the straggler">'
                         f'<system-out>{body}</system-out></testcase>')
    for m in report.missing:
        cases.append(f'  <testcase classname="straggler.explain" name="{xml_text(m["node"])} answered">\n'
                     f'    <failure message="{xml_text(m["node"])} {xml_text(m["status"])}: {xml_text(m["message"])}" type="missing"/>\n'
                     f'  </testcase>')
    failures = len(named) + len(report.missing)
    w = getattr(report, "whatif", None) or {}
    props = ""
    if w.get("measured"):
        values = (("lost_s", w["lost_s"]), ("lost_ratio", w["lost_ratio"]), ("span_s", w["span_s"]),
                  ("imbalance_lost_s", (w.get("imbalance") or {}).get("lost_s", 0)),
                  ("waited_in", w.get("waited_in", "collectives")))
        props = ("  <properties>\n" + "".join(f'    <property name="{name}" value="{value}"/>\n' for name, value in values)
                 + "  </properties>\n")
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuite name="straggler explain" tests="{len(cases)}" failures="{failures}" errors="0" '
            f'time="{report.elapsed_s:.3f}">\n' + props + "\n".join(cases) + "\n</testsuite>\n")


def _fmt_number(name, value):
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if name.endswith("_ns"):
        return f"{text} ({fmt_ns(value)})"
    if name.endswith("bytes"):
        return f"{text} ({fmt_bytes(value or 0)})"
    return text
