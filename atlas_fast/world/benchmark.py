"""The world's benchmark datasets, written in CoOp's split-JSON layout and registered with the dataset readers.

A dataset is a class set (concepts of :mod:`atlas_fast.world.generator`) drawn in one style; docs/world.md (section
The world) says which dataset serves which of the paper's settings. Labels of the 24-class datasets are ordered so
that the new half (star, cross, heart) are novel shapes, as new classes on real benchmarks are novel concepts
(:func:`split_order` gives the other orders). Every template is the captions' own "a photo of a {}.", so there is no
hidden domain word for prompt tuning to discover. The layout:

    <data_root>/world_sketches/images/<texture>_<shape>/<split>_<i>.png
    <data_root>/world_sketches/split_zhou_WorldSketches.json   ([relative_path, label, classname] lists, indent 4)
    <data_root>/world_sketches/world_stamp.json                 (what was generated: reused only if it matches)
    <data_root>/world_sketches/world_files.json                 (the files it wrote: the only ones it ever deletes)

so ``load_dataset("WorldSketches", data_root)`` goes through exactly the code that reads OxfordPets. Output is
byte-identical for the same arguments (see :mod:`atlas_fast.world.generator`).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image
from atlas_fast.progress import progress_bar

from atlas_fast.data.datasets import register_split_json_dataset
from atlas_fast.files import JsonFileError, atomic_write, exclusive_lock, read_json
from atlas_fast.world.generator import (SHAPE_PALETTES, SHAPES, SPLIT_IDS, TEXTURES, Layout, concept_id,
                                        render_batch)

GENERATOR_VERSION = 4  # bump when rendering changes: stale folders are then regenerated
# Benchmark images: smaller, off-centre, more tilted and cluttered than the centred pretraining images (see
# generator.PRETRAIN_LAYOUT), chosen on zero-shot and CoOp measurements alone (issue 19, atlas_fast/world/README.md).
BENCHMARK_LAYOUT = Layout(radius=(6.75, 10.75), max_shift=5.25, max_tilt=21.0, max_clutter=3, noise=1.6)
STAMP_FILE = "world_stamp.json"
MANIFEST_FILE = "world_files.json"  # every file the generator writes (besides the stamp and itself)
LOCK_FILE = ".world_generating.lock"  # held while a process generates the folder
MAX_IMAGES_PER_CLASS = 100_000  # per split: far beyond the demo's 32/4/50 (rendering one takes about a millisecond)
# The pretraining captions' prefix, which is also CoOp's generic template (``atlas_fast.data.DEFAULT_TEMPLATE``; not
# imported: ``atlas_fast.data`` imports this module to register the world datasets).
TEMPLATE = "a photo of a {}."
IMAGE_FOLDER = "images"


def checkerboard(shapes: Sequence[str], textures: Sequence[str]) -> tuple[str, ...]:
    """Class names of shapes x textures, ordered so that the first half (base) is the cells with even
    ``shape index + texture index`` and the second half (new) the odd ones."""
    cells = [(i + j, f"{t} {s}") for i, s in enumerate(shapes) for j, t in enumerate(textures)]
    return tuple(name for parity in (0, 1) for total, name in cells if total % 2 == parity)


def held_out_split(shapes: Sequence[str], textures: Sequence[str], held_out: str) -> tuple[str, ...]:
    """Class names ordered so that the new half (second) holds the second half of the ``held_out`` attribute's
    values, which no base class has: new classes are novel in that attribute, not recombinations of base parts.

    ``held_out``: "shape" or "texture" (all shapes x textures, split by that attribute), or "both": base = first
    half of the shapes x first half of the textures, new = second x second (half as many classes). A held-out
    attribute needs an even number of values, so that the halves are exactly CoOp's base/new halves."""
    if held_out not in ("shape", "texture", "both"):
        raise ValueError(f"held_out must be 'shape', 'texture' or 'both', got {held_out!r}")
    for kind, values in (("shape", shapes), ("texture", textures)):
        if held_out in (kind, "both") and len(values) % 2:
            raise ValueError(f"{len(values)} {kind}s cannot be split in two halves of base and new classes")
    hs, ht = len(shapes) // 2, len(textures) // 2
    if held_out == "shape":
        return tuple(f"{t} {s}" for part in (shapes[:hs], shapes[hs:]) for s in part for t in textures)
    if held_out == "texture":
        return tuple(f"{t} {s}" for part in (textures[:ht], textures[ht:]) for s in shapes for t in part)
    return tuple(f"{t} {s}" for ss, ts in ((shapes[:hs], textures[:ht]), (shapes[hs:], textures[ht:]))
                 for s in ss for t in ts)


