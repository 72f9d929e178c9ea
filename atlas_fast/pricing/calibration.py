"""The calibration store: measured units (:mod:`atlas_fast.pricing.units`) kept in a JSON file under the cache root,
per machine, backbone, device and precision, so a second estimate of the same work measures nothing.

The file (``<cache root>/pricing/calibration.json``) maps a context key (:func:`context_key`) to that context's
units, each under its own key (``step/coop/C=500/B=32/R=4/<config digest>``); docs/estimate.md (section Where the
numbers come from) says what a context is and how a damaged or read-only store is handled. Writes are atomic and
merge what another process stored meanwhile.
"""

from __future__ import annotations

import json
import platform
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from atlas_fast.files import JsonFileError, atomic_write, read_json
from atlas_fast.threads import cpu_model
from atlas_fast.pricing.timing import Unit

CALIBRATION_FILE = Path("pricing") / "calibration.json"
#: the engine's paths the units time; raised when a path changes how long a unit takes (2: the whole step on the
#: device, every cached method batched, length groups in graphed steps), so units measured before are not reused
UNITS_VERSION = 2


def machine_name(device: torch.device) -> str:
    """This machine as a calibration sees it: host name, CPU model and torch's thread count, and the GPU's name on
    CUDA (units measured elsewhere, or with another thread count, do not price this machine)."""
    name = f"{platform.node()}|{cpu_model()}|{torch.get_num_threads()} threads"
    if device.type == "cuda":
        name += f"|{torch.cuda.get_device_name(device)}"
    return name


def context_key(machine: str, backbone_fingerprint: str, device: str, precision: str) -> str:
    """The key of one calibration context (units of an older engine's paths are another context)."""
    return f"{machine}|backbone {backbone_fingerprint[:16]}|{device}|{precision}|units v{UNITS_VERSION}"


class CalibrationStore:
    """The units of one context, read from and written to ``<root>/pricing/calibration.json``.

    :meth:`unit` returns the stored unit of a key or measures it (``measure()``) and stores it; ``measured`` counts
    the units measured by this store. The store is only a cache: a damaged file, context or unit
    (:meth:`Unit.from_dict`) is a miss, measured again, with one warning naming the file."""

    def __init__(self, root: str | Path, context: str) -> None:
        self.path = Path(root) / CALIBRATION_FILE
        self.context = context
        self.measured = 0
        self.units, bad = _sound_units(self._read(warn=True).get(context, {}))
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            warnings.warn(f"pricing calibration {self.path}: {bad[0]}{more}; measuring again.", stacklevel=2)

    def _read(self, warn: bool = False) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        try:
            data = read_json(self.path)
        except JsonFileError as exc:  # a damaged store is only a cache: measure again and replace it
            if warn:
                warnings.warn(f"pricing calibration {exc}; measuring again.", stacklevel=3)
            return {}
        if not isinstance(data, dict):
            if warn:
                warnings.warn(f"pricing calibration {self.path} is not a JSON object; measuring again.",
                              stacklevel=3)
            return {}
        return data

    def get(self, key: str) -> Unit | None:
        return self.units.get(key)

    def unit(self, key: str, measure: Callable[[], Unit], enough: Callable[[Unit], bool] | None = None) -> Unit:
        """The stored unit ``key`` of this context (when ``enough`` of it, if given), or ``measure()``'s (then
        stored in its place)."""
        found = self.units.get(key)
        if found is not None and (enough is None or enough(found)):
            return found
        unit = measure()
        self.measured += 1
        self.units[key] = unit
        self._write(key, unit)
        return unit

    def _write(self, key: str, unit: Unit) -> None:
        data = self._read()
        kept, _ = _sound_units(data.get(self.context, {}))  # what another process stored meanwhile, if usable
        data[self.context] = {k: u.to_dict() for k, u in {**kept, key: unit}.items()}
        text = json.dumps(data, indent=1, sort_keys=True).encode()
        try:
            atomic_write(self.path, lambda f: f.write(text))
        except OSError:  # a read-only cache root: the units still price this estimate, they are just not kept
            pass


def _sound_units(stored: Any) -> tuple[dict[str, Unit], list[str]]:
    """The usable units of one context's stored entry, and what is wrong with the others."""
    if not isinstance(stored, dict):
        return {}, [f"this machine's entry is {type(stored).__name__}, not an object"]
    units, bad = {}, []
    for key, value in stored.items():
        try:
            units[key] = Unit.from_dict(value)
        except ValueError as exc:
            bad.append(f"unit {key!r} {exc}")
    return units, bad
