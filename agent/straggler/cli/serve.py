"""`straggler serve` (moving here from straggler.api.server)."""
from ..api.server import add_arguments, run  # noqa: F401
