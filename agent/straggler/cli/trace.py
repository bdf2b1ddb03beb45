"""`straggler trace` (moving here from straggler.agent)."""
from ..agent import add_arguments, run  # noqa: F401
