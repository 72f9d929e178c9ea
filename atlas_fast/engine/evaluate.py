"""Accuracy from cached test features (or test pixels, for prompted image towers): base, new, all classes, H,
zero-shot references, and saved runs.

Accuracy is Dassl's ``Classification`` evaluator: micro top-1 in percent over the whole evaluated split
(docs/protocol.md, "Evaluation"). In base-to-new, *base* is an m-way problem over the base class names, *new* an (n-m)-way
problem over the new names whose text features are built from the **learned** context (``set_classnames``), and
H = 2BN/(B+N). *all* is the n-way problem over every class name (not reported by the references, but cheap here).
Methods that prompt the image tower (``reads_pixels``) are evaluated on the test view (view 0) of each
image, decoded in batches of :data:`EVAL_PIXEL_BATCH` (the references' test batch), with the class prompts encoded
once per class set; every evaluated set in one pass, each distinct image through the prompted tower once
(:func:`pixel_accuracies`). A module of R runs (a group) is evaluated in that one pass for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import torch

from atlas_fast.clip.backbones import Backbone
from atlas_fast.methods.base import PromptMethod

if TYPE_CHECKING:
    from atlas_fast.engine.pixels import ImageViews

EVAL_PIXEL_BATCH = 100
# Sequences per call of the prompted image tower at evaluation: R runs x images (a group of R = 12 runs takes 33
# images at a time through its 12 prompted towers; a run alone, the whole batch of 100).
EVAL_PIXEL_SEQUENCES = 400


@dataclass
class EvalSet:
    """One evaluation problem: the class names of the classifier and the test features (N, D) with labels (N,);
    ``images`` are the same test images as pixels, for methods that prompt the image tower."""

    name: str
    classnames: tuple[str, ...]
    features: torch.Tensor
    labels: torch.Tensor
    images: ImageViews | None = None

    def __post_init__(self) -> None:
        if self.features.shape[0] != self.labels.shape[0]:
            raise ValueError(f"EvalSet {self.name!r}: {self.features.shape[0]} features but "
                             f"{self.labels.shape[0]} labels.")
        if self.images is not None and len(self.images) != self.labels.shape[0]:
            raise ValueError(f"EvalSet {self.name!r}: {len(self.images)} images but {self.labels.shape[0]} labels.")


def harmonic_mean(base: float, new: float) -> float:
    """H = 2BN/(B+N) (0 when both are 0), as the CoCoOp/MaPLe papers define it."""
    return 0.0 if base + new == 0 else 2.0 * base * new / (base + new)


def top1_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Micro top-1 accuracy in percent; ``logits`` (R, N, C) gives one value per run, shape (R,)."""
    return accuracy_of_hits(top1_hits(logits, labels))


def top1_hits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Whether each image's top-1 class is its label: (R, n) bool of logits (R, n, C) and labels (n,)."""
    return logits.argmax(dim=-1) == labels.to(logits.device)


def accuracy_of_hits(hits: torch.Tensor) -> torch.Tensor:
    """Micro top-1 accuracy in percent (R,) of per-image hits (R, N): the mean of the 0/1 hits over the whole split,
    computed as :func:`top1_accuracy` always has, so streamed and whole-split evaluations give equal numbers."""
    return 100.0 * hits.float().mean(dim=-1)


