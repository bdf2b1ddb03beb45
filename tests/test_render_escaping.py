"""Node text in reports: what the nodes recorded (process names, node names, the findings that quote
them, a fleet query's cells) reaches the Markdown a CI job posts, the JUnit XML it reads, the CSV and
the terminal as text, never as markup. A process named `[fix](//ev.il)` must not become a live link,
`<img src=x onerror=alert(1)>` must not become HTML, `a|b` must not add a table column.

The report is a real one: explain run on a synthetic cluster (straggler_lab.synth) whose nodes are
named with Markdown and HTML in them and whose CPU thief's process is renamed to CRAFTED before the
merge. The Markdown is parsed with markdown-it-py (CommonMark with GitHub's tables and
strikethrough) and the JUnit with xml.etree, and what they show is compared with what was recorded."""
import csv
import dataclasses
import io
import json
import re
import sqlite3
import sys
import xml.etree.ElementTree as ET

import pytest
from markdown_it import MarkdownIt

from test_api_helpers import REPO

from straggler import render
from straggler.analysis import explain
from straggler.analysis.merge import merge
from straggler.render.report import EPISODE_COLUMNS, NODE_COLUMNS, to_junit, to_markdown, to_text
from straggler_lab import synth

# the process that steals the straggler's CPU, as its node recorded it: a link, an image, raw HTML,
# a script, a table pipe, a lone backtick and a run of three, emphasis, strikethrough, an autolink, a
# bare URL, a bare www address, an e-mail address, an entity, a backslash before a bracket, math, a
# list marker and an XML non-character
CRAFTED = ("[fix](//ev.il) ![x](//ev.il/p.png) <img src=x onerror=alert(1)> <script>alert(1)</script> "
           "a|b c`d ``` *bold* _em_ ~~gone~~ <https://ev.il> https://ev.il/x www.ev.il me@ev.il &amp; \\[ $x$ "
           "- 1. \uffff")
# node names may hold Markdown and HTML too (not brackets, backticks, quotes, colons or spaces)
NODE_PREFIX = "<script>*n*|_x_&amp;~~s~~#-"
LINK_TOKENS = {"link_open", "link_close", "image"}
HTML_TOKENS = {"html_inline", "html_block"}
OUR_HTML = re.compile(r"<details><summary>SQL: [^<>]*</summary>\n|</details>\n")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """explain's report on a 4-node cpu_hog cluster (rank 3 missing) with crafted names."""
    base = tmp_path_factory.mktemp("escaping")
    spec = synth.SynthSpec(scenario="cpu_hog", events=3000, straggler=1, prefix=NODE_PREFIX, missing=(3,))
    facts = synth.write_nodes(str(base / "nodes"), spec)
    paths = [f["path"] for f in facts["files"]]
    conn = sqlite3.connect(paths[1])
    for table, column in (("events", "other_comm"), ("processes", "comm"), ("processes", "cmdline")):
        conn.execute(f"UPDATE {table} SET {column} = replace({column}, 'cpu-hog', ?)", (CRAFTED,))
    conn.execute("UPDATE thread_time SET thieves = replace(thieves, '\"cpu-hog\"', ?)", (json.dumps(CRAFTED),))
    conn.commit()
    conn.close()
    merge(paths, str(base / "cluster.db"), offsets=facts["offsets"])
    result = explain.explain_db(str(base / "cluster.db"))
    assert result.straggler == spec.node_name(1)
    assert any(CRAFTED in f.summary for f in result.findings), "the thief's name is quoted in a finding"
    return result


def _markdown_parser():
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _walk(tokens):
    for token in tokens:
        yield token
        yield from _walk(token.children or [])


def _shown(inline):
    """What an inline token shows: its text, entities and escapes decoded, code spans' content."""
    return "".join(c.content if c.type in ("text", "text_special", "code_inline") else "\n"
                   for c in inline.children if c.type in ("text", "text_special", "code_inline", "softbreak"))


def _assert_no_markup_from_the_nodes(tokens):
    kinds = [t.type for t in _walk(tokens)]
    assert not LINK_TOKENS & set(kinds), "a link, image or autolink"
    assert not {"em_open", "s_open"} & set(kinds), "emphasis or strikethrough"
    for token in _walk(tokens):
        if token.type in HTML_TOKENS:
            assert OUR_HTML.fullmatch(token.content), f"raw HTML: {token.content!r}"


