"""Progress that suits where the output goes: bars on a terminal, none in a log (no carriage-return spam), and
one-line messages (:func:`say`) that print cleanly above a bar or into a log."""

from __future__ import annotations

import sys
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
