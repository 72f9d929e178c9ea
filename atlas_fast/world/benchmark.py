"""The world's benchmark datasets, written in CoOp's split-JSON layout and registered with the dataset readers.

Each dataset is one rendering style of all 48 classes. Its hand-crafted template is CoOp's generic
"a photo of a {}." (as CoOp gives ImageNet-Sketch), not the style's caption prefix: the style words are what
prompt tuning has to discover (measured in ``atlas_fast/world/README.md``). The layout:

    <data_root>/world_sketches/images/<colour>_<shape>/<split>_<i>.png
    <data_root>/world_sketches/split_zhou_WorldSketches.json   ([relative_path, label, classname] lists, indent 4)
    <data_root>/world_sketches/world_stamp.json                 (what was generated: reused only if it matches)

so ``load_dataset("WorldSketches", data_root)`` goes through exactly the code that reads OxfordPets. Output is
byte-identical for the same arguments (see :mod:`atlas_fast.world.generator`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from PIL import Image
from tqdm import tqdm

from atlas_fast.world.generator import CLASSNAMES, STYLE_BY_NAME, render_batch

GENERATOR_VERSION = 2  # bump when rendering changes: stale folders are then regenerated
STAMP_FILE = "world_stamp.json"
# CoOp's generic template (``atlas_fast.data.DEFAULT_TEMPLATE``; not imported: ``atlas_fast.data`` imports this module
# to register the world datasets).
GENERIC_TEMPLATE = "a photo of a {}."
IMAGE_FOLDER = "images"


@dataclass(frozen=True)
class WorldDataset:
    """A benchmark dataset: registry name, folder under the data root, the style its images are drawn in, and its
    hand-crafted template."""

    name: str
    folder: str
    style: str
    template: str = GENERIC_TEMPLATE

    @property
    def style_template(self) -> str:
        """The prompt that names the style as pretraining captions did (the best hand-crafted prompt here)."""
        return STYLE_BY_NAME[self.style].prefix + " {}."

    @property
    def split_file(self) -> str:
        return f"split_zhou_{self.name}.json"


WORLD_DATASETS: tuple[WorldDataset, ...] = (
    WorldDataset("WorldPhotos", "world_photos", "photo"),
    WorldDataset("WorldSketches", "world_sketches", "sketch"),
    WorldDataset("WorldBlurry", "world_blurry", "blurry"),
    WorldDataset("WorldDark", "world_dark", "dark"),
    WorldDataset("WorldPixels", "world_pixels", "pixelated"),
)
WORLD_BY_NAME: dict[str, WorldDataset] = {d.name: d for d in WORLD_DATASETS}


@dataclass(frozen=True)
class SplitSizes:
    """Images per class in each split (16-shot training needs ``train >= 16``)."""

    train: int = 20
    val: int = 4
    test: int = 10

    def items(self) -> list[tuple[str, int]]:
        return [("train", self.train), ("val", self.val), ("test", self.test)]


def register_world_datasets() -> None:
    """Make every world dataset loadable by name (idempotent: re-registering replaces the same spec)."""
    from atlas_fast.data import register_split_json_dataset

    for d in WORLD_DATASETS:
        register_split_json_dataset(d.name, d.folder, IMAGE_FOLDER, d.template, split_file=d.split_file)


def write_dataset(dataset: WorldDataset, data_root: str | Path, sizes: SplitSizes = SplitSizes(), seed: int = 0,
                  progress: bool = True) -> Path:
    """Write (or reuse, if its stamp matches) one dataset under ``<data_root>/<folder>``; returns the folder."""
    dataset_dir = Path(data_root) / dataset.folder
    stamp = {"generator_version": GENERATOR_VERSION, "dataset": asdict(dataset), "sizes": asdict(sizes), "seed": seed}
    stamp_path = dataset_dir / STAMP_FILE
    if stamp_path.is_file():
        if json.loads(stamp_path.read_text()) == stamp:
            return dataset_dir
        # Ours but made with other arguments: remove what we wrote before regenerating.
        stamp_path.unlink()
        shutil.rmtree(dataset_dir / IMAGE_FOLDER, ignore_errors=True)
        (dataset_dir / dataset.split_file).unlink(missing_ok=True)
    elif dataset_dir.exists() and any(dataset_dir.iterdir()):
        raise FileExistsError(
            f"{dataset_dir} exists and holds files but no {STAMP_FILE}: it was not written by the world generator. "
            f"Move it away or choose another data root.")

    split: dict[str, list] = {}
    total = len(CLASSNAMES) * (sizes.train + sizes.val + sizes.test)
    with tqdm(total=total, desc=f"render {dataset.name}", disable=not progress, leave=False) as bar:
        for split_name, per_class in sizes.items():
            items = []
            for label, classname in enumerate(CLASSNAMES):
                class_dir = classname.replace(" ", "_")
                (dataset_dir / IMAGE_FOLDER / class_dir).mkdir(parents=True, exist_ok=True)
                images = render_batch([label] * per_class, [dataset.style] * per_class, [None] * per_class, seed,
                                      split_name)
                for i, pixels in enumerate(images):
                    rel = f"{class_dir}/{split_name}_{i:04d}.png"
                    Image.fromarray(pixels).save(dataset_dir / IMAGE_FOLDER / rel, optimize=False)
                    items.append([rel, label, classname])
                bar.update(per_class)
            split[split_name] = items
    with open(dataset_dir / dataset.split_file, "w") as f:
        json.dump(split, f, indent=4, separators=(",", ": "))
    stamp_path.write_text(json.dumps(stamp, indent=4, sort_keys=True) + "\n")  # last: marks the folder complete
    return dataset_dir


def generate_benchmark(data_root: str | Path, datasets: Sequence[str] | None = None,
                       sizes: SplitSizes = SplitSizes(), seed: int = 0, progress: bool = True) -> list[Path]:
    """Write the world datasets (all, or those named) under ``data_root``, reusing finished ones, and register them.

    Idempotent: a dataset folder whose stamp matches the arguments is left untouched."""
    names = list(datasets) if datasets is not None else [d.name for d in WORLD_DATASETS]
    unknown = [n for n in names if n not in WORLD_BY_NAME]
    if unknown:
        raise ValueError(f"unknown world dataset(s) {unknown}; valid names: {list(WORLD_BY_NAME)}")
    register_world_datasets()
    return [write_dataset(WORLD_BY_NAME[n], data_root, sizes, seed, progress) for n in names]
