"""Rendering of tables and reports: rich for people (plain text when rich is missing or the
output is not a terminal), JSON, CSV and Markdown for programs. No logic about what a
table means lives here.

Every cell, column name and title is untrusted text (process names, command lines, SQL results,
node names): it is printed as text, never as markup, with control characters written out
(straggler.text.safe_text). rich gets Text objects, which it does not parse (a process named
`[/bold]` prints as is; `:smile:` stays words). JSON keeps the exact values (json escapes them).

Each format has its one escaping rule here, used by every face that writes that format (the
reports in report.py, the tables below, the collection's actions): md_text (Markdown inline text),
md_cell (a Markdown table cell), md_prose (a sentence that may hold `code` spans), md_code (a code
span), md_fence (a fenced block), html_text (HTML, as in a report's <details>), xml_text (JUnit XML)
and csv_cell (CSV). Each starts from safe_text, so what a terminal would act on is written out in
every format the same way."""
import csv
import html
import io
import json
import re
import sys

from ..text import safe_text


def cell_text(value):
    """A value as a table cell shows it: '' for None, floats to 3 decimals (or 6 significant digits
    when large), anything else as safe_text."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1e6 else f"{value:.6g}"
    return safe_text(value)


# ---- Markdown (CommonMark and GitHub's extensions) ----

# Backslash-escaped wherever they are: the punctuation that makes links and images ([ ]), emphasis and
# strikethrough (* ~, and _ unless it sits between two letters or digits, where it cannot), code (`),
# table columns (|), math ($), the backslash itself (so that a backslash in the text cannot escape
# what follows it), ':' before '//' and '.' after 'www' (the bare URLs GitHub makes links of) and '@'
# (the bare e-mail addresses it makes links of). HTML-escaped: < > & (raw HTML, autolinks
# <https://...>, entities).
_MD_SPECIAL = re.compile(r"[\\`*\[\]|~$@]|_(?![^\W_])|(?<![^\W_])_|:(?=//)|(?<=[wW]{3})\.|[<>&]")
_MD_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
# What makes a block of a line it starts (after up to 3 spaces): a heading (# x), a list item (- x,
# + x; * is escaped above), a setext underline (===, ---) or a thematic break (- - -); and an ordered
# list item (1. x, 1) x), whose '.' or ')' is escaped. (> is HTML-escaped above.)
_MD_BLOCK_MARKER = re.compile(r"^( {0,3})(?=#{1,6}(?:[ \t]|$)|[-+](?:[ \t]|$)|[=-]+[ \t]*$|(?:-[ \t]*){3,}$)")
_MD_ORDERED_MARKER = re.compile(r"^( {0,3}\d{1,9})([.)])(?=[ \t]|$)")


def _md_escape_char(match):
    char = match.group()
    return _MD_HTML.get(char) or "\\" + char


def _md_escape(text, line_start=True):
    """md_text's rule on text that safe_text has already made safe; line_start: the text may begin a line."""
    escaped = _MD_SPECIAL.sub(_md_escape_char, text)
    if line_start:
        escaped = _MD_ORDERED_MARKER.sub(r"\1\\\2", _MD_BLOCK_MARKER.sub(r"\1\\", escaped, count=1), count=1)
    return escaped


def md_text(value):
    """Untrusted text as Markdown inline text that renders as itself: safe_text, then every
    character that could make a link, an image, an autolink, raw HTML, emphasis, strikethrough, code,
    math or a table column escaped (backslash, or an HTML entity for < > &), and a heading, list or
    rule marker at its start escaped. `[fix](//ev.il)` renders as `[fix](//ev.il)`, not as a link."""
    return _md_escape(safe_text(value))


def md_cell(value):
    """A value as a Markdown table cell: cell_text (None as '', floats rounded; safe_text has written
    out any line break), then md_text's escapes, the table pipe included (a cell starts no block, so a
    leading '#' or '1.' is left as it is)."""
    return _md_escape(cell_text(value), line_start=False)


