"""The ``atlas-fast`` command line: :func:`build_parser` adds each command group of :data:`COMMAND_GROUPS` (one
module of this package each, with ``add_parser(subparsers)`` beside the ``run_*`` functions that carry the command
out), and :func:`main` runs the chosen command. The modules import nothing heavy at import time (torch, the engine
and the methods are imported inside the ``run_*`` functions), so ``--help`` and argument errors stay instant.

Expected errors (:func:`atlas_fast.errors.user_errors`) print ``error: ...`` naming the file or value and exit with
status 2; ``--debug`` (anywhere on the line) shows the traceback instead. Ctrl-C prints one ``interrupted: ...`` line
(what was finished, and that the same command resumes) and exits with status 130, as shells report it. Argument
errors are argparse's one line and warnings one ``warning: ...`` line each, without their source line."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
import warnings
from typing import Sequence

from atlas_fast.app.torch_pair import check_torch_pair
from atlas_fast.app.options import UnknownName, apply_download
from atlas_fast.app.thread_options import add_threads, command_threads, split_threads
from atlas_fast.errors import shorten_values, user_errors

# The command groups in the order ``--help`` lists them: modules of this package.
COMMAND_GROUPS = ("cache", "train", "eval", "demo", "experiment", "report", "data", "search", "doctor")


class CommandParser(argparse.ArgumentParser):
    """argparse's parser (every command's, as subparsers take their parent's class) refusing bad arguments in one
    line and a pointer to ``--help``, not the whole usage (22 lines for ``train``) above the line that matters."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {shorten_values(message)}\n(`{self.prog} --help` lists the options)\n")


# A library's notices of its own API changes (torch's "torch.jit.load is deprecated"): addressed to developers, so a
# command shows them only with --debug.
DEVELOPER_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` of a command: ``warning: <message>``, without the file, line and source text (and
    without the developers' warnings of :data:`DEVELOPER_WARNINGS`)."""
    if not issubclass(category, DEVELOPER_WARNINGS):
        print(f"warning: {message}", file=file or sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="atlas-fast", description="Feature-cache-first prompt tuning of CLIP.")
    parser.add_argument("--debug", action="store_true",
                        help="print the full traceback of an error, and warnings with their source and the libraries' "
                             "deprecation notices (may also be given after the command)")
    add_threads(parser)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        importlib.import_module(f"atlas_fast.cli.{group}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``atlas-fast`` console script; returns the exit status (2 for a user error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv, threads = split_threads(argv)
    try:
        args = build_parser().parse_args((["--debug"] if debug else []) + threads + [a for a in argv if a != "--debug"])
        with warnings.catch_warnings():
            if not debug:  # --debug keeps Python's own lines, with where each warning came from
                warnings.showwarning = show_warning
            with command_threads(args):  # (its warning, a count above the CPUs, is one line too)
                check_torch_pair()  # from the installed metadata, before a mismatched torchvision fails to import
                apply_download(args)
                return int(args.func(args) or 0)
    except (*user_errors(), UnknownName) as exc:
        if debug:
            traceback.print_exc()
        else:
            print(f"error: {shorten_values(str(exc))}", file=sys.stderr)
            print("(run again with --debug for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: finished work is on disk, nothing half-written is
        if debug:
            traceback.print_exc()
        finished = str(exc) or "what had finished is kept"
        print(f"\ninterrupted: {finished}; the same command resumes the rest.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
