"""The calibration store: measured units (:mod:`atlas_fast.pricing.units`) kept in a JSON file under the cache root,
per machine, backbone, device and precision, so a second estimate of the same work measures nothing.

The file (``<cache root>/pricing/calibration.json``) maps a context key (:func:`context_key`: this machine's name, CPU
model and thread count or GPU name, the backbone's fingerprint, the device type and the precision) to that context's
units, each under its own key (``step/coop/C=500/B=32/R=4/<config digest>``). Writes are atomic (a reader never sees
half a file) and merge what another process stored meanwhile. A unit measured on another machine, backbone or
precision is never used: that is another context.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any, Callable

import torch

from atlas_fast.files import atomic_write
from atlas_fast.threads import cpu_model
from atlas_fast.pricing.units import Unit

CALIBRATION_FILE = Path("pricing") / "calibration.json"


def machine_name(device: torch.device) -> str:
    """This machine as a calibration sees it: host name, CPU model and torch's thread count, and the GPU's name on
    CUDA (units measured elsewhere, or with another thread count, do not price this machine)."""
    name = f"{platform.node()}|{cpu_model()}|{torch.get_num_threads()} threads"
    if device.type == "cuda":
        name += f"|{torch.cuda.get_device_name(device)}"
    return name


def context_key(machine: str, backbone_fingerprint: str, device: str, precision: str) -> str:
    """The key of one calibration context."""
    return f"{machine}|backbone {backbone_fingerprint[:16]}|{device}|{precision}"


class CalibrationStore:
    """The units of one context, read from and written to ``<root>/pricing/calibration.json``.

    :meth:`unit` returns the stored unit of a key or measures it (``measure()``) and stores it; ``measured`` counts
    the units measured by this store (a second estimate of the same work measures none)."""

    def __init__(self, root: str | Path, context: str) -> None:
        self.path = Path(root) / CALIBRATION_FILE
        self.context = context
        self.measured = 0
        self.units: dict[str, Unit] = {k: Unit.from_dict(v) for k, v in self._read().get(context, {}).items()}

    def _read(self) -> dict[str, dict[str, Any]]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # a damaged store is only a cache: measure again and replace it
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Unit | None:
        return self.units.get(key)

    def unit(self, key: str, measure: Callable[[], Unit]) -> Unit:
        """The stored unit ``key`` of this context, or ``measure()``'s (then stored)."""
        found = self.units.get(key)
        if found is not None:
            return found
        unit = measure()
        self.measured += 1
        self.units[key] = unit
        self._write(key, unit)
        return unit

    def _write(self, key: str, unit: Unit) -> None:
        data = self._read()
        data.setdefault(self.context, {})[key] = unit.to_dict()
        text = json.dumps(data, indent=1, sort_keys=True).encode()
        try:
            atomic_write(self.path, lambda f: f.write(text))
        except OSError:  # a read-only cache root: the units still price this estimate, they are just not kept
            pass