def md_code(value):
    """Text as a Markdown code span, verbatim (safe_text aside): its delimiter is one backtick longer
    than the longest backtick run inside, so nothing inside can close it (CommonMark). '' for ''.
    Not for table cells (GitHub splits a table row at '|' even inside code)."""
    text = safe_text(value)
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_prose(value):
    """A sentence written by straggler that quotes untrusted text (a finding's summary or
    recommendation: 'move NAME (pid 6161) off the trainer's cores: `taskset -pc ...`'): its backtick
    pairs (CommonMark's rule: a run of backticks up to the next run of the same length) as code spans
    (md_code), the rest as md_text. Whatever the quoted text holds, the result has no link, image or
    HTML: code spans show their content as it is, and the rest is escaped."""
    text = safe_text(value)
    runs = list(re.finditer("`+", text))
    out, pos, i = [], 0, 0
    while i < len(runs):
        opener = runs[i]
        closer = next((j for j in range(i + 1, len(runs)) if len(runs[j].group()) == len(opener.group())), None)
        if closer is None:        # no run of its length after it: literal backticks
            i += 1
            continue
        out.append(_md_escape(text[pos:opener.start()], line_start=pos == 0))
        out.append(md_code(text[opener.end():runs[closer].start()]))
        pos = runs[closer].end()
        i = closer + 1
    out.append(_md_escape(text[pos:], line_start=pos == 0))
    return "".join(out)


def md_fence(text, info=""):
    """Multi-line text (SQL) as a fenced code block, its lines verbatim (each safe_text): the fence is
    longer than any backtick run inside (at least ```), so no line can close it (CommonMark)."""
    lines = [safe_text(line) for line in str(text).strip().splitlines()]
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return "\n".join([fence + safe_text(info).replace("`", "")] + lines + [fence])


# ---- HTML and XML ----

_XML_NONCHARS = re.compile("[\ufffe\uffff]")     # what XML 1.0 cannot hold that safe_text keeps


def html_text(value):
    """Untrusted text as HTML text or an attribute value: safe_text, then & < > " ' escaped."""
    return html.escape(safe_text(value), quote=True)


def xml_text(value):
    """Untrusted text for an XML (JUnit) attribute or element: html_text, and U+FFFE/U+FFFF written
    out (\\ufffe) as safe_text writes control characters: XML 1.0 cannot hold them (nor most control
    characters, which safe_text has written out), so the document stays well-formed."""
    return _XML_NONCHARS.sub(lambda m: f"\\u{ord(m.group()):04x}", html_text(value))


# ---- CSV ----

def csv_cell(value):
    """A value as a CSV field: numbers and None (an empty field) as they are, text as safe_text (CSV is
    read in terminals too); quoting is the csv module's. The CSV is for programs (`--csv`, the
    collection's aggregate): values are not rewritten for spreadsheets (a leading apostrophe against
    formulas would change values such as `-bash`, a login shell's process name)."""
    return value if value is None or isinstance(value, (int, float)) else safe_text(value)


def rich_cell(value):
    """cell_text as a rich Text: rich prints it as it is (no markup, no emoji codes)."""
    from rich.text import Text
    return Text(cell_text(value))


def table_text(columns, rows, title=None, width=None):
    """A table as text: rich's box drawing when rich is importable, an aligned plain table otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # the agent runs without rich on a bare node
        return _plain_table(columns, rows, title)
    table = Table(title=rich_cell(title) if title is not None else None, show_lines=False)
    for col in columns:
        table.add_column(rich_cell(col), overflow="fold")
    for row in rows:
        table.add_row(*[rich_cell(v) for v in row])
    buf = io.StringIO()
    Console(file=buf, width=width or 160, force_terminal=False, color_system=None, markup=False, emoji=False,
            highlight=False).print(table)
    return buf.getvalue()


def _plain_table(columns, rows, title=None):
    cells = [[cell_text(c) for c in columns]] + [[cell_text(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))] if columns else []
    lines = [cell_text(title)] if title else []
    for n, r in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def print_table(columns, rows, title=None, file=None):
    (file or sys.stdout).write(table_text(columns, rows, title))


def to_csv(columns, rows):
    """CSV with a header line; text values as safe_text (CSV is read in terminals too), numbers and
    None (an empty field) as they are."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])
    writer.writerows([csv_cell(v) for v in row] for row in rows)
    return buf.getvalue()


def to_json(obj):
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def to_markdown(columns, rows):
    """A Markdown (GitHub) table, every column name and cell through md_cell."""
    out = ["| " + " | ".join(md_cell(c) for c in columns) + " |",
           "|" + "|".join(" --- " for _ in columns) + "|"]
    out += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out) + "\n"
