"""Calibration of a classifier's predictions: top-1 ECE, NLL, Brier score and mean confidence, and temperature
scaling.

Every figure is computed from the logits the softmax is taken of (a method's own scaled logits, ``exp(logit_scale) *
cos``) and the labels, per image first (:func:`per_image_scores`: the top-1 confidence, whether the top-1 class is
the label, the negative log-likelihood of the label and the Brier score), then reduced over the split
(:func:`summarise`). An evaluation streams its logits chunk by chunk and keeps only the per-image values, so the
figures of a record and those of :func:`calibration_metrics` on the whole split's logits are the same numbers.
Each figure's definition (ECE over :data:`CALIBRATION_BINS` = 15 equal-width bins, in percent; NLL in nats; the
multi-class Brier score; mean confidence in percent; temperature scaling by :func:`fit_temperature` on the run's
few-shot validation split) is in docs/experiments.md, section Calibration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

CALIBRATION_BINS = 15
# The figures of a class set in ``record["metrics"]["calibration"][set]``, in the order tables list them (beside
# them ``temperature``, ``ece_ts`` and ``nll_ts`` where the run has a validation split distinct from its test split).
SCORES = ("ece", "nll", "brier", "confidence")
# The search range of the temperature (Newton's method on 1/T, within this bracket): the method's own
# logit scale sharpened or flattened up to ten times. A fitted T on a bound says the validation split could not pin it
# (e.g. every one of its images right: the NLL then falls as T falls).
TEMPERATURE_RANGE = (0.1, 10.0)


@dataclass
class PerImage:
    """Per-image values of logits (..., N, C): top-1 confidence, hit (top-1 == label), NLL and Brier, float64."""

    confidence: torch.Tensor
    hit: torch.Tensor
    nll: torch.Tensor
    brier: torch.Tensor

    @staticmethod
    def cat(parts: Sequence["PerImage"], dim: int = -1) -> "PerImage":
        return PerImage(*(torch.cat([getattr(p, f) for p in parts], dim=dim)
                          for f in ("confidence", "hit", "nll", "brier")))


def scaled(logits: torch.Tensor, temperature: float | torch.Tensor | None) -> torch.Tensor:
    """``logits / temperature`` in the logits' dtype (unchanged for None); the one place logits are rescaled, so a
    record's figures after temperature scaling are reproduced from its saved logits and temperature."""
    if temperature is None:
        return logits
    if isinstance(temperature, torch.Tensor):
        t = temperature.to(dtype=logits.dtype, device=logits.device)
    else:  # a fill on the logits' device, not a copy from the host
        t = torch.full((), temperature, dtype=logits.dtype, device=logits.device)
    return logits / (t.reshape(*t.shape, *([1] * (logits.dim() - t.dim()))) if t.dim() else t)


def per_image_scores(logits: torch.Tensor, labels: torch.Tensor) -> PerImage:
    """Per-image values (..., N) of logits (..., N, C) and labels (N,): each row on its own, so chunks of a split give
    exactly the values of the whole split. One pass of exponentials, in float32 (or the logits' wider dtype): with
    m the row's largest logit, e = exp(z - m) and s = sum e, the top-1 probability is 1/s, the NLL log s - (z_y - m)
    and the Brier score sum e^2 / s^2 - 2 e_y / s + 1."""
    if logits.shape[-2] != labels.shape[0]:
        raise ValueError(f"{logits.shape[-2]} rows of logits but {labels.shape[0]} labels")
    logits = logits if logits.dtype == torch.float64 else logits.float()
    labels = labels.to(logits.device, torch.long)
    top_value, top = logits.max(dim=-1, keepdim=True)
    e = torch.exp(logits - top_value)
    s = e.sum(dim=-1)
    s2 = (e * e).sum(dim=-1)
    index = labels.expand(*logits.shape[:-1]).unsqueeze(-1)
    z_label = (logits.gather(-1, index) - top_value).squeeze(-1)
    s, s2, z_label = s.double(), s2.double(), z_label.double()
    p_label = torch.exp(z_label) / s
    confidence = 1.0 / s
    nll = torch.log(s) - z_label
    brier = s2 / (s * s) - 2.0 * p_label + 1.0
    return PerImage(confidence.cpu(), (top.squeeze(-1) == labels).cpu(), nll.cpu(), brier.cpu())


def reliability_bins(confidence: torch.Tensor, hit: torch.Tensor, bins: int = CALIBRATION_BINS
                     ) -> dict[str, torch.Tensor]:
    """Per bin (..., bins): the image ``count``, the ``correct`` top-1 predictions and the ``confidence_sum``; bin b
    holds ``b/bins < confidence <= (b+1)/bins``."""
    edges = torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64)
    index = torch.bucketize(confidence.double(), edges[1:-1], right=False)
    shape = (*confidence.shape[:-1], bins)
    count = torch.zeros(shape, dtype=torch.float64).scatter_add_(-1, index, torch.ones_like(confidence.double()))
    correct = torch.zeros(shape, dtype=torch.float64).scatter_add_(-1, index, hit.double())
    confidence_sum = torch.zeros(shape, dtype=torch.float64).scatter_add_(-1, index, confidence.double())
    return {"count": count, "correct": correct, "confidence_sum": confidence_sum}


