"""Grid vs search on the world, side by side in one run: CoOp + ATLaS-ISL (base-to-new, 16 shots), selected on the
validation H.

* **grid**: every point of the sensitivity figure's ranges that ISL reads, α ∈ {0.1, ..., 1.0} x K ∈ {1, ..., 5}
  (atlas_fast/experiments/fig_sensitivity.py; θ and τ_c change only LS and CSL soft labels, so an ISL grid over them
  would repeat each point), every point trained to the end (an Optuna grid sampler, no pruning);
* **search**: TPE over the same ranges (α continuous, K integer) with Hyperband pruning (``--pruner``) from the
  validation H of its rung epochs, ``--trials`` trials.

Both run through :func:`atlas_fast.search.run_study` on one feature cache, built beforehand (not timed), so both read
the same cached features and count epochs the same way (the epochs a trial trained, summed). Printed: the best
validation H of each, the epochs and seconds each spent, whether the search came within 0.5 points of the grid's best
with at most 20 % of its epochs, and the time of 200 trials against 40 full runs (extrapolated from the measured
seconds per trial and per grid run unless ``--trials 200``). The best-so-far vs epochs-spent curves go to
``--out/search_speed.png``.

Usage::

    python benchmarks/search_speed.py                      # the full grid (50 points, the recipe's 200 epochs)
    python benchmarks/search_speed.py --epochs 20 --alphas 0.1 0.4 0.7 1.0    # a reduced grid (say so)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.atlas.variants import label_variant  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig  # noqa: E402
from atlas_fast.vocabulary import PRUNERS  # noqa: E402
from atlas_fast.engine import TrainConfig  # noqa: E402
from atlas_fast.experiments.fig_sensitivity import GRIDS  # noqa: E402
from atlas_fast.search import SearchConfig, choice, integers, run_study, uniform  # noqa: E402
from atlas_fast.search.outputs import best_so_far  # noqa: E402

DATASET = "WorldPhotos"
ISL = label_variant("base2new", "isl")  # CoOp + ATLaS-ISL with the paper's base-to-new presets


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-root", type=Path, default=Path("data/world"))
    p.add_argument("--cache-root", type=Path, default=Path("cache"))
    p.add_argument("--out", type=Path, default=Path("results/search_speed"))
    p.add_argument("--world-images", type=int, nargs=3, default=[32, 4, 50], metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--epochs", type=int, default=None, help="default: CoOp's base-to-new recipe (200)")
    p.add_argument("--alphas", type=float, nargs="+", default=GRIDS["alpha"][1], help="grid of α (default: the "
                   "sensitivity figure's 10 values)")
    p.add_argument("--periods", type=int, nargs="+", default=GRIDS["K"][1], help="grid of K (default 1-5)")
    p.add_argument("--trials", type=int, default=40, help="trials of the search (default 40)")
    p.add_argument("--batch-runs", type=int, default=None, help="grid points trained together (default: a "
                   "sweep's, 12 on a GPU and 4 on the CPU)")
    p.add_argument("--pruner", choices=[p for p in PRUNERS if p != "none"], default="hyperband",
                   help="the search's pruner (default hyperband, the search's default)")
    p.add_argument("--search-batch", type=int, default=None,
                   help="trials of the search trained together (default: the search's, 1 on the CPU)")
    p.add_argument("--seed", type=int, default=1, help="few-shot seed (default 1)")
    p.add_argument("--sampler-seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    return p.parse_args(argv)


def base_config(args: argparse.Namespace, results: Path) -> TrainConfig:
    config = TrainConfig(DATASET, args.data_root, backbone=BackboneConfig("atlas-world", "atlas-world"), shots=16,
                         seed=args.seed, schedule=ISL.schedule, soft_labels=ISL.soft_labels, epochs=args.epochs, device=args.device,
                         cache_root=args.cache_root, results_dir=results, progress=False)
    return config


def timed_study(search: SearchConfig) -> tuple[object, float]:
    clock = time.perf_counter()
    study = run_study(search, progress=False)
    return study, time.perf_counter() - clock


def plot_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for row_name, curve in curves.items():
        points = [(e, v) for e, v in curve if v != float("-inf")]
        axes.step([e for e, _ in points], [v for _, v in points], where="post", label=row_name)
    axes.set_xlabel("training epochs spent (summed over trials)")
    axes.set_ylabel("best validation H so far (%)")
    axes.set_title("CoOp + ATLaS-ISL on WorldPhotos: grid vs search")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from atlas_fast.engine.config import resolve_device
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    generate_benchmark(args.data_root, [DATASET], sizes=SplitSizes(*args.world_images), progress=True)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="search_speed-"))  # fresh studies every run: nothing is resumed
    base = base_config(args, work)
    grid_space = {"alpha": choice(*args.alphas), "K": choice(*args.periods)}
    points = len(args.alphas) * len(args.periods)
    common = dict(objective="H", heartbeat_seconds=60.0, grace_seconds=600.0, finalize=False)

    # the cache (train views, validation features) and soft labels, built once and not timed
    warm = SearchConfig(dataclasses.replace(base, epochs=2, views=base.views or _epochs(base)),
                        {"alpha": uniform(0.1, 1.0)}, n_trials=1, pruner="none", study_name="warm", **common)
    run_study(warm, progress=False)

    from atlas_fast.sweep import DEFAULT_BATCH_RUNS

    batch_runs = args.batch_runs or DEFAULT_BATCH_RUNS.get(resolve_device(base.device).type, 1)
    grid = SearchConfig(base, grid_space, n_trials=points, sampler="grid", pruner="none",
                        sampler_seed=args.sampler_seed, batch_trials=batch_runs, study_name="grid", **common)
    grid_study, grid_seconds = timed_study(grid)
    search_space = {"alpha": uniform(min(args.alphas), max(args.alphas)),
                    "K": integers(min(args.periods), max(args.periods))}
    search = SearchConfig(base, search_space, n_trials=args.trials, sampler="tpe", pruner=args.pruner,
                          sampler_seed=args.sampler_seed, batch_trials=args.search_batch, study_name="search", **common)
    search_study, search_seconds = timed_study(search)

    epochs = _epochs(base)
    grid_curve, search_curve = best_so_far(grid_study), best_so_far(search_study)
    grid_best, search_best = grid_curve[-1][1], search_curve[-1][1]
    grid_epochs, search_epochs = grid_curve[-1][0], search_curve[-1][0]
    pruned = sum(t.state.name == "PRUNED" for t in search_study.trials)
    per_run = grid_seconds / points
    per_trial = search_seconds / args.trials
    lines = [
        f"CoOp + ATLaS-ISL on {DATASET} (base-to-new, 16 shots, seed {args.seed}, {epochs} epochs, device "
        f"{resolve_device(base.device).type}, {torch.get_num_threads()} thread(s)), selected on validation H; cache "
        f"built beforehand",
        "",
        "| | trials | pruned | epochs spent | seconds | best validation H | best values |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| grid ({len(args.alphas)} α x {len(args.periods)} K, {batch_runs} runs a group) | {points} | 0 | "
        f"{grid_epochs} | {grid_seconds:.1f} | {grid_best:.2f} | {_values(grid_study.best_params)} |",
        f"| search (TPE + {args.pruner}, {search.batch_trials or 'default'} trial(s) a batch) | {args.trials} | "
        f"{pruned} | {search_epochs} | {search_seconds:.1f} | {search_best:.2f} | "
        f"{_values(search_study.best_params)} |",
        "",
        f"search vs grid: {search_best - grid_best:+.2f} points of validation H with "
        f"{100 * search_epochs / grid_epochs:.1f} % of the grid's epochs -> target (within 0.5 points, at most 20 %): "
        f"{'met' if search_best >= grid_best - 0.5 and search_epochs <= 0.2 * grid_epochs else 'NOT met'}",
        f"200 trials vs 40 full runs: {200 * per_trial:.0f} s vs {40 * per_run:.0f} s"
        + (" (measured)" if args.trials == 200 else f" (extrapolated from {per_trial:.2f} s per search trial and "
           f"{per_run:.2f} s per grid run)") + " -> target (at most as slow): "
        + ("met" if 200 * per_trial <= 40 * per_run else "NOT met"),
    ]
    plot = args.out / "search_speed.png"
    plot_curves({f"grid ({points} points)": grid_curve, f"search ({args.trials} trials, {args.pruner})": search_curve},
                plot)
    lines.append(f"best-so-far vs epochs spent: {plot}")
    text = "\n".join(lines)
    (args.out / "search_speed.md").write_text(text + "\n", encoding="utf-8")
    (args.out / "search_speed.json").write_text(json.dumps({"grid": grid_curve, "search": search_curve}) + "\n")
    print(text)
    return 0


def _epochs(config: TrainConfig) -> int:
    from atlas_fast.engine.spec import resolve_recipe

    return resolve_recipe(config, DATASET)[1].epochs


def _values(params: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


if __name__ == "__main__":
    sys.exit(main())
