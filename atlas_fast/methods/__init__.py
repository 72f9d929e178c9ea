"""Prompt-tuning methods behind one interface (:class:`PromptMethod`); importing this package registers them all."""

from atlas_fast.methods.base import (METHODS, MethodConfig, OptimRecipe, PromptMethod, build_method,
                                     register_method)
from atlas_fast.methods.coop import CoOp, CoOpConfig, coop_recipe

__all__ = ["METHODS", "CoOp", "CoOpConfig", "MethodConfig", "OptimRecipe", "PromptMethod", "build_method",
           "coop_recipe", "register_method"]
