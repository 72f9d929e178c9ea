"""Few-shot figure: CoOp vs + ATLaS / -CSL / -ISL for K = 1, 2, 4, 8, 16 shots (all classes, δ always 1).

    python -m experiments.fig_few_shot --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Uses the few-shot presets (K=3, θ=0.05, τ_c=0.02, α=0.1) and CoOp's epochs per shot count (50/100/100/200/200).
"""

from __future__ import annotations

from pathlib import Path

from atlas_fast.report import aggregate, plot_series
from atlas_fast.sweep import atlas_variants, run_grid
from experiments.common import base_config, parser

SHOTS = (1, 2, 4, 8, 16)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--shots", type=int, nargs="+", default=list(SHOTS))
    args = p.parse_args(argv)
    curves: dict[str, list[float]] = {}
    for shots in args.shots:
        base = base_config(args, "few_shot", shots=shots)
        records = run_grid(base, args.datasets, atlas_variants("few_shot"), args.seeds)
        for row in aggregate(records, metrics=("all",)):
            curves.setdefault(row.label, []).append(row.metrics["all"])
    out = Path(args.out)
    lines = ["| Method | " + " | ".join(f"{k}-shot" for k in args.shots) + " |",
             "|---|" + "---:|" * len(args.shots)]
    lines += [f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |" for name, values in curves.items()]
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fig_few_shot.md").write_text(table + "\n")
    plot_series(args.shots, curves, out / "fig_few_shot.png", xlabel="shots per class",
                ylabel="accuracy (%)", title=f"Few-shot, mean over {len(args.datasets)} datasets")
    print(table)
    return curves


if __name__ == "__main__":
    main()
