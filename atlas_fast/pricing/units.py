"""A run's units of work, measured on this machine: what the estimator (:mod:`atlas_fast.pricing.estimate`) multiplies
per step, per test image and per run (:func:`measure_step`, :func:`measure_eval`, :func:`measure_soft_labels`,
:func:`measure_run_overhead`). The command's own units around its runs (its start, the feature cache's build,
decoding, its report, its end) are in :mod:`atlas_fast.pricing.command_units`; how a unit is timed, in
:mod:`atlas_fast.pricing.timing`.

Every unit runs the engine's own code on synthetic inputs of the real shapes, so what is timed is what a run does
(docs/estimate.md, section Where the numbers come from). The class names set the prompts' lengths, so a plan's own
names are passed where there are any. Each returns a :class:`~atlas_fast.pricing.timing.Unit` (seconds, and the peak
host RSS and peak device memory seen while it ran).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from atlas_fast.clip.backbones import Backbone
from atlas_fast.methods.config import MethodConfig, OptimRecipe
from atlas_fast.methods.registry import method_class
from atlas_fast.pricing.timing import SLOW_CALL_SECONDS, PeakMemory, Unit, timed

#: most cached test features an evaluation unit is timed on (methods whose images cost little next to their class
#: prompts need many for the cost per image to show)
MAX_EVAL_IMAGES = 1 << 14
#: shortest timing an evaluation unit's cost per image is read from (a few microseconds' difference is noise)
MIN_EVAL_SECONDS = 0.05
#: words the synthetic class names are drawn from (one to three words, like the datasets' names)
_WORDS = ("red", "great", "spotted", "common", "little", "wild", "house", "garden", "river", "terrier", "beetle",
          "station", "mountain", "church", "market", "lizard", "sparrow", "bridge", "forest", "kitchen")


def synthetic_classnames(count: int) -> list[str]:
    """``count`` distinct class names of one to three words (deterministic)."""
    names = []
    n = len(_WORDS)
    for i in range(count):
        words = [_WORDS[i % n]]
        if i >= n:
            words.insert(0, _WORDS[(i // n) % n])
        if i >= n * n:
            words.insert(0, _WORDS[(i // (n * n)) % n])
        if i >= n ** 3:
            words.append(str(i))
        names.append(" ".join(words))
    return names


def _fp16(device: torch.device, amp: bool) -> torch.autocast:
    """fp16 autocast on CUDA with ``amp``, as the engine's evaluation runs (nothing elsewhere)."""
    return torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp and device.type == "cuda")


class _SyntheticInputs:
    """:class:`~atlas_fast.engine.step.TrainInputs` of one random tensor (N, ...) already on the device; cached
    features offer their rows there, as the cached views do (the step then gathers its batch on the device)."""

    def __init__(self, inputs: Any) -> None:
        self.inputs = inputs

    def device_rows(self) -> tuple[torch.Tensor, int] | None:
        return None if isinstance(self.inputs, tuple) or self.inputs.dim() != 2 else (self.inputs, 1)

    def batches(self, epoch: int, order: torch.Tensor, batch_size: int) -> Iterator[tuple[Any, torch.Tensor]]:
        batch = self.inputs
        device = batch[0].device if isinstance(batch, tuple) else batch.device
        for index in order.to(device).split(batch_size):  # moved once per epoch, as the engine's inputs do
            if isinstance(batch, tuple):  # PromptSRC, KDPL: pixels and cached features of the same views
                from atlas_fast.engine.feed import PixelBatch

                yield PixelBatch(batch[0][index], batch[1][index]), index
            else:
                yield batch[index], index


def _training_inputs(entry, backbone: Backbone, items: int, device: torch.device,
                     method_config: MethodConfig | None = None) -> Any:
    """Random training inputs shaped as the feed serves them (a method's teacher's features appended)."""
    generator = torch.Generator().manual_seed(0)
    teacher = entry.view_teacher(method_config, backbone) if method_config is not None else None
    width = (backbone.embed_dim if not entry.reads_pixels or entry.reads_frozen_features else 0) + (
        teacher.embed_dim if teacher is not None else 0)
    pixels = None
    if entry.reads_pixels:
        size = backbone.preprocessing.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        pixels = torch.randn(items, 3, size, size, generator=generator).to(device)
    features = torch.randn(items, width, generator=generator).to(device) if width else None
    if pixels is None:
        return features
    return pixels if features is None else (pixels, features)


def method_config_for(method: str, config: MethodConfig | None = None, backbone: Backbone | None = None
                      ) -> MethodConfig:
    """The method's config to measure: ``config`` (a planned run's) or else its paper base-to-new recipe's,
    with prompt depths deeper than ``backbone``'s towers cut to them (a tiny test model has fewer blocks than
    ViT-B/16)."""
    entry = method_class(method)
    if config is None:
        config, _ = entry.recipe_function("paper", "base2new", 16, "ImageNet")
    if backbone is not None:  # a planned run's depths fit already (planning checks them): unchanged
        model = backbone.model
        text = len(model.transformer.resblocks)
        vision = len(getattr(getattr(model.visual, "transformer", None), "resblocks", ())) or text
        cut = {}
        for option in entry.depth_options:
            layers = text if "text" in option else vision if "vision" in option else min(text, vision)
            cut[option] = min(getattr(config, option), layers)
        config = dataclasses.replace(config, **cut)
    return config


