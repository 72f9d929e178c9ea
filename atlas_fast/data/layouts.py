"""The on-disk layouts of the 15 CoOp benchmarks and of a user's own data, and their readers.

A :class:`Layout` reads a dataset folder's train/val/test lists and describes the tree it expects (for the error when
something is missing); the registry (:mod:`atlas_fast.data.datasets`) pairs each dataset with its layout. Each
layout reads its lists as the reference code (CoOp's dataset classes on Dassl) does, with the label and name rules
of docs/protocol.md (section Datasets and layout). A split file is untrusted input: its paths must stay inside the
dataset folder and its labels run 0..K-1 over its K class names, checked in memory proportional to its entries
(never sized by a label). ImageNet's image names are **sorted** (Dassl lists them in file-system order): a
documented deviation so that few-shot subsets do not depend on the file system. Keys (``Datum.key``) are posix paths
relative to the dataset folder, so caches are portable across machines.
"""

from __future__ import annotations

import math
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from atlas_fast.files import JsonFileError, read_json
from atlas_fast.progress import progress_bar

from atlas_fast.data.base import Datum

SplitLists = tuple[list[Datum], list[Datum], list[Datum]]

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
_PROGRESS_MIN_ITEMS = 20_000  # no progress bar for lists read in well under a second


class DatasetLayoutError(FileNotFoundError):
    """A dataset folder, split file, image folder or image file is missing (the message shows the expected layout)."""


class DatasetFormatError(ValueError):
    """A split file is malformed (the message names the file and the line or entry at fault)."""



class Layout(Protocol):
    """How one dataset is stored: reads the three lists and describes the expected tree for error messages."""

    val_is_test: bool
    test_only: bool

    def read(self, dataset_dir: Path) -> SplitLists: ...

    def tree(self, dataset_dir: Path) -> str: ...


def _require(path: Path, what: str, layout: Layout, dataset_dir: Path, is_dir: bool) -> None:
    found = path.is_dir() if is_dir else path.is_file()
    if not found:
        raise DatasetLayoutError(
            f"{what} not found: {path}\nExpected layout:\n{layout.tree(dataset_dir)}")


def _datum(dataset_dir: Path, key: str, label: int, classname: str) -> Datum:
    return Datum(impath=str(dataset_dir / key), label=label, classname=classname, key=key)


def _check_files_exist(items: list[Datum], source: str) -> None:
    """Dassl's ``Datum`` asserts that each image exists; do the same, naming the split file that lists it."""
    for d in progress_bar(items, desc=f"checking images of {Path(source).name}", unit="img",
                          enabled=len(items) >= _PROGRESS_MIN_ITEMS, leave=False):
        if not os.path.isfile(d.impath):
            raise DatasetLayoutError(f"image file listed in {source} not found: {d.impath}")


