"""What open_clip knows by name: the model configs shipped in ``atlas_fast/model_configs/`` (e.g. ``atlas-tiny``,
registered so they work everywhere an open_clip name does), model names, QuickGELU, pretrained tags and where a
tag's weights are already cached."""

from __future__ import annotations

import os
from pathlib import Path

import open_clip

MODEL_CONFIG_DIR = Path(__file__).parents[1] / "model_configs"

_registered = False


def register_model_configs() -> None:
    """Make the JSON configs in ``atlas_fast/model_configs`` known to open_clip (once per process)."""
    global _registered
    if not _registered and MODEL_CONFIG_DIR.is_dir():
        open_clip.add_model_config(MODEL_CONFIG_DIR)
        _registered = True


class WeightsUnavailableError(OSError):
    """The weights of an open_clip pretrained tag could not be downloaded or found in the local cache (offline)."""


def model_name(name: str) -> str:
    """The open_clip name of a model: ``ViT-B/16`` (CLIP's and CoOp's spelling) is ``ViT-B-16``; a name open_clip
    does not know is refused with the closest known ones."""
    import difflib

    register_model_configs()
    known = open_clip.list_models()
    if name not in known and name.replace("/", "-") in known:
        return name.replace("/", "-")
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `python -c \"import open_clip; print(open_clip.list_models())\"` lists them"
        raise ValueError(f"Unknown model {name!r}: open_clip has no config of that name{hint}")
    return name


def wants_quick_gelu(name: str, tag: str | None) -> bool:
    """OpenAI-trained weights need QuickGELU; random ViT-B/16-shaped models default to OpenAI's architecture too."""
    if tag is not None:
        return bool(open_clip.get_pretrained_cfg(name, tag).get("quick_gelu", False))
    cfg = open_clip.get_model_config(name) or {}
    return bool(cfg.get("quick_gelu", name in ("ViT-B-16", "ViT-B-32", "ViT-L-14", "RN50")))


def cached_weights(name: str, tag: str, hf_cache: str | None = None, url_cache: str | None = None) -> Path | None:
    """The local file that open_clip would load for ``(name, tag)`` if it is already downloaded (Hugging Face cache
    first, as open_clip prefers, then the URL cache ``~/.cache/clip``), else None. Loading that file directly needs
    no network at all, not even the Hub's freshness check."""
    cfg = open_clip.get_pretrained_cfg(name, tag) or {}
    hub = cfg.get("hf_hub", "")
    if hub:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            try_to_load_from_cache = None
        if try_to_load_from_cache is not None:
            repo, filename = os.path.split(hub)
            names = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
            for candidate in names:
                found = try_to_load_from_cache(repo, candidate, cache_dir=hf_cache)
                if isinstance(found, str) and os.path.isfile(found):
                    return Path(found)
    url = cfg.get("url", "")
    if url:
        path = Path(url_cache or os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
        if path.is_file():
            return path
    return None


def check_known_tag(name: str, tag: str) -> None:
    tags = open_clip.list_pretrained_tags_by_model(name)
    if tag not in tags:
        raise ValueError(
            f"Unknown pretrained tag {tag!r} for model {name!r}. Known tags: {sorted(tags) or 'none'}; "
            f"or pass a local checkpoint file path.")


def tokenizer_known(name: str) -> bool:
    try:
        return open_clip.get_model_config(name) is not None
    except Exception:
        return False
