"""The export's one error class, ExportError, in a module of its own: the plan, the writers and the
Perfetto sink (which needs the optional perfetto package) all raise it without importing each other.
Must hold nothing else."""
from ...errors import StragglerError


class ExportError(StragglerError):
    """The export was refused or failed; the output was not written (or left as it was)."""
