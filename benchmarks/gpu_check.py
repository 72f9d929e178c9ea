"""Exercise every GPU path of atlas_fast once and print one table (run through ``benchmarks/gpu_check.sh``, after
``atlas-fast doctor``).

**First contact** (``--block first-contact``; planned under 4 minutes on an H100/H200), every hazard of a first run
on a real GPU, each a row:

a. a pixel group (IVLP, R = 4) through the real pipeline and loader, 2 decoding workers and pinned memory, the graphs
   captured while the workers decode: no fallback, steps replayed;
b. CLIP-LoRA (text tower, AdamW, a cosine over steps) graphed against eager with the graph's length groups: equal;
c. PromptSRC, three runs of unequal sizes (sit-outs and a partial batch) graphed against eager: equal;
d. per-epoch evaluation under graphs (CoOp, R = 2; each evaluation rebuilds the class buffers): every epoch's loss
   and accuracies equal to eager, graphs captured again after each evaluation;
e. an injected fp16 overflow: atlas_fast's optimiser, eager and replayed from a CUDA graph, against torch's own SGD
   + ``torch.amp.GradScaler`` on each run alone: equal tensors and scales;
f. reserved memory (the caching allocator's peak) of CoOp at R = 12, C = 1,000, graphed, each epoch ending on a
   partial batch, against what the memory plan budgets for that group.

Any ``graph_steps`` fallback warning during any check is a FAIL row. Then the **pricing block** (``--block pricing``)
within what ``--budget-s`` leaves (a check whose planned time does not fit is skipped with a row saying so):

1. cache build with fp16 autocast: a ViT-B/16-shaped CLIP (random weights: nothing is downloaded) encodes 38 views
   (Table III's mean) of 600 synthetic 500 x 375 JPEGs; features/s of the build, of its encoding alone and of its
   view cutting alone, the time by stage, Table III's 7.1 M features at that rate, the build before this version
   (from git) at the same size, and how close fp16-autocast and fp32 features are (cosine);
2. faiss on the GPU, when the installed faiss has GPU support: the CSL inner-product search on the GPU equals the CPU
   one (atlas_fast itself searches C x C class similarities on the CPU: they are tiny);
3. cached training with AMP: one CoOp + ATLaS-CSL run under fp16 autocast + gradient scaler vs the same run in fp32
   (seconds per epoch, and the difference of the final accuracies, which AMP may change a little);
4. R-batched training: R runs (seeds x label variants) as one module vs the same runs one by one, fp32: speed-up and
   the largest metric difference (must be ~0: batching is a pure speed knob);
5. a pixel-path method (image encoder prompted), when this version has one; otherwise n/a;
6. step speed (``benchmarks/step_speed.py``, fp16 autocast): the text step with the shared prefix and length groups
   vs open_clip's blocks at C = 19 and 500, the prompted vision tower with fused attention, a MaPLe training step;
7. graph steps: every method on cached features (batch 32, fp16 AMP), eager vs ``graph_steps`` (CUDA graphs of the
   whole step), CoOp at C = 10, 50 and 500 and the others at C = 50: steady-state ms per step, steps replayed from a
   graph, the largest difference of the learned tensors after the same steps against the same steps run eagerly
   with the graph's length groups (must be 0: a graph replays the eager kernels) and against the default eager run
   (padded); a step that syncs with the host cannot be captured, so graph_steps trains it eagerly and the row says
   so; then R = 4 runs of every cached method as one graphed group against the same group eager (must be 0) and
   run 1 alone; the host synchronisations per graphed step (CUDA's sync debug mode, target 0); and a graphed step
   at ImageNet's 500 base classes and R = 12 with the class suffixes in length groups against one padded group;
8. runs/hour by R: the 12-run grid of check 4 with the default precision (AMP) at R = 1, 4 and 12 (the GPU's default
   ``DEFAULT_BATCH_RUNS``) with the default graph steps, and R = 1 with eager steps; seconds by phase from the
   records (plan, inputs, training, evaluation, the rest);
9. the demo (``atlas-fast demo``: 12 runs of the embedded world, the paper's CoOp recipe): wall time;
10. pixel steps, graph vs eager: IVLP, MaPLe, PromptSRC and DePT-MaPLe as groups of R = 4 runs (batch 4 each,
    fp16 AMP): steady-state ms per step eager and graphed, steps replayed, the largest learned-tensor difference
    (must be 0);
11. the largest pixel group's memory: MaPLe at ImageNet's 1,000 classes (cross-dataset, J = 3) and IVLP at its 500
    base classes, R = 12 runs, batch 4, AMP: peak device memory of the training steps beside the planner's estimate
    (``atlas_fast.engine.memory``) and the R the planner picks;
12. the paper at its real scale (``benchmarks/paper_scale.py`` within ``--paper-scale-budget`` seconds): Table III's
    units at every dataset's real C, batch, R and test-set size, and the whole table's predicted hours beside the
    official code's, with the pixel methods' targets (IVLP + MaPLe training <= 1.2 h, evaluation <= 0.5 h, Table
    III <= 6 h) and the cached methods' (CoOp + DePT + CoCoOp training <= 1.2 h);
13. beyond the paper (``benchmarks/beyond_methods.py``): TCP, CLIP-LoRA on the text tower and KDPL-CoOp/-CoCoOp, a
    training step from cached features vs the pixel path (decode, frozen towers, KDPL's ViT-H-14 teacher with random
    weights), at C = 50; check 7 covers their graph steps (Adam/AdamW and a per-step cosine included).

Sizes are chosen to finish in a few minutes on one GPU; ``--scale`` multiplies the dataset size. ``--device cpu
--model atlas-tiny --scale 0.1`` is a smoke test of this script itself on a machine without a GPU (no fp16/AMP rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from gpu_profile import RandomFeatures  # noqa: E402  (random cached features held on the device)
from sweep_speed import write_dataset  # noqa: E402  (the same synthetic OxfordPets-layout dataset)

ROWS: list[tuple[str, str, str, str]] = []
SETUP = {"device": "cuda", "model": "ViT-B-16"}


def row(check: str, status: str, value: str = "", note: str = "") -> None:
    ROWS.append((check, status, value, note))
    print(f"[{status}] {check}: {value} {note}", flush=True)


def guarded(check: str):
    """Run a check; a failure becomes a FAIL row with the error instead of stopping the script, and so does any
    graph_steps fallback warning the check did not catch itself (a run that trained eagerly where graphs should
    have replayed: counted as a failure, never as "ok")."""
    def wrap(function):
        def run(*args, **kwargs):
            import warnings

            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    return function(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - every failure must reach the table
                    traceback.print_exc()
                    row(check, "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
                        f"after {time.perf_counter() - start:.1f} s")
                    return None
                finally:
                    fallbacks = [str(w.message) for w in caught if "graph_steps" in str(w.message)]
                    for w in caught:
                        if "graph_steps" not in str(w.message):
                            print(f"warning: {w.message}", file=sys.stderr)
                    if fallbacks:
                        row(f"{check}: graph fallback", "FAIL", fallbacks[0][:200],
                            f"{len(fallbacks)} fallback warning(s): a graphed path trained eagerly")
        return run
    return wrap


TABLE3_FEATURES = 7.1e6  # Table III's cache: 7.1 M features of 186 k images (benchmarks/paper_scale.py)


@guarded("cache build (fp16 autocast)")
def check_cache(backbone, root: Path, dataset, photos: int = 600, views: int = 37) -> None:
    """The cache build at Table III's mean of 38 views per image, on 500 x 375 JPEGs (the decoding and view cutting
    of a real photo, which 32 x 32 images would understate): features/s of the build, of its encoding alone and of
    its view cutting alone (one process, divided by the workers the build starts), the time by stage, and the
    hours Table III's 7.1 M features would take at the build's rate; the build before this version (from git, where
    the checkout has its history) at the same size; fp16 autocast against fp32 on a few images (cosine)."""
    import numpy as np

    from atlas_fast.cache import FeatureCache
    from atlas_fast.cache.build import _batches, default_workers
    from atlas_fast.clip import transforms
    from cache_build import baseline, photos as write_photos

    device = torch.device(SETUP["device"])
    low = "fp16" if device.type == "cuda" else "bf16"
    items = write_photos(root / "photos", photos)
    spec, wanted = backbone.transform, list(range(views + 1))
    reports = {}
    for precision in (low, "fp32"):  # the features of both precisions agree
        cache = FeatureCache(root / f"cache-{precision}", storage_dtype="float32")
        reports[precision] = cache.build(backbone, dataset.name, dataset.train[:64], num_views=2, device=str(device),
                                         precision=precision, progress=False)  # also the warm-up
    pair = [FeatureCache(root / f"cache-{p}").load(backbone, dataset.name, dataset.train[:64], views=[0, 1, 2])
            for p in (low, "fp32")]
    cosine = torch.nn.functional.cosine_similarity(pair[0].flatten(0, 1), pair[1].flatten(0, 1), dim=-1).min()
    synchronize()
    report = FeatureCache(root / "cache-timed").build(backbone, "Photos", items, num_views=views, device=str(device),
                                                      precision=low, progress=False)
    rate = report.encoded / report.seconds
    sample = items[:8]  # view cutting alone, one process: what one worker does per view
    clock = time.perf_counter()
    for d in sample:
        transforms.load_view_pixels(d.impath, d.key, wanted, spec)
    cut = (time.perf_counter() - clock) / (len(sample) * len(wanted))
    workers = report.workers or default_workers(device)
    units = [(d, i, wanted) for i, d in enumerate(items[:32])]
    batches = [torch.from_numpy(np.concatenate([transforms.load_view_pixels(units[i][0].impath, units[i][0].key,
                                                                            wanted, spec) for i in batch]))
               for batch in _batches(units, 64)]
    synchronize()
    clock = time.perf_counter()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16 if low == "fp16" else torch.bfloat16):
        for pixels in batches:
            backbone.encode_image(transforms.normalize_pixels(pixels, spec, device))
    synchronize()
    encode = (time.perf_counter() - clock) / sum(len(b) for b in batches)
    old = baseline("f9ca88d")
    before = ""
    if old is not None:
        old_report = old[1].CacheBuilder(root / "cache-before").build(backbone, "Photos", items, num_views=views,
                                                                      device=str(device), precision=low,
                                                                      progress=False)
        before = (f"; the build before: {old_report.encoded / old_report.seconds:.0f} features/s "
                  f"({rate / (old_report.encoded / old_report.seconds):.2f}x now)")
    row(f"cache build ({low} autocast)", "ok" if cosine > 0.99 else "WARN",
        f"{rate:.0f} features/s ({report.encoded} features); encoding alone {1 / encode:.0f}/s, view cutting alone "
        f"{workers / cut:.0f}/s ({workers} workers x {1e3 * cut:.2f} ms/view){before}; Table III's 7.1 M features: "
        f"{TABLE3_FEATURES / rate / 3600:.2f} h",
        f"{len(items)} JPEGs 500x375 x {views + 1} views; by stage: encoding {report.encode_seconds:.1f} s, waiting "
        f"for views {report.input_wait_seconds:.1f} s, writing {report.write_seconds:.1f} s beside them in "
        f"{report.transactions} transactions, of {report.seconds:.1f} s; {low} vs fp32 feature cosine min "
        f"{cosine:.4f}")


@guarded("faiss on GPU")
def check_faiss() -> None:
    try:
        import faiss
    except ImportError:
        row("faiss on GPU", "n/a", "faiss not installed")
        return
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if gpus == 0:
        row("faiss on GPU", "n/a", f"faiss {faiss.__version__} has no GPU support (faiss-cpu)",
            "atlas_fast searches class similarities on the CPU (0.1 s at C = 1,000: docs/install.md)")
        return
    vectors = torch.nn.functional.normalize(torch.randn(1000, 512), dim=-1).numpy()
    cpu = faiss.IndexFlatIP(512)
    cpu.add(vectors)
    gpu = faiss.index_cpu_to_all_gpus(faiss.IndexFlatIP(512))
    gpu.add(vectors)
    start = time.perf_counter()
    d_gpu, i_gpu = gpu.search(vectors, 10)
    seconds = time.perf_counter() - start
    d_cpu, i_cpu = cpu.search(vectors, 10)
    same = float((i_gpu == i_cpu).mean())
    row("faiss on GPU", "ok" if same > 0.99 else "WARN", f"{gpus} GPU(s), 1000x1000 search {seconds * 1000:.1f} ms",
        f"top-10 ids equal to the CPU index: {100 * same:.1f}%")


def _config(root: Path, **changes):
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig

    base = dict(dataset="OxfordPets", data_root=root / "data", backbone=BackboneConfig(SETUP["model"], None),
                shots=8, epochs=6, device=SETUP["device"], cache_root=root / "cache", results_dir=root / "results",
                progress=False)
    return TrainConfig(**{**base, **changes})


@guarded("cached training with AMP")
def check_amp(root: Path) -> None:
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine import run

    common = dict(schedule=Alternating(2), soft_labels=soft_label_preset("base2new", "csl"))
    run(_config(root, precision="fp32", results_dir=root / "warmup", **common))  # builds the cache (not timed)
    if SETUP["device"] != "cuda":
        row("cached training with AMP", "n/a", "AMP needs a CUDA device")
        return
    first = run(_config(root, precision="amp", results_dir=root / "amp-first", **common))  # fp16 kernels, plans
    amp = run(_config(root, precision="amp", results_dir=root / "amp", **common))
    fp32 = run(_config(root, precision="fp32", results_dir=root / "fp32", **common))
    diff = max(abs(amp["metrics"][m] - fp32["metrics"][m]) for m in ("base", "new", "H"))
    finite = all(torch.isfinite(torch.tensor(e["loss"])) for e in amp["epochs"])
    row("cached training with AMP", "ok" if finite else "FAIL",
        f"{amp['timings']['seconds_per_epoch'] * 1000:.0f} ms/epoch AMP, "
        f"{fp32['timings']['seconds_per_epoch'] * 1000:.0f} ms/epoch fp32 (the process's first AMP run: "
        f"{first['timings']['seconds_per_epoch'] * 1000:.0f} ms/epoch)",
        f"{amp['data']['num_train']} train images, {amp['data']['num_classes']} classes; "
        f"AMP vs fp32 base/new/H differ by <= {diff:.2f} points")


def synchronize() -> None:
    if SETUP["device"] == "cuda":
        torch.cuda.synchronize()


@guarded("R-batched training")
def check_batched(root: Path, runs: int) -> None:
    from atlas_fast.sweep import Execution, paper_variants, grid_configs, run_configs

    seeds = list(range(1, max(1, runs // 4) + 1))
    configs = grid_configs(_config(root, precision="fp32"), ["OxfordPets"], paper_variants("base2new"), seeds)
    timings = {}
    records = {}
    for r in (1, len(configs)):
        folder = root / f"batched-R{r}"
        configs_r = [_config(root, **{**c.__dict__, "results_dir": folder}) for c in configs]
        synchronize()
        start = time.perf_counter()
        records[r] = run_configs(configs_r, Execution("local", r), progress=False)
        synchronize()
        timings[r] = time.perf_counter() - start
    diff = max(abs(a["metrics"][m] - b["metrics"][m]) for a, b in zip(records[1], records[len(configs)])
               for m in ("base", "new", "H"))
    r = len(configs)
    row("R-batched training", "ok" if diff < 1e-3 else "FAIL",
        f"R={r}: {timings[1]:.1f} s one by one, {timings[r]:.1f} s batched ({timings[1] / timings[r]:.2f}x)",
        f"{3600 * r / timings[r]:.0f} runs/hour batched; largest metric difference {diff:.2e}")


@guarded("pixel-path method")
def check_pixels(root: Path) -> None:
    from atlas_fast.methods import METHODS
    from atlas_fast.engine import run

    pixel = sorted(name for name, entry in METHODS.items() if entry.reads_pixels)
    if not pixel:
        row("pixel-path method", "n/a", "no pixel-path method in this version")
        return
    # the first of the paper's pixel methods, as before the methods beyond it came (they have a row of their own)
    # (CoPrompt, a method beyond it too, also needs a descriptions file)
    name = next((n for n in pixel if not n.startswith(("clip-lora", "kdpl-", "coprompt"))), pixel[0])
    # a smoke test's small model (2 blocks per tower) gets prompts 2 blocks deep; ViT-B/16 keeps the recipe's depth
    options = {option: 2 for option in METHODS[name].depth_options} if SETUP["model"] == "atlas-tiny" else None
    record = run(_config(root, method=name, epochs=2, results_dir=root / f"pixels-{name}", method_options=options))
    row("pixel-path method", "ok", f"{name}: {record['timings']['seconds_per_epoch']:.1f} s/epoch",
        f"default precision ({'AMP' if SETUP['device'] == 'cuda' else 'fp32'}), 2 epochs; "
        f"base {record['metrics'].get('base', float('nan')):.1f}")


@guarded("step speed")
def check_step_speed() -> None:
    import step_speed

    rows = step_speed.measure(["--device", SETUP["device"], "--model", SETUP["model"], "--classes", "19", "500",
                               "--repeats", "3"])
    if rows is None:
        row("step speed", "n/a", "no device")
        return
    speedups = [f"{row_name.split(' (')[0]} {variant}: {ratio:.2f}x" for row_name, variant, _, ratio in rows
                if ratio is not None and variant != "shared prefix"]
    row("step speed", "ok", "; ".join(speedups), "vs open_clip's blocks over every prompt"
        + (" (fp16 autocast)" if SETUP["device"] == "cuda" else " (fp32)"))


def _train_cached(name: str, backbone, classnames, features, labels, epochs: int, graph_steps: bool,
                  runs: int = 1, groups: bool = False, batch: int = 32):
    """``runs`` cached runs of method ``name`` as one group (batch 32, fp16 AMP on a GPU, seeded init and orders)
    through the loop; ``groups``: run the eager steps with a graph's length groups, as a graphed run does. Returns
    (method, logs, seconds, fallback warnings)."""
    import contextlib
    import warnings

    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.clip.text_encoder import graph_length_groups
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.engine.step import RunState
    from atlas_fast.methods.config import OptimRecipe
    from atlas_fast.methods.registry import method_class

    from atlas_fast.engine.group import stacked_method

    device = torch.device(SETUP["device"])
    entry = method_class(name)
    singles = []
    for r in range(runs):  # run r starts as it would alone (initialised with seed r), as a group's runs do
        torch.manual_seed(r)
        singles.append(entry.build(backbone, classnames, cached_method_config(name, backbone)))
    method = singles[0].to(device) if runs == 1 else stacked_method(
        entry, backbone, classnames, cached_method_config(name, backbone), [s.state_for_checkpoint() for s in singles],
        device)
    states = [RunState(RandomFeatures(features), labels, None, OneHot(), seed=seed, device=device)
              for seed in range(1, runs + 1)]
    recipe = OptimRecipe(epochs=epochs, batch_size=batch, lr=0.002)
    _, own = entry.recipe_function("paper", "base2new", 16, "ImageNet")
    if own.optimizer != "sgd":  # its own optimiser (Adam, AdamW) and a cosine over the steps, as its recipe has them
        recipe = dataclasses.replace(own, epochs=epochs, batch_size=batch, warmup_epochs=0,
                                     iterations=epochs * -(-len(labels) // batch))
    with warnings.catch_warnings(record=True) as caught, \
            graph_length_groups() if groups else contextlib.nullcontext():
        warnings.simplefilter("always")
        synchronize()
        start = time.perf_counter()
        logs = train_runs(TrainingRuns(method, states), recipe, device, amp=device.type == "cuda", progress=False,
                          graph_steps=graph_steps)
        synchronize()
        seconds = time.perf_counter() - start
    fallbacks = [str(w.message) for w in caught if "graph_steps" in str(w.message)]
    return method, logs, seconds, fallbacks


def _largest_difference(a: torch.nn.Module, b: torch.nn.Module, run: int | None = None) -> float:
    """The largest difference of the learned tensors (of ``b``'s run ``run`` against ``a``, a one-run method)."""
    pairs = zip(a.trainable_parameters(), b.trainable_parameters())
    return max((p.detach().float() - (q.detach()[run:run + 1] if run is not None else q.detach()).float()).abs().max()
               .item() for p, q in pairs)


def cached_method_config(name: str, backbone):
    """A cached method's paper base-to-new config, its depths cut to the backbone's towers; a
    method with a teacher (KDPL) gets the backbone's architecture with random weights as its teacher (nothing is
    downloaded)."""
    from atlas_fast.pricing.units import method_config_for

    config = method_config_for(name, None, backbone)
    if hasattr(config, "teacher"):
        config = dataclasses.replace(config, teacher=SETUP["model"], teacher_pretrained="none")
    return config


def feature_width(name: str, backbone) -> int:
    """The width of a cached method's training features: the backbone's, and its teacher's appended (KDPL)."""
    from atlas_fast.methods.registry import method_class

    teacher = method_class(name).view_teacher(cached_method_config(name, backbone), backbone)
    return backbone.embed_dim + (teacher.embed_dim if teacher is not None else 0)

@guarded("graph steps")
def check_graph_steps(backbone, steps_per_epoch: int = 10, short: int = 2, long: int = 6) -> None:
    """Eager vs graphed steps of every cached method: ms per step in steady state (the time of ``long`` epochs minus
    that of ``short`` ones, so warm-up steps and captures cancel), the largest difference of the learned tensors
    after the same ``long`` epochs against the same steps run eagerly with the graph's length groups (0: a replay
    runs the eager step's kernels) and against the default eager run (one padded group: fp16 rounding apart)."""
    cuda = SETUP["device"] == "cuda"  # on the CPU (a smoke test of this check) both runs are eager
    from atlas_fast.methods import METHODS

    cached = [name for name, entry in METHODS.items() if entry.learns and not entry.reads_pixels]
    cases = [("coop", c) for c in ((10, 50, 500) if cuda else (10,))] + \
        [(name, 50 if cuda else 10) for name in cached if name != "coop"]
    generator = torch.Generator().manual_seed(0)
    results, notes, worst, padded_worst, fast_enough = [], [], 0.0, 0.0, True
    for name, classes in cases:
        classnames = [f"class {i}" for i in range(classes)]
        n = 32 * steps_per_epoch  # every batch full-size: every step after the warm-up can replay
        features = torch.randn(n, feature_width(name, backbone), generator=generator).to(SETUP["device"])
        labels = torch.randint(classes, (n,), generator=generator)
        _train_cached(name, backbone, classnames, features, labels, 1, False)  # warm-up (kernels, cuBLAS)
        timed = {}
        for graphed in (False, True) if cuda else (False,):
            times = {}
            for epochs in (short, long):
                method, logs, times[epochs], fallbacks = _train_cached(name, backbone, classnames, features, labels,
                                                                       epochs, graphed)
            timed[graphed] = (method, 1000 * (times[long] - times[short]) / ((long - short) * steps_per_epoch),
                              sum(e.get("graphed_steps", 0) for e in logs[0]))
            if fallbacks and len(notes) < 3:
                notes.append(f"{name} fell back to eager: " + fallbacks[0][:160])
        eager_ms = timed[False][1]
        if cuda:
            graphed_method, graphed_ms, replayed = timed[True]
            same_path, *_ = _train_cached(name, backbone, classnames, features, labels, long, False, groups=True)
            diff = _largest_difference(same_path, graphed_method)
            padded = _largest_difference(timed[False][0], graphed_method)
            worst, padded_worst = max(worst, diff), max(padded_worst, padded)
            results.append(f"{name} C={classes}: {eager_ms:.2f} ms eager, {graphed_ms:.2f} ms graphed "
                           f"({eager_ms / graphed_ms:.2f}x, {replayed}/{long * steps_per_epoch} replayed, "
                           f"diff {diff:.1e}, vs padded eager {padded:.1e})")
            if name == "coop" and classes == 50:
                fast_enough = graphed_ms <= 5.0
        else:
            results.append(f"{name} C={classes}: {eager_ms:.2f} ms eager")
    status = ("ok" if worst == 0.0 else "FAIL") if cuda else "n/a"
    row("graph steps", status, "; ".join(results),
        f"cached methods, batch 32, fp16 AMP, steady-state ms/step ({long} minus {short} epochs of "
        f"{steps_per_epoch} steps), the whole step graphed; largest learned-tensor difference graphed vs eager "
        f"with the graph's length groups {worst:.2e} (must be 0), vs the default padded eager run "
        f"{padded_worst:.2e} (fp16 rounding); target <= 5 ms for CoOp at C=50: "
        f"{'met' if fast_enough else 'NOT met'}"
        + ("; " + "; ".join(notes) if notes else "") if cuda else "CPU smoke test: eager only")


@guarded("batched graph steps")
def check_batched_graph_steps(backbone, runs: int = 4, classes: int = 50, epochs: int = 4) -> None:
    """R runs of each cached method as one graphed group (length groups, the whole step on the device, a scaler per
    run) against the same group eager with the graph's length groups (must be 0) and against each run trained
    alone eagerly (fp16 rounding)."""
    cuda = SETUP["device"] == "cuda"
    from atlas_fast.engine.group import batches_runs
    from atlas_fast.methods import METHODS

    cached = [name for name, entry in METHODS.items() if entry.learns and not entry.reads_pixels
              and batches_runs(entry)]
    generator = torch.Generator().manual_seed(1)
    classnames = [f"class {i}" for i in range(classes)]
    n = 32 * 8
    features = torch.randn(n, backbone.embed_dim, generator=generator).to(SETUP["device"])
    labels = torch.randint(classes, (n,), generator=generator)
    results, worst, alone_worst = [], 0.0, 0.0
    for name in cached:
        group, logs, _, _ = _train_cached(name, backbone, classnames, features, labels, epochs, cuda, runs=runs)
        eager, *_ = _train_cached(name, backbone, classnames, features, labels, epochs, False, runs=runs, groups=True)
        single, *_ = _train_cached(name, backbone, classnames, features, labels, epochs, False)  # run 1 (seed 1)
        diff, alone = _largest_difference(eager, group), _largest_difference(single, group, run=0)
        worst, alone_worst = max(worst, diff), max(alone_worst, alone)
        replayed = sum(e.get("graphed_steps", 0) for e in logs[0])
        results.append(f"{name}: diff {diff:.1e}, run 1 vs alone {alone:.1e}, {replayed} replayed")
    status = ("ok" if worst == 0.0 else "FAIL") if cuda else "n/a"
    row("batched graph steps", status, "; ".join(results),
        f"R = {runs} runs (seeds 1-{runs}) of each cached method, C = {classes}, {epochs} epochs, fp16 AMP; graphed "
        f"group vs the eager group with the graph's length groups (must be 0): {worst:.1e}; run 1 vs it alone "
        f"(eager, padded): {alone_worst:.1e}" if cuda else "CPU smoke test: eager only")


@guarded("host syncs per graphed step")
def check_graphed_syncs(backbone, classes: int = 50) -> None:
    """CUDA's sync debug mode over whole trainings of 3 epochs of 10 and of 20 graphed steps (R = 4 CoOp, AMP): the
    difference over the 30 extra steps is the host synchronisations per graphed step (target 0)."""
    if SETUP["device"] != "cuda":
        row("host syncs per graphed step", "n/a", "needs CUDA's sync debug mode")
        return
    from atlas_fast.engine.graphs import host_syncs

    classnames = [f"class {i}" for i in range(classes)]
    generator = torch.Generator().manual_seed(2)
    counts = {}
    for steps in (10, 20):
        features = torch.randn(32 * steps, backbone.embed_dim, generator=generator).to(SETUP["device"])
        labels = torch.randint(classes, (32 * steps,), generator=generator)
        _, syncs = host_syncs(lambda: _train_cached("coop", backbone, classnames, features, labels, 3, True, runs=4))
        counts[steps] = len(syncs)
    per_step = (counts[20] - counts[10]) / 30
    row("host syncs per graphed step", "ok" if per_step == 0 else "FAIL", f"{per_step:.2f} per step",
        f"sync debug mode: {counts[10]} syncs in 3 epochs of 10 steps, {counts[20]} in 3 of 20 (R = 4 CoOp, C = "
        f"{classes}, AMP; the epoch's loss read-back and finiteness check are per epoch)")


@guarded("length groups in graphed steps")
def check_graph_groups(backbone, runs: int = 12, classes: int = 500, steps: int = 8) -> None:
    """A graphed step with the class suffixes in length groups against one padded group, at ImageNet's base classes
    (their real names) and R = 12: CoOp (batch 32), CoCoOp (batch 1), DePT (batch 4); steady-state ms per step."""
    if SETUP["device"] != "cuda":
        row("length groups in graphed steps", "n/a", "needs CUDA graphs")
        return
    from atlas_fast.clip import text_encoder
    from atlas_fast.world.standin_plan import real_classes

    names = [name for _, name in real_classes("ImageNet")][:classes]
    generator = torch.Generator().manual_seed(3)
    results = []
    for name, batch in (("coop", 32), ("cocoop", 1), ("dept-coop", 4)):
        n = batch * steps
        features = torch.randn(n, backbone.embed_dim, generator=generator).to(SETUP["device"])
        labels = torch.randint(classes, (n,), generator=generator)
        timed = {}
        for row_name, cost in (("groups", text_encoder.GRAPHED_GROUP_COST), ("padded", 1e12)):
            saved, text_encoder.GRAPHED_GROUP_COST = text_encoder.GRAPHED_GROUP_COST, cost
            try:
                seconds = [_train_cached(name, backbone, names, features, labels, epochs, True, runs=runs,
                                         batch=batch)[2] for epochs in (2, 4)]
            finally:
                text_encoder.GRAPHED_GROUP_COST = saved
            timed[row_name] = 1000 * (seconds[1] - seconds[0]) / (2 * steps)
        results.append(f"{name}: {timed['padded']:.1f} ms padded, {timed['groups']:.1f} ms in groups "
                       f"({timed['padded'] / timed['groups']:.2f}x)")
    row("length groups in graphed steps", "ok", "; ".join(results),
        f"ImageNet's first {classes} class names, R = {runs}, fp16 AMP, steady-state ms per graphed step "
        f"(GRAPHED_GROUP_COST = {text_encoder.GRAPHED_GROUP_COST:g} positions per extra group)")


@guarded("beyond the paper: cached vs pixel")
def check_beyond_methods(teacher: str) -> None:
    """TCP, CLIP-LoRA (text tower) and KDPL-CoOp/-CoCoOp: a training step from cached features vs the pixel path
    (``benchmarks/beyond_methods.py``; KDPL's teacher ``teacher`` with random weights), ms per step and the ratio."""
    import contextlib
    import io

    import beyond_methods

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = beyond_methods.main(["--device", SETUP["device"], "--model", SETUP["model"], "--teacher", teacher,
                                      "--classes", "50", "--steps", "3"])
    print(out.getvalue(), flush=True)
    cells = [line.split(" | ") for line in out.getvalue().splitlines() if line.startswith("| ") and "---" not in line]
    ratios = [f"{c[0].lstrip('| ')} {c[3]} vs {c[4]} ms ({c[5]})" for c in cells[1:]]
    row("beyond the paper: cached vs pixel", "ok" if status == 0 else "FAIL", "; ".join(ratios),
        f"C=50, recipe batch sizes, teacher {teacher} (random weights); pixel = decode + frozen towers + loss")


def _phases(records: list[dict], seconds: float) -> str:
    """Where a sweep's wall time went, from its records' timings (a group's training counted once)."""
    train = sum(r["timings"]["train"] / r["timings"]["batch_runs"] for r in records)
    parts = {name: sum(r["timings"][name] for r in records) for name in ("plan", "inputs", "evaluate")}
    parts["train"] = train
    parts["other"] = seconds - sum(parts.values())
    return " ".join(f"{name} {value:.1f}" for name, value in parts.items())


@guarded("runs/hour by R")
def check_runs_per_hour(root: Path) -> None:
    from atlas_fast.sweep import DEFAULT_BATCH_RUNS, Execution, paper_variants, grid_configs, run_configs

    configs = grid_configs(_config(root), ["OxfordPets"], paper_variants("base2new"), [1, 2, 3])
    cuda = SETUP["device"] == "cuda"
    cases = [("R = 1 eager", 1, False)] if cuda else []
    cases += [(f"R = {r}", r, None) for r in (1, 4, 12)]  # None: graph steps wherever they apply (the default)
    rates, phases = {}, []
    for row_name, r, graphs in cases:
        folder = root / f"per-hour-{row_name.replace(' ', '')}"
        configs_r = [_config(root, **{**c.__dict__, "results_dir": folder, "graph_steps": graphs})
                     for c in configs]
        synchronize()
        start = time.perf_counter()
        records = run_configs(configs_r, Execution("local", r), progress=False)
        synchronize()
        seconds = time.perf_counter() - start
        rates[row_name] = 3600 * len(configs) / seconds
        phases.append(f"{row_name}: {_phases(records, seconds)}")
    base = next(iter(rates.values()))
    row("runs/hour by R", "ok", ", ".join(f"{row_name}: {rate:.0f} runs/hour ({rate / base:.2f}x)"
                                          for row_name, rate in rates.items()),
        f"{len(configs)} cached CoOp runs (CoOp + ATLaS/-CSL/-ISL x 3 seeds, {configs[0].epochs} epochs), default "
        f"precision ({'AMP' if cuda else 'fp32'}), graph steps by default; the GPU's default R is "
        f"{DEFAULT_BATCH_RUNS['cuda']}; seconds by phase: " + "; ".join(phases))


@guarded("demo")
def check_demo(root: Path) -> None:
    from atlas_fast.app.demo import DemoConfig, run_demo

    config = DemoConfig(data_root=root / "world", cache_root=root / "world-cache", results_dir=root / "demo",
                        device=SETUP["device"], plot=root / "demo" / "table3.png")
    synchronize()
    start = time.perf_counter()
    report = run_demo(config, progress=False)
    seconds = time.perf_counter() - start
    print(report, flush=True)
    row("demo", "ok" if "nan" not in report.lower() else "WARN", f"{seconds:.0f} s wall time",
        "atlas-fast demo from nothing: world generated, cache built, 12 runs (CoOp + 3 ATLaS variants x 3 seeds)")


def _pixel_inputs(backbone, entry, items: int):
    """Random pixels (and frozen features, PromptSRC) of ``items`` training images on the device, as a run's
    training inputs (the same every epoch)."""
    from atlas_fast.pricing.units import _SyntheticInputs, _training_inputs

    return _SyntheticInputs(_training_inputs(entry, backbone, items, torch.device(SETUP["device"])))


def _train_pixels(name: str, backbone, classnames, runs: int, steps: int, epochs: int, graph_steps: bool):
    """A group of ``runs`` runs of pixel method ``name`` (batch 4, the paper recipe's prompts at the model's depth,
    fp16 AMP on a GPU) through the loop; returns (method, logs, seconds, fallback warnings)."""
    import warnings

    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.clip.text_encoder import graph_length_groups
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.engine.step import RunState
    from atlas_fast.methods.config import OptimRecipe
    from atlas_fast.methods.registry import method_class
    from atlas_fast.pricing.units import method_config_for

    device = torch.device(SETUP["device"])
    entry = method_class(name)
    torch.manual_seed(0)
    method = entry.build(backbone, classnames, method_config_for(name, None, backbone), runs).to(device)
    inputs = _pixel_inputs(backbone, entry, 4 * steps)
    labels = torch.arange(4 * steps) % len(classnames)
    states = [RunState(inputs, labels, None, OneHot(), seed=r, device=device) for r in range(runs)]
    # eager steps with the length groups a graphed run's steps use, so that graph and eager run the same kernels
    with warnings.catch_warnings(record=True) as caught, graph_length_groups():
        warnings.simplefilter("always")
        synchronize()
        start = time.perf_counter()
        logs = train_runs(TrainingRuns(method, states), OptimRecipe(epochs=epochs, batch_size=4, lr=0.002), device,
                          amp=device.type == "cuda", progress=False, graph_steps=graph_steps)
        synchronize()
        seconds = time.perf_counter() - start
    return method, logs[0], seconds, [str(w.message) for w in caught if "graph_steps" in str(w.message)]


@guarded("pixel steps, graph vs eager")
def check_pixel_graphs(backbone, runs: int = 4, steps: int = 6, short: int = 2, long: int = 4) -> None:
    """Eager vs graphed steps of every pixel method as a group of ``runs`` runs: ms per step in steady state (the
    time of ``long`` epochs minus that of ``short`` ones) and the largest difference of the learned tensors after
    the same ``long`` epochs (0: a graph replays the eager kernels)."""
    cuda = SETUP["device"] == "cuda"
    classnames = [f"class {i}" for i in range(10)]
    results, notes, worst = [], [], 0.0
    for name in ("ivlp", "maple", "promptsrc", "dept-maple"):
        _train_pixels(name, backbone, classnames, runs, steps, 1, False)  # warm-up (kernels, cuBLAS)
        timed = {}
        for graphed in (False, True) if cuda else (False,):
            times = {}
            for epochs in (short, long):
                method, logs, times[epochs], fallbacks = _train_pixels(name, backbone, classnames, runs, steps,
                                                                       epochs, graphed)
            timed[graphed] = (method, 1000 * (times[long] - times[short]) / ((long - short) * steps),
                              sum(e.get("graphed_steps", 0) for e in logs))
            if fallbacks and len(notes) < 3:
                notes.append(f"{name} fell back to eager: " + fallbacks[0][:160])
        if cuda:
            diff = _largest_difference(timed[False][0], timed[True][0])
            worst = max(worst, diff)
            results.append(f"{name} R={runs}: {timed[False][1]:.1f} ms eager, {timed[True][1]:.1f} ms graphed "
                           f"({timed[False][1] / timed[True][1]:.2f}x, {timed[True][2]}/{long * steps} replayed, "
                           f"diff {diff:.1e})")
        else:
            results.append(f"{name} R={runs}: {timed[False][1]:.1f} ms eager")
    row("pixel steps, graph vs eager", ("ok" if worst == 0.0 and not notes else "FAIL") if cuda else "n/a",
        "; ".join(results), (f"batch 4 per run, C = 10, fp16 AMP, steady-state ms/step ({long} minus {short} "
                             f"epochs of {steps} steps); largest learned-tensor difference {worst:.2e}"
                             + ("; " + "; ".join(notes) if notes else "")) if cuda else "CPU smoke test: eager only")


@guarded("largest pixel group's memory")
def check_pixel_memory(backbone) -> None:
    """Peak device memory of the steps of the largest pixel groups (R = 12 at ImageNet's class counts) beside the
    planner's estimate, and the R the planner picks for them on this device."""
    from atlas_fast.cache.space import human_bytes
    from atlas_fast.engine import memory
    from atlas_fast.methods.registry import method_class
    from atlas_fast.pricing.units import measure_step, method_config_for

    cuda = SETUP["device"] == "cuda"
    runs = 12 if cuda else 2
    cases = ([("maple", "cross_dataset", 1000), ("ivlp", "base2new", 500), ("coprompt", "base2new", 1000)] if cuda
             else [("maple", "base2new", 10), ("coprompt", "base2new", 10)])
    device = torch.device(SETUP["device"])
    total = memory.device_bytes(device)
    results = []
    for name, setting, classes in cases:
        entry = method_class(name)
        config, recipe = entry.recipe_function("paper", setting, 16, "ImageNet")
        config = method_config_for(name, config, backbone)
        if name == "coprompt":  # its class descriptions: two per class (ImageNet's file has 50; K x C x D fp32 once)
            path = Path(tempfile.mkdtemp()) / "descriptions.json"
            path.write_text(json.dumps({f"class {i}": [f"a photo of class {i}.", f"class {i}, a kind of thing."]
                                        for i in range(classes)}))
            config = dataclasses.replace(config, descriptions=str(path))
        per_run = memory.step_bytes_per_run(entry, backbone, classes, recipe.batch_size, cuda)
        fixed = memory.frozen_bytes(backbone, cuda)
        planned = memory.runs_that_fit(runs, per_run, fixed, total)
        unit = measure_step(backbone, name, [f"class {i}" for i in range(classes)], recipe.batch_size, runs,
                            config=config, amp=cuda, steps=1)
        measured = unit.peak_device_bytes if cuda else unit.peak_host_bytes
        results.append(f"{name} C={classes} R={runs}: peak {human_bytes(measured)} measured, "
                       f"{human_bytes(fixed + runs * per_run)} estimated; planner's R {planned}; "
                       f"{1000 * unit.seconds:.0f} ms/step")
    row("largest pixel group's memory", "ok", "; ".join(results),
        f"batch 4 per run, {'fp16 AMP' if cuda else 'fp32'}; device memory {human_bytes(total or 0)}"
        + ("" if cuda else " (CPU smoke test: host RSS, tiny model)"))


@guarded("paper scale (Table III priced)")
def check_paper_scale(budget_s: int) -> None:
    import paper_scale

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "paper_scale.json"
        paper_scale.main(["--device", SETUP["device"], "--model", SETUP["model"], "--budget-s", str(budget_s),
                          "--out", str(out)])
        result = json.loads(out.read_text())["result"]
    if not result.get("runs_priced"):
        row("paper scale (Table III priced)", "WARN", "no run priced", f"budget {budget_s} s ran out first")
        return
    official = result.get("official_seconds")
    row("paper scale (Table III priced)", "ok" if result["runs_priced"] == result["runs"] else "WARN",
        f"{result['table3_seconds'] / 3600:.1f} h for {result['runs_priced']} of {result['runs']} runs"
        + (f" (official code {official / 3600:.0f} h)" if official else ""),
        f"peak device memory {result['peak_device_bytes'] / 2**30:.1f} GiB; units measured within {budget_s} s")
    by_method = result.get("by_method", {})
    pixel_training = sum(by_method.get(m, {}).get("training_seconds", 0.0) for m in ("ivlp", "maple"))
    targets = [("IVLP + MaPLe training", pixel_training, 1.2), ("evaluation", result["phases"]["evaluation"], 0.5),
               ("Table III", result["table3_seconds"], 6.0)]
    complete = result["runs_priced"] == result["runs"]

    def judged(met: bool) -> str:  # the targets are one GPU's hours: a CPU smoke test prices the CPU, judges nothing
        return "n/a" if SETUP["device"] != "cuda" else ("ok" if met else "FAIL") if complete else "WARN"

    row("paper scale, pixel targets", judged(all(v / 3600 <= t for _, v, t in targets)),
        "; ".join(f"{row_name} {value / 3600:.2f} h (target <= {target} h)" for row_name, value, target in targets),
        "; ".join(f"{m}: training {v['training_seconds'] / 3600:.2f} h, evaluation "
                  f"{v['evaluation_seconds'] / 3600:.2f} h, R {v['runs_per_group']}" for m, v in by_method.items())
        + ("" if complete else "; a partial table: the budget ran out"))
    cached = [m for m in ("coop", "dept-coop", "cocoop") if m in by_method]
    cached_training = sum(by_method[m]["training_seconds"] for m in cached)
    row("paper scale, cached targets", judged(cached_training / 3600 <= 1.2),
        f"{' + '.join(cached)} training {cached_training / 3600:.2f} h (target <= 1.2 h)",
        "the whole step graphed, class suffixes in length groups, every cached method in groups of R"
        + ("" if complete else "; a partial table: the budget ran out"))


# ------------------------------------------------------------------------------------------- first contact
# Every hazard of a real GPU's first run (issue 43), each a row; any graph_steps fallback is a FAIL (guarded()).

def _graph_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "graph_steps" in str(w.message)]


