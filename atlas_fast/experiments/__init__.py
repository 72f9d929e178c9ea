"""One module per table and figure of the ATLaS paper, the project's only experiments folder:
``atlas-fast experiment NAME --help`` (or ``python -m atlas_fast.experiments NAME``); ``atlas-fast experiment --list``
names them with the paper item."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

NOT_EXPERIMENTS = {"common", "__main__"}


def experiment_names() -> list[str]:
    """The experiment modules of this package, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in NOT_EXPERIMENTS)


def load_experiment(name: str) -> ModuleType:
    """An experiment module by name, with the valid names in the error."""
    if name not in experiment_names():
        raise ValueError(f"Unknown experiment {name!r}; valid: {', '.join(experiment_names())}.")
    return importlib.import_module(f"{__name__}.{name}")


def experiment_table() -> list[tuple[str, str, str]]:
    """(name, paper item, what it shows) for every experiment module."""
    rows = []
    for name in experiment_names():
        module = load_experiment(name)
        rows.append((name, module.PAPER, (module.__doc__ or "").strip().splitlines()[0]))
    return rows
