"""Ablation table: soft labels alone (every epoch), jointly with y (two CE terms), and alternating (ATLaS).

    python -m experiments.table_ablation --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Rows: CoOp; + vanilla LS, + vanilla LS + y, + ATLaS; the same three for CSL and for ISL (base-to-new, 16 shots).
The paper ablates CoOp only; ``--method`` runs the same rows for another text-side method (e.g. cocoop, dept-coop).
"""

from __future__ import annotations

from atlas_fast.methods import RECIPES
from atlas_fast.report import aggregate, method_name
from atlas_fast.schedules import Atlas, Joint, OneHot
from atlas_fast.softlabels import atlas_period, atlas_preset
from atlas_fast.sweep import Variant, run_grid
from experiments.common import base_config, parser, write_table

NAMES = {"ls": ("vanilla LS", "ATLaS"), "csl": ("CSL", "ATLaS-CSL"), "isl": ("ISL", "ATLaS-ISL")}


def ablation_label(config: dict) -> str:
    """Row names of the paper's ablation table (K = 1 is 'soft labels alone')."""
    schedule, soft = config["schedule"], (config.get("soft_labels") or {}).get("kind")
    if schedule["name"] == "onehot":
        return f"{method_name(config['method'])} (baseline)"
    alone, alternating = NAMES[soft]
    if schedule["name"] == "joint":
        return f"+ {alone} + y"
    return f"+ {alone}" if schedule["period"] == 1 else f"+ {alternating}"


def variants() -> list[Variant]:
    rows = [Variant("CoOp", OneHot())]
    for kind in NAMES:
        soft = atlas_preset("base2new", kind)
        rows += [Variant("alone", Atlas(1), soft), Variant("joint", Joint(), soft),
                 Variant("atlas", Atlas(atlas_period("base2new")), soft)]
    return rows


def main(argv: list[str] | None = None) -> str:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--method", default="coop", choices=sorted(set(RECIPES) - {"zsclip"}),
                   help="the method ablated (default coop, as in the paper)")
    args = p.parse_args(argv)
    records = run_grid(base_config(args, "base2new", method=args.method), args.datasets, variants(), args.seeds)
    title = (f"Ablation of soft labels and alternation ({method_name(args.method)}, base-to-new, "
             f"{len(args.datasets)} datasets)")
    return write_table(aggregate(records, label=ablation_label), "table_ablation", title, args.out)


if __name__ == "__main__":
    main()
