"""The work of a cached training step and what it asks of the host, measured on any machine (no GPU needed).

Three sections, each printed with its ratios side by side:

* ``flops``: the arithmetic of one training step (matmul and attention FLOPs of the forward and backward passes,
  ``torch.utils.flop_counter`` on fake tensors: nothing is computed, the shapes are the real ones) of CoOp, CoCoOp,
  DePT (on CoOp) and KgCoOp at ImageNet's shapes: ViT-B/16, its real class names (C = 500 base, 1,000 all), the
  recipe's batch, R = 12 runs (a GPU's group). Padded (every class suffix as long as the longest, what an eager
  GPU step runs) against the length groups of a graphed step (and of the CPU, for reference).
* ``floor``: Table III's training of the cached methods (CoOp, CoCoOp, DePT; 11 datasets, their own class names,
  4 label variants x 3 seeds in groups of 12, 16 shots, the recipes' epochs and batches) as FLOPs, and the hours
  they take at 40 % of an H100's dense fp16 peak (989 TFLOP/s): the floor a GPU run can be held against, padded and
  with length groups.
* ``host``: what one step dispatches on the host and how many of those operators read a value back (on a GPU each
  waits for the device), counted with a dispatch mode on the tiny model: an eager step, a graphed step (torch.cuda's
  graphs faked: a replay re-runs the captured step, with counting paused; what the loop dispatches between two
  replays is the host's share of a graphed step), and, for the step before this change, the host work that stayed
  outside its graph re-run here with the same torch calls (the batch stacked per run and copied into the graph's
  buffers, ``torch.amp.GradScaler.step``/``update`` over ``torch.optim.SGD``).

    python benchmarks/cached_step_work.py                     # all three (about a minute and a half on 2 cores)
    python benchmarks/cached_step_work.py --sections flops host --runs 12
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from atlas_fast.atlas.schedules import OneHot  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.clip.text_encoder import graph_length_groups  # noqa: E402
from atlas_fast.data.check import PUBLISHED_SIZES  # noqa: E402
from atlas_fast.data.datasets import ELEVEN  # noqa: E402
from atlas_fast.engine.graphs import DispatchCount  # noqa: E402
from atlas_fast.engine.optim import RunsSGD  # noqa: E402
from atlas_fast.engine.step import RunState, forward_backward  # noqa: E402
from atlas_fast.methods.registry import method_class  # noqa: E402
from atlas_fast.world.standin_plan import real_classes  # noqa: E402

#: an H100 SXM's dense fp16 tensor peak, and the share of it a well-fed step reaches (the issues' floor)
H100_FP16_FLOPS = 989.4e12
MFU = 0.4
SHOTS, SEEDS, VARIANTS = 16, 3, 4
FLOOR_METHODS = ("coop", "cocoop", "dept-coop")
MODES = ("padded", "graph groups", "cpu groups")


def recipe_of(method: str, dataset: str, setting: str = "base2new"):
    entry = method_class(method)
    config, recipe = entry.recipe_function("paper", setting, SHOTS, dataset)
    return entry, config, recipe


@contextlib.contextmanager
def grouping(method, mode: str):
    """Class suffixes padded to the longest (one group), or in the length groups of a graph / of the CPU."""
    encoder = getattr(method, "base", method).text_encoder
    encoder.length_groups = mode != "padded"
    with graph_length_groups() if mode == "graph groups" else contextlib.nullcontext():
        yield
    encoder.length_groups = True


def step_flops(backbone, method: str, names: list[str], runs: int, batch: int, modes=MODES,
               setting: str = "base2new") -> dict[str, float]:
    """FLOPs of one step of ``method`` (forward and backward, fake tensors) per grouping mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    entry, config, _ = recipe_of(method, "ImageNet", setting)
    torch.manual_seed(0)
    module = entry.build(backbone, names, config, runs)
    module.train()
    optimizer = RunsSGD(module.param_groups(), runs, 0.9, 5e-4, amp=False)
    cpu = torch.device("cpu")
    states = [RunState(None, torch.zeros(1, dtype=torch.long), None, OneHot(), seed, cpu) for seed in range(runs)]
    result = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        base = getattr(module, "base", module)
        if hasattr(base, "hand_crafted_features"):  # KgCoOp's targets: computed once per class set, not per step
            hand_crafted = torch.randn(len(names), backbone.embed_dim)
            base.hand_crafted_features = lambda: hand_crafted
        features = torch.randn(runs, batch, backbone.embed_dim)
        labels = torch.randint(len(names), (runs, batch))
        targets = [(r, labels[r], None) for r in range(runs)]
        for mode in modes:
            with grouping(module, mode), FlopCounterMode(display=False) as counter:
                forward_backward(module, states, optimizer, 0, features, labels, targets, [batch] * runs, cpu,
                                 amp=False)
            result[mode] = float(counter.get_total_flops())
    return result


