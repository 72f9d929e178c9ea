"""``atlas-fast data check``: what is present under a data root, its layout, its counts against the published split
sizes, what is missing or wrong and how to fix it (one line each), and which images do not decode.

The readers of :mod:`atlas_fast.data.datasets` stop at the first fault of the dataset a run reaches; this module
looks at every dataset asked for and names every fault it can see (docs/data-check.md). The published sizes are
CoOp's fixed splits. A count that differs is a warning (a subset may be deliberate); a missing or malformed file, an
empty split and an image that does not decode are errors.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from atlas_fast.data.datasets import DatasetSpec, dataset_spec
from atlas_fast.data.layouts import (AircraftLayout, ClassFolderLayout, ImageNetLayout, ImageNetV2Layout,
                                     SplitJsonLayout, WnidFolderLayout)

#: The manifest a stand-in dataset (generated images in the real layout) carries in its folder.
STANDIN_MANIFEST = "STANDIN.json"

#: Images decoded per dataset by default (spread over its splits, the same ones each time).
DEFAULT_SAMPLE = 64


@dataclass(frozen=True)
class SplitSizes:
    """Published class and image counts of a dataset's fixed split (None: the split does not exist)."""

    classes: int
    train: int | None
    val: int | None
    test: int


#: CoOp's fixed splits, as its paper's dataset table gives them (ImageNet: the ILSVRC-2012 train set; its val set is
#: the test set, so CoOp has no separate val split).
PUBLISHED_SIZES: dict[str, SplitSizes] = {
    "ImageNet": SplitSizes(1000, 1_281_167, None, 50_000),
    "Caltech101": SplitSizes(100, 4_128, 1_649, 2_465),
    "OxfordPets": SplitSizes(37, 2_944, 736, 3_669),
    "StanfordCars": SplitSizes(196, 6_509, 1_635, 8_041),
    "OxfordFlowers": SplitSizes(102, 4_093, 1_633, 2_463),
    "Food101": SplitSizes(101, 50_500, 20_200, 30_300),
    "FGVCAircraft": SplitSizes(100, 3_334, 3_333, 3_333),
    "SUN397": SplitSizes(397, 15_880, 3_970, 19_850),
    "DescribableTextures": SplitSizes(47, 2_820, 1_128, 1_692),
    "EuroSAT": SplitSizes(10, 13_500, 5_400, 8_100),
    "UCF101": SplitSizes(101, 7_639, 1_898, 3_783),
    "ImageNetV2": SplitSizes(1000, None, None, 10_000),
    "ImageNetSketch": SplitSizes(1000, None, None, 50_889),
    "ImageNetA": SplitSizes(200, None, None, 7_500),
    "ImageNetR": SplitSizes(200, None, None, 30_000),
}

_SPLIT_SOURCE = "CoOp's fixed split, linked from CoOp's DATASETS.md"
#: Where each benchmark's images come from (the archive to extract into the dataset folder).
IMAGE_SOURCES: dict[str, str] = {
    "ImageNet": "ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from image-net.org, extracted to images/train "
                "and images/val",
    "Caltech101": "101_ObjectCategories.tar.gz (Caltech101, data.caltech.edu)",
    "OxfordPets": "images.tar.gz of the Oxford-IIIT Pet dataset (robots.ox.ac.uk/~vgg/data/pets)",
    "StanfordCars": "cars_train.tgz and cars_test.tgz of Stanford Cars (or a mirror: the original site is gone)",
    "OxfordFlowers": "102flowers.tgz of Oxford Flowers 102 (robots.ox.ac.uk/~vgg/data/flowers/102), giving jpg/",
    "Food101": "food-101.tar.gz (data.vision.ee.ethz.ch), extracted so that food-101/images/ exists",
    "FGVCAircraft": "fgvc-aircraft-2013b.tar.gz (robots.ox.ac.uk/~vgg/data/fgvc-aircraft): its data/ folder, "
                    "renamed fgvc_aircraft/",
    "SUN397": "SUN397.tar.gz (vision.princeton.edu), giving sun397/SUN397/",
    "DescribableTextures": "dtd-r1.0.1.tar.gz (robots.ox.ac.uk/~vgg/data/dtd), giving dtd/images/",
    "EuroSAT": "EuroSAT.zip (RGB), extracted so that eurosat/2750/ exists",
    "UCF101": "UCF-101-midframes.zip (the middle frames, linked from CoOp's DATASETS.md)",
    "ImageNetV2": "imagenetv2-matched-frequency.tar.gz (github.com/modestyachts/ImageNetV2)",
    "ImageNetSketch": "ImageNet-Sketch (github.com/HaohanWang/ImageNet-Sketch), extracted to images/",
    "ImageNetA": "imagenet-a.tar (github.com/hendrycks/natural-adv-examples)",
    "ImageNetR": "imagenet-r.tar (github.com/hendrycks/imagenet-r)",
}
SORT_VAL_COMMAND = ("atlas-fast data sort-imagenet-val --data-root {root} --devkit ILSVRC2012_devkit_t12.tar.gz "
                    "(moves each val image into images/val/<wnid>/ by the devkit's ground truth)")


