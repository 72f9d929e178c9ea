"""A deterministic compositional image world: coloured shapes drawn in several rendering styles.

Classes are colour x shape ("red circle", 8 x 6 = 48). Every image varies position, size, tilt, background,
clutter and noise, and is drawn in one *style* (photo, sketch, blurry photo, dark photo, pixelated photo). A style
changes the pixels much more than the class does, and pretraining captions name it ("a sketch of a red circle."),
so the words before the class name carry information: that is what gives prompt tuning something to learn.

Labels are ordered shape-major, so the protocol's base half (first 24 labels) holds the circles, triangles and
squares and the new half the stars, crosses and hearts: base-to-new generalisation is along the shape attribute.

Rendering is a pure function of ``(seed, style, split, label, index)``: the same arguments give byte-identical
pixels on every machine (numpy's PCG64 and Pillow's rasteriser, no global random state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

IMAGE_SIZE = 32
SUPERSAMPLE = 4  # shapes are rasterised at 4x and box-filtered down: anti-aliased edges

COLOURS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("red", (215, 35, 35)),
    ("orange", (245, 135, 20)),
    ("yellow", (235, 215, 30)),
    ("green", (40, 165, 55)),
    ("cyan", (35, 205, 215)),
    ("blue", (35, 65, 215)),
    ("purple", (135, 45, 195)),
    ("pink", (250, 125, 190)),
)
SHAPES: tuple[str, ...] = ("circle", "triangle", "square", "star", "cross", "heart")
CLASSNAMES: tuple[str, ...] = tuple(f"{colour} {shape}" for shape in SHAPES for colour, _ in COLOURS)

SIZES: dict[str, tuple[float, float]] = {"small": (5.0, 7.0), "medium": (7.5, 10.0), "large": (10.5, 13.5)}
# Shapes are tilted by at most this much: upright enough that a triangle is not a rotated square at 32 px.
MAX_TILT_DEGREES = 30.0


@dataclass(frozen=True)
class Style:
    """A rendering domain and the words that describe it (``prefix`` + class name is its caption)."""

    name: str
    prefix: str
    index: int  # part of every image's seed, so styles never share random draws


STYLES: tuple[Style, ...] = (
    Style("photo", "a photo of a", 0),
    Style("sketch", "a sketch of a", 1),
    Style("blurry", "a blurry photo of a", 2),
    Style("dark", "a dark photo of a", 3),
    Style("pixelated", "a pixelated photo of a", 4),
)
STYLE_BY_NAME: dict[str, Style] = {s.name: s for s in STYLES}

# Split ids keep the random streams of benchmark splits and of pretraining apart.
SPLIT_IDS: dict[str, int] = {"train": 0, "val": 1, "test": 2, "pretrain": 3, "eval": 4}


def label_of(colour: str, shape: str) -> int:
    return SHAPES.index(shape) * len(COLOURS) + [c for c, _ in COLOURS].index(colour)


def _unit_polygon(shape: str) -> np.ndarray:
    """Vertices (N, 2) of a shape centred at 0 with circumradius about 1, in y-down image coordinates."""
    if shape == "circle":
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1)
    if shape == "triangle":
        t = -np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        return np.stack([np.cos(t), np.sin(t)], 1)
    if shape == "square":
        t = np.pi / 4 + np.arange(4) * np.pi / 2
        return np.stack([np.cos(t), np.sin(t)], 1)
    if shape == "star":
        t = -np.pi / 2 + np.arange(10) * np.pi / 5
        r = np.where(np.arange(10) % 2 == 0, 1.0, 0.42)
        return np.stack([r * np.cos(t), r * np.sin(t)], 1)
    if shape == "cross":
        a, b = 0.95, 0.32
        return np.array([[-b, -a], [b, -a], [b, -b], [a, -b], [a, b], [b, b], [b, a], [-b, a], [-b, b], [-a, b],
                         [-a, -b], [-b, -b]])
    if shape == "heart":
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        x = 16 * np.sin(t) ** 3
        y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
        pts = np.stack([x, y + 2.5], 1)
        return pts / np.abs(pts).max()
    raise ValueError(f"Unknown shape {shape!r}; valid shapes: {SHAPES}")


_POLYGONS = {shape: _unit_polygon(shape) for shape in SHAPES}


def _muted(rng: np.random.Generator, low: float, high: float) -> np.ndarray:
    """A desaturated colour with brightness in [low, high] (backgrounds and clutter must not look like a class)."""
    grey = rng.uniform(low, high)
    return np.clip(grey + rng.normal(0, 12, 3), 0, 255)


def _background(rng: np.random.Generator, style: str) -> np.ndarray:
    """A linear gradient between two muted colours along a random direction, (H, W, 3) float."""
    if style == "sketch":
        c0, c1 = _muted(rng, 225, 250), _muted(rng, 215, 245)
    elif style == "dark":
        c0, c1 = _muted(rng, 5, 45), _muted(rng, 5, 45)
    else:
        c0, c1 = _muted(rng, 70, 190), _muted(rng, 70, 190)
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE] / (IMAGE_SIZE - 1) - 0.5
    t = np.clip(0.5 + xx * np.cos(angle) + yy * np.sin(angle), 0, 1)[..., None]
    return c0 * (1 - t) + c1 * t


def _mask(polygon: np.ndarray, outline_width: float | None) -> np.ndarray:
    """Anti-aliased coverage (H, W) in [0, 1] of a polygon given in image pixel coordinates."""
    big = IMAGE_SIZE * SUPERSAMPLE
    canvas = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(canvas)
    xy = [tuple(p) for p in (polygon * SUPERSAMPLE).round(2).tolist()]
    if outline_width is None:
        draw.polygon(xy, fill=255)
    else:
        draw.polygon(xy, outline=255, width=max(1, int(round(outline_width * SUPERSAMPLE))))
    small = canvas.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float64) / 255.0


def _clutter(rng: np.random.Generator, image: np.ndarray, style: str) -> None:
    """Draw 0-3 small muted strokes or dots in place (distractors that are neither a class colour nor a shape)."""
    for _ in range(int(rng.integers(0, 4))):
        if rng.random() < 0.5:
            p0 = rng.uniform(0, IMAGE_SIZE, 2)
            p1 = p0 + rng.normal(0, 6, 2)
            poly = np.array([p0, p1, p1 + 0.01])
            cover = _mask(poly, outline_width=rng.uniform(0.6, 1.2))
        else:
            centre = rng.uniform(0, IMAGE_SIZE, 2)
            cover = _mask(centre + _POLYGONS["circle"] * rng.uniform(0.8, 1.8), outline_width=None)
        if style == "sketch":
            colour = _muted(rng, 60, 150)
        elif style == "dark":
            colour = _muted(rng, 30, 90)
        else:
            colour = _muted(rng, 40, 220)
        alpha = cover[..., None] * rng.uniform(0.5, 0.9)
        image *= 1 - alpha
        image += alpha * colour


def render(label: int, style: str, rng: np.random.Generator, size: str | None = None) -> np.ndarray:
    """One image (32, 32, 3) uint8 of class ``label`` drawn in ``style``; ``size`` is small/medium/large or random."""
    if not 0 <= label < len(CLASSNAMES):
        raise ValueError(f"label {label} out of range [0, {len(CLASSNAMES)})")
    if style not in STYLE_BY_NAME:
        raise ValueError(f"Unknown style {style!r}; valid styles: {sorted(STYLE_BY_NAME)}")
    shape = SHAPES[label // len(COLOURS)]
    rgb = np.array(COLOURS[label % len(COLOURS)][1], dtype=np.float64)
    size = size or ("small", "medium", "large")[int(rng.integers(0, 3))]
    if size not in SIZES:
        raise ValueError(f"Unknown size {size!r}; valid sizes: {sorted(SIZES)}")

    image = _background(rng, style)
    _clutter(rng, image, style)

    radius = rng.uniform(*SIZES[size])
    margin = 0.75 * radius
    centre = rng.uniform(margin, IMAGE_SIZE - margin, 2)
    angle = np.deg2rad(rng.uniform(-MAX_TILT_DEGREES, MAX_TILT_DEGREES))
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    polygon = centre + (_POLYGONS[shape] @ rot.T) * radius

    colour = np.clip(rgb + rng.normal(0, 12, 3), 0, 255)
    if style == "sketch":
        cover = _mask(polygon, outline_width=rng.uniform(1.0, 1.8))
        shading = 1.0
    else:
        cover = _mask(polygon, outline_width=None)
        yy, xx = (np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE] - centre[::-1, None, None]) / max(radius, 1.0)
        light = rng.uniform(0, 2 * np.pi)
        shading = (1.0 + 0.15 * (xx * np.cos(light) + yy * np.sin(light)))[..., None]
        if style == "dark":
            shading = shading * rng.uniform(0.4, 0.6)
    alpha = cover[..., None]
    image = image * (1 - alpha) + alpha * colour * shading

    noise = {"photo": 6.0, "sketch": 4.0, "blurry": 5.0, "dark": 9.0, "pixelated": 5.0}[style]
    image = np.clip(image + rng.normal(0, noise, image.shape), 0, 255).round().astype(np.uint8)

    if style == "blurry":
        pil = Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(1.0, 1.6))))
        image = np.asarray(pil)
    elif style == "pixelated":
        cells = int(rng.integers(8, 12))
        pil = Image.fromarray(image).resize((cells, cells), Image.Resampling.BOX)
        image = np.asarray(pil.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.NEAREST))
    return np.ascontiguousarray(image)


def image_rng(seed: int, style: str, split: str, label: int, index: int) -> np.random.Generator:
    """The random stream of one image: independent of generation order, so any subset regenerates identically."""
    return np.random.default_rng([seed, STYLE_BY_NAME[style].index, SPLIT_IDS[split], label, index])


def render_batch(labels: Sequence[int], styles: Sequence[str], sizes: Sequence[str | None], seed: int,
                 split: str, start_index: int = 0) -> np.ndarray:
    """Images (N, 32, 32, 3) uint8; item i uses the stream ``(seed, style, split, label, start_index + i)``."""
    out = np.empty((len(labels), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, (label, style, size) in enumerate(zip(labels, styles, sizes)):
        out[i] = render(int(label), style, image_rng(seed, style, split, int(label), start_index + i), size)
    return out
