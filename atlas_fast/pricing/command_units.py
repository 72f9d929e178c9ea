"""The units a command pays around its runs' steps, measured on this machine: loading the backbone (its start), the
feature cache's build (:func:`measure_encode` in the build's own batches; :func:`measure_decode`, decoding an image
and cutting its views), starting the pixel path's decoding pool, writing its report and ending its process
(:func:`measure_exit`). A run's own units are in :mod:`atlas_fast.pricing.units`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from atlas_fast.clip.backbones import Backbone
from atlas_fast.pricing.timing import PeakMemory, Unit, timed


def measure_encode(backbone: Backbone, batch: int = 64, precision: str = "auto", max_repeats: int = 3) -> Unit:
    """Seconds per image view of what a cache build's own thread does for it: normalise its 8-bit pixels on the
    encoder's device and encode them with the frozen image encoder, in batches of ``batch`` views (timed at each
    batch the build will use: an image's views go together, and a view costs more in a batch of 201 than of 64) at
    the cache's precision (``auto``: fp16 autocast on CUDA, fp32 on the CPU). The views are cut in worker processes
    beside it (:func:`measure_decode`) and written by a thread beside it."""
    from atlas_fast.clip.transforms import normalize_pixels

    device = backbone.device
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if precision == "auto" and device.type == "cuda":
        dtype = torch.float16
    size = backbone.preprocessing.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (batch, size, size, 3), generator=generator, dtype=torch.uint8)
    pixels = pixels.pin_memory() if device.type == "cuda" else pixels

    def encode() -> None:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            backbone.encode_image(normalize_pixels(pixels, backbone.transform, device))

    with PeakMemory(device) as peak:
        seconds, repeats = timed(encode, device, max_repeats)
    return Unit(seconds / batch, peak.host, peak.device_bytes, repeats=repeats)


def measure_decode(backbone: Backbone, views: int = 2, max_repeats: int = 5,
                   images: Sequence[str | Path] = (), pixels: bool = False) -> Unit:
    """Seconds to decode an image and transform it into views: ``seconds`` per view, ``fixed_seconds`` per decoded
    image. Timed on ``images`` (a sample of the files a plan reads) or, without them, on a 500 x 375 random-texture
    JPEG (an average photo of the paper's datasets): :func:`~atlas_fast.clip.transforms.load_views`, or with
    ``pixels`` a cache build's workers' 8-bit views (:func:`~atlas_fast.clip.transforms.load_view_pixels`)."""
    from PIL import Image

    from atlas_fast.clip.transforms import load_view_pixels, load_views

    load = load_view_pixels if pixels else load_views

    spec = backbone.transform
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="atlas_pricing_") as folder:
        paths = [Path(p) for p in images]
        if not paths:
            paths = [Path(folder) / "photo.jpg"]
            noise = torch.randint(0, 256, (375, 500, 3), generator=torch.Generator().manual_seed(0),
                                  dtype=torch.uint8)
            Image.fromarray(noise.numpy()).save(paths[0], quality=90)
        one, _ = timed(lambda: [load(p, p.name, [0], spec) for p in paths], cpu, max_repeats)
        many, repeats = timed(lambda: [load(p, p.name, list(range(1, views + 1)), spec) for p in paths], cpu,
                              max_repeats)
    one, many = one / len(paths), many / len(paths)
    per_view = max(0.0, (many - one) / max(1, views - 1)) if views > 1 else one
    return Unit(per_view, fixed_seconds=max(0.0, one - per_view), repeats=repeats)


def measure_loader_start(backbone: Backbone, max_repeats: int = 3) -> Unit:
    """Seconds to start the pixel path's decoding pool (:class:`~atlas_fast.engine.pixels.DecodingPool`, with the
    worker processes it uses on this device) and decode one small image through it: what a command that reads
    pixels pays once (its pool then serves every epoch and every evaluated class set)."""
    from PIL import Image

    from atlas_fast.data.base import Datum
    from atlas_fast.engine.pixels import DecodingPool, ImageViews, ViewFeed, default_workers

    device = backbone.device
    with tempfile.TemporaryDirectory(prefix="atlas_pricing_") as folder:
        path = Path(folder) / "tiny.jpg"
        Image.new("RGB", (32, 32), (128, 64, 32)).save(path)
        items = [Datum(str(path), 0, "tiny", "tiny.jpg")]

        def start() -> None:
            pool = DecodingPool(default_workers(device), pin_memory=device.type == "cuda")
            try:
                for _ in ImageViews(items, backbone, device=device, feed=ViewFeed(pool, device)).batches(0, None, 1):
                    pass
            finally:
                pool.close()

        seconds, repeats = timed(start, device, max_repeats, min_seconds=0.0)
    return Unit(seconds, repeats=repeats)


def measure_report(write: Callable[[Path], Any]) -> Unit:
    """Seconds ``write(folder)`` takes to write an experiment's report into an empty folder (its tables and a plot),
    timed on its first call in this process, so that matplotlib's start (the largest part on a small job) counts as
    the command will pay it."""
    with tempfile.TemporaryDirectory(prefix="atlas_pricing_") as folder:
        start = time.perf_counter()
        write(Path(folder))
        seconds = time.perf_counter() - start
    return Unit(seconds)


def measure_backbone_load(config: Any, device: torch.device) -> Unit:
    """Seconds to load (and fingerprint) a backbone: what a fresh process pays once before its first run."""
    from atlas_fast.clip.backbones import load_backbone

    with PeakMemory(device) as peak:
        start = time.perf_counter()
        load_backbone(config, device)
        seconds = time.perf_counter() - start
    return Unit(seconds, peak.host, peak.device_bytes)


#: what a fresh interpreter runs to time its own end (:func:`measure_exit`): import the modules named on standard
#: input, say so, and end
_IMPORT_THEN_END = """
import importlib, sys, warnings
warnings.simplefilter("ignore")
for name in sys.stdin.read().split():
    try:
        importlib.import_module(name)
    except Exception:
        pass
print("\\nall imported", flush=True)
"""


def measure_exit(modules: Sequence[str] | None = None) -> Unit:
    """Seconds a command's process takes to end once its work is done: Python tearing down every module and object
    (a command pays it before its shell returns). Timed on a fresh interpreter that imports the modules this process
    holds (call it after the other units; ``modules``: those instead), from then to its end. A failure to time it
    warns and prices nothing."""
    names = "\n".join(name for name in (list(sys.modules) if modules is None else modules)
                      if name not in ("__main__", "__mp_main__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    child = subprocess.Popen([sys.executable, "-c", _IMPORT_THEN_END], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        child.stdin.write(names)
        child.stdin.close()
        said = next((line for line in child.stdout if line == "all imported\n"), "")  # a module may print too
        start = time.perf_counter()
        child.stdout.read()  # what its end prints, to the end of its output
        child.wait(timeout=600)
        seconds = time.perf_counter() - start
    except (OSError, subprocess.TimeoutExpired) as exc:
        child.kill()
        child.wait()
        said, seconds = f"{type(exc).__name__}: {exc}", 0.0
    if not said.startswith("all imported") or child.returncode != 0:
        warnings.warn(f"pricing: could not time a process's end ({said.strip() or f'exit status {child.returncode}'});"
                      f" it is priced at 0 s.", stacklevel=2)
        return Unit(0.0)
    return Unit(seconds)
