"""Prompt-tuning methods behind one interface (:class:`PromptMethod`); importing this package registers them all."""

from atlas_fast.methods.base import (METHODS, MethodConfig, OptimRecipe, PromptMethod, build_method,
                                     register_method)
from atlas_fast.methods.coop import CoOp, CoOpConfig, coop_recipe
from atlas_fast.methods.ivlp import IVLP, IVLPConfig, ivlp_recipe
from atlas_fast.methods.maple import MaPLe, MaPLeConfig, maple_recipe
from atlas_fast.methods.promptsrc import PromptSRC, PromptSRCConfig, gpa_weights, promptsrc_recipe

__all__ = ["IVLP", "METHODS", "CoOp", "CoOpConfig", "IVLPConfig", "MaPLe", "MaPLeConfig", "MethodConfig",
           "OptimRecipe", "PromptMethod", "PromptSRC", "PromptSRCConfig", "build_method", "coop_recipe",
           "gpa_weights", "ivlp_recipe", "maple_recipe", "promptsrc_recipe", "register_method"]