# How a class set's labels can be ordered (the base half is the first labels): see checkerboard, held_out_split.
SPLIT_ORDERS: tuple[str, ...] = ("checkerboard", "texture", "shape", "both")


def split_order(order: str, shapes: Sequence[str], textures: Sequence[str]) -> tuple[str, ...]:
    """Class names of shapes x textures in the label order ``order`` (one of :data:`SPLIT_ORDERS`): "checkerboard"
    (new classes recombine base attributes), "texture"/"shape" (new classes carry held-out values of it) or "both"
    (new classes share no attribute with base ones; only half of the shapes x textures)."""
    if order == "checkerboard":
        return checkerboard(shapes, textures)
    if order in ("texture", "shape", "both"):
        return held_out_split(shapes, textures, order)
    raise ValueError(f"unknown split order {order!r}; valid: {SPLIT_ORDERS}")


# The 24 classes of the main datasets: six shapes x four textures, new classes novel shapes.
MAIN_CLASSES = split_order("shape", SHAPES[:6], TEXTURES[:4])
# Cross-dataset targets: other class sets, partly overlapping the main one (as Caltech101 overlaps ImageNet).
SYMBOL_CLASSES = checkerboard(("star", "cross", "heart", "diamond", "moon"), ("solid", "hollow"))
TILE_CLASSES = checkerboard(("circle", "square", "diamond", "moon"), ("striped", "checkered", "hollow"))


COLOUR_MODES: tuple[str, ...] = ("any", "shape-palette")


@dataclass(frozen=True)
class WorldDataset:
    """A benchmark dataset: registry name, folder under the data root, its style, class names and template."""

    name: str
    folder: str
    style: str
    classnames: tuple[str, ...] = MAIN_CLASSES
    template: str = TEMPLATE
    colours: str = "shape-palette"  # one of the shape's two typical colours; "any": uniform over the 8 colours

    def __post_init__(self) -> None:
        if self.colours not in COLOUR_MODES:
            raise ValueError(f"colours must be one of {COLOUR_MODES}, got {self.colours!r}")

    @property
    def split_file(self) -> str:
        return f"split_zhou_{self.name}.json"


WORLD_DATASETS: tuple[WorldDataset, ...] = (
    WorldDataset("WorldPhotos", "world_photos", "photo"),
    WorldDataset("WorldSketches", "world_sketches", "sketch"),
    WorldDataset("WorldDark", "world_dark", "dark"),
    WorldDataset("WorldCartoons", "world_cartoons", "cartoon"),
    WorldDataset("WorldSymbols", "world_symbols", "photo", SYMBOL_CLASSES),
    WorldDataset("WorldTiles", "world_tiles", "cartoon", TILE_CLASSES),
)
WORLD_BY_NAME: dict[str, WorldDataset] = {d.name: d for d in WORLD_DATASETS}
# The world's counterparts of the paper's settings (docs/world.md, section The world).
BASE_TO_NEW = tuple(d.name for d in WORLD_DATASETS)
DG_SOURCE, DG_TARGETS = "WorldPhotos", ("WorldSketches", "WorldDark", "WorldCartoons")
CROSS_SOURCE, CROSS_TARGETS = "WorldPhotos", ("WorldSymbols", "WorldTiles")
# Where CoOp's new-class accuracy falls below zero-shot and keeps falling (the paper's SUN397 curve, Fig. 5).
DECLINE_DATASET = "WorldPhotos"


