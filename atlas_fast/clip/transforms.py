"""Image views for the feature cache: CLIP's test transform and per-(image, view) seeded train augmentations.

A *view* of an image is fully determined by ``(transform spec, image key, view index)``: view 0 is CLIP's test
transform, views 1..V Dassl's train augmentation for the CoOp configs, with the crop and flip drawn from a
``torch.Generator`` seeded by a blake2b hash of ``(aug_seed, key, view)`` (never global RNG state nor Python's salted
``hash()``), following torchvision's ``RandomResizedCrop.get_params`` step by step (docs/protocol.md, section
Views and augmentation, gives the parameters).

:meth:`TransformSpec.fingerprint` hashes a JSON description of all of this (plus a version number bumped whenever
the pixels a spec produces change), and keys the feature cache. A loaded backbone carries its spec
(:attr:`atlas_fast.clip.backbones.Backbone.transform`; :meth:`~atlas_fast.clip.backbones.Backbone.transform_for`
for another augmentation seed).

A view is computed in two steps, which may run in different places: its 8-bit pixels (:func:`load_view_pixels`:
decode, crop, resize, flip; a feature cache's worker processes), then ToTensor + Normalize (:func:`normalize_pixels`;
the encoder's device), equal bit for bit to torchvision's functions applied view by view. :func:`load_views` does
both.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
TRANSFORM_VERSION = 2  # 2: 16-bit and float images keep their values (they were clipped to white)
_INTERPOLATIONS = {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR,
                   "nearest": InterpolationMode.NEAREST}
_NORMALIZE_CHUNK = 1 << 18  # 8-bit values normalised at a time on the CPU (1 MiB of floats: twice as fast at 224 px)
_PIL_INTERPOLATIONS = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
                       "nearest": Image.Resampling.NEAREST}


class ImageReadError(RuntimeError):
    """An image file that is missing, truncated or not an image."""


@dataclass(frozen=True)
class Preprocessing:
    """The pixel pipeline a backbone expects (CLIP: bicubic resize of the short side, centre crop, mean/std)."""

    image_size: int
    mean: tuple[float, float, float] = OPENAI_MEAN
    std: tuple[float, float, float] = OPENAI_STD
    interpolation: str = "bicubic"

    def to_dict(self) -> dict[str, Any]:
        return {"image_size": self.image_size, "mean": list(self.mean), "std": list(self.std),
                "interpolation": self.interpolation}


@dataclass(frozen=True)
class TransformSpec:
    """Everything that decides the pixels of a view. A backbone's is ``backbone.transform`` (built once at load by
    :meth:`from_preprocessing`); ``backbone.transform_for(aug_seed)`` gives it with another augmentation seed."""

    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bicubic"
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    aug_seed: int = 0

    def __post_init__(self) -> None:
        if self.interpolation not in _INTERPOLATIONS:
            raise ValueError(f"Unknown interpolation {self.interpolation!r}; expected one of {sorted(_INTERPOLATIONS)}.")
        if self.image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {self.image_size}.")

    @classmethod
    def from_preprocessing(cls, preprocessing: Preprocessing, aug_seed: int = 0) -> "TransformSpec":
        """The CoOp/Dassl transforms at a backbone's input size, mean, std and interpolation."""
        return cls(image_size=preprocessing.image_size, mean=tuple(preprocessing.mean), std=tuple(preprocessing.std),
                   interpolation=preprocessing.interpolation, aug_seed=aug_seed)

    def describe(self) -> dict[str, Any]:
        """The JSON description stored in cache files (and hashed into :meth:`fingerprint`)."""
        return {
            "version": TRANSFORM_VERSION,
            "view0": {"kind": "resize_shorter_side+center_crop", "size": self.image_size,
                      "interpolation": self.interpolation},
            "views1+": {"kind": "random_resized_crop+horizontal_flip", "size": self.image_size,
                        "interpolation": self.interpolation, "scale": list(self.crop_scale),
                        "ratio": list(self.crop_ratio), "flip_p": self.flip_p,
                        "seeding": "torch.Generator(blake2b(aug_seed, key, view))"},
            "mean": [float(m) for m in self.mean],
            "std": [float(s) for s in self.std],
            "aug_seed": self.aug_seed,
        }

    def fingerprint(self) -> str:
        text = json.dumps(self.describe(), sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB with its values kept.

    Pillow's ``convert("RGB")`` (Dassl's ``read_image``) is right for the 8-bit modes and is used for them: grey
    ("L", "1"), palette ("P", "PA"), alpha ("LA", "RGBA", ...; the alpha channel is dropped, as in the reference),
    CMYK, YCbCr, LAB, HSV. It clips wider values to 255 instead of scaling them, so those modes are scaled here:

    * "I;16*" (16-bit grey: PNG, TIFF): the high byte, ``v >> 8``;
    * "I" (32-bit integers): values up to 255 are kept as they are (Pillow's convention for "I", as from an 8-bit
      "L"); otherwise the image holds 16-bit values (how 16-bit files are often decoded): clipped to
      [0, 65535], then ``v >> 8``;
    * "F" (floats): an image whose values all lie in [0, 1] is scaled by 255 and rounded; otherwise it follows
      Pillow's [0, 255] convention (clipped). NaN becomes 0.
    * "La" (grey with premultiplied alpha) goes through "LA" (Pillow has no direct conversion).
    """
    mode = image.mode
    if mode.startswith("I;16"):
        grey = (np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8)
    elif mode == "I":
        values = np.asarray(image)
        if values.size and int(values.max()) > 255:
            grey = (np.clip(values, 0, 65535).astype(np.uint32) >> 8).astype(np.uint8)
        else:
            grey = np.clip(values, 0, 255).astype(np.uint8)
    elif mode == "F":
        values = np.nan_to_num(np.asarray(image, dtype=np.float32), nan=0.0, posinf=255.0, neginf=0.0)
        if values.size and float(values.min()) >= 0.0 and float(values.max()) <= 1.0:
            grey = np.round(values * 255.0).astype(np.uint8)
        else:
            return Image.fromarray(values, "F").convert("RGB")
    elif mode == "La":
        return image.convert("LA").convert("RGB")
    else:
        return image.convert("RGB")
    return Image.fromarray(grey, "L").convert("RGB")


def read_image(path: str | Path) -> Image.Image:
    """Open an image as RGB (as Dassl's ``read_image``, but 16-bit and float images keep their values: see
    :func:`to_rgb`); a missing or corrupt file raises an error naming it."""
    try:
        with Image.open(path) as img:
            return to_rgb(img)
    except FileNotFoundError as exc:
        raise ImageReadError(f"Image file not found: {path}") from exc
    except Exception as exc:  # PIL raises many types for truncated/corrupt data
        raise ImageReadError(f"Cannot read image {path}: {type(exc).__name__}: {exc}") from exc


def view_seed(aug_seed: int, key: str, view: int) -> int:
    """A stable 63-bit seed for one (image key, view): the same on every machine and in every process."""
    digest = hashlib.blake2b(f"{aug_seed}\x00{key}\x00{view}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def random_resized_crop_params(width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float],
                               generator: torch.Generator) -> tuple[int, int, int, int]:
    """``(top, left, height, width)`` of a crop, drawn exactly as torchvision's ``RandomResizedCrop.get_params``
    but from ``generator``: 10 tries of (area, log-uniform aspect ratio), then a centre crop fallback."""
    area = height * width
    low, high = _log_ratio(ratio)
    draw = torch.empty(1)  # one float32 draw at a time, as torch.empty(1).uniform_ in get_params
    for _ in range(10):
        target_area = area * draw.uniform_(scale[0], scale[1], generator=generator).item()
        aspect = math.exp(draw.uniform_(low, high, generator=generator).item())
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@functools.lru_cache(maxsize=16)
def _log_ratio(ratio: tuple[float, float]) -> tuple[float, float]:
    """``torch.log(torch.tensor(ratio))`` as get_params computes it (float32), once per ratio."""
    low, high = torch.log(torch.tensor(ratio)).tolist()
    return low, high


# ------------------------------------------------------------------------------------------------ 8-bit view pixels
# ToTensor + Normalize maps each 8-bit value of channel c to one float: on the CPU the batch runs the very same
# IEEE operations; elsewhere it is a table of 3 x 256 floats computed by torchvision's own functions
# (:func:`normalize_table`). So workers hand over 8-bit pixels (a quarter of the bytes) and the encoder's device
# normalises them just before encoding.

def view0_pixels(image: Image.Image, spec: TransformSpec) -> np.ndarray:
    """View 0's 8-bit pixels (S, S, 3): resize the shorter side (bicubic, PIL), centre crop."""
    mode = _INTERPOLATIONS[spec.interpolation]
    resized = TF.resize(image, spec.image_size, interpolation=mode)
    return np.asarray(TF.center_crop(resized, [spec.image_size, spec.image_size]))


