"""``python -m atlas_fast.cli``: the ``atlas-fast`` command without the console script."""

import sys

from atlas_fast.cli import main

sys.exit(main())
