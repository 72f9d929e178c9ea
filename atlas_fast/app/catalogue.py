"""The registered methods' names, read from the method files without importing them (so the command line's
``--help`` and argument checks do not import torch): every ``register_method(Cls)`` call in
``atlas_fast/methods/*.py`` and the ``name`` and ``learns`` that class declares, the same class attributes the
registry reads. The registry itself (:data:`atlas_fast.methods.registry.METHODS`) stays the truth;
``tests/test_registry.py`` checks the two agree."""

from __future__ import annotations

import ast
import sys
from functools import lru_cache
from pathlib import Path

METHODS_DIR = Path(__file__).resolve().parents[1] / "methods"


@lru_cache(maxsize=1)
def declared_classes() -> tuple[type, ...]:
    """The registered classes of the package's method files as stand-ins: plain classes holding each method class's
    constant attributes, with its bases among the method files' classes, so that an attribute a class inherits
    (CoPrompt's ``reads_pixels`` from IVLP through MaPLe) is found by Python's own lookup, as on the real class."""
    nodes: dict[str, ast.ClassDef] = {}
    registered: list[str] = []
    for path in sorted(METHODS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes.update({node.name: node for node in tree.body if isinstance(node, ast.ClassDef)})
        registered += [node.args[0].id for node in ast.walk(tree)
                       if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_method"
                       and node.args and isinstance(node.args[0], ast.Name)]
    made: dict[str, type] = {}

    def stand_in(name: str) -> type:
        if name not in made:
            node = nodes[name]
            bases = tuple(stand_in(b.id) for b in node.bases if isinstance(b, ast.Name) and b.id in nodes)
            made[name] = type(name, bases or (object,), _class_constants(node))
        return made[name]

    return tuple(stand_in(name) for name in registered if name in nodes)


def declared_methods() -> dict[str, bool]:
    """``{name: learns}`` of every method registered in the package's method files, sorted by name."""
    return dict(sorted((cls.name, getattr(cls, "learns", True)) for cls in declared_classes()
                       if isinstance(getattr(cls, "name", None), str)))


def pixel_method_names() -> list[str]:
    """The shipped methods that train on decoded pixels (``reads_pixels``: they prompt or adapt the image encoder),
    sorted; the others train on cached image features."""
    return sorted(cls.name for cls in declared_classes()
                  if isinstance(getattr(cls, "name", None), str) and getattr(cls, "reads_pixels", False))


def _class_constants(cls: ast.ClassDef) -> dict[str, object]:
    constants = {}
    for statement in cls.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Constant)):
            constants[statement.targets[0].id] = statement.value.value
        elif (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
              and isinstance(statement.value, ast.Constant)):  # ``learns: ClassVar[bool] = True``
            constants[statement.target.id] = statement.value.value
    return constants


def method_names(learning_only: bool = False) -> list[str]:
    """The methods' names, sorted (``learning_only``: without zero-shot CLIP, which learns nothing): those the method
    files declare and, once the registry is imported, any method registered in this process (a user's own)."""
    found = dict(declared_methods())
    registry = sys.modules.get("atlas_fast.methods.registry")  # looked up, not imported: no torch for --help
    if registry is not None:
        found.update({name: cls.learns for name, cls in registry.METHODS.items()})
    return sorted(name for name, learns in found.items() if learns or not learning_only)
