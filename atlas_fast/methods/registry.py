"""The registry of method classes (:data:`METHODS`): every method file registers its classes with
:func:`register_method`, and the rest of atlas_fast finds a method by name (:func:`method_class`,
:func:`build_method`). Importing :mod:`atlas_fast.methods` imports every method file, so the registry is complete
once the package is imported."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from atlas_fast.clip.backbones import Backbone
    from atlas_fast.methods.base import PromptMethod
    from atlas_fast.methods.config import MethodConfig


METHODS: dict[str, type[PromptMethod]] = {}
# What a registered class must declare itself (inheriting them would register a second method under its base's
# name, recipe function or printed name).
OWN_DECLARATIONS = ("name", "printed_name", "recipe_function")


def register_method(cls: type[PromptMethod]) -> type[PromptMethod]:
    """Make ``cls`` known under ``cls.name``; every method file calls this once for each method it defines."""
    missing = [attribute for attribute in OWN_DECLARATIONS if attribute not in vars(cls)]
    if missing:
        raise ValueError(f"{cls.__name__} must declare {', '.join(missing)} itself to be registered")
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"Two prompt methods are registered as {cls.name!r}")
    from atlas_fast.methods.pixel_method import PixelMethod

    if cls.reads_pixels != issubclass(cls, PixelMethod):
        raise ValueError(f"{cls.__name__} must read pixels exactly when it derives from PixelMethod (the pixel "
                         f"contract: atlas_fast.methods.pixel_method), got reads_pixels={cls.reads_pixels}")
    config_fields = {f.name for f in fields(cls.config_class)}
    unknown = sorted(set(cls.depth_options) - config_fields)
    if unknown:
        raise ValueError(f"{cls.name}: depth options {unknown} are not fields of {cls.config_class.__name__}")
    METHODS[cls.name] = cls
    return cls


def method_class(name: str) -> type[PromptMethod]:
    """The registered method ``name``, with the known names in the error."""
    import atlas_fast.methods  # noqa: F401  (importing the package registers every method)

    if name not in METHODS:
        raise ValueError(f"Unknown prompt method {name!r}; known: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


def build_method(name: str, backbone: Backbone, classnames: Sequence[str],
                 config: MethodConfig | None = None, runs: int = 1) -> PromptMethod:
    """Build a registered method for ``classnames`` holding ``runs`` runs (config defaults to the method's config
    class defaults)."""
    return method_class(name).build(backbone, classnames, config, runs)