def imagenet_names() -> list[str]:
    return [name for _, name in real_classes("ImageNet")]


def section_flops(backbone, runs: int, methods: list[str], class_counts: list[int]) -> None:
    print(f"\n## FLOPs per training step at ImageNet's shapes ({backbone.config.model}, real class names, R = {runs}, "
          f"recipe batch)")
    print("\n| method | C | batch | padded TFLOP | graph groups TFLOP | ratio | CPU groups TFLOP | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    names = imagenet_names()
    for method in methods:
        for classes in class_counts:
            setting = "base2new" if classes < len(names) else "cross_dataset"
            _, _, recipe = recipe_of(method, "ImageNet", setting)
            clock = time.perf_counter()
            flops = step_flops(backbone, method, names[:classes], runs, recipe.batch_size, setting=setting)
            padded = flops["padded"]
            print(f"| {method} | {classes} | {recipe.batch_size} | {padded / 1e12:.2f} | "
                  f"{flops['graph groups'] / 1e12:.2f} | {flops['graph groups'] / padded:.2f}x | "
                  f"{flops['cpu groups'] / 1e12:.2f} | {flops['cpu groups'] / padded:.2f}x |  "
                  f"[{time.perf_counter() - clock:.1f} s]", flush=True)


def section_floor(backbone, datasets: list[str]) -> None:
    print("\n## Table III's cached training as FLOPs: the floor at 40 % of an H100's dense fp16 peak")
    print(f"(each dataset's base classes and names, {SHOTS} shots, {VARIANTS} variants x {SEEDS} seeds in groups of "
          f"12, the recipe's epochs and batch)\n")
    print("| method | padded PFLOP | length groups PFLOP | ratio | floor padded (h) | floor with groups (h) |")
    print("|---|---:|---:|---:|---:|---:|")
    runs = VARIANTS * SEEDS
    totals = {}
    for method in FLOOR_METHODS:
        work = {"padded": 0.0, "graph groups": 0.0}
        for dataset in datasets:
            classes = PUBLISHED_SIZES[dataset].classes
            base = math.ceil(classes / 2)
            names = [name for _, name in real_classes(dataset)][:base]
            _, _, recipe = recipe_of(method, dataset)
            flops = step_flops(backbone, method, names, runs, recipe.batch_size, modes=("padded", "graph groups"))
            steps = recipe.epochs * math.ceil(SHOTS * base / recipe.batch_size)
            for mode in work:
                work[mode] += steps * flops[mode]
        totals[method] = work
        hours = {mode: value / (MFU * H100_FP16_FLOPS) / 3600 for mode, value in work.items()}
        print(f"| {method} | {work['padded'] / 1e15:.0f} | {work['graph groups'] / 1e15:.0f} | "
              f"{work['graph groups'] / work['padded']:.2f}x | {hours['padded']:.3f} | {hours['graph groups']:.3f} |",
              flush=True)
    padded = sum(w["padded"] for w in totals.values())
    grouped = sum(w["graph groups"] for w in totals.values())
    print(f"| **together** | {padded / 1e15:.0f} | {grouped / 1e15:.0f} | {grouped / padded:.2f}x | "
          f"{padded / (MFU * H100_FP16_FLOPS) / 3600:.3f} | {grouped / (MFU * H100_FP16_FLOPS) / 3600:.3f} |")


class _Rows:
    """Cached features held as rows on the device (what the cached views offer)."""

    def __init__(self, features: torch.Tensor) -> None:
        self.features = features

    def device_rows(self):
        return self.features, 1

    def batches(self, epoch, order, batch_size):
        for index in order.split(batch_size):
            yield self.features[index], index


@contextlib.contextmanager
def faked_graphs(on_replay):
    """torch.cuda's streams faked and graphs "captured" without running; a replay calls ``on_replay(body)``."""
    from atlas_fast.engine import graphs, loop

    class Stream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, other):
            pass

    saved = [(torch.cuda, n, getattr(torch.cuda, n)) for n in ("Stream", "current_stream", "stream",
                                                                "graph_pool_handle")]
    saved += [(graphs, n, getattr(graphs, n)) for n in ("graphs_available", "capture", "host_syncs")]
    saved += [(loop, "graphs_available", loop.graphs_available)]
    torch.cuda.Stream, torch.cuda.current_stream = Stream, lambda *a, **k: Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.graph_pool_handle = lambda: None
    graphs.graphs_available = loop.graphs_available = lambda device: True
    graphs.capture = lambda body, stream, pool=None: ((lambda: on_replay(body)), None)
    graphs.host_syncs = lambda function: (function(), [])
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _states(backbone, runs: int, items: int, classes: int, generator):
    states = []
    for seed in range(runs):
        features = torch.randn(items, backbone.embed_dim, generator=generator)
        labels = torch.randint(classes, (items,), generator=generator)
        states.append(RunState(_Rows(features), labels, None, OneHot(), seed, torch.device("cpu")))
    return states