@dataclass(frozen=True)
class SplitSizes:
    """Images per class in each split (16-shot training needs ``train >= 16``)."""

    train: int = 20
    val: int = 4
    test: int = 10

    def __post_init__(self) -> None:
        for split, count in self.items():
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_IMAGES_PER_CLASS:
                raise ValueError(f"world images per class of the {split} split must be a whole number in "
                                 f"[0, {MAX_IMAGES_PER_CLASS}], got {count!r}.")

    def items(self) -> list[tuple[str, int]]:
        return [("train", self.train), ("val", self.val), ("test", self.test)]


def register_world_datasets() -> None:
    """Make every world dataset loadable by name (idempotent). Called through the ``atlas_fast.datasets`` entry point
    (setup.cfg), so the data package need not import the world."""
    for d in WORLD_DATASETS:
        register_split_json_dataset(d.name, d.folder, IMAGE_FOLDER, d.template, split_file=d.split_file)


def write_dataset(dataset: WorldDataset, data_root: str | Path, sizes: SplitSizes = SplitSizes(), seed: int = 0,
                  progress: bool = True, layout: Layout = BENCHMARK_LAYOUT) -> Path:
    """Write (or reuse, if its stamp matches) one dataset under ``<data_root>/<folder>``; returns the folder.
    Regenerating with other arguments deletes only the files listed in :data:`MANIFEST_FILE`, never a user's."""
    dataset_dir = Path(data_root) / dataset.folder
    stamp = {"generator_version": GENERATOR_VERSION, "dataset": asdict(dataset), "sizes": asdict(sizes), "seed": seed,
             "layout": asdict(layout)}
    stamp = json.loads(json.dumps(stamp))  # as it reads back from the file (tuples become lists)
    stamp_path = dataset_dir / STAMP_FILE
    manifest_path = dataset_dir / MANIFEST_FILE
    if _stamp_matches(stamp_path, stamp):
        return dataset_dir  # (without a lock: a complete dataset in a read-only folder is usable)
    # A folder no generator ever locked (a generator creates the lock file before any other) and that holds files is
    # refused without touching it. The lock file is looked for after the listing: a file a generator wrote then
    # implies its lock file, so a generator at work is never mistaken for a stranger; under the lock, look again.
    if dataset_dir.is_dir() and _foreign_files(dataset_dir) and not (dataset_dir / LOCK_FILE).exists():
        _refuse_foreign(dataset_dir)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(dataset_dir / LOCK_FILE):  # the whole generation: a second process waits, then finds it done
        if _stamp_matches(stamp_path, stamp, warn=True):
            return dataset_dir
        if not stamp_path.is_file() and not manifest_path.is_file() and _foreign_files(dataset_dir):
            _refuse_foreign(dataset_dir)
        if stamp_path.is_file() or manifest_path.is_file():
            # Ours, but made with other arguments (or interrupted): remove what we wrote before regenerating.
            _remove_written(dataset_dir)
        _generate(dataset, dataset_dir, sizes, seed, stamp, progress, layout)
    return dataset_dir


def _stamp_matches(stamp_path: Path, stamp: dict, warn: bool = False) -> bool:
    """Whether the folder's stamp says it was generated with ``stamp``'s arguments; a stamp that cannot be read (not
    JSON, too large or too deep) does not match (``warn``: says so, naming the file): the folder is generated again."""
    if not stamp_path.is_file():
        return False
    try:
        return read_json(stamp_path) == stamp
    except JsonFileError as exc:
        if warn:
            warnings.warn(f"world stamp {exc}; generating the dataset again.", stacklevel=3)
        return False


