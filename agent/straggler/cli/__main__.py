"""`python -m straggler.cli COMMAND …`: the same as the `straggler` command."""
import sys

from . import main

sys.exit(main())
