"""Hand-crafted prompt templates, one table per use (``{}`` is replaced by the class name with ``_`` -> space).

* :data:`ATLAS_TEMPLATES` -- the per-dataset prompts of the ATLaS paper (appendix "Implementation Details"), used by
  CSL/ISL to build soft labels; this is ``DatasetSplits.template``. It equals CoOp's table except DTD.
* :data:`CUSTOM_TEMPLATES` -- CoOp's ``ZeroshotCLIP`` prompts (``trainers/zsclip.py``), for zero-shot baselines.
* :data:`IMAGENET_TEMPLATES_SELECT` -- the 7 prompts ``ZeroshotCLIP2`` ensembles (plus the dataset's CUSTOM prompt when
  the dataset is not ImageNet).

Tables are keyed by registry name (``OxfordPets``, ``DescribableTextures``, ...). A dataset registered with
``register_split_json_dataset`` gets its own template from both lookups; any other name (a ``{train,val,test}/<class>``
folder dataset, whose ``DatasetSplits.name`` is its folder name) gets :data:`DEFAULT_TEMPLATE`.
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

IMAGENET_TEMPLATES_SELECT = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)


def check_template(template: str, owner: str) -> None:
    """Reject a template without exactly one ``{}`` for the class name (``owner`` names the config in the error)."""
    if template.count("{}") != 1:
        raise ValueError(f"{owner}.template must contain one '{{}}' for the class name, got {template!r}")


def fill_template(template: str, classnames: Sequence[str]) -> list[str]:
    """One prompt per class: ``template`` with ``{}`` replaced by the class name, ``_`` -> space (as CoOp does)."""
    return [template.format(name.replace("_", " ")) for name in classnames]


def atlas_template(name: str) -> str:
    """The ATLaS soft-label template of a dataset (registry or CoOp config name, any case)."""
    return _lookup(ATLAS_TEMPLATES, name)


def zeroshot_template(name: str) -> str:
    """CoOp's zero-shot CLIP template of a dataset (registry or CoOp config name, any case); DTD: ``{} texture.``."""
    return _lookup(CUSTOM_TEMPLATES, name)


def _lookup(table: MappingProxyType, name: str) -> str:
    # Imported here: the registry imports this module's tables at import time.
    from atlas_fast.data.datasets import find_spec

    spec = find_spec(name)
    return DEFAULT_TEMPLATE if spec is None else table.get(spec.name, spec.template)
