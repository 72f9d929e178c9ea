"""The registered methods' names, read from the method files without importing them (so the command line's
``--help`` and argument checks do not import torch): every ``register_method(Cls)`` call in
``atlas_fast/methods/*.py`` and the ``name`` and ``learns`` that class declares, the same class attributes the
registry reads. The registry itself (:data:`atlas_fast.methods.base.METHODS`) stays the truth;
``tests/test_registry.py`` checks the two agree."""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

METHODS_DIR = Path(__file__).resolve().parents[1] / "methods"


@lru_cache(maxsize=1)
def declared_methods() -> dict[str, bool]:
    """``{name: learns}`` of every method registered in the package's method files, sorted by name."""
    found: dict[str, bool] = {}
    for path in sorted(METHODS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_method" and node.args
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in classes):
                attributes = _class_constants(classes[node.args[0].id])
                if "name" in attributes:
                    found[attributes["name"]] = attributes.get("learns", True)
    return dict(sorted(found.items()))


def _class_constants(cls: ast.ClassDef) -> dict[str, object]:
    constants = {}
    for statement in cls.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Constant)):
            constants[statement.targets[0].id] = statement.value.value
    return constants


def method_names(learning_only: bool = False) -> list[str]:
    """The methods' names, sorted (``learning_only``: without zero-shot CLIP, which learns nothing): those the method
    files declare and, once the registry is imported, any method registered in this process (a user's own)."""
    found = dict(declared_methods())
    registry = sys.modules.get("atlas_fast.methods.base")  # looked up, not imported: no torch for --help
    if registry is not None:
        found.update({name: cls.learns for name, cls in registry.METHODS.items()})
    return sorted(name for name, learns in found.items() if learns or not learning_only)
