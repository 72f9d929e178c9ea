"""A deterministic compositional image world: textured shapes in random colours, drawn in several rendering styles.

A *concept* is a shape with a surface texture ("striped triangle"): 8 shapes x 5 textures = 40 concepts (docs/world.md,
section The world). No class name mentions a colour: pretraining draws it at random for every image, benchmark
datasets (:mod:`atlas_fast.world.benchmark`) from the shape's two typical colours (:data:`SHAPE_PALETTES`). Every
image is drawn in one *style* (photo, sketch, dark photo, cartoon), the world's domain shift; pretraining captions
never name the style.

Rendering is a pure function of ``(seed, style, split, concept, index)``: the same arguments give byte-identical
pixels on every machine (numpy's PCG64 and Pillow's rasteriser, no global random state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 32
SUPERSAMPLE = 4  # shapes and textures are drawn at 4x and box-filtered down: anti-aliased edges

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
SHAPES: tuple[str, ...] = ("circle", "triangle", "square", "star", "cross", "heart", "diamond", "moon")
TEXTURES: tuple[str, ...] = ("solid", "striped", "dotted", "checkered", "hollow")
# What a shape has in common with others; pretraining captions sometimes say it ("a striped square, a shape with
# four corners."), so the text tower learns that square and diamond, or circle, heart and moon, are alike.
SHAPE_ATTRIBUTES: dict[str, str] = {
    "circle": "a round shape with no corners",
    "triangle": "a shape with three corners",
    "square": "a shape with four corners",
    "star": "a shape with five points",
    "cross": "a shape with four arms",
    "heart": "a round shape with one point",
    "diamond": "a shape with four corners",
    "moon": "a round shape with two points",
}
# Typical colours of a shape in a benchmark drawn with ``colours="shape-palette"`` (issue 19): as real classes have
# colours their names do not say (a flamingo is pink), each shape is drawn in one of two colours; every colour is
# typical of two shapes. Pretraining never pairs a class name with these (its colours are uniform).
_PALETTE_ORDER = np.random.default_rng(2020).permutation(len(COLOURS))
SHAPE_PALETTES: dict[str, tuple[int, int]] = {
    shape: (int(_PALETTE_ORDER[i]), int(_PALETTE_ORDER[(i + 3) % len(COLOURS)])) for i, shape in enumerate(SHAPES)}
STYLES: tuple[str, ...] = ("photo", "sketch", "dark", "cartoon")
CONCEPTS: tuple[str, ...] = tuple(f"{texture} {shape}" for shape in SHAPES for texture in TEXTURES)


@dataclass(frozen=True)
class Layout:
    """How an object sits in its image: circumradius range (pixels of the 32-pixel image), largest shift of its centre
    from the image centre, largest tilt (degrees; up to ~20 a diamond, a tall rhombus, never becomes a square), most
    clutter strokes and a factor on the style's pixel noise."""

    radius: tuple[float, float] = (10.0, 13.5)
    max_shift: float = 2.5
    max_tilt: float = 10.0
    max_clutter: int = 2
    noise: float = 1.0


# Pretraining images are centred, large and clean, like the curated photos a CLIP learns from; benchmark images are
# BENCHMARK_LAYOUT (benchmark.py): smaller, off-centre, tilted and cluttered, so zero-shot CLIP is strong but not
# perfect on them and prompt tuning has a dataset to adapt to.
PRETRAIN_LAYOUT = Layout()

# Split ids keep the random streams of benchmark splits and of pretraining apart.
SPLIT_IDS: dict[str, int] = {"train": 0, "val": 1, "test": 2, "pretrain": 3, "eval": 4}


def concept_id(name: str) -> int:
    """Index of a concept ("striped triangle") in :data:`CONCEPTS`; a clear error names the valid words."""
    try:
        return CONCEPTS.index(name)
    except ValueError:
        raise ValueError(f"unknown concept {name!r}: a concept is '<texture> <shape>' with texture in {TEXTURES} "
                         f"and shape in {SHAPES}") from None


