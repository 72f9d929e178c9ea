"""Beyond the paper: calibration of one-hot training, label smoothing (LS, CSL, ISL every epoch) and ATLaS's
alternation of each, base-to-new.

    atlas-fast experiment table_calibration --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt
    atlas-fast experiment table_calibration --world --methods coop --every-epoch ls

Label smoothing is meant to make a model less over-confident; this table asks which variant is calibrated, on the
base classes it trained on and on the new ones. One block of rows per method (``--methods``, default the paper's):
the plain method (one-hot), then + LS / + CSL / + ISL (the soft labels every epoch, ATLaS's K = 1: smoothing without
alternation; ``--every-epoch`` picks the kinds) and + ATLaS / + ATLaS-CSL / + ATLaS-ISL (the paper's K = 2
alternation; ``--kinds``), 16 shots, seeds 1-3, the paper's base-to-new presets (θ=0.1, τ_c=0.05, α=0.1).

Every record holds the figures (:mod:`atlas_fast.engine.calibration`): top-1 ECE with 15 equal-width bins (percent),
NLL (nats), both from the method's own scaled logits, and both again after temperature scaling (one temperature per
run, fitted on its few-shot validation split of the base classes; "(T)" columns). The report writes
``table_calibration_ece`` (ECE base/new, before and after T) and ``table_calibration_nll`` (NLL likewise), each with
the mean ± std over seeds and, per column, the mean paired difference to the block's first row with its 95 % t
interval, as Markdown, LaTeX and CSV; and ``table_calibration_reliability_{base,new}.png/.pdf``, the reliability
diagram of each label variant (summed over seeds and datasets; one per method block when there are several).
Records written before records held calibration show "–" until the experiment is run again, which scores them on
their saved prompts without retraining.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, PAPER_METHODS, base_config, method_args, publish, write_text
from atlas_fast.vocabulary import PAPER_SOFT_LABEL_KINDS

if TYPE_CHECKING:
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.engine import TrainConfig

PAPER = "Beyond the paper (calibration: ECE and NLL of one-hot, LS, CSL, ISL and ATLaS)"
ECE_COLUMNS = ("ECE", "ECE (T)")
NLL_COLUMNS = ("NLL", "NLL (T)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    method_args(p, PAPER_METHODS)
    p.add_argument("--every-epoch", nargs="*", choices=PAPER_SOFT_LABEL_KINDS, default=list(PAPER_SOFT_LABEL_KINDS),
                   help="soft-label kinds trained every epoch, without alternation (K = 1; default: %(default)s)")
    p.add_argument("--kinds", nargs="*", choices=PAPER_SOFT_LABEL_KINDS, default=list(PAPER_SOFT_LABEL_KINDS),
                   help="soft-label kinds under ATLaS's alternation (the paper's K; default: %(default)s)")


def variants(args: argparse.Namespace) -> list[LabelVariant]:
    """The rows of a block: one-hot, the kinds every epoch, then the kinds alternated."""
    from atlas_fast.atlas.variants import label_variant

    return ([label_variant("base2new", "none")]
            + [label_variant("base2new", kind, period=1) for kind in args.every_epoch]
            + [label_variant("base2new", kind) for kind in args.kinds])


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import grid_configs

    return [config for method in args.methods
            for config in grid_configs(base_config(args, "base2new", method=method, evaluate=BASE_NEW),
                                       args.datasets, variants(args), args.seeds)]


def report(args: argparse.Namespace, records: list[dict]) -> str:
    from pathlib import Path

    from atlas_fast.report.figures import plot_reliability
    from atlas_fast.report.formats import latex_label, latex_table, markdown_table, write_csv
    from atlas_fast.report.rows import aggregate, calibration_columns, strategy_name
    from atlas_fast.report.stats import counted

    out = Path(args.out)
    scope = f"mean over {counted(len(args.datasets), 'dataset')}, {counted(len(args.seeds), 'seed')}"
    texts = []
    for name, figures, what in (("table_calibration_ece", ECE_COLUMNS, "ECE (%, 15 bins)"),
                                ("table_calibration_nll", NLL_COLUMNS, "NLL (nats)")):
        columns = calibration_columns(figures)
        rows = aggregate(records, metrics=columns, name_of=strategy_name, by_method=True,
                         leave_out={"schedule.period"})  # K = 1 is named in the rows (+ LS, + CSL, + ISL)
        title = (f"Calibration, base-to-new: {what} on base and new classes, before and after temperature scaling "
                 f"(T) fitted on the few-shot validation split ({scope}); lower is better")
        write_text(out, f"{name}.tex", latex_table(rows, caption=title, label=latex_label(name), paired=columns))
        write_csv(rows, out / f"{name}.csv", paired=columns)
        texts.append(publish(out, f"{name}.md", markdown_table(rows, title, paired=columns)))
    per_method = {method: [r for r in records if r["config"]["method"] == method] for method in args.methods}
    for class_set in BASE_NEW:
        for method, chosen in per_method.items():
            stem = f"table_calibration_reliability_{class_set}" + (
                f"_{method}" if len(per_method) > 1 else "")
            try:
                plot_reliability(chosen, out / f"{stem}.png", class_set, name_of=strategy_name)
            except ValueError as exc:  # records from before calibration: the tables say "–"; no diagram
                print(f"no reliability diagram ({method}, {class_set}): {exc}")
    return "\n\n".join(texts)
