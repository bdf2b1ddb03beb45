"""`straggler pki` (moving here from straggler.pki)."""
from ..pki import add_arguments, run  # noqa: F401