def _nonblank_lines(path: Path) -> list[tuple[int, str]]:
    """(1-based line number, stripped line) pairs; trailing blank lines are ignored, blank lines inside are an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise DatasetFormatError(f"{path}:{number}: blank line (every line must name a class or image)")
        out.append((number, line.strip()))
    return out


def read_wnid_classnames(path: Path) -> dict[str, str]:
    """``classnames.txt`` of the ImageNet family: ``<wnid> <class name words...>`` per line, file order kept."""
    names: dict[str, str] = {}
    for number, line in _nonblank_lines(path):
        wnid, _, classname = line.partition(" ")  # = Dassl's split(" ") then " ".join(tokens[1:])
        if not classname.strip():
            raise DatasetFormatError(f"{path}:{number}: expected '<wnid> <class name>', got {line!r}")
        if wnid in names:
            raise DatasetFormatError(f"{path}:{number}: wnid {wnid!r} listed twice")
        names[wnid] = classname
    return names


def _files_in(folder: Path, suffixes: frozenset[str] | None = None) -> list[str]:
    """Sorted non-hidden file names in ``folder`` (optionally only those with an image suffix)."""
    return sorted(e.name for e in os.scandir(folder)
                  if not e.name.startswith(".") and e.is_file()
                  and (suffixes is None or Path(e.name).suffix.lower() in suffixes))


def _subfolders(folder: Path) -> list[str]:
    """Sorted non-hidden sub-folder names (Dassl: sorted ``listdir_nohidden``; files such as README.txt are skipped)."""
    return sorted(e.name for e in os.scandir(folder) if not e.name.startswith(".") and e.is_dir())


@dataclass(frozen=True)
class SplitJsonLayout:
    """CoOp's ``split_zhou_<Name>.json``: ``{"train"|"val"|"test": [[relative_path, label, classname], ...]}``.

    ``image_prefix`` is the folder the JSON paths are relative to, itself relative to the dataset folder
    (``""`` = the dataset folder, as for StanfordCars)."""

    image_prefix: str
    split_file: str
    val_is_test: bool = False
    test_only: bool = False

    def tree(self, dataset_dir: Path) -> str:
        images = (f"  {self.image_prefix}/   image files; JSON paths are relative to this folder"
                  if self.image_prefix else
                  "  <image folders>/   JSON paths are relative to the dataset folder (e.g. cars_train/00001.jpg)")
        return (f"{dataset_dir}/\n{images}\n  {self.split_file}   "
                '{"train": [[relative_path, label, classname], ...], "val": [...], "test": [...]}')

    def read(self, dataset_dir: Path) -> SplitLists:
        split_path = dataset_dir / self.split_file
        _require(split_path, "split file", self, dataset_dir, is_dir=False)
        if self.image_prefix:
            _require(dataset_dir / self.image_prefix, "image folder", self, dataset_dir, is_dir=True)
        try:  # no size bound (the lists are kept in memory anyway), but one on nesting: never a RecursionError
            split = read_json(split_path, max_bytes=math.inf)
        except JsonFileError as exc:
            if exc.position is None:
                raise DatasetFormatError(f"{split_path}: it {exc.reason}") from None
            line, column, what = exc.position
            raise DatasetFormatError(f"{split_path}:{line}:{column}: invalid JSON ({what})") from None
        if not isinstance(split, dict) or not {"train", "val", "test"} <= split.keys():
            raise DatasetFormatError(f"{split_path}: expected an object with keys 'train', 'val', 'test'")
        train, val, test = (self._convert(dataset_dir, split_path, name, split[name])
                            for name in ("train", "val", "test"))
        _check_consistent_classes(split_path, (train, val, test))
        _check_label_range(split_path, (train, val, test))
        return train, val, test

    def _convert(self, dataset_dir: Path, split_path: Path, name: str, entries: object) -> list[Datum]:
        if not isinstance(entries, list):
            raise DatasetFormatError(f"{split_path}: '{name}' must be a list of [relative_path, label, classname]")
        items = []
        for index, entry in enumerate(entries):
            valid = (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                     and isinstance(entry[2], str) and _is_label(entry[1]))
            if not valid or entry[0].startswith("/") or not entry[0]:
                raise DatasetFormatError(
                    f"{split_path}: entry {name}[{index}] = {entry!r}; expected [relative_path, label >= 0, classname]")
            key = posixpath.join(self.image_prefix, entry[0]) if self.image_prefix else entry[0]
            _check_inside(key, f"{split_path}: entry {name}[{index}] = {entry!r}", dataset_dir)
            items.append(_datum(dataset_dir, key, int(entry[1]), entry[2]))
        _check_files_exist(items, f"{split_path} ('{name}')")
        return items


def _check_inside(key: str, where: str, dataset_dir: Path) -> None:
    """A path read from a split file must name a file inside the dataset folder: no ``..`` escapes."""
    normalized = posixpath.normpath(key)
    if normalized == ".." or normalized.startswith("../") or posixpath.isabs(normalized):
        raise DatasetFormatError(f"{where}: the path leaves the dataset folder {dataset_dir}; split files may only "
                                 f"name images inside it.")


def _check_consistent_classes(source: Path, lists: SplitLists) -> None:
    """Every label must carry one class name, and every class name one label, across train/val/test (a split file
    whose entries disagree would otherwise rename a class silently)."""
    name_of: dict[int, tuple[str, str]] = {}
    label_of: dict[str, tuple[int, str]] = {}
    for split, items in zip(("train", "val", "test"), lists):
        for index, d in enumerate(items):
            where = f"{split}[{index}]"
            first_name, first_where = name_of.setdefault(d.label, (d.classname, where))
            if first_name != d.classname:
                raise DatasetFormatError(f"{source}: entry {where} gives label {d.label} the class name "
                                         f"{d.classname!r}, but {first_where} calls it {first_name!r}; fix the entry.")
            first_label, first_where = label_of.setdefault(d.classname, (d.label, where))
            if first_label != d.label:
                raise DatasetFormatError(f"{source}: entry {where} gives class {d.classname!r} label {d.label}, but "
                                         f"{first_where} gives it label {first_label}; fix the entry.")


def _check_label_range(source: Path, lists: SplitLists) -> None:
    """Labels must be 0..K-1 for the K class names of the file (each label has one name and each name one label,
    :func:`_check_consistent_classes`). Checked in memory proportional to the entries, never to a label's value:
    a hostile label such as 30000000 must not size a list of class names."""
    count = len({d.classname for items in lists for d in items})
    for split, items in zip(("train", "val", "test"), lists):
        for index, d in enumerate(items):
            if d.label >= count:
                raise DatasetFormatError(
                    f"{source}: entry {split}[{index}] has label {d.label}, but the file names {count} class(es): "
                    f"labels must run 0..{count - 1}, one per class name; fix the entry.")


def _is_label(value: object) -> bool:
    """Dassl casts labels with ``int()``; accept ints and integral strings/floats, never negatives or bools."""
    if isinstance(value, bool):
        return False
    try:
        return int(value) == float(value) and int(value) >= 0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class AircraftLayout:
    """FGVC-Aircraft 2013b ``data/``: label = line index of ``variants.txt``; lists ``<image_id> <variant name>``."""

    val_is_test: bool = False
    test_only: bool = False

    def tree(self, dataset_dir: Path) -> str:
        return (f"{dataset_dir}/   (the data/ folder of fgvc-aircraft-2013b)\n"
                "  images/<image_id>.jpg\n"
                "  variants.txt   one variant name per line; label = line index\n"
                "  images_variant_train.txt, images_variant_val.txt, images_variant_test.txt   "
                "'<image_id> <variant name>' per line")

    def read(self, dataset_dir: Path) -> SplitLists:
        variants_path = dataset_dir / "variants.txt"
        _require(variants_path, "class list", self, dataset_dir, is_dir=False)
        _require(dataset_dir / "images", "image folder", self, dataset_dir, is_dir=True)
        label_of: dict[str, int] = {}
        for number, name in _nonblank_lines(variants_path):
            if name in label_of:
                raise DatasetFormatError(f"{variants_path}:{number}: variant {name!r} listed twice")
            label_of[name] = len(label_of)
        train, val, test = (self._read_list(dataset_dir, split, label_of) for split in ("train", "val", "test"))
        return train, val, test

    def _read_list(self, dataset_dir: Path, split: str, label_of: dict[str, int]) -> list[Datum]:
        list_path = dataset_dir / f"images_variant_{split}.txt"
        _require(list_path, "split file", self, dataset_dir, is_dir=False)
        items = []
        for number, line in _nonblank_lines(list_path):
            image_id, _, variant = line.partition(" ")
            if "/" in image_id or image_id in (".", ".."):
                raise DatasetFormatError(f"{list_path}:{number}: image id {image_id!r} is not a plain file name "
                                         f"(images must lie in {dataset_dir / 'images'})")
            if variant not in label_of:
                raise DatasetFormatError(
                    f"{list_path}:{number}: variant {variant!r} is not in variants.txt (line {line!r})")
            items.append(_datum(dataset_dir, f"images/{image_id}.jpg", label_of[variant], variant))
        _check_files_exist(items, str(list_path))
        return items


@dataclass(frozen=True)
class ImageNetLayout:
    """``images/{train,val}/<wnid>/`` + ``classnames.txt``; labels = index in each split's sorted wnid folders."""

    val_is_test: bool = True
    test_only: bool = False

    def tree(self, dataset_dir: Path) -> str:
        return (f"{dataset_dir}/\n"
                "  images/train/<wnid>/<images>   one folder per class (n01440764, ...)\n"
                "  images/val/<wnid>/<images>     the validation set sorted into the same class folders\n"
                "  classnames.txt                 '<wnid> <class name>' per line")

    def read(self, dataset_dir: Path) -> SplitLists:
        names_path = dataset_dir / "classnames.txt"
        _require(names_path, "class-name file", self, dataset_dir, is_dir=False)
        classnames = read_wnid_classnames(names_path)
        wnids = {}
        for split in ("train", "val"):
            split_dir = dataset_dir / "images" / split
            _require(split_dir, "image folder", self, dataset_dir, is_dir=True)
            wnids[split] = _subfolders(split_dir)
        if wnids["train"] != wnids["val"]:  # labels are folder positions, counted per split: they must agree
            only = sorted(set(wnids["train"]) ^ set(wnids["val"]))
            raise DatasetLayoutError(f"images/train and images/val of {dataset_dir} hold different class folders "
                                     f"(e.g. {only[:3]})\nExpected layout:\n{self.tree(dataset_dir)}")
        train, test = (_read_wnid_folders(dataset_dir, dataset_dir / "images" / split, wnids[split], classnames,
                                          names_path) for split in ("train", "val"))
        return train, test, test


