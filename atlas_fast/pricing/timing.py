"""How a unit of work is timed and what it records: :class:`Unit` (seconds, a fixed part, the peaks seen), the
process's resident set (:func:`host_rss`) and its peaks (:class:`PeakMemory`), and :func:`timed` (a median or a
fastest of repeats, after one untimed call). The units themselves are in :mod:`atlas_fast.pricing.units` (a run's)
and :mod:`atlas_fast.pricing.command_units` (the command's around its runs).

Host memory is the process's resident set sampled every few milliseconds (the backbone and Python included: it is
what the run's process will hold); device memory is ``torch.cuda.max_memory_reserved`` (reset before the unit):
what the allocator held, a CUDA graph's private pool included, not only the live tensors.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

#: shortest time a unit is timed for (repeats are added until it is reached, up to ``max_repeats``)
MIN_TIMED_SECONDS = 0.3
#: a call this long is timed as the fastest of two, not five: a hiccup of the machine is small beside it, and five
#: repeats of CoCoOp's evaluation (0.8 s for 64 images) took most of a job's calibration
SLOW_CALL_SECONDS = 0.25


@dataclass(frozen=True)
class Unit:
    """A measured unit: ``seconds`` per unit (a step, an image, a run...), ``fixed_seconds`` paid once per use where
    the unit has a fixed part (evaluation: the class prompts), and the peaks seen while it ran."""

    seconds: float
    peak_host_bytes: int = 0
    peak_device_bytes: int = 0
    fixed_seconds: float = 0.0
    repeats: int = 1
    # an evaluation unit on cached features: the test images its cost per image holds for (the cap it was timed up
    # to, or MAX_EVAL_IMAGES when that cost showed before it); 0: not such a unit
    images: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Unit":
        """The unit stored as ``data`` (:meth:`to_dict`), or a ``ValueError`` saying which field is of the wrong
        type or range: times are finite numbers >= 0 (``seconds`` required), byte counts whole numbers >= 0,
        ``repeats`` a whole number >= 1."""
        if not isinstance(data, dict):
            raise ValueError(f"is {type(data).__name__}, not an object")
        if "seconds" not in data:
            raise ValueError("has no seconds")
        for name, value in data.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if name in ("seconds", "fixed_seconds") and not (number and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} is {str(value)[:20]!r}, not a number >= 0")
            if name in ("peak_host_bytes", "peak_device_bytes", "repeats", "images") and not (
                    number and isinstance(value, int) and value >= (1 if name == "repeats" else 0)):
                raise ValueError(f"{name} is {str(value)[:20]!r}, not a whole number >= "
                                 f"{1 if name == 'repeats' else 0}")
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def host_rss() -> int:
    """This process's resident set size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class PeakMemory:
    """Context manager: the peak host RSS (sampled every ``interval`` s by a thread; ``host_start``: the RSS on
    entry) and the peak CUDA memory allocated on ``device`` while the block ran."""

    def __init__(self, device: torch.device, interval: float = 0.005) -> None:
        self.device, self.interval = device, interval
        self.host = 0
        self.device_bytes = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.host = max(self.host, host_rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.host = self.host_start = host_rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.device_bytes = int(torch.cuda.max_memory_reserved(self.device))
        self._stop.set()
        self._thread.join()
        self.host = max(self.host, host_rss())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(call: Callable[[], Any], device: torch.device, max_repeats: int, min_seconds: float = MIN_TIMED_SECONDS,
           fastest: bool = False) -> tuple[float, int]:
    """Median seconds of ``call`` after one untimed call, repeated until ``min_seconds`` or ``max_repeats``.
    ``fastest``: the fastest of at least five repeats, two for calls over :data:`SLOW_CALL_SECONDS` (for
    differences of two timings, which noise would swamp)."""
    clock = time.perf_counter()
    call()
    sync(device)
    slow = time.perf_counter() - clock > SLOW_CALL_SECONDS  # the machine's hiccups are small beside such a call
    times: list[float] = []
    least = (2 if slow else 5) if fastest else 1
    while len(times) < max(least, max_repeats) and (len(times) < least or sum(times) < min_seconds):
        start = time.perf_counter()
        call()
        sync(device)
        times.append(time.perf_counter() - start)
    return (min(times) if fastest else statistics.median(times)), len(times)

