"""Rendering of tables and reports: rich for people (plain text when rich is missing or the
output is not a terminal), JSON, CSV and Markdown for programs. No logic about what a
table means lives here."""
import csv
import io
import json
import sys


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1e6 else f"{value:.6g}"
    return str(value)


def table_text(columns, rows, title=None, width=None):
    """A table as text: rich's box drawing when rich is importable, an aligned plain table otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # the agent runs without rich on a bare node
        return _plain_table(columns, rows, title)
    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(str(col), overflow="fold")
    for row in rows:
        table.add_row(*[_cell(v) for v in row])
    buf = io.StringIO()
    Console(file=buf, width=width or 160, force_terminal=False, color_system=None).print(table)
    return buf.getvalue()


def _plain_table(columns, rows, title=None):
    cells = [[str(c) for c in columns]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))] if columns else []
    lines = [title] if title else []
    for n, r in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def print_table(columns, rows, title=None, file=None):
    (file or sys.stdout).write(table_text(columns, rows, title))


def to_csv(columns, rows):
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue()


def to_json(obj):
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def to_markdown(columns, rows):
    def esc(v):
        return _cell(v).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(esc(c) for c in columns) + " |",
           "|" + "|".join(" --- " for _ in columns) + "|"]
    out += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
    return "\n".join(out) + "\n"
