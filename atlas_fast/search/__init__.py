"""Hyper-parameter search over a run's fields, ATLaS knobs and method options with Optuna, selected on the
validation split, pruned from per-epoch validation accuracy, batched on a GPU, stored in a shareable storage
(``atlas-fast search``; docs/search.md).

The names below are imported on first use, so ``search.space`` (what the command line checks ``--param`` with) is
importable without torch: a typo in ``--param`` is refused before any heavy import."""

from typing import Any

from atlas_fast.vocabulary import OBJECTIVES, PRUNERS, SAMPLERS

_NAMES = {"Choice": "space", "Range": "space", "choice": "space", "integers": "space", "log_uniform": "space",
          "parse_param": "space", "uniform": "space", "run_search": "run", "SearchConfig": "study",
          "SearchResult": "study", "run_study": "study"}

__all__ = ["Choice", "OBJECTIVES", "PRUNERS", "Range", "SAMPLERS", "SearchConfig", "SearchResult", "choice",
           "integers", "log_uniform", "parse_param", "run_search", "run_study", "uniform"]


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