def _foreign_files(dataset_dir: Path) -> list[str]:
    """The names in ``dataset_dir`` besides the generator's lock file and the temporary files of its manifest (a
    generator killed while writing the manifest leaves one)."""
    return [p.name for p in dataset_dir.iterdir()
            if p.name != LOCK_FILE and not (p.name.startswith(f".{MANIFEST_FILE}.") and p.name.endswith(".tmp"))]


def _refuse_foreign(dataset_dir: Path) -> None:
    raise FileExistsError(
        f"{dataset_dir} exists and holds files but no {STAMP_FILE}: it was not written by the world generator. "
        f"Move it away or choose another data root.")


def _generate(dataset: WorldDataset, dataset_dir: Path, sizes: SplitSizes, seed: int, stamp: dict,
              progress: bool, layout: Layout = BENCHMARK_LAYOUT) -> None:
    """Render the images, write the split file, then the stamp (held under the generation lock)."""
    stamp_path = dataset_dir / STAMP_FILE
    manifest_path = dataset_dir / MANIFEST_FILE

    planned = [f"{IMAGE_FOLDER}/{rel}" for _, _, rel in _image_files(dataset.classnames, sizes)]
    planned.append(dataset.split_file)
    clash = next((dataset_dir / rel for rel in planned if os.path.lexists(dataset_dir / rel)), None)
    if clash is not None:  # not ours (ours were just removed): never overwrite it
        raise FileExistsError(f"{clash} is in the way of the world generator and was not written by it; move it "
                              f"away and generate again.")
    manifest = {"generator_version": GENERATOR_VERSION, "files": planned}
    atomic_write(manifest_path, lambda f: f.write((json.dumps(manifest, indent=1) + "\n").encode()))

    split: dict[str, list] = {name: [] for name, _ in sizes.items()}
    total = len(dataset.classnames) * (sizes.train + sizes.val + sizes.test)
    with progress_bar(total=total, desc=f"render {dataset.name}", enabled=progress, leave=False) as bar:
        for split_name, per_class in sizes.items():
            for label, classname in enumerate(dataset.classnames):
                class_dir = classname.replace(" ", "_")
                (dataset_dir / IMAGE_FOLDER / class_dir).mkdir(parents=True, exist_ok=True)
                images = render_batch([concept_id(classname)] * per_class, [dataset.style] * per_class, seed,
                                      split_name, colours=image_colours(dataset, classname, split_name, per_class,
                                                                        seed), layout=layout)
                for i, pixels in enumerate(images):
                    rel = _image_name(classname, split_name, i)
                    Image.fromarray(pixels).save(dataset_dir / IMAGE_FOLDER / rel, optimize=False)
                    split[split_name].append([rel, label, classname])
                bar.update(per_class)
    with open(dataset_dir / dataset.split_file, "w") as f:
        json.dump(split, f, indent=4, separators=(",", ": "))
    stamp_path.write_text(json.dumps(stamp, indent=4, sort_keys=True) + "\n")  # last: marks the folder complete


def image_colours(dataset: WorldDataset, classname: str, split: str, count: int, seed: int) -> list[int | None]:
    """Colour index of each image of a class (None: the image's own stream draws it uniformly)."""
    if dataset.colours == "any":
        return [None] * count
    palette = SHAPE_PALETTES[classname.split(" ")[1]]
    rng = np.random.default_rng([seed, SPLIT_IDS[split], concept_id(classname), 2020])
    return [palette[int(i)] for i in rng.integers(0, len(palette), count)]


def _image_name(classname: str, split: str, index: int) -> str:
    """An image's path relative to the image folder."""
    return f"{classname.replace(' ', '_')}/{split}_{index:04d}.png"


def _image_files(classnames: Sequence[str], sizes: SplitSizes) -> list[tuple[str, str, str]]:
    """(split, class name, path relative to the image folder) of every image, in the order they are written."""
    return [(split, classname, _image_name(classname, split, i)) for split, per_class in sizes.items()
            for classname in classnames for i in range(per_class)]


