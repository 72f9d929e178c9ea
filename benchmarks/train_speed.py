"""Time per epoch of CoOp training: the reference's full forward path vs atlas_fast's cached path, in one process.

Both paths run the *same* training (atlas_fast's ``train_runs``: same data, views, model, init, shuffling, epochs,
batch size, SGD + cosine schedule) and differ only in the forward:

* full: the frozen image encoder runs on the epoch's view pixels at every step and the prompts go through the text
  tower at the full 77-token context length, as the reference trainers do (``docs/method-zoo.md``, section CoOp). The
  view pixels are decoded and augmented once beforehand (not timed), which favours the full path: the reference also
  decodes and augments every step. Test accuracy uses the test view-0 features of both (what the image encoder gives on
  the test pixels) with each path's own text tower.
* cached: the same views encoded once into the feature cache (build time reported separately, stored as float32 so
  both paths see the same numbers), then training reads features and runs the text tower truncated to the longest
  prompt (exact under the causal mask).

Because both read the same views, their final test accuracies must be identical (the script checks and prints the
largest difference of the learned context, which is rounding noise). Memory is the process's peak resident set (CPU)
or peak CUDA allocation, plus how much it rose during each path's training; all sizes run in one process, so the
totals of later sizes include what earlier ones left resident, and the rise is the number to compare.
Model: a ViT-B/16-shaped CLIP with random weights (``BackboneConfig("ViT-B-16", None)``); the speed ratio does not
depend on the weights. On a busy machine pass ``--threads 1``: two intra-op threads competing with other processes
slow the many small ops of the cached path several-fold.

Usage::

    python benchmarks/train_speed.py            # C = 10, 50, 100 classes, 1 shot, 2 epochs
    python benchmarks/train_speed.py --quick    # C = 10, 1 shot, 2 epochs: a short check
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.cache import FeatureCache  # noqa: E402
from atlas_fast.data.base import Datum  # noqa: E402
from atlas_fast.engine.evaluate import top1_accuracy  # noqa: E402
from atlas_fast.methods.config import OptimRecipe  # noqa: E402
from atlas_fast.methods.coop import CoOp, CoOpConfig  # noqa: E402
from atlas_fast.atlas.schedules import OneHot  # noqa: E402
from atlas_fast.engine.feed import CachedViews, EpochTensorInputs  # noqa: E402
from atlas_fast.engine.loop import TrainingRuns, train_runs  # noqa: E402
from atlas_fast.engine.step import RunState  # noqa: E402
from atlas_fast.clip.transforms import load_views  # noqa: E402

COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple", "brown", "grey"]
ANIMALS = ["cat", "dog", "bird", "horse", "sheep", "cow", "frog", "fish", "snake", "turtle"]


class FullForwardCoOp(CoOp):
    """CoOp computed as the reference does at every step: image encoder on pixels, prompts padded to 77 tokens.

    Its inputs are the epoch's view pixels, which :class:`PixelViews` serves to the shared training loop."""

    def full_text_features(self) -> torch.Tensor:
        model = self.backbone.model
        prompts = self.prompt_embeddings()  # (R, C, n_used, d)
        runs, classes, used, width = prompts.shape
        length = int(model.positional_embedding.shape[0])
        padding = model.token_embedding(torch.zeros(length - used, dtype=torch.long, device=prompts.device))
        x = torch.cat([prompts, padding.expand(runs, classes, -1, -1)], dim=2).reshape(-1, length, width)
        x = model.transformer(x + model.positional_embedding, attn_mask=model.attn_mask)
        x = model.ln_final(x)[torch.arange(x.shape[0]), self.eot_index.repeat(runs)]
        projection = model.text_projection
        x = projection(x) if isinstance(projection, torch.nn.Linear) else x @ projection
        return F.normalize(x.reshape(runs, classes, -1), dim=-1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        image_features = F.normalize(self.backbone.model.encode_image(pixels), dim=-1)
        return self.logit_scale * torch.einsum("bd,rcd->rbc", image_features, self.full_text_features())


class PixelViews(EpochTensorInputs):
    """The augmented view pixels of every training image; epoch ``e`` reads view ``1 + (e mod V)``."""

    def __init__(self, pixels: torch.Tensor) -> None:
        self.pixels = pixels  # (N, V, 3, S, S)

    def for_epoch(self, epoch: int) -> torch.Tensor:
        return self.pixels[:, epoch % self.pixels.shape[1]]


def write_images(folder: Path, classes: int, per_class: int, split: str, seed: int) -> list[Datum]:
    """Small random-colour images (decoding cost is not what is measured); labels 0..classes-1."""
    rng = np.random.default_rng(seed)
    items = []
    for label in range(classes):
        name = f"{COLOURS[label % 10]} {ANIMALS[label // 10 % 10]}"
        for i in range(per_class):
            key = f"{split}/{label:03d}_{i}.png"
            path = folder / key
            path.parent.mkdir(parents=True, exist_ok=True)
            pixels = np.clip(rng.integers(0, 256, 3) + rng.normal(0, 40, (64, 80, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(path)
            items.append(Datum(str(path), label, name, key))
    return items


def peak_memory_reset(device: torch.device) -> float:
    """Start a peak-memory measurement; returns the memory in use now (MiB)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    try:  # Linux: writing 5 resets the peak resident set size (VmHWM) of this process to the current one
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _proc_status_mib("VmRSS:")


def _proc_status_mib(field: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def peak_memory_mib(device: torch.device) -> float:
    """Peak since :func:`peak_memory_reset`: CUDA allocated memory, or the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = _proc_status_mib("VmHWM:")
    if peak == peak:  # not NaN
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_size(backbone, classes: int, shots: int, epochs: int, batch_size: int, folder: Path,
             device: torch.device, progress: bool) -> dict:
    train = write_images(folder, classes, shots, "train", seed=classes)
    test = write_images(folder, classes, 1, "test", seed=10_000 + classes)
    names = tuple(dict.fromkeys(d.classname for d in train))
    labels = torch.tensor([d.label for d in train])
    views, aug_seed, dataset = epochs, 0, f"bench{classes}"
    recipe = OptimRecipe(epochs=epochs, batch_size=batch_size, lr=0.002)
    method_config = CoOpConfig(ctx_init="a photo of a")

    cache = FeatureCache(folder / "cache", storage_dtype="float32")
    start = time.perf_counter()
    cache.build(backbone, dataset, train, num_views=views, aug_seed=aug_seed, progress=progress)
    cache.build(backbone, dataset, test, num_views=0, progress=progress)
    build_seconds = time.perf_counter() - start
    test_features = cache.load(backbone, dataset, test, views=[0])[:, 0]
    test_labels = torch.tensor([d.label for d in test])

    spec = backbone.transform_for(aug_seed)
    train_pixels = torch.stack([load_views(d.impath, d.key, list(range(1, views + 1)), spec) for d in train])

    results = {}
    for path in ("cached", "full"):
        torch.manual_seed(0)
        cls = CoOp if path == "cached" else FullForwardCoOp
        method = cls(backbone, names, method_config).to(device)
        inputs = (CachedViews(cache, backbone, dataset, train, views, aug_seed) if path == "cached"
                  else PixelViews(train_pixels))
        start_mib = peak_memory_reset(device)
        (log,) = train_runs(TrainingRuns(method, [RunState(inputs, labels, None, OneHot(), seed=1, device=device)]),
                            recipe, device=device, amp=False, progress=progress)
        memory = peak_memory_mib(device)
        with torch.no_grad():
            # test view 0 is what the image encoder gives on the test pixels (float32 cache)
            text = method.text_features() if path == "cached" else method.full_text_features()
            image_features = F.normalize(test_features.to(device), dim=-1)
            logits = method.logit_scale * torch.einsum("bd,rcd->rbc", image_features, text)
            accuracy = top1_accuracy(logits, test_labels)[0].item()
        results[path] = {"epoch_s": float(np.median([row["seconds"] for row in log])), "peak_mib": memory,
                         "added_mib": memory - start_mib,
                         "accuracy": accuracy, "ctx": method.ctx.detach().cpu().clone(),
                         "predictions": logits[0].argmax(-1).cpu(),
                         "loss": [row["loss"] for row in log]}
    return {"classes": classes, "train_images": len(train), "build_s": build_seconds, **results,
            "ctx_max_diff": float((results["cached"]["ctx"] - results["full"]["ctx"]).abs().max()),
            "same_predictions": bool(torch.equal(results["cached"]["predictions"], results["full"]["predictions"]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[10, 50, 100], help="class counts C")
    parser.add_argument("--shots", type=int, default=1, help="training images per class (default 1)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs, also the number of cached views (default 2)")
    parser.add_argument("--batch-size", type=int, default=32, help="CoOp's batch size (default 32)")
    parser.add_argument("--model", default="ViT-B-16", help="open_clip model, random weights (default ViT-B-16)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="a short check: C = 10 only")
    parser.add_argument("--progress", action="store_true", help="show progress bars")
    args = parser.parse_args(argv)
    if args.quick:
        args.classes = [10]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backbone = load_backbone(BackboneConfig(args.model, None), device)
    print(f"{backbone.describe()} on {device} ({torch.get_num_threads()} threads); {args.shots} shot(s), "
          f"{args.epochs} epochs, batch {args.batch_size}; epoch time = median over epochs; MiB = peak "
          f"{'CUDA allocation' if device.type == 'cuda' else 'resident set'} + its rise during training")
    columns = ("C", "N", "build s", "full s/ep", "cached s/ep", "speed-up", "full MiB", "cached MiB",
               "acc full", "acc cached", "max|dctx|", "same preds")
    print(" ".join(f"{name:>12}" for name in columns))
    rows = []
    with tempfile.TemporaryDirectory(prefix="atlas_train_speed_") as tmp:
        for classes in args.classes:
            r = run_size(backbone, classes, args.shots, args.epochs, args.batch_size, Path(tmp) / f"c{classes}",
                         device, args.progress)
            rows.append(r)
            full, cached = r["full"], r["cached"]
            values = (classes, r["train_images"], f"{r['build_s']:.2f}", f"{full['epoch_s']:.3f}",
                      f"{cached['epoch_s']:.4f}", f"{full['epoch_s'] / cached['epoch_s']:.1f}x",
                      f"{full['peak_mib']:.0f}+{max(0.0, full['added_mib']):.0f}",
                      f"{cached['peak_mib']:.0f}+{max(0.0, cached['added_mib']):.0f}", f"{full['accuracy']:.2f}",
                      f"{cached['accuracy']:.2f}", f"{r['ctx_max_diff']:.2e}", r["same_predictions"])
            print(" ".join(f"{str(v):>12}" for v in values), flush=True)
    same = all(r["full"]["accuracy"] == r["cached"]["accuracy"] and r["same_predictions"] for r in rows)
    print(f"accuracy and test predictions identical on every size: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
