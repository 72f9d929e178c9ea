"""``python -m atlas_fast.experiments NAME [options]``: the same as ``atlas-fast experiment NAME [options]``."""

import sys

from atlas_fast.cli import main

sys.exit(main(["experiment", *sys.argv[1:]]))
