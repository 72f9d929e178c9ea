"""Prompt-tuning methods behind one interface (:class:`~atlas_fast.methods.base.PromptMethod`).

Each method's file defines and registers its class, config and recipe; importing this package imports every
module, so a new method is one new file (docs/method-zoo.md, section Adding a method). The rest of atlas_fast reads
:data:`atlas_fast.methods.registry.METHODS`.
"""

import importlib
import pkgutil

from atlas_fast.methods.registry import METHODS  # noqa: F401  (the registry: complete once this package is imported)

# The registry's order (the command line's choices, the report's rows): the paper's hosts in its order, then the
# methods added after it, each file's methods in the order they are defined, then any other file by name. It is set
# here and not by import order, which a file importing another (CoPrompt imports MaPLe) would shuffle.
ORDER = ("zsclip", "coop", "cocoop", "kgcoop", "ivlp", "maple", "dept", "promptsrc", "clip_lora", "tcp", "kdpl",
         "coprompt", "mmrl", "promptkd")

_FILES = [module.name for module in pkgutil.iter_modules(__path__)]
for _file in _FILES:  # every method file registers its methods on import
    importlib.import_module(f"{__name__}.{_file}")


def _place(item) -> tuple:
    file = item[1].__module__.rpartition(".")[2]
    return (ORDER.index(file), "") if file in ORDER else (len(ORDER), file)


_ordered = sorted(METHODS.items(), key=_place)  # stable: a file's methods keep their definition order
METHODS.clear()
METHODS.update(_ordered)
