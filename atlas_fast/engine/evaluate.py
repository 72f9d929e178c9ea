"""Accuracy from cached test features (or test pixels, for prompted image towers): base, new, all classes, H,
zero-shot references, and saved runs.

Accuracy is Dassl's ``Classification`` evaluator: micro top-1 in percent over the whole evaluated split
(docs/protocol.md, "Evaluation"). In base-to-new, *base* is an m-way problem over the base class names, *new* an (n-m)-way
problem over the new names whose text features are built from the **learned** context (``set_classnames``), and
H = 2BN/(B+N). *all* is the n-way problem over every class name (not reported by the references, but cheap here).
Methods that prompt the image tower are evaluated on the test view (view 0) of each image (:func:`pixel_scores`).
A module of R runs (a group) is evaluated in one pass for all of them, which also scores calibration
(:func:`score_method`, :mod:`atlas_fast.engine.calibration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import torch

from atlas_fast.clip.backbones import Backbone
from atlas_fast.engine.calibration import PerImage, fit_temperature, per_image_scores, record_figures, scaled, summarise
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


@dataclass
class SetScores:
    """What one pass over an evaluation set gives, per run: the accuracy (percent), the calibration figures
    (:func:`~atlas_fast.engine.calibration.record_figures` plus the reliability ``bins``) when scored, the
    temperature when fitted, and the logits (R, N, C) float32 on the CPU when kept."""

    accuracy: list[float]
    labels: torch.Tensor
    calibration: list[dict[str, Any]] | None = None
    logits: torch.Tensor | None = None

    def run_figures(self, r: int) -> dict[str, float] | None:
        """Run r's entry of ``record["metrics"]["calibration"]`` (no reliability bins), or None."""
        if self.calibration is None:
            return None
        return {name: value for name, value in self.calibration[r].items() if name != "bins"}

    def run_bins(self, r: int) -> dict[str, list] | None:
        """Run r's reliability table (``record["reliability"][set]``), or None."""
        return None if self.calibration is None else self.calibration[r]["bins"]


class _SetCollector:
    """Gathers a set's per-image values (R, N) as chunks of its logits arrive, in any order of images."""

    def __init__(self, labels: torch.Tensor, calibrate: bool, temperatures: list[float | None] | None,
                 keep_logits: bool) -> None:
        self.labels = labels
        self.calibrate, self.temperatures, self.keep = calibrate, temperatures, keep_logits
        self.hits = torch.zeros(1, 0, dtype=torch.bool)
        self.per: PerImage | None = None
        self.per_ts: PerImage | None = None
        self.logits: torch.Tensor | None = None
        self.divide: torch.Tensor | None = None  # the runs' temperatures on the logits' device, made once per set
        self.seen = 0

    def _allocate(self, runs: int) -> None:
        """The per-image arrays (R, N), sized by the first chunk's R."""
        n = self.labels.shape[0]
        self.hits = torch.zeros(runs, n, dtype=torch.bool)
        self.per = self._empty(runs, n) if self.calibrate else None
        self.per_ts = self._empty(runs, n) if self.calibrate and self.temperatures is not None else None

    @staticmethod
    def _empty(runs: int, n: int) -> PerImage:
        return PerImage(torch.zeros(runs, n, dtype=torch.float64), torch.zeros(runs, n, dtype=torch.bool),
                        torch.zeros(runs, n, dtype=torch.float64), torch.zeros(runs, n, dtype=torch.float64))

    @staticmethod
    def _place(into: PerImage, at, values: PerImage) -> None:
        for name in ("confidence", "hit", "nll", "brier"):
            getattr(into, name)[:, at] = getattr(values, name)

    def add(self, logits: torch.Tensor, at: slice | torch.Tensor) -> None:
        """Score logits (R, n, C) of the images at positions ``at`` of the set."""
        if self.seen == 0:
            self._allocate(logits.shape[0])
        labels = self.labels[at]
        self.hits[:, at] = top1_hits(logits, labels).cpu()
        self.seen += logits.shape[1]
        if self.per is not None:
            self._place(self.per, at, per_image_scores(logits, labels))
        if self.per_ts is not None:
            if self.divide is None:  # fitted on the host: copied to the device once per set, not per chunk
                self.divide = torch.tensor([1.0 if t is None else t for t in self.temperatures],
                                           dtype=logits.dtype).to(logits.device)
            self._place(self.per_ts, at, per_image_scores(scaled(logits, self.divide), labels))
        if self.keep:
            if self.logits is None:
                self.logits = torch.zeros(logits.shape[0], self.labels.shape[0], logits.shape[-1])
            self.logits[:, at] = logits.float().cpu()

    def result(self) -> SetScores:
        if self.seen != self.labels.shape[0]:
            raise ValueError(f"the logits cover {self.seen} images but there are {self.labels.shape[0]} labels")
        calibration = None
        if self.per is not None:
            calibration = []
            for r in range(self.hits.shape[0]):
                summary = summarise(PerImage(*(getattr(self.per, f)[r] for f in ("confidence", "hit", "nll",
                                                                                   "brier"))))
                temperature = None if self.temperatures is None else self.temperatures[r]
                scaled_summary = None if temperature is None else summarise(PerImage(*(
                    getattr(self.per_ts, f)[r] for f in ("confidence", "hit", "nll", "brier"))))
                calibration.append({**record_figures(summary, scaled_summary, temperature),
                                    "bins": summary["bins"]})
        return SetScores(accuracy_of_hits(self.hits).tolist(), self.labels, calibration, self.logits)