def _unit_polygon(shape: str) -> np.ndarray:
    """Vertices (N, 2) of a shape centred near 0 with circumradius about 1, in y-down image coordinates."""
    if shape == "circle":
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1)
    if shape == "triangle":
        t = -np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        return np.stack([np.cos(t), np.sin(t) + 0.2], 1)
    if shape == "square":
        t = np.pi / 4 + np.arange(4) * np.pi / 2
        return np.stack([np.cos(t), np.sin(t)], 1)
    if shape == "star":
        t = -np.pi / 2 + np.arange(10) * np.pi / 5
        r = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
        return np.stack([r * np.cos(t), r * np.sin(t) + 0.1], 1)
    if shape == "cross":
        a, b = 0.95, 0.34
        return np.array([[-b, -a], [b, -a], [b, -b], [a, -b], [a, b], [b, b], [b, a], [-b, a], [-b, b], [-a, b],
                         [-a, -b], [-b, -b]])
    if shape == "heart":
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        x = 16 * np.sin(t) ** 3
        y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
        pts = np.stack([x, y + 2.5], 1)
        return pts / np.abs(pts).max()
    if shape == "diamond":  # a tall rhombus
        return np.array([[0.0, -1.0], [0.62, 0.0], [0.0, 1.0], [-0.62, 0.0]])
    if shape == "moon":  # the unit disc minus a disc of radius 0.8 centred at (0.45, 0): a crescent opening right
        corner = np.arctan2(0.7806, 0.625)
        outer = np.linspace(corner, 2 * np.pi - corner, 36)
        inner_corner = np.arctan2(0.7806, 0.625 - 0.45)
        inner = np.linspace(2 * np.pi - inner_corner, inner_corner, 28)
        pts = np.concatenate([np.stack([np.cos(outer), np.sin(outer)], 1),
                              np.stack([0.45 + 0.8 * np.cos(inner), 0.8 * np.sin(inner)], 1)])
        return pts + np.array([0.3, 0.0])
    raise ValueError(f"Unknown shape {shape!r}; valid shapes: {SHAPES}")


_POLYGONS = {shape: _unit_polygon(shape) for shape in SHAPES}
_BIG = IMAGE_SIZE * SUPERSAMPLE
# Pixel-centre coordinates of the supersampled grid, in image pixels (y, x).
_GRID_Y, _GRID_X = (np.mgrid[0:_BIG, 0:_BIG] + 0.5) / SUPERSAMPLE


def _downsample(big: np.ndarray) -> np.ndarray:
    """Box-filter a (BIG, BIG, ...) array to (IMAGE_SIZE, IMAGE_SIZE, ...)."""
    s = SUPERSAMPLE
    return big.reshape(IMAGE_SIZE, s, IMAGE_SIZE, s, *big.shape[2:]).mean(axis=(1, 3))


def _coverage(polygon: np.ndarray, outline_width: float | None = None) -> np.ndarray:
    """Binary coverage (BIG, BIG) of a polygon given in image pixel coordinates (filled, or its outline)."""
    canvas = Image.new("L", (_BIG, _BIG), 0)
    draw = ImageDraw.Draw(canvas)
    xy = [tuple(p) for p in (polygon * SUPERSAMPLE).round(2).tolist()]
    if outline_width is None:
        draw.polygon(xy, fill=255)
    else:
        draw.polygon(xy, outline=255, width=max(1, int(round(outline_width * SUPERSAMPLE))))
    return np.asarray(canvas, dtype=np.float64) / 255.0


