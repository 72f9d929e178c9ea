"""What a sweep costs besides training, and what memory the methods and the evaluation take, at the paper's scale.

ImageNet's shapes: 1,000 classes (base-to-new trains on 500), 16 shots, a 50,000-image test set, ViT-B/16 with
random weights (``pretrained=None``: nothing is downloaded). The dataset is written in ImageNet's real on-disk layout
with tiny JPEGs (what planning reads is the listing and the files' identities, not the pixels); the feature cache
is built through the real builder with the image decoding and the encoder replaced by random features of the right
size (the write path, transactions and file layout are the real ones). Sections, printed side by side:

* planning: seconds per run for sweeps of ``--runs`` runs (listing, few-shot draw, fingerprints), with
  ``--baseline-src DIR`` also for another checkout of atlas_fast (e.g. ``git archive <commit>`` unpacked);
* cache: file size and write/read rates for 16 shots x C classes x (1 + V) views plus the test set;
* inputs: what a group reads per run and once per group (the cache checks, the evaluation features);
* evaluation: time and peak memory (fresh process) of CoOp's evaluation on N x C cached features, streamed (the
  engine's path) against holding every logit (the whole-split path), and the zero-shot references of a group;
* overhead vs training: the per-run overhead of a sweep of R runs against one run's training time at paper scale
  (CoOp's ImageNet recipe: 50 epochs of 16 x C / 32 steps, one measured step of ViT-B/16 times the step count);
* ``--memory``: peak RSS of one training step of every method at each of ``--memory-classes`` at its recipe's batch
  size (fresh process each; on CUDA also the step's peak GPU memory).

Run from the repository root (minutes on a CPU; ``--quick`` for a small check)::

    python benchmarks/scale_overhead.py [--classes 1000] [--test 50000] [--runs 1 12 48] [--views 50]
        [--memory] [--device cpu] [--baseline-src DIR] [--work DIR] [--quick]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "ViT-B-16"
METHODS = ("coop", "cocoop", "kgcoop", "dept-coop", "ivlp", "maple", "promptsrc")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident set now (MB). Read here, not from atlas_fast: planning also runs under a
    ``--baseline-src`` checkout, which may predate atlas_fast.pricing."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_peak(block) -> dict:
    """``rss_before_mb`` and ``peak_rss_mb`` of a finished :class:`atlas_fast.pricing.timing.PeakMemory` block."""
    return {"rss_before_mb": block.host_start / 2**20, "peak_rss_mb": block.host / 2**20}

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.peak_mb = max(self.peak_mb, self.read())


def classnames(count: int) -> list[str]:
    """ImageNet-like names: short ones, and the last as long in tokens as ImageNet's longest (about 10), since
    the text tower runs up to the longest prompt."""
    names = [f"class {i} name" for i in range(count)]
    names[-1] = "greater swiss mountain dog with a very long breed name"
    return names


def write_imagenet(data_root: Path, classes: int, train_per_class: int, test_per_class: int) -> Path:
    """ImageNet's layout (``images/{train,val}/<wnid>/``, ``classnames.txt``) with one tiny JPEG's bytes per file."""
    from PIL import Image

    dataset_dir = data_root / "imagenet"
    if (dataset_dir / "classnames.txt").exists():
        return dataset_dir
    wnids = [f"n{1_440_764 + 37 * i:08d}" for i in range(classes)]
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (128, 100, 90)).save(buffer, format="JPEG")
    data = buffer.getvalue()
    for wnid in wnids:
        for split, count in (("train", train_per_class), ("val", test_per_class)):
            folder = dataset_dir / "images" / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                (folder / f"{wnid}_{split}{i:04d}.JPEG").write_bytes(data)
    names = classnames(classes)
    (dataset_dir / "classnames.txt").write_text("".join(f"{w} {n}\n" for w, n in zip(wnids, names)))
    return dataset_dir


def train_config(work: Path, seed: int, **changes):
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine.config import TrainConfig

    return TrainConfig("ImageNet", work / "data", backbone=BackboneConfig(MODEL, None), method="coop",
                       setting="base2new", shots=16, seed=seed, cache_root=work / "cache",
                       results_dir=work / "results", device="cpu", progress=False, **changes)


# ---- children (each in a fresh process, so peak memory is its own) ---------------------------------------------
def child_plan(work: Path, count: int, warm: bool) -> dict:
    """Seconds to plan a sweep of ``count`` runs and the memory its plans hold (backbone loaded beforehand); with
    ``warm``, only draw and store the few-shot subsets of seeds 1..count (a run's first plan, once ever)."""
    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.sweep.grid import plan_sweep

    clock = time.perf_counter()
    shared_backbone(BackboneConfig(MODEL, None), "cpu")
    out = {"backbone_s": time.perf_counter() - clock}
    configs = [train_config(work, s) for s in range(1, count + 1)]
    if warm:
        plan_sweep(configs)
        return out
    before = rss_mb()
    clock = time.perf_counter()
    specs = plan_sweep(configs)
    out["seconds"] = time.perf_counter() - clock
    out["held_mb"] = rss_mb() - before
    out["runs"] = len(specs)
    return out


def child_evaluate(classes: int, test: int, whole: bool) -> dict:
    """CoOp's evaluation of ``test`` cached features on ``classes`` classes: streamed, or holding every logit."""
    import torch

    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.engine.evaluate import EvalSet, evaluate_method, method_logits, top1_accuracy
    from atlas_fast.pricing.timing import PeakMemory
    from atlas_fast.methods.registry import build_method

    backbone = shared_backbone(BackboneConfig(MODEL, None), "cpu")
    torch.manual_seed(0)
    method = build_method("coop", backbone, classnames(classes))
    features = torch.randn(test, backbone.embed_dim)
    labels = torch.randint(0, classes, (test,))
    clock = time.perf_counter()
    with PeakMemory(torch.device("cpu")) as rss:
        if whole:
            accuracy = top1_accuracy(method_logits(method, features), labels).tolist()
        else:
            accuracy = evaluate_method(method, [EvalSet("all", tuple(classnames(classes)), features, labels)])["all"]
    return {"seconds": time.perf_counter() - clock, **rss_peak(rss), "accuracy": accuracy}


def child_eval_chunk(method_name: str, classes: int) -> dict:
    """One evaluation chunk of a method whose test path is not one text pass: CoCoOp (its text-sequence budget of
    images, C prompts each) or a pixel method (one batch of test pixels through the prompted image tower)."""
    import torch

    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.engine.evaluate import EVAL_PIXEL_BATCH
    from atlas_fast.pricing.timing import PeakMemory
    from atlas_fast.methods.registry import build_method

    backbone = shared_backbone(BackboneConfig(MODEL, None), "cpu")
    torch.manual_seed(0)
    method = build_method(method_name, backbone, classnames(classes)).eval()
    out = {"method": method_name, "classes": classes}
    with torch.no_grad():
        if method.reads_pixels:
            clock = time.perf_counter()
            classify = method.pixel_classifier()  # the class set's text, encoded once
            out["text_s"] = time.perf_counter() - clock
            pixels = torch.randn(EVAL_PIXEL_BATCH, 3, 224, 224)
            with PeakMemory(torch.device("cpu")) as rss:
                clock = time.perf_counter()
                classify(method.eval_pixel_features(pixels))
            out["images"] = EVAL_PIXEL_BATCH
        else:
            features = torch.randn(method.eval_chunk(), backbone.embed_dim)
            with PeakMemory(torch.device("cpu")) as rss:
                clock = time.perf_counter()
                list(method.eval_logit_chunks(features))
            out["images"] = len(features)
    out.update(chunk_s=time.perf_counter() - clock, **rss_peak(rss))
    return out


def child_step(method_name: str, classes: int, device: str) -> dict:
    """One training step (forward, backward, SGD) of ``method_name`` at ``classes`` classes, its recipe's batch."""
    import torch
    import torch.nn.functional as F

    from atlas_fast.atlas.criterion import LossCriterion
    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.methods.config import MissingRecipe
    from atlas_fast.methods.registry import method_class
    from atlas_fast.pricing.timing import PeakMemory

    entry = method_class(method_name)
    setting = "base2new" if classes <= 500 else "cross_dataset"
    try:
        config, recipe = entry.recipe_function("paper", setting, 16, "ImageNet")
    except MissingRecipe:
        setting = "base2new"
        config, recipe = entry.recipe_function("paper", setting, 16, "ImageNet")
    torch_device = torch.device(device)
    backbone = shared_backbone(BackboneConfig(MODEL, None), torch_device)
    torch.manual_seed(0)
    method = entry.build(backbone, classnames(classes), config).to(torch_device)
    size = recipe.batch_size
    labels = torch.randint(0, classes, (size,), device=torch_device)
    if entry.reads_pixels:
        inputs = torch.randn(size, 3, 224, 224, device=torch_device)
        if entry.reads_frozen_features:
            from atlas_fast.engine.feed import PixelBatch

            inputs = PixelBatch(inputs, torch.randn(size, backbone.embed_dim, device=torch_device))
    else:
        inputs = torch.randn(size, backbone.embed_dim, device=torch_device)
    if hasattr(method, "fixed_embeddings"):  # PromptSRC's teacher text (60 x C prompts, once per process): stand-in
        method.fixed_embeddings = torch.randn(classes, backbone.embed_dim, device=torch_device)
    if torch_device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    gpu_base = torch.cuda.memory_allocated() if torch_device.type == "cuda" else 0

    criterion = LossCriterion(lambda logits, r: F.cross_entropy(logits.float(), labels), [len(labels)], torch_device)

    optimizer = torch.optim.SGD(method.trainable_parameters(), lr=1e-3, momentum=0.9)
    clock = time.perf_counter()
    with PeakMemory(torch.device("cpu")) as rss:
        method.training_loss(inputs, labels, criterion).backward()
        optimizer.step()
        if torch_device.type == "cuda":
            torch.cuda.synchronize()
    out = {"method": method_name, "classes": classes, "setting": setting, "batch": size,
           "step_s": time.perf_counter() - clock, **rss_peak(rss), "process_peak_rss_mb": peak_rss_mb()}
    if torch_device.type == "cuda":
        out["gpu_step_peak_mb"] = (torch.cuda.max_memory_allocated() - gpu_base) / 2**20
    return out


def run_child(args: list[str], src: Path = ROOT, timeout: float | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}


# ---- sections run in this process --------------------------------------------------------------------------------
def stand_in_encoder(dim: int):
    """Replace the cache builder's decoding and encoder by random features of the right size (the write path
    stays the real one)."""
    import numpy as np
    import torch

    import atlas_fast.cache.build as build

    def fake_item(self, index):
        datum, row, views = self.units[index]
        return torch.zeros(len(views), 1), row, views

    build._ViewDataset.__getitem__ = fake_item
    rng = np.random.default_rng(0)
    build._encode = lambda backbone, pixels, device, precision: rng.standard_normal(
        (pixels.shape[0], dim)).astype(np.float32)


def measure_cache(work: Path, views: int) -> dict:
    """Build the cache of seed 1's few-shot train list (1 + ``views`` views) and of the test list, then read."""
    from atlas_fast.cache import FeatureCache
    from atlas_fast.engine.spec import plan_run

    spec = plan_run(train_config(work, 1, views=views))
    backbone = spec.backbone()
    stand_in_encoder(backbone.embed_dim)
    cache = FeatureCache(work / "cache")
    train, test = spec.data.fewshot.train, spec.data.fewshot.test
    out = {"train_items": len(train), "test_items": len(test), "views": views}
    clock = time.perf_counter()
    report = cache.build(backbone, spec.dataset, train, num_views=views, num_workers=0, progress=False)
    out["write_train_s"] = time.perf_counter() - clock
    out["train_features"] = report.encoded
    clock = time.perf_counter()
    report = cache.build(backbone, spec.dataset, test, num_views=0, num_workers=0, progress=False)
    out["write_test_s"] = time.perf_counter() - clock
    files = sorted((work / "cache" / spec.dataset).glob("*.h5"))
    out["files"] = len(files)
    out["file_mb"] = sum(f.stat().st_size for f in files) / 2**20
    out["feature_mb"] = (len(train) * (views + 1) + len(test)) * backbone.embed_dim * 2 / 2**20  # float16
    clock = time.perf_counter()
    cache.load(backbone, spec.dataset, test, views=[0])
    out["read_test_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    cache.load(backbone, spec.dataset, train, views=[1])
    out["read_train_view_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    cache.load(backbone, spec.dataset, test[:1], views=[0])
    out["open_and_index_s"] = time.perf_counter() - clock
    return out


def measure_inputs(work: Path, group: int, views: int) -> dict:
    """prepare_inputs for the runs of one group (shared reads once per group), on the cache built above. Only seed
    1's train features are cached, so every run of the group is seed 1's (what is per run is the same work)."""
    from atlas_fast.engine.feed import prepare_inputs
    from atlas_fast.engine.spec import plan_run

    spec = plan_run(train_config(work, 1, views=views))
    backbone = spec.backbone()
    read_once: dict = {}
    seconds = []
    for _ in range(group):
        clock = time.perf_counter()
        prepare_inputs(spec, backbone, read_once)
        seconds.append(time.perf_counter() - clock)
    return {"first_run_s": seconds[0], "next_runs_s": sum(seconds[1:]) / max(1, len(seconds) - 1)}


def measure_zero_shot(work: Path) -> dict:
    """The zero-shot references of a group (base/new/all with ImageNet's template) on the cached test features."""
    from atlas_fast.cache import FeatureCache
    from atlas_fast.engine.evaluate import zero_shot_references
    from atlas_fast.engine.feed import evaluation_set
    from atlas_fast.engine.spec import plan_run

    spec = plan_run(train_config(work, 1))
    backbone = spec.backbone()
    cache = FeatureCache(work / "cache")
    sets = [evaluation_set(name, split, backbone, cache, spec.method) for name, split in spec.data.splits.items()]
    out = {}
    for attempt in ("first", "again"):  # the text features of the prompts are kept per process
        clock = time.perf_counter()
        zero_shot_references(backbone, sets, spec.dataset)
        out[f"{attempt}_s"] = time.perf_counter() - clock
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--test", type=int, default=50_000, help="test images (a multiple of --classes)")
    parser.add_argument("--train-per-class", type=int, default=20)
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 12, 48])
    parser.add_argument("--views", type=int, default=50, help="cached augmented views (CoOp's ImageNet epochs)")
    parser.add_argument("--group", type=int, default=4, help="runs per group (the CPU default)")
    parser.add_argument("--memory", action="store_true", help="add the per-method step memory table")
    parser.add_argument("--sections", default="plan,cache,eval,overhead",
                        help="comma-separated, from plan, cache (with the inputs and zero-shot), eval, overhead "
                             "(needs plan, cache and eval), memory")
    parser.add_argument("--memory-classes", type=int, nargs="+", default=[500, 1000])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--device", default="cpu", help="device of the --memory steps")
    parser.add_argument("--baseline-src", type=Path, help="another atlas_fast checkout to plan with, side by side")
    parser.add_argument("--work", type=Path, help="folder for the synthetic data and cache (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="100 classes, 2,000 test images, runs 1 4")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, rest = args.child[0], args.child[1:]
        if kind == "plan":
            out = child_plan(Path(rest[0]), int(rest[1]), rest[2:] == ["warm"])
        elif kind == "evaluate":
            out = child_evaluate(int(rest[0]), int(rest[1]), rest[2] == "whole")
        elif kind == "chunk":
            out = child_eval_chunk(rest[0], int(rest[1]))
        else:
            out = child_step(rest[0], int(rest[1]), rest[2])
        print(json.dumps(out), flush=True)
        return
    args.sections = set(args.sections.split(",")) | ({"memory"} if args.memory else set())
    if args.quick:
        args.classes, args.test, args.runs, args.views = 100, 2000, [1, 4], 4
        args.memory_classes = [min(c, 100) for c in args.memory_classes]
    work = args.work or Path(tempfile.mkdtemp(prefix="scale_overhead_"))
    try:
        report(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def report(args: argparse.Namespace, work: Path) -> None:
    import torch

    print(f"# scale overhead: ImageNet-shaped, {args.classes} classes, {args.test} test images, {MODEL} random "
          f"weights, torch {torch.__version__}, {os.cpu_count()} CPUs, threads {torch.get_num_threads()}")
    if args.sections - {"memory", "eval"}:
        clock = time.perf_counter()
        write_imagenet(work / "data", args.classes, args.train_per_class, args.test // args.classes)
        print(f"data written in {time.perf_counter() - clock:.1f} s ({args.classes * args.train_per_class} train, "
              f"{args.test} test files)")

    plans: dict = {}
    if "plan" in args.sections:
        plans = measure_planning(args, work)
    if "cache" in args.sections:
        cache, inputs, zero_shot = report_cache(args, work)
    if "eval" in args.sections:
        evaluations = report_evaluation(args)
    if "overhead" in args.sections and plans and "cache" in args.sections and "eval" in args.sections:
        report_overhead(args, plans, inputs, zero_shot, evaluations)
    if "memory" in args.sections:
        report_memory(args)


def measure_planning(args: argparse.Namespace, work: Path) -> dict:
    print("\n## planning a sweep (seconds per run, the one listing of the dataset included; backbone loaded "
          "beforehand)")
    sources = [("this checkout", ROOT)] + ([("baseline", args.baseline_src)] if args.baseline_src else [])
    plans = {}
    for row_name, src in sources:
        plan_work = work / f"plan-{len(plans)}"
        plan_work.mkdir(exist_ok=True)
        if not (plan_work / "data").exists():
            (plan_work / "data").symlink_to(work / "data")
        run_child(["plan", str(plan_work), str(max(args.runs)), "warm"], src)
        plans[row_name] = {count: run_child(["plan", str(plan_work), str(count)], src) for count in args.runs}
    print("| runs | " + " | ".join(f"{row_name} s/run | {row_name} MB held by the plans" for row_name in plans) + " |")
    print("|---:|" + "---:|---:|" * len(plans))
    for count in args.runs:
        cells = [f"{p[count]['seconds'] / count:.3f} | {p[count]['held_mb']:.0f}" if "seconds" in p[count]
                 else p[count].get("error", "?") for p in plans.values()]
        print(f"| {count} | " + " | ".join(cells) + " |")
    return plans


def report_cache(args: argparse.Namespace, work: Path) -> tuple[dict, dict, dict]:
    print("\n## feature cache (one HDF5 file per dataset, backbone and transform; float16)")
    cache = measure_cache(work, args.views)
    print(f"train {cache['train_items']} images x {1 + cache['views']} views written in {cache['write_train_s']:.1f} s "
          f"({cache['train_features'] * 1024 / 2**20 / cache['write_train_s']:.1f} MB/s of float16 features), test "
          f"{cache['test_items']} x 1 view in {cache['write_test_s']:.1f} s; {cache['files']} file(s), "
          f"{cache['file_mb']:.0f} MB on disk for {cache['feature_mb']:.0f} MB of features")
    test_mb = cache["test_items"] * 1024 / 2**20
    print(f"read: test view 0 {cache['read_test_s']:.2f} s ({test_mb / cache['read_test_s']:.0f} MB/s), one train "
          f"view {cache['read_train_view_s']:.2f} s, open + row index for one image {cache['open_and_index_s']:.3f} s")

    inputs = measure_inputs(work, args.group, args.views)
    print(f"\n## a group's inputs: first run {inputs['first_run_s']:.2f} s (test-set checks and evaluation features, "
          f"once per group), each further run {inputs['next_runs_s']:.2f} s")
    zero_shot = measure_zero_shot(work)
    print(f"zero-shot references (base/new/all): {zero_shot['first_s']:.1f} s the first time in a process, "
          f"{zero_shot['again_s']:.1f} s for each later group (prompt features kept)")
    return cache, inputs, zero_shot


def report_evaluation(args: argparse.Namespace) -> dict:
    print(f"\n## evaluation of {args.test} cached test features x {args.classes} classes (CoOp, fresh process)")
    evaluations = {mode: run_child(["evaluate", str(args.classes), str(args.test), mode])
                   for mode in ("stream", "whole")}
    print("| path | seconds | RSS before MB | peak RSS MB | peak over before MB | accuracy |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, e in evaluations.items():
        if "error" in e:
            print(f"| {mode} | {e['error']} |")
            continue
        print(f"| {mode} | {e['seconds']:.1f} | {e['rss_before_mb']:.0f} | {e['peak_rss_mb']:.0f} | "
              f"{e['peak_rss_mb'] - e['rss_before_mb']:.0f} | "
              f"{e['accuracy'][0]:.3f} |")
    print(f"\nOne evaluation chunk of the methods whose test path is not one text pass ({args.classes} classes; "
          f"the whole test set extrapolated from it):")
    print("| method | images per chunk | seconds per chunk | peak over before MB | test set, extrapolated |")
    print("|---|---:|---:|---:|---:|")
    for name in ("cocoop", "ivlp"):
        c = run_child(["chunk", name, str(args.classes)])
        if "error" in c:
            print(f"| {name} | {c['error']} |")
            continue
        total = c["chunk_s"] * args.test / c["images"] + c.get("text_s", 0.0)
        print(f"| {name} | {c['images']} | {c['chunk_s']:.1f} | {c['peak_rss_mb'] - c['rss_before_mb']:.0f} | "
              f"{total / 3600:.1f} h |")
    return evaluations


def report_overhead(args: argparse.Namespace, plans: dict, inputs: dict, zero_shot: dict, evaluations: dict) -> None:
    step = run_child(["step", "coop", str(min(args.classes, 500)), "cpu"])
    steps = 50 * (16 * min(args.classes, 500) // 32)
    if "error" not in step:
        train_s = step["step_s"] * steps
        evaluation = evaluations["stream"].get("seconds", 0.0)
        print(f"\n## per-run overhead against training (CoOp base-to-new on ImageNet: {steps} steps x "
              f"{step['step_s']:.1f} s measured = {train_s / 3600:.1f} h per run on this machine)")
        print("| runs R | plan s/run | inputs s/run | zero-shot s/run | evaluation s/run (3 sets) | overhead % of "
              "training |")
        print("|---:|---:|---:|---:|---:|---:|")
        plan = plans["this checkout"]
        for count in args.runs:
            groups = -(-count // args.group)
            per_run_plan = plan[count].get("seconds", float("nan")) / count
            per_run_inputs = (groups * inputs["first_run_s"] + (count - groups) * inputs["next_runs_s"]) / count
            per_run_zero = (zero_shot["first_s"] + (groups - 1) * zero_shot["again_s"]) / count
            per_run_eval = 2 * evaluation  # base + new (500 classes each, half the images) + all: about 2x "all"
            total = per_run_plan + per_run_inputs + per_run_zero + per_run_eval
            print(f"| {count} | {per_run_plan:.2f} | {per_run_inputs:.2f} | {per_run_zero:.2f} | {per_run_eval:.1f} | "
                  f"{100 * total / train_s:.3f} |")


def report_memory(args: argparse.Namespace) -> None:
    print(f"\n## one training step at ImageNet's class counts ({MODEL}, recipe batch, {args.device}, fresh "
          f"process each)")
    gpu = args.device.startswith("cuda")
    print("| method | C | batch | step s | RSS before MB | step peak RSS MB | process peak RSS MB |"
          + (" GPU step peak MB |" if gpu else ""))
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if gpu else ""))
    for classes in args.memory_classes:
        for name in args.methods:
            m = run_child(["step", name, str(classes), args.device])
            if "error" in m:
                print(f"| {name} | {classes} | {m['error']} |")
                continue
            print(f"| {name} | {classes} | {m['batch']} | {m['step_s']:.1f} | {m['rss_before_mb']:.0f} | "
                  f"{m['peak_rss_mb']:.0f} | {m['process_peak_rss_mb']:.0f} |"
                  + (f" {m['gpu_step_peak_mb']:.0f} |" if gpu else ""), flush=True)


if __name__ == "__main__":
    main()
