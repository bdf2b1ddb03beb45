"""`straggler watch` (moving here from straggler.analysis.watch)."""
from ..analysis.watch import add_arguments, run  # noqa: F401
