"""`straggler explain` (moving here from straggler.analysis.explain)."""
from ..analysis.explain import add_arguments, run  # noqa: F401
