"""Prompt-tuning methods behind one interface (:class:`PromptMethod`); importing this package registers them all."""

from atlas_fast.methods.base import (METHODS, MethodConfig, OptimRecipe, PromptMethod, build_method,
                                     register_method)

__all__ = ["METHODS", "MethodConfig", "OptimRecipe", "PromptMethod", "build_method", "register_method"]
