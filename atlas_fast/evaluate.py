"""Accuracy from cached test features: base, new, all classes, H, zero-shot references, and saved runs.

Accuracy is Dassl's ``Classification`` evaluator: micro top-1 in percent over the whole evaluated split
(``data-pipeline.md`` §7). In base-to-new, *base* is an m-way problem over the base class names, *new* an (n-m)-way
problem over the new names whose text features are built from the **learned** context (``set_classnames``), and
H = 2BN/(B+N). *all* is the n-way problem over every class name (not reported by the references, but cheap here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from atlas_fast.backbones import Backbone
from atlas_fast.methods.base import PromptMethod

EVAL_BATCH = 1024


@dataclass
class EvalSet:
    """One evaluation problem: the class names of the classifier and the test features (N, D) with labels (N,)."""

    name: str
    classnames: tuple[str, ...]
    features: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.features.shape[0] != self.labels.shape[0]:
            raise ValueError(f"EvalSet {self.name!r}: {self.features.shape[0]} features but "
                             f"{self.labels.shape[0]} labels.")


def harmonic_mean(base: float, new: float) -> float:
    """H = 2BN/(B+N) (0 when both are 0), as the CoCoOp/MaPLe papers define it."""
    return 0.0 if base + new == 0 else 2.0 * base * new / (base + new)


def top1_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Micro top-1 accuracy in percent; ``logits`` (R, N, C) gives one value per run, shape (R,)."""
    correct = (logits.argmax(dim=-1) == labels.to(logits.device)).float()
    return 100.0 * correct.mean(dim=-1)


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device_type=device.type, dtype=torch.float16, enabled=enabled and device.type == "cuda")


@torch.no_grad()
def method_logits(method: PromptMethod, features: torch.Tensor, amp: bool = False) -> torch.Tensor:
    """Logits (R, N, C) of cached features (N, D). Methods whose text features do not depend on the image (the base
    ``forward``) encode the class prompts once; others run their own forward in chunks."""
    if method.consumes != "features":
        raise NotImplementedError(f"{type(method).__name__} consumes pixels; evaluating it from cached features is "
                                  f"impossible (its image path is prompted). The full forward path comes later.")
    device = next(iter(method.trainable_parameters()), features).device
    was_training = method.training
    method.eval()
    try:
        with _autocast(device, amp):
            if type(method).forward is PromptMethod.forward:
                text = method.text_features().float()
                chunks = [method.logit_scale * torch.einsum(
                    "bd,rcd->rbc", F.normalize(x.to(device).float(), dim=-1), text)
                    for x in features.split(EVAL_BATCH)]
            else:
                chunks = [method(x.to(device)).float() for x in features.split(EVAL_BATCH)]
    finally:
        method.train(was_training)
    return torch.cat(chunks, dim=1)


def evaluate_method(method: PromptMethod, sets: Sequence[EvalSet], amp: bool = False) -> dict[str, list[float]]:
    """Accuracy (one per run) of ``method`` on each set, with the classifier rebuilt for each set's class names.
    The method's own class set is restored afterwards."""
    original = tuple(method.classnames)
    results: dict[str, list[float]] = {}
    try:
        for eval_set in sets:
            method.set_classnames(eval_set.classnames)
            logits = method_logits(method, eval_set.features, amp)
            results[eval_set.name] = top1_accuracy(logits, eval_set.labels).tolist()
    finally:
        if original:
            method.set_classnames(original)
    return results


@torch.no_grad()
def zero_shot_accuracy(backbone: Backbone, eval_set: EvalSet, template: str) -> float:
    """Zero-shot CLIP (``ZeroshotCLIP``): one hand-crafted prompt per class, logits = exp(logit_scale) f_v f_t^T."""
    prompts = [template.format(c.replace("_", " ")) for c in eval_set.classnames]
    text = F.normalize(backbone.encode_text(prompts).float(), dim=-1)
    scale = backbone.model.logit_scale.exp().float()
    correct = 0
    for x, y in zip(eval_set.features.split(EVAL_BATCH), eval_set.labels.split(EVAL_BATCH)):
        logits = scale * F.normalize(x.to(text.device).float(), dim=-1) @ text.T
        correct += int((logits.argmax(-1).cpu() == y).sum())
    return 100.0 * correct / max(1, len(eval_set.labels))


