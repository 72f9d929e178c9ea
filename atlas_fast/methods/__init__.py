"""Prompt-tuning methods behind one interface (:class:`~atlas_fast.methods.base.PromptMethod`).

Each method's file defines its class (which declares its name, printed name, recipe and data path), config and
recipe, and registers the class with :func:`~atlas_fast.methods.base.register_method`; importing this package
imports every module in it, so a new method is one new file here (docs/method-zoo.md, section Adding a method).
The registry, :data:`atlas_fast.methods.base.METHODS`, is what the rest of atlas_fast reads; import a method's
names from its own module (``from atlas_fast.methods.coop import CoOp``).
"""

import importlib
import pkgutil

from atlas_fast.methods.base import METHODS  # noqa: F401  (the registry: complete once this package is imported)

for _module in pkgutil.iter_modules(__path__):  # every method file registers its methods on import
    importlib.import_module(f"{__name__}.{_module.name}")