@dataclass(frozen=True)
class Finding:
    """One thing found: ``level`` error (the dataset cannot be used as it is), warning (usable, but not what the
    papers used) or ok; what it is, the file or folder, and how to fix it."""

    level: str
    what: str
    path: str = ""
    fix: str = ""

    def line(self) -> str:
        where = f"{self.path}: " if self.path else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.level:<7} {where}{self.what}{fix}"


@dataclass
class DatasetCheck:
    """What :func:`check_dataset` found for one dataset."""

    name: str
    folder: str
    layout: str
    findings: list[Finding] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # classes, train, val, test as read
    decoded: int = 0

    @property
    def broken(self) -> bool:
        return any(f.level == "error" for f in self.findings)

    def lines(self) -> list[str]:
        """The report of this dataset: a heading, then one line per finding."""
        state = "BROKEN" if self.broken else "ok"
        heading = f"{self.name}: {state}  {self.folder}  ({self.layout})"
        return [heading] + [f"  {finding.line()}" for finding in self.findings]


def _error(what: str, path: Path | str = "", fix: str = "") -> Finding:
    return Finding("error", what, str(path), fix)


def _warning(what: str, path: Path | str = "", fix: str = "") -> Finding:
    return Finding("warning", what, str(path), fix)


def _image_fix(name: str) -> str:
    source = IMAGE_SOURCES.get(name)
    return f"extract {source}." if source else "put the images there."


def _layout_name(spec: DatasetSpec) -> str:
    layout = spec.layout
    if isinstance(layout, SplitJsonLayout):
        images = f"{layout.image_prefix}/" if layout.image_prefix else "the dataset folder"
        return f"split JSON {layout.split_file}, image paths relative to {images}"
    if isinstance(layout, ImageNetLayout):
        return "images/{train,val}/<wnid>/ + classnames.txt; val is the test set"
    if isinstance(layout, WnidFolderLayout):
        return f"test only: {layout.image_folder}/<wnid>/ + classnames.txt"
    if isinstance(layout, ImageNetV2Layout):
        return f"test only: {layout.image_folder}/<label>/ + classnames.txt"
    if isinstance(layout, AircraftLayout):
        return "FGVC-Aircraft data/: images/ + variants.txt + images_variant_{train,val,test}.txt"
    if isinstance(layout, ClassFolderLayout):
        return "class folders {train,val,test}/<class>/"
    return type(layout).__name__


def _dataset_dir(spec: DatasetSpec, data_root: str | Path) -> Path:
    return Path(os.path.abspath(os.path.expanduser(str(data_root)))) / spec.folder


def _has_images(folder: Path) -> int:
    """How many image files lie directly in ``folder`` (not in sub-folders)."""
    from atlas_fast.data.layouts import IMAGE_SUFFIXES

    with os.scandir(folder) as entries:
        return sum(1 for e in entries if e.is_file() and Path(e.name).suffix.lower() in IMAGE_SUFFIXES)


def _classnames_findings(dataset_dir: Path, name: str) -> list[Finding]:
    path = dataset_dir / "classnames.txt"
    if path.is_file():
        return []
    if name == "ImageNet":
        fix = ("download classnames.txt ('<wnid> <class name>' per line, CLIP's ImageNet names; linked from CoOp's "
               "DATASETS.md) into this folder.")
    else:
        fix = f"copy ImageNet's classnames.txt here (cp <data root>/imagenet/classnames.txt {dataset_dir}/)."
    return [_error("class-name file classnames.txt not found.", path, fix)]


