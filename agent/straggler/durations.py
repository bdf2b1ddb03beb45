"""Durations as people write them: `300`, `90s`, `5m`, `1h`, `1.5h`, `2d` -> seconds (float).

The one rule for every option that takes a length of time from a person or a playbook
(`straggler trace --duration`, `--max-age`; the Ansible role's straggler_agent_duration, whose
argument check uses DURATION_PATTERN's text). A bare number is seconds.
"""
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
