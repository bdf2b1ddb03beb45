"""Durations and time bounds as people write them.

parse_duration: `300`, `90s`, `5m`, `1h`, `1.5h`, `2d` -> seconds (float). The one rule for every
option that takes a length of time from a person or a playbook (`straggler trace --duration`,
`--max-age`; the Ansible role's straggler_agent_duration, whose argument check uses
DURATION_PATTERN's text). A bare number is seconds.

parse_time_bound: a point in a trace, `--since`/`--until` of `straggler export` and `straggler
explain`: seconds from the trace's start (`30`, `30s`, `1.5`) or an ISO-8601 time (UTC when it
names no zone). Each caller says where its trace starts; nothing here reads a trace.
"""
import datetime
import math
import re

from .errors import UsageError

UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The accepted forms, also used (as text) by the role's argument check.
DURATION_PATTERN = r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhd]?)\s*$"
_DURATION = re.compile(DURATION_PATTERN, re.IGNORECASE)


def parse_duration(text, option="--duration") -> float:
    """'300' -> 300.0, '90s' -> 90.0, '5m' -> 300.0, '1h' -> 3600.0, '2d' -> 172800.0.

    Numbers (int/float) are taken as seconds. Negative, non-finite or unreadable values raise
    UsageError with one line naming `option` and the accepted forms."""
    if isinstance(text, bool):
        raise UsageError(f"{option} {text!r}: give seconds (300) or a number with s, m, h or d (90s, 5m, 1h)")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise UsageError(f"{option} {text!r}: give seconds (300) or a number with s, m, h or d (90s, 5m, 1h)")
        value = float(match.group(1)) * UNITS[match.group(2).lower()]
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{option} {text!r}: must be a finite length of time >= 0")
    return value


TIME_BOUND_FORMS = "seconds from the trace's start (30, 90s) or an ISO-8601 time (2026-01-01T02:00:00, UTC if no zone)"


def time_bound(value, option="time bound"):
    """A --since/--until as given -> ("offset", ns from the trace's start) or ("wall", ns since the
    epoch, UTC). Numbers (int/float) are seconds from the start. Unreadable or non-finite values raise
    UsageError with one line naming `option` and the accepted forms."""
    if isinstance(value, bool):
        raise UsageError(f"{option} {value!r}: expected {TIME_BOUND_FORMS}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text.rstrip("s"))
        except ValueError:
            seconds = None
        if seconds is None:
            try:
                dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise UsageError(f"{option} {value!r}: expected {TIME_BOUND_FORMS}") from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=datetime.timezone.utc)
            return "wall", int(dt.timestamp() * 1e9)
    if not math.isfinite(seconds):
        raise UsageError(f"{option} {value!r}: expected {TIME_BOUND_FORMS}")
    return "offset", int(seconds * 1e9)


def parse_time_bound(value, trace_start_ns, option="time bound"):
    """--since/--until -> ns on the trace's timeline (None stays None): seconds from `trace_start_ns`
    ('30', '30s', '1.5', 30), or an ISO-8601 time as ns since the epoch (UTC if it names no zone)."""
    if value is None:
        return None
    kind, ns = time_bound(value, option)
    return trace_start_ns + ns if kind == "offset" else ns
