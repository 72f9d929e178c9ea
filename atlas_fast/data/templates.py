"""Hand-crafted prompt templates, one table per use (``{}`` is replaced by the class name with ``_`` -> space).

* :data:`ATLAS_TEMPLATES` -- the per-dataset prompts of the ATLaS paper (appendix "Implementation Details"), used by
  CSL/ISL to build soft labels; this is ``DatasetSplits.template``. It equals CoOp's table except DTD.
* :data:`CUSTOM_TEMPLATES` -- CoOp's ``ZeroshotCLIP`` prompts (``trainers/zsclip.py``), for zero-shot baselines.
* :data:`IMAGENET_TEMPLATES` -- the 60 prompts of CLIP's ImageNet prompt-engineering notebook, whose averaged
  (un-normalised) text features are PromptSRC's frozen text targets.

Tables are keyed by registry name (``OxfordPets``, ``DescribableTextures``, ...); the lookups by dataset name
(``atlas_template``, ``zeroshot_template``) live with the registry in ``datasets.py``, so this module imports nothing
of the data package. A dataset registered with ``register_split_json_dataset`` gets its own template from both;
any other name (a folder dataset) gets :data:`DEFAULT_TEMPLATE`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Sequence

DEFAULT_TEMPLATE = "a photo of a {}."

_IMAGENET_FAMILY = ("ImageNet", "ImageNetV2", "ImageNetSketch", "ImageNetA", "ImageNetR")

CUSTOM_TEMPLATES = MappingProxyType({
    "OxfordPets": "a photo of a {}, a type of pet.",
    "OxfordFlowers": "a photo of a {}, a type of flower.",
    "FGVCAircraft": "a photo of a {}, a type of aircraft.",
    "DescribableTextures": "{} texture.",
    "EuroSAT": "a centered satellite photo of {}.",
    "StanfordCars": "a photo of a {}.",
    "Food101": "a photo of {}, a type of food.",
    "SUN397": "a photo of a {}.",
    "Caltech101": "a photo of a {}.",
    "UCF101": "a photo of a person doing {}.",
    **{name: "a photo of a {}." for name in _IMAGENET_FAMILY},
})

ATLAS_TEMPLATES = MappingProxyType({
    **CUSTOM_TEMPLATES,
    "DescribableTextures": "a photo of a {}, a type of texture.",
})

IMAGENET_TEMPLATES = (
    "a photo of a {}.",
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
)


def check_template(template: str, owner: str) -> None:
    """Reject a template without exactly one ``{}`` for the class name (``owner`` names the config in the error)."""
    if template.count("{}") != 1:
        raise ValueError(f"{owner}.template must contain one '{{}}' for the class name, got {template!r}")


def fill_template(template: str, classnames: Sequence[str]) -> list[str]:
    """One prompt per class: ``template`` with ``{}`` replaced by the class name, ``_`` -> space (as CoOp does)."""
    return [template.format(name.replace("_", " ")) for name in classnames]
