"""A backbone's fingerprint: its architecture in a few numbers and a hash of its weights. It keys feature caches and
result records, so features made with other weights are never mistaken for these."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from torch import nn


def weights_hash(model: nn.Module) -> str:
    """A stable hash of every parameter and buffer (name, dtype, shape, bytes) in fp32 on the CPU."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu")
        if t.is_floating_point():
            t = t.float()
        digest.update(name.encode())
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()


def architecture_of(model: nn.Module, name: str) -> dict[str, Any]:
    """A compact description of the model's shape, enough to tell architectures apart."""
    visual = model.visual
    act = "unknown"
    for module in model.modules():
        cls = type(module).__name__
        if cls in ("QuickGELU", "GELU"):
            act = cls
            break
    return {
        "name": name,
        "image_size": image_size(model),
        "embed_dim": int(model.text_projection.shape[1]) if not isinstance(model.text_projection, nn.Linear)
        else int(model.text_projection.out_features),
        "text_width": int(model.token_embedding.weight.shape[1]),
        "text_layers": len(model.transformer.resblocks),
        "context_length": int(model.positional_embedding.shape[0]),
        "vision": type(visual).__name__,
        "vision_layers": len(getattr(getattr(visual, "transformer", None), "resblocks", [])),
        "activation": act,
        "n_params": int(sum(p.numel() for p in model.parameters())),
    }


def image_size(model: nn.Module) -> int:
    size = getattr(model.visual, "image_size", None)
    if size is None:
        size = getattr(model.visual, "input_resolution", 224)
    if isinstance(size, (tuple, list)):
        size = size[0]
    return int(size)


def model_fingerprint(model: nn.Module, name: str) -> tuple[dict[str, Any], str]:
    """(architecture, fingerprint) of a loaded model named ``name``: what :class:`~atlas_fast.clip.backbones.Backbone`
    carries."""
    architecture = architecture_of(model, name)
    return architecture, hashlib.blake2b(
        (json.dumps(architecture, sort_keys=True) + weights_hash(model)).encode(), digest_size=16).hexdigest()