def _tables(tokens):
    """Each table as a list of rows, each row a list of what its cells show."""
    tables, rows, row = [], None, None
    for t in tokens:
        if t.type == "table_open":
            rows = []
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None:
            row.append(_shown(t))
        elif t.type == "tr_close":
            rows.append(row)
            row = None
        elif t.type == "table_close":
            tables.append(rows)
    return tables


def test_markdown_report_shows_node_text_without_links_images_or_html(report):
    markdown = to_markdown(report)
    tokens = _markdown_parser().parse(markdown)
    _assert_no_markup_from_the_nodes(tokens)
    # the only list is the missing nodes', the only bold is the report's own, the only headings are its own
    kinds = [t.type for t in tokens]
    assert kinds.count("bullet_list_open") == 1 and "ordered_list_open" not in kinds and "hr" not in kinds
    for t in tokens:
        if t.type == "inline":
            strong = [n for n, c in enumerate(t.children) if c.type == "strong_open"]
            for n in strong:
                assert t.children[n + 1].content in ("Recommendation:", f"Straggler: {report.straggler}")
    headings = [_shown(tokens[i + 1]) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert len(headings) == 4 + len(report.findings) + bool(report.missing)   # title, time lost, episodes, per node
    # readable: every crafted text shows as it was recorded
    paragraphs = [_shown(t) for t in tokens if t.type == "inline"]
    assert f"Straggler: {report.straggler}" in paragraphs
    cpu = next(f for f in report.findings if f.cause == "cpu-contention")
    assert cpu.summary in paragraphs and CRAFTED in cpu.summary
    for f in report.findings:
        assert f"{f.severity.upper()}: {f.cause} — {f.node or 'fleet'}" in " ".join(headings)
    assert any(p.startswith("Recommendation: move [fix](//ev.il)") for p in paragraphs)
    assert any("taskset -pc <other cores>" in p for p in paragraphs)


def test_markdown_report_tables_keep_their_columns(report):
    tables = _tables(_markdown_parser().parse(to_markdown(report)))
    by_header = {tuple(t[0]): t[1:] for t in tables}
    assert tuple(EPISODE_COLUMNS) in by_header and tuple(NODE_COLUMNS) in by_header
    for table in tables:
        assert all(len(row) == len(table[0]) for row in table), table
    assert [row[0] for row in by_header[tuple(NODE_COLUMNS)]] == [n["node"] for n in report.nodes]
    assert by_header[tuple(EPISODE_COLUMNS)][0][1] == report.episodes[0]["node"]


def test_markdown_sql_stays_verbatim_in_a_fence_it_cannot_close(report):
    """The SQL shows as it is (the crafted node names in its literals), and SQL holding a fence, a
    closing </details> and a link stays inside its block; the block's name is HTML-escaped."""
    hostile_sql = "SELECT '```' AS a,\n'````' AS b\n```\n</details>\n[fix](//ev.il) <img src=x onerror=alert(1)>"
    first = dataclasses.replace(report.findings[0], sql={"<img src=x onerror=alert(1)>": hostile_sql})
    crafted = dataclasses.replace(report, findings=[first] + report.findings[1:])
    tokens = _markdown_parser().parse(to_markdown(crafted))
    _assert_no_markup_from_the_nodes(tokens)
    fences = [t for t in tokens if t.type == "fence"]
    assert len(fences) == sum(len(f.sql) for f in crafted.findings)
    assert fences[0].content == hostile_sql + "\n" and fences[0].info == "sql"
    assert any(report.stragglers[0] in t.content for t in fences[1:])     # node names verbatim in the SQL
    summaries = [t.content for t in tokens if t.type == "html_block" and "<summary>" in t.content]
    assert summaries[0] == "<details><summary>SQL: &lt;img src=x onerror=alert(1)&gt;</summary>\n"


def test_fleet_query_table_in_markdown_keeps_its_columns_and_text():
    """A fleet query's answer as a Markdown table (the collection's aggregate writes it so)."""
    columns = ["node", "comm", "n|pipe", "ms"]
    rows = [[f"{NODE_PREFIX}01", CRAFTED, 3, 1.5],
            ["gpu-node-02", "a|b|c", None, 2.0],
            ["# heading", "1. list", "- item", "`code`"]]
    tokens = _markdown_parser().parse(render.to_markdown(columns, rows))
    _assert_no_markup_from_the_nodes(tokens)
    assert not any(t.type == "code_inline" for t in _walk(tokens))
    [table] = _tables(tokens)
    assert table == [columns] + [[render.cell_text(v) for v in row] for row in rows]


def test_aggregate_markdown_shows_missing_host_names_as_text():
    pytest.importorskip("ansible")
    sys.path.insert(0, str(REPO / "collections"))
    try:
        from ansible_collections.straggler.fleet.plugins.action.aggregate import render_aggregate
    finally:
        sys.path.remove(str(REPO / "collections"))
    table = dict(columns=["node", "comm"], rows=[["gpu-node-01", CRAFTED]], missing=["[fix](//ev.il)", "<b>x</b>"],
                 hosts=[dict(host="[fix](//ev.il)", node="", status="unreachable", rows=0, message=CRAFTED)])
    tokens = _markdown_parser().parse(render_aggregate(table, "markdown", render))
    _assert_no_markup_from_the_nodes(tokens)
    shown = [_shown(t) for t in tokens if t.type == "inline"]
    assert "Missing hosts: [fix](//ev.il), <b>x</b>" in shown and CRAFTED in shown


def test_junit_is_well_formed_and_its_text_round_trips(report):
    suite = ET.fromstring(to_junit(report))                   # U+FFFF would make it unreadable
    written = CRAFTED.replace("\uffff", "\\uffff")            # XML 1.0 cannot hold it: written out
    names = [case.get("name") for case in suite.iter("testcase")]
    assert [f"{n['node']} is not the straggler" for n in report.nodes] == names[:len(report.nodes)]
    failure = next(case for case in suite.iter("testcase")
                   if case.get("name") == f"{report.straggler} is not the straggler").find("failure")
    assert failure.get("message").startswith(f"{report.straggler} (rank 1) is the straggler")
    cpu = next(f for f in report.findings if f.cause == "cpu-contention")
    assert f"[{cpu.severity}] {cpu.summary.replace(CRAFTED, written)}" in failure.text.splitlines()


def test_the_terminal_report_and_csv_keep_the_text_as_it_is(report):
    assert CRAFTED in to_text(report)
    rows = [[CRAFTED, 1, 2.5, None], ["-bash", -3, 0.0, "=1+1"], ["a\x1b[2J,\n\"q\"", 0, 1e9, True]]
    text = render.to_csv(["comm", "n", "x", "y"], rows)
    parsed = list(csv.reader(io.StringIO(text)))
    # CSV is for programs: values are not rewritten for spreadsheets, numbers stay numbers; what a
    # terminal would act on is written out (safe_text), the csv module quotes commas and quotes
    assert parsed == [["comm", "n", "x", "y"], [CRAFTED, "1", "2.5", ""], ["-bash", "-3", "0.0", "=1+1"],
                      ['a\\x1b[2J,\\n"q"', "0", "1000000000.0", "True"]]


@pytest.mark.parametrize("value, markdown", [
    ("[fix](//ev.il)", "\\[fix\\](//ev.il)"),
    ("<https://ev.il>", "&lt;https\\://ev.il&gt;"),
    ("wait_pct _em_", "wait_pct \\_em\\_"),
    ("- item", "\\- item"),
    ("12. item", "12\\. item"),
    ("# title", "\\# title"),
    ("---", "\\---"),
    ("1.5 s", "1.5 s"),
    ("a\x1b[2J", "a\\\\x1b\\[2J"),          # safe_text first: the escape written out, then its backslash escaped
])
def test_md_text_escapes_what_would_be_markup(value, markdown):
    assert render.md_text(value) == markdown
    assert _shown(_markdown_parser().parseInline(markdown)[0]) == render.cell_text(value)


def test_code_spans_and_fences_are_longer_than_any_backtick_run_inside():
    assert render.md_code("a``b") == "```a``b```" and render.md_code("`x") == "`` `x ``"
    assert render.md_fence("x\n`````\ny", "sql").splitlines() == ["``````sql", "x", "`````", "y", "``````"]
    prose = render.md_prose("move c`d (pid 1): `taskset -pc <cores> 1`")
    [inline] = [t for t in _markdown_parser().parse(prose) if t.type == "inline"]
    assert [c.type for c in inline.children if c.type not in ("text", "text_special")] == ["code_inline"]
    assert "<cores>" in _shown(inline)
