"""Per-step time and peak memory of the methods that prompt the image tower, side by side in one process.

Each row is one training step of batch 4 (forward, backward, SGD step; fp16 autocast + gradient scaler on a GPU,
fp32 on the CPU) on a ViT-B/16-shaped CLIP with random weights (``BackboneConfig("ViT-B-16", None)``), the recipes'
architectures:

* CoOp (M = 4, cached image features): the text-only reference point;
* IVLP 2 + 2 tokens, depth 12 / 12 (the MaPLe repository's base-to-new config);
* MaPLe M = 2, J = 9, and DePT's head on it;
* PromptSRC 4 + 4, depth 9 / 9, with its frozen image features of the batch's views read from the cache (what
  atlas_fast does) and computed by running the frozen image tower every step (what the reference does).

Time is the median over ``--steps`` timed steps after one untimed warm-up step (which also encodes PromptSRC's
60-template text targets once). Memory: "activations" is what autograd saves for the backward pass in one step
(unique tensor storages, the frozen weights excluded), exact and device-independent; "peak" is the peak CUDA
allocation on a GPU, or the process's peak resident set on the CPU, measured from a reset before each row, and
"rise" is the peak minus what was in use before the row started (on the CPU the allocator keeps memory freed by
earlier rows, so compare the activations there). Pixels are random (speed does not depend on them) and the same
for every row.

Usage::

    python benchmarks/pixel_methods.py                  # C = 10 classes, 3 timed steps
    python benchmarks/pixel_methods.py --classes 100 --steps 10 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from atlas_fast.atlas.criterion import LossCriterion  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.engine.feed import PixelBatch  # noqa: E402
from atlas_fast.methods.registry import build_method  # noqa: E402
from atlas_fast.methods.coop import CoOpConfig  # noqa: E402
from atlas_fast.methods.dept import DePTMaPLeConfig  # noqa: E402
from atlas_fast.methods.ivlp import IVLPConfig  # noqa: E402
from atlas_fast.methods.maple import MaPLeConfig  # noqa: E402
from atlas_fast.methods.promptsrc import PromptSRCConfig  # noqa: E402
from train_speed import peak_memory_mib, peak_memory_reset  # noqa: E402

ROWS = [
    ("CoOp M=4 (cached features)", "coop", CoOpConfig(ctx_init="a photo of a"), "features"),
    ("IVLP 2+2, J=12/12", "ivlp", IVLPConfig(), "pixels"),
    ("MaPLe M=2, J=9", "maple", MaPLeConfig(), "pixels"),
    ("DePT-MaPLe M=2, J=9", "dept-maple", DePTMaPLeConfig(), "pixels"),
    ("PromptSRC 4+4, J=9/9, frozen features cached", "promptsrc", PromptSRCConfig(), "cached"),
    ("PromptSRC 4+4, J=9/9, frozen features computed", "promptsrc", PromptSRCConfig(), "pixels"),
]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SavedActivations:
    """Sum of the storages autograd saves for backward while active, excluding the frozen CLIP weights."""

    def __init__(self, backbone) -> None:
        self.frozen = {p.untyped_storage().data_ptr() for p in backbone.model.parameters()}
        self.sizes: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.frozen:
            self.sizes[storage.data_ptr()] = storage.nbytes()
        return tensor

    def mib(self) -> float:
        return sum(self.sizes.values()) / 2**20


def measure(backbone, name: str, config, inputs_kind: str, classnames: list[str], pixels: torch.Tensor,
            labels: torch.Tensor, steps: int, device: torch.device) -> dict:
    amp = device.type == "cuda"
    start_mib = peak_memory_reset(device)
    torch.manual_seed(0)
    method = build_method(name, backbone, classnames, config).to(device)
    optimizer = torch.optim.SGD(method.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    if inputs_kind == "features":
        inputs = backbone.encode_image(pixels)
    elif inputs_kind == "cached":
        inputs = PixelBatch(pixels, backbone.encode_image(pixels))  # the cache holds exactly these features
    else:
        inputs = pixels
    method.train()
    times = []
    for step in range(steps + 1):
        synchronize(device)
        start = time.perf_counter()
        saved = SavedActivations(backbone)
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp), \
                torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda tensor: tensor):
            criterion = LossCriterion(lambda logits, r: F.cross_entropy(logits.float(), labels), [len(labels)])
            loss = method.training_loss(inputs, labels, criterion)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        synchronize(device)
        if step > 0:  # step 0 warms up (and encodes PromptSRC's template targets)
            times.append(time.perf_counter() - start)
    peak = peak_memory_mib(device)
    params = sum(p.numel() for p in method.parameters() if p.requires_grad)
    del method, optimizer
    return {"step_ms": 1000 * statistics.median(times), "peak_mib": peak, "rise_mib": max(0.0, peak - start_mib),
            "params": params, "activations_mib": saved.mib()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=10, help="training classes C (default 10)")
    parser.add_argument("--batch-size", type=int, default=4, help="images per step (default 4, the recipes')")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per row (default 3)")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    parser.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    backbone = load_backbone(BackboneConfig("ViT-B-16", None), device)
    size = backbone.preprocessing.image_size
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(args.batch_size, 3, size, size, generator=generator).to(device)
    labels = torch.randint(0, args.classes, (args.batch_size,), generator=generator).to(device)
    classnames = [f"class number {i}" for i in range(args.classes)]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"ViT-B/16 random weights, batch {args.batch_size}, C = {args.classes}, {where}, "
          f"{'fp16 autocast' if device.type == 'cuda' else 'fp32'}; median of {args.steps} steps\n")
    results = {}
    print("| method | trainable params | ms / step | activations MiB | peak MiB | rise MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for row_name, name, config, kind in ROWS:
        results[row_name] = row = measure(backbone, name, config, kind, classnames, pixels, labels, args.steps, device)
        print(f"| {row_name} | {row['params']:,} | {row['step_ms']:.1f} | {row['activations_mib']:.1f} | "
              f"{row['peak_mib']:.0f} | {row['rise_mib']:.0f} |", flush=True)
    cached, computed = results[ROWS[4][0]], results[ROWS[5][0]]
    print(f"\nPromptSRC, frozen features computed / cached: time x{computed['step_ms'] / cached['step_ms']:.2f}, "
          f"activations x{computed['activations_mib'] / max(cached['activations_mib'], 1e-9):.2f}, "
          f"peak x{computed['peak_mib'] / max(cached['peak_mib'], 1e-9):.2f}")
    coop = results[ROWS[0][0]]["step_ms"]
    print("Step time relative to CoOp on cached features:\n" + "\n".join(
        f"  {row_name}: x{row['step_ms'] / coop:.2f}" for row_name, row in list(results.items())[1:]))


if __name__ == "__main__":
    main()
