"""Stand-ins of the 15 CoOp benchmarks: each dataset in its real on-disk layout, with its real class names, class
count and split sizes, but small generated images (``atlas-fast data standins``).

What is real: the folder and file layout each reader of :mod:`atlas_fast.data.datasets` expects (split_zhou JSON
files, ImageNet's ``images/{train,val}/<wnid>/`` with ``classnames.txt``, the variants' folders, FGVC-Aircraft's
txt files), the class names in label order (``standin_classes.json``, gathered from the datasets' public class
lists) and the published split sizes (:data:`atlas_fast.data.check.PUBLISHED_SIZES`). What is not: every image is a
32x32 JPEG drawn from the seed (a colour per class plus noise), so decoding and resizing still happen at the true
image counts, but no accuracy measured on a stand-in means anything about the real benchmark.

Sizes. Test and val splits are written in full unless a ``test_fraction`` F < 1 is asked for: then a split of
published size n over K classes holds ``max(K, floor(F * n + 0.5))`` images (every class keeps one). Training sets
hold ``train_per_class`` images per class (default 16, the most shots the papers use; a class whose published share
is smaller keeps its share); the full 1.28 M ImageNet training images would be pointless for few-shot runs. Any
split's images are spread evenly over the classes (the first ``n mod K`` classes get one more).

Each dataset folder gets a ``STANDIN.json`` manifest (the request, the counts written and published, that it is a
stand-in, and ``files``: every file the generator writes there), written before the first image and marked complete
after the last, when it also records each file's size and modification time. A complete manifest of the same
request is skipped; an incomplete one of the same request is completed (images already there are kept: each image
is written to a hidden temporary name and renamed; the temporary files a killed run left are removed); a manifest
of another request has its files rewritten: only the files it lists are deleted, and only while they are as the
generator wrote them. Anything else in the folder (a user's notes, real data extracted beside it) is kept; a listed
file that was changed since (real data extracted over it), or a file of the user's where a new image would go,
stops the rewrite before anything is deleted, with an error naming it. A folder that holds files but no manifest
is not a stand-in and is never touched. A lock per dataset makes concurrent generators safe: the second waits, then
finds the dataset done.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image

from atlas_fast.data.check import PUBLISHED_SIZES, STANDIN_MANIFEST
from atlas_fast.data.datasets import BUILTIN_DATASETS, dataset_spec
from atlas_fast.data.layouts import SplitJsonLayout
from atlas_fast.files import atomic_write, read_json, temporary_path, temporary_target
from atlas_fast.progress import progress_bar

MANIFEST = STANDIN_MANIFEST
MANIFEST_FORMAT = 1
DEFAULT_TRAIN_PER_CLASS = 16
IMAGE_SIZE = 32
SPLITS = ("train", "val", "test")
_PROGRESS_MIN_IMAGES = 2_000

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


@dataclass(frozen=True)
class StandinResult:
    """What :func:`write_standin` did: ``written``, ``skipped`` (complete for this request), ``completed`` (an
    interrupted run of this request finished) or ``rewritten`` (a stand-in of another request replaced)."""

    plan: StandinPlan
    action: str
    dataset_dir: Path
    images_written: int
    bytes_written: int
    seconds: float


# ----------------------------------------------------------------------------------------------------- the classes


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


# ------------------------------------------------------------------------------------------------------ the sizes


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


# ----------------------------------------------------------------------------------------------------- the images


def _image_paths(plan: StandinPlan) -> dict[str, list[tuple[int, str]]]:
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


def _class_colour(seed: int, dataset_index: int, label: int) -> np.ndarray:
    return np.random.default_rng([seed, dataset_index, label, 1]).integers(30, 226, size=3).astype(np.float32)


def _jpeg(seed: int, dataset_index: int, label: int, n: int, colour: np.ndarray) -> bytes:
    """Image ``n`` of class ``label``: the class's colour, a gradient and noise drawn from the seed; JPEG bytes."""
    rng = np.random.default_rng([seed, dataset_index, label, n])
    ramp = np.linspace(-25, 25, IMAGE_SIZE, dtype=np.float32)
    direction = rng.integers(0, 2)
    gradient = (ramp[None, :] if direction else ramp[:, None])[..., None]
    pixels = colour + gradient + rng.normal(0, 12, size=(IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _write_images(plan: StandinPlan, dataset_dir: Path, paths: dict[str, list[tuple[int, str]]],
                  progress: bool) -> tuple[int, int]:
    """Write every image not already there (each to a hidden temporary name, then renamed: a file that exists is
    whole); returns (images written, bytes written)."""
    dataset_index = BUILTIN_DATASETS.index(plan.name)
    colours: dict[int, np.ndarray] = {}
    made: set[Path] = set()
    written = size = 0
    total = plan.images()
    with progress_bar(total=total, desc=f"standin {plan.name}", unit="img",
                      enabled=progress and total >= _PROGRESS_MIN_IMAGES, leave=False) as bar:
        n = 0
        for split in SPLITS:
            for label, relative in paths[split]:
                n += 1
                path = dataset_dir / relative
                bar.update(1)
                if path.exists():
                    continue
                if path.parent not in made:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    made.add(path.parent)
                if label not in colours:
                    colours[label] = _class_colour(plan.request.seed, dataset_index, label)
                data = _jpeg(plan.request.seed, dataset_index, label, n, colours[label])
                temporary = temporary_path(path)
                temporary.write_bytes(data)
                os.replace(temporary, path)
                written += 1
                size += len(data)
    return written, size


# ---------------------------------------------------------------------------------------------- the layout files


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def _layout_files(plan: StandinPlan, paths: dict[str, list[tuple[int, str]]]) -> dict[str, str]:
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


# --------------------------------------------------------------------------------------------------- the manifest


def _manifest(plan: StandinPlan, complete: bool, files: dict[str, list[int] | None] | None = None) -> dict:
    published = PUBLISHED_SIZES[plan.name]
    return {
        "standin": True,
        "about": "Synthetic stand-in written by 'atlas-fast data standins': the real layout, class names and split "
                 f"sizes of {plan.name}, with generated {IMAGE_SIZE}x{IMAGE_SIZE} JPEG images (not the real ones). "
                 "Test and val splits hold the given fraction of the published sizes; the training set holds "
                 "train_per_class images per class.",
        "dataset": plan.name,
        "format": MANIFEST_FORMAT,
        "request": asdict(plan.request) | {"image_size": IMAGE_SIZE},
        "counts": plan.counts(),
        "published": {split: getattr(published, split) for split in ("classes", *SPLITS)},
        "images": plan.images(),
        "complete": complete,
        # every file written here: [size, mtime_ns] once complete (what a rewrite may delete), null before
        "files": files or {},
    }


def read_manifest(dataset_dir: Path) -> dict | None:
    """The stand-in manifest of a dataset folder, or None when there is none (or it is not one of ours)."""
    path = Path(dataset_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = read_json(path)
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("standin") is True else None


def _same_request(manifest: dict, plan: StandinPlan) -> bool:
    expected = _manifest(plan, complete=True)
    return all(manifest.get(key) == expected[key] for key in ("dataset", "format", "request", "counts", "images"))


@contextmanager
def _dataset_lock(root: Path, folder: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``<root>/.<folder>.standin-lock`` (outside the folder, which a rewrite deletes)."""
    fd = os.open(root / f".{folder}.standin-lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_standin(name: str, root: str | Path, request: StandinRequest = StandinRequest(),
                  progress: bool = True) -> StandinResult:
    """Write (or skip, complete or rewrite, see the module's docstring) the stand-in of benchmark ``name`` under
    ``root``. Raises FileExistsError when its folder holds files but no stand-in manifest (real data, perhaps), or
    when a rewrite would delete or overwrite a file the generator did not write as it is now (nothing is deleted)."""
    started = time.perf_counter()
    plan = plan_standin(name, request)
    root = Path(os.path.abspath(os.path.expanduser(str(root))))
    root.mkdir(parents=True, exist_ok=True)
    dataset_dir = root / plan.folder
    with _dataset_lock(root, plan.folder):
        manifest = read_manifest(dataset_dir)
        if manifest is not None and manifest.get("complete") is True and _same_request(manifest, plan):
            return StandinResult(plan, "skipped", dataset_dir, 0, 0, time.perf_counter() - started)
        paths = _image_paths(plan)
        layout = _layout_files(plan, paths)
        planned = [*layout, *(relative for split in SPLITS for _, relative in paths[split])]
        listed: dict[str, list[int] | None] = {}
        if manifest is None:
            if dataset_dir.is_dir() and any(dataset_dir.iterdir()):
                raise FileExistsError(
                    f"{dataset_dir} holds files but no {MANIFEST}: it is not a stand-in (real data?), so nothing was "
                    f"written there. Choose another root, or move the folder away.")
            action = "written"
        else:
            action = "completed" if _same_request(manifest, plan) else "rewritten"
            listed = _listed_files(dataset_dir, manifest)
        _remove_temporaries(dataset_dir, {*planned, *listed, MANIFEST})  # of a generator killed mid-write
        ours = _unchanged_files(dataset_dir, listed, legacy=manifest is not None and "files" not in manifest)
        in_the_way = [relative for relative in planned if relative not in ours
                      and os.path.lexists(dataset_dir / relative)]
        if in_the_way:
            raise FileExistsError(
                f"{dataset_dir / in_the_way[0]}{_and_more(in_the_way)} is not the stand-in's but lies where it "
                f"would write; nothing was deleted or written. Move it (or the folder {dataset_dir}) away and run "
                f"again.")
        if action == "rewritten":
            _remove_files(dataset_dir, ours)
        dataset_dir.mkdir(parents=True, exist_ok=True)
        _write_text(dataset_dir / MANIFEST, json.dumps(_manifest(plan, False, dict.fromkeys(planned)), indent=1)
                    + "\n")
        for relative, text in layout.items():
            _write_text(dataset_dir / relative, text)
        written, size = _write_images(plan, dataset_dir, paths, progress)
        os.sync()  # the images reach the disk before the manifest says they are all there
        files = {relative: _identity(dataset_dir / relative) for relative in planned}
        _write_text(dataset_dir / MANIFEST, json.dumps(_manifest(plan, True, files), indent=1) + "\n")
    return StandinResult(plan, action, dataset_dir, written, size, time.perf_counter() - started)


def _identity(path: Path) -> list[int]:
    """What says a file is still the one the generator wrote: its size and modification time (ns)."""
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def _and_more(items: list) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _listed_files(dataset_dir: Path, manifest: dict) -> dict[str, list[int] | None]:
    """The files a manifest says the generator wrote (relative path -> [size, mtime_ns], or None when it was not
    complete); for a manifest of an earlier version, which lists none, the files its request writes. Refused
    (FileExistsError, nothing deleted) when the list is not one of relative paths inside the folder."""
    path = dataset_dir / MANIFEST
    files = manifest.get("files")
    if files is None:  # an earlier version's manifest: its request says what it wrote
        try:
            request = manifest["request"]
            plan = plan_standin(manifest["dataset"], StandinRequest(
                request["test_fraction"], request["train_per_class"], request["seed"]))
        except (KeyError, TypeError, ValueError):
            raise FileExistsError(f"{path} does not say which files the stand-in wrote; nothing was deleted. Move "
                                  f"the folder {dataset_dir} away (after saving any files of your own in it)."
                                  ) from None
        paths = _image_paths(plan)
        return dict.fromkeys([*_layout_files(plan, paths), *(r for split in SPLITS for _, r in paths[split])])
    sound = isinstance(files, dict) and all(
        isinstance(relative, str) and relative and not Path(relative).is_absolute() and ".." not in Path(relative).parts
        and (identity is None or (isinstance(identity, list) and len(identity) == 2
                                  and all(isinstance(v, int) and not isinstance(v, bool) for v in identity)))
        for relative, identity in files.items())
    if not sound:
        raise FileExistsError(f"{path}: 'files' is not a list of the files the stand-in wrote inside {dataset_dir}; "
                              f"nothing was deleted. Move the folder away (after saving any files of your own in it).")
    return files


def _unchanged_files(dataset_dir: Path, listed: dict[str, list[int] | None], legacy: bool) -> set[str]:
    """The listed files that are still as the generator wrote them (same size and modification time; a file listed
    by an unfinished run, which recorded none, counts as its own). A listed file changed since is the user's now:
    FileExistsError naming it, nothing deleted. ``legacy`` (a manifest that listed no files): any file besides the
    listed ones is refused the same way, since nothing tells the stand-in's files from others at those paths."""
    ours, changed = set(), []
    for relative, identity in listed.items():
        path = dataset_dir / relative
        if not os.path.lexists(path):
            continue
        if path.is_symlink() or not path.is_file() or (identity is not None and _identity(path) != identity):
            changed.append(relative)
        else:
            ours.add(relative)
    if changed:
        raise FileExistsError(
            f"{dataset_dir / changed[0]}{_and_more(changed)} was changed since the stand-in wrote it (real data "
            f"extracted over it?): it is yours now, so nothing was deleted or written. Move the folder {dataset_dir} "
            f"away (or the files you keep out of it) and run again.")
    if legacy:
        others = sorted(str(p.relative_to(dataset_dir)) for p in dataset_dir.rglob("*")
                        if not p.is_dir() and p.name != MANIFEST and str(p.relative_to(dataset_dir)) not in ours)
        if others:
            raise FileExistsError(
                f"{dataset_dir / others[0]}{_and_more(others)} is not the stand-in's, and its {MANIFEST} (of an "
                f"earlier version) does not list the files it wrote; nothing was deleted. Move your files out of "
                f"{dataset_dir} and run again.")
    return ours


def _remove_temporaries(dataset_dir: Path, relatives: set[str]) -> None:
    """Remove the temporary files a killed generator left beside the files it writes (under the dataset's lock no
    other generator writes there)."""
    targets = {dataset_dir / relative for relative in relatives}
    for folder in {target.parent for target in targets}:
        try:
            entries = [entry.name for entry in os.scandir(folder) if entry.name.startswith(".")]
        except OSError:
            continue
        for entry in entries:
            target = temporary_target(entry)
            if target is not None and folder / target in targets:
                (folder / entry).unlink(missing_ok=True)


def _remove_files(dataset_dir: Path, relatives: set[str]) -> None:
    """Delete these files and the folders this leaves empty (a folder holding anything else stays)."""
    folders: set[Path] = set()
    for relative in relatives:
        path = dataset_dir / relative
        path.unlink(missing_ok=True)
        folders.update(p for p in path.parents if dataset_dir in p.parents)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:
            pass


def describe(result: StandinResult) -> str:
    """One line for the command's output: what was done, the counts written against the published ones."""
    plan = result.plan
    published = PUBLISHED_SIZES[plan.name]
    counts = plan.counts()
    parts = [f"{counts['classes']:,} classes"]
    for split in SPLITS:
        if split not in counts:
            continue
        full = getattr(published, split)
        if split == "train":
            parts.append(f"train {counts[split]:,} ({plan.request.train_per_class} per class; published {full:,})")
        else:
            parts.append(f"{split} {counts[split]:,}/{full:,}")
    done = (f"{result.images_written:,} image(s), {result.bytes_written / 1e6:.1f} MB in {result.seconds:.1f} s"
            if result.action != "skipped" else "already complete for this request")
    return f"{plan.name}: {result.action}: {', '.join(parts)}; {done} -> {result.dataset_dir}"
