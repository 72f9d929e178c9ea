"""The run engine: plan (spec) -> feed -> loop -> evaluate -> record. ``run``/``run_group`` are its entry points.

The names below are imported on first use, so a light module of the package (``validity``, ``run_identity``,
``seal``: what the report reads) is importable without torch."""

from typing import Any

_NAMES = {"TrainConfig": "config", "RunSpec": "spec", "plan_run": "spec", "evaluate_saved": "pipeline",
          "run": "pipeline", "run_group": "pipeline", "run_specs": "pipeline"}

__all__ = ["RunSpec", "TrainConfig", "evaluate_saved", "plan_run", "run", "run_group", "run_specs"]


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
