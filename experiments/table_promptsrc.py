"""Appendix: base-to-new generalisation of PromptSRC, plain and with ATLaS, ATLaS-CSL and ATLaS-ISL, per dataset
and averaged (the paper's appendix tables, PromptSRC rows).

    python -m experiments.table_promptsrc --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

PromptSRC's recipe (IVLP 4 + 4 at depth 9, 20 epochs, GPA mean 15 / std 1, λ_t 25, λ_v 10) on the base classes,
16 shots, seeds 1-3, the paper's base-to-new ATLaS presets; PromptSRC trains on the pixel path and reads its frozen
image features from the cache. ``--method-option depth_text=3 depth_vision=3`` fits the depth to a small backbone.
"""

from __future__ import annotations

from atlas_fast.report import aggregate
from atlas_fast.sweep import atlas_variants, run_grid
from experiments.common import base_config, method_option_arg, parser, write_table


def main(argv: list[str] | None = None) -> str:
    p = parser(__doc__.splitlines()[0])
    method_option_arg(p)
    args = p.parse_args(argv)
    records = run_grid(base_config(args, "base2new", method="promptsrc"), args.datasets,
                       atlas_variants("base2new"), args.seeds)
    rows = []
    groups = [(dataset, [r for r in records if r["config"]["dataset"] == dataset]) for dataset in args.datasets]
    for block, group in groups + [(f"Average ({len(args.datasets)} datasets)", records)]:
        for row in aggregate(group):
            row.block, row.label = block, f"{block}: {row.label}"
            rows.append(row)
    title = f"Base-to-new, PromptSRC with ATLaS ({len(args.seeds)} seeds)"
    return write_table(rows, "table_promptsrc", title, args.out)


if __name__ == "__main__":
    main()
