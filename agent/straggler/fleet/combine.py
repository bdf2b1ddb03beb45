"""One table from the hosts' answers to one SQL: the rule every path uses (the fleet client over
HTTPS, `straggler fleet query`, and the collection's aggregate over Ansible's own connection), so
the same SQL gives the same table whichever way it travelled.

The rule (combine_answers):
- Columns: the union of the answering hosts' columns in first-seen order: the first answering
  host's columns in its order, then each later host's new columns appended in its order. A name
  a host selects twice (SELECT 1 AS a, 2 AS a) is two columns (its 1st and 2nd `a`), so equal
  column lists always line up position by position.
- A `node` column comes first, holding each row's node name, unless the SQL selected a column
  named `node`; then that column stays where the union puts it, and a host whose answer lacks it
  gets its own name there (the node column is never null).
- Rows: every answering host's rows, in the hosts' order, each row's values placed by column
  name; a column the host did not return is null (None) in its rows.
- A host whose columns differ from the first answering host's (other names, fewer, more, or
  another order) is kept, not dropped; its note says how ("columns differ: ..."). Hosts with the
  same columns get an empty note.
- A host answers for itself (identity_problem, shared_names: the one identity rule of every path,
  HTTPS and Ansible's connection alike): the node it names is a node name, the one the caller knows
  it is when it knows (the certificate's name, the inventory host's node name), a `node` column it
  returns holds that name in every row, and no two hosts name one node. The caller refuses a host's
  answer that breaks it (status wrong-node, one line saying why), before combining.

Pure: no I/O, no Ansible; plain lists in, plain lists out.
"""
from ..text import node_name_problem

NODE_COLUMN = "node"


def _keys(columns):
    """Column keys that keep repeated names apart: (name, its occurrence number in this list)."""
    seen = {}
    keys = []
    for name in columns:
        name = str(name)
        seen[name] = seen.get(name, 0) + 1
        keys.append((name, seen[name]))
    return keys


def _names(keys):
    return ", ".join(name for name, _ in keys)


def columns_note(reference, columns):
    """'' when `columns` equals `reference`, else one line: 'columns differ: ...' saying which of
    the first host's columns this host lacks (null in its rows), which it adds, or that the order differs."""
    reference_keys, keys = _keys(reference), _keys(columns)
    if keys == reference_keys:
        return ""
    missing = [key for key in reference_keys if key not in keys and key != (NODE_COLUMN, 1)]
    extra = [key for key in keys if key not in reference_keys]
    parts = []
    if missing:
        parts.append(f"lacks {_names(missing)} (null in its rows)")
    if (NODE_COLUMN, 1) in reference_keys and (NODE_COLUMN, 1) not in keys:
        parts.append(f"lacks {NODE_COLUMN} (its node name is used)")
    if extra:
        parts.append(f"adds {_names(extra)}")
    if not parts:
        parts.append("same columns in another order (lined up by name)")
    return "columns differ: " + "; ".join(parts)


def foreign_node(name, columns, rows):
    """The first value of the host's `node` column (its first one, the one the table keys on) that
    is not `name`, as (value,); None when every row is the host's own, or it has no such column."""
    columns = [str(c) for c in columns or []]
    if NODE_COLUMN not in columns:
        return None
    at = columns.index(NODE_COLUMN)
    return next(((row[at],) for row in rows or [] if at < len(row) and row[at] != name), None)


def shown(value, limit=60):
    """A value a node sent, for a one-line message: repr (quotes, escapes), shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def identity_problem(origin, claimed, expected=None, columns=None, rows=None):
    """Why an answer that came from `origin` (an address, an inventory host) cannot be taken as node
    `claimed`'s, as one line; None when it can: `claimed` must be a node name, be `expected` when the
    caller knows which node `origin` is, and hold every value of the answer's `node` column."""
    problem = node_name_problem(claimed)
    if problem:
        return f"{origin} answered as node {shown(claimed)}, not {problem}; refusing its answer"
    if expected is not None and claimed != expected:
        return (f"{origin} answered as node {shown(claimed)}, but it is {expected}; refusing its answer: a node "
                f"cannot answer as another")
    foreign = foreign_node(claimed, columns, rows)
    if foreign is not None:
        return (f"{origin} (node {claimed}) answered rows of node {shown(foreign[0])}; refusing its answer: a node "
                f"cannot answer for another")
    return None


def shared_names(claims):
    """The node names two or more origins answered as: {node: [origin, ...]} from [(origin, node)]
    (each of them is refused: which one is the node cannot be told)."""
    by_node = {}
    for origin, node in claims:
        by_node.setdefault(node, []).append(origin)
    return {node: origins for node, origins in by_node.items() if len(origins) > 1}


def shared_name_message(node, origins):
    return (f"{', '.join(str(o) for o in origins)} all answered as node {node}; refusing each: a node cannot answer "
            f"as another (give each agent its own --node, or say which node each address is)")


def combine_answers(answers):
    """(columns, rows, notes) from the answering hosts' answers; see the module docstring.

    answers: a list of (node_name, columns, rows), one per answering host, in the order the rows
    should appear (hosts that did not answer are left out by the caller).
    notes: one string per answer, in the same order: '' or 'columns differ: ...'."""
    answers = [(str(name) if name is not None else "", list(columns or []), list(rows or []))
               for name, columns, rows in answers]
    if not answers:
        return [], [], []
    union = []
    for _, columns, _ in answers:
        for key in _keys(columns):
            if key not in union:
                union.append(key)
    node_key = (NODE_COLUMN, 1)
    selects_node = node_key in union
    out_columns = ([] if selects_node else [NODE_COLUMN]) + [name for name, _ in union]
    reference = answers[0][1]
    rows, notes = [], []
    for name, columns, host_rows in answers:
        notes.append(columns_note(reference, columns))
        position = {key: index for index, key in enumerate(_keys(columns))}
        for row in host_rows:
            row = list(row)
            values = []
            for key in union:
                index = position.get(key)
                if index is not None and index < len(row):
                    values.append(row[index])
                elif key == node_key:
                    values.append(name)
                else:
                    values.append(None)
            rows.append(values if selects_node else [name] + values)
    return out_columns, rows, notes