def streamed_top1(chunks: Iterable[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """:func:`top1_accuracy` of logits that arrive as consecutive chunks (R, n, C) along the images: only each
    chunk's hits (R, n) are kept, so memory is one chunk of logits plus N booleans per run, not N x C floats."""
    hits, start = [], 0
    for chunk in chunks:
        rows = chunk.shape[1]
        hits.append(top1_hits(chunk, labels[start:start + rows]))
        start += rows
    if start != labels.shape[0]:
        raise ValueError(f"the logits cover {start} images but there are {labels.shape[0]} labels")
    return accuracy_of_hits(torch.cat(hits, dim=1))


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device_type=device.type, dtype=torch.float16, enabled=enabled and device.type == "cuda")


def _each_under(context: Callable[[], Any], chunks: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The chunks as float32, each computed inside a fresh ``context()`` (autocast): the context covers the
    producer only, never the caller's code between chunks."""
    while True:
        with context():
            chunk = next(chunks, None)
            if chunk is None:
                return
            chunk = chunk.float()
        yield chunk


@contextmanager
def _eval_mode(method: PromptMethod):
    was_training = method.training
    method.eval()
    try:
        yield
    finally:
        method.train(was_training)


@torch.no_grad()
def method_logit_chunks(method: PromptMethod, features: torch.Tensor, amp: bool = False) -> Iterator[torch.Tensor]:
    """Logits (R, n, C) of consecutive chunks of cached features (N, D): the method's own test-time path
    (:meth:`~atlas_fast.methods.base.PromptMethod.eval_logit_chunks`) in eval mode, under fp16 autocast with ``amp``."""
    with _eval_mode(method):
        yield from _each_under(lambda: _autocast(method.device, amp), method.eval_logit_chunks(features))


def method_logits(method: PromptMethod, features: torch.Tensor, amp: bool = False) -> torch.Tensor:
    """Logits (R, N, C) of cached features (N, D): :func:`method_logit_chunks` joined."""
    return torch.cat(list(method_logit_chunks(method, features, amp)), dim=1)


def evaluate_method(method: PromptMethod, sets: Sequence[EvalSet], amp: bool = False,
                    progress: bool = False) -> dict[str, list[float]]:
    """Accuracy (one per run: a module of R runs is evaluated in one pass) of ``method`` on each set, with the
    classifier rebuilt for each set's class names. The logits stream chunk by chunk (:func:`streamed_top1`); the
    sets read as pixels go through the image tower together (:func:`pixel_accuracies`). The method's own class set
    is restored afterwards."""
    original = tuple(method.classnames)
    results: dict[str, list[float]] = {}
    try:
        pixel_sets = [eval_set for eval_set in sets if eval_set.images is not None]
        if pixel_sets:  # the feed gives images to the methods that read pixels
            results.update(pixel_accuracies(method, pixel_sets, amp, progress))
        for eval_set in sets:
            if eval_set.images is None:
                method.set_classnames(eval_set.classnames)
                chunks = method_logit_chunks(method, eval_set.features, amp)
                results[eval_set.name] = streamed_top1(chunks, eval_set.labels).tolist()
    finally:
        if original:
            method.set_classnames(original)
    return {eval_set.name: results[eval_set.name] for eval_set in sets}


@torch.no_grad()
def pixel_accuracies(method: PromptMethod, sets: Sequence[EvalSet], amp: bool = False,
                     progress: bool = False) -> dict[str, list[float]]:
    """Accuracy (one per run) of a prompted-image method on the test view of each set's images, in one pass: each
    distinct test image is decoded once, however many sets hold it (base, new and all share theirs), and goes
    through the R runs' prompted image towers together (:meth:`~atlas_fast.methods.base.PromptMethod.
    eval_pixel_features`, at most :data:`EVAL_PIXEL_SEQUENCES` sequences per call); every set that holds it then
    scores its features with its own classifier (the class prompts encoded once per set,
    :meth:`~atlas_fast.methods.base.PromptMethod.pixel_classifier`). Images are taken set by set in each set's
    order, :data:`EVAL_PIXEL_BATCH` at a time, as a set evaluated alone takes them."""
    from atlas_fast.progress import progress_bar

    device = method.device
    with _eval_mode(method):
        classifiers = []
        for eval_set in sets:
            method.set_classnames(eval_set.classnames)
            with _autocast(device, amp):
                classifiers.append(method.pixel_classifier())
        union: dict[tuple[str, str], int] = {}  # (path, key) -> position among every set's images
        items, places, bounds = [], [], [0]
        for eval_set in sets:
            for d in eval_set.images.items:
                if (d.impath, d.key) not in union:
                    union[(d.impath, d.key)] = len(items)
                    items.append(d)
            places.append(torch.tensor([union[(d.impath, d.key)] for d in eval_set.images.items]))
            bounds.append(len(items))  # the images this set brings first, in its order (chunked as if alone)
        where = []  # per set: each union image's position in the set, or -1
        for place in places:
            index = torch.full((len(items),), -1, dtype=torch.long)
            index[place] = torch.arange(len(place))
            where.append(index)
        hits = [torch.zeros(method.num_runs, len(s.labels), dtype=torch.bool) for s in sets]
        images = sets[0].images
        starts = sorted(set(bounds))
        per_call = max(1, EVAL_PIXEL_SEQUENCES // method.num_runs)
        with progress_bar(total=len(items), desc=f"evaluate {', '.join(s.name for s in sets)}", unit="img",
                          enabled=progress, leave=False) as bar:
            for low, high in zip(starts, starts[1:]):
                first = low
                for pixels, _ in images.feed.register(items[low:high], images.spec, 0, torch.arange(high - low),
                                                      EVAL_PIXEL_BATCH):
                    rows = slice(first, first + len(pixels))
                    first += len(pixels)
                    with _autocast(images.device, amp):
                        features = torch.cat([method.eval_pixel_features(part) for part in pixels.split(per_call)],
                                             dim=1)
                        for classify, index, eval_set, set_hits in zip(classifiers, where, sets, hits):
                            places = index[rows]
                            held = (places >= 0).nonzero().flatten()
                            if len(held):
                                logits = classify(features[:, held.to(features.device)]).float()
                                set_hits[:, places[held]] = top1_hits(logits, eval_set.labels[places[held]]).cpu()
                    bar.update(len(pixels))
    return {eval_set.name: accuracy_of_hits(set_hits).tolist() for eval_set, set_hits in zip(sets, hits)}


def zero_shot_accuracy(backbone: Backbone, eval_set: EvalSet, template: str) -> float:
    """Zero-shot CLIP (``ZeroshotCLIP``, the ``zsclip`` method): one hand-crafted prompt per class."""
    from atlas_fast.methods.zsclip import ZeroShotCLIP, ZeroShotConfig

    method = ZeroShotCLIP(backbone, eval_set.classnames, ZeroShotConfig(template=template))
    return streamed_top1(method_logit_chunks(method, eval_set.features), eval_set.labels)[0].item()


def summarize(accuracies: dict[str, float]) -> dict[str, float]:
    """Add H when both base and new are present."""
    out = dict(accuracies)
    if "base" in out and "new" in out:
        out["H"] = harmonic_mean(out["base"], out["new"])
    return out


def evaluate_run(method: PromptMethod, eval_sets: Sequence[EvalSet], backbone: Backbone, dataset: str,
                 amp: bool = False, progress: bool = False, zero_shot: dict[str, float] | None = None
                 ) -> dict[str, Any]:
    """A trained run's final metrics: accuracy on each evaluation set (base/new/all, H) and the zero-shot references
    with the dataset's CLIP template on the same sets (``zero_shot``: those references when already computed for
    the same sets, e.g. by another run of the group)."""
    accuracies = {name: values[0] for name, values in evaluate_method(method, eval_sets, amp, progress).items()}
    if zero_shot is None:
        zero_shot = zero_shot_references(backbone, eval_sets, dataset)
    return {**summarize(accuracies), "zero_shot": zero_shot}


def zero_shot_references(backbone: Backbone, eval_sets: Sequence[EvalSet], dataset: str) -> dict[str, float]:
    """Zero-shot CLIP's accuracy on each evaluation set with the dataset's CLIP template (H added)."""
    from atlas_fast.data.datasets import zeroshot_template

    template = zeroshot_template(dataset)
    return summarize({s.name: zero_shot_accuracy(backbone, s, template) for s in eval_sets})
