"""Progress that suits where the output goes: bars on a terminal, none in a log (no carriage-return spam), a line
every few seconds with the time left for long work in a log (:class:`ProgressLines`), one-line messages
(:func:`say`) that print cleanly above a bar or into a log, and the time words of those lines (:func:`duration`,
:class:`TimeLeft`, :func:`process_seconds`)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm


def interactive() -> bool:
    """True when progress bars can redraw in place (standard error is a terminal)."""
    return sys.stderr.isatty()


def progress_bar(*args: Any, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar, shown when ``enabled`` and standard error is a terminal (disabled bars cost nothing)."""
    return tqdm(*args, disable=not (enabled and interactive()), **kwargs)


def say(message: str) -> None:
    """Print a status line to standard error without breaking a bar that is being drawn."""
    tqdm.write(message, file=sys.stderr)


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 7 s``, ``1 h 5 min``: a wall time as a line says it."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


class TimeLeft:
    """The time words of a phase's progress lines: time since the phase began and, from the work done so far, about
    how much is left (``12 s so far, about 36 s left``). ``done`` and ``total`` count any unit; ``seconds``: the part
    of the time spent on counted work, when some of it (a first cache build) is not like the rest."""

    def __init__(self, total: float) -> None:
        self.total = total
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def text(self, done: float, seconds: float | None = None) -> str:
        elapsed = self.elapsed()
        if done <= 0 or done >= self.total:
            return f"{duration(elapsed)} so far"
        rate = (elapsed if seconds is None else seconds) / done
        return f"{duration(elapsed)} so far, about {duration(rate * (self.total - done))} left"


def process_seconds() -> float:
    """Wall seconds since this process started (0 where /proc is missing): what a command's total counts from (its
    start-up, imports included)."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


class ProgressLines:
    """The lines a :func:`progress_bar` stands for where no bar can redraw (a log): when ``enabled`` and standard
    error is not a terminal, a line every ``every`` seconds with how much of ``total`` is done, the rate and the
    :class:`TimeLeft` words (nothing for work that ends sooner). Use as a context manager beside the bar and call
    :meth:`update` as the bar's."""

    def __init__(self, total: int, what: str, unit: str, enabled: bool = True, every: float = 10.0) -> None:
        self.total, self.what, self.unit, self.every = total, what, unit, every
        self.enabled = enabled and not interactive()
        self.done = 0
        self.time = TimeLeft(total)
        self.last = self.time.start

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        if not self.enabled or now - self.last < self.every or self.done >= self.total:
            return
        self.last = now
        say(f"{self.what}: {self.done:,} of {self.total:,} {self.unit}s ({100 * self.done / self.total:.0f} %), "
            f"{self.done / max(self.time.elapsed(), 1e-9):,.0f} {self.unit}s/s; {self.time.text(self.done)}")
