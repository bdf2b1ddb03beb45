"""`straggler status` (moving here from straggler.status)."""
from ..status import add_arguments, run  # noqa: F401
