"""Rendering of tables and reports: rich for people (plain text when rich is missing or the
output is not a terminal), JSON, CSV and Markdown for programs. No logic about what a
table means lives here.

Every cell, column name and title is untrusted text (process names, command lines, SQL results,
node names): it is printed as text, never as markup, with control characters written out
(straggler.text.safe_text). rich gets Text objects, which it does not parse (a process named
`[/bold]` prints as is; `:smile:` stays words). JSON keeps the exact values (json escapes them)."""
import csv
import io
import json
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
    def field(value):
        return value if value is None or isinstance(value, (int, float)) else safe_text(value)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([field(c) for c in columns])
    writer.writerows([field(v) for v in row] for row in rows)
    return buf.getvalue()


def to_json(obj):
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def to_markdown(columns, rows):
    def esc(v):
        return cell_text(v).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(esc(c) for c in columns) + " |",
           "|" + "|".join(" --- " for _ in columns) + "|"]
    out += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
    return "\n".join(out) + "\n"
