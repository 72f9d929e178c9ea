"""κ of the paper's Theorem 1, measured: how much noisier a soft label makes the stochastic gradient than the one-hot
label, at a given context. ``docs/theorem1-kappa.md`` (section From the paper's definitions to what is computed) maps
each of the paper's symbols (∇F, σ², σ̂², κ, the variance factors of Theorem 1 and Lemma 3) to what is computed here.

The per-sample gradients are of exactly the loss a run trains
(:meth:`~atlas_fast.methods.base.PromptMethod.training_loss` of a batch of one, with the schedule's one-hot or soft
cross-entropy as its criterion), all N at once with ``torch.func`` (``vmap`` over ``grad``). σ̂² is centred on the
one-hot ∇F (Lemma 1), not on the soft label's own mean gradient. Which ŷ and θ a soft label stands for:
:func:`smoothing_parts`; ``κ_target`` is the same ratio for the smoothing epoch's actual target ``y_LS``.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from atlas_fast.atlas.criterion import Criterion, LossCriterion
from atlas_fast.atlas.schedules import hard_cross_entropy, soft_cross_entropy

if TYPE_CHECKING:  # the methods sit above the ATLaS layer: κ reads their interface, a type-only import
    from atlas_fast.methods.base import PromptMethod


def variance_factors(kappa: float, theta: float, period: int) -> tuple[float, float]:
    """The σ² multipliers of the two bounds: ATLaS ``1 − θ/K + θκ/K`` (Theorem 1) and vanilla LS ``1 − θ + θκ``."""
    if period < 1:
        raise ValueError(f"ATLaS period K must be >= 1, got {period}")
    return 1.0 - theta / period + theta * kappa / period, 1.0 - theta + theta * kappa


def smoothing_parts(kind: str, theta: float, target_rows: torch.Tensor) -> tuple[float, torch.Tensor]:
    """``(θ, ŷ rows)`` for a soft label whose smoothing-epoch targets are ``target_rows`` (N, C): uniform LS is
    ``(1 − θ) y + θ · 1/C``, so ŷ = 1/C with its θ; CSL, ISL and mix replace the target outright, so θ = 1 and ŷ is
    the target itself."""
    if kind == "ls":
        return theta, torch.full_like(target_rows, 1.0 / target_rows.shape[1])
    return 1.0, target_rows


class _BatchOfOneLoss(nn.Module):
    """The method's training loss of a batch of one item, as a module whose parameters are the method's (names
    prefixed ``method.``), so :func:`torch.func.functional_call` can swap them for the tensors to differentiate."""

    def __init__(self, method: "PromptMethod") -> None:
        super().__init__()
        self.method = method

    def forward(self, feature: torch.Tensor, label: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        return self.method.training_loss(feature.unsqueeze(0), label.unsqueeze(0), criterion).sum()


def _check_method(method: "PromptMethod") -> None:
    if method.reads_pixels:
        raise ValueError(f"κ is measured on cached features; {method.name} trains on pixels.")
    if method.num_runs != 1:
        raise ValueError(f"κ is measured for one run at a time; this {method.name} holds {method.num_runs}.")


def per_sample_gradients(method: "PromptMethod", features: torch.Tensor, labels: torch.Tensor,
                         targets: torch.Tensor | None = None, chunk_size: int | None = 32) -> torch.Tensor:
    """Per-sample gradients (N, P) of the method's training loss with respect to its learned tensors (flattened in
    ``named_parameters`` order), each for one item: features (N, D), labels (N,), and ``targets`` (N, C) soft-label
    rows (the schedule's soft cross-entropy) or None (its one-hot cross-entropy). ``chunk_size`` items share one
    vectorised pass (memory: the text encoder runs once per item in a chunk)."""
    _check_method(method)
    loss_module = _BatchOfOneLoss(method)
    params = {name: p.detach() for name, p in loss_module.named_parameters() if p.requires_grad}
    device = method.device

    def one_hot_loss(params, feature, label):
        criterion = LossCriterion(lambda logits, r: hard_cross_entropy(logits, label.unsqueeze(0)), (1,), device)
        return functional_call(loss_module, params, (feature, label, criterion))

    def soft_loss(params, feature, label, target):
        criterion = LossCriterion(lambda logits, r: soft_cross_entropy(logits, target.unsqueeze(0)), (1,), device)
        return functional_call(loss_module, params, (feature, label, criterion))

    args = [features.to(device).float(), labels.to(device).long()]
    with warnings.catch_warnings():
        # torch has no batched backward of the CPU's fused attention yet and loops over the chunk there (correct)
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        if targets is None:
            grads = vmap(grad(one_hot_loss), in_dims=(None, 0, 0), chunk_size=chunk_size)(params, *args)
        else:
            grads = vmap(grad(soft_loss), in_dims=(None, 0, 0, 0), chunk_size=chunk_size)(
                params, *args, targets.to(device).float())
    return torch.cat([g.reshape(len(labels), -1) for g in grads.values()], dim=1).detach()


def gradient_variance(per_sample: torch.Tensor, full_gradient: torch.Tensor) -> float:
    """``mean_i ‖∇F − g_i‖²`` (float64)."""
    return float(((per_sample.double() - full_gradient.double()) ** 2).sum(dim=1).mean())


@dataclass(frozen=True)
class KappaMeasure:
    """κ of one soft label at one context: the variances, the ratio, and the bounds' variance factors."""

    kind: str
    theta: float  # the θ of y_LS = (1 − θ) y + θ ŷ this soft label stands for
    period: int  # ATLaS's K
    sigma2: float  # one-hot: mean ‖∇F − ∇ℓ(y)‖²
    sigma_hat2: float  # ŷ: mean ‖∇F − ∇ℓ(ŷ)‖²
    kappa: float  # σ̂² / σ²
    kappa_target: float  # mean ‖∇F − ∇ℓ(y_LS)‖² / σ², the smoothing epoch's own target
    atlas_factor: float  # 1 − θ/K + θκ/K
    ls_factor: float  # 1 − θ + θκ

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_kappa(method: "PromptMethod", features: torch.Tensor, labels: torch.Tensor,
                  soft_labels: dict[str, tuple[torch.Tensor, float]], period: int,
                  chunk_size: int | None = 32) -> list[KappaMeasure]:
    """κ of each soft label at the method's current learned tensors, over the items (features (N, D), labels (N,)).
    ``soft_labels`` maps a kind (ls, csl, isl, mix) to ``(target rows (N, C), θ of the preset)``: the rows a
    smoothing epoch trains on. ∇F and σ² come from the one-hot gradients of the same items."""
    one_hot = per_sample_gradients(method, features, labels, None, chunk_size)
    full = one_hot.mean(dim=0)
    sigma2 = gradient_variance(one_hot, full)
    if not sigma2 > 0:
        raise ValueError("The one-hot gradients of these items are all equal (σ² = 0): κ is undefined.")
    measures = []
    for kind, (rows, preset_theta) in soft_labels.items():
        theta, hat_rows = smoothing_parts(kind, preset_theta, rows)
        sigma_hat2 = gradient_variance(per_sample_gradients(method, features, labels, hat_rows, chunk_size), full)
        target2 = (sigma_hat2 if hat_rows is rows else
                   gradient_variance(per_sample_gradients(method, features, labels, rows, chunk_size), full))
        kappa = sigma_hat2 / sigma2
        atlas, ls = variance_factors(kappa, theta, period)
        measures.append(KappaMeasure(kind, theta, period, sigma2, sigma_hat2, kappa, target2 / sigma2, atlas, ls))
    return measures
