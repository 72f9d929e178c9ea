"""Views study (atlas_fast's own): what caching V augmented views per image, instead of a fresh crop every epoch,
does to base/new/H of CoOp and CoOp + ATLaS.

    atlas-fast experiment views_study --world
    atlas-fast experiment views_study --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt --datasets DTD

The reference trains on a fresh random crop of every image in every epoch; the feature cache stores V crops per
image and epoch e reads view 1 + (e mod V) (``--views`` in every other module). V = epochs is the faithful setting.
One block of rows per V (``--view-counts``, ``0`` standing for one view per epoch), base-to-new with the paper's
presets, mean ± std over seeds; the last column of each row is its change in H against the same method at
V = epochs.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING

from atlas_fast.errors import UsageError
from atlas_fast.experiments.common import BASE_NEW, base_config, publish
from atlas_fast.vocabulary import PAPER_SOFT_LABEL_KINDS

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "views study (atlas_fast: cached views vs a fresh crop per epoch)"
VIEW_COUNTS = (1, 5, 20, 0)  # 0: one view per epoch (the faithful setting)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--view-counts", type=int, nargs="+", default=list(VIEW_COUNTS),
                   help="V values; 0 means one view per epoch (default: %(default)s)")
    p.add_argument("--kinds", nargs="*", default=["ls"], choices=PAPER_SOFT_LABEL_KINDS,
                   help="ATLaS soft labels to add next to plain CoOp (default: %(default)s)")


def _views_name(record: dict) -> str:
    """V as the table shows it: "epochs (E)" when every epoch had a view of its own (the faithful setting)."""
    views, epochs = record["config"].get("views"), len(record["epochs"])
    return f"epochs ({epochs})" if not views or views >= epochs else str(views)


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import paper_variants, grid_configs

    if any(v < 0 for v in args.view_counts):
        raise UsageError(f"--view-counts must be >= 0 (0: one view per epoch), got {args.view_counts}")
    base = base_config(args, "base2new", method="coop", evaluate=BASE_NEW)
    variants = paper_variants("base2new", kinds=args.kinds)
    return [config for views in args.view_counts for config in grid_configs(
        dataclasses.replace(base, views=views or None), args.datasets, variants, args.seeds)]


def report(args: argparse.Namespace, records: list[dict]) -> str:
    from atlas_fast.engine.evaluate import harmonic_mean
    from atlas_fast.report.formats import deviation_sentences
    from atlas_fast.report.rows import deviation_marks, variant_name
    from atlas_fast.report.stats import interval_note, paired_by_seed

    # (views, variant) -> dataset -> metric -> per-seed values
    cells: dict[tuple[str, str], dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        key = (_views_name(record), variant_name(record["config"]))
        runs[key].append(record)
        for metric in ("base", "new"):
            cells[key][record["config"]["dataset"]][metric].append(record["metrics"][metric])
        cells[key][record["config"]["dataset"]]["seed"].append(record["config"]["seed"])
    table_note, marks = deviation_marks(runs, leave_out={"views"})  # V is the table's first column
    lines = [f"**Cached views per image (V) vs one fresh view per epoch: base-to-new, {', '.join(args.datasets)}, "
             f"mean ± std over seeds {', '.join(map(str, args.seeds))}{table_note}**", ""]
    for dataset in args.datasets:
        lines += [f"*{dataset}*", "", "| V | Method | base | new | H | H vs V = epochs | ΔH paired (95 % CI) |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        h_at: dict[tuple[str, str], float] = {}
        h_by_seed: dict[tuple[str, str], dict[int, float]] = {}
        rows = []
        for (views, variant), per_dataset in cells.items():
            base, new = per_dataset[dataset]["base"], per_dataset[dataset]["new"]
            hs = [harmonic_mean(b, n) for b, n in zip(base, new)]
            h_at[(views, variant)] = statistics.fmean(hs)
            h_by_seed[(views, variant)] = dict(zip(per_dataset[dataset]["seed"], hs))
            rows.append((views, variant, base, new, hs))
        seeds = 0
        for views, variant, base, new, hs in rows:
            ref = next((h for (v, name), h in h_at.items() if name == variant and v.startswith("epochs")), None)
            change = f"{statistics.fmean(hs) - ref:+.2f}" if ref is not None and not views.startswith("epochs") else ""
            ref_key = next((k for k in h_by_seed if k[1] == variant and k[0].startswith("epochs")), None)
            paired = (paired_by_seed(h_by_seed[(views, variant)], h_by_seed[ref_key])
                      if change and ref_key is not None else None)
            seeds = max(seeds, paired.seeds if paired else 0)
            lines.append(f"| {views} | {variant}{marks[(views, variant)]} | {_mean_std(base)} | {_mean_std(new)} | "
                         f"{_mean_std(hs)} | {change} | "
                         + (paired.cell() if paired else "") + " |")
        if seeds:
            lines += ["", interval_note(seeds, "the same variant with one view per epoch") + "."]
        lines.append("")
    sentences = deviation_sentences(table_note, marks.values())
    if sentences:
        lines.append("; ".join(sentences) + ".")
    return publish(args.out, "views_study.md", "\n".join(lines).rstrip())


def _mean_std(values: list[float]) -> str:
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {spread:.2f}"
