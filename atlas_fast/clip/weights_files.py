"""What a ``pretrained`` value means before any weights are read, without importing torch: the spellings of random
weights, whether a value names a local file, the message for such a file that is not there, and whether a tag's
weights may be downloaded.

The command line checks ``--pretrained`` with these as it parses its arguments (an absent file is refused in well
under a second, before torch is imported), and :func:`atlas_fast.clip.backbones.load_backbone` gives the Python API
the same message, so both say the same thing in the same words."""

from __future__ import annotations

import os
from pathlib import Path

#: spellings of "random weights" (the command line's ``--pretrained none``; ``BackboneConfig(..., "none")`` too)
RANDOM_WEIGHTS = ("none", "random", "")
#: the suffixes of the checkpoint files a backbone loads
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
#: at most this many weight files of the named folder are listed in the message
LISTED_FILES = 4

DOWNLOAD_VARIABLE = "ATLAS_FAST_DOWNLOAD"


def downloads_allowed() -> bool:
    """Whether a pretrained tag whose weights are not cached may be downloaded (``--download`` sets this)."""
    return os.environ.get(DOWNLOAD_VARIABLE, "").lower() in ("1", "true", "yes")


def random_weights(value: str | None) -> bool:
    """Whether ``value`` asks for random weights (None, or one of :data:`RANDOM_WEIGHTS`, any case)."""
    return value is None or value.strip().lower() in RANDOM_WEIGHTS


def names_a_file(value: str) -> bool:
    """Whether ``value`` is meant as a local file rather than an open_clip tag or a shipped checkpoint name: it has a
    weights suffix, a folder separator or a leading ``~``."""
    return (Path(value).suffix.lower() in WEIGHT_SUFFIXES or os.sep in value or "/" in value
            or value.startswith("~"))


def missing_weights_message(value: str, what: str = "weights file") -> str | None:
    """None when ``value`` is not meant as a file or the file is there; else what is wrong (no such file, or a
    folder), the weights files its folder does hold, and where such a file usually comes from. The hint never repeats
    ``value``: the user has just typed it."""
    if not names_a_file(value):
        return None
    path = Path(os.path.expanduser(value))
    if path.is_file():
        return None
    if path.is_dir():
        return (f"{what} {path} is a folder: pass the checkpoint file itself (a {'/'.join(WEIGHT_SUFFIXES)} file). "
                + _where_they_come_from())
    folder = path.parent
    if folder.is_dir():
        found = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in WEIGHT_SUFFIXES and p.is_file())
        if found:
            more = f" and {len(found) - LISTED_FILES} more" if len(found) > LISTED_FILES else ""
            there = f"its folder holds {', '.join(found[:LISTED_FILES])}{more}"
        else:
            there = "its folder holds no weights file"
    else:
        there = "its folder does not exist either"
    return f"{what} not found: {path} ({there}). " + _where_they_come_from(path)


#: where OpenAI's ``clip`` package downloads its ``.pt`` files (and CoOp's users have them)
CLIP_DOWNLOADS = "~/.cache/clip"


def _where_they_come_from(path: Path | None = None) -> str:
    """Where such a file usually comes from; said without repeating ``path``'s folder when it is that place."""
    if path is not None and path.parent == Path(os.path.expanduser(CLIP_DOWNLOADS)):
        openai = ("OpenAI's `clip` package downloads its .pt files into that folder: "
                  "python -c \"import clip; clip.load('ViT-B/16')\" fetches one once")
    else:
        openai = (f"OpenAI's .pt files are what its `clip` package downloads into {CLIP_DOWNLOADS} "
                  f"(clip.load('ViT-B/16'), as CoOp's users have them)")
    return (f"{openai}; open_clip's .safetensors/.bin come from its Hugging Face downloads (with --model naming their "
            f"architecture). Or give an open_clip tag (e.g. openai, with --download to fetch it once) or 'none' for "
            f"random weights.")


# How a user's words for the student's backbone read when the backbone at fault is a teacher's: the loader's messages
# speak of --model / --pretrained, which would change the student.
_STUDENT_OPTIONS = (("the --model it was trained as", "the {model}=MODEL it was trained as"),
                    ("--model naming", "{model}=MODEL naming"),
                    ("`--pretrained ", "`{weights}="), ("--pretrained ", "{weights}="), ("--model ", "{model}="))


def in_teacher_words(text: str, model_option: str = "teacher", weights_option: str = "teacher_pretrained") -> str:
    """``text`` (a loader's message about the student's ``--model`` / ``--pretrained``) with the teacher's own
    ``--method-option`` names in their place."""
    for student, teacher in _STUDENT_OPTIONS:
        text = text.replace(student, teacher.format(model=model_option, weights=weights_option))
    return text
