"""The one rule for a unit's own word (a GPU's, devices.py; a node's links, network.py): a unit is named
only when its kind of evidence stands out, on at most a share of the units seen; a kind on more of them
is a condition of the fleet or the fabric, named by nobody. Evidence objects carry `.kind` (None:
nothing)."""


def by_kind(evidence):
    """{kind: [evidence]} of the units that show something."""
    out = {}
    for ev in evidence.values():
        if ev.kind:
            out.setdefault(ev.kind, []).append(ev)
    return out


def standing_out(evidence, max_alike, order):
    """The units whose kind is on at most max_alike of all those seen (none among fewer than two),
    sorted by `order`."""
    total = len(evidence)
    if total < 2:
        return []
    return sorted((ev for evs in by_kind(evidence).values() if len(evs) / total <= max_alike for ev in evs), key=order)


def alike(evidence, max_alike):
    """The kinds more than max_alike of the units show alike: {kind: [evidence]}."""
    total = len(evidence)
    return {k: v for k, v in by_kind(evidence).items() if total and len(v) / total > max_alike}
