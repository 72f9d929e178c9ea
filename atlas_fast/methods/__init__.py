"""Prompt-tuning methods behind one interface (:class:`PromptMethod`); importing this package registers them all."""

from atlas_fast.methods.base import (METHODS, MethodConfig, MissingRecipe, OptimRecipe, PromptMethod, build_method,
                                     register_method)
from atlas_fast.methods.cocoop import CoCoOp, CoCoOpConfig, cocoop_recipe
from atlas_fast.methods.coop import CoOp, CoOpConfig, coop_recipe
from atlas_fast.methods.dept import (DePT, DePTCoCoOp, DePTCoCoOpConfig, DePTCoOp, DePTCoOpConfig, DePTKgCoOp,
                                     DePTKgCoOpConfig, dept_cocoop_recipe, dept_coop_recipe, dept_kgcoop_recipe)
from atlas_fast.methods.ivlp import IVLP, IVLPConfig, ivlp_recipe
from atlas_fast.methods.kgcoop import KgCoOp, KgCoOpConfig, kgcoop_recipe
from atlas_fast.methods.maple import MaPLe, MaPLeConfig, maple_recipe
from atlas_fast.methods.promptsrc import PromptSRC, PromptSRCConfig, gpa_weights, promptsrc_recipe
from atlas_fast.methods.zsclip import ZeroShotCLIP, ZeroShotConfig, zsclip_recipe

RECIPES = {"zsclip": zsclip_recipe, "coop": coop_recipe, "cocoop": cocoop_recipe, "kgcoop": kgcoop_recipe,
           "dept-coop": dept_coop_recipe, "dept-cocoop": dept_cocoop_recipe, "dept-kgcoop": dept_kgcoop_recipe,
           "ivlp": ivlp_recipe, "maple": maple_recipe, "promptsrc": promptsrc_recipe}
"""Per method: ``(family, setting, shots, dataset) -> (method config, OptimRecipe)`` (``methods.md`` §10)."""

__all__ = ["IVLP", "METHODS", "RECIPES", "CoCoOp", "CoCoOpConfig", "CoOp", "CoOpConfig", "DePT", "DePTCoCoOp",
           "DePTCoCoOpConfig", "DePTCoOp", "DePTCoOpConfig", "DePTKgCoOp", "DePTKgCoOpConfig", "IVLPConfig", "KgCoOp",
           "KgCoOpConfig", "MaPLe", "MaPLeConfig", "MethodConfig", "MissingRecipe", "OptimRecipe", "PromptMethod",
           "PromptSRC", "PromptSRCConfig", "ZeroShotCLIP", "ZeroShotConfig", "build_method", "cocoop_recipe",
           "coop_recipe", "dept_cocoop_recipe", "dept_coop_recipe", "dept_kgcoop_recipe", "gpa_weights",
           "ivlp_recipe", "kgcoop_recipe", "maple_recipe", "promptsrc_recipe", "register_method", "zsclip_recipe"]