def _read_wnid_folders(dataset_dir: Path, image_dir: Path, wnids: list[str], classnames: dict[str, str],
                       names_path: Path) -> list[Datum]:
    """Label = position in ``wnids``; class name looked up by wnid; image names sorted."""
    items = []
    prefix = image_dir.relative_to(dataset_dir).as_posix()
    for label, wnid in enumerate(progress_bar(wnids, desc=f"listing {prefix}", unit="class",
                                              enabled=len(wnids) >= 100, leave=False)):
        if wnid not in classnames:
            raise DatasetFormatError(f"class folder {image_dir / wnid} has no line in {names_path}")
        names = _files_in(image_dir / wnid)
        if not names:
            raise DatasetLayoutError(f"class folder {image_dir / wnid} holds no images; remove the folder or add "
                                     f"its images (labels are the positions of the class folders)")
        for name in names:
            items.append(_datum(dataset_dir, f"{prefix}/{wnid}/{name}", label, classnames[wnid]))
    return items


@dataclass(frozen=True)
class WnidFolderLayout:
    """Test-only ImageNet variant with ``<image_folder>/<wnid>/`` + ``classnames.txt`` (Sketch, -A, -R).

    Labels are the positions of the wnid folders present, sorted: 0..999 for Sketch (= ImageNet's labels) and
    0..199 for -A/-R (200-way, not indices into ImageNet's 1000 classes)."""

    image_folder: str
    val_is_test: bool = False
    test_only: bool = True

    def tree(self, dataset_dir: Path) -> str:
        return (f"{dataset_dir}/\n"
                f"  {self.image_folder}/<wnid>/<images>   one folder per class present (README.txt is ignored)\n"
                "  classnames.txt   '<wnid> <class name>' per line (ImageNet's 1000-line file)")

    def read(self, dataset_dir: Path) -> SplitLists:
        names_path = dataset_dir / "classnames.txt"
        image_dir = dataset_dir / self.image_folder
        _require(names_path, "class-name file", self, dataset_dir, is_dir=False)
        _require(image_dir, "image folder", self, dataset_dir, is_dir=True)
        data = _read_wnid_folders(dataset_dir, image_dir, _subfolders(image_dir), read_wnid_classnames(names_path),
                                  names_path)
        return [], [], data