def evaluate_method(method: PromptMethod, sets: Sequence[EvalSet], amp: bool = False) -> dict[str, list[float]]:
    """Accuracy (one per run: a module of R runs is evaluated in one pass) of ``method`` on each set, with the
    classifier rebuilt for each set's class names (:func:`score_method` without calibration)."""
    return {name: scores.accuracy for name, scores in score_method(method, sets, amp).items()}


def fitted_temperatures(method: PromptMethod, held_out: EvalSet | Sequence[EvalSet | None], amp: bool = False
                        ) -> list[float | None]:
    """Per run, the temperature minimising the NLL of the method's logits on its held-out set (the run's few-shot
    validation split, never its test split; one set for every run, or one per run, None for a run without):
    :func:`~atlas_fast.engine.calibration.fit_temperature`, each distinct set scored once for all runs."""
    per_run = _per_run(method, held_out)
    temperatures: list[float | None] = [None] * len(per_run)
    for held, runs in _owners(per_run):
        logits = score_method(method, [held], amp, keep_logits=True)[held.name].logits
        for r in runs:
            temperatures[r] = fit_temperature(logits[r], held.labels)
    return temperatures


def _per_run(method: PromptMethod, held_out: EvalSet | Sequence[EvalSet | None] | None) -> list[EvalSet | None]:
    if held_out is None or isinstance(held_out, EvalSet):
        return [held_out] * method.num_runs
    if len(held_out) != method.num_runs:
        raise ValueError(f"{len(held_out)} held-out sets for a module of {method.num_runs} runs")
    return list(held_out)


def _owners(per_run: Sequence[EvalSet | None]) -> list[tuple[EvalSet, list[int]]]:
    """The distinct held-out sets (first-seen order) and the runs each belongs to."""
    owners: dict[int, tuple[EvalSet, list[int]]] = {}
    for r, held in enumerate(per_run):
        if held is not None:
            owners.setdefault(id(held), (held, []))[1].append(r)
    return list(owners.values())


def score_method(method: PromptMethod, sets: Sequence[EvalSet], amp: bool = False, progress: bool = False,
                 calibrate: bool = False, keep_logits: bool = False,
                 held_out: EvalSet | Sequence[EvalSet | None] | None = None,
                 temperatures: Sequence[float | None] | None = None) -> dict[str, SetScores]:
    """Accuracy, and with ``calibrate`` the calibration figures, of ``method`` on each set, per run, in one pass:
    the logits stream chunk by chunk and only per-image values are kept (the logits too with ``keep_logits``); the
    sets read as pixels go through the image tower together (:func:`pixel_scores`). With ``held_out`` (and
    ``calibrate``: one set for every run, or one per run) each run's temperature is fitted on it and the figures
    after dividing by it are added; ``temperatures``: the runs' temperatures already fitted (None for a run without
    one). The method's own class set is restored afterwards."""
    original = tuple(method.classnames)
    held = _per_run(method, held_out) if calibrate and temperatures is None and held_out is not None else []
    owners = _owners(held)
    host = None  # the feature set whose pass scores the held-out images first
    if owners and all(h.images is None for h, _ in owners):
        names = {tuple(h.classnames) for h, _ in owners}
        host = next((s for s in sets if s.images is None and len(names) == 1 and tuple(s.classnames) in names), None)
    if owners and host is None:
        temperatures = fitted_temperatures(method, held, amp)
    state = {"temperatures": None if host is not None else _checked(calibrate, temperatures)}
    results: dict[str, SetScores] = {}
    try:
        ordered = ([host] if host is not None else []) + [s for s in sets if s is not host]
        feature_sets = [eval_set for eval_set in ordered if eval_set.images is None]
        for eval_set in feature_sets:
            method.set_classnames(eval_set.classnames)
            features, skip = eval_set.features, 0
            if eval_set is host:
                features = torch.cat([h.features for h, _ in owners] + [eval_set.features])
                skip = sum(len(h.labels) for h, _ in owners)
                kept: list[torch.Tensor] = []
            collector = None
            start = 0
            for chunk in method_logit_chunks(method, features, amp):
                rows = chunk.shape[1]
                if start < skip:  # held-out rows first: kept until they are all there, then the temperatures
                    take = min(rows, skip - start)
                    kept.append(chunk[:, :take].cpu())
                    chunk, start, rows = chunk[:, take:], start + take, rows - take
                    if start == skip:
                        state["temperatures"] = _fit_owned(torch.cat(kept, dim=1), owners, len(held))
                        kept = []
                    if rows == 0:
                        continue
                if collector is None:
                    collector = _SetCollector(eval_set.labels, calibrate, state["temperatures"], keep_logits)
                collector.add(chunk, slice(start - skip, start - skip + rows))
                start += rows
            if collector is None:
                collector = _SetCollector(eval_set.labels, calibrate, state["temperatures"], keep_logits)
            results[eval_set.name] = collector.result()
        pixel_sets = [eval_set for eval_set in sets if eval_set.images is not None]
        if pixel_sets:  # the feed gives images to the methods that read pixels
            results.update(pixel_scores(method, pixel_sets, amp, progress, calibrate, keep_logits,
                                        state["temperatures"]))
    finally:
        if original:
            method.set_classnames(original)
    return {eval_set.name: results[eval_set.name] for eval_set in sets}