def layout_findings(spec: DatasetSpec, data_root: str | Path) -> list[Finding]:
    """The cheap part of the check: the dataset folder, its split or class-name files and its image folders exist,
    and ImageNet's val images lie in class folders. No image is listed or decoded. Errors only (empty: the layout
    looks right)."""
    name, layout = spec.name, spec.layout
    dataset_dir = _dataset_dir(spec, data_root)
    if not dataset_dir.is_dir():
        return [_error(f"dataset folder of {name} not found.", dataset_dir,
                       f"create it and {_image_fix(name)}" if name in IMAGE_SOURCES else
                       "point --data-root at the folder that holds it.")]
    findings: list[Finding] = []
    if isinstance(layout, SplitJsonLayout):
        split = dataset_dir / layout.split_file
        if not split.is_file():
            findings.append(_error(f"split file {layout.split_file} not found.", split,
                                   f"download {layout.split_file} ({_SPLIT_SOURCE}) into {dataset_dir}/."
                                   if name in PUBLISHED_SIZES else f"write {layout.split_file} there."))
        if layout.image_prefix and not (dataset_dir / layout.image_prefix).is_dir():
            findings.append(_error(f"image folder {layout.image_prefix}/ not found.", dataset_dir / layout.image_prefix,
                                   _image_fix(name)))
    elif isinstance(layout, ImageNetLayout):
        findings += _classnames_findings(dataset_dir, name)
        for split in ("train", "val"):
            folder = dataset_dir / "images" / split
            if not folder.is_dir():
                findings.append(_error(f"image folder images/{split}/ not found.", folder, _image_fix(name)))
        val = dataset_dir / "images" / "val"
        if val.is_dir():
            flat = _has_images(val)
            if flat:
                findings.append(_error(
                    f"{flat} image(s) lie directly in images/val/, not in class folders (ILSVRC2012_img_val.tar is "
                    f"shipped flat): they are not read, so the test set misses them.", val,
                    SORT_VAL_COMMAND.format(root=Path(data_root))))
    elif isinstance(layout, (WnidFolderLayout, ImageNetV2Layout)):
        findings += _classnames_findings(dataset_dir, name)
        folder = dataset_dir / layout.image_folder
        if not folder.is_dir():
            findings.append(_error(f"image folder {layout.image_folder}/ not found.", folder, _image_fix(name)))
    elif isinstance(layout, AircraftLayout):
        for file in ("variants.txt", "images_variant_train.txt", "images_variant_val.txt", "images_variant_test.txt"):
            if not (dataset_dir / file).is_file():
                findings.append(_error(f"{file} not found.", dataset_dir / file,
                                       f"keep every .txt file of the data/ folder of {IMAGE_SOURCES[name]}."))
        if not (dataset_dir / "images").is_dir():
            findings.append(_error("image folder images/ not found.", dataset_dir / "images", _image_fix(name)))
    elif isinstance(layout, ClassFolderLayout):
        for split in ("train", "test"):
            if not (dataset_dir / split).is_dir():
                findings.append(_error(f"{split}/ folder not found.", dataset_dir / split,
                                       f"put one folder per class in {split}/ (<class name>/<images>)."))
    return findings


def _count_findings(name: str, counts: dict[str, int], dataset_dir: Path, split_file: bool) -> list[Finding]:
    """Counts as read against the published sizes (warnings), and empty splits (errors)."""
    findings = []
    if not counts.get("test"):
        findings.append(_error("no test images were found: every run would fail to evaluate.", dataset_dir))
    published = PUBLISHED_SIZES.get(name)
    if published is None:
        return findings
    differ = {split: (counts[split], getattr(published, split)) for split in ("classes", "train", "val", "test")
              if split in counts and getattr(published, split) is not None
              and counts[split] != getattr(published, split)}
    if differ:
        text = ", ".join(f"{split} {found:,}/{expected:,}" for split, (found, expected) in differ.items())
        if (dataset_dir / STANDIN_MANIFEST).exists():
            fix = f"a stand-in (atlas-fast data standins): its {STANDIN_MANIFEST} says what it holds and why."
        elif "classes" in differ:
            fix = ("another class list than the papers': use the full release"
                   + (" and CoOp's split file." if split_file else " (every class folder)."))
        elif any(found < expected for found, expected in differ.values()):
            fix = "a partial download or extraction: extract the full archives again."
        else:
            fix = "more images than the split: look for stray files in the image folders."
        findings.append(_warning(f"counts differ from CoOp's split (found/published): {text}.", dataset_dir, fix))
    return findings


