"""ATLaS's offline soft labels (paper §3.4, ``docs/protocol.md``), computed once before training and stored.

The four kinds (LS, CSL, ISL and their mix) and the paper's presets are specified in docs/protocol.md (section
Soft labels, with each row's formula).

:func:`compute_soft_labels` returns one row per training item (N, C), so the trainer indexes rows by item, and keeps
them in a small ``.pt`` store keyed by everything they depend on. A stored file carries a BLAKE2b of its rows; one
that is unreadable, fails its checksum or has none is recomputed and replaced, with a warning naming it (the rows
are derived data).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone, encode_class_prompts
from atlas_fast.data.base import DatasetSplits
from atlas_fast.files import atomic_write, blake2b_hex
from atlas_fast.vocabulary import DELTAS as _DELTAS, SOFT_LABEL_KINDS, Delta, SoftLabelKind

STORE_VERSION = 1
# Ranges that keep the soft labels finite in float32: cos / tau_c stays below 1e4 (the paper uses 0.02-0.05; a larger
# tau_c is already uniform), and (p + alpha y) / (1 + alpha) needs a finite alpha (the paper uses 0.1-1).
MIN_TAU_C, MAX_TAU_C = 1e-4, 1e4
MAX_ALPHA = 1e4


@dataclass(frozen=True)
class SoftLabelConfig:
    """Which soft labels and their hyper-parameters (defaults: the paper's base-to-new values, w = 0.3)."""

    kind: SoftLabelKind = "ls"
    theta: float = 0.1
    tau_c: float = 0.05
    alpha: float = 0.1
    delta: Delta = "wrong_only"
    w: float = 0.3
    top_k: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SOFT_LABEL_KINDS:
            raise ValueError(f"SoftLabelConfig.kind must be one of {SOFT_LABEL_KINDS}, got {self.kind!r}")
        if not 0.0 <= self.theta <= 1.0:
            raise ValueError(f"SoftLabelConfig.theta (LS smoothing) must be in [0, 1], got {self.theta}")
        if not self.tau_c > 0.0:
            raise ValueError(f"SoftLabelConfig.tau_c (CSL temperature) must be > 0, got {self.tau_c}")
        if not MIN_TAU_C <= self.tau_c <= MAX_TAU_C:
            raise ValueError(f"SoftLabelConfig.tau_c (CSL temperature) must be in [{MIN_TAU_C:g}, {MAX_TAU_C:g}], got "
                             f"{self.tau_c}")
        if not self.alpha >= 0.0:
            raise ValueError(f"SoftLabelConfig.alpha (ISL rectification) must be >= 0, got {self.alpha}")
        if not self.alpha <= MAX_ALPHA:
            raise ValueError(f"SoftLabelConfig.alpha (ISL rectification) must be in [0, {MAX_ALPHA:g}], got "
                             f"{self.alpha}")
        if self.delta not in _DELTAS:
            raise ValueError(f"SoftLabelConfig.delta must be one of {_DELTAS}, got {self.delta!r}")
        if not 0.0 <= self.w <= 1.0:
            raise ValueError(f"SoftLabelConfig.w (CSL weight of the mix) must be in [0, 1], got {self.w}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"SoftLabelConfig.top_k must be None (all classes) or >= 1, got {self.top_k}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The paper's soft-label hyper-parameters by setting (appendix "Implementation Details"); the ATLaS period K of each
# setting is in atlas_fast.atlas.variants.
ATLAS_PRESETS: dict[str, dict[str, Any]] = {
    "base2new": {"theta": 0.1, "tau_c": 0.05, "alpha": 0.1, "delta": "wrong_only"},
    "few_shot": {"theta": 0.05, "tau_c": 0.02, "alpha": 0.1, "delta": "always"},
    "cross_dataset": {"theta": 0.1, "tau_c": 0.04, "alpha": 1.0, "delta": "wrong_only"},
}


def soft_label_preset(setting: str, kind: SoftLabelKind = "ls", **overrides: Any) -> SoftLabelConfig:
    """The paper's soft-label hyper-parameters for ``setting`` (base2new | few_shot | cross_dataset)."""
    if setting not in ATLAS_PRESETS:
        raise ValueError(f"No ATLaS preset for setting {setting!r}; known: {sorted(ATLAS_PRESETS)}")
    return replace(SoftLabelConfig(kind=kind, **ATLAS_PRESETS[setting]), **overrides)


def uniform_ls(labels: torch.Tensor, num_classes: int, theta: float) -> torch.Tensor:
    """Vanilla label smoothing rows (N, C): ``(1 - theta) * onehot(y) + theta / C``."""
    onehot = F.one_hot(labels.long(), num_classes).float()
    return (1.0 - theta) * onehot + theta / num_classes


def class_soft_labels(text_embeddings: torch.Tensor, tau_c: float, top_k: int | None = None) -> torch.Tensor:
    """CSL matrix (C, C): row c = softmax_j(cos(t_c, t_j) / tau_c), similarities from a faiss ``IndexFlatIP``.

    With ``top_k`` each row keeps only its k most similar classes (itself always among them), the others are 0 and
    the kept entries are renormalised (= the softmax over the kept similarities).
    """
    if text_embeddings.dim() != 2:
        raise ValueError(f"text_embeddings must be (C, D), got {tuple(text_embeddings.shape)}")
    num_classes = text_embeddings.shape[0]
    k = num_classes if top_k is None else min(top_k, num_classes)
    vectors = np.ascontiguousarray(F.normalize(text_embeddings.detach().float(), dim=-1).cpu().numpy())
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    similarities, neighbours = index.search(vectors, k)
    rows = np.arange(num_classes)
    # ties between identical embeddings may leave a class out of its own top-k: put it back in the last slot
    missing_self = ~(neighbours == rows[:, None]).any(axis=1)
    neighbours[missing_self, -1] = rows[missing_self]
    similarities[missing_self, -1] = (vectors[missing_self] ** 2).sum(axis=1)
    weights = torch.softmax(torch.from_numpy(similarities).float() / tau_c, dim=1)
    return torch.zeros(num_classes, num_classes).scatter_(1, torch.from_numpy(neighbours).long(), weights)


def instance_soft_labels(zs_probs: torch.Tensor, labels: torch.Tensor, alpha: float,
                         delta: Delta = "wrong_only") -> torch.Tensor:
    """ISL rows (N, C): ``(p + delta * alpha * y) / (1 + delta * alpha)``; delta = 1 iff argmax p != y
    (``wrong_only``) or for every item (``always``)."""
    if delta not in _DELTAS:
        raise ValueError(f"delta must be one of {_DELTAS}, got {delta!r}")
    probs = zs_probs.float()
    onehot = F.one_hot(labels.long().to(probs.device), probs.shape[1]).to(probs.dtype)
    if delta == "always":
        rectify = torch.ones(probs.shape[0], 1, dtype=probs.dtype, device=probs.device)
    else:
        rectify = (probs.argmax(dim=1) != labels.to(probs.device)).to(probs.dtype).unsqueeze(1)
    return (probs + rectify * alpha * onehot) / (1.0 + rectify * alpha)


def mixed_soft_labels(csl_rows_for_items: torch.Tensor, isl: torch.Tensor, w: float) -> torch.Tensor:
    """``w * CSL + (1 - w) * ISL`` per item (both (N, C))."""
    return w * csl_rows_for_items + (1.0 - w) * isl


@torch.no_grad()
def zero_shot_probabilities(backbone: Backbone, text_embeddings: torch.Tensor,
                            image_features: torch.Tensor) -> torch.Tensor:
    """CLIP's zero-shot probabilities (N, C) = softmax(exp(logit_scale) * f_v f_t^T) with its own logit scale."""
    text = F.normalize(text_embeddings.float(), dim=-1)
    images = F.normalize(image_features.float().to(text.device), dim=-1)
    scale = backbone.model.logit_scale.detach().float().exp().to(text.device)
    return torch.softmax(scale * images @ text.t(), dim=1)


def compute_soft_labels(config: SoftLabelConfig, backbone: Backbone, splits: DatasetSplits,
                        train_features_view0: torch.Tensor, store_dir: str | Path | None = None) -> torch.Tensor:
    """Soft-label rows (N, C), float32 on the CPU, for the items of ``splits.train`` (row i belongs to item i).

    Text embeddings are the backbone's ``encode_text`` of ``splits.prompts()`` (the dataset's ATLaS template);
    ``train_features_view0`` are the cached un-augmented image features (N, D) of the same items in the same order.
    With ``store_dir`` the rows are saved there and reused when config, backbone, class prompts, items and
    features are all the same.
    """
    items = splits.train
    labels = torch.tensor([d.label for d in items], dtype=torch.long)
    num_classes = splits.num_classes
    if train_features_view0.dim() != 2 or train_features_view0.shape[0] != len(items):
        raise ValueError(f"train_features_view0 must be ({len(items)}, D) for the {len(items)} training items of "
                         f"{splits.name}, got {tuple(train_features_view0.shape)}")
    if len(items) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"{splits.name}: training labels must lie in [0, {num_classes - 1}], got "
                         f"[{int(labels.min())}, {int(labels.max())}]")

    path = None
    if store_dir is not None:
        path = Path(store_dir) / f"{config.kind}-{_store_key(config, backbone, splits, train_features_view0)}.pt"
        if path.is_file():
            rows, problem = _read_stored(path, (len(items), num_classes))
            if problem is None:
                return rows
            # a damaged stored file is only a cache: recompute the rows and replace it
            print(f"warning: stored soft labels {path} {problem}; recomputing them.", file=sys.stderr)

    if config.kind == "ls":
        rows = uniform_ls(labels, num_classes, config.theta)
    else:
        text = encode_class_prompts(backbone, splits.prompts())
        if config.kind in ("csl", "mix"):
            csl = class_soft_labels(text, config.tau_c, config.top_k)[labels]
        if config.kind in ("isl", "mix"):
            probs = zero_shot_probabilities(backbone, text, train_features_view0)
            isl = instance_soft_labels(probs, labels, config.alpha, config.delta).cpu()
        if config.kind == "csl":
            rows = csl
        elif config.kind == "isl":
            rows = isl
        else:
            rows = mixed_soft_labels(csl, isl, config.w)
    rows = rows.float().cpu().contiguous()

    if path is not None:
        stored = {"rows": rows, "config": config.to_dict(), "fingerprint": backbone.fingerprint,
                  "rows_blake2b": _rows_digest(rows)}
        try:  # atomic: a concurrent reader never sees half a file, a killed writer's temporary file is cleaned later
            atomic_write(path, lambda f: torch.save(stored, f))
        except OSError:  # a read-only (or full) cache root: the rows are cheap to recompute, so run without storing
            pass
    return rows


def _rows_digest(rows: torch.Tensor) -> str:
    """The checksum stored with the rows: BLAKE2b of their float32 bytes (``torch.load`` checks none)."""
    return blake2b_hex(rows.detach().float().cpu().contiguous().numpy().tobytes())


def _read_stored(path: Path, shape: tuple[int, int]) -> tuple[torch.Tensor | None, str | None]:
    """The stored rows, or None and what is wrong with the file (unreadable, no checksum, other shape, checksum
    mismatch)."""
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, garbage, or pickled code (never executed)
        return None, f"are unreadable ({type(exc).__name__})"
    if not isinstance(stored, dict) or not isinstance(stored.get("rows"), torch.Tensor):
        return None, "are not a soft-label file"
    rows = stored["rows"]
    if "rows_blake2b" not in stored:
        return None, "have no checksum (written by an older atlas_fast)"
    if tuple(rows.shape) != shape or rows.dtype != torch.float32:
        return None, f"hold {rows.dtype} rows of shape {tuple(rows.shape)}, not float32 {shape}"
    if _rows_digest(rows) != stored["rows_blake2b"]:
        return None, "fail their checksum (the file is damaged)"
    return rows, None


def _store_key(config: SoftLabelConfig, backbone: Backbone, splits: DatasetSplits, features: torch.Tensor) -> str:
    """A hash of everything the rows depend on."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(json.dumps({"version": STORE_VERSION, "config": config.to_dict(), "backbone": backbone.fingerprint,
                              "prompts": splits.prompts(), "items": [[d.key, d.label] for d in splits.train]},
                             sort_keys=True).encode())
    if config.kind in ("isl", "mix"):
        digest.update(features.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
