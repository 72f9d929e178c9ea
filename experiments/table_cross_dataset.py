"""Tables I and II: cross-dataset transfer and domain generalisation of CoOp, CoCoOp and DePT with ATLaS (trained
on ImageNet).

    python -m experiments.table_cross_dataset --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Trains on ImageNet (all 1000 classes, 16 shots, each method's recipe, the cross-dataset presets K=3, θ=0.1,
τ_c=0.04, α=1.0), then evaluates each run's learned tensors on the full test split of every target (``--targets``:
the 10 other datasets and ImageNetV2/-Sketch/-A/-R by default). One block of rows per method (``--methods``; the
paper's "DePT" is ``dept-coop``, whose head is fused on ImageNet and its variants and unused on other datasets);
``--zero-shot`` adds a zero-shot CLIP row. Cells are means over seeds.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from atlas_fast.evaluate import evaluate_record
from atlas_fast.report import method_name, variant_label
from atlas_fast.schedules import OneHot
from atlas_fast.sweep import Variant, atlas_variants, run_grid
from experiments.common import ELEVEN, PAPER_TEXT_METHODS, base_config, method_args, parser

TARGETS = ELEVEN[1:] + ("ImageNetV2", "ImageNetSketch", "ImageNetA", "ImageNetR")


def main(argv: list[str] | None = None) -> str:
    p = parser(__doc__.splitlines()[0], datasets=("ImageNet",))
    method_args(p, PAPER_TEXT_METHODS)
    p.add_argument("--targets", nargs="+", default=list(TARGETS))
    args = p.parse_args(argv)
    grids = [("zsclip", [Variant("zero-shot", OneHot())])] if args.zero_shot else []
    grids += [(method, atlas_variants("cross_dataset")) for method in args.methods]
    cells: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for method, variants in grids:
        for record in run_grid(base_config(args, "cross_dataset", method=method), args.datasets, variants,
                               args.seeds):
            row = (method_name(method), variant_label(record["config"]))
            cells[row]["source"].append(record["metrics"]["all"])
            for target in args.targets:
                result = evaluate_record(record["path"], target, args.data_root, cache_root=args.cache_root,
                                         device=args.device, progress=False)
                # zero-shot CLIP on a target uses the target's own template, not the source's
                cells[row][target].append(result["zero_shot"] if method == "zsclip" else result["accuracy"])
    columns = ["source"] + list(args.targets)
    lines = ["| Method | " + " | ".join(columns) + " | target mean |", "|---|" + "---:|" * (len(columns) + 1)]
    for (_, label), per_column in cells.items():
        means = [statistics.fmean(per_column[c]) for c in columns]
        lines.append(f"| {label} | " + " | ".join(f"{m:.2f}" for m in means)
                     + f" | {statistics.fmean(means[1:]) if len(means) > 1 else float('nan'):.2f} |")
    table = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table_cross_dataset.md").write_text(table + "\n")
    print(table)
    return table


if __name__ == "__main__":
    main()