def measure_step(backbone: Backbone, method: str, classnames: Sequence[str], batch: int, runs: int = 1,
                 config: MethodConfig | None = None, amp: bool | None = None, steps: int = 3,
                 graph_steps: bool | None = None, warmup: bool = True) -> Unit:
    """Seconds per training step of ``method`` at C = ``len(classnames)``, batch ``batch`` and R = ``runs`` runs
    trained together, through the engine's training loop: one untimed epoch (warm-up; on CUDA the step graphs are
    captured there), then one timed epoch of ``steps`` full steps. Peaks cover both epochs. ``warmup=False`` (for
    steps that take minutes on a CPU) times the first epoch, first step included."""
    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.engine.graphs import GRAPH_WARMUP_STEPS, use_graph_steps
    from atlas_fast.engine.group import batches_runs
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.engine.step import RunState
    from atlas_fast.threads import small_step_threads

    if batch < 1 or runs < 1 or steps < 1 or not classnames:
        raise ValueError(f"measure_step needs classes, batch, runs and steps >= 1; got C={len(classnames)}, "
                         f"batch={batch}, runs={runs}, steps={steps}.")
    device = backbone.device
    amp = device.type == "cuda" if amp is None else amp
    entry = method_class(method)
    if runs > 1 and not batches_runs(entry):
        raise ValueError(f"{method} trains its runs one by one (it does not batch runs): measure it at runs=1.")
    method_config = method_config_for(method, config, backbone)
    torch.manual_seed(0)
    module = entry.build(backbone, list(classnames), method_config, runs).to(device)
    schedules = [OneHot() for _ in range(runs)]
    graphs = use_graph_steps([graph_steps] * runs, entry, schedules, device) and warmup
    warm_steps = GRAPH_WARMUP_STEPS + 1 if graphs else 1
    timed_steps = max(steps, warm_steps)
    items = batch * timed_steps
    inputs = _training_inputs(entry, backbone, items, device, method_config)
    labels = torch.arange(items) % len(classnames)
    states = [RunState(_SyntheticInputs(inputs), labels, None, schedule, seed, device)
              for seed, schedule in enumerate(schedules)]
    recipe = OptimRecipe(epochs=2 if warmup else 1, batch_size=batch, lr=1e-6, warmup_epochs=1 if warmup else 0)
    with PeakMemory(device) as peak:
        with small_step_threads(device.type, small_steps=not entry.reads_pixels):
            logs = train_runs(TrainingRuns(module, states), recipe, device, amp, progress=False, graph_steps=graphs)
    seconds = logs[0][-1]["seconds"] / timed_steps
    return Unit(seconds, peak.host, peak.device_bytes, repeats=timed_steps)


