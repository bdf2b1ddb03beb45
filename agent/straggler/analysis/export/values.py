"""A bad value in the database that stopped an export, named in one line: the table, the column, the
node, the row and the value (merge.values' rules: a text where an integer belongs, a blob where text
does, JSON that is not). merge refuses such values, so they are in a database changed after its merge
or written by an older straggler; export looks for them only once something failed (a sound export
reads nothing more), the tables export and explain read first.

Only reads the database (opened read-only); must not write anything.
"""
from ..merge import values
from ..merge.errors import show
from .errors import ExportError


def refuse_bad_values(db_path):
    """Raise ExportError naming the first bad value of db_path; return when it has none (or cannot
    be read: the failure that led here then stands)."""
    line = values.bad_value_line(db_path, show)
    if line:
        raise ExportError(f"{db_path}: {line}; export cannot draw a bad value (merge the node stores again: merge "
                          f"refuses such values, naming the store that holds one)") from None
