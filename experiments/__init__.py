"""One module per table and figure of the ATLaS paper, runnable from the repository root::

    python -m experiments.table3_base_to_new --help      # = atlas-fast experiment table3_base_to_new --help

Each module here only starts its packaged twin in ``atlas_fast/experiments/`` (where the runs and the report are
defined), so an installed atlas_fast runs the same experiments through ``atlas-fast experiment NAME``.
"""

from __future__ import annotations

import sys


def run_when_main(module_name: str, experiment: str) -> None:
    """Run ``atlas-fast experiment <experiment> <argv>`` and exit, when the calling module is ``__main__``."""
    if module_name == "__main__":
        from atlas_fast.app.cli import main

        sys.exit(main(["experiment", experiment, *sys.argv[1:]]))
