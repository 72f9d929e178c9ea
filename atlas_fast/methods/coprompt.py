"""CoPrompt (Roy & Etemad, ICLR 2024, "Consistency-guided Prompt Learning for Vision-Language Models"): MaPLe's
prompts plus two adapters, trained with a consistency constraint towards the frozen CLIP on a second augmented view
and on LLM-written class descriptions (``docs/method-zoo.md``, section CoPrompt; reference ShuvenduRoy/CoPrompt).

Learned tensors (R runs lead every one): MaPLe's (``ctx``, ``deep_text``, ``coupling_weight``, ``coupling_bias``)
and two bias-free adapters ``A(x) = ReLU(ReLU(x W_down) W_up)`` (D -> D/4 -> D), image and text, mixed residually:

    v = 0.1 * A_img(f_v) + 0.9 * f_v,   t_c = 0.2 * A_txt(f_t,c) + 0.8 * f_t,c      (then L2-normalised)
    L = CE(z, y) + W * [(1 - mean_c cos(t_c, g_k,c)) + (1 - mean_i cos(v_i, u_i))]  (``consistency="cosine"``)
    L = CE(z, y) + W * [mse(t, g_k) + mse(v, normalize(u))]                        (``consistency="mse"``)

With ATLaS only CE(z, y) receives the schedule's targets. u (the frozen CLIP's features of the second view) is a
cached feature: the cache holds views 1..2V, the consistency term reads view V + 1 + (e mod V)
(``frozen_second_view``); given pixels alone, :meth:`CoPrompt.training_loss` encodes them. The description index k
is a fixed integer hash of (the run's description seed, step), computed on the device, so a run draws the same
sequence alone, batched or replayed from a CUDA graph (the reference draws ``random.randint`` per step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone, encode_class_prompts
from atlas_fast.files import JsonFileError, blake2b_hex, read_json
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.ivlp import PAPER_CTX_INIT
from atlas_fast.methods.maple import MaPLe, MaPLeConfig

# The consistency measures of the reference (its TRAINER.DISTILL).
CONSISTENCIES = ("cosine", "mse")
# MINSTD's modulus and multiplier: the description index is an integer hash of (seed, step) in int64 without overflow.
_MODULUS, _MULTIPLIER = 2_147_483_647, 48_271


@dataclass(frozen=True)
class CoPromptConfig(MaPLeConfig):
    """CoPrompt = MaPLe's prompts (M tokens from "a photo of a", depth J) + the adapters (``image_adapter_ratio``,
    ``text_adapter_ratio``, ``adapter_reduction``) + the consistency terms (weight ``consistency_weight`` = W,
    ``consistency`` cosine or mse) on the class descriptions in ``descriptions`` (a JSON file
    ``{class name: [description, ...]}``, the same number for every class). ``descriptions_checksum`` is filled in
    when a run is planned (the file's content is part of the run's identity)."""

    n_ctx: int = 2
    ctx_init: str = PAPER_CTX_INIT
    depth: int = 9
    consistency_weight: float = 1.0
    consistency: str = "cosine"
    descriptions: str = ""
    descriptions_checksum: str = ""
    image_adapter_ratio: float = 0.1
    text_adapter_ratio: float = 0.2
    adapter_reduction: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_scale(self, "consistency_weight")
        check_scale(self, "image_adapter_ratio", high=1.0)
        check_scale(self, "text_adapter_ratio", high=1.0)
        if self.consistency not in CONSISTENCIES:
            raise ValueError(f"{owner}.consistency must be one of {', '.join(CONSISTENCIES)}, got {self.consistency!r}")
        if self.adapter_reduction < 1:
            raise ValueError(f"{owner}.adapter_reduction must be >= 1, got {self.adapter_reduction}")


# The reference's per-dataset overrides (trainers/constants.py): prompt depth J, tokens M, consistency weight W and
# epochs where they differ from its config (8 epochs, batch 4, lr 0.0035, J 9, M 2, W 1).
DATASET_RECIPES: dict[str, dict[str, float]] = {
    "ImageNet": dict(depth=12, n_ctx=4, consistency_weight=8.0),
    "Caltech101": dict(depth=12, n_ctx=4, consistency_weight=4.0),
    "OxfordPets": dict(depth=12, n_ctx=2, consistency_weight=0.1),
    "StanfordCars": dict(depth=12, n_ctx=4, consistency_weight=4.0),
    "OxfordFlowers": dict(depth=9, n_ctx=4, consistency_weight=8.0),
    "Food101": dict(depth=9, n_ctx=4, consistency_weight=0.5, epochs=5),
    "FGVCAircraft": dict(depth=9, n_ctx=4, consistency_weight=2.0),
    "SUN397": dict(depth=12, n_ctx=4, consistency_weight=8.0),
    "DescribableTextures": dict(depth=12, n_ctx=2, consistency_weight=8.0),
    "EuroSAT": dict(depth=12, n_ctx=2, consistency_weight=0.1),
    "UCF101": dict(depth=12, n_ctx=4, consistency_weight=2.0),
}


def coprompt_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[CoPromptConfig, OptimRecipe]:
    """CoPrompt's recipe (``docs/method-zoo.md``, section Recipes; its repository's config and per-dataset table).

    * base-to-new: 8 epochs (Food101 5), batch 4, lr 0.0035, cosine consistency; J, M and W per dataset
      (:data:`DATASET_RECIPES`; other datasets J 9, M 2, W 1). ``paper`` sets M = 4 (all four words learnable).
    * cross-dataset (train on ImageNet): the same code and table, so ImageNet's row (J 12, M 4, W 8).
    * few-shot: the reference defines none (:class:`~atlas_fast.methods.config.MissingRecipe`).
    """
    check_family("CoPrompt", family)
    row = dict(DATASET_RECIPES.get(dataset, {}))
    epochs = int(row.pop("epochs", 8))
    config = CoPromptConfig(**{"n_ctx": 2, "depth": 9, "consistency_weight": 1.0, **row})
    if family == "paper":
        config = replace(config, n_ctx=4)
    if setting not in ("base2new", "cross_dataset"):
        raise MissingRecipe("CoPrompt", setting, config)
    return config, OptimRecipe(epochs=epochs, batch_size=4, lr=0.0035)


# The official repository's file of each dataset (gpt_file/<name>_prompt.json).
OFFICIAL_FILE_NAMES = {"Caltech101": "caltech", "DescribableTextures": "dtd", "EuroSAT": "eurosat",
                       "FGVCAircraft": "fgvc", "Food101": "food101", "ImageNet": "imagenet",
                       "ImageNetA": "imagenet_a", "ImageNetR": "imagenet_r", "ImageNetSketch": "imagenet_sketch",
                       "ImageNetV2": "imagenetv2", "OxfordFlowers": "oxford_flowers", "OxfordPets": "oxford_pets",
                       "StanfordCars": "stanford_cars", "SUN397": "sun397", "UCF101": "ucf101"}


def descriptions_file(path: str | Path, dataset: str) -> str | Path:
    """The descriptions file of ``dataset`` (registry name): ``path`` itself, or in a folder ``path``,
    ``<dataset>.json`` or the official repository's name (``oxford_pets_prompt.json``), so one option serves an
    experiment over several datasets. A folder without either is refused, naming both."""
    if not str(path):
        return ""  # refused by read_descriptions, with what to give
    path = Path(path).expanduser().absolute()
    if not path.is_dir():
        return path
    names = [f"{dataset}.json"] + ([f"{OFFICIAL_FILE_NAMES[dataset]}_prompt.json"] if dataset in OFFICIAL_FILE_NAMES
                                   else [])
    for name in names:
        if (path / name).is_file():
            return path / name
    raise ValueError(f"CoPrompt's class descriptions: the folder {path} has no file for {dataset} (looked for "
                     f"{' and '.join(names)})")


def description_key(classname: str) -> str:
    """The key a class's descriptions have in the reference's files: its name with '_' as spaces."""
    return classname.replace("_", " ")


def read_descriptions(path: str | Path, classnames: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Each class's descriptions from ``path`` (``{class name: [description, ...]}``; a class is looked up by its
    name with '_' as spaces, then as written). Refused with the file named: a file that cannot be read or is not
    such an object, a class without descriptions, a description that is not text, classes with different numbers
    of descriptions (the reference stacks them)."""
    if not str(path):
        raise ValueError("CoPrompt needs its class descriptions: --method-option descriptions=PATH (Python: "
                         "method_options={'descriptions': PATH}), a JSON file {class name: [description, ...]} with "
                         "the same number of descriptions for every training class, or a folder of such files named "
                         "<dataset>.json (the official CoPrompt repository ships one per dataset, e.g. "
                         "gpt_file/oxford_pets_prompt.json, which a folder may also hold).")
    path = Path(path).expanduser()
    try:
        table = read_json(path)
    except JsonFileError as exc:
        raise ValueError(f"CoPrompt's class descriptions {exc}") from None
    if not isinstance(table, dict):
        raise ValueError(f"CoPrompt's class descriptions {path}: expected a JSON object {{class name: [description, "
                         f"...]}}, got a JSON {type(table).__name__}")
    rows = []
    for name in classnames:
        key = description_key(name) if description_key(name) in table else name
        texts = table.get(key)
        if not isinstance(texts, list) or not texts:
            found = "no entry" if texts is None else f"{json.dumps(texts)[:60]}"
            raise ValueError(f"CoPrompt's class descriptions {path}: class {name!r} has no descriptions (looked up "
                             f"as {description_key(name)!r}: {found}); every training class needs a non-empty list "
                             f"of strings")
        if not all(isinstance(text, str) and text.strip() for text in texts):
            raise ValueError(f"CoPrompt's class descriptions {path}: class {name!r} has a description that is not a "
                             f"non-empty string")
        rows.append(tuple(texts))
    counts = {len(texts) for texts in rows}
    if len(counts) > 1:
        sizes = ", ".join(f"{name!r}: {len(texts)}" for name, texts in list(zip(classnames, rows))[:6])
        raise ValueError(f"CoPrompt's class descriptions {path}: every class needs the same number of descriptions "
                         f"(step by step one description index serves every class, as in the reference); found "
                         f"{sorted(counts)} ({sizes}{', ...' if len(rows) > 6 else ''})")
    return tuple(rows)