def _checked(calibrate: bool, temperatures: Sequence[float | None] | None) -> list[float | None] | None:
    """The runs' temperatures to divide by, or None when there are none to use."""
    if not calibrate or temperatures is None or all(t is None for t in temperatures):
        return None
    return list(temperatures)


def _fit_owned(logits: torch.Tensor, owners: Sequence[tuple[EvalSet, list[int]]], runs: int
               ) -> list[float | None] | None:
    """Each run's temperature from the held-out logits (R, sum of the held-out sets' images, C) of its own set."""
    temperatures: list[float | None] = [None] * runs
    start = 0
    for held, members in owners:
        rows = slice(start, start + len(held.labels))
        for r in members:
            temperatures[r] = fit_temperature(logits[r, rows], held.labels)
        start += len(held.labels)
    return _checked(True, temperatures)


@torch.no_grad()
def pixel_scores(method: PromptMethod, sets: Sequence[EvalSet], amp: bool = False, progress: bool = False,
                 calibrate: bool = False, keep_logits: bool = False,
                 temperatures: list[float | None] | None = None) -> dict[str, SetScores]:
    """Accuracy (one per run), and with ``calibrate`` the calibration figures, of a prompted-image method on the
    test view of each set's images, in one pass: each distinct test image is decoded once, however many sets hold
    it (base, new and all share theirs), and goes through the R runs' prompted image towers together
    (:meth:`~atlas_fast.methods.base.PromptMethod.eval_pixel_features`, at most :data:`EVAL_PIXEL_SEQUENCES`
    sequences per call); every set that holds it then scores its features with its own classifier (the class
    prompts encoded once per set, :meth:`~atlas_fast.methods.base.PromptMethod.pixel_classifier`). Images are taken
    set by set in each set's order, :data:`EVAL_PIXEL_BATCH` at a time, as a set evaluated alone takes them."""
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
        collectors = [_SetCollector(s.labels, calibrate, temperatures, keep_logits)
                      for s in sets]
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
                        for classify, index, collector in zip(classifiers, where, collectors):
                            places = index[rows]
                            held = (places >= 0).nonzero().flatten()
                            if len(held):
                                logits = classify(features[:, held.to(features.device)]).float()
                                collector.add(logits, places[held])
                    bar.update(len(pixels))
    return {eval_set.name: collector.result() for eval_set, collector in zip(sets, collectors)}


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


def run_metrics(scores: dict[str, SetScores], r: int) -> dict[str, Any]:
    """Run r's accuracies (H added) and, when scored, its ``calibration`` figures per class set."""
    metrics: dict[str, Any] = summarize({name: s.accuracy[r] for name, s in scores.items()})
    figures = {name: s.run_figures(r) for name, s in scores.items() if s.calibration is not None}
    if figures:
        metrics["calibration"] = figures
    return metrics


def zero_shot_references(backbone: Backbone, eval_sets: Sequence[EvalSet], dataset: str) -> dict[str, float]:
    """Zero-shot CLIP's accuracy on each evaluation set with the dataset's CLIP template (H added)."""
    from atlas_fast.data.datasets import zeroshot_template

    template = zeroshot_template(dataset)
    return summarize({s.name: zero_shot_accuracy(backbone, s, template) for s in eval_sets})
