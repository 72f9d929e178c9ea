"""PromptKD (Li et al., CVPR 2024, "PromptKD: Unsupervised Prompt Distillation for Vision-Language Models"): a
PromptSRC teacher on a larger CLIP distils into a student whose image tower carries visual prompts and whose image
features pass a projector into the teacher's feature space; the student is scored against the teacher's prompted text
features, on every training image of the domain, without labels (``docs/method-zoo.md``, section PromptKD).

For a batch of B views, the teacher's prompted image features u_i and its prompted text features g_c of the C classes
(both normalised; s_T the teacher's CLIP temperature), the student's prompted image features x_i, the projector P
(1x1 conv D_s -> D_t, BatchNorm, ReLU, 1x1 conv D_t -> D_t, as linear maps), s the student's temperature, T the
distillation temperature and w the KD weight:

    z_T = s_T u g^T,   z_S = s normalize(P(x)) g^T
    L = w * T^2 * sum_{i,c} KL(softmax(z_T,i / T) || softmax(z_S,i / T)) / (B * C)

At test time the student's logits of a class set are z_S with that set's teacher text features (so evaluating a
PromptKD model needs its teacher's text tower and prompts, never the teacher's image tower).

What is cached: the teacher's **prompted image features** of every training view, in a cache file keyed by a
fingerprint of the teacher's weights *and* its prompts (:meth:`PromptKD.view_teacher`); its logits of a view are one
product of those with the text features, which are computed once per class set and process. Given pixels alone, the
teacher runs on them (the official trainer's way, kept for the benchmark and the equivalence tests). The student's
image tower is prompted, so it trains on pixels.

Learned tensors (R runs lead every one): ``vision_ctx`` (R, M_v, w), ``deep_vision`` (R, J_v - 1, M_v, w),
N(0, 0.02^2) as IVLP's; the projector ``proj_w1`` (R, D_t, D_s), ``proj_b1``, ``proj_gamma``, ``proj_beta``,
``proj_w2`` (R, D_t, D_t), ``proj_b2`` (PyTorch's Conv2d / BatchNorm2d init). The BatchNorm's running mean and
variance are state too (saved with the learned tensors; the test-time projector uses them).

PromptKD uses no labels: a label schedule (ATLaS, ...) is refused (``uses_labels = False``); the comparison for ATLaS
is the student's base method (IVLP/PromptSRC on the few-shot labels) + ATLaS. It trains on the domain's unlabeled
images (``trains_on_domain``): every training image of every class of the dataset, not the few-shot subset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone, BackboneConfig
from atlas_fast.clip.prompted_towers import PromptedVisionEncoder
from atlas_fast.files import file_blake2b, read_json
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.pixel_method import PixelMethod
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.teachers import load_teacher as load_teacher_clip, teacher_for_views
from atlas_fast.methods.ivlp import PAPER_CTX_INIT, check_depth, normal_prompts
from atlas_fast.methods.promptsrc import PromptSRC, PromptSRCConfig

# The official teacher: a PromptSRC (4 + 4 tokens, depth 9 / 9) on OpenAI's ViT-L/14.
DEFAULT_TEACHER = ("ViT-L-14", "openai")
# The methods whose records carry a teacher's prompts (IVLP's four tensors; PromptSRC is the official teacher).
TEACHER_RECORD_METHODS = ("promptsrc", "ivlp")
# PyTorch's BatchNorm defaults (the official projector's BatchNorm2d).
BN_EPS, BN_MOMENTUM = 1e-5, 0.1
# Datasets whose KD weight is 200 in the official base-to-new script's note (1000 elsewhere).
KD_WEIGHT_200 = ("FGVCAircraft", "OxfordFlowers", "DescribableTextures")
TEACHER_OPTIONS = "--method-option teacher=MODEL teacher_pretrained=TAG|FILE|none teacher_prompts=RECORD|FILE|none"
# The teacher's PromptSRC fields for teacher_prompts=none: PromptSRC's own field names prefixed with teacher_.
TEACHER_SHAPE_OPTIONS = ("--method-option teacher_n_ctx_text=N teacher_n_ctx_vision=N teacher_depth_text=J "
                         "teacher_depth_vision=J")


def teacher_shape_error(exc: Exception) -> str:
    """PromptSRC's refusal of the teacher's initial prompts, said with PromptKD's options: its field ``depth_text`` is
    PromptKD's ``teacher_depth_text`` (a user sets only the latter)."""
    return (f"PromptKD's teacher prompts at their initialisation (teacher_prompts=none): {exc}; PromptSRC's field X "
            f"is PromptKD's option teacher_X: set them with {TEACHER_SHAPE_OPTIONS}")


