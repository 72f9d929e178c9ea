"""The stand-ins' images: every image a 32x32 JPEG drawn from the seed (a colour per class, a gradient and noise), so
decoding and resizing still happen at the true image counts, but no accuracy measured on a stand-in means anything
about the real benchmark."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

from atlas_fast.data.datasets import BUILTIN_DATASETS
from atlas_fast.files import temporary_path
from atlas_fast.progress import progress_bar
from atlas_fast.world.standin_plan import SPLITS, StandinPlan

IMAGE_SIZE = 32
_PROGRESS_MIN_IMAGES = 2_000


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


def write_images(plan: StandinPlan, dataset_dir: Path, paths: dict[str, list[tuple[int, str]]],
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
