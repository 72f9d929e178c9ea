"""One module per table and figure of the ATLaS paper, the project's only experiments folder.

The folder sits at the top of the repository (``experiments/``) and installs as ``atlas_fast.experiments``
(setup.py's ``package_dir``), so ``atlas-fast experiment NAME --help`` and ``python -m atlas_fast.experiments NAME``
run it from any folder; ``atlas-fast experiment --list`` names the modules with the paper item of each."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from atlas_fast.errors import did_you_mean

NOT_EXPERIMENTS = {"common", "__main__"}


def experiment_names() -> list[str]:
    """The experiment modules of this package, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in NOT_EXPERIMENTS)


def load_experiment(name: str) -> ModuleType:
    """An experiment module by name, with the valid names in the error."""
    if name not in experiment_names():
        raise ValueError(f"Unknown experiment {name!r}{did_you_mean(name, experiment_names())}; valid: {', '.join(experiment_names())}.")
    return importlib.import_module(f"{__name__}.{name}")


def summary(doc: str | None) -> str:
    """A module docstring's first paragraph on one line: what ``--help`` and ``--list`` say the module does (its
    first line alone may stop mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def experiment_table() -> list[tuple[str, str, str]]:
    """(name, paper item, what it shows) for every experiment module, read from the modules' source (their
    docstring and ``PAPER``) without importing them, so ``atlas-fast experiment --list`` starts without torch."""
    rows = []
    for name in experiment_names():
        tree = ast.parse(Path(__path__[0], f"{name}.py").read_text())
        paper = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "PAPER" for t in node.targets))
        rows.append((name, paper, summary(ast.get_docstring(tree))))
    return rows