@dataclass(frozen=True)
class PromptKDConfig(MethodConfig):
    """The student's visual prompts (M_v tokens, depth J_v), the distillation (KD weight w, temperature T) and the
    teacher: ``teacher`` an open_clip model, ``teacher_pretrained`` a tag, a checkpoint file or ``none``,
    ``teacher_prompts`` its learned prompts (an atlas_fast PromptSRC or IVLP record, the official Dassl checkpoint of
    the prompt learner, or ``none``: the prompts at their initialisation, drawn with seed 0, shaped by the
    ``teacher_*`` fields below). A record or a Dassl file decides its own prompt shapes."""

    n_ctx_vision: int = 4
    depth_vision: int = 9
    kd_weight: float = 1000.0
    temperature: float = 1.0
    teacher: str = DEFAULT_TEACHER[0]
    teacher_pretrained: str = DEFAULT_TEACHER[1]
    teacher_prompts: str = ""
    teacher_ctx_init: str = PAPER_CTX_INIT
    teacher_n_ctx_text: int = 4
    teacher_n_ctx_vision: int = 4
    teacher_depth_text: int = 9
    teacher_depth_vision: int = 9

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if self.n_ctx_vision < 1:
            raise ValueError(f"{owner}.n_ctx_vision must be >= 1, got {self.n_ctx_vision}")
        if self.depth_vision < 0:
            raise ValueError(f"{owner}.depth_vision must be >= 0, got {self.depth_vision}")
        check_scale(self, "kd_weight")
        check_scale(self, "temperature", low_open=True)
        if self.teacher_prompts and self.teacher_prompts.lower() != "none":
            path = Path(self.teacher_prompts).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"PromptKD's teacher_prompts {path} is not a file (an atlas_fast record "
                                        f"JSON or an official Dassl checkpoint; {TEACHER_OPTIONS})")
            if path.suffix == ".json":
                check_teacher_record(self, path)
        # the teacher's own shape fields, for teacher_prompts=none (a record or a file brings its own)
        try:
            PromptSRCConfig(n_ctx_text=self.teacher_n_ctx_text, n_ctx_vision=self.teacher_n_ctx_vision,
                            ctx_init=self.teacher_ctx_init, depth_text=self.teacher_depth_text,
                            depth_vision=self.teacher_depth_vision)
        except ValueError as exc:
            raise ValueError(teacher_shape_error(exc)) from None

    def teacher_backbone(self) -> BackboneConfig:
        pretrained = None if self.teacher_pretrained.lower() == "none" else self.teacher_pretrained
        return BackboneConfig(self.teacher, pretrained)


