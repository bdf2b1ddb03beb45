"""`straggler export` (moving here from straggler.analysis.export)."""
from ..analysis.export import add_arguments, run  # noqa: F401