def _texture_pattern(texture: str, rng: np.random.Generator, centre: np.ndarray, angle: float) -> np.ndarray:
    """Where (BIG, BIG) in {0, 1} the surface shows its ink colour, in the shape's own tilted frame."""
    dy, dx = _GRID_Y - centre[1], _GRID_X - centre[0]
    u = dx * np.cos(angle) + dy * np.sin(angle)
    v = -dx * np.sin(angle) + dy * np.cos(angle)
    if texture == "solid":
        return np.ones_like(u)
    if texture == "striped":  # diagonal-ish stripes, 2 px of ink every ~4 px
        period = rng.uniform(3.6, 4.6)
        theta = rng.choice([np.pi / 4, 3 * np.pi / 4]) + rng.uniform(-0.2, 0.2)
        phase = (u * np.cos(theta) + v * np.sin(theta)) / period + rng.uniform(0, 1)
        return (phase % 1.0 < 0.5).astype(np.float64)
    if texture == "dotted":  # a sparse square lattice of round dots
        period = rng.uniform(5.0, 5.8)
        fu, fv = (u / period + rng.uniform(0, 1)) % 1.0 - 0.5, (v / period + rng.uniform(0, 1)) % 1.0 - 0.5
        return ((fu ** 2 + fv ** 2) * period ** 2 < rng.uniform(1.2, 1.5) ** 2).astype(np.float64)
    if texture == "checkered":  # squares of 2.5-3 px
        period = rng.uniform(5.0, 6.0)
        cu, cv = np.floor(2 * u / period + rng.uniform(0, 2)), np.floor(2 * v / period + rng.uniform(0, 2))
        return ((cu + cv) % 2 == 0).astype(np.float64)
    if texture == "hollow":  # only the outline is drawn (by the caller)
        return np.zeros_like(u)
    raise ValueError(f"Unknown texture {texture!r}; valid textures: {TEXTURES}")


def _muted(rng: np.random.Generator, low: float, high: float) -> np.ndarray:
    """A desaturated colour with brightness in [low, high] (backgrounds and clutter must not look like a class)."""
    grey = rng.uniform(low, high)
    return np.clip(grey + rng.normal(0, 12, 3), 0, 255)


def _background(rng: np.random.Generator, style: str) -> np.ndarray:
    """A linear gradient between two muted colours along a random direction, (H, W, 3) float."""
    if style == "sketch":
        c0, c1 = _muted(rng, 228, 250), _muted(rng, 222, 248)
    elif style == "dark":
        c0, c1 = _muted(rng, 5, 40), _muted(rng, 5, 40)
    elif style == "cartoon":
        c0 = np.clip(rng.uniform(150, 240) + rng.normal(0, 25, 3), 0, 255)
        c1 = c0
    else:
        c0, c1 = _muted(rng, 70, 190), _muted(rng, 70, 190)
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE] / (IMAGE_SIZE - 1) - 0.5
    t = np.clip(0.5 + xx * np.cos(angle) + yy * np.sin(angle), 0, 1)[..., None]
    return c0 * (1 - t) + c1 * t


def _clutter(rng: np.random.Generator, image: np.ndarray, style: str, most: int) -> None:
    """Draw 0..most small muted strokes in place (distractors that are neither a texture nor a shape)."""
    for _ in range(int(rng.integers(0, most + 1))):
        p0 = rng.uniform(0, IMAGE_SIZE, 2)
        p1 = p0 + rng.normal(0, 5, 2)
        cover = _downsample(_coverage(np.array([p0, p1, p1 + 0.01]), outline_width=rng.uniform(0.6, 1.0)))
        colour = _muted(rng, 60, 150) if style in ("sketch", "cartoon") else _muted(rng, 30, 200)
        alpha = cover[..., None] * rng.uniform(0.4, 0.8)
        image *= 1 - alpha
        image += alpha * colour