def check_teacher_record(config: PromptKDConfig, path: Path) -> dict[str, Any]:
    """The record's JSON, refused unless it holds a one-run PromptSRC or IVLP trained on the teacher's model and
    weights (checked by name before any weights are loaded; the weights' fingerprint when the teacher loads)."""
    try:
        record = read_json(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the option's fault
        raise ValueError(f"PromptKD's teacher_prompts {path} cannot be read as an atlas_fast record ({exc})") from None
    saved = record.get("config") if isinstance(record, dict) else None
    if not isinstance(saved, dict) or "method" not in saved:
        raise ValueError(f"PromptKD's teacher_prompts {path} is not an atlas_fast record (no config.method)")
    if saved["method"] not in TEACHER_RECORD_METHODS:
        raise ValueError(f"PromptKD's teacher_prompts {path} is a {saved['method']!r} record; the teacher's prompts "
                         f"come from a {' or '.join(TEACHER_RECORD_METHODS)} record")
    backbone = saved.get("backbone", {})
    wanted = config.teacher_backbone()
    if (backbone.get("model"), backbone.get("pretrained")) != (wanted.model, wanted.pretrained):
        raise ValueError(f"PromptKD's teacher_prompts {path} were trained on {backbone.get('model')} "
                         f"({backbone.get('pretrained') or 'random init'}), but the teacher is {wanted.model} "
                         f"({wanted.pretrained or 'random init'}); set teacher=... teacher_pretrained=... to the "
                         f"record's backbone ({TEACHER_OPTIONS})")
    return record


@dataclass(frozen=True)
class TeacherPrompts:
    """A teacher's learned prompts as atlas_fast's PromptSRC holds them (one run) and the prompt learner's config."""

    config: PromptSRCConfig
    tensors: dict[str, torch.Tensor]
    source: str


def record_prompts(config: PromptKDConfig, path: Path) -> TeacherPrompts:
    """The prompts of an atlas_fast PromptSRC / IVLP record (its learned tensors, checksum verified)."""
    record = check_teacher_record(config, path)
    learned = path.with_name(record.get("learned", path.with_suffix(".pt").name))
    if not learned.is_file():
        raise FileNotFoundError(f"PromptKD's teacher_prompts {path}: its learned tensors {learned} are missing")
    if "learned_blake2b" in record and file_blake2b(learned) != record["learned_blake2b"]:
        raise ValueError(f"PromptKD's teacher_prompts {path}: its learned tensors {learned} fail their checksum")
    tensors = {k: v for k, v in torch.load(learned, map_location="cpu", weights_only=True).items()
               if not k.startswith("snapshot.")}
    if any(t.shape[0] != 1 for t in tensors.values()):
        raise ValueError(f"PromptKD's teacher_prompts {path} hold several runs; a teacher is one run")
    fields = {f.name for f in dataclasses.fields(PromptSRCConfig)}
    saved = {k: v for k, v in record["config"].get("method_config", {}).items() if k in fields}
    return TeacherPrompts(PromptSRCConfig(**saved), tensors, f"record {path}")


def dassl_prompts(config: PromptKDConfig, path: Path) -> TeacherPrompts:
    """The prompts of the official teacher checkpoint (Dassl: ``{"state_dict": ...}`` of PromptSRC's CustomCLIP):
    ``prompt_learner.ctx`` (M, d_t), ``text_encoder.transformer.resblocks.{i}.VPT_shallow`` and
    ``image_encoder.VPT`` / ``image_encoder.transformer.resblocks.{i}.VPT_shallow`` for blocks i = 1..J-1. The text
    prompt's phrase is ``teacher_ctx_init`` (the official CTX_INIT). Other entries (a full checkpoint's frozen
    tower weights) are not read: the teacher's weights are ``teacher_pretrained``'s."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"PromptKD's teacher_prompts {path} cannot be read as a tensor checkpoint "
                         f"({type(exc).__name__}: {exc})") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or "prompt_learner.ctx" not in {k.removeprefix("module.") for k in state}:
        raise ValueError(f"PromptKD's teacher_prompts {path} is not a PromptSRC prompt-learner checkpoint (no "
                         f"state_dict with prompt_learner.ctx; expected the official model-best.pth.tar)")
    state = {k.removeprefix("module."): v for k, v in state.items()}

    def deep(prefix: str) -> list[torch.Tensor]:
        found = {}
        for key, value in state.items():
            if key.startswith(prefix) and key.endswith(".VPT_shallow"):
                found[int(key[len(prefix):].split(".")[0])] = value
        if sorted(found) != list(range(1, len(found) + 1)):
            raise ValueError(f"PromptKD's teacher_prompts {path}: the deep prompts under {prefix} are not blocks "
                             f"1..J-1 (found {sorted(found)})")
        return [found[i].float() for i in sorted(found)]

    ctx = state["prompt_learner.ctx"].float()
    text = deep("text_encoder.transformer.resblocks.")
    vision = deep("image_encoder.transformer.resblocks.")
    tensors = {"ctx": ctx[None]}
    if text:
        tensors["deep_text"] = torch.stack(text)[None]
    if "image_encoder.VPT" in state:
        tensors["vision_ctx"] = state["image_encoder.VPT"].float()[None]
        if vision:
            tensors["deep_vision"] = torch.stack(vision)[None]
    n_vision = tensors["vision_ctx"].shape[1] if "vision_ctx" in tensors else config.teacher_n_ctx_vision
    prompt_config = PromptSRCConfig(n_ctx_text=ctx.shape[0], n_ctx_vision=n_vision, ctx_init=config.teacher_ctx_init,
                                    depth_text=1 + len(text),
                                    depth_vision=(1 + len(vision)) if "vision_ctx" in tensors else 0)
    return TeacherPrompts(prompt_config, tensors, f"Dassl checkpoint {path}")


def teacher_prompts(config: PromptKDConfig) -> TeacherPrompts | None:
    """The prompts ``teacher_prompts`` names (None: ``none``, the initialisation)."""
    if config.teacher_prompts.lower() == "none":
        return None
    path = Path(config.teacher_prompts).expanduser()
    return record_prompts(config, path) if path.suffix == ".json" else dassl_prompts(config, path)


class PromptedTeacherModel(nn.Module):
    """The teacher's CLIP whose ``encode_image`` is its **prompted** image tower (what the feature cache encodes for
    :meth:`PromptKD.view_teacher`); every other attribute is the CLIP's."""

    def __init__(self, model: nn.Module, prompts: PromptSRC) -> None:
        super().__init__()
        self.clip = model
        self.prompts = prompts

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["clip"], name)

    @torch.no_grad()
    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.prompts.image_batch(pixels)[0]