def summarize(accuracies: dict[str, float]) -> dict[str, float]:
    """Add H when both base and new are present."""
    out = dict(accuracies)
    if "base" in out and "new" in out:
        out["H"] = harmonic_mean(out["base"], out["new"])
    return out


def evaluate_run(method: PromptMethod, eval_sets: Sequence[EvalSet], backbone: Backbone, dataset: str,
                 amp: bool = False) -> dict[str, Any]:
    """A trained run's final metrics: accuracy on each evaluation set (base/new/all, H) and the zero-shot references
    with the dataset's CLIP template on the same sets."""
    from atlas_fast.data.templates import zeroshot_template

    accuracies = {name: values[0] for name, values in evaluate_method(method, eval_sets, amp).items()}
    template = zeroshot_template(dataset)
    zero_shot = {s.name: zero_shot_accuracy(backbone, s, template) for s in eval_sets}
    return {**summarize(accuracies), "zero_shot": summarize(zero_shot)}


def evaluate_record(record_path: str | Path, dataset: str, data_root: str | Path, subsample: str = "all",
                    shots: int | None = None, seed: int | None = None, cache_root: str | Path = "cache",
                    device: str = "auto", progress: bool = True) -> dict[str, Any]:
    """Evaluate a saved run's learned tensors on a dataset's test split (e.g. cross-dataset transfer, or the new
    classes of another seed). ``subsample`` picks the class set; ``shots``/``seed`` only matter for the base/new
    split, which is defined by the (few-shot) train list's labels, so they default to the run's own."""
    from atlas_fast.backbones import BackboneConfig, shared_backbone
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
    from atlas_fast.data.templates import zeroshot_template
    from atlas_fast.methods import METHODS, build_method
    from atlas_fast.results import load_learned, read_record
    from atlas_fast.plan import resolve_device

    record = read_record(record_path)
    config = record["config"]
    torch_device = resolve_device(device)
    backbone = shared_backbone(BackboneConfig(**config["backbone"]), torch_device)
    if backbone.fingerprint != record["backbone"]["fingerprint"]:
        raise ValueError(f"The backbone {backbone.describe()} differs from the one {record_path} was trained with "
                         f"({record['backbone']['fingerprint'][:12]}); its learned prompts would be meaningless.")
    splits = load_dataset(dataset, data_root)
    if subsample != "all":
        shots = config["shots"] if shots is None else shots
        seed = config["seed"] if seed is None else seed
        splits = fewshot_subset(splits, shots, seed, store_dir=Path(cache_root) / splits.name / "split_fewshot")
    splits = subsample_classes(splits, subsample)
    cache = FeatureCache(cache_root)
    cache.build(backbone, splits.name, splits.test, num_views=0, progress=progress)
    features = cache.load(backbone, splits.name, splits.test, views=[0])[:, 0]
    labels = torch.tensor([d.label for d in splits.test])
    eval_set = EvalSet(subsample, splits.classnames, features, labels)

    method_name = config["method"]
    method_config = METHODS[method_name].config_class(**config["method_config"]) if method_name in METHODS else None
    method = build_method(method_name, backbone, splits.classnames, method_config).to(torch_device)
    method.load_checkpoint_state(load_learned(record_path))
    amp = config.get("precision") == "amp" and torch_device.type == "cuda"
    accuracy = evaluate_method(method, [eval_set], amp)[subsample][0]
    return {"dataset": splits.name, "subsample": subsample, "accuracy": accuracy,
            "zero_shot": zero_shot_accuracy(backbone, eval_set, zeroshot_template(splits.name)),
            "record": str(record_path), "num_test": len(labels), "num_classes": len(splits.classnames)}