@dataclass(frozen=True)
class ImageNetV2Layout:
    """``imagenetv2-matched-frequency-format-val/<0..N-1>/``: label = folder number, name = line ``label`` of
    ``classnames.txt`` (whose order must therefore be ImageNet's index order)."""

    image_folder: str = "imagenetv2-matched-frequency-format-val"
    val_is_test: bool = False
    test_only: bool = True

    def tree(self, dataset_dir: Path) -> str:
        return (f"{dataset_dir}/\n"
                f"  {self.image_folder}/<0..999>/<images>   folder name = label\n"
                "  classnames.txt   ImageNet's '<wnid> <class name>' file; line i names label i")

    def read(self, dataset_dir: Path) -> SplitLists:
        names_path = dataset_dir / "classnames.txt"
        image_dir = dataset_dir / self.image_folder
        _require(names_path, "class-name file", self, dataset_dir, is_dir=False)
        _require(image_dir, "image folder", self, dataset_dir, is_dir=True)
        data = []
        classnames = list(read_wnid_classnames(names_path).values())
        for label, classname in enumerate(progress_bar(classnames, desc=f"listing {self.image_folder}",
                                                       unit="class", enabled=len(classnames) >= 100, leave=False)):
            _require(image_dir / str(label), f"class folder of label {label}", self, dataset_dir, is_dir=True)
            names = _files_in(image_dir / str(label))
            if not names:
                raise DatasetLayoutError(f"class folder {image_dir / str(label)} holds no images")
            for name in names:
                data.append(_datum(dataset_dir, f"{self.image_folder}/{label}/{name}", label, classname))
        return [], [], data