def host_counts(backbone, method: str, runs: int, amp: bool, batch: int = 8, steps: int = 5) -> dict[str, float]:
    """Per step: operators the host dispatches and read-backs, eager and graphed (between replays; inside the
    replayed step), through the training loop."""
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.methods.config import OptimRecipe

    entry = method_class(method)
    names = [f"class {i}" for i in range(10)]
    generator = torch.Generator().manual_seed(0)
    cpu = torch.device("cpu")
    result = {}

    def build():
        torch.manual_seed(0)
        return entry.build(backbone, names, entry.config_class(ctx_init="a photo of a"), runs)

    # eager, per step: an epoch of 2N steps less an epoch of N (what an epoch does once cancels)
    eager = {}
    for count in (steps, 2 * steps):
        counter = DispatchCount()
        with counter:
            train_runs(TrainingRuns(build(), _states(backbone, runs, batch * count, len(names), generator)),
                       OptimRecipe(epochs=1, batch_size=batch, lr=0.01), cpu, amp, progress=False)
        eager[count] = counter
    result["eager ops"] = (eager[2 * steps].total - eager[steps].total) / steps
    result["eager read-backs"] = (eager[2 * steps].read_backs - eager[steps].read_backs) / steps

    # graphed: epoch 0 warms up and captures, epoch 1 replays every step
    outside, inside, marks = DispatchCount(), DispatchCount(), []

    def on_replay(body):
        marks.append(outside.total)
        outside.paused = True
        with inside:
            body()
        outside.paused = False

    with faked_graphs(on_replay), outside:
        train_runs(TrainingRuns(build(), _states(backbone, runs, batch * steps, len(names), generator)),
                   OptimRecipe(epochs=2, batch_size=batch, lr=0.01), cpu, amp, progress=False, graph_steps=True)
    last = marks[-steps:]  # consecutive replays of the last epoch
    result["graphed host ops"] = (last[-1] - last[0]) / (steps - 1)
    result["graphed read-backs"] = inside.read_backs / len(marks)
    result["replayed step ops"] = inside.total / len(marks)
    return result