def descriptions_checksum(descriptions: Sequence[Sequence[str]]) -> str:
    """A checksum of the descriptions a run reads (its training classes', in order)."""
    return blake2b_hex(json.dumps([list(texts) for texts in descriptions]).encode())[:16]


# Normalised description features by (backbone, device, descriptions): K x C prompts through the frozen text tower
# (ImageNet: 50,000), the same for every run and seed on those classes, so computed once per process.
_DESCRIPTION_FEATURES: dict[tuple, torch.Tensor] = {}
_DESCRIPTION_FEATURES_KEPT = 4


def description_features(backbone: Backbone, descriptions: Sequence[Sequence[str]]) -> torch.Tensor:
    """(K, C, D) fp32: the frozen CLIP's L2-normalised text features of description k of class c (autocast off)."""
    key = (backbone.fingerprint, str(backbone.device), descriptions_checksum(descriptions), len(descriptions))
    if key not in _DESCRIPTION_FEATURES:
        count = len(descriptions[0])
        texts = [text for k in range(count) for text in (row[k] for row in descriptions)]
        with torch.no_grad(), torch.autocast(backbone.device.type, enabled=False):
            features = F.normalize(encode_class_prompts(backbone, texts), dim=-1)
        if len(_DESCRIPTION_FEATURES) >= _DESCRIPTION_FEATURES_KEPT:
            _DESCRIPTION_FEATURES.pop(next(iter(_DESCRIPTION_FEATURES)))
        _DESCRIPTION_FEATURES[key] = features.view(count, len(descriptions), -1)
    return _DESCRIPTION_FEATURES[key]


