"""Hostile text: what the nodes record (process names, command lines, SQL results, node names, the
findings that quote them) is printed as text by every face. A process named `[/bold]` prints as
`[/bold]` (rich never parses it as markup: before, `straggler query` failed with MarkupError), and
an escape sequence in a name is shown written out (`\\x1b[2J`), never sent to the terminal raw.

Each face is run for real: `straggler query` and `straggler explain` as commands on stores that
hold such names, `straggler fleet query` against a real agent on loopback, the watch's live table
drawn by rich into a terminal console, and the Ansible summary callback's text."""
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from test_api_helpers import REPO, Pki, make_node_db

from straggler import render
from straggler.analysis.merge import merge
from straggler.api.server import start_background
from straggler.render.events import format_event
from straggler.render.report import to_junit, to_markdown, verdict_line
from straggler.text import safe_text
from straggler_lab import synth

# markup that closes a tag never opened (rich raised MarkupError on it), a screen clear, a window
# title change ended by BEL, and a right-to-left override
HOSTILE = "[/bold]evil\x1b[2J\x1b]0;owned\x07\u202eexe.txt"
SHOWN = "[/bold]evil\\x1b[2J\\x1b]0;owned\\x07\\u202eexe.txt"
RAW = ("\x1b[2J", "\x1b]0;owned", "\x07", "\u202e")


def _assert_shown_as_text(output):
    assert SHOWN in output, output
    for raw in RAW:
        assert raw not in output, f"{raw!r} reached the terminal raw"


def _assert_markdown_shown_as_text(markdown):
    """Markdown escapes its own punctuation (`[` is written `\\[`: tests/test_render_escaping.py): what
    it shows once rendered holds SHOWN, and its source holds nothing raw."""
    from markdown_it import MarkdownIt
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    shown = "\n".join("".join(c.content for c in t.children if c.type in ("text", "text_special"))
                      for t in tokens if t.type == "inline")
    _assert_shown_as_text(shown + "\n" + "\n".join(t.content for t in tokens if t.type == "fence"))
    for raw in RAW:
        assert raw not in markdown, f"{raw!r} reached the Markdown raw"