def augmented_view_pixels(image: Image.Image, spec: TransformSpec, key: str, view: int) -> np.ndarray:
    """An augmented view's 8-bit pixels (S, S, 3): the seeded random resized crop (bicubic, PIL) and flip, by the
    PIL calls of torchvision's ``resized_crop`` and ``hflip`` on a PIL image (a crop that has the output size already
    is not resampled)."""
    generator = torch.Generator().manual_seed(view_seed(spec.aug_seed, key, view))
    top, left, h, w = random_resized_crop_params(image.width, image.height, spec.crop_scale, spec.crop_ratio,
                                                 generator)
    size = spec.image_size
    crop = image.crop((left, top, left + w, top + h))
    if (h, w) != (size, size):
        crop = crop.resize((size, size), _PIL_INTERPOLATIONS[spec.interpolation])
    if torch.rand(1, generator=generator).item() < spec.flip_p:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)  # hflip's call (a reversed array copies 4x slower)
    return np.asarray(crop)


def view_pixels(image: Image.Image, spec: TransformSpec, key: str, view: int) -> np.ndarray:
    """View 0 = the test transform, views >= 1 = seeded augmentations; (S, S, 3) uint8 before ToTensor/Normalize."""
    if view < 0:
        raise ValueError(f"View index must be >= 0 (0 = test transform), got {view} for {key!r}.")
    return view0_pixels(image, spec) if view == 0 else augmented_view_pixels(image, spec, key, view)