def _replayed(records) -> int:
    return sum(e.get("graphed_steps", 0) for r in records for e in r.get("epochs", []))


def _logged_fallbacks(records) -> list[str]:
    """The fallbacks the records' epoch logs name (``graph_fallback``), beside the warnings."""
    return [e["graph_fallback"] for r in records for e in r.get("epochs", []) if e.get("graph_fallback")]


def _judged(cuda: bool, good: bool) -> str:
    """ok/FAIL on a GPU; on a CPU (a smoke test of the script) the path ran eagerly: n/a."""
    return ("ok" if good else "FAIL") if cuda else "n/a"


@guarded("first contact: pixel group through the loader")
def check_loader_group(root: Path, workers: int = 2) -> None:
    """IVLP, 4 runs as one group (2 seeds x plain/LS) through the real pipeline: the pixel loader with ``workers``
    decoding processes and pinned memory (CUDA) keeps decoding while the first graphs are captured (3 epochs,
    graphs by default, AMP). No fallback, steps replayed in every epoch after the first warm-ups, finite metrics."""
    import warnings

    from atlas_fast.atlas.schedules import Alternating, OneHot
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.methods import METHODS
    from atlas_fast.sweep import Execution, run_configs

    cuda = SETUP["device"] == "cuda"
    options = {option: 2 for option in METHODS["ivlp"].depth_options} if SETUP["model"] == "atlas-tiny" else None
    configs = [_config(root, method="ivlp", seed=seed, epochs=3, batch_size=4, workers=workers,
                       results_dir=root / "fc-loader", method_options=options, schedule=schedule, soft_labels=soft)
               for seed in (1, 2) for schedule, soft in ((OneHot(), None), (Alternating(2), soft_label_preset("base2new", "ls")))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        records = run_configs(configs, Execution("local", 4), progress=False)
        seconds = time.perf_counter() - start
    fallbacks = _graph_warnings(caught) + _logged_fallbacks(records)
    replayed = _replayed(records)
    finite = all(torch.isfinite(torch.tensor(r["metrics"]["base"])) for r in records)
    row("first contact: pixel group through the loader", _judged(cuda, not fallbacks and replayed > 0 and finite),
        f"IVLP R = {records[0]['timings']['batch_runs']}, {workers} decoding workers"
        f"{', pinned memory' if cuda else ''}: {replayed} steps replayed, {seconds:.1f} s",
        ("fell back: " + fallbacks[0][:200]) if fallbacks else "3 epochs, graphs by default, finite metrics"
        if cuda else "CPU smoke test: eager")


@guarded("first contact: CLIP-LoRA graphed")
def check_clip_lora_graphs(backbone, steps: int = 6) -> None:
    """CLIP-LoRA on the text tower (AdamW, a cosine over optimiser steps): graphed against eager with the graph's
    length groups, bit for bit, every step after the warm-ups replayed (it once uploaded its logit scale every
    step, so its graphs were refused)."""
    cuda = SETUP["device"] == "cuda"
    classnames = [f"class {i}" for i in range(10)]
    generator = torch.Generator().manual_seed(4)
    features = torch.randn(32 * steps, feature_width("clip-lora-text", backbone), generator=generator)
    features = features.to(SETUP["device"])
    labels = torch.randint(10, (32 * steps,), generator=generator)
    eager, *_ = _train_cached("clip-lora-text", backbone, classnames, features, labels, 2, False, groups=True)
    if not cuda:
        row("first contact: CLIP-LoRA graphed", "n/a", "eager only", "CPU smoke test: eager")
        return
    graphed, logs, _, fallbacks = _train_cached("clip-lora-text", backbone, classnames, features, labels, 2, True)
    diff = _largest_difference(eager, graphed)
    replayed = sum(e.get("graphed_steps", 0) for e in logs[0])
    row("first contact: CLIP-LoRA graphed", _judged(cuda, diff == 0.0 and replayed > 0 and not fallbacks),
        f"diff {diff:.1e}, {replayed}/{2 * steps} replayed",
        ("fell back: " + fallbacks[0][:200]) if fallbacks else "must be 0, no fallback")


@guarded("first contact: PromptSRC, unequal runs")
def check_promptsrc_unequal(backbone, steps: int = 5) -> None:
    """Three PromptSRC runs of unequal training sets as one group (one sits out the last steps, one ends on a
    partial batch: keys with sit-outs, whose masks once uploaded the run sizes from the host): graphed against the
    same group eager with the graph's length groups, bit for bit, no fallback."""
    import warnings

    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.clip.text_encoder import graph_length_groups
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.engine.step import RunState
    from atlas_fast.methods.config import OptimRecipe
    from atlas_fast.methods.registry import method_class
    from atlas_fast.pricing.units import _SyntheticInputs, _training_inputs, method_config_for

    cuda = SETUP["device"] == "cuda"
    device = torch.device(SETUP["device"])
    entry = method_class("promptsrc")
    classnames = [f"class {i}" for i in range(10)]
    sizes = (4 * steps, 4 * steps - 8, 4 * steps - 2)

    def trained(graph_steps: bool):
        torch.manual_seed(0)
        method = entry.build(backbone, classnames, method_config_for("promptsrc", None, backbone), len(sizes))
        method = method.to(device)
        states = []
        for r, n in enumerate(sizes):
            inputs = _SyntheticInputs(_training_inputs(entry, backbone, n, device))
            states.append(RunState(inputs, torch.arange(n) % 10, None, OneHot(), seed=r + 1, device=device))
        with warnings.catch_warnings(record=True) as caught, graph_length_groups():
            warnings.simplefilter("always")
            logs = train_runs(TrainingRuns(method, states), OptimRecipe(epochs=3, batch_size=4, lr=0.002), device,
                              amp=cuda, progress=False, graph_steps=graph_steps)
        return method, logs, _graph_warnings(caught)

    eager, _, _ = trained(False)
    if not cuda:
        row("first contact: PromptSRC, unequal runs", "n/a", f"runs of {sizes} images, eager only",
            "CPU smoke test: eager")
        return
    graphed, logs, fallbacks = trained(True)
    diff = _largest_difference(eager, graphed)
    replayed = sum(e.get("graphed_steps", 0) for e in logs[0])
    row("first contact: PromptSRC, unequal runs", _judged(cuda, diff == 0.0 and replayed > 0 and not fallbacks),
        f"runs of {sizes} images, batch 4: diff {diff:.1e}, {replayed} steps replayed",
        ("fell back: " + fallbacks[0][:200]) if fallbacks else "sit-outs and a partial batch; must be 0")


@guarded("first contact: per-epoch evaluation under graphs")
def check_epoch_evaluation(root: Path) -> None:
    """CoOp, 2 runs as one group, evaluated after every epoch (each evaluation rebuilds the class buffers the graphs
    read): graphed against eager, both with the graph's length groups, every epoch's metrics equal and the graphs
    captured again after each evaluation (steps replayed in every epoch)."""
    import warnings

    from atlas_fast.clip.text_encoder import graph_length_groups
    from atlas_fast.sweep import Execution, run_configs

    cuda = SETUP["device"] == "cuda"
    results = {}
    for graphs in ((None, False) if cuda else (False,)):
        configs = [_config(root, seed=seed, epochs=4, eval_every_epoch=True, graph_steps=graphs,
                           results_dir=root / f"fc-epochs-{graphs}") for seed in (1, 2)]
        with warnings.catch_warnings(record=True) as caught, graph_length_groups():
            warnings.simplefilter("always")
            records = run_configs(configs, Execution("local", 2), progress=False)
        results[graphs] = (records, _graph_warnings(caught) + _logged_fallbacks(records))
    if not cuda:
        row("first contact: per-epoch evaluation under graphs", "n/a", "eager only", "CPU smoke test: eager")
        return
    (graphed, fallbacks), (eager, _) = results[None], results[False]

    def per_epoch(records):
        return [[(e["loss"], e.get("accuracy")) for e in r["epochs"]] for r in records]

    same = per_epoch(graphed) == per_epoch(eager)
    later = [e.get("graphed_steps", 0) for r in graphed for e in r["epochs"][1:]]
    row("first contact: per-epoch evaluation under graphs",
        _judged(cuda, same and not fallbacks and all(n > 0 for n in later)),
        f"every epoch's loss and accuracies equal to eager: {same}; steps replayed per epoch after the first: "
        f"{later}", ("fell back: " + fallbacks[0][:200]) if fallbacks else
        "class buffers rebuilt by each evaluation; graphs captured again")


@guarded("first contact: injected overflow vs torch's GradScaler")
def check_overflow(runs: int = 3, steps: int = 6) -> None:
    """atlas_fast's optimiser (SGD and a scaler per run, device arithmetic) on the device, eagerly and replayed from a
    CUDA graph, against torch's own SGD + ``torch.amp.GradScaler`` on each run alone: run 1's gradients overflow in
    steps 0 and 3. Every run's tensor and loss scale equal, bit for bit."""
    from atlas_fast.engine.optim import RunsSGD

    cuda = SETUP["device"] == "cuda"
    device = torch.device(SETUP["device"])
    generator = torch.Generator().manual_seed(5)
    start = torch.randn(runs, 5, 3, generator=generator) * 0.02
    grads = []
    for step in range(steps):
        grad = torch.randn(runs, 5, 3, generator=generator) * 0.1
        if step in (0, 3):
            grad[1, 0, 0] = float("inf")
        grads.append(grad.to(device))
    lrs = [1e-5, 0.002, 0.002, 0.0018, 0.0015, 0.001]

    def ours(graphed: bool):
        param = torch.nn.Parameter(start.clone().to(device))
        optimizer = RunsSGD([{"params": [param]}], runs=runs, momentum=0.9, weight_decay=5e-4, amp=True)
        static = grads[0].clone()

        def body():
            losses = (param * static).flatten(1).sum(dim=1)
            (scaled,) = torch.autograd.grad(optimizer.scale_losses(losses), [param])
            optimizer.step([scaled])

        replay = None
        stream = torch.cuda.Stream(device) if graphed else None
        for step in range(steps):
            optimizer.set_lrs([lrs[step]])
            static.copy_(grads[step])
            if not graphed:
                body()
            elif step < 2:  # two eager warm-up steps on the capture stream, as torch asks before a capture
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    body()
                torch.cuda.current_stream(device).wait_stream(stream)
            else:
                if replay is None:  # captured once (nothing runs), then replayed every step
                    torch.cuda.synchronize(device)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        body()
                    replay = graph.replay
                replay()
        return param.detach().cpu(), optimizer.scale.cpu()

    def reference(r: int):
        param = torch.nn.Parameter(start[r:r + 1].clone().to(device))
        optimizer = torch.optim.SGD([param], lr=lrs[0], momentum=0.9, weight_decay=5e-4)
        scaler = torch.amp.GradScaler(device.type)
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = lrs[step]
            optimizer.zero_grad()
            scaler.scale((param * grads[step][r:r + 1]).sum()).backward()
            scaler.step(optimizer)
            scaler.update()
        return param.detach().cpu(), scaler.get_scale()

    expected = [reference(r) for r in range(runs)]
    results = {"eager": ours(False)}
    if cuda:
        results["graphed"] = ours(True)
    verdicts = {}
    for row_name, (param, scale) in results.items():
        verdicts[row_name] = all(torch.equal(param[r:r + 1], expected[r][0]) and scale[r].item() == expected[r][1]
                              for r in range(runs))
    row("first contact: injected overflow vs torch's GradScaler", "ok" if all(verdicts.values()) else "FAIL",
        "; ".join(f"{row_name}: {'equal' if good else 'DIFFERENT'}" for row_name, good in verdicts.items()),
        f"{runs} runs, run 1 overflows in steps 0 and 3; scales {[e[1] for e in expected]}"
        + ("" if cuda else " (CPU smoke test: eager only)"))


@guarded("first contact: reserved memory vs the plan, partial batch")
def check_reserved_memory(backbone, runs: int = 12, classes: int = 1000) -> None:
    """CoOp, R = ``runs`` at C = ``classes`` (ImageNet's), batch 32, graphed, each epoch ending on a partial batch
    (an eager step beside the graphs' pool): the device memory the training reserved (peak, torch's caching
    allocator) against what the memory plan budgets for that group."""
    from atlas_fast.cache.space import human_bytes
    from atlas_fast.engine import memory
    from atlas_fast.methods.registry import method_class

    cuda = SETUP["device"] == "cuda"
    if not cuda:
        runs, classes = 2, 10
    entry = method_class("coop")
    per_run = memory.step_bytes_per_run(entry, backbone, classes, 32, cuda)
    # what the plan budgets for R graphed runs: the frozen CLIP and, per run, a live graph's pool beside an eager step
    planned = memory.frozen_bytes(backbone, cuda) + runs * per_run * (memory.GRAPHED_ACTIVATION_SETS if cuda else 1)
    generator = torch.Generator().manual_seed(6)
    n = 32 * 3 + 5
    features = torch.randn(n, backbone.embed_dim, generator=generator).to(SETUP["device"])
    labels = torch.randint(classes, (n,), generator=generator)
    classnames = [f"class {i}" for i in range(classes)]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_reserved()
    _, logs, seconds, fallbacks = _train_cached("coop", backbone, classnames, features, labels, 2, cuda, runs=runs)
    if not cuda:
        row("first contact: reserved memory vs the plan, partial batch", "n/a",
            f"plan {human_bytes(planned)} for R = {runs}", "CPU smoke test: no device memory to measure")
        return
    reserved = torch.cuda.max_memory_reserved() - before + memory.frozen_bytes(backbone, cuda)
    replayed = sum(e.get("graphed_steps", 0) for e in logs[0])
    row("first contact: reserved memory vs the plan, partial batch",
        "ok" if reserved <= planned and not fallbacks and replayed > 0 else "FAIL",
        f"CoOp R = {runs}, C = {classes}: {human_bytes(reserved)} reserved (peak, frozen CLIP counted as planned), "
        f"plan {human_bytes(planned)} ({reserved / planned:.2f} of it); {replayed} steps replayed",
        ("fell back: " + fallbacks[0][:200]) if fallbacks else
        f"batch 32, {n} images: each epoch ends on a partial batch run eagerly beside the graphs' pool")


def first_contact(root: Path, backbone, workers: int) -> None:
    """The first-contact block: every hazard of a first run on a real GPU (planned under 4 minutes on an H100)."""
    check_loader_group(root, workers)
    check_clip_lora_graphs(backbone)
    check_promptsrc_unequal(backbone)
    check_epoch_evaluation(root)
    check_overflow()
    check_reserved_memory(backbone)


#: (check, planned seconds on an H100/H200) of the pricing block, in the order they run: a check starts only while
#: the budget (--budget-s) leaves it its planned time, so the whole script stays within it.
PRICING_PLAN = {"cache build": 40, "faiss": 2, "AMP": 15, "batched": 20, "pixels": 15, "step speed": 15,
                "graph steps": 40, "pixel graphs": 40, "pixel memory": 20, "batched graphs": 20, "syncs": 10,
                "groups": 20, "runs/hour": 40, "demo": 30, "beyond": 40}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="dataset size multiplier (default 1)")
    p.add_argument("--runs", type=int, default=12, help="runs of the batched check (default 12)")
    p.add_argument("--device", default="cuda", help="cuda (default); cpu only to smoke-test this script")
    p.add_argument("--model", default="ViT-B-16", help="open_clip model, random weights (default ViT-B-16)")
    p.add_argument("--block", choices=("all", "first-contact", "pricing"), default="all",
                   help="the first-contact block (every hazard of a first GPU run), the pricing block, or both "
                        "(default, first contact first)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="seconds this script may take (default 420: with the doctor before it, gpu_check.sh stays "
                        "under 8 minutes); pricing checks that would not fit are skipped, each with a row")
    p.add_argument("--workers", type=int, default=2, help="decoding workers of the first-contact pixel group")
    p.add_argument("--skip-demo", action="store_true", help="leave out the demo's wall time (the longest check)")
    p.add_argument("--beyond-teacher", default="ViT-H-14-quickgelu",
                   help="KDPL's teacher in the cached-vs-pixel check, random weights (default: the paper's ViT-H-14)")
    p.add_argument("--paper-scale-budget", type=int, default=120,
                   help="at most these seconds for benchmarks/paper_scale.py's units (default 120, less if the "
                        "budget has less left; 0 leaves it out)")
    args = p.parse_args()
    SETUP.update(device=args.device, model=args.model)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("No CUDA device visible to torch: nothing to check.")
        return 2
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.data import load_dataset

    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (script smoke test)"
    row("device", "ok", name, f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    start = time.perf_counter()

    def fits(check: str) -> bool:
        """Whether the pricing check ``check`` may start: its planned seconds still fit the budget."""
        left = args.budget_s - (time.perf_counter() - start)
        if left >= PRICING_PLAN[check]:
            return True
        row(f"pricing: {check}", "skipped", f"{left:.0f} s of the budget left",
            f"planned {PRICING_PLAN[check]} s on an H100/H200 (--budget-s {args.budget_s:g})")
        return False

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        classes = max(4, int(100 * args.scale)) // 2 * 2
        write_dataset(root / "data", classes, train=10, test=4)
        backbone = load_backbone(BackboneConfig(args.model, None), args.device)
        if args.block in ("all", "first-contact"):
            first_contact(root, backbone, args.workers)
            seconds = time.perf_counter() - start
            cuda = args.device == "cuda"
            row("first-contact block", ("ok" if seconds <= 240 else "WARN") if cuda else "n/a", f"{seconds:.0f} s",
                "target under 4 minutes on an H100/H200" if cuda else "CPU smoke test: not judged")
        if args.block in ("all", "pricing"):
            if fits("cache build"):
                check_cache(backbone, root, load_dataset("OxfordPets", root / "data"),
                            photos=max(8, int(600 * args.scale)))
            steps = [("faiss", check_faiss, ()), ("AMP", check_amp, (root,)), ("batched", check_batched,
                                                                                 (root, args.runs)),
                     ("pixels", check_pixels, (root,)), ("step speed", check_step_speed, ()),
                     ("graph steps", check_graph_steps, (backbone,)), ("pixel graphs", check_pixel_graphs, (backbone,)),
                     ("pixel memory", check_pixel_memory, (backbone,)),
                     ("batched graphs", check_batched_graph_steps, (backbone,)),
                     ("syncs", check_graphed_syncs, (backbone,)), ("groups", check_graph_groups, (backbone,)),
                     ("runs/hour", check_runs_per_hour, (root,))]
            if not args.skip_demo:
                steps.append(("demo", check_demo, (root,)))
            for check, function, check_args in steps:
                if fits(check):
                    function(*check_args)
            left = args.budget_s - (time.perf_counter() - start) - PRICING_PLAN["beyond"] - 15
            if args.paper_scale_budget > 0 and left >= 30:
                check_paper_scale(int(min(args.paper_scale_budget, left)))
            elif args.paper_scale_budget > 0:
                row("pricing: paper scale", "skipped", f"{left:.0f} s of the budget left", "")
            if fits("beyond"):
                check_beyond_methods(args.beyond_teacher if args.device == "cuda" else args.model)
    total = time.perf_counter() - start
    print(f"\n## atlas_fast GPU check on {name} ({total:.0f} s)\n")
    print("| check | status | measured | note |")
    print("|---|---|---|---|")
    for check, status, value, note in ROWS:
        print(f"| {check} | {status} | {value} | {note} |")
    return 1 if any(status == "FAIL" for _, status, _, _ in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
