"""Prompt-tuning methods behind one interface (:class:`PromptMethod`).

Each method's file defines its class, config and recipe and registers them with
:func:`~atlas_fast.methods.base.register_method`; importing this package imports every module in it, so a new
method is one new file here (docs/method-zoo.md, section Adding a method). The names below are re-exported for
convenience only: the registry (:data:`METHODS`) is what the rest of atlas_fast reads.
"""

import importlib
import pkgutil

from atlas_fast.methods.base import (METHODS, MethodConfig, MethodEntry, MissingRecipe, OptimRecipe, PromptMethod,
                                     build_method, method_entry, register_method)
from atlas_fast.methods.cocoop import CoCoOp, CoCoOpConfig, cocoop_recipe
from atlas_fast.methods.coop import CoOp, CoOpConfig, coop_recipe
from atlas_fast.methods.dept import (DePT, DePTCoCoOp, DePTCoCoOpConfig, DePTCoOp, DePTCoOpConfig, DePTKgCoOp,
                                     DePTKgCoOpConfig, DePTMaPLe, DePTMaPLeConfig, dept_cocoop_recipe,
                                     dept_coop_recipe, dept_kgcoop_recipe, dept_maple_recipe)
from atlas_fast.methods.ivlp import IVLP, IVLPConfig, ivlp_recipe
from atlas_fast.methods.kgcoop import KgCoOp, KgCoOpConfig, kgcoop_recipe
from atlas_fast.methods.maple import MaPLe, MaPLeConfig, maple_recipe
from atlas_fast.methods.promptsrc import PromptSRC, PromptSRCConfig, gpa_weights, promptsrc_recipe
from atlas_fast.methods.zsclip import ZeroShotCLIP, ZeroShotConfig, zsclip_recipe

for _module in pkgutil.iter_modules(__path__):  # methods added as new files register themselves on import
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["IVLP", "METHODS", "MethodEntry", "method_entry", "CoCoOp", "CoCoOpConfig", "CoOp", "CoOpConfig", "DePT", "DePTCoCoOp",
           "DePTCoCoOpConfig", "DePTCoOp", "DePTCoOpConfig", "DePTKgCoOp", "DePTKgCoOpConfig", "DePTMaPLe",
           "DePTMaPLeConfig", "IVLPConfig", "KgCoOp", "KgCoOpConfig", "MaPLe", "MaPLeConfig", "MethodConfig",
           "MissingRecipe", "OptimRecipe", "PromptMethod", "PromptSRC", "PromptSRCConfig", "ZeroShotCLIP",
           "ZeroShotConfig", "build_method", "cocoop_recipe", "coop_recipe", "dept_cocoop_recipe",
           "dept_coop_recipe", "dept_kgcoop_recipe", "dept_maple_recipe", "gpa_weights", "ivlp_recipe",
           "kgcoop_recipe", "maple_recipe", "promptsrc_recipe", "register_method", "zsclip_recipe"]
