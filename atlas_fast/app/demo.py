"""``atlas-fast demo``: the paper's base-to-new comparison (Table III) on the embedded world, on any CPU.

It generates the world benchmark (or reuses it), loads the shipped ``atlas-world`` CLIP, builds the feature cache,
and trains CoOp, + ATLaS, + ATLaS-CSL and + ATLaS-ISL on the base classes (16 shots, the paper's CoOp recipe and
ATLaS presets, one fresh augmented view per epoch as the reference trains, seeds 1-3), then prints a table shaped
like Table III with a zero-shot row and a plain sentence on whether ATLaS helped here (paired by seed, with a 95 %
interval; with ``kappa``, also κ of Theorem 1 for each soft label at the start and end of its run), and saves a
plot. Every stage goes through the same loaders, cache and trainer as a real dataset; finished runs are reused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from atlas_fast.app.options import WORLD_BACKBONE
from atlas_fast.world.benchmark import DECLINE_DATASET, SplitSizes
from atlas_fast.vocabulary import PAPER_SOFT_LABEL_KINDS, environment_graph_steps


@dataclass
class DemoConfig:
    """What the demo runs. ``views``: cached augmented views per training image; None is one per epoch, the
    reference's fresh crop every epoch (a smaller V is a speed knob whose cost docs/views-study.md measures).
    ``sizes``: images per class generated for train/val/test (32 train images let the seeds draw different 16-shot
    subsets; 50 test images per class give 600 test images per 12-class half)."""

    data_root: Path = Path("data/world")
    cache_root: Path = Path("cache")
    results_dir: Path = Path("results/demo")
    datasets: tuple[str, ...] = (DECLINE_DATASET,)
    seeds: tuple[int, ...] = (1, 2, 3)
    shots: int = 16
    sizes: SplitSizes = SplitSizes(train=32, val=4, test=50)
    views: int | None = None
    epochs: int | None = None
    device: str = "auto"
    graph_steps: bool | None = field(default_factory=environment_graph_steps)  # TrainConfig.graph_steps of every run
    plot: Path = field(default_factory=lambda: Path("results/demo/table3_base2new.png"))
    kappa: bool = False  # also measure κ of Theorem 1 (atlas_fast.app.kappa_runs) at each run's start and end


def run_demo(config: DemoConfig, progress: bool = True) -> str:
    """Run the demo grid and return the printed report (table, where the files are, and the command's total time
    from its start, with where it went)."""
    from atlas_fast.report.figures import plot_rows
    from atlas_fast.report.formats import latex_table, markdown_table
    from atlas_fast.report.rows import aggregate
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.atlas.variants import paper_variants
    from atlas_fast.sweep import run_grid
    from atlas_fast.engine import TrainConfig
    from atlas_fast.world.benchmark import generate_benchmark

    from atlas_fast.progress import process_seconds, say

    from atlas_fast.engine.spec import refuse_graph_steps_off_cuda

    refuse_graph_steps_off_cuda(config.graph_steps, config.device)  # before the world is generated
    stage = say if progress else (lambda message: None)
    phases: dict[str, float] = {"start-up": process_seconds()}  # imports and parsing, before this function
    count = 4 if config.kappa else 3
    clock = time.perf_counter()
    stage(f"demo 1/{count}: the world benchmark ({', '.join(config.datasets)}) under {config.data_root}")
    generate_benchmark(config.data_root, config.datasets, sizes=config.sizes, progress=progress)
    base = TrainConfig(dataset=config.datasets[0], data_root=config.data_root,
                       backbone=BackboneConfig(*WORLD_BACKBONE), method="coop", recipe_family="paper",
                       setting="base2new", shots=config.shots, views=config.views, epochs=config.epochs,
                       device=config.device, graph_steps=config.graph_steps, cache_root=config.cache_root, results_dir=config.results_dir,
                       progress=False)
    variants = paper_variants("base2new")
    phases["world"], clock = time.perf_counter() - clock, time.perf_counter()
    stage(f"demo 2/{count}: {len(config.datasets) * len(variants) * len(config.seeds)} runs (CoOp and + ATLaS, "
          f"-CSL, -ISL x seeds {', '.join(map(str, config.seeds))}); the feature cache is built on first use")
    records = run_grid(base, config.datasets, variants, config.seeds, progress=progress)
    phases["runs"], clock = time.perf_counter() - clock, time.perf_counter()
    judged = verdict(records)
    if config.kappa:
        stage(f"demo 3/{count}: κ of Theorem 1 for LS, CSL and ISL at the start and end of each run")
        judged += "".join(f" {sentence}"
                          for sentence in kappa_sentences(base, config, variants, records, progress=progress))
        phases["κ"], clock = time.perf_counter() - clock, time.perf_counter()
    stage(f"demo {count}/{count}: the table, plot and verdict")
    rows = aggregate(records, leave_out={"backbone.model"})  # the title names the world's CLIP
    zs = _zero_shot_row(records)
    views = "one per epoch" if config.views is None else str(config.views)
    title = (f"Base-to-new on the embedded world ({', '.join(config.datasets)}; atlas-world CLIP; "
             f"{config.shots} shots, seeds {', '.join(map(str, config.seeds))}; mean ± std over seeds; "
             f"cached views per image: {views})")
    plot = plot_rows(rows, config.plot)
    (config.results_dir / "table3_base2new.tex").write_text(latex_table(rows, caption=title) + "\n")
    phases["table and plot"] = time.perf_counter() - clock
    lines = [markdown_table(rows, title), "", zs, "", judged, "", f"Plot: {plot}",
             f"LaTeX: {config.results_dir / 'table3_base2new.tex'}",
             f"Records: {config.results_dir}/<dataset>/*.json", time_line(phases, records)]
    report = "\n".join(lines)
    (config.results_dir / "table3_base2new.md").write_text(report + "\n")
    return report


def time_line(phases: dict[str, float], records: Sequence[dict]) -> str:
    """``Total time: 5 min 2 s from the command's start (start-up 3 s; world 1 s; 12 runs 4 min 50 s: ...)``: the
    whole command, and where it went; the runs' part splits into what the runs trained now spent on their inputs
    (building the feature cache; soft labels) and the rest (training, evaluation, records)."""
    from atlas_fast.progress import duration, process_seconds

    trained = [r for r in records if not r.get("skipped")]
    inputs = sum(float(r.get("timings", {}).get("inputs", 0.0)) for r in trained)
    parts = []
    for name, seconds in phases.items():
        if name == "runs" and trained:
            parts.append(f"{len(trained)} runs {duration(seconds)}: feature cache and inputs {duration(inputs)}, "
                         f"training and evaluation {duration(max(seconds - inputs, 0.0))}")
        elif name == "runs":
            parts.append(f"runs {duration(seconds)}: every run was finished already")
        else:
            parts.append(f"{name} {duration(seconds)}")
    return f"Total time: {duration(process_seconds())} from the command's start ({'; '.join(parts)})"


def kappa_sentences(base, config: DemoConfig, variants, records: Sequence[dict], progress: bool = False
                    ) -> list[str]:
    """The verdict's sentences on κ of Theorem 1: each soft label's κ at the initial context and at the end of its
    own ATLaS run, per dataset, against the order of the runs' H (:func:`atlas_fast.app.kappa_runs.kappa_sentence`).
    With ``progress``, a line per run measured, with the time so far and about how much is left."""
    from atlas_fast.app.kappa_runs import kappa_sentence, run_kappa
    from atlas_fast.progress import TimeLeft, say
    from atlas_fast.report.rows import variant_name
    from atlas_fast.sweep import grid_configs

    configs = grid_configs(base, config.datasets, variants, config.seeds)  # run_grid's order: the records' order
    listings: dict = {}
    rows: list[dict] = []
    clock = TimeLeft(len(records))
    for done, (c, record) in enumerate(zip(configs, records), start=1):
        rows += run_kappa(c, record, PAPER_SOFT_LABEL_KINDS, listings)
        if progress:
            say(f"κ [{done}/{len(records)}] {c.dataset} {variant_name(record['config'])} seed {c.seed}: "
                f"{clock.text(done)}")
    return [s for s in (kappa_sentence(rows, records, dataset) for dataset in config.datasets) if s]


def _zero_shot_row(records: Sequence[dict]) -> str:
    """The zero-shot CLIP reference (the dataset's template, no training), from the records."""
    from atlas_fast.engine.evaluate import harmonic_mean

    first = {}
    for record in records:  # zero-shot does not depend on the variant or seed's training, only on the classes
        first.setdefault((record["config"]["dataset"], record["config"]["seed"]), record["metrics"]["zero_shot"])
    base = sum(z["base"] for z in first.values()) / len(first)
    new = sum(z["new"] for z in first.values()) / len(first)
    return (f"Zero-shot CLIP reference (hand-crafted template, no training): base {base:.2f}, new {new:.2f}, "
            f"H {harmonic_mean(base, new):.2f}")


def verdict(records: Sequence[dict]) -> str:
    """One plain sentence per ATLaS variant: does it raise or lower new-class accuracy and H against CoOp? The paired
    per-seed differences decide, with a 95 % t interval over them (:mod:`atlas_fast.report.stats`): "raises" or
    "lowers" when the interval excludes 0, "no difference at 95 %" when it holds it; with one seed there is no
    interval, and the sentence says so. Seeds pair within a dataset; each dataset gets its own sentences."""
    datasets = list(dict.fromkeys(record["config"]["dataset"] for record in records))
    if len(datasets) > 1:
        return " ".join(f"On {dataset}: " + verdict([r for r in records if r["config"]["dataset"] == dataset])
                        for dataset in datasets)
    from collections import defaultdict

    from atlas_fast.engine.evaluate import harmonic_mean
    from atlas_fast.report.stats import paired_difference
    from atlas_fast.report.rows import variant_name

    by_variant: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for record in records:
        c, m = record["config"], record["metrics"]
        by_variant[variant_name(c)][c["seed"]] = {"new": m["new"], "H": harmonic_mean(m["base"], m["new"])}
    names = list(by_variant)
    baseline, sentences, seeds = names[0], [], set()
    for variant in names[1:]:
        pairs = [seed for seed in by_variant[variant] if seed in by_variant[baseline]]
        seeds.add(len(pairs))
        parts = []
        for metric in ("new", "H"):
            paired = paired_difference([by_variant[variant][k][metric] for k in pairs],
                                       [by_variant[baseline][k][metric] for k in pairs])
            name = "new-class accuracy" if metric == "new" else "H"
            direction = paired.direction()
            if not paired.has_interval:
                parts.append(f"changes {name} by {paired.mean:+.2f} on its one seed (no interval)")
            elif direction == "no difference at 95 %":
                parts.append(f"no difference at 95 % in {name} ({paired.cell()})")
            else:
                parts.append(f"{direction} {name} by {abs(paired.mean):.2f} "
                             f"[{paired.low:+.2f}, {paired.high:+.2f}]")
        sentences.append(f"{variant.removeprefix('+ ')}: {parts[0]}; {parts[1]}.")
    count = max(seeds) if seeds else 0
    basis = (f"paired by seed, mean difference over {count} seeds with its 95 % t interval" if count > 1 else
             "one seed only: differences without an interval")
    return f"Against {baseline} ({basis}): " + " ".join(sentences)
