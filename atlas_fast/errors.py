"""What counts as the user's error (bad input, a damaged or foreign file, a full disk) rather than atlas_fast's.

The command line reports these as one ``error:`` line naming the file or value, with exit status 2 (the traceback
behind ``--debug``); a sweep's workers send them back to the driver as :class:`RunFailed` with the worker's message,
not its stack. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A combination of options that cannot work (the message says what to change)."""


class RunFailed(ValueError):
    """A user error raised in a sweep's worker (Ray task, SLURM job), carried back as its message alone."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "the input is wrong": ValueError (DatasetFormatError, CheckpointError,
    UsageError, RunFailed), OSError (DatasetLayoutError, a full disk, a read-only folder), the cache's CacheError and
    the image reader's ImageReadError (RuntimeErrors), NotImplementedError (an unsupported model) and
    FloatingPointError (a run that diverged)."""
    import sys

    errors: list[type[BaseException]] = [ValueError, OSError, NotImplementedError, FloatingPointError]
    # A CacheError or ImageReadError can only have been raised once their modules are imported; looking them up here
    # (rather than importing them) keeps a failing --help or argument check free of torch.
    for module, name in (("atlas_fast.cache", "CacheError"), ("atlas_fast.clip.transforms", "ImageReadError")):
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)
