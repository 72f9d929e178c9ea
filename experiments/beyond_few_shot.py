"""Beyond the paper: few-shot CLIP-LoRA (K = 1, 2, 4, 8, 16 shots, all classes) with and without ATLaS, as its paper
reports it.

    atlas-fast experiment beyond_few_shot --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt
    atlas-fast experiment beyond_few_shot --world --kinds isl --shots 1 4 16

CLIP-LoRA's one recipe at every shot count (500 x K iterations of batch 32, AdamW, adapters on q/k/v of both towers;
docs/method-zoo.md, section CLIP-LoRA), the plain method and + ATLaS with each soft-label kind of ``--kinds`` under
the paper's few-shot presets (K=3, θ=0.05, τ_c=0.02, α=0.1, δ always 1). ``--methods clip-lora-text`` trains the
text-tower-only variant from cached features. One row per variant (``CLIP-LoRA``, ``+ ATLaS-ISL``), one column per
shot count; a plot of the curves beside the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import base_config, chunks, publish
from atlas_fast.report.figures import plot_series
from atlas_fast.report.formats import deviation_sentences
from atlas_fast.report.rows import aggregate, deviation_marks, variant_name
from atlas_fast.vocabulary import PAPER_SOFT_LABEL_KINDS

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Beyond the paper (few-shot CLIP-LoRA)"
SHOTS = (1, 2, 4, 8, 16)
# CLIP-LoRA on both towers (the paper's, pixels) and on the text tower alone (cached features)
LORA_METHODS = ("clip-lora", "clip-lora-text")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from atlas_fast.app.options import add_method_options, add_methods

    p.add_argument("--shots", type=int, nargs="+", default=list(SHOTS))
    p.add_argument("--kinds", nargs="+", choices=PAPER_SOFT_LABEL_KINDS, default=list(PAPER_SOFT_LABEL_KINDS),
                   help="the ATLaS soft-label kinds (default: %(default)s)")
    add_methods(p, LORA_METHODS[:1], among=LORA_METHODS)
    add_method_options(p)


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import paper_variants, grid_configs

    variants = paper_variants("few_shot", args.kinds)
    return [config for method in args.methods for shots in args.shots for config in grid_configs(
        base_config(args, "few_shot", shots=shots, method=method), args.datasets, variants, args.seeds)]


def report(args: argparse.Namespace, records: list[dict]) -> str:
    from atlas_fast.report.rows import method_name

    curves: dict[str, list[float]] = {}
    runs: dict[str, list[dict]] = {}
    for block in chunks(records, len(records) // (len(args.shots) * len(args.methods))):
        for row in aggregate(block, metrics=("all",)):
            method = method_name(block[0]["config"]["method"])
            name = f"{method} {row.name}" if row.name.startswith("+") else row.name
            curves.setdefault(name, []).append(row.metrics["all"])
    for record in records:
        variant = variant_name(record["config"])
        method = method_name(record["config"]["method"])
        runs.setdefault(f"{method} {variant}" if variant.startswith("+") else variant, []).append(record)
    table_note, marks = deviation_marks(runs)
    lines = [f"Few-shot accuracy (all classes; mean of {len(args.datasets)} datasets, {len(args.seeds)} seeds)"
             f"{table_note}", "", "| Method | " + " | ".join(f"{k}-shot" for k in args.shots) + " |",
             "|---|" + "---:|" * len(args.shots)]
    lines += [f"| {name}{marks[name]} | " + " | ".join(f"{v:.2f}" for v in values) + " |"
              for name, values in curves.items()]
    sentences = deviation_sentences(table_note, marks.values())
    table = "\n".join(lines + (["", "; ".join(sentences) + "."] if sentences else []))
    plot_series(args.shots, curves, Path(args.out) / "beyond_few_shot.png", xlabel="shots per class",
                ylabel=f"accuracy (%), mean of {len(args.datasets)} datasets", log_x=True)
    return publish(args.out, "beyond_few_shot.md", table)
