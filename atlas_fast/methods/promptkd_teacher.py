"""PromptKD's prompted teacher (:mod:`atlas_fast.methods.promptkd` is the student and its loss): a PromptSRC on the
teacher's CLIP, its prompts read from an atlas_fast PromptSRC / IVLP record, the official Dassl checkpoint or their
initialisation (``teacher_prompts``), checked and refused with the teacher's own options; the teacher backbone whose
``encode_image`` is the prompted image tower (what the feature cache encodes) and whose fingerprint covers its
prompts; both kept per process, with the teacher's text features of each class set."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from atlas_fast.clip.backbones import Backbone
from atlas_fast.files import file_blake2b, read_json
from atlas_fast.methods.config import MethodConfig
from atlas_fast.methods.promptsrc import PromptSRC, PromptSRCConfig
from atlas_fast.methods.teachers import load_teacher as load_teacher_clip

# ``config`` below is always PromptKD's (atlas_fast.methods.promptkd.PromptKDConfig, its teacher_* fields), typed by its
# base so that the student's file imports this one and not the other way round.

# The methods whose records carry a teacher's prompts (IVLP's four tensors; PromptSRC is the official teacher).
TEACHER_RECORD_METHODS = ("promptsrc", "ivlp")
TEACHER_OPTIONS = "--method-option teacher=MODEL teacher_pretrained=TAG|FILE|none teacher_prompts=RECORD|FILE|none"
# The teacher's PromptSRC fields for teacher_prompts=none: PromptSRC's own field names prefixed with teacher_.
TEACHER_SHAPE_OPTIONS = ("--method-option teacher_n_ctx_text=N teacher_n_ctx_vision=N teacher_depth_text=J "
                         "teacher_depth_vision=J")


def teacher_shape_error(exc: Exception) -> str:
    """PromptSRC's refusal of the teacher's initial prompts, said with PromptKD's options: its field ``depth_text`` is
    PromptKD's ``teacher_depth_text`` (a user sets only the latter)."""
    return (f"PromptKD's teacher prompts at their initialisation (teacher_prompts=none): {exc}; PromptSRC's field X "
            f"is PromptKD's option teacher_X: set them with {TEACHER_SHAPE_OPTIONS}")


def check_teacher_record(config: MethodConfig, path: Path) -> dict[str, Any]:
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


def record_prompts(config: MethodConfig, path: Path) -> TeacherPrompts:
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


def dassl_prompts(config: MethodConfig, path: Path) -> TeacherPrompts:
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


def teacher_prompts(config: MethodConfig) -> TeacherPrompts | None:
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


def load_teacher(config: MethodConfig, device: torch.device | str) -> Backbone:
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