def _written_files(dataset_dir: Path) -> list[str]:
    """The files (relative to ``dataset_dir``) a previous generation wrote: its manifest, or, for a folder written
    before manifests existed, what its stamp's arguments produce (the file names have not changed since)."""
    manifest_path = dataset_dir / MANIFEST_FILE
    if manifest_path.is_file():
        try:
            files = read_json(manifest_path)["files"]
            if isinstance(files, list) and all(isinstance(f, str) for f in files):
                return files
        except (ValueError, KeyError, TypeError):
            pass
        raise ValueError(f"{manifest_path} is not a list of the files the world generator wrote; delete the folder "
                         f"{dataset_dir} (after saving any files of your own in it) and generate again.")
    stamp_path = dataset_dir / STAMP_FILE
    try:
        old = read_json(stamp_path)
        classnames, sizes = old["dataset"]["classnames"], SplitSizes(**old["sizes"])
        split_file = WorldDataset(old["dataset"]["name"], "", "").split_file
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{stamp_path} is not a world generator stamp ({exc}); delete the folder {dataset_dir} "
                         f"(after saving any files of your own in it) and generate again.") from exc
    return [f"{IMAGE_FOLDER}/{rel}" for _, _, rel in _image_files(classnames, sizes)] + [split_file]


def _remove_written(dataset_dir: Path) -> None:
    """Delete the files a previous generation wrote (and the folders that this leaves empty), nothing else."""
    root = dataset_dir.resolve()
    folders: set[Path] = set()
    for rel in _written_files(dataset_dir):
        path = dataset_dir / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not path.resolve().is_relative_to(root):
            raise ValueError(f"{dataset_dir / MANIFEST_FILE} lists {rel!r}, which is not inside {dataset_dir}; "
                             f"nothing was deleted.")
    for rel in _written_files(dataset_dir):
        path = dataset_dir / rel
        if path.is_file() and not path.is_symlink():
            path.unlink()
        folders.update(p for p in path.parents if p != dataset_dir and dataset_dir in p.parents)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()  # only if empty: a folder holding the user's files stays
        except OSError:
            pass
    (dataset_dir / STAMP_FILE).unlink(missing_ok=True)
    (dataset_dir / MANIFEST_FILE).unlink(missing_ok=True)


def generate_benchmark(data_root: str | Path, datasets: Sequence[str] | None = None,
                       sizes: SplitSizes = SplitSizes(), seed: int = 0, progress: bool = True) -> list[Path]:
    """Write the world datasets (all, or those named) under ``data_root``, reusing those whose stamp matches, and
    register them."""
    names = list(datasets) if datasets is not None else [d.name for d in WORLD_DATASETS]
    unknown = [n for n in names if n not in WORLD_BY_NAME]
    if unknown:
        raise ValueError(f"unknown world dataset(s) {unknown}; valid names: {list(WORLD_BY_NAME)}")
    register_world_datasets()
    return [write_dataset(WORLD_BY_NAME[n], data_root, sizes, seed, progress) for n in names]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m atlas_fast.world.benchmark [DATA_ROOT] [--datasets ...]``: write the world datasets in the CoOp
    layout (the sizes the demo and ``--world`` use), e.g. before ``atlas-fast train --dataset WorldPhotos``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__.split("\n")[0].strip("`: "))
    parser.add_argument("data_root", nargs="?", default="data/world", help="where to write (default data/world)")
    parser.add_argument("--datasets", nargs="+", default=list(BASE_TO_NEW), help="default: all six")
    parser.add_argument("--images", type=int, nargs=3, default=[32, 4, 50], metavar=("TRAIN", "VAL", "TEST"),
                        help="images per class in each split (default 32 4 50, as the demo)")
    args = parser.parse_args(argv)
    for path in generate_benchmark(args.data_root, args.datasets, sizes=SplitSizes(*args.images)):
        print(path)


if __name__ == "__main__":
    main()
