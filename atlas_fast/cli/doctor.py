"""``atlas-fast doctor``: what this machine will do with atlas_fast, checked in about a minute (the checks are
:mod:`atlas_fast.app.doctor`); a table to paste into a bug report, and a non-zero exit on any mismatch."""

from __future__ import annotations

import argparse
import sys

from atlas_fast.app.options import add_methods
from atlas_fast.errors import UsageError

#: The exit status of a finished doctor that found a mismatch (2 stays a user error, as for every command).
MISMATCH_STATUS = 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast doctor``."""
    doctor = subparsers.add_parser(
        "doctor", help="check what this machine will do (versions, device, graphed vs eager steps, memory plan, "
                       "faiss) in about a minute",
        description="Say what this machine will do with atlas_fast: torch, CUDA and driver versions, the device and "
                    "its memory; for CoOp (cached text), CoCoOp, IVLP (pixels) and TCP (Adam) a few training steps "
                    "at small shapes: host traffic per step, graphed steps against eager ones (CUDA) and a group of "
                    "runs against a run alone, and the memory they reserve; the R the memory plan picks at "
                    "ViT-B/16 and 1,000 classes; where faiss searches. On a CPU the same checks run on the tiny "
                    "model and the rows that need a GPU say so. Prints one table (paste it into a bug report); exits "
                    f"{MISMATCH_STATUS} on any mismatch. Random weights only: nothing is downloaded.")
    doctor.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    doctor.add_argument("--model", default=None,
                        help="open_clip architecture of the steps, random weights (default ViT-B-16 on CUDA, "
                             "atlas-tiny on the CPU)")
    add_methods(doctor, None, help="only these of the families' methods (coop cocoop ivlp tcp; default all four)")
    doctor.add_argument("--steps", type=int, default=4, help="full training steps per epoch (default 4; 2 epochs)")
    doctor.set_defaults(func=run_doctor_command)


def run_doctor_command(args: argparse.Namespace) -> int:
    from atlas_fast.app.options import check_range

    check_range("--steps", args.steps, 3, 1000)  # 2 warm-up steps, then replays
    from atlas_fast.app.doctor import FAMILIES, run_doctor

    families = [method for _, method in FAMILIES]
    unknown = [m for m in args.methods or [] if m not in families]
    if unknown:
        raise UsageError(f"--methods {unknown[0]!r}: the doctor trains {', '.join(families)}.")

    report = run_doctor(args.device, args.model, args.methods, args.steps,
                        say=lambda line: print(line, file=sys.stderr, flush=True))
    print(report.markdown())
    return MISMATCH_STATUS if report.failed else 0
