"""Frozen CLIP backbones through open_clip, identified by a fingerprint.

A backbone is named by a :class:`BackboneConfig`:

* ``model="ViT-B-16", pretrained="openai"`` -- an open_clip model name with a pretrained tag, downloaded on the
  user's machine the way open_clip does it (QuickGELU is switched on when the tag needs it, as OpenAI's CLIP has it);
* ``pretrained="/path/to/ViT-B-16.pt"`` -- a local file: OpenAI's JIT/state-dict ``.pt`` (as CoOp users have it,
  the architecture is read from the weights; one that is no known OpenAI shape and not ``model``'s is refused) or
  an open_clip ``.bin``/``.pt``/``.safetensors`` checkpoint for ``model``;
* ``pretrained=None`` -- random weights from the model's config, seeded by ``init_seed`` (tests, benchmarks).

Model configs shipped in ``atlas_fast/model_configs/`` (e.g. ``atlas-tiny``) are registered with open_clip, so they
work everywhere an open_clip name does. The :attr:`Backbone.fingerprint` (architecture + a hash of the weights)
keys caches and result records: features made with other weights are never mistaken for these.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

import open_clip

# Preprocessing and OpenAI's mean/std live with the transforms (imports run transforms <- backbones); they are
# importable from here as before.
from atlas_fast.clip.transforms import OPENAI_MEAN, OPENAI_STD, Preprocessing, TransformSpec
from atlas_fast.clip.weights_files import missing_weights_message, random_weights
from atlas_fast.progress import progress_bar

MODEL_CONFIG_DIR = Path(__file__).parents[1] / "model_configs"
CHECKPOINT_DIR = Path(__file__).parents[1] / "checkpoints"

_registered = False


class _RandomInitNotice(logging.Filter):
    """open_clip warns on the root logger when it builds a model without weights; for ``pretrained=None`` that is
    what was asked for, so that one warning is dropped while such a model is created (any other message passes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("No pretrained weights loaded")


def _create_random_model(name: str) -> nn.Module:
    notice = _RandomInitNotice()
    logging.getLogger().addFilter(notice)
    try:
        return open_clip.create_model(name, pretrained=None, force_quick_gelu=_wants_quick_gelu(name, None))
    finally:
        logging.getLogger().removeFilter(notice)


def _register_model_configs() -> None:
    """Make the JSON configs in ``atlas_fast/model_configs`` known to open_clip (once per process)."""
    global _registered
    if not _registered and MODEL_CONFIG_DIR.is_dir():
        open_clip.add_model_config(MODEL_CONFIG_DIR)
        _registered = True


@dataclass(frozen=True)
class BackboneConfig:
    """Which CLIP to load. ``pretrained``: an open_clip tag, a local file path, a shipped checkpoint name, or None
    for random weights (``"none"``, as the command line's ``--pretrained none``, means None here too)."""

    model: str = "ViT-B-16"
    pretrained: str | None = "openai"
    init_seed: int = 0

    def __post_init__(self) -> None:
        if self.pretrained is not None and random_weights(self.pretrained):
            object.__setattr__(self, "pretrained", None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Backbone:
    """A frozen open_clip CLIP model with its tokenizer, preprocessing, image transforms and fingerprint.

    ``transform`` (the test view and the seeded augmentations, :mod:`atlas_fast.clip.transforms`, at augmentation
    seed 0) is derived from ``preprocessing`` once, when the backbone is made, and read from here by the feature
    cache and the pixel path alike, as open_clip's ``create_model_and_transforms`` hands its transforms out with the
    model."""

    model: nn.Module
    tokenizer: Callable[..., torch.Tensor]
    preprocessing: Preprocessing
    config: BackboneConfig
    architecture: dict[str, Any]
    fingerprint: str = field(default="")
    transform: TransformSpec = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.transform = TransformSpec.from_preprocessing(self.preprocessing)

    def transform_for(self, aug_seed: int = 0) -> TransformSpec:
        """:attr:`transform` with the augmentation seed ``aug_seed`` (which seeds views 1.. only)."""
        return self.transform if aug_seed == self.transform.aug_seed else replace(self.transform, aug_seed=aug_seed)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def embed_dim(self) -> int:
        proj = self.model.text_projection
        return proj.out_features if isinstance(proj, nn.Linear) else proj.shape[1]

    @property
    def context_length(self) -> int:
        return int(self.model.positional_embedding.shape[0])

    def to(self, device: str | torch.device) -> "Backbone":
        self.model.to(device)
        return self

    @torch.no_grad()
    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """Un-normalised image features (B, D) for preprocessed pixels (B, 3, H, W)."""
        return self.model.encode_image(pixels)

    def tokenize(self, texts: Sequence[str], labels: Sequence[str] | None = None) -> torch.Tensor:
        """Token ids (N, context_length) of ``texts``, on the CPU.

        A text longer than the text tower's context is refused: open_clip's tokenizer would cut it silently, and
        two long class names that differ only after the cut would then be encoded identically. The ValueError
        names the text and, given ``labels`` (one per text, e.g. the class names), its label.
        """
        texts = list(texts)
        length = self.context_length
        # One spare position: a text fits iff that position is still padding (as it is for the empty string).
        ids = self.tokenizer(texts, context_length=length + 1)
        padding = self.tokenizer([""], context_length=length + 1)[0, length]
        cut = (ids[:, length] != padding).nonzero().flatten().tolist()
        if cut:
            i = cut[0]
            def quote(text: str) -> str:  # a huge name is quoted by its ends: the error stays one short line
                return repr(text) if len(text) <= 100 else f"{text[:60]!r}...{text[-20:]!r} ({len(text)} characters)"

            what = (f"class {quote(labels[i])}: its prompt {quote(texts[i])}" if labels is not None
                    else f"the text {quote(texts[i])}")
            others = f" ({len(cut) - 1} more texts are too long as well)" if len(cut) > 1 else ""
            raise ValueError(f"{what} does not fit the text tower's context of {length} tokens{others}; the "
                             f"tokenizer would cut it silently (two long names could then be encoded identically). "
                             f"Shorten the class name or the prompt.")
        return ids[:, :length]

    @torch.no_grad()
    def encode_text(self, texts: list[str]) -> torch.Tensor:
        """Un-normalised text features (N, D) for raw strings, exactly as CLIP's ``encode_text`` (texts that do not
        fit the context are refused, see :meth:`tokenize`)."""
        tokens = self.tokenize(texts).to(self.device)
        return self.model.encode_text(tokens)

    def describe(self) -> str:
        return f"{self.config.model} ({self.config.pretrained or 'random init'}) [{self.fingerprint[:12]}]"


@torch.no_grad()
def encode_class_prompts(backbone: Backbone, prompts: list[str], batch_size: int = 256,
                         progress: bool = False) -> torch.Tensor:
    """Un-normalised text features (C, D) of hand-crafted class prompts, in batches (:meth:`Backbone.encode_text`
    of each batch): the soft labels' class texts, PromptSRC's frozen teacher prompts, the pricing's text unit."""
    chunks = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    return torch.cat([backbone.encode_text(chunk).float()
                      for chunk in progress_bar(chunks, desc="soft labels: text", enabled=progress)])


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


def _architecture_of(model: nn.Module, name: str) -> dict[str, Any]:
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
        "image_size": _image_size(model),
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


def _image_size(model: nn.Module) -> int:
    size = getattr(model.visual, "image_size", None)
    if size is None:
        size = getattr(model.visual, "input_resolution", 224)
    if isinstance(size, (tuple, list)):
        size = size[0]
    return int(size)


def _shipped_checkpoint(name: str) -> Path | None:
    for suffix in ("", ".pt", ".safetensors", ".bin"):
        path = CHECKPOINT_DIR / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def _is_openai_checkpoint(path: Path) -> bool:
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


def load_backbone(config: BackboneConfig, device: str | torch.device = "cpu") -> Backbone:
    """Load a frozen CLIP in fp32 (mixed precision is applied by the caller with autocast) and fingerprint it."""
    _register_model_configs()
    pretrained = _expand(config.pretrained)
    name = model_name(config.model)
    if pretrained is not None and not os.path.isfile(pretrained) and _shipped_checkpoint(pretrained) is not None:
        pretrained = str(_shipped_checkpoint(pretrained))

    if pretrained is None:
        with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
            torch.manual_seed(config.init_seed)
            model = _create_random_model(name)
    elif os.path.isfile(pretrained):
        path = Path(pretrained)
        try:
            if _is_openai_checkpoint(path):
                model = open_clip.load_openai_model(str(path), precision="fp32", device="cpu")
                asked, name = name, _openai_name_for(model, name)
                if name == asked and (held := _other_architecture(model, asked)) is not None:
                    raise CheckpointError(
                        f"Cannot load checkpoint {path} as model {_architecture_summary(asked)}: it holds a CLIP of "
                        f"another architecture ({held}). Pass a complete CLIP checkpoint (OpenAI .pt, open_clip "
                        f".bin/.pt/.safetensors) and the --model it was trained as.")
            else:
                model = open_clip.create_model(name, pretrained=str(path),
                                               force_quick_gelu=_wants_quick_gelu(name, None))
        except CheckpointError:
            raise
        except Exception as exc:  # torch, safetensors and open_clip raise many types for a bad file
            raise CheckpointError(_checkpoint_message(path, name, exc)) from exc
    elif (missing := missing_weights_message(pretrained, "checkpoint file")) is not None:
        raise FileNotFoundError(missing)
    else:
        _check_known_tag(name, pretrained)
        local = cached_weights(name, pretrained)
        if local is None and not downloads_allowed():
            raise WeightsUnavailableError(
                f"The weights of {name!r} with pretrained tag {pretrained!r} are not on this machine (looked in the "
                f"Hugging Face cache and ~/.cache/clip), and atlas_fast downloads nothing unless asked: add "
                f"--download (Python: set {DOWNLOAD_VARIABLE}=1) to fetch them once, or pass a local file, e.g. "
                f"--pretrained ~/.cache/clip/ViT-B-16.pt (OpenAI's file, as CoOp users have it).")
        try:
            if local is not None and _is_openai_checkpoint(local):  # OpenAI's own file, from the URL cache
                model = open_clip.load_openai_model(str(local), precision="fp32", device="cpu")
            else:
                model = open_clip.create_model(name, pretrained=str(local) if local is not None else pretrained,
                                               force_quick_gelu=_wants_quick_gelu(name, pretrained))
        except Exception as exc:  # network failures surface as many exception types
            raise WeightsUnavailableError(
                f"Could not obtain the weights of {name!r} with pretrained tag {pretrained!r} ({type(exc).__name__}: "
                f"{exc}). Without network access, pass a local checkpoint file instead, e.g. "
                f"`--pretrained /path/to/ViT-B-16.pt` (OpenAI's file, as CoOp users have it in ~/.cache/clip) or "
                f"`--pretrained /path/to/open_clip_model.safetensors` with `--model {name}`.") from exc

    model = model.float().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    image_size = _image_size(model)
    mean = tuple(getattr(model.visual, "image_mean", None) or OPENAI_MEAN)
    std = tuple(getattr(model.visual, "image_std", None) or OPENAI_STD)
    preprocessing = Preprocessing(image_size=image_size, mean=mean, std=std, interpolation="bicubic")
    architecture = _architecture_of(model, name)
    fingerprint = hashlib.blake2b(
        (json.dumps(architecture, sort_keys=True) + weights_hash(model)).encode(), digest_size=16).hexdigest()
    backbone = Backbone(model=model, tokenizer=open_clip.get_tokenizer(name) if _tokenizer_known(name)
                        else open_clip.get_tokenizer("ViT-B-16"),
                        preprocessing=preprocessing, config=config, architecture=architecture, fingerprint=fingerprint)
    return backbone.to(device)


class WeightsUnavailableError(OSError):
    """The weights of an open_clip pretrained tag could not be downloaded or found in the local cache (offline)."""


class CheckpointError(ValueError):
    """A local checkpoint file that cannot be loaded for the requested model (names the file and architecture)."""


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


def model_name(name: str) -> str:
    """The open_clip name of a model: ``ViT-B/16`` (CLIP's and CoOp's spelling) is ``ViT-B-16``; a name open_clip
    does not know is refused with the closest known ones."""
    import difflib

    _register_model_configs()
    known = open_clip.list_models()
    if name not in known and name.replace("/", "-") in known:
        return name.replace("/", "-")
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `python -c \"import open_clip; print(open_clip.list_models())\"` lists them"
        raise ValueError(f"Unknown model {name!r}: open_clip has no config of that name{hint}")
    return name


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


def _expand(pretrained: str | None) -> str | None:
    """``~/.cache/clip/ViT-B-16.pt`` from Python works like it does from a shell (tags have no ``~``)."""
    return None if pretrained is None else os.path.expanduser(pretrained)


def _wants_quick_gelu(name: str, tag: str | None) -> bool:
    """OpenAI-trained weights need QuickGELU; random ViT-B/16-shaped models default to OpenAI's architecture too."""
    if tag is not None:
        return bool(open_clip.get_pretrained_cfg(name, tag).get("quick_gelu", False))
    cfg = open_clip.get_model_config(name) or {}
    return bool(cfg.get("quick_gelu", name in ("ViT-B-16", "ViT-B-32", "ViT-L-14", "RN50")))


DOWNLOAD_VARIABLE = "ATLAS_FAST_DOWNLOAD"


def downloads_allowed() -> bool:
    """Whether a pretrained tag whose weights are not cached may be downloaded (``--download`` sets this)."""
    return os.environ.get(DOWNLOAD_VARIABLE, "").lower() in ("1", "true", "yes")


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


def _check_known_tag(name: str, tag: str) -> None:
    tags = open_clip.list_pretrained_tags_by_model(name)
    if tag not in tags:
        raise ValueError(
            f"Unknown pretrained tag {tag!r} for model {name!r}. Known tags: {sorted(tags) or 'none'}; "
            f"or pass a local checkpoint file path.")


def _tokenizer_known(name: str) -> bool:
    try:
        return open_clip.get_model_config(name) is not None
    except Exception:
        return False


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
            "text layers": len(model.transformer.resblocks), "px": _image_size(model)}
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


_SHARED: dict[tuple, Backbone] = {}
_SHARED_MAX = 2


def shared_backbone(config: BackboneConfig, device: str | torch.device = "cpu") -> Backbone:
    """:func:`load_backbone`, memoised within the process: a sweep of many runs (or a cross-dataset evaluation of many
    records) loads and fingerprints the weights once. Keyed by the config, the device and, for a local checkpoint,
    the file's identity and size, modification and change times, so an edited file is loaded afresh (the change
    time moves on every write, even one that restores the size and the modification time). Holds at most two
    backbones."""
    file_state = None
    pretrained = _expand(config.pretrained)
    if pretrained is not None and os.path.isfile(pretrained):
        stat = os.stat(pretrained)
        file_state = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    key = (config, str(torch.device(device)), file_state)
    if key not in _SHARED:
        while len(_SHARED) >= _SHARED_MAX:
            _SHARED.pop(next(iter(_SHARED)))
        _SHARED[key] = load_backbone(config, device)
    return _SHARED[key].to(device)
