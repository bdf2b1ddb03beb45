"""Small text rules every layer shares, each written once: SQL literals and identifiers, the
one-line form of an error, how untrusted text is printed (safe_text), what a node name may be
(node_name_problem: merge and the fleet client check what the nodes say they are by it), and how
bytes, durations and shares are shown to people.

Pure functions of their arguments: no I/O, no imports from the rest of straggler.
"""
import re
import unicodedata

MAX_NODE_NAME = 255
_UNPRINTABLE_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")   # control, format (bidi), surrogates, line breaks
_NODE_NAME_FORBIDDEN = frozenset(':"\'`\\[]{}')


def sql_quote(text):
    """A string as an SQL literal: 'it''s'."""
    return "'" + str(text).replace("'", "''") + "'"


def sql_literal(value):
    """NULL, an integer (floats are truncated, as the times and pids explain writes are), or a quoted string."""
    if value is None:
        return "NULL"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(int(value))
    return sql_quote(value)


def sql_ident(name):
    """A name as an SQL identifier: "my ""table""."""
    return '"' + str(name).replace('"', '""') + '"'


# What safe_text escapes: C0 and C1 control characters (ESC, CSI, BEL, backspace, carriage return,
# newline, tab, DEL), the bidirectional overrides and isolates (text that reads one way and runs
# another), the Unicode line and paragraph separators, and lone surrogates (undecodable bytes).
_UNSAFE_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                           "\u2028\u2029\ud800-\udfff]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match):
    char = match.group()
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(value):
    """Text from anywhere (a process name, a command line, an SQL result, a node name, a message
    that quotes them) as it is to be printed: str(value) with every character that a terminal
    would act on instead of showing written out as an escape (ESC as \\x1b, a newline as \\n, a
    right-to-left override as \\u202e), so it prints on one line as itself and cannot move the
    cursor, clear the screen, retitle the window or forge a line. Everything else, backslashes,
    brackets and non-ASCII letters included, is kept as it is. The one rule every face uses
    before it prints such text (tables, reports, events, status lines)."""
    text = value if isinstance(value, str) else str(value)
    if _UNSAFE_CHARS.search(text) is None:
        return text
    return _UNSAFE_CHARS.sub(_escape_char, text)


def has_unprintable(text):
    """Whether `text` holds a control, format (bidi), surrogate or line-break character."""
    return any(unicodedata.category(ch) in _UNPRINTABLE_CATEGORIES for ch in text)


def node_name_problem(name):
    """Why `name` cannot be a node name (None when it can): non-empty text of at most MAX_NODE_NAME
    characters, without whitespace or ':' (event ids are NODE:SEQ, as the agent's --node demands),
    without quotes, brackets or braces (no JSON or SQL in disguise), and without control, format or
    line-break characters."""
    if not isinstance(name, str):
        return "a node name (text)"
    if not name:
        return "a non-empty node name"
    if len(name) > MAX_NODE_NAME:
        return f"a node name of at most {MAX_NODE_NAME} characters"
    if has_unprintable(name):
        return "a node name without control characters"
    if any(ch.isspace() or ch in _NODE_NAME_FORBIDDEN for ch in name):
        return "a node name without spaces, ':', quotes, brackets or braces"
    return None


def one_line(exc, limit=None):
    """An exception (or any text) as one line: whitespace runs folded to one space; the exception's
    class name when it says nothing; cut to `limit` characters with '...' when given."""
    text = " ".join(str(exc if exc is not None else "").split())
    if not text and isinstance(exc, BaseException):
        text = exc.__class__.__name__
    if limit is not None and len(text) > limit:
        text = text[:max(0, limit - 3)] + "..."
    return text


def fmt_bytes(n, none="-"):
    """1536 -> '1.5 KiB' (binary units up to TiB); `none` for None."""
    if n is None:
        return none
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0


def fmt_ns(ns):
    """A duration in ns for people: '2.50 s', '12.3 ms', '40 µs', '900 ns' ('' for None)."""
    if ns is None:
        return ""
    ns = float(ns)
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns:.0f} ns"


def fmt_pct(share):
    """A share (0..1) as a whole percentage: 0.253 -> '25%'."""
    return f"{100 * share:.0f}%"
