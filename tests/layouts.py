"""Writers of small synthetic datasets in the exact on-disk layouts of the CoOp benchmarks (test stand-ins).

Images are tiny random-colour PNG/JPEG files; what matters is the folder structure, split files and names.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, seed: int, size: int = 40) -> None:
    """A deterministic noisy image whose mean colour depends on ``seed`` (JPEG or PNG by suffix)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=3)
    pixels = np.clip(base + rng.normal(0, 30, size=(size, size + 8, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def write_split_json(path: Path, split: dict) -> None:
    """Dassl's ``write_json``: indent 4, separators (",", ": ")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(split, f, indent=4, separators=(",", ": "))


def make_oxford_pets(data_root: Path, n_classes: int = 6, n_train: int = 8, n_val: int = 3, n_test: int = 4,
                     size: int = 40, seed: int = 0) -> Path:
    """``oxford_pets/images/*.jpg`` + ``split_zhou_OxfordPets.json`` with breed-style class names."""
    dataset_dir = Path(data_root) / "oxford_pets"
    rng = random.Random(seed)
    split: dict[str, list] = {"train": [], "val": [], "test": []}
    for label in range(n_classes):
        cname = f"breed_{chr(ord('a') + label)}_cat" if label % 2 else f"dog_{chr(ord('a') + label)}"
        for name, n in (("train", n_train), ("val", n_val), ("test", n_test)):
            for i in range(n):
                rel = f"{cname}_{name}{i}.jpg"
                write_image(dataset_dir / "images" / rel, seed=label * 1000 + ("train", "val", "test").index(name) * 100 + i, size=size)
                split[name].append([rel, label, cname])
    for items in split.values():
        rng.shuffle(items)
    write_split_json(dataset_dir / "split_zhou_OxfordPets.json", split)
    return dataset_dir
