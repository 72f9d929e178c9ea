"""What a stand-in of one of the 15 CoOp benchmarks holds, before a file is written: the request, the benchmark's
real classes and split sizes, where each image lies and the split or class-name files of its layout.

What is real: the folder and file layout each reader of :mod:`atlas_fast.data.datasets` expects (split_zhou JSON
files, ImageNet's ``images/{train,val}/<wnid>/`` with ``classnames.txt``, the variants' folders, FGVC-Aircraft's
txt files), the class names in label order (``standin_classes.json``, gathered from the datasets' public class
lists) and the published split sizes (:data:`atlas_fast.data.check.PUBLISHED_SIZES`).

The sizes (``test_fraction``, ``train_per_class``, images spread evenly over the classes) are as docs/data-check.md
(section Stand-ins of the 15 benchmarks) states them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from atlas_fast.data.check import PUBLISHED_SIZES
from atlas_fast.data.datasets import BUILTIN_DATASETS, dataset_spec
from atlas_fast.data.layouts import SplitJsonLayout

DEFAULT_TRAIN_PER_CLASS = 16
SPLITS = ("train", "val", "test")

#: Where each dataset's images lie, relative to its folder, by split ("*": every split). {folder}: the class's
#: on-disk name (folder, wnid, file stem, UCF101's CamelCase action), {name}: its class name, {label}: its label,
#: {n}: a running number over the dataset's images.
_PATHS: dict[str, dict[str, str]] = {
    "ImageNet": {"train": "images/train/{folder}/{folder}_{n}.JPEG",
                 "test": "images/val/{folder}/ILSVRC2012_val_{n:08d}.JPEG"},
    "Caltech101": {"*": "101_ObjectCategories/{folder}/image_{n:04d}.jpg"},
    "OxfordPets": {"*": "images/{folder}_{n}.jpg"},
    "StanfordCars": {"train": "cars_train/{n:05d}.jpg", "val": "cars_train/{n:05d}.jpg",
                     "test": "cars_test/{n:05d}.jpg"},
    "OxfordFlowers": {"*": "jpg/image_{n:05d}.jpg"},
    "Food101": {"*": "images/{name}/{n:07d}.jpg"},
    "FGVCAircraft": {"*": "images/{n:07d}.jpg"},
    "SUN397": {"*": "SUN397/{folder}/sun_{n:06d}.jpg"},
    "DescribableTextures": {"*": "images/{name}/{name}_{n:04d}.jpg"},
    "EuroSAT": {"*": "2750/{folder}/{folder}_{n}.jpg"},
    "UCF101": {"*": "UCF-101-midframes/{name}/v_{folder}_g{n:04d}_c01.jpg"},
    "ImageNetV2": {"test": "imagenetv2-matched-frequency-format-val/{label}/{n}.jpeg"},
    "ImageNetSketch": {"test": "images/{folder}/sketch_{n}.JPEG"},
    "ImageNetA": {"test": "imagenet-a/{folder}/{n:06d}.jpg"},
    "ImageNetR": {"test": "imagenet-r/{folder}/art_{n}.jpg"},
}
_IMAGENET_FAMILY = ("ImageNet", "ImageNetV2", "ImageNetSketch", "ImageNetA", "ImageNetR")


@dataclass(frozen=True)
class StandinRequest:
    """What to write: the fraction of each test and val split, training images per class, the images' seed."""

    test_fraction: float = 1.0
    train_per_class: int = DEFAULT_TRAIN_PER_CLASS
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.test_fraction, bool) or not 0 < self.test_fraction <= 1:
            raise ValueError(f"test fraction {self.test_fraction!r} is outside the valid range 0 < F <= 1 (F = 1 "
                             f"writes the published test and val splits in full).")
        if isinstance(self.train_per_class, bool) or not isinstance(self.train_per_class, int) or \
                self.train_per_class < 1:
            raise ValueError(f"training images per class {self.train_per_class!r} must be a whole number >= 1.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed {self.seed!r} must be a whole number >= 0.")


@dataclass(frozen=True)
class StandinClass:
    """One class: its on-disk name (folder, wnid, file stem; "" where the layout has none), its class name as the
    reader gives it, and how many images each split holds."""

    folder: str
    name: str
    train: int
    val: int
    test: int


@dataclass(frozen=True)
class StandinPlan:
    """Everything written for one dataset, before a file is written."""

    name: str
    folder: str
    request: StandinRequest
    classes: tuple[StandinClass, ...]

    def counts(self) -> dict[str, int]:
        """Classes and images per split, as the dataset's reader will count them (no val split where CoOp has
        none)."""
        published = PUBLISHED_SIZES[self.name]
        counts = {"classes": len(self.classes)}
        for split in SPLITS:
            if getattr(published, split) is not None:
                counts[split] = sum(getattr(c, split) for c in self.classes)
        return counts

    def images(self) -> int:
        return sum(c.train + c.val + c.test for c in self.classes)


@lru_cache(maxsize=1)
def _class_lists() -> dict:
    text = resources.files("atlas_fast.world").joinpath("standin_classes.json").read_text(encoding="utf-8")
    return json.loads(text)


