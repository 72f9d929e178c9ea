"""The data model shared by every dataset reader, the cache and the trainers.

Mirrors Dassl's ``Datum``/``DatasetBase``: a datum is an image path, a
0-based label and a class name; a split set derives its class names from the *train* list only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from atlas_fast.data.templates import fill_template


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

    def prompts(self, template: str | None = None) -> list[str]:
        """Hand-crafted prompts, one per class, with ``_`` in class names replaced by spaces (as CoOp does)."""
        return fill_template(template or self.template, self.classnames)

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