def tensors_digest(tensors: dict[str, torch.Tensor], extra: str) -> str:
    """blake2b of named fp32 tensors and a description (a teacher's prompts and its prompt learner's config)."""
    digest = hashlib.blake2b(extra.encode(), digest_size=16)
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# The prompted teachers by (teacher config, prompts option, device): loaded once per process.
_TEACHERS: dict[tuple, Backbone] = {}
_TEACHERS_KEPT = 2
# The teacher's normalised text features by (teacher fingerprint, device, class names).
_TEACHER_TEXT: dict[tuple, torch.Tensor] = {}
_TEACHER_TEXT_KEPT = 4


def load_teacher(config: PromptKDConfig, device: torch.device | str) -> Backbone:
    """The prompted teacher: its backbone (``teacher``, ``teacher_pretrained``) with ``model`` a
    :class:`PromptedTeacherModel` holding its PromptSRC prompts, and a fingerprint of its weights and its prompts.
    A missing or mismatched teacher is refused here, naming the options, before it encodes anything."""
    if not config.teacher_prompts:
        raise ValueError(f"PromptKD needs its teacher's prompts: --method-option teacher_prompts=RECORD|FILE|none "
                         f"(Python: method_options), an atlas_fast PromptSRC record trained on the teacher "
                         f"{config.teacher} ({config.teacher_pretrained}), the official teacher checkpoint "
                         f"(model-best.pth.tar of its VLPromptLearner) or none (the prompts' initialisation)")
    path = Path(config.teacher_prompts).expanduser()
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    key = (config.teacher, config.teacher_pretrained, config.teacher_prompts, stamp, config.teacher_ctx_init,
           config.teacher_n_ctx_text, config.teacher_n_ctx_vision, config.teacher_depth_text,
           config.teacher_depth_vision, str(torch.device(device)))
    if key in _TEACHERS:
        return _TEACHERS[key]
    # any failure (an unknown model, weights not here, a damaged or other architecture's file) names the teacher's
    # own options, as KDPL's teacher does
    backbone = load_teacher_clip("PromptKD", config.teacher, config.teacher_pretrained, device)
    loaded = teacher_prompts(config)
    prompt_config = loaded.config if loaded is not None else PromptSRCConfig(
        n_ctx_text=config.teacher_n_ctx_text, n_ctx_vision=config.teacher_n_ctx_vision,
        ctx_init=config.teacher_ctx_init, depth_text=config.teacher_depth_text,
        depth_vision=config.teacher_depth_vision)
    source = loaded.source if loaded is not None else "none (the initialisation, seed 0)"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            module = PromptSRC(backbone, ["teacher"], prompt_config)
        except ValueError as exc:
            if loaded is None:
                raise ValueError(f"PromptKD's teacher {backbone.describe()}: {teacher_shape_error(exc)}") from None
            raise ValueError(f"PromptKD's teacher prompts ({source}) do not fit the teacher {backbone.describe()}: "
                             f"{exc} ({TEACHER_OPTIONS})") from None
    module = module.to(backbone.device)
    if loaded is not None:
        try:
            module.load_checkpoint_state(loaded.tensors)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"PromptKD's teacher prompts ({source}) do not fit the teacher "
                             f"{backbone.describe()}: {exc} ({TEACHER_OPTIONS})") from None
        if source.startswith("record"):
            record = read_json(path)
            trained_on = record.get("backbone", {}).get("fingerprint")
            if trained_on and trained_on != backbone.fingerprint:
                raise ValueError(f"PromptKD's teacher_prompts {path} were trained on the backbone "
                                 f"{trained_on[:12]}, but the teacher {backbone.describe()} has other weights "
                                 f"({TEACHER_OPTIONS})")
    module.requires_grad_(False).eval()
    prompts = {name: p for name, p in module.named_parameters()}
    described = (f"{prompt_config.n_ctx_text}/{prompt_config.n_ctx_vision}/{prompt_config.depth_text}/"
                 f"{prompt_config.depth_vision}/{prompt_config.ctx_init}")
    digest = tensors_digest(prompts, described)
    fingerprint = hashlib.blake2b(f"{backbone.fingerprint}+promptsrc:{digest}".encode(), digest_size=16).hexdigest()
    architecture = {**backbone.architecture, "teacher_prompts": {"learner": described, "digest": digest}}
    teacher = dataclasses.replace(backbone, model=PromptedTeacherModel(backbone.model, module),
                                  architecture=architecture, fingerprint=fingerprint)
    while len(_TEACHERS) >= _TEACHERS_KEPT:
        _TEACHERS.pop(next(iter(_TEACHERS)))
    _TEACHERS[key] = teacher
    return teacher