def summarise(scores: PerImage, bins: int = CALIBRATION_BINS) -> dict[str, Any]:
    """The figures of one run's per-image values (N,): ``ece`` (percent), ``nll``, ``brier``, ``confidence``
    (percent) and ``accuracy`` (percent), and its ``bins`` (counts, correct, confidence sums, as lists)."""
    if scores.confidence.dim() != 1:
        raise ValueError(f"summarise takes one run's per-image values (N,), not {tuple(scores.confidence.shape)}")
    n = scores.confidence.shape[0]
    if n == 0:
        raise ValueError("no images to compute calibration over")
    table = reliability_bins(scores.confidence, scores.hit, bins)
    ece = (table["correct"] - table["confidence_sum"]).abs().sum().item() / n
    return {"ece": 100.0 * ece, "nll": scores.nll.mean().item(), "brier": scores.brier.mean().item(),
            "confidence": 100.0 * scores.confidence.mean().item(),
            "accuracy": 100.0 * scores.hit.double().mean().item(),
            "bins": {"count": [int(c) for c in table["count"].tolist()], "correct": [int(c) for c in
                                                                                      table["correct"].tolist()],
                     "confidence_sum": table["confidence_sum"].tolist()}}


def calibration_metrics(logits: Any, labels: Any, temperature: float | None = None, bins: int = CALIBRATION_BINS
                        ) -> dict[str, Any]:
    """ECE (percent, ``bins`` equal-width bins), NLL (nats), Brier, mean confidence and accuracy (percent) of logits
    (N, C) and labels (N,) (tensors or arrays), after dividing the logits by ``temperature`` when given; with the
    reliability table under ``bins``. A record's figures are reproduced from its saved predictions by this function
    (with the record's temperature, ``ece_ts`` / ``nll_ts``)."""
    logits, labels = torch.as_tensor(logits), torch.as_tensor(labels)
    if logits.dim() != 2:
        raise ValueError(f"calibration_metrics takes logits of shape (N, C), not {tuple(logits.shape)}")
    return summarise(per_image_scores(scaled(logits, temperature), labels), bins)


def fit_temperature(logits: Any, labels: Any) -> float:
    """The temperature T minimising the NLL of ``logits / T`` (N, C) on ``labels`` (held-out images, never the test
    split), within :data:`TEMPERATURE_RANGE`. The NLL is convex in b = 1/T, with derivative mean(E_p[z] - z_y) and
    second derivative mean(Var_p(z)), so Newton's method on b, kept inside a bracket that bisects whenever a step
    would leave it, finds the minimum in a few passes over the logits (float64, deterministic)."""
    logits = torch.as_tensor(logits).double().cpu()
    labels = torch.as_tensor(labels).long().cpu()
    if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"fit_temperature needs logits (N, C) with N >= 1 and N labels, not "
                         f"{tuple(logits.shape)} and {tuple(labels.shape)}")
    z_label = logits.gather(1, labels[:, None]).squeeze(1)

    def slope(b: float) -> tuple[float, float]:
        p = torch.softmax(logits * b, dim=1)
        mean = (p * logits).sum(dim=1)
        variance = (p * logits * logits).sum(dim=1) - mean * mean
        return (mean - z_label).mean().item(), variance.clamp_min(0).mean().item()

    low, high = 1.0 / TEMPERATURE_RANGE[1], 1.0 / TEMPERATURE_RANGE[0]
    g_low, _ = slope(low)
    if g_low >= 0:  # the NLL rises from the smallest b on: the largest T
        return TEMPERATURE_RANGE[1]
    g_high, _ = slope(high)
    if g_high <= 0:  # still falling at the largest b: the smallest T
        return TEMPERATURE_RANGE[0]
    b = min(max(1.0, low), high)
    for _ in range(100):
        g, h = slope(b)
        if g > 0:
            high = b
        else:
            low = b
        step = b - g / h if h > 0 else math.nan
        b_next = step if low < step < high else (low + high) / 2.0
        if abs(b_next - b) <= 1e-12 * b or high - low <= 1e-12 * high:
            b = b_next
            break
        b = b_next
    return 1.0 / b


def record_figures(summary: dict[str, Any], scaled_summary: dict[str, Any] | None = None,
                   temperature: float | None = None) -> dict[str, float]:
    """A class set's entry of ``record["metrics"]["calibration"]``: :data:`SCORES` of ``summary`` and, with a
    temperature, ``temperature``, ``ece_ts`` and ``nll_ts`` (the ECE and NLL of ``scaled_summary``, the logits
    divided by it)."""
    out = {name: summary[name] for name in SCORES}
    if temperature is not None and scaled_summary is not None:
        out.update(temperature=temperature, ece_ts=scaled_summary["ece"], nll_ts=scaled_summary["nll"])
    return out
