"""``atlas-fast report RESULTS_DIR``: every finished run under a results folder as paper tables and plots (the
tables themselves are :func:`atlas_fast.report.collect.report_folder`)."""

from __future__ import annotations

import argparse
from collections import deque
from pathlib import Path

from atlas_fast.errors import UsageError
from atlas_fast.report.collect import FORMATS, report_folder
from atlas_fast.report.rows import CALIBRATION_FIGURES, calibration_columns
from atlas_fast.report.verify import verify_report
from atlas_fast.vocabulary import CLASS_SETS, METRICS

# How far the search for the nearest folder with records looks: folders below the one given (or beside it), and at
# most this many folders in all, so a refusal stays instant wherever it is run.
NEAREST_DEPTH = 3
NEAREST_VISITS = 500


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast report RESULTS_DIR [--datasets ...] [--methods ...] [--metrics ...] [--out DIR] [--format ...]``
    (imports nothing heavy: the report's modules are imported when it runs)."""
    report = subparsers.add_parser(
        "report", help="tables (Markdown, LaTeX, CSV) and plots of every finished run under a results folder",
        description="Read every finished run record under RESULTS_DIR (<dataset>/*.json, whichever command trained "
                    "it) and write one table per setting: rows by dataset (and an Average over datasets), method and "
                    "variant (CoOp, + ATLaS, ...), each cell the mean ± population std over seeds; base-to-new shows "
                    "base/new/H (H of the mean base and new), few-shot and cross-dataset the accuracy on their "
                    "classes. Damaged records are skipped with a warning. The Markdown is printed.")
    report.add_argument("results_dir", type=Path, help="the results folder of the runs (e.g. results)")
    report.add_argument("--datasets", nargs="+", default=None, help="only these datasets (default: all found)")
    report.add_argument("--methods", nargs="+", default=None,
                        help="only these methods, by registry name (e.g. coop dept-coop; default: all found)")
    report.add_argument("--metrics", nargs="+", default=None, choices=METRICS + calibration_columns(
                            tuple(CALIBRATION_FIGURES), CLASS_SETS), metavar="METRIC",
                        help="table columns: accuracies (base new H all) or calibration figures on a class set, "
                             "e.g. 'ECE new' 'NLL (T) base' (ECE, ECE (T), NLL, NLL (T), Brier, conf.: "
                             "docs/experiments.md); a record without them shows '–' (default: base new H for "
                             "base-to-new, all otherwise)")
    report.add_argument("--out", type=Path, default=None, help="output folder (default RESULTS_DIR/report)")
    report.add_argument("--format", nargs="+", dest="formats", choices=FORMATS, default=list(FORMATS),
                        metavar="FORMAT", help=f"outputs to write, any of {' '.join(FORMATS)} (default: all)")
    report.add_argument("--verify", action="store_true",
                        help="write nothing: check the report already written (in --out) against its records: every "
                             "record's seal, and every table cell computed again from the records it names; exit "
                             "status 1 on any difference")
    report.set_defaults(func=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    """Write the report of ``args.results_dir`` and print its Markdown (0), or with ``--verify`` check the written
    one (0 when every seal and cell checks out, else 1, listing the problems)."""
    if args.verify:
        problems = verify_report(args.results_dir, out=args.out)
        for problem in problems:
            print(f"verify: {problem}")
        print(f"verify: FAILED, {len(problems)} problem(s)" if problems
              else "verify: every seal and table cell checks out")
        return 1 if problems else 0
    require_records(args.results_dir)
    print(report_folder(args.results_dir, out=args.out, datasets=args.datasets, methods=args.methods,
                        metrics=args.metrics, formats=args.formats))
    return 0


def has_records(folder: Path) -> bool:
    """Whether ``folder`` holds a valid run record among its first 20 ``<dataset>/*.json``, checked before the
    report's modules (and torch) are imported."""
    from atlas_fast.engine.validity import is_record_file

    try:
        return any(is_record_file(path) for path in sorted(folder.glob("*/*.json"))[:20])
    except OSError:
        return False


def nearest_records_folder(folder: Path) -> Path | None:
    """The closest folder with records below ``folder`` or, failing that, below its parent (e.g. ``results/demo``
    for ``results``, which the demo writes into): breadth first, so the shallowest wins; None if there is none."""
    for start in ([folder] if folder.is_dir() else []) + ([folder.parent] if folder.parent.is_dir() else []):
        queue, visits = deque([(start, 0)]), 0
        while queue and visits < NEAREST_VISITS:
            current, depth = queue.popleft()
            visits += 1
            if current != start and has_records(current):
                return current
            if depth < NEAREST_DEPTH:
                try:
                    children = sorted(p for p in current.iterdir() if p.is_dir() and not p.name.startswith("."))
                except OSError:
                    continue
                queue.extend((child, depth + 1) for child in children if child != folder or start == folder)
    return None


def require_records(results_dir: Path) -> None:
    """Refuse a results folder that is missing or holds no record file, at once (before torch is imported) and
    naming the nearest folder that has records, with the command that reports it."""
    if results_dir.is_dir() and (has_records(results_dir) or next(results_dir.glob("*/*.json"), None) is not None):
        return  # record files that are all invalid: the report names each and why it leaves it out
    what = (f"Results folder {results_dir} does not exist" if not results_dir.exists()
            else f"No finished result record under {results_dir}")
    nearest = nearest_records_folder(results_dir)
    hint = (f"; the nearest folder with records is {nearest}: atlas-fast report {nearest}" if nearest is not None
            else "; no folder near it has any")
    raise UsageError(f"{what} (records are <results_dir>/<dataset>/*.json){hint}.")
