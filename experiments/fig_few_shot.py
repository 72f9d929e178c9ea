"""Few-shot figure: CoOp vs + ATLaS / -CSL / -ISL for K = 1, 2, 4, 8, 16 shots (all classes, δ always 1).

    atlas-fast experiment fig_few_shot --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Uses the few-shot presets (K=3, θ=0.05, τ_c=0.02, α=0.1) and CoOp's epochs per shot count (50/100/100/200/200).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import base_config, chunks, publish
from atlas_fast.report.figures import plot_series
from atlas_fast.report.formats import deviation_sentences
from atlas_fast.report.rows import aggregate, deviation_marks, variant_name
from atlas_fast.report.stats import counted

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Fig. 4 (few-shot)"
SHOTS = (1, 2, 4, 8, 16)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shots", type=int, nargs="+", default=list(SHOTS))


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import paper_variants, grid_configs

    return [config for shots in args.shots for config in grid_configs(
        base_config(args, "few_shot", shots=shots), args.datasets, paper_variants("few_shot"), args.seeds)]


def report(args: argparse.Namespace, records: list[dict]) -> str:
    curves: dict[str, list[float]] = {}
    for block in chunks(records, len(records) // len(args.shots)):
        for row in aggregate(block, metrics=("all",)):
            curves.setdefault(row.name, []).append(row.metrics["all"])
    runs: dict[str, list[dict]] = {}
    for record in records:
        runs.setdefault(variant_name(record["config"]), []).append(record)
    table_note, marks = deviation_marks(runs)
    lines = ["| Method | " + " | ".join(f"{k}-shot" for k in args.shots) + " |",
             "|---|" + "---:|" * len(args.shots)]
    lines += [f"| {name}{marks[name]} | " + " | ".join(f"{v:.2f}" for v in values) + " |"
              for name, values in curves.items()]
    sentences = deviation_sentences(table_note, marks.values(), in_title=False)
    table = "\n".join(lines + (["", "; ".join(sentences) + "."] if sentences else []))
    plot_series(args.shots, curves, Path(args.out) / "fig_few_shot.png", xlabel="shots per class",
                ylabel=f"accuracy (%), mean of {counted(len(args.datasets), 'dataset')}", log_x=True)
    return publish(args.out, "fig_few_shot.md", table)