@dataclass(frozen=True)
class ClassFolderLayout:
    """A user's own data: ``{train,val,test}/<class>/<images>``; labels by the sorted class folders of ``train``,
    ``val`` optional. Only files with an image suffix are listed; images are sorted by name."""

    val_is_test: bool = False
    test_only: bool = False

    def tree(self, dataset_dir: Path) -> str:
        return (f"{dataset_dir}/\n"
                "  train/<class name>/<images>   one folder per class; label = index in the sorted folder names\n"
                "  val/<class name>/<images>     optional; classes must also be in train/\n"
                "  test/<class name>/<images>    classes must also be in train/")

    def read(self, dataset_dir: Path) -> SplitLists:
        _require(dataset_dir / "train", "train folder", self, dataset_dir, is_dir=True)
        _require(dataset_dir / "test", "test folder", self, dataset_dir, is_dir=True)
        classes = _subfolders(dataset_dir / "train")
        if not classes:
            raise DatasetLayoutError(f"no class folders in {dataset_dir / 'train'}\n"
                                     f"Expected layout:\n{self.tree(dataset_dir)}")
        label_of = {c: i for i, c in enumerate(classes)}
        splits = [self._read_split(dataset_dir, s, label_of) if (dataset_dir / s).is_dir() else []
                  for s in ("train", "val", "test")]
        return splits[0], splits[1], splits[2]

    def _read_split(self, dataset_dir: Path, split: str, label_of: dict[str, int]) -> list[Datum]:
        items = []
        for classname in _subfolders(dataset_dir / split):
            if classname not in label_of:
                raise DatasetLayoutError(f"class folder {dataset_dir / split / classname} has no counterpart in "
                                         f"{dataset_dir / 'train'}\nExpected layout:\n{self.tree(dataset_dir)}")
            names = _files_in(dataset_dir / split / classname, IMAGE_SUFFIXES)
            if split == "train" and not names:
                raise DatasetLayoutError(f"class folder {dataset_dir / split / classname} holds no image files "
                                         f"(suffixes: {', '.join(sorted(IMAGE_SUFFIXES))})")
            for name in names:
                items.append(_datum(dataset_dir, f"{split}/{classname}/{name}", label_of[classname], classname))
        return items
