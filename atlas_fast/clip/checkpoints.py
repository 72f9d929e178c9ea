"""Local checkpoint files: OpenAI's JIT/state-dict ``.pt`` (as CoOp users have it; the architecture is read from the
weights, and one that is no known OpenAI shape and not the asked model's is refused), open_clip ``.bin``/``.pt``/
``.safetensors`` checkpoints, and the checkpoints shipped in ``atlas_fast/checkpoints/``; what went wrong with one,
in words a user can act on."""

from __future__ import annotations

from pathlib import Path

import open_clip
import torch
from torch import nn

from atlas_fast.clip.fingerprint import image_size
from atlas_fast.clip.open_clip_names import wants_quick_gelu

CHECKPOINT_DIR = Path(__file__).parents[1] / "checkpoints"


class CheckpointError(ValueError):
    """A local checkpoint file that cannot be loaded for the requested model (names the file and architecture)."""


def load_checkpoint_file(path: Path, name: str) -> tuple[nn.Module, str]:
    """The CLIP in the local file ``path`` and its open_clip name: OpenAI's ``.pt`` (named by its shape), or an
    open_clip checkpoint of model ``name``; CheckpointError when it cannot be loaded as such."""
    try:
        if is_openai_checkpoint(path):
            model = open_clip.load_openai_model(str(path), precision="fp32", device="cpu")
            asked, name = name, _openai_name_for(model, name)
            if name == asked and (held := _other_architecture(model, asked)) is not None:
                raise CheckpointError(
                    f"Cannot load checkpoint {path} as model {_architecture_summary(asked)}: it holds a CLIP of "
                    f"another architecture ({held}). Pass a complete CLIP checkpoint (OpenAI .pt, open_clip "
                    f".bin/.pt/.safetensors) and the --model it was trained as.")
        else:
            model = open_clip.create_model(name, pretrained=str(path), force_quick_gelu=wants_quick_gelu(name, None))
    except CheckpointError:
        raise
    except Exception as exc:  # torch, safetensors and open_clip raise many types for a bad file
        raise CheckpointError(_checkpoint_message(path, name, exc)) from exc
    return model, name


def shipped_checkpoint(name: str) -> Path | None:
    for suffix in ("", ".pt", ".safetensors", ".bin"):
        path = CHECKPOINT_DIR / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def is_openai_checkpoint(path: Path) -> bool:
    """OpenAI's released ``.pt`` files are TorchScript archives; a plain OpenAI state dict has no ``visual.``-less
    open_clip wrapper either, so we treat ``.pt`` files that open as TorchScript, or whose keys are OpenAI's, as
    OpenAI checkpoints."""
    if path.suffix != ".pt":
        return False
    try:
        torch.jit.load(str(path), map_location="cpu")
        return True
    except Exception:  # not TorchScript: inspect the state dict
        pass
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception:
        return False
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    keys = set(state) if isinstance(state, dict) else set()
    return "visual.proj" in keys and "text_projection" in keys and "visual.transformer.resblocks.0.attn.in_proj_weight" in keys


def _architecture_summary(name: str) -> str:
    """E.g. ``ViT-B-16 (embed 512; vision width 768, 12 layers, patch 16, 224 px; text width 512, 12 layers)``."""
    try:
        cfg = open_clip.get_model_config(name) or {}
    except Exception:
        cfg = {}
    vision, text = cfg.get("vision_cfg", {}), cfg.get("text_cfg", {})
    if not cfg:
        return repr(name)
    return (f"{name!r} (embed {cfg.get('embed_dim')}; vision width {vision.get('width')}, {vision.get('layers')} "
            f"layers, patch {vision.get('patch_size')}, {vision.get('image_size')} px; text width "
            f"{text.get('width')}, {text.get('layers')} layers)")


def _checkpoint_message(path: Path, name: str, exc: BaseException) -> str:
    """What went wrong with a checkpoint, in words a user can act on; never torch's advice to unpickle unsafely."""
    text = str(exc)
    kind = type(exc).__name__
    if "weights_only" in text or kind == "UnpicklingError":
        reason = ("it is not a checkpoint of tensors (not a PyTorch/TorchScript archive, or one holding pickled code, "
                  "which is never executed)")
    elif kind == "SafetensorError":
        reason = f"it is not a valid safetensors file ({text.splitlines()[0][:160]})"
    elif isinstance(exc, (EOFError, OSError)) or "PytorchStreamReader" in text or "zip archive" in text:
        reason = "the file is truncated or damaged"
    elif isinstance(exc, (AssertionError, KeyError)) or "size mismatch" in text or "Missing key" in text \
            or "Unexpected key" in text:
        reason = f"its weights do not fit this architecture ({kind}: {text.splitlines()[0][:160] if text else ''})"
    else:
        reason = f"{kind}: {text.splitlines()[0][:200] if text else ''}"
    return (f"Cannot load checkpoint {path} as model {_architecture_summary(name)}: {reason}. Pass a complete CLIP "
            f"checkpoint (OpenAI .pt, open_clip .bin/.pt/.safetensors) and the --model it was trained as.")


def _openai_name_for(model: nn.Module, fallback: str) -> str:
    """Name an OpenAI checkpoint by its shape (ViT-B-16 for the 768-wide, patch-16 vision tower)."""
    visual = model.visual
    conv = getattr(visual, "conv1", None)
    if conv is None:
        return fallback
    width, patch = conv.weight.shape[0], conv.weight.shape[-1]
    known = {(768, 16): "ViT-B-16", (768, 32): "ViT-B-32", (1024, 14): "ViT-L-14"}
    return known.get((int(width), int(patch)), fallback)



def _other_architecture(model: nn.Module, name: str) -> str | None:
    """The shape of ``model`` (an OpenAI-layout file's CLIP, built from its weights) in the words of
    :func:`_architecture_summary` when it is not open_clip's config ``name`` (embedding, towers' widths and depths,
    patch, image size; a ResNet tower's width is not compared); None when it is, or ``name`` has no config."""
    try:
        cfg = open_clip.get_model_config(name) or {}
    except Exception:
        cfg = {}
    if not cfg:
        return None
    vision, text = cfg.get("vision_cfg", {}), cfg.get("text_cfg", {})
    conv = getattr(model.visual, "conv1", None)
    vit = type(model.visual).__name__ == "VisionTransformer" and conv is not None
    held = {"embed": int(model.text_projection.shape[1]), "text width": int(model.token_embedding.weight.shape[1]),
            "text layers": len(model.transformer.resblocks), "px": image_size(model)}
    wanted = {"embed": cfg.get("embed_dim"), "text width": text.get("width"), "text layers": text.get("layers"),
              "px": vision.get("image_size")}
    if vit:
        held.update({"vision width": int(conv.weight.shape[0]), "vision layers": len(model.visual.transformer.resblocks),
                     "patch": int(conv.weight.shape[-1])})
        wanted.update({"vision width": vision.get("width"), "vision layers": vision.get("layers"),
                       "patch": vision.get("patch_size")})
    if all(wanted[key] is None or wanted[key] == value for key, value in held.items()):
        return None
    tower = (f"vision width {held['vision width']}, {held['vision layers']} layers, patch {held['patch']}, "
             if vit else "")
    return (f"embed {held['embed']}; {tower}{held['px']} px; text width {held['text width']}, "
            f"{held['text layers']} layers")
