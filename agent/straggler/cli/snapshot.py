"""`straggler snapshot` (moving here from straggler.store.snapshot)."""
from ..store.snapshot import add_arguments, run  # noqa: F401
