"""κ of Theorem 1 measured: each soft label's gradient noise against one-hot's, at init and along CoOp's runs.

    atlas-fast experiment theorem1_kappa --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt
    atlas-fast experiment theorem1_kappa --world --seeds 1          # WorldPhotos and WorldSketches

The paper's Theorem 1 says soft labels act on ATLaS's convergence only through κ = σ̂² / σ² (Lemma 1) and that
ATLaS's bound, with variance factor 1 − θ/K + θκ/K, beats vanilla LS's 1 − θ + θκ whenever κ > 1; it never measures
κ. This module trains CoOp and CoOp + ATLaS / -CSL / -ISL (base-to-new, the paper's presets) saving the context at
a few points of each run, then measures κ of every soft label at those contexts on the run's training items
(:mod:`atlas_fast.atlas.kappa`; ``docs/theorem1-kappa.md`` maps the paper's definitions to the computation), and
writes per dataset a table (κ at the initial context and along each soft label's own ATLaS run, the bounds' factors,
and the H that run reaches against CoOp, paired by seed) and a plot of κ along the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.report.figures import save_figure, series_figure
from atlas_fast.report.formats import deviation_sentences, write_csv_lines
from atlas_fast.report.rows import deviation_marks, variant_name
from atlas_fast.report.stats import interval_note, paired_by_seed
from atlas_fast.experiments.common import BASE_NEW, base_config, publish
from atlas_fast.vocabulary import SOFT_LABEL_KINDS

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Theorem 1 and Lemma 1 (κ, measured; not in the paper)"
DATASETS = ("ImageNet",)
WORLD_DEFAULTS = {"datasets": ["WorldPhotos", "WorldSketches"]}
KINDS = SOFT_LABEL_KINDS
NAMES = {"ls": "LS", "csl": "CSL", "isl": "ISL", "mix": "mix"}  # how this module's tables print each kind


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                   help="soft labels whose κ is measured (default: all); the runs are CoOp and + ATLaS with ls, "
                        "csl and isl")
    p.add_argument("--snapshot-fractions", type=float, nargs="*", default=[0.05, 0.25, 0.5, 0.75],
                   help="fractions of the run's epochs at which its context is saved, besides the start and the "
                        "end (default: %(default)s)")


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.app.kappa_runs import with_snapshots
    from atlas_fast.sweep import paper_variants, grid_configs

    configs = []
    for dataset in args.datasets:
        base = dataclasses.replace(base_config(args, "base2new", method="coop", evaluate=BASE_NEW), dataset=dataset)
        base = with_snapshots(base, args.snapshot_fractions)
        configs += grid_configs(base, [dataset], paper_variants("base2new"), args.seeds)
    return configs


def report(args: argparse.Namespace, records: list[dict]) -> str:
    from atlas_fast.app.kappa_runs import kappa_sentence, run_kappa

    configs = plan(args)
    listings: dict = {}
    rows = [row for config, record in zip(configs, records)
            for row in run_kappa(config, record, args.kinds, listings)]
    out = Path(args.out)
    write_csv_lines(out / "theorem1_kappa.csv", rows, ["dataset"])
    sections = []
    for dataset in args.datasets:
        sections.append(dataset_table(rows, records, dataset))
        _plot(rows, dataset, out / f"theorem1_kappa_{dataset}.png")
        sentence = kappa_sentence(rows, records, dataset)
        if sentence:
            sections.append(sentence)
    return publish(args.out, "theorem1_kappa.md", "\n\n".join(sections))


def dataset_table(rows: list[dict], records: list[dict], dataset: str) -> str:
    """Markdown: per soft label, κ at the initial context, along and at the end of its own ATLaS run (at CoOp's
    end for the mix, which has no run here), the bounds' variance factors there, and that run's H against CoOp."""
    from atlas_fast.app.kappa_runs import h_by_run, mean_over_seeds, own_run

    kappa = mean_over_seeds([r for r in rows if r["dataset"] == dataset])
    factors = {field: mean_over_seeds([r for r in rows if r["dataset"] == dataset], field)
               for field in ("theta", "kappa_target", "atlas_factor", "ls_factor")}
    h = h_by_run(records)
    epochs = sorted({key[2] for key in kappa})
    seeds = sorted({r["seed"] for r in rows if r["dataset"] == dataset})
    head = (["Soft label", "run", "θ"] + [("κ init" if e == 0 else f"κ @{e}") for e in epochs]
            + ["κ of y_LS (end)", "ATLaS 1−θ/K+θκ/K", "LS 1−θ+θκ", "H of the run", "ΔH vs CoOp (95 % CI)"])
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    runs: dict[str, list[dict]] = {}
    for record in records:
        if record["config"]["dataset"] == dataset:
            runs.setdefault(variant_name(record["config"]), []).append(record)
    table_note, marks = deviation_marks(runs)
    coop = h.get((dataset, "CoOp"), {})
    for kind in sorted({key[3] for key in kappa}, key=list(KINDS).index):
        run = own_run(kind) if any(key[1] == own_run(kind) for key in kappa) else "CoOp"
        cells = [f"{kappa[(dataset, run, e, kind)]:.3f}" if (dataset, run, e, kind) in kappa else "" for e in epochs]
        end = (dataset, run, epochs[-1], kind)
        h_run = h.get((dataset, run), {})
        paired = paired_by_seed(h_run, coop) if run != "CoOp" else None
        lines.append("| " + " | ".join([NAMES[kind], run + marks.get(run, ""), f"{factors['theta'][end]:g}", *cells,
                                        f"{factors['kappa_target'][end]:.3f}", f"{factors['atlas_factor'][end]:.3f}",
                                        f"{factors['ls_factor'][end]:.3f}",
                                        f"{statistics.fmean(h_run.values()):.2f}" if h_run else "",
                                        paired.cell() if paired else ""]) + " |")
    coop_end = [f"{NAMES[k]} {kappa[(dataset, 'CoOp', epochs[-1], k)]:.3f}" for k in KINDS
                if (dataset, "CoOp", epochs[-1], k) in kappa]
    notes = [f"κ = σ̂²/σ² over the {dataset} training items (view 0), mean over seed(s) {', '.join(map(str, seeds))}",
             "θ is the paper's θ of y_LS = (1 − θ) y + θ ŷ: the preset θ for uniform LS (ŷ = 1/C), 1 for CSL, ISL "
             "and mix (they replace the smoothing epoch's target, so ŷ is the soft label itself)",
             "factors at the run's end",
             f"at CoOp's final context: {', '.join(coop_end)}" if coop_end else "",
             interval_note(len(seeds), "CoOp"), *deviation_sentences(table_note, marks.values())]
    title = f"**κ of Theorem 1 on {dataset} (CoOp, base-to-new, the paper's presets){table_note}**"
    return "\n".join([title, "", *lines, "", "; ".join(n for n in notes if n) + "."])


def _plot(rows: list[dict], dataset: str, path: Path) -> None:
    """κ along each soft label's own ATLaS run (and along CoOp's run), mean over seeds."""
    from atlas_fast.app.kappa_runs import mean_over_seeds, own_run

    kappa = mean_over_seeds([r for r in rows if r["dataset"] == dataset])
    epochs = sorted({key[2] for key in kappa})
    series = {}
    for kind in sorted({key[3] for key in kappa}, key=list(KINDS).index):
        for run, tag in ((own_run(kind), "own ATLaS run"), ("CoOp", "CoOp's run")):
            values = [kappa.get((dataset, run, e, kind)) for e in epochs]
            if all(v is not None for v in values):
                series[f"{NAMES[kind]}, {tag}"] = values
    fig = series_figure(epochs, series, xlabel="epochs trained", ylabel="κ = σ̂²/σ² (log scale)", log_y=True)
    fig.set_size_inches(6.2, 2.8)
    fig.axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # off the curves
    save_figure(fig, path)