def load_view_pixels(impath: str | Path, key: str, views: Sequence[int], spec: TransformSpec) -> np.ndarray:
    """Decode one image once and return the 8-bit pixels of its requested views, (len(views), S, S, 3) uint8."""
    image = read_image(impath)
    out = np.empty((len(views), spec.image_size, spec.image_size, 3), dtype=np.uint8)
    for i, view in enumerate(views):
        out[i] = view_pixels(image, spec, key, view)
    return out


@functools.lru_cache(maxsize=16)
def normalize_table(mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """(3, 256) float32: ToTensor then Normalize(mean, std) of every 8-bit value of each channel, computed by
    torchvision's own functions on an image holding each value once."""
    ramp = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)
    return TF.normalize(TF.to_tensor(Image.fromarray(ramp, "RGB")), list(mean), list(std))[:, 0].contiguous()


def normalize_pixels(pixels: np.ndarray | torch.Tensor, spec: TransformSpec,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """(N, S, S, 3) uint8 view pixels -> (N, 3, S, S) float32 on ``device`` (default: where ``pixels`` are), equal
    bit for bit to ToTensor + Normalize of each view: on the CPU the same float32 operations, by numpy (one thread:
    torch's would spin on such short operations); elsewhere a lookup in :func:`normalize_table` (a GPU divides by
    255 through a reciprocal, which can differ in the last bit)."""
    device = (pixels.device if isinstance(pixels, torch.Tensor) else torch.device("cpu")) if device is None else (
        torch.device(device))
    if device.type == "cpu":
        values = pixels.numpy() if isinstance(pixels, torch.Tensor) else np.asarray(pixels)
        out = np.empty((values.shape[0], 3, *values.shape[1:3]), dtype=np.float32)
        mean = np.asarray(spec.mean, dtype=np.float32).reshape(1, 3, 1, 1)
        std = np.asarray(spec.std, dtype=np.float32).reshape(1, 3, 1, 1)
        step = max(1, _NORMALIZE_CHUNK // max(1, values[0].size))  # views whose floats stay in the CPU's cache
        for i in range(0, len(values), step):
            chunk = out[i:i + step]
            np.divide(values[i:i + step].transpose(0, 3, 1, 2), np.float32(255), out=chunk, dtype=np.float32)
            np.subtract(chunk, mean, out=chunk)
            np.divide(chunk, std, out=chunk)
        return torch.from_numpy(out)
    return look_up_pixels(pixels, spec, device)


def look_up_pixels(pixels: np.ndarray | torch.Tensor, spec: TransformSpec, device: torch.device) -> torch.Tensor:
    """:func:`normalize_pixels` on ``device`` by a lookup of each 8-bit value in :func:`normalize_table`."""
    pixels = pixels if isinstance(pixels, torch.Tensor) else torch.tensor(np.asarray(pixels))
    pixels = pixels.to(device, non_blocking=True)
    table = normalize_table(tuple(spec.mean), tuple(spec.std)).to(device).flatten()
    offsets = torch.arange(0, 3 * 256, 256, device=device, dtype=torch.int64).view(1, 3, 1, 1)
    return table[pixels.permute(0, 3, 1, 2).to(torch.int64) + offsets]


def load_views(impath: str | Path, key: str, views: list[int] | tuple[int, ...], spec: TransformSpec) -> torch.Tensor:
    """Decode one image once and return its requested views stacked as (len(views), 3, S, S)."""
    return normalize_pixels(load_view_pixels(impath, key, views, spec), spec)
