"""`straggler query` (moving here from straggler.store.query)."""
from ..store.query import add_arguments, run  # noqa: F401
