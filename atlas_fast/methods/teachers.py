"""A teacher-based method's frozen teacher CLIP (KDPL, PromptKD): loaded once per process with errors in the teacher's
own options, and given the student's image transform so that it encodes the views the student trains on."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from atlas_fast.clip.backbones import Backbone


def load_teacher(owner: str, model: str, pretrained: str, device: Any, model_option: str = "teacher",
                 weights_option: str = "teacher_pretrained") -> Backbone:
    """A teacher-based method's frozen teacher CLIP (open_clip ``model`` with ``pretrained``: a tag, a checkpoint
    file or ``none``), loaded once per process. Any failure (an unknown model, weights not on this machine, a missing,
    damaged or other architecture's file) raises the loader's error type with a message that starts with
    ``owner``'s teacher and names the teacher's own options (``--method-option teacher=... teacher_pretrained=...``)
    where the loader's would name the student's. The reusable half of a teacher check
    (:meth:`~atlas_fast.methods.base.PromptMethod.check_before_work`)."""
    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.clip.weights_files import in_teacher_words

    weights = None if pretrained.lower() == "none" else pretrained
    try:
        return shared_backbone(BackboneConfig(model, weights), device)
    except (OSError, ValueError, NotImplementedError) as exc:
        text = in_teacher_words(str(exc), model_option, weights_option)
        raise type(exc)(f"{owner}'s teacher {model} ({pretrained}) cannot be loaded: {text} For the teacher "
                        f"itself: --method-option {model_option}=MODEL {weights_option}=TAG|FILE|none (Python: "
                        f"method_options), e.g. {model_option}=ViT-B-16 "
                        f"{weights_option}=~/.cache/clip/ViT-B-16.pt") from None


def teacher_for_views(owner: str, teacher: Backbone, student: Backbone, choose: str) -> Backbone:
    """``teacher`` with ``student``'s image transform: the teacher-based reference trainers feed the student's
    preprocessed images to the teacher, so the feed encodes the student's views with it. A teacher of another image
    size is refused, ``choose`` saying how to pick one."""
    size, own = student.preprocessing.image_size, teacher.preprocessing.image_size
    if size != own:
        raise ValueError(f"{owner}'s teacher {teacher.describe()} takes {own} px images, but the student's views are "
                         f"{size} px (the reference feeds the student's images to the teacher); choose a teacher of "
                         f"the student's image size {choose}")
    return replace(teacher, preprocessing=student.preprocessing)