def teacher_text_features(teacher: Backbone, classnames: Sequence[str]) -> torch.Tensor:
    """(C, D_t): the teacher's normalised prompted text features of ``classnames`` (PromptSRC's class prompts), fp32,
    kept per process: the official trainer's teacher text, which is the same at every step."""
    key = (teacher.fingerprint, str(teacher.device), tuple(classnames))
    if key not in _TEACHER_TEXT:
        module: PromptSRC = teacher.model.prompts
        with torch.no_grad(), torch.autocast(teacher.device.type, enabled=False):
            module.set_classnames(classnames)
            features = module.text_features()[0].float()
        if len(_TEACHER_TEXT) >= _TEACHER_TEXT_KEPT:
            _TEACHER_TEXT.pop(next(iter(_TEACHER_TEXT)))
        _TEACHER_TEXT[key] = features
    return _TEACHER_TEXT[key]


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, weight: float, temperature: float
                      ) -> torch.Tensor:
    """``w T^2 sum KL(softmax(teacher / T) || softmax(student / T)) / (B C)`` of student logits (B, C) (the official
    ``F.kl_div(..., reduction="sum") * T * T / numel``)."""
    kl = F.kl_div(F.log_softmax(student.float() / temperature, dim=-1),
                  F.log_softmax(teacher.float() / temperature, dim=-1), reduction="sum", log_target=True)
    return weight * kl * temperature * temperature / student.numel()


