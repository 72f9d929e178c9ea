"""Frozen CLIP backbones through open_clip: what a :class:`Backbone` is and the two ways to get one
(:func:`load_backbone`, :func:`shared_backbone`).

A backbone is named by a :class:`BackboneConfig`: an open_clip model name with a pretrained tag, downloaded the way
open_clip does it (QuickGELU switched on when the tag needs it, :mod:`~atlas_fast.clip.open_clip_names`); a local
file, OpenAI's ``.pt`` or an open_clip checkpoint (:mod:`~atlas_fast.clip.checkpoints`); or None, random weights
seeded by ``init_seed`` (tests, benchmarks).

The :attr:`Backbone.fingerprint` (:mod:`~atlas_fast.clip.fingerprint`) keys caches and result records.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

import open_clip

from atlas_fast.clip.checkpoints import is_openai_checkpoint, load_checkpoint_file, shipped_checkpoint
from atlas_fast.clip.fingerprint import image_size, model_fingerprint
from atlas_fast.clip.open_clip_names import (WeightsUnavailableError, cached_weights, check_known_tag, model_name,
                                             register_model_configs, tokenizer_known, wants_quick_gelu)
from atlas_fast.clip.transforms import OPENAI_MEAN, OPENAI_STD, Preprocessing, TransformSpec
from atlas_fast.clip.weights_files import DOWNLOAD_VARIABLE, downloads_allowed, missing_weights_message, random_weights


class _RandomInitNotice(logging.Filter):
    """open_clip warns on the root logger when it builds a model without weights; for ``pretrained=None`` that is
    what was asked for, so that one warning is dropped while such a model is created (any other message passes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("No pretrained weights loaded")


def _create_random_model(name: str) -> nn.Module:
    notice = _RandomInitNotice()
    logging.getLogger().addFilter(notice)
    try:
        return open_clip.create_model(name, pretrained=None, force_quick_gelu=wants_quick_gelu(name, None))
    finally:
        logging.getLogger().removeFilter(notice)


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

    ``transform`` (the test view and the seeded augmentations at augmentation seed 0) is derived from
    ``preprocessing`` once, and read from here by the feature cache and the pixel path alike."""

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

        A text longer than the text tower's context is a ValueError naming it and, given ``labels`` (one per text),
        its label: open_clip's tokenizer would cut it silently, so two long names could be encoded identically.
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
def encode_class_prompts(backbone: Backbone, prompts: list[str], batch_size: int = 256) -> torch.Tensor:
    """Un-normalised text features (C, D) of hand-crafted class prompts, in batches (:meth:`Backbone.encode_text`
    of each batch): the soft labels' class texts, PromptSRC's frozen teacher prompts, the pricing's text unit."""
    chunks = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    return torch.cat([backbone.encode_text(chunk).float() for chunk in chunks])



def load_backbone(config: BackboneConfig, device: str | torch.device = "cpu") -> Backbone:
    """Load a frozen CLIP in fp32 (mixed precision is applied by the caller with autocast) and fingerprint it."""
    register_model_configs()
    pretrained = _expand(config.pretrained)
    name = model_name(config.model)
    if pretrained is not None and not os.path.isfile(pretrained) and shipped_checkpoint(pretrained) is not None:
        pretrained = str(shipped_checkpoint(pretrained))

    if pretrained is None:
        with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
            torch.manual_seed(config.init_seed)
            model = _create_random_model(name)
    elif os.path.isfile(pretrained):
        model, name = load_checkpoint_file(Path(pretrained), name)
    elif (missing := missing_weights_message(pretrained, "checkpoint file")) is not None:
        raise FileNotFoundError(missing)
    else:
        check_known_tag(name, pretrained)
        local = cached_weights(name, pretrained)
        if local is None and not downloads_allowed():
            raise WeightsUnavailableError(
                f"The weights of {name!r} with pretrained tag {pretrained!r} are not on this machine (looked in the "
                f"Hugging Face cache and ~/.cache/clip), and atlas_fast downloads nothing unless asked: add "
                f"--download (Python: set {DOWNLOAD_VARIABLE}=1) to fetch them once, or pass a local file, e.g. "
                f"--pretrained ~/.cache/clip/ViT-B-16.pt (OpenAI's file, as CoOp users have it).")
        try:
            if local is not None and is_openai_checkpoint(local):  # OpenAI's own file, from the URL cache
                model = open_clip.load_openai_model(str(local), precision="fp32", device="cpu")
            else:
                model = open_clip.create_model(name, pretrained=str(local) if local is not None else pretrained,
                                               force_quick_gelu=wants_quick_gelu(name, pretrained))
        except Exception as exc:  # network failures surface as many exception types
            raise WeightsUnavailableError(
                f"Could not obtain the weights of {name!r} with pretrained tag {pretrained!r} ({type(exc).__name__}: "
                f"{exc}). Without network access, pass a local checkpoint file instead, e.g. "
                f"`--pretrained /path/to/ViT-B-16.pt` (OpenAI's file, as CoOp users have it in ~/.cache/clip) or "
                f"`--pretrained /path/to/open_clip_model.safetensors` with `--model {name}`.") from exc

    model = model.float().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    mean = tuple(getattr(model.visual, "image_mean", None) or OPENAI_MEAN)
    std = tuple(getattr(model.visual, "image_std", None) or OPENAI_STD)
    preprocessing = Preprocessing(image_size=image_size(model), mean=mean, std=std, interpolation="bicubic")
    architecture, fingerprint = model_fingerprint(model, name)
    backbone = Backbone(model=model, tokenizer=open_clip.get_tokenizer(name) if tokenizer_known(name)
                        else open_clip.get_tokenizer("ViT-B-16"),
                        preprocessing=preprocessing, config=config, architecture=architecture, fingerprint=fingerprint)
    return backbone.to(device)


def _expand(pretrained: str | None) -> str | None:
    """``~/.cache/clip/ViT-B-16.pt`` from Python works like it does from a shell (tags have no ``~``)."""
    return None if pretrained is None else os.path.expanduser(pretrained)


_SHARED: dict[tuple, Backbone] = {}
_SHARED_MAX = 2


def shared_backbone(config: BackboneConfig, device: str | torch.device = "cpu") -> Backbone:
    """:func:`load_backbone`, memoised within the process, so a sweep loads and fingerprints the weights once. Keyed by
    the config, the device and, for a local checkpoint, the file's identity, size, modification and change times, so
    an edited file is loaded afresh. Holds at most two backbones."""
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