def render(concept: int, style: str, rng: np.random.Generator, colour: int | None = None,
           layout: Layout = PRETRAIN_LAYOUT) -> np.ndarray:
    """One image (32, 32, 3) uint8 of concept index ``concept`` drawn in ``style`` (colour index random if None)."""
    if not 0 <= concept < len(CONCEPTS):
        raise ValueError(f"concept {concept} out of range [0, {len(CONCEPTS)})")
    if style not in STYLES:
        raise ValueError(f"Unknown style {style!r}; valid styles: {list(STYLES)}")
    texture, shape = CONCEPTS[concept].split(" ")
    colour = int(rng.integers(0, len(COLOURS))) if colour is None else colour
    rgb = np.clip(np.array(COLOURS[colour][1], dtype=np.float64) + rng.normal(0, 12, 3), 0, 255)

    image = _background(rng, style)
    _clutter(rng, image, style, layout.max_clutter)

    radius = rng.uniform(*layout.radius)
    centre = IMAGE_SIZE / 2 + rng.uniform(-layout.max_shift, layout.max_shift, 2)
    angle = np.deg2rad(rng.uniform(-layout.max_tilt, layout.max_tilt))
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    polygon = centre + (_POLYGONS[shape] @ rot.T) * radius

    inside = _coverage(polygon)
    pattern = _texture_pattern(texture, rng, centre, angle)
    outline = _coverage(polygon, outline_width=rng.uniform(1.1, 1.6))
    # One colour layer at 4x: its colour (BIG, BIG, 3) and coverage (BIG, BIG).
    if style == "sketch":  # grey pencil on paper, no colour at all: the outline and the texture's marks
        ink = np.full(3, rng.uniform(40, 90))
        layer = np.broadcast_to(ink, (_BIG, _BIG, 3))
        big_alpha = np.maximum(outline, inside * pattern * (0.55 if texture == "solid" else 0.85))
    else:
        ink = rgb if style != "cartoon" else np.clip((rgb - rgb.mean()) * 1.3 + rgb.mean(), 0, 255)
        if texture == "hollow":
            layer, big_alpha = np.broadcast_to(ink, (_BIG, _BIG, 3)), outline
        else:  # between the ink marks the surface is a pale tint of the same colour
            tint = 0.35 * ink + 0.65 * 245.0
            layer, big_alpha = tint + pattern[..., None] * (ink - tint), inside
    alpha = _downsample(big_alpha)[..., None]
    fg = _downsample(layer * big_alpha[..., None]) / np.maximum(alpha, 1e-6)

    if style in ("photo", "dark"):
        yy, xx = (np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE] - centre[::-1, None, None]) / max(radius, 1.0)
        light = rng.uniform(0, 2 * np.pi)
        fg = fg * (1.0 + 0.15 * (xx * np.cos(light) + yy * np.sin(light)))[..., None]
        if style == "dark":
            fg = fg * rng.uniform(0.35, 0.55)
    image = image * (1 - alpha) + alpha * fg
    if style == "cartoon":  # a dark outline around every cartoon shape
        rim = _downsample(outline)[..., None] * 0.9
        image = image * (1 - rim) + rim * 25.0

    noise = layout.noise * {"photo": 6.0, "sketch": 4.0, "dark": 8.0, "cartoon": 2.0}[style]
    image = np.clip(image + rng.normal(0, noise, image.shape), 0, 255).round().astype(np.uint8)
    return np.ascontiguousarray(image)


def image_rng(seed: int, style: str, split: str, concept: int, index: int) -> np.random.Generator:
    """The random stream of one image: independent of generation order, so any subset regenerates identically."""
    return np.random.default_rng([seed, STYLES.index(style), SPLIT_IDS[split], concept, index])


def render_batch(concepts: Sequence[int], styles: Sequence[str], seed: int, split: str, start_index: int = 0,
                 colours: Sequence[int | None] | None = None, layout: Layout = PRETRAIN_LAYOUT) -> np.ndarray:
    """Images (N, 32, 32, 3) uint8; item i uses the stream ``(seed, style, split, concept, start_index + i)``."""
    out = np.empty((len(concepts), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    colours = [None] * len(concepts) if colours is None else colours
    for i, (concept, style, colour) in enumerate(zip(concepts, styles, colours)):
        out[i] = render(int(concept), style, image_rng(seed, style, split, int(concept), start_index + i), colour,
                        layout)
    return out