def _run(*args, timeout=60):
    proc = subprocess.run([sys.executable, "-m", "straggler.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO))
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# ---- the one rule ----

@pytest.mark.parametrize("value, shown", [
    ("[/bold]", "[/bold]"),
    ("a\x1b[2Jb", "a\\x1b[2Jb"),
    ("line\nforged: line\r\tx", "line\\nforged: line\\r\\tx"),
    ("\x9b31m", "\\x9b31m"),                          # the one-byte CSI
    ("\u202egnp.exe", "\\u202egnp.exe"),
    ("ünïcode 日本 back\\slash", "ünïcode 日本 back\\slash"),
    (42, "42"),
])
def test_safe_text_writes_out_what_a_terminal_would_act_on(value, shown):
    assert safe_text(value) == shown


# ---- straggler query ----

@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """A node store whose trainer process is named HOSTILE, with HOSTILE in its command line."""
    db = tmp_path_factory.mktemp("hostile") / "gpu-node-01.db"
    make_node_db(db, "gpu-node-01", 0)
    conn = sqlite3.connect(str(db))
    conn.execute("UPDATE processes SET comm = ?, cmdline = ?", (HOSTILE, f"python train.py --tag {HOSTILE}"))
    conn.execute("UPDATE events SET comm = ?", (HOSTILE,))
    conn.commit()
    conn.close()
    return db


def test_query_prints_a_markup_and_escape_named_process_as_text(hostile_store):
    proc = _run("query", "-d", str(hostile_store), "SELECT comm, cmdline FROM processes")
    assert proc.returncode == 0, proc.stderr
    _assert_shown_as_text(proc.stdout)
    assert f"--tag {SHOWN}" in proc.stdout
    # SQL results too: a value the query makes up is data, not markup
    proc = _run("query", "-d", str(hostile_store), "SELECT '[bold red]x[/] [link=file:///etc/passwd]y' AS t")
    assert proc.returncode == 0 and "[bold red]x[/] [link=file:///etc/passwd]y" in proc.stdout, proc.stdout
    proc = _run("query", "-d", str(hostile_store), "SELECT comm FROM processes", "--csv")
    _assert_shown_as_text(proc.stdout)
    proc = _run("query", "-d", str(hostile_store), "SELECT comm FROM processes", "--json")
    assert json.loads(proc.stdout)["rows"] == [[HOSTILE]]         # JSON keeps the exact value, escaped by JSON


# ---- straggler fleet query, against a real agent ----

def test_fleet_query_prints_a_hostile_process_name_as_text(hostile_store, tmp_path):
    certs = Pki(tmp_path)
    handle = start_background(str(hostile_store), listen="127.0.0.1:0", tls=certs.server("127.0.0.1"))
    try:
        proc = _run("fleet", "query", "--nodes", f"127.0.0.1:{handle.port}", "--clock-samples", "0",
                    *certs.tls_args(certs.client()), "SELECT DISTINCT comm FROM events")
    finally:
        handle.stop()
    assert proc.returncode == 0, proc.stderr
    _assert_shown_as_text(proc.stdout)


# ---- straggler explain ----

def test_explain_prints_a_hostile_cpu_thief_in_its_findings_as_text(tmp_path):
    """The CPU thief's name is quoted in explain's finding and recommendation."""
    facts = synth.write_nodes(str(tmp_path / "nodes"), synth.SynthSpec(scenario="cpu_hog", events=3000, straggler=1))
    paths = [f["path"] for f in facts["files"]]
    straggler_db = sqlite3.connect(paths[1])
    for table, column in (("events", "other_comm"), ("processes", "comm"), ("processes", "cmdline")):
        straggler_db.execute(f"UPDATE {table} SET {column} = replace({column}, 'cpu-hog', ?)", (HOSTILE,))
    straggler_db.execute("UPDATE thread_time SET thieves = replace(thieves, '\"cpu-hog\"', ?)",   # a JSON list
                         (json.dumps(HOSTILE),))
    straggler_db.commit()
    straggler_db.close()
    cluster = tmp_path / "cluster.db"
    merge(paths, str(cluster), offsets=facts["offsets"])
    proc = _run("explain", "-d", str(cluster), "--markdown", str(tmp_path / "r.md"), "--junit", str(tmp_path / "r.xml"))
    assert proc.returncode == 0, proc.stderr
    _assert_shown_as_text(proc.stdout)
    assert f"who held it (run-queue wait grown over the baseline): {SHOWN} (pid" in proc.stdout
    _assert_markdown_shown_as_text((tmp_path / "r.md").read_text())
    junit = (tmp_path / "r.xml").read_text()
    _assert_shown_as_text(junit)
    import xml.etree.ElementTree as ET
    ET.fromstring(junit)                          # XML 1.0 cannot hold ESC or BEL: it parses because they are written out


# ---- the watch: its live table in a terminal, its event lines ----

def test_the_watch_table_and_events_show_hostile_names_as_text():
    from rich.console import Console
    from rich.live import Live

    from straggler.analysis.watch import LiveVerdict, NodeFeed
    from straggler.cli.watch import _LiveTable

    screen = io.StringIO()
    table = _LiveTable(Console(file=screen, force_terminal=True, color_system=None, width=200), Live)
    feeds = [NodeFeed(address="127.0.0.1:7433", node=HOSTILE, status="ok"),
             NodeFeed(address="127.0.0.2:7433", node="gpu-node-02", status="timeout")]
    table.start()
    try:
        table.update(LiveVerdict(), feeds)
        table.print(format_event(dict(event="lost", time="2026-01-01T00:00:01", node=HOSTILE, status="timeout",
                                      message=f"no answer\n00:00:02 RECOVERED {HOSTILE}")))
    finally:
        table.stop()
    output = screen.getvalue()
    _assert_shown_as_text(output)
    assert f"LOST {SHOWN} (timeout): no answer\\n00:00:02 RECOVERED {SHOWN}; watching" in output   # no forged line
    onset = format_event(dict(event="onset", time="2026-01-01T00:00:01", node="gpu-node-02", cause="cpu",
                              summary=f"who held it: {HOSTILE}"))
    assert onset.splitlines() == ["00:00:01 STRAGGLER gpu-node-02: cpu", f"         who held it: {SHOWN}"]


# ---- the renderers every face shares ----

def test_tables_csv_markdown_and_the_verdict_show_hostile_text_as_text():
    _assert_shown_as_text(render.table_text(["comm", HOSTILE], [[HOSTILE, 1]], title=HOSTILE))
    _assert_shown_as_text(render._plain_table(["comm"], [[HOSTILE]], title=HOSTILE))
    _assert_shown_as_text(render.to_csv(["comm"], [[HOSTILE]]))
    _assert_markdown_shown_as_text(render.to_markdown(["comm"], [[HOSTILE]]))
    line = verdict_line("gpu-node-02", "cpu", 0.9, f"who held it: {HOSTILE}\nstraggler: none")
    assert line == f"straggler: gpu-node-02: cpu (90% of its excess): who held it: {SHOWN}\\nstraggler: none"


# ---- the Ansible summary callback ----

def test_the_summary_callback_prints_hostile_text_as_text():
    pytest.importorskip("ansible")
    sys.path.insert(0, str(REPO / "collections"))
    try:
        from ansible_collections.straggler.fleet.plugins.callback.summary import plain_table, summary_text
    finally:
        sys.path.remove(str(REPO / "collections"))
    result = dict(columns=["node", "comm"], rows=[["gpu-node-01", HOSTILE]],
                  nodes=[dict(node="gpu-node-01", address="127.0.0.1:7433", status="ok", row_count=1, message=HOSTILE)],
                  failed_nodes=[HOSTILE])
    _assert_shown_as_text(summary_text("fleet_query", "play: task", result))
    explained = dict(msg=f"straggler: gpu-node-01: cpu: {HOSTILE}",
                     findings=[dict(severity="warning", node="gpu-node-01", cause="cpu", summary=HOSTILE)],
                     missing=[dict(node=HOSTILE, status="timeout", message=HOSTILE)])
    _assert_shown_as_text(summary_text("explain", "play: task", explained))
    _assert_shown_as_text(plain_table(["comm"], [[HOSTILE]], title=HOSTILE))


def test_the_markdown_report_and_junit_of_a_report_are_text(tmp_path):
    """to_markdown/to_junit on a report whose nodes and findings quote a hostile name (no explain run)."""
    from types import SimpleNamespace
    finding = SimpleNamespace(severity="warning", cause="cpu", node="gpu-node-01", summary=f"who held it: {HOSTILE}",
                              numbers={}, recommendation=f"stop {HOSTILE}", sql={"q": f"SELECT '{HOSTILE}'"})
    report = SimpleNamespace(source=str(Path(tmp_path)), straggler="gpu-node-01", stragglers=["gpu-node-01"],
                             episodes=[], findings=[finding], nodes=[dict(node="gpu-node-01", rank=0)],
                             missing=[dict(node="gpu-node-02", status="timeout", message=HOSTILE)], elapsed_s=0.1)
    _assert_markdown_shown_as_text(to_markdown(report))
    _assert_shown_as_text(to_junit(report))