def real_classes(name: str) -> list[tuple[str, str]]:
    """(on-disk name, class name) of each class of benchmark ``name`` in label order, as CoOp's reader gives them."""
    lists = _class_lists()
    if name in ("ImageNet", "ImageNetV2", "ImageNetSketch"):
        return [(wnid, classname) for wnid, classname in lists["ImageNet"]["classes"]]
    if name in ("ImageNetA", "ImageNetR"):
        names = dict(real_classes("ImageNet"))
        return [(wnid, names[wnid]) for wnid in lists[name]["wnids"]]
    entry = lists[name]
    if "classes" in entry:
        return [(folder, classname) for folder, classname in entry["classes"]]
    return [("", classname) for classname in entry["names"]]


def imagenet_classnames() -> list[tuple[str, str]]:
    """ImageNet's ``classnames.txt``: (wnid, class name), 1000 lines in sorted wnid order (label order)."""
    return real_classes("ImageNet")


def spread(total: int, classes: int) -> list[int]:
    """``total`` images over ``classes`` classes as evenly as possible (the first ``total mod classes`` get one
    more)."""
    base, extra = divmod(total, classes)
    return [base + (1 if i < extra else 0) for i in range(classes)]


def scaled_size(published: int, fraction: float, classes: int) -> int:
    """A test or val split's size at ``fraction``: ``max(classes, floor(fraction * published + 0.5))``, so that
    every class keeps at least one image; ``fraction == 1`` gives the published size."""
    return published if fraction == 1 else max(classes, int(fraction * published + 0.5))


def plan_standin(name: str, request: StandinRequest = StandinRequest(), full_train: bool = False) -> StandinPlan:
    """The classes and per-class split sizes of benchmark ``name`` for ``request``; ``full_train`` plans the
    published training set instead of ``train_per_class`` images per class (what a full copy holds)."""
    if name not in PUBLISHED_SIZES:
        raise ValueError(f"no stand-in for {name!r}: stand-ins exist for the 15 benchmarks "
                         f"({', '.join(BUILTIN_DATASETS)}).")
    published = PUBLISHED_SIZES[name]
    pairs = real_classes(name)
    if len(pairs) != published.classes:
        raise AssertionError(f"{name}: {len(pairs)} class names for {published.classes} published classes")
    k = len(pairs)
    per_split = {}
    for split in SPLITS:
        size = getattr(published, split)
        if size is None:
            per_split[split] = [0] * k
        elif split == "train":
            share = spread(size, k)
            per_split[split] = share if full_train else [min(request.train_per_class, s) for s in share]
        else:
            per_split[split] = spread(scaled_size(size, request.test_fraction, k), k)
    classes = tuple(StandinClass(folder, classname, per_split["train"][i], per_split["val"][i], per_split["test"][i])
                    for i, (folder, classname) in enumerate(pairs))
    return StandinPlan(name, dataset_spec(name).folder, request, classes)


def image_paths(plan: StandinPlan) -> dict[str, list[tuple[int, str]]]:
    """split -> [(label, path relative to the dataset folder)] of every image, classes in label order."""
    templates = _PATHS[plan.name]
    paths: dict[str, list[tuple[int, str]]] = {split: [] for split in SPLITS}
    n = 0
    for split in SPLITS:
        for label, cls in enumerate(plan.classes):
            for _ in range(getattr(cls, split)):
                n += 1
                template = templates.get(split, templates.get("*"))
                paths[split].append((label, template.format(folder=cls.folder, name=cls.name, label=label, n=n)))
    return paths


def layout_files(plan: StandinPlan, paths: dict[str, list[tuple[int, str]]]) -> dict[str, str]:
    """The split or class-name files of the dataset's layout: relative path -> text (the images are written
    separately)."""
    layout = dataset_spec(plan.name).layout
    if isinstance(layout, SplitJsonLayout):
        prefix = f"{layout.image_prefix}/" if layout.image_prefix else ""
        split = {}
        for name in SPLITS:
            entries = []
            for label, relative in paths[name]:
                assert relative.startswith(prefix), (relative, prefix)
                entries.append([relative[len(prefix):], label, plan.classes[label].name])
            split[name] = entries
        return {layout.split_file: json.dumps(split, indent=4, separators=(",", ": "))}
    if plan.name == "FGVCAircraft":
        files = {"variants.txt": "".join(f"{c.name}\n" for c in plan.classes)}
        for name in SPLITS:
            lines = [f"{Path(relative).stem} {plan.classes[label].name}\n" for label, relative in paths[name]]
            files[f"images_variant_{name}.txt"] = "".join(lines)
        return files
    if plan.name in _IMAGENET_FAMILY:
        files = {"classnames.txt": "".join(f"{wnid} {classname}\n" for wnid, classname in imagenet_classnames())}
        if plan.name in ("ImageNetA", "ImageNetR"):
            image_folder = _PATHS[plan.name]["test"].split("/")[0]
            files[f"{image_folder}/README.txt"] = ("Stand-in written by atlas-fast data standins (the real archive "
                                                   "has a README.txt here).\n")
        return files
    raise AssertionError(f"no layout writer for {plan.name}")