def promptkd_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[PromptKDConfig, OptimRecipe]:
    """PromptKD's recipe (zhengli97/PromptKD ``configs/trainers/PromptKD`` and ``scripts/promptkd``; both families
    the same): 4 visual tokens, SGD lr 0.005, batch 8, 20 epochs (one constant warmup epoch at 1e-5, cosine), T = 1,
    the ViT-L/14 teacher.

    * base-to-new (``vit_b16_c2_ep20_batch8_4+4ctx``): depth 9; KD weight 1000, 200 on FGVC-Aircraft, Flowers102 and
      DTD (the script's note).
    * cross-dataset (``..._cross_datasets``, ImageNet source): depth 3, KD weight 1000.
    * few-shot: none (:class:`MissingRecipe`).
    """
    check_family("PromptKD", family)
    config = PromptKDConfig()
    optim = OptimRecipe(epochs=20, batch_size=8, lr=0.005)
    if setting == "base2new":
        weight = 200.0 if dataset in KD_WEIGHT_200 else 1000.0
        return dataclasses.replace(config, kd_weight=weight), optim
    if setting == "cross_dataset":
        return dataclasses.replace(config, depth_vision=3), optim
    raise MissingRecipe("PromptKD", setting, config)


class PromptKD(PixelMethod):
    """The PromptKD student: IVLP's visual prompts in the student's image tower, the projector into the teacher's
    feature space, the teacher's text features as its classifier."""

    name = "promptkd"
    printed_name = "PromptKD"
    recipe_function = staticmethod(promptkd_recipe)
    config_class = PromptKDConfig
    uses_labels = False
    trains_text_tower = False  # its classifier is the teacher's text features, computed once per class set
    #: trains on every training image of the dataset, all classes, unlabeled (the official base-to-novel and
    #: cross-dataset data: DATASET.NUM_SHOTS 0, SUBSAMPLE_CLASSES all); the engine hands it that list
    trains_on_domain = True
    # R runs train as one module: each run's BatchNorm statistics and loss over its own rows only
    supports_batched_runs = True
    #: the labelled method to compare with ATLaS (beyond_base_to_new): PromptSRC on the student's CLIP
    base_class: ClassVar[type[PromptMethod]] = PromptSRC
    # the student's only: the teacher's depths count its own towers (checked when it loads)
    depth_options = ("depth_vision",)

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig) -> None:
        super().__init__(backbone, classnames, config)
        self.image_encoder = PromptedVisionEncoder(backbone)
        runs, device, width = self.num_runs, backbone.device, self.image_encoder.width
        check_depth(type(self).__name__, "depth_vision", config.depth_vision, self.image_encoder.layers, 0)
        self.vision_ctx = (nn.Parameter(normal_prompts((runs, config.n_ctx_vision, width), device))
                           if config.depth_vision > 0 else None)
        self.deep_vision = (nn.Parameter(normal_prompts((runs, config.depth_vision - 1, config.n_ctx_vision, width),
                                                        device)) if config.depth_vision > 1 else None)
        source = backbone.embed_dim
        target = self.teacher_dim(config, backbone)

        def conv_init(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:  # Conv2d's kaiming_uniform(a=sqrt 5)
            bound = 1.0 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty((runs, *shape), device=device).uniform_(-bound, bound))

        self.proj_w1 = conv_init((target, source), source)
        self.proj_b1 = conv_init((target,), source)
        self.proj_gamma = nn.Parameter(torch.ones(runs, target, device=device))
        self.proj_beta = nn.Parameter(torch.zeros(runs, target, device=device))
        self.proj_w2 = conv_init((target, target), target)
        self.proj_b2 = conv_init((target,), target)
        self.register_buffer("proj_running_mean", torch.zeros(runs, target, device=device))
        self.register_buffer("proj_running_var", torch.ones(runs, target, device=device))
        self.set_classnames(classnames)

    # --- the teacher ------------------------------------------------------------------------------------------------
    @staticmethod
    def teacher_dim(config: PromptKDConfig, backbone: Backbone) -> int:
        """D_t, the teacher's feature width (the projector's output), read from its open_clip config without loading
        its weights where that is possible."""
        try:
            import open_clip

            return int(open_clip.get_model_config(config.teacher)["embed_dim"])
        except (TypeError, KeyError):
            return int(load_teacher(config, backbone.device).embed_dim)

    @classmethod
    def view_teacher(cls, config: PromptKDConfig, backbone: Backbone) -> Backbone:
        """The prompted teacher with ``backbone``'s transform: the feed caches its prompted image features of every
        training view in a file of its fingerprint (weights and prompts)."""
        return teacher_for_views("PromptKD", load_teacher(config, backbone.device), backbone, f"({TEACHER_OPTIONS})")

    @classmethod
    def check_before_work(cls, config: PromptKDConfig, backbone: Backbone) -> None:
        """At planning: the teacher, its weights and its prompts load and fit the student's views."""
        cls.view_teacher(config, backbone)

    @property
    def teacher(self) -> Backbone:
        """The prompted teacher, loaded at first use (training, or the text features of a class set)."""
        if getattr(self, "_teacher", None) is None:
            self._teacher = self.view_teacher(self.config, self.backbone)
        return self._teacher

    def teacher_text(self) -> torch.Tensor:
        """(C, D_t) normalised teacher text features of the current classes."""
        return teacher_text_features(self.teacher, self.classnames).to(self.device)

    def teacher_logits(self, features: torch.Tensor) -> torch.Tensor:
        """s_T cos(u, g): (B, C) of the teacher's un-normalised prompted image features (B, D_t), at the teacher's
        own temperature (as the official teacher scores)."""
        scale = self.teacher.model.logit_scale.detach().exp().to(features.device)
        return scale * F.normalize(features.float(), dim=-1) @ self.teacher_text().t()

    # --- the student ------------------------------------------------------------------------------------------------
    def set_classnames(self, classnames: Sequence[str]) -> None:
        if not classnames:
            raise ValueError("PromptKD needs at least one class name")
        self.classnames = tuple(classnames)

    def vision_prompts(self) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        return self.vision_ctx, list(self.deep_vision.unbind(1)) if self.deep_vision is not None else []

    def project(self, features: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """The projector on (R, B, D_s): linear, BatchNorm over the batch (training: the batch's statistics, the
        running ones updated with momentum 0.1 and the unbiased variance; evaluation: the running ones), ReLU,
        linear. ``sizes``: each run's own rows when R runs' batches are zero-padded to B (its statistics are over
        those rows only; a run with none leaves its running statistics)."""
        h = torch.baddbmm(self.proj_b1.unsqueeze(1).to(features.dtype), features,
                          self.proj_w1.transpose(1, 2).to(features.dtype))
        if self.training:
            h32 = h.float()
            if sizes is None or min(sizes) == h.shape[1]:  # every row is a run's own
                mean = h32.mean(dim=1)
                var = h32.var(dim=1, unbiased=False)
                counts = torch.full((h.shape[0],), float(h.shape[1]), device=h.device)
            else:  # each run's statistics over its own rows, as training it alone computes them
                counts = torch.tensor([float(n) for n in sizes], device=h.device)
                zeros = h32.new_zeros(h32.shape[-1])
                mean = torch.stack([h32[r, :n].mean(dim=0) if n else zeros for r, n in enumerate(sizes)])
                var = torch.stack([h32[r, :n].var(dim=0, unbiased=False) if n else zeros
                                   for r, n in enumerate(sizes)])
            with torch.no_grad():
                # a run with one row has no unbiased variance (the official loader drops such a batch), with none
                # nothing to add
                seen, spread = (counts > 0).unsqueeze(1), (counts > 1).unsqueeze(1)
                unbiased = var.detach() * (counts / (counts - 1).clamp(min=1)).unsqueeze(1)
                self.proj_running_mean.copy_(torch.where(
                    seen, (1 - BN_MOMENTUM) * self.proj_running_mean + BN_MOMENTUM * mean.detach(),
                    self.proj_running_mean))
                self.proj_running_var.copy_(torch.where(
                    spread, (1 - BN_MOMENTUM) * self.proj_running_var + BN_MOMENTUM * unbiased,
                    self.proj_running_var))
        else:
            mean, var = self.proj_running_mean, self.proj_running_var
        normed = (h.float() - mean.unsqueeze(1)) * torch.rsqrt(var.unsqueeze(1) + BN_EPS)
        normed = (normed * self.proj_gamma.unsqueeze(1) + self.proj_beta.unsqueeze(1)).to(h.dtype)
        return torch.baddbmm(self.proj_b2.unsqueeze(1).to(h.dtype), F.relu(normed),
                             self.proj_w2.transpose(1, 2).to(h.dtype))

    def image_batch(self, pixels: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
        """Projected student image features (R, B, D_t), un-normalised, of pixels (B, 3, H, W) seen by every run, or
        (R, B, 3, H, W), one batch per run (``sizes``: each run's own rows of a padded batch)."""
        self.check_pixels(pixels)
        prompts, deep = self.vision_prompts()
        features = self.image_encoder(pixels, prompts, deep)
        if features.shape[0] != self.num_runs:
            features = features.expand(self.num_runs, -1, -1)
        return self.project(features, sizes)

    def raw_text_features(self) -> torch.Tensor:
        """(R, C, D_t): the teacher's text features of the current classes, the student's classifier (normalised
        already)."""
        return self.teacher_text().unsqueeze(0).expand(self.num_runs, -1, -1)

    def text_features(self) -> torch.Tensor:
        return self.raw_text_features()

    def split_inputs(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixels, the teacher's prompted image features (B, D_t)) of a training batch: served from the teacher's
        cache file, or (pixels alone) encoded by the teacher now."""
        pixels, cached = inputs if isinstance(inputs, tuple) else (inputs, None)
        if cached is None:
            teacher = self.teacher
            with torch.no_grad():
                cached = teacher.encode_image(pixels.to(teacher.device))
        return pixels, cached[..., -self.teacher.embed_dim:]

    def training_loss(self, inputs, labels: torch.Tensor | None, criterion: Callable[..., torch.Tensor] | None
                      ) -> torch.Tensor:
        """The distillation loss (``criterion`` unused and labels only read for their shape: PromptKD learns from its
        teacher alone): summed over the runs for one batch seen by every run; each run's (R,) for R runs trained
        together on one batch each ((R, B) labels), over its own rows (``criterion.sizes``) when padded."""
        pixels, teacher_features = self.split_inputs(inputs)
        teacher = self.teacher_logits(teacher_features)
        config = self.config
        if labels is None or labels.dim() == 1:  # one batch, seen by every run
            student = self.forward(pixels)
            return sum(distillation_loss(student[r], teacher, config.kd_weight, config.temperature)
                       for r in range(student.shape[0]))
        sizes = getattr(criterion, "sizes", None)
        student = self.similarity_logits(self.image_batch(pixels, sizes), self.text_features())
        T = config.temperature
        kl = F.kl_div(F.log_softmax(student.float() / T, dim=-1), F.log_softmax(teacher.float() / T, dim=-1),
                      reduction="none", log_target=True).sum(dim=-1)  # (R, B)
        rows = student.shape[1]
        if sizes is None or min(sizes) == rows:
            counts = torch.full((student.shape[0],), float(rows), device=kl.device)
        else:
            counts = torch.tensor([float(n) for n in sizes], device=kl.device)
            kl = kl * (torch.arange(rows, device=kl.device) < counts.unsqueeze(1))
        return config.kd_weight * T * T * kl.sum(dim=1) / (counts.clamp(min=1) * student.shape[2])

    # --- state --------------------------------------------------------------------------------------------------
    def state_for_checkpoint(self) -> dict[str, torch.Tensor]:
        """The learned tensors and the BatchNorm's running statistics (the test-time projector's)."""
        state = super().state_for_checkpoint()
        for name in ("proj_running_mean", "proj_running_var"):
            state[name] = getattr(self, name).detach().cpu().clone()
        return state

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        running = {name: state.pop(name) for name in ("proj_running_mean", "proj_running_var") if name in state}
        super().load_checkpoint_state(state)
        missing = sorted({"proj_running_mean", "proj_running_var"} - set(running))
        if missing:
            raise KeyError(f"PromptKD checkpoint mismatch: missing {missing}")
        for name, value in running.items():
            buffer = getattr(self, name)
            if tuple(value.shape) != tuple(buffer.shape):
                raise ValueError(f"PromptKD checkpoint tensor {name!r} has shape {tuple(value.shape)}, expected "
                                 f"{tuple(buffer.shape)}")
            buffer.copy_(value.to(buffer))


register_method(PromptKD)