def measure_eval(backbone: Backbone, method: str, classnames: Sequence[str], images: int = 64,
                 config: MethodConfig | None = None, amp: bool | None = None, max_repeats: int = 5,
                 runs: int = 1, max_images: int = MAX_EVAL_IMAGES) -> Unit:
    """A method's evaluation at C = ``len(classnames)`` of ``runs`` runs evaluated together (a group's one pass):
    ``fixed_seconds`` once per class set (the R runs' class prompts) and ``seconds`` per test image for all R runs
    (cached features, or pixels through the prompted image towers; decoding priced apart), measured on ``images``
    random test inputs and scaled linearly. On cached
    features the count grows up to ``max_images`` (a few times the largest test set the plan evaluates: an image's
    cost that does not show on that many images does not matter to the plan); the unit keeps the count it reached
    (``images``)."""
    from atlas_fast.engine.evaluate import EVAL_PIXEL_BATCH, EVAL_PIXEL_SEQUENCES, method_logits

    device = backbone.device
    amp = device.type == "cuda" if amp is None else amp
    entry = method_class(method)
    torch.manual_seed(0)
    module = entry.build(backbone, list(classnames), method_config_for(method, config, backbone), runs)
    module = module.to(device).eval()
    reached = 0
    with PeakMemory(device) as peak:
        if entry.reads_pixels:  # the class prompts once, then the prompted image towers per image
            with torch.no_grad(), _fp16(device, amp):
                fixed, _ = timed(lambda: module.text_features(), device, max_repeats)
            count = min(images, EVAL_PIXEL_BATCH)
            pixels = _training_inputs(entry, backbone, count, device)
            pixels = pixels[0] if isinstance(pixels, tuple) else pixels
            per_call_images = max(1, EVAL_PIXEL_SEQUENCES // runs)

            def logits() -> list[torch.Tensor]:
                return [classify(module.eval_pixel_features(part)) for part in pixels.split(per_call_images)]

            with torch.no_grad(), _fp16(device, amp):
                classify = module.pixel_classifier()
                per_call, repeats = timed(logits, device, max_repeats)
        else:  # linear in the images: t(1) is the fixed part (the class prompts) plus one image; N grows (x4, up
            # to the cap) until the images' part is at least the fixed part and t(N) at least MIN_EVAL_SECONDS, so
            # that noise, divided by N, cannot pass for a cost per image
            cap = max(2, min(MAX_EVAL_IMAGES, max_images))
            features = torch.randn(cap, backbone.embed_dim).to(device)
            one, _ = timed(lambda: method_logits(module, features[:1], amp), device, max_repeats, fastest=True)
            count = max(2, min(images, cap))
            while True:  # every timing the fastest of five: one slow call on a busy machine must not stop it
                total, repeats = timed(lambda: method_logits(module, features[:count], amp), device, max_repeats,
                                        fastest=True)
                if (total >= 2 * one and total >= MIN_EVAL_SECONDS) or count >= cap:
                    break
                count = min(cap, 4 * count)
            per_image = max(0.0, total - one) / (count - 1)
            if count < cap and total < SLOW_CALL_SECONDS:  # and once at 4N (a busy moment only adds time, so the
                # smaller slope), unless t(N) is long enough for a busy moment to be small beside it
                more = min(cap, 4 * count)
                longer, _ = timed(lambda: method_logits(module, features[:more], amp), device, max_repeats,
                                   fastest=True)
                per_image = min(per_image, max(0.0, longer - one) / (more - 1))
            fixed = max(0.0, one - per_image)
            per_call = per_image * count
            reached = cap if count >= cap else MAX_EVAL_IMAGES  # stopped before the cap: the cost showed at any N
    return Unit(per_call / count, peak.host, peak.device_bytes, fixed_seconds=fixed, repeats=repeats, images=reached)


def measure_soft_labels(backbone: Backbone, kind: str, classnames: Sequence[str], items: int,
                        max_repeats: int = 3) -> Unit:
    """Seconds to generate one run's soft-label rows of ``kind`` (``ls``, ``csl``, ``isl``, ``mix``) for ``items``
    training images at C = ``len(classnames)``: what :func:`atlas_fast.atlas.softlabels.compute_soft_labels` runs
    (the class prompts through the text encoder, then the rows), on random image features."""
    from atlas_fast.atlas.softlabels import (SoftLabelConfig, soft_label_preset, compute_soft_labels)
    from atlas_fast.data.base import DatasetSplits, Datum

    config: SoftLabelConfig = soft_label_preset("base2new", kind)  # type: ignore[arg-type]
    names = list(classnames)
    train = tuple(Datum(impath=f"/synthetic/{i}.jpg", label=i % len(names), classname=names[i % len(names)],
                        key=f"{i}.jpg") for i in range(items))
    splits = DatasetSplits(name="Synthetic", dataset_dir=Path("/synthetic"), train=train, val=(), test=(),
                           classnames=tuple(names), template="a photo of a {}.")
    features = torch.randn(items, backbone.embed_dim)
    device = backbone.device
    with PeakMemory(device) as peak:
        seconds, repeats = timed(lambda: compute_soft_labels(config, backbone, splits, features), device,
                                  max_repeats, min_seconds=0.0)
    return Unit(seconds, peak.host, peak.device_bytes, repeats=repeats)


def measure_run_overhead(backbone: Backbone, method: str, classnames: Sequence[str],
                         config: MethodConfig | None = None, max_repeats: int = 3) -> Unit:
    """What one run costs outside its steps and its evaluation's images: building the method for C classes (its
    class prompts tokenised and embedded), the zero-shot references' class prompts through the text encoder, and
    writing a record with its learned tensors."""
    from atlas_fast.clip.backbones import encode_class_prompts
    from atlas_fast.files import atomic_write

    entry = method_class(method)
    device = backbone.device
    method_config = method_config_for(method, config, backbone)
    names = list(classnames)

    def one_run(folder: Path) -> None:
        torch.manual_seed(0)
        module = entry.build(backbone, names, method_config).to(device)
        encode_class_prompts(backbone, [f"a photo of a {name}." for name in names])
        learned = module.state_for_checkpoint()
        torch.save(learned, folder / "learned.pt")
        text = json.dumps({"classnames": names, "metrics": {}}).encode()
        atomic_write(folder / "record.json", lambda f: f.write(text))

    with tempfile.TemporaryDirectory(prefix="atlas_pricing_") as tmp, PeakMemory(device) as peak:
        seconds, repeats = timed(lambda: one_run(Path(tmp)), device, max_repeats, min_seconds=0.0)
    return Unit(seconds, peak.host, peak.device_bytes, repeats=repeats)

