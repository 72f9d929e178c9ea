"""The paper at its real scale, measured per unit: for each method and dataset of Table III (and the ImageNet source
of Tables I and II, trained on all 1,000 classes), a few training steps at the real C and recipe batch, evaluation
at the real test-set size, CSL/ISL generation at the real C; per-unit time and peak memory; then the whole Table III
(methods x 4 label variants x 3 seeds x datasets) predicted on this machine, and beside it the official code's cost
from the paper's Table V (1,746 s for one ImageNet CoOp run) scaled by the same units.

Model: ViT-B/16 with random weights (nothing is downloaded; time and memory do not depend on the weights). Every
unit is :mod:`atlas_fast.pricing.units`' (the engine's own step, evaluation and soft-label code on synthetic inputs
of the real shapes); the whole table is :func:`atlas_fast.pricing.estimate.price` over the table's plan facts:

* classes: base = the first ceil(C/2) classes (the base/new split), new = the rest; ImageNet (all) = 1,000;
* training images: 16 shots x the training classes; steps per epoch = ceil(images / batch); the recipe's epochs;
* class names: each dataset's own (CoOp's class lists, as the stand-ins carry them): their lengths set the prompts'
  and so the text tower's work with length groups; a unit is keyed by C, so datasets of equal C share one;
* R: the methods that batch runs (every method of the table: CoOp, CoCoOp, DePT, IVLP, MaPLe, ...) train the 12
  runs of a dataset (4 variants x 3 seeds) in groups of the device's default R (12 on a GPU, 4 on the CPU),
  lowered where R runs' steps would not fit the device's memory, as the sweep's planner groups them
  (:func:`atlas_fast.engine.group.group_runs`); the other methods one by one. A pixel group decodes each step's views once for its seeds (a seed's
  variants read the same images) and trains the epochs its runs share (ATLaS's first K - 1) with one trunk run per
  seed, then forks, as the engine does;
* evaluation: the published test-set sizes (CoOp's splits) shared out between base and new by their class counts;
  a group is evaluated in one pass (its R runs together, each test image decoded once), its units measured at its
  R; each evaluation unit is timed on ``--eval-images`` test inputs and scaled linearly to the real size;
* cache build: every test image once and 3 seeds x 16 shots x base classes training images (an upper bound: seeds
  share some) with the views of the longest cached recipe, at the measured encode rate;
* soft labels: CSL and ISL once per run that uses them, at (C, 16 x C).

The official code's column assumes its per-run cost scales as ours does between runs (by the same units): official
table = 1,746 s x (our table's per-run time summed) / (our ImageNet CoOp run), setup and cache build left out.

``--budget-s`` bounds the whole benchmark (a lent GPU is lent for minutes): a unit that would start after the
budget is skipped, results are written to ``--out`` after every unit, and the tables print what was measured.

Usage::

    python benchmarks/paper_scale.py --datasets ImageNet --methods coop --steps 1        # CPU, ViT-B/16
    python benchmarks/paper_scale.py --device cuda --budget-s 420 --out paper_scale.json  # all of Table III
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.atlas.schedules import Alternating, OneHot  # noqa: E402
from atlas_fast.atlas.variants import alternation_period  # noqa: E402
from atlas_fast.cache.build import default_workers  # noqa: E402
from atlas_fast.cache.space import human_bytes  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.data.check import PUBLISHED_SIZES  # noqa: E402
from atlas_fast.data.datasets import ELEVEN  # noqa: E402
from atlas_fast.engine import memory  # noqa: E402
from atlas_fast.methods.registry import method_class  # noqa: E402
from atlas_fast.pricing import calibrate, unit_keys as keys  # noqa: E402
from atlas_fast.pricing import command_units  # noqa: E402
from atlas_fast.pricing import estimate as est  # noqa: E402
from atlas_fast.pricing import facts as plan  # noqa: E402
from atlas_fast.pricing import units as measure  # noqa: E402
from atlas_fast.pricing.timing import Unit  # noqa: E402
from atlas_fast.sweep.grid import DEFAULT_BATCH_RUNS  # noqa: E402
from atlas_fast.world.standin_plan import real_classes  # noqa: E402

TABLE3_METHODS = ("coop", "cocoop", "dept-coop", "ivlp", "maple")
VARIANT_SOFT = (None, "ls", "csl", "isl")  # plain, ATLaS, ATLaS-CSL, ATLaS-ISL
SEEDS = 3
SHOTS = 16
# The paper's Table V: one CoOp run on ImageNet's base classes (16 shots) with the official code, and the extra time
# of generating CSL and ISL.
PAPER_COOP_IMAGENET_S = 1746.0
PAPER_CSL_S, PAPER_ISL_S = 1.96, 2.47
CPU_MEMORY_LIMIT = 24 << 30
IMAGENET_ALL = "ImageNet (all)"  # the source of Tables I and II: trained on all 1,000 classes


def problem(dataset: str) -> dict[str, Any]:
    """The real shapes of one dataset's problem: training classes, recipe setting, evaluation sets (name, C, N), and
    the dataset's own class names (``names``: per class set and for training; their lengths set the prompts')."""
    name = "ImageNet" if dataset == IMAGENET_ALL else dataset
    sizes = PUBLISHED_SIZES[name]
    classes, test = sizes.classes, sizes.test
    names = [classname for _, classname in real_classes(name)]
    if dataset == IMAGENET_ALL:
        return {"dataset": dataset, "recipe_dataset": name, "setting": "cross_dataset", "classes": classes,
                "eval": [("all", classes, test)], "train_pool": sizes.train,
                "names": {"train": names, "all": names}}
    base = math.ceil(classes / 2)
    base_test = round(test * base / classes)
    return {"dataset": dataset, "recipe_dataset": name, "setting": "base2new", "classes": base,
            "eval": [("base", base, base_test), ("new", classes - base, test - base_test)], "train_pool": sizes.train,
            "names": {"train": names[:base], "base": names[:base], "new": names[base:]}}


class Bench:
    """Measures units within a time budget, keeps them by key and writes them to ``out`` after each one."""

    def __init__(self, backbone, args: argparse.Namespace) -> None:
        self.backbone, self.args = backbone, args
        self.device = backbone.device
        self.units: dict[str, Unit] = {}
        self.skipped: list[str] = []
        self.failed: dict[str, str] = {}
        self.start = time.perf_counter()
        # decoding processes beside the GPU: the pixel path's default (up to 8) and the cache build's (every CPU the
        # process may use but one)
        self.decode_workers = min(8, max(1, (os.cpu_count() or 2) - 1)) if self.device.type == "cuda" else 1
        self.cache_workers = default_workers(self.device)
        if args.units_from:  # price from units measured earlier (e.g. on a GPU): nothing that is there is measured
            saved = json.loads(Path(args.units_from).read_text())
            self.units = {k: Unit.from_dict(v) for k, v in saved["units"].items()}
            self.device = torch.device(saved["device"])
            self.decode_workers = saved.get("decode_workers") or (8 if saved["device"].startswith("cuda") else 1)
            self.cache_workers = saved.get("cache_workers") or self.decode_workers

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.start)

    def unit(self, key: str, call) -> Unit | None:
        if key in self.units:
            return self.units[key]
        if key in self.failed or key in self.skipped:
            return None
        if self.left() <= 0 or self.args.units_from:  # out of time, or a unit the saved ones lack
            self.skipped.append(key)
            return None
        clock = time.perf_counter()
        try:
            unit = call()
        except (RuntimeError, MemoryError) as exc:  # out of memory, most likely: say so, go on with the rest
            self.failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            print(f"  {key}: FAILED ({self.failed[key]})", flush=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None
        self.units[key] = unit
        print(f"  {key}: {unit.seconds:.4g} s/unit (+{unit.fixed_seconds:.3g} s fixed), peak host "
              f"{human_bytes(unit.peak_host_bytes)}, device {human_bytes(unit.peak_device_bytes)} "
              f"[{time.perf_counter() - clock:.1f} s]", flush=True)
        self.save()
        return unit

    def save(self) -> None:
        if self.args.out:
            data = {"device": str(self.device), "model": self.args.model, "budget_s": self.args.budget_s,
                    "decode_workers": self.decode_workers, "cache_workers": self.cache_workers,
                    "threads": torch.get_num_threads(),
                    "units": {k: u.to_dict() for k, u in self.units.items()}, "skipped": self.skipped,
                    "failed": self.failed}
            Path(self.args.out).write_text(json.dumps(data, indent=1))


def runs_per_group(method: str, device: torch.device, backbone=None, classes: int = 0, batch: int = 1,
                   amp: bool = False) -> int:
    """R of the method's groups: the device's default (at most a dataset's 12 runs), lowered as the planner lowers
    it where R runs' steps would not fit the device's memory (:mod:`atlas_fast.engine.memory`)."""
    from atlas_fast.engine.group import batches_runs

    entry = method_class(method)
    if not batches_runs(entry):
        return 1
    runs = min(len(VARIANT_SOFT) * SEEDS, DEFAULT_BATCH_RUNS.get(device.type, 1))
    if backbone is None:
        return runs
    per_run = memory.step_bytes_per_run(entry, backbone, classes, batch, amp)
    return memory.runs_that_fit(runs, per_run, memory.frozen_bytes(backbone, amp), memory.device_bytes(device),
                                graphs=device.type == "cuda")  # the steps are graphed there (one-hot, ATLaS)


def measure_dataset(bench: Bench, dataset: str, methods: list[str], steps: bool) -> list[plan.GroupFacts]:
    """Measure the training steps (``steps``) or the other units of ``dataset``'s runs; returns the plan facts of its
    part of the table."""
    p = problem(dataset)
    backbone, args = bench.backbone, bench.args
    amp = bench.device.type == "cuda"
    groups = []
    for method in methods:
        entry = method_class(method)
        config, recipe = entry.recipe_function("paper", p["setting"], SHOTS, p["recipe_dataset"])
        config = measure.method_config_for(method, config, backbone)
        digest = keys.config_digest(config)
        runs = runs_per_group(method, bench.device, backbone, p["classes"], recipe.batch_size, amp)
        images = SHOTS * p["classes"]
        names = p["names"]["train"]
        if steps:
            sizes = {runs} | {trunk_of(method, p["setting"], part, recipe.epochs)[0] for part in parts(runs)} - {0}
            for size in sorted(sizes, reverse=True):  # the group's R, and its trunk's where its runs fork
                bench.unit(keys.step_key(method, p["classes"], recipe.batch_size, size, digest),
                           lambda: measure.measure_step(backbone, method, names, recipe.batch_size, size,
                                                        config=config, amp=amp, steps=args.steps,
                                                        warmup=not args.no_warmup))
            continue
        if args.steps_only:
            continue
        bench.unit(keys.overhead_key(method, p["classes"], digest),
                   lambda: measure.measure_run_overhead(backbone, method, names, config=config, max_repeats=1))
        for set_name, classes, _ in p["eval"]:
            for group_runs in sorted({len(part) for part in parts(runs)}):
                bench.unit(keys.eval_key(method, classes, digest, group_runs),
                           lambda: measure.measure_eval(backbone, method, p["names"][set_name],
                                                        args.eval_images, config=config, amp=amp, max_repeats=1,
                                                        runs=group_runs))
            bench.unit(keys.eval_key(keys.ZERO_SHOT, classes),
                       lambda: measure.measure_eval(backbone, "zsclip", p["names"][set_name], args.eval_images,
                                                    amp=amp, max_repeats=1))
        for kind in ("csl", "isl"):
            bench.unit(keys.soft_key(kind, p["classes"], images),
                       lambda: measure.measure_soft_labels(backbone, kind, names, images, max_repeats=1))
    for method in methods:  # the plan facts of the dataset's part of the table
        entry = method_class(method)
        config, recipe = entry.recipe_function("paper", p["setting"], SHOTS, p["recipe_dataset"])
        digest = keys.config_digest(measure.method_config_for(method, config, backbone))
        runs = runs_per_group(method, bench.device, backbone, p["classes"], recipe.batch_size, amp)
        images = SHOTS * p["classes"]
        evals = tuple(plan.EvalFacts(name, c, n) for name, c, n in p["eval"])
        for part in parts(runs):
            trunk_runs, trunk_epochs = trunk_of(method, p["setting"], part, recipe.epochs)
            groups.append(plan.GroupFacts(method, dataset, p["classes"], len(part), recipe.batch_size, recipe.epochs,
                                         (images,) * len(part), evals, tuple(kind for kind, _ in part),
                                         entry.reads_pixels, views=recipe.epochs, config_digest=digest,
                                         training_sets=len({seed for _, seed in part}), trunk_runs=trunk_runs,
                                         trunk_epochs=trunk_epochs))
    return groups


def trunk_of(method: str, setting: str, part: list[tuple[str | None, int]], epochs: int) -> tuple[int, int]:
    """(trunk runs, shared epochs) of a group as the engine forks it (:func:`atlas_fast.engine.group.
    plan_fork`): a pixel method's runs of one seed train alike while every run's targets are one-hot (ATLaS: the
    first K - 1 epochs); (0, 0) where nothing is shared."""
    if not method_class(method).reads_pixels:
        return 0, 0
    schedules = [OneHot() if kind is None else Alternating(alternation_period(setting)) for kind, _ in part]
    shared = next((e for e in range(epochs) if any(s.cross_entropy_kind(e) != "hard" for s in schedules)), epochs)
    seeds = len({seed for _, seed in part})
    return (seeds, shared) if shared and seeds < len(part) else (0, 0)


def parts(runs: int) -> list[list[tuple[str | None, int]]]:
    """A dataset's 12 runs (soft labels, seed), in the sweep's order (variant by variant, seeds within), cut into
    groups of ``runs`` as the planner cuts them."""
    table = [(kind, seed) for kind in VARIANT_SOFT for seed in range(SEEDS)]
    return [table[start:start + runs] for start in range(0, len(table), runs)]


def cache_features(datasets: list[str], groups: list[plan.GroupFacts]) -> tuple[int, int]:
    """(features, images) the table's cache holds: each dataset's test images (view 0) and its training images
    (3 seeds x 16 shots x training classes, at most the training split) with the longest cached recipe's views."""
    features = images = 0
    for dataset in datasets:
        p = problem(dataset)
        train = min(SEEDS * SHOTS * p["classes"], p["train_pool"])
        test = sum(n for _, _, n in p["eval"])
        views = max([g.views for g in groups if g.dataset == dataset and not g.reads_pixels] or [0])
        features += test + train * (views + 1)
        images += test + train
    return features, images


def priced(bench: Bench, groups: list[plan.GroupFacts], features: int, images: int) -> tuple[est.Estimate, list]:
    """The estimate of the groups whose units were all measured, and the groups left out."""
    parts = ((keys.CUT_KEY, bench.args.encode_batch, features, images),)  # the unit timed at --encode-batch
    facts = plan.PlanFacts((), 0, 0, features, images, int(bench.backbone.embed_dim), bench.device.type,
                           decode_workers=bench.decode_workers, cache_workers=bench.cache_workers, encode_parts=parts)
    common = [k for k in calibrate.needed_units(facts)]
    kept, left_out = [], []
    for g in groups:
        one = plan.PlanFacts((g,), g.runs, 0, 0, 0, facts.embed_dim, facts.device,
                             decode_workers=bench.decode_workers)
        if all(k in bench.units for k in calibrate.needed_units(one)):
            kept.append(g)
        else:
            left_out.append(g)
    ready = all(k in bench.units for k in common)
    facts = plan.PlanFacts(tuple(kept), sum(g.runs for g in kept), 0, features if ready else 0,
                           images if ready else 0, facts.embed_dim, facts.device, decode_workers=facts.decode_workers,
                           cache_workers=facts.cache_workers, encode_parts=parts if ready else ())
    return est.price(facts, bench.units), left_out


def per_run_seconds(estimate: est.Estimate) -> float:
    return sum(v for k, v in estimate.phases.items() if k not in ("setup", "cache build"))


def measure_machine_units(bench: Bench) -> None:
    """The units every run shares (loading the backbone, encoding and decoding an image, starting the image loader),
    measured first: a budget spent on the steps must not leave the whole table unpriced."""
    device = bench.device
    for key, call in ((keys.LOAD_KEY, lambda: command_units.measure_backbone_load(bench.backbone.config, device)),
                      (keys.encode_key(bench.args.encode_batch),
                       lambda: command_units.measure_encode(bench.backbone, batch=bench.args.encode_batch)),
                      (keys.DECODE_KEY, lambda: command_units.measure_decode(bench.backbone)),
                      (keys.CUT_KEY, lambda: command_units.measure_decode(bench.backbone, pixels=True)),
                      (keys.LOADER_KEY, lambda: command_units.measure_loader_start(bench.backbone))):
        bench.unit(key, call)


def report(bench: Bench, datasets: list[str], groups: list[plan.GroupFacts]) -> dict[str, Any]:
    """Print the units' table, the soft labels beside Table V, and the whole table's predicted time."""
    device = bench.device
    source = (f"units from {bench.args.units_from}" if bench.args.units_from
              else f"{torch.get_num_threads()} CPU threads")
    print(f"\n### Units at the real shapes ({bench.args.model}, random weights, {device}"
          f"{', fp16 autocast' if device.type == 'cuda' else ', fp32'}; {source})\n")
    print("| dataset | method | C | batch | R | s/step | steps/run | train s/run | eval s/run | peak host | "
          "peak device |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    seen = set()
    for g in groups:
        if (g.dataset, g.method) in seen:
            continue
        seen.add((g.dataset, g.method))
        step = bench.units.get(keys.step_key(g.method, g.classes, g.batch, g.runs, g.config_digest))
        why = bench.failed.get(keys.step_key(g.method, g.classes, g.batch, g.runs, g.config_digest))
        if step is None:
            print(f"| {g.dataset} | {g.method} | {g.classes} | {g.batch} | {g.runs} | "
                  f"{'failed: ' + why if why else 'skipped (budget)'} | | | | | |")
            continue
        one = plan.PlanFacts((g,), g.runs, 0, 0, 0, int(bench.backbone.embed_dim), device.type,
                             decode_workers=bench.decode_workers)
        if all(k in bench.units for k in calibrate.needed_units(one)):
            e = est.price(one, bench.units)
            train, evaluation = e.phases["training"] / g.runs, e.phases["evaluation"] / g.runs
            train_s, eval_s = f"{train:.1f}", f"{evaluation:.1f}"
        else:
            train_s = f"{g.epochs * g.steps_per_epoch * step.seconds / g.runs:.1f}"
            eval_s = "skipped"
        flag = " (over 24 GiB)" if device.type == "cpu" and step.peak_host_bytes > CPU_MEMORY_LIMIT else ""
        trunk = (bench.units.get(keys.step_key(g.method, g.classes, g.batch, g.trunk_runs, g.config_digest))
                 if g.trunk_epochs else None)
        shown = f"{step.seconds:.3g}" + (f" ({trunk.seconds:.3g} at R = {g.trunk_runs}, first "
                                         f"{g.trunk_epochs} epoch(s))" if trunk else "")
        print(f"| {g.dataset} | {g.method} | {g.classes} | {g.batch} | {g.runs} | {shown} | "
              f"{g.epochs * g.steps_per_epoch} | {train_s} | {eval_s} | {human_bytes(step.peak_host_bytes)}{flag} | "
              f"{human_bytes(step.peak_device_bytes) if device.type == 'cuda' else '-'} |")
    print("\nEvaluation is timed on a slice of test inputs and scaled linearly to the published test-set sizes. A "
          "pixel group's first epochs, which its runs share, train at its trunk's R (in brackets).")

    print("\n### Soft labels at the real C (one run's rows, 16 shots) beside the paper's Table V (ImageNet)\n")
    print("| dataset | C | images | CSL s | ISL s | Table V CSL / ISL s |")
    print("|---|---:|---:|---:|---:|---:|")
    for dataset in datasets:
        p = problem(dataset)
        n = SHOTS * p["classes"]
        csl = bench.units.get(keys.soft_key("csl", p["classes"], n))
        isl = bench.units.get(keys.soft_key("isl", p["classes"], n))
        paper = f"{PAPER_CSL_S} / {PAPER_ISL_S}" if dataset == "ImageNet" else ""
        print(f"| {dataset} | {p['classes']} | {n} | {csl.seconds if csl else float('nan'):.2f} | "
              f"{isl.seconds if isl else float('nan'):.2f} | {paper} |")

    table3 = [g for g in groups if g.dataset != IMAGENET_ALL]
    if not table3:
        print(f"\nTable III: none of its datasets was measured (--datasets {' '.join(datasets)}).")
        return {"table3_seconds": None, "runs_priced": 0}
    features, images = cache_features([d for d in datasets if d != IMAGENET_ALL], table3)
    estimate, left_out = priced(bench, table3, features, images)
    runs = sum(g.runs for g in table3)
    coop_imagenet = [g for g in table3 if g.dataset == "ImageNet" and g.method == "coop"]
    official = None
    if coop_imagenet and not any(g in left_out for g in coop_imagenet):
        one, _ = priced(bench, coop_imagenet, 0, 0)
        per_coop_run = per_run_seconds(one) / sum(g.runs for g in coop_imagenet)
        official = PAPER_COOP_IMAGENET_S * per_run_seconds(estimate) / per_coop_run
    print(f"\n### Table III on this machine ({device}): {estimate.runs} of {runs} runs priced"
          + (f"; {len(left_out)} group(s) left out (units skipped or failed): a partial table" if left_out else "")
          + "\n")
    print("| phase | atlas_fast (predicted) |")
    print("|---|---:|")
    for phase, seconds in estimate.phases.items():
        print(f"| {phase} | {seconds / 3600:.3f} h |")
    print(f"| **total** | **{estimate.total_seconds / 3600:.2f} h** |")
    if official is not None:
        print(f"| official code, from Table V (1,746 s per ImageNet CoOp run) scaled by the same units | "
              f"{official / 3600:.1f} h |")
    encode, decode = keys.encode_key(bench.args.encode_batch), keys.CUT_KEY
    timed = (f" (encode {1e3 * bench.units[encode].seconds:.3f} ms, cut {1e3 * bench.units[decode].seconds:.3f} ms "
             f"per view)" if {encode, decode} <= set(bench.units) else "")
    print(f"\npeak host memory {human_bytes(estimate.peak_host_bytes)}; peak device memory "
          f"{human_bytes(estimate.peak_device_bytes)}; cache: {features} features of {images} images "
          f"({human_bytes(features * int(bench.backbone.embed_dim) * est.STORAGE_ITEMSIZE)}), built with "
          f"{bench.cache_workers} decoding worker(s){timed}")
    by_method = {}
    print("\n| method | runs priced | R | training | evaluation | peak device memory of a group |")
    print("|---|---:|---|---:|---:|---:|")
    for method in dict.fromkeys(g.method for g in table3):
        mine, _ = priced(bench, [g for g in table3 if g.method == method], 0, 0)
        sizes = sorted({g.runs for g in table3 if g.method == method}, reverse=True)
        by_method[method] = {"training_seconds": mine.phases["training"],
                             "evaluation_seconds": mine.phases["evaluation"], "runs_priced": mine.runs,
                             "runs_per_group": sizes, "peak_device_bytes": mine.peak_device_bytes}
        print(f"| {method} | {mine.runs} | {', '.join(map(str, sizes))} | {mine.phases['training'] / 3600:.3f} h | "
              f"{mine.phases['evaluation'] / 3600:.3f} h | {human_bytes(mine.peak_device_bytes)} |")
    result = {"table3_seconds": estimate.total_seconds, "phases": estimate.phases, "runs_priced": estimate.runs,
              "runs": runs, "official_seconds": official, "peak_host_bytes": estimate.peak_host_bytes,
              "peak_device_bytes": estimate.peak_device_bytes, "by_method": by_method}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="ViT-B-16", help="open_clip model, random weights (default ViT-B-16)")
    parser.add_argument("--datasets", nargs="+", default=[*ELEVEN, IMAGENET_ALL],
                        help=f"Table III's datasets and {IMAGENET_ALL!r} (default: all of them)")
    parser.add_argument("--methods", nargs="+", default=list(TABLE3_METHODS),
                        help=f"default: {' '.join(TABLE3_METHODS)} (Table III's); promptsrc and kgcoop also run")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per unit (default 3)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="time the first steps too (no untimed warm-up epoch): for steps of minutes on a CPU")
    parser.add_argument("--steps-only", action="store_true",
                        help="measure only the training steps (time and peak memory), no evaluation or soft labels")
    parser.add_argument("--eval-images", type=int, default=32, help="test inputs each evaluation unit is timed on")
    parser.add_argument("--encode-batch", type=int, default=64,
                        help="image views per batch of the encode unit (default 64, the cache build's)")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="stop starting units after this")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default=None, help="JSON file, written after every unit")
    parser.add_argument("--units-from", default=None,
                        help="a JSON file of an earlier --out: price with its units (and its device) and measure "
                             "nothing (a unit it lacks is reported as skipped)")
    args = parser.parse_args(argv)
    for dataset in args.datasets:
        if dataset != IMAGENET_ALL and dataset not in PUBLISHED_SIZES:
            parser.error(f"--datasets: {dataset!r} has no published split sizes; known: "
                         f"{', '.join([*PUBLISHED_SIZES, IMAGENET_ALL])}")
    for method in args.methods:
        method_class(method)  # unknown names fail here, naming the registered ones
    if args.steps < 1 or args.eval_images < 1:
        parser.error("--steps and --eval-images must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device if not args.units_from else "cpu")
    backbone = load_backbone(BackboneConfig(args.model, None), device)
    print(f"{backbone.describe()} on {device}; {args.steps} timed step(s) per unit"
          f"{'' if args.no_warmup else ' after an untimed warm-up epoch'}; budget {args.budget_s} s", flush=True)
    bench = Bench(backbone, args)
    measure_machine_units(bench)
    for dataset in args.datasets:  # every training step first (time and peak memory), then the rest
        print(f"{dataset}, training steps:", flush=True)
        measure_dataset(bench, dataset, args.methods, steps=True)
    groups: list[plan.GroupFacts] = []
    for dataset in args.datasets:
        if not args.steps_only:
            print(f"{dataset}, evaluation, soft labels, per-run overhead:", flush=True)
        groups += measure_dataset(bench, dataset, args.methods, steps=False)
    result = report(bench, args.datasets, groups)
    if bench.skipped:
        print(f"\n{len(bench.skipped)} unit(s) skipped: the --budget-s of {args.budget_s} s ran out "
              f"(e.g. {bench.skipped[0]})")
    if args.out:
        data = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        Path(args.out).write_text(json.dumps({**data, "result": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
