"""Old names that users' code may still call, kept working with a :class:`DeprecationWarning` that names the new one.

Each word of atlas_fast's vocabulary has one name (docs/architecture.md, section Names); where a name changed or
a definition moved, its old spelling stays reachable here for a while:

- :func:`moved_names` makes a module's ``__getattr__`` answer an old module-level name with its new home;
- :func:`renamed_fields` lets a dataclass take an old field name as a keyword and read it as an attribute;
- :func:`renamed_attribute` makes an old attribute or method name of a class read the new one.

Imports nothing heavy; a target is imported only when its old name is used.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from typing import Any, Callable, Mapping


def _warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is deprecated; use {new}.", DeprecationWarning, stacklevel=stacklevel)


def moved_names(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: each old name of ``names`` (``old -> "package.module:new"``) warns
    and returns the new object; any other name is an ``AttributeError`` as usual."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target_module, _, target = names[name].partition(":")
        _warn(f"{module}.{name}", f"{target_module}.{target}")
        return getattr(importlib.import_module(target_module), target)

    return __getattr__


def renamed_fields(renames: Mapping[str, str]) -> Callable[[type], type]:
    """Class decorator for a dataclass whose fields ``old -> new`` were renamed: ``Cls(old=...)`` (and
    ``dataclasses.replace(obj, old=...)``) set the new field, ``obj.old`` reads and writes it, each with a warning;
    ``Cls(old=..., new=...)`` is refused with a ``TypeError`` naming both (neither may silently win)."""

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for old, new in renames.items():
                if old in kwargs and new in kwargs and not _called_by_replace():
                    raise TypeError(f"{cls.__name__} got both {old}={kwargs[old]!r} (the old name) and "
                                    f"{new}={kwargs[new]!r}; give {new} only.")
                if old in kwargs:
                    _warn(f"{cls.__name__}({old}=...)", f"{cls.__name__}({new}=...)")
                    kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        for old, new in renames.items():
            setattr(cls, old, _renamed_property(cls.__name__, old, new))
        return cls

    return decorate


def _called_by_replace() -> bool:
    """Whether the dataclass being built is ``dataclasses.replace``'s copy: it passes every current field beside
    the changes, so an old name among the changes meets the new one without the caller having given both."""
    frame = sys._getframe(2)  # the decorated __init__'s caller
    return frame.f_globals.get("__name__") == "dataclasses"


def _renamed_property(owner: str, old: str, new: str) -> property:
    def get(self: Any) -> Any:
        _warn(f"{owner}.{old}", f"{owner}.{new}")
        return getattr(self, new)

    def set_(self: Any, value: Any) -> None:
        _warn(f"{owner}.{old}", f"{owner}.{new}")
        setattr(self, new, value)

    return property(get, set_)


class renamed_attribute:
    """A class attribute ``old`` that reads ``new`` (on the class or an instance) with a warning; a subclass that
    assigns ``old`` itself overrides it (see :func:`atlas_fast.methods.base.register_method`)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, instance: Any, owner: type) -> Any:
        _warn(f"{owner.__name__}.{self.old}", f"{owner.__name__}.{self.new}")
        return getattr(owner if instance is None else instance, self.new)
