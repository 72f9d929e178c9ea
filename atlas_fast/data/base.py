"""The data model shared by every dataset reader, the cache and the trainers.

Mirrors Dassl's ``Datum``/``DatasetBase``: a datum is an image path, a
0-based label and a class name; a split set derives its class names from the *train* list only.
"""

from __future__ import annotations

import html
import re
import unicodedata
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from atlas_fast.data.templates import fill_template
from atlas_fast.errors import short_repr


@dataclass(frozen=True)
class Datum:
    """One labelled image. ``key`` is the image path relative to the dataset folder (portable across machines);
    ``impath`` is the absolute path used to read it."""

    impath: str
    label: int
    classname: str
    key: str
    domain: int = 0


@dataclass(frozen=True)
class DatasetSplits:
    """train/val/test lists of one dataset plus what prompts need (class names, hand-crafted template).

    ``name`` is the registry name (e.g. ``OxfordPets``), ``dataset_dir`` the dataset's folder under the data root,
    ``classnames`` are indexed by label, and ``subset`` records how the lists were derived (few-shot K and seed,
    base/new/all) so caches and result records can name them. ``val_is_test`` marks datasets whose val list *is*
    the test list (ImageNet, as in CoOp): few-shot sampling leaves it alone.
    """

    name: str
    dataset_dir: Path
    train: tuple[Datum, ...]
    val: tuple[Datum, ...]
    test: tuple[Datum, ...]
    classnames: tuple[str, ...]
    template: str
    subset: dict = field(default_factory=dict)
    val_is_test: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.classnames)

    def prompts(self) -> list[str]:
        """Hand-crafted prompts of the dataset's template, one per class, with ``_`` in class names replaced by
        spaces (as CoOp does)."""
        return fill_template(self.template, self.classnames)

    def with_lists(self, **changes) -> "DatasetSplits":
        return replace(self, **changes)


def classnames_from(items: tuple[Datum, ...] | list[Datum]) -> tuple[str, ...]:
    """Dassl's rule: ``num_classes = max(label) + 1`` and names from the (label, classname) pairs of the list.

    A label with no item gets an empty name (Dassl would fail later on such a gap; we keep the index aligned)."""
    if not items:
        return ()
    names: dict[int, str] = {}
    for d in items:
        names[d.label] = d.classname
    return tuple(names.get(i, "") for i in range(max(names) + 1))


def prompt_text(classname: str) -> str:
    """What CLIP's tokenizer reads of a class name in a prompt: ``_`` becomes a space (as prompts are filled), then the
    tokenizer's own cleaning (open_clip's ``basic_clean`` and ``whitespace_clean`` and lower case): ftfy's repair
    with Unicode NFC, HTML entities unescaped, runs of white space made one space, no case. Two names with the same
    prompt text get identical prompts and cannot be told apart."""
    text = classname.replace("_", " ")
    try:
        import ftfy  # open_clip's tokenizer cleans with it

        text = ftfy.fix_text(text)
    except ImportError:
        text = unicodedata.normalize("NFC", text)
    text = html.unescape(html.unescape(text))
    return re.sub(r"\s+", " ", text).strip().lower()


def check_distinct_classnames(classnames: Sequence[str], source: object) -> None:
    """Refuse class names that differ but that CLIP's tokenizer cannot tell apart (:func:`prompt_text`: 'Café' in
    NFC and NFD, 'Sea Lion' and 'sea lion', 'red  fox' and 'red fox'), naming both and ``source`` (the dataset's
    folder): their prompts would be identical, so one of the two classes could never be predicted. The same name
    written twice is kept with a warning: CLIP's ImageNet list (CoOp's ``classnames.txt``) has "missile" and
    "sunglasses" twice, and every published ImageNet number was evaluated with them."""
    seen: dict[str, tuple[int, str]] = {}
    repeated: list[str] = []
    for label, name in enumerate(classnames):
        first = seen.setdefault(prompt_text(name), (label, name))
        if first[0] == label:
            continue
        if first[1] != name:
            raise ValueError(f"{source}: classes {first[0]} {short_repr(first[1])} and {label} {short_repr(name)} are "
                             f"the same text to CLIP's tokenizer (case, white space, '_' and Unicode normalisation "
                             f"aside), so their prompts would be identical; rename one of them.")
        repeated.append(f"{first[0]} and {label} {short_repr(name)}")
    if repeated:
        warnings.warn(f"{source}: classes {'; '.join(repeated)} are named alike, so their prompts are identical and a "
                      f"prompt shared by all classes predicts the first of each pair (as in the reference code, which "
                      f"keeps CLIP's names).")