def before_host_counts(backbone, method: str, runs: int, amp: bool, batch: int = 8) -> dict[str, float]:
    """The host work of one graphed step before this change, re-run with the same calls: each run's batch indexed and
    stacked on the host side (the streamed path), copied into the graph's buffers, GradScaler.step/update over
    torch.optim.SGD on the replay's gradients, and each run's loss added to the epoch's sum."""
    from atlas_fast.engine.step import StreamedBatches

    entry = method_class(method)
    names = [f"class {i}" for i in range(10)]
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    module = entry.build(backbone, names, entry.config_class(ctx_init="a photo of a"), runs)
    states = _states(backbone, runs, batch * 3, len(names), generator)
    stream = StreamedBatches(states, batch, torch.device("cpu")).epoch(
        0, [torch.randperm(batch * 3, generator=generator) for _ in states])
    inputs, labels, targets = next(stream).tensors()
    static = (inputs.clone(), labels.clone(), [run_labels.clone() for _, run_labels, _ in targets])
    params = module.trainable_parameters()
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cpu", enabled=amp)
    scaler.scale(torch.zeros(()))  # what the captured forward did (the scaler's state is made lazily)
    losses, totals = torch.rand(runs), torch.zeros(runs)
    for p in params:  # the replay's (scaled) gradients
        p.grad = torch.randn_like(p) * (scaler.get_scale() if amp else 1.0)
    counter = DispatchCount()
    with counter:
        inputs, labels, targets = next(stream).tensors()
        static[0].copy_(inputs)
        static[1].copy_(labels)
        for buffer, (_, run_labels, _) in zip(static[2], targets):
            buffer.copy_(run_labels)
        scaler.step(optimizer)
        scaler.update()
        for r in range(runs):
            totals[r] += losses[r].detach().float() * batch
    return {"graphed host ops": counter.total, "graphed read-backs": counter.read_backs}


def section_host(runs: int, methods: list[str]) -> None:
    backbone = load_backbone(BackboneConfig("atlas-tiny", None), "cpu")
    print(f"\n## What one step asks of the host (atlas-tiny, CPU, R = {runs}, batch 8, 10 classes; operators "
          f"dispatched per step, read-backs = operators that wait for the device on a GPU)\n")
    print("| method | precision | eager: ops / read-backs | graphed, this change: host ops between replays / "
          "read-backs in the replayed step | graphed, before: host ops around a replay / read-backs |")
    print("|---|---|---:|---:|---:|")
    for method in methods:
        for amp in (False, True):
            now = host_counts(backbone, method, runs, amp)
            before = before_host_counts(backbone, method, runs, amp)
            print(f"| {method} | {'AMP' if amp else 'fp32'} | {now['eager ops']:.0f} / {now['eager read-backs']:.0f} | "
                  f"{now['graphed host ops']:.0f} / {now['graphed read-backs']:.0f} ({now['replayed step ops']:.0f} "
                  f"ops replayed) | {before['graphed host ops']:.0f} / {before['graphed read-backs']:.0f} |",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["flops", "floor", "host"], choices=["flops", "floor", "host"])
    parser.add_argument("--runs", type=int, default=12, help="R of the FLOP section (default 12, a GPU's group)")
    parser.add_argument("--host-runs", type=int, default=4, help="R of the host section (default 4)")
    parser.add_argument("--datasets", nargs="+", default=list(ELEVEN), help="the floor's datasets (default: Table III's)")
    parser.add_argument("--methods", nargs="+", default=["coop", "cocoop", "dept-coop", "kgcoop"],
                        help="methods of the flops and host sections")
    parser.add_argument("--classes", type=int, nargs="+", default=[500, 1000],
                        help="C of the flops section: ImageNet's first C class names (default 500 1000)")
    parser.add_argument("--model", default="ViT-B-16", help="open_clip model of the flops and floor sections")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.perf_counter()
    if {"flops", "floor"} & set(args.sections):
        backbone = load_backbone(BackboneConfig(args.model, None), "cpu")
        if "flops" in args.sections:
            section_flops(backbone, args.runs, args.methods, args.classes)
        if "floor" in args.sections:
            section_floor(backbone, args.datasets)
    if "host" in args.sections:
        section_host(args.host_runs, args.methods)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
