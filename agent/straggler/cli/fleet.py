"""`straggler fleet` (moving here from straggler.fleet.cli)."""
from ..fleet.cli import add_arguments, run  # noqa: F401