def _decode_findings(paths: Sequence[str]) -> tuple[int, list[Finding]]:
    """Decode each image fully (PIL); one error per image that does not."""
    from PIL import Image

    findings = []
    for path in paths:
        try:
            with Image.open(path) as image:
                image.load()
        except Exception as exc:  # any decoder failure: truncated, not an image, unsupported
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            findings.append(_error(f"image does not decode ({reason}).", path,
                                   "extract it again from its archive (or remove it from the split)."))
    return len(paths), findings


def check_dataset(name: str, data_root: str | Path, full: bool = False, sample: int = DEFAULT_SAMPLE
                  ) -> DatasetCheck:
    """Check one dataset under ``data_root``: its layout (:func:`layout_findings`), its full listing by the reader
    the runs use, the counts against :data:`PUBLISHED_SIZES`, and a decode check of ``sample`` images (every image
    with ``full``; none with ``sample=0``)."""
    from atlas_fast.data.layouts import DatasetFormatError, DatasetLayoutError

    spec = dataset_spec(name)
    dataset_dir = _dataset_dir(spec, data_root)
    result = DatasetCheck(spec.name, str(dataset_dir), _layout_name(spec))
    result.findings = layout_findings(spec, data_root)
    if not dataset_dir.is_dir():
        return result
    try:
        splits = spec.load(data_root)
    except (DatasetLayoutError, DatasetFormatError, OSError, ValueError) as exc:
        if not result.broken:  # the cheap part saw nothing: the reader says what it found
            message = str(exc).splitlines()[0]
            tree = "; ".join(line.strip() for line in spec.layout.tree(dataset_dir).splitlines()[1:])
            result.findings.append(_error(message.rstrip(".") + ".", dataset_dir,
                                          f"correct it; the expected layout is {tree}"))
        return result
    counts = {"classes": splits.num_classes, "train": len(splits.train), "test": len(splits.test)}
    if not splits.val_is_test:
        counts["val"] = len(splits.val)
    if spec.layout.test_only:
        counts = {"classes": counts["classes"], "test": counts["test"]}
    result.counts = counts
    result.findings += _count_findings(spec.name, counts, dataset_dir, isinstance(spec.layout, SplitJsonLayout))
    images = sorted({d.impath for items in (splits.train, splits.val, splits.test) for d in items})
    if not full:
        images = sorted(random.Random(0).sample(images, min(sample, len(images))))
    result.decoded, decode = _decode_findings(images)
    result.findings += decode
    if not result.broken:
        result.findings.insert(0, Finding("ok", _counts_text(spec.name, counts) +
                                          f"; {result.decoded} image(s) decoded{' (all)' if full else ''}."))
    return result


def _counts_text(name: str, counts: dict[str, int]) -> str:
    published = PUBLISHED_SIZES.get(name)
    parts = []
    for split in ("classes", "train", "val", "test"):
        if split not in counts:
            continue
        expected = getattr(published, split, None) if published else None
        parts.append(f"{split} {counts[split]:,}" + (f"/{expected:,}" if expected is not None else ""))
    return ", ".join(parts) + (" (found/published)" if published else "")


class DataLayoutProblems(FileNotFoundError):
    """The data a command was asked to read is missing or laid out wrongly (every fault found, one line each)."""


def _problem_text(finding: Finding) -> str:
    """A finding as an error message: what, where, and the fix."""
    where = f": {finding.path}" if finding.path else ""
    return f"{finding.what.rstrip('.')}{where}." + (f" Fix: {finding.fix}" if finding.fix else "")


def require_layouts(names: Iterable[str], data_root: str | Path) -> None:
    """The cheap part of ``data check`` for every dataset a command will read, before any work: raises
    :class:`DataLayoutProblems` whose first line is the first fault (what, which file, the fix) and whose next lines
    name every other fault of every dataset, so one attempt shows them all."""
    problems = []
    checked = []
    for name in dict.fromkeys(names):
        spec = dataset_spec(name)
        checked.append(spec.name)
        problems += [_problem_text(f) for f in layout_findings(spec, data_root)]
    if problems:
        more = [f"  and: {problem}" for problem in problems[1:]]
        raise DataLayoutProblems("\n".join([problems[0], *more,
                                             f"  (atlas-fast data check --data-root {data_root} --datasets "
                                             f"{' '.join(checked)} checks the counts and images too)"]))
