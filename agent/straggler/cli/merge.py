"""`straggler merge` (moving here from straggler.analysis.merge)."""
from ..analysis.merge import add_arguments, run  # noqa: F401
