"""The live watch's events as lines for people (straggler watch's text output, the watch action).
Node names, messages and summaries come from the nodes: each line is printed through
straggler.text.safe_text."""
import json

from ..text import safe_text
from .report import whatif_text


def format_event(e):
    """One event as text: one line, or two for an onset or a cause change (the finding's summary
    indented below), each line safe_text."""
    return "\n         ".join(safe_text(line) for line in _event_lines(e))


def _event_lines(e):
    t = e.get("time", "")[11:19]
    kind = e["event"]
    if kind == "start":
        return [f"{t} watching {len(e['nodes'])} node(s) every {e['interval_s']:g} s: the last {e['window_s']:g} s "
                f"against the {e['baseline_s']:g} s before"]
    if kind in ("onset", "cause-change"):
        rank = f" rank {e['rank']}" if e.get("rank") is not None else ""
        share = f" ({e['share']:.0%} of its excess)" if e.get("share") is not None else ""
        moved = f"; the step time moved {e['step_moved_s']:g} s ago" if e.get("step_moved_s") is not None else ""
        waits = (f"; it waits {e['wait_pct']:g}% for its peers vs {e['others_wait_pct']:g}%"
                 if e.get("wait_pct") is not None and e.get("others_wait_pct") is not None else "")
        head = "STRAGGLER" if kind == "onset" else f"CAUSE CHANGED (was {e.get('previous_cause')})"
        return [f"{t} {head} {e['node']}{rank}: {e['cause']}{share}{waits}{moved}", e.get("summary", "")]
    if kind == "recovered":
        lost = f", the job lost {e['lost_s']:g} s to it" if e.get("lost_s") is not None else ""
        return [f"{t} RECOVERED {e['node']}: {e.get('reason') or 'no longer the straggler'} "
                f"({e.get('cause')} lasted {e['lasted_s']:g} s{lost})"]
    if kind == "lost":
        return [f"{t} LOST {e['node']} ({e['status']}): {e['message']}; watching the others"]
    if kind == "back":
        return [f"{t} BACK {e['node']} answers again"]
    if kind == "imbalance":
        return [f"{t} IMBALANCE (no node's fault): {e.get('summary') or ''}"]
    if kind == "balanced":
        return [f"{t} BALANCED: the job no longer loses its time to imbalance (it did for {e['lasted_s']:g} s)"]
    if kind == "end":
        return ([f"{t} watch ended: {e['reason']}" + (f" (straggler: {e['straggler']})" if e.get("straggler") else "")]
                + [f"over the time the watch held, {line}" for line in whatif_text(e.get("window"))])
    return [f"{t} {json.dumps(e, default=str)}"]
