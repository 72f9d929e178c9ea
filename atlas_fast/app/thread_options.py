"""``--threads N|auto`` and ``--deterministic``: how many CPU threads a command's process (and the workers it starts)
computes with, taken anywhere on the command line and applied before torch is imported (the policy itself is
:mod:`atlas_fast.threads`'). Nothing here imports torch."""

from __future__ import annotations

import argparse
from typing import Sequence

from atlas_fast.errors import UsageError


def add_threads(parser: argparse.ArgumentParser) -> None:
    """``--threads N|auto`` (intra-op CPU threads, :mod:`atlas_fast.threads`) and ``--deterministic`` (one thread:
    the CPU's numbers then do not depend on a thread count); both taken anywhere on the line."""
    parser.add_argument("--threads", default=None, metavar="N|auto",
                        help="CPU threads per process (default auto: the CPUs this process may use - affinity, "
                             "cgroup quota, SLURM_CPUS_PER_TASK - and for small cached training steps the count a "
                             "short probe measures fastest; OMP_NUM_THREADS, if set, is kept). May also be given "
                             "after the command")
    parser.add_argument("--deterministic", action="store_true",
                        help="one CPU thread per process (--threads 1), so that the numbers computed on the CPU do "
                             "not depend on the thread count or the probe's choice: bit-identical from one machine "
                             "state to another on the same machine (see docs/threads.md for what it costs and what "
                             "it does not cover). May also be given after the command")


def split_threads(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(``argv`` without ``--threads N`` / ``--threads=N`` / ``--deterministic``, those words), so the options work
    after the command."""
    rest, threads = [], []
    words = iter(argv)
    for word in words:
        if word == "--threads":
            threads += [word, next(words, "")]
        elif word.startswith("--threads=") or word == "--deterministic":
            threads.append(word)
        else:
            rest.append(word)
    return rest, threads


def command_threads(args: argparse.Namespace):
    """The context in which a command runs: ``--threads`` (or the default policy; ``--deterministic``: 1; a command's
    own default, ``default_threads``, where it sets one: the demo's 1) applied before torch is imported, so the
    command and the workers it starts follow it (:func:`atlas_fast.threads.command_threads`)."""
    from atlas_fast.threads import command_threads as threads_context, parse_threads

    threads = getattr(args, "threads", None)
    try:
        parse_threads(threads)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
    if getattr(args, "deterministic", False):
        if threads not in (None, "1"):
            raise UsageError(f"--deterministic runs one CPU thread; drop --threads {threads}.")
        threads = "1"
    return threads_context(threads, default=getattr(args, "default_threads", "auto"))