def description_index(seed: torch.Tensor, step: torch.Tensor, count: int) -> torch.Tensor:
    """Each run's description index in [0, count) at its step ``step`` (R,), from its seed (R,) in [0, 2^31 - 1):
    three MINSTD rounds of (seed, step), exact int64 arithmetic on any device."""
    x = (seed * _MULTIPLIER + step * 69_621 + 1) % _MODULUS
    for _ in range(2):
        x = (x * _MULTIPLIER) % _MODULUS
    return x % count


def adapter_weights(width: int, reduction: int, runs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, D, D/r) and (R, D/r, D): each run's two bias-free ``nn.Linear`` layers with PyTorch's default init, stored
    transposed (x @ W)."""
    down, up = [], []
    for _ in range(runs):
        down.append(nn.Linear(width, width // reduction, bias=False).weight.detach().t())
        up.append(nn.Linear(width // reduction, width, bias=False).weight.detach().t())
    return torch.stack(down).to(device), torch.stack(up).to(device)


def adapted(features: torch.Tensor, down: torch.Tensor, up: torch.Tensor, ratio: float) -> torch.Tensor:
    """``ratio * A(x) + (1 - ratio) * x`` of features (R, N, D) (or (1, N, D) shared), A = ReLU(ReLU(x W_d) W_u)."""
    hidden = F.relu(torch.einsum("rnd,rdh->rnh", features, down.to(features.dtype)))
    return ratio * F.relu(torch.einsum("rnh,rhd->rnd", hidden, up.to(features.dtype))) + (1 - ratio) * features


class CoPrompt(MaPLe):
    """MaPLe + adapters + consistency with the frozen CLIP on a second view and on class descriptions; reads pixels
    and the frozen CLIP's cached features of a second view of every image."""

    name = "coprompt"
    printed_name = "CoPrompt"
    recipe_function = staticmethod(coprompt_recipe)
    config_class = CoPromptConfig
    reads_frozen_features = True
    frozen_second_view = True

    @classmethod
    def planned_config(cls, config: MethodConfig, dataset: str, classnames: Sequence[str]) -> MethodConfig:
        """Read and check the descriptions of the training classes before anything is loaded or encoded (a folder
        gives the dataset's file, :func:`descriptions_file`); the config then names the file and carries the
        descriptions' checksum (a run on other descriptions is another run)."""
        path = descriptions_file(config.descriptions, dataset)
        rows = read_descriptions(path, classnames)
        return replace(config, descriptions=str(path), descriptions_checksum=descriptions_checksum(rows))

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.trained_classnames = tuple(classnames)
        self._descriptions: tuple[tuple[str, ...], ...] | None = None  # read at the first training step
        self._targets: torch.Tensor | None = None  # their features, (K, C, D)
        dim, device = backbone.embed_dim, self.ctx.device
        if dim // config.adapter_reduction < 1:
            raise ValueError(f"CoPromptConfig.adapter_reduction {config.adapter_reduction} leaves no hidden unit "
                             f"for the {dim}-d features")
        down, up = adapter_weights(dim, config.adapter_reduction, self.num_runs, device)
        self.image_adapter_down, self.image_adapter_up = nn.Parameter(down), nn.Parameter(up)
        down, up = adapter_weights(dim, config.adapter_reduction, self.num_runs, device)
        self.text_adapter_down, self.text_adapter_up = nn.Parameter(down), nn.Parameter(up)
        # each run's description seed (drawn last, from the run's seeded initialisation) and its step count
        self.register_buffer("description_seed", torch.randint(0, _MODULUS, (self.num_runs,), device=device),
                             persistent=False)
        self.register_buffer("description_step", torch.zeros(self.num_runs, dtype=torch.long, device=device),
                             persistent=False)
        self._active: dict[tuple[int, ...], torch.Tensor] = {}

    # --- the adapters sit after both towers: training and test logits alike ----------------------------------
    def raw_text_features(self) -> torch.Tensor:
        """The adapted, un-normalised class text features (R, C, D)."""
        return adapted(super().raw_text_features(), self.text_adapter_down, self.text_adapter_up,
                       self.config.text_adapter_ratio)

    def image_batch(self, pixels: torch.Tensor) -> torch.Tensor:
        """The adapted, un-normalised prompted image features (R, B, D)."""
        return adapted(super().image_batch(pixels), self.image_adapter_down, self.image_adapter_up,
                       self.config.image_adapter_ratio)

    # --- the consistency terms -------------------------------------------------------------------------------
    @torch.no_grad()
    def frozen_image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The unprompted CLIP's image features (B, D) or (R, B, D) of the second view's pixels: what the cache
        holds for those views."""
        if pixels.dim() == 5:
            return self.backbone.encode_image(pixels.flatten(0, 1)).view(*pixels.shape[:2], -1)
        return self.backbone.encode_image(pixels)

    @property
    def descriptions(self) -> tuple[tuple[str, ...], ...]:
        """The training classes' descriptions, read once (training needs them; evaluation never does). A file that
        changed since the run was planned is refused."""
        if self._descriptions is None:
            rows = read_descriptions(self.config.descriptions, self.trained_classnames)
            expected = self.config.descriptions_checksum
            if expected and descriptions_checksum(rows) != expected:
                raise ValueError(f"CoPrompt's class descriptions {self.config.descriptions} changed since the run "
                                 f"was planned (checksum {descriptions_checksum(rows)}, planned {expected}); plan "
                                 f"the run again")
            self._descriptions = rows
        return self._descriptions

    def description_targets(self, device: torch.device) -> torch.Tensor:
        """(K, C, D): the normalised description features of the classes this method was built for (looked up once
        per module and device, not every step)."""
        if self._targets is None or self._targets.device != torch.device(device):
            self._targets = description_features(self.backbone, self.descriptions).to(device)
        return self._targets

    def take_description_step(self, sizes: Sequence[int] | None) -> torch.Tensor:
        """Each run's description index (R,) for this step, then each run that takes part counts the step (device
        work only: the same in a replayed graph)."""
        count = len(self.descriptions[0])
        index = description_index(self.description_seed, self.description_step, count)
        if sizes is None or min(sizes) > 0:
            self.description_step += 1
        else:
            key = tuple(sizes)
            if key not in self._active:
                active = torch.zeros(len(sizes), dtype=torch.long, device=self.description_step.device)
                for r, size in enumerate(sizes):
                    active[r] = int(size > 0)
                self._active[key] = active
            self.description_step += self._active[key]
        return index

    def consistency_loss(self, text: torch.Tensor, image: torch.Tensor, frozen: torch.Tensor, index: torch.Tensor,
                         criterion: Criterion | None = None) -> torch.Tensor:
        """W * (text term + image term) of each run (R,) (:meth:`consistency_terms`)."""
        text_term, image_term = self.consistency_terms(text, image, frozen, index, criterion)
        return self.config.consistency_weight * (text_term + image_term)

    def consistency_terms(self, text: torch.Tensor, image: torch.Tensor, frozen: torch.Tensor, index: torch.Tensor,
                          criterion: Criterion | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The text and the image consistency term of each run, (R,) each: text (R, C, D) and image (R, B, D)
        normalised, frozen the second view's frozen features (B, D) or (R, B, D), index (R,) each run's description.
        ``criterion``: the step's, whose sizes say each run's rows when the batches of runs trained together are
        zero-padded (the image term averages a run's own; its ``rows`` are on the device: no upload)."""
        if tuple(self.classnames) != self.trained_classnames:
            raise RuntimeError("CoPrompt trains on the class set it was built for (its description targets)")
        config = self.config
        targets = self.description_targets(text.device)[index]  # (R, C, D)
        fixed = F.normalize(frozen.float().to(text.device), dim=-1).expand(image.shape)
        if config.consistency == "cosine":
            text_term = 1 - (text.float() * targets).sum(-1).mean(-1)
            image_rows = 1 - (image.float() * fixed).sum(-1)  # (R, B)
        else:
            text_term = (text.float() - targets).pow(2).mean(dim=(1, 2))
            image_rows = (image.float() - fixed).pow(2).mean(-1)
        mask = criterion.padding_mask(image.shape[1]) if criterion is not None else None
        if criterion is None or mask is None:
            image_term = image_rows.mean(-1)
        else:  # a run's own rows only (a run that sits the step out gets 0)
            image_term = (image_rows * mask).sum(-1) / criterion.rows.clamp(min=1).float()
        return text_term, image_term

    def training_loss(self, inputs, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        """criterion(z) + W * consistency (each run's (R,) when R runs train together). ``inputs``: (pixels, the
        frozen CLIP's features of a second view (B, D) or (R, B, D)) (an :class:`atlas_fast.engine.feed.PixelBatch`)
        or (pixels, the second view's pixels)."""
        if not isinstance(inputs, tuple) or len(inputs) != 2:
            raise ValueError("CoPrompt trains on (pixels, the frozen CLIP's features of a second augmented view of "
                             "the same images) or (pixels, the second view's pixels); its consistency term needs "
                             "the second view")
        pixels, frozen = inputs
        if frozen.dim() >= 4:  # the second view's pixels: encode them (the feed serves their cached features)
            frozen = self.frozen_image_features(frozen)
        text = F.normalize(self.raw_text_features(), dim=-1)
        image = F.normalize(self.image_batch(pixels), dim=-1)
        logits = self.similarity_logits(image, text)
        index = self.take_description_step(criterion.sizes if labels.dim() == 2 else None)
        if labels.dim() == 1:  # one batch (seen by every run)
            return criterion(logits) + self.consistency_loss(text, image, frozen, index).sum()
        return criterion.per_run(logits) + self.consistency_loss(text, image, frozen, index, criterion)

    # --- run bookkeeping ---------------------------------------------------------------------------------------
    def state_for_checkpoint(self) -> dict[str, torch.Tensor]:
        """The learned tensors and each run's description seed (a run resumed or batched draws its own)."""
        state = super().state_for_checkpoint()
        state["description_seed"] = self.description_seed.detach().cpu().clone()
        return state

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        seed = state.pop("description_seed", None)
        super().load_checkpoint_state(state)
        if seed is not None:
            if tuple(seed.shape) != (self.num_runs,):
                raise ValueError(f"CoPrompt checkpoint tensor 'description_seed' has shape {tuple(seed.shape)}, "
                                 f"expected ({self.num_runs},)")
            self.description_seed.copy_(seed.to(self.description_seed.device))

    def carry_runs(self, source: "CoPrompt", keep: Sequence[int]) -> None:
        """The description seeds and step counts of ``source``'s runs ``keep``."""
        index = torch.tensor(list(keep), device=source.description_seed.device)
        self.description_seed.copy_(source.description_seed.index_select(0, index).to(self.description_seed.device))
        self.description_step.copy_(source.description_step.index_select(0, index).to(self.description_step.device))


register_method(CoPrompt)
