"""atlas_fast: feature-cache-first prompt tuning of CLIP with ATLaS.

The package is laid out by layer, as docs/architecture.md draws it.

``from atlas_fast import TrainConfig, run, run_group`` is the Python entry point; it is imported on first use, so
importing the package (e.g. for the command line's ``--help``) does not import torch. ``atlas_fast.set_threads(n)``
(or ``"auto"``) fixes the CPU threads of the process, as the command line's ``--threads`` does.
"""

from typing import Any

__version__ = "0.1.0"

_ENGINE = ("TrainConfig", "run", "run_group", "plan_run", "evaluate_saved")


def __getattr__(name: str) -> Any:
    if name in _ENGINE:
        import atlas_fast.engine as engine

        return getattr(engine, name)
    if name == "set_threads":  # CPU threads for this process (atlas_fast.threads); imports nothing heavy
        from atlas_fast.threads import set_threads

        return set_threads
    raise AttributeError(f"module 'atlas_fast' has no attribute {name!r}")
