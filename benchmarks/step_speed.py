"""Speed of the shared-prefix text pass and the fused attention blocks, against open_clip's plain blocks, in one run.

Everything runs on a CLIP with open_clip's ViT-B-16 architecture and random weights (``BackboneConfig("ViT-B-16",
None)``: nothing is downloaded; speed does not depend on the weights), one torch thread on the CPU by default.

1. **Text step** (forward + backward of the class text features, CoOp with M = 4 from "a photo of a", one run) at
   C = 19 (OxfordPets' base classes), 100 and 500 (synthetic names with ImageNet / SUN397-like lengths: one to five
   words, some rare words of several BPE tokens), three ways: *plain* (open_clip's blocks over every assembled
   prompt, padded to the longest), *shared prefix* (the shared positions once, every class padded to the longest
   suffix) and *shared prefix + length groups* (the default).
2. **Tower blocks**: the text tower over assembled prompts (C = 19) and the prompted vision tower (batch 4, MaPLe's
   2 visual prompts at depth 9), forward + backward, open_clip's blocks vs the fused blocks.
3. **MaPLe training step** (M = 2, J = 9, batch 4 pixels, C = 19; loss, backward, SGD step): *before* = open_clip's
   blocks everywhere and no shared prefix, *after* = the defaults.

Timing: the variants of a row alternate, every variant runs once untimed first, and a row reports the fastest of
``--repeats`` timed runs (neighbouring processes on a shared machine only ever slow a run down). By default (quick)
C = 19 gets 3 repeats, C = 100 and the tower / MaPLe rows 2, C = 500 one (without the untimed run: each of its runs
takes seconds); on 2 busy CPU cores that is about 2.5 minutes. On a GPU (``--device cuda``) everything runs under
fp16 autocast, as training does.

Usage::

    python benchmarks/step_speed.py                       # CPU, 1 thread, quick
    python benchmarks/step_speed.py --repeats 5           # more repeats everywhere
    python benchmarks/step_speed.py --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.methods.registry import build_method  # noqa: E402
from atlas_fast.methods.coop import CoOpConfig  # noqa: E402
from atlas_fast.methods.maple import MaPLeConfig  # noqa: E402

#: OxfordPets' 19 base classes (the first half of its 37, in row_name order)
PETS_BASE = ["abyssinian", "american_bulldog", "american_pit_bull_terrier", "basset_hound", "beagle", "bengal",
             "birman", "bombay", "boxer", "british_shorthair", "chihuahua", "egyptian_mau", "english_cocker_spaniel",
             "english_setter", "german_shorthaired", "great_pyrenees", "havanese", "japanese_chin", "keeshond"]
MODIFIERS = ["indoor", "outdoor", "great", "little", "american", "english", "african", "european", "golden", "black",
             "white", "red", "spotted", "striped", "common", "giant", "miniature", "wild", "old", "public",
             "natural", "broad-leaved", "three-toed", "long-horned", "wire-haired"]
NOUNS = ["dog", "cat", "car", "house", "tree", "bird", "fish", "boat", "bridge", "tower", "road", "shop", "room",
         "field", "lake", "beach", "church", "kitchen", "garden", "street", "market", "office", "school", "station",
         "forest", "mountain", "river", "desert", "castle", "temple", "terrier", "spaniel", "beetle", "lizard",
         "snake", "turtle", "monkey", "building", "interior", "store", "hall", "court", "restaurant", "bakery"]
RARE = ["chesapeake", "schipperke", "rhodesian", "ridgeback", "weimaraner", "staffordshire", "bedlington",
        "sealyham", "vizsla", "axolotl", "tarantula", "hummingbird", "chickadee", "ptarmigan", "wallaby", "echidna",
        "platypus", "dugong", "amphitheater", "planetarium", "archipelago", "quonset", "kasbah", "pagoda"]


def synthetic_classnames(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct ImageNet / SUN397-like names: 1-5 words (30/35/20/10/5 %), a rare word in about a third of
    them (several BPE tokens each)."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < count:
        words = rng.choices([1, 2, 3, 4, 5], weights=[30, 35, 20, 10, 5])[0]
        name = [rng.choice(MODIFIERS) for _ in range(words - 1)]
        name.append(rng.choice(RARE if rng.random() < 0.35 else NOUNS))
        name = " ".join(name)
        if name not in names:
            names.append(name)
    return names


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, step: Callable[[], None]) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start


def fastest(variants: dict[str, Callable[[], None]], repeats: int, timer: Timer) -> dict[str, float]:
    """Best time of every variant: one untimed run each (unless a single repeat is asked for: those runs take
    seconds, next to which warming up is noise), then ``repeats`` rounds alternating the variants."""
    if repeats > 1:
        for step in variants.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, step in variants.items():
            times[name].append(timer(step))
    return {name: min(values) for name, values in times.items()}


def set_paths(method, fused: bool, shared: bool, groups: bool = True) -> None:
    base = getattr(method, "base", method)
    base.text_encoder.fused_attention = fused
    base.text_encoder.shared_prefix = shared
    base.text_encoder.length_groups = groups
    if hasattr(base, "image_encoder"):
        base.image_encoder.fused_attention = fused


def text_rows(backbone, classes: int, repeats: int, timer: Timer, autocast) -> list[tuple]:
    names = PETS_BASE if classes == len(PETS_BASE) else synthetic_classnames(classes)
    method = build_method("coop", backbone, names, CoOpConfig(ctx_init="a photo of a")).to(backbone.device)
    suffix = (method.eot_index - method.n_ctx).float()  # class tokens + "." + EOT
    weights = torch.randn(1, len(names), backbone.embed_dim, device=backbone.device)

    def step(fused, shared, groups=True):
        def run():
            set_paths(method, fused, shared, groups)
            method.zero_grad(set_to_none=True)
            with autocast():
                features = method.raw_text_features()
            (features.float() * weights).sum().backward()
        return run

    times = fastest({"plain": step(False, False), "shared prefix": step(True, True, False),
                     "shared prefix + length groups": step(True, True)}, repeats, timer)
    row_name = (f"text fwd+bwd, C={len(names)} ({'OxfordPets base' if names is PETS_BASE else 'synthetic'}; suffix "
             f"{suffix.mean():.1f} mean / {int(suffix.max())} max tokens)")
    return [(row_name, "plain", times["plain"], None)] + [
        (row_name, name, seconds, times["plain"] / seconds) for name, seconds in times.items() if name != "plain"]


def tower_rows(backbone, repeats: int, timer: Timer, autocast) -> list[tuple]:
    device = backbone.device
    depth = min(9, len(backbone.model.transformer.resblocks), len(backbone.model.visual.transformer.resblocks))
    method = build_method("maple", backbone, PETS_BASE, MaPLeConfig(n_ctx=2, depth=depth)).to(device)
    size = backbone.preprocessing.image_size
    pixels = torch.randn(4, 3, size, size, device=device)
    prompts = method.class_prompts.assemble(method.ctx.detach()).requires_grad_(True)
    deep = [p.detach() for p in method.text_prompts()[1]]

    def text(fused):
        def run():
            method.text_encoder.fused_attention = fused
            with autocast():
                features = method.text_encoder(prompts, method.eot_index, deep)
            features.float().sum().backward()
        return run

    def vision(fused):
        def run():
            method.image_encoder.fused_attention = fused
            method.zero_grad(set_to_none=True)
            with autocast():
                features = method.image_batch(pixels)
            features.float().sum().backward()
        return run

    rows = []
    for row_name, make in ((f"text tower blocks, C={len(PETS_BASE)} assembled prompts", text),
                        (f"vision tower blocks, batch 4, {method.config.n_ctx} prompts, depth {depth}", vision)):
        times = fastest({"open_clip blocks": make(False), "fused attention": make(True)}, repeats, timer)
        rows += [(row_name, "open_clip blocks", times["open_clip blocks"], None),
                 (row_name, "fused attention", times["fused attention"],
                  times["open_clip blocks"] / times["fused attention"])]
    return rows


def maple_rows(backbone, repeats: int, timer: Timer, autocast) -> list[tuple]:
    device = backbone.device
    depth = min(9, len(backbone.model.transformer.resblocks), len(backbone.model.visual.transformer.resblocks))
    method = build_method("maple", backbone, PETS_BASE, MaPLeConfig(n_ctx=2, depth=depth)).to(device)
    optimizer = torch.optim.SGD(method.parameters(), lr=1e-6, momentum=0.9)
    size = backbone.preprocessing.image_size
    pixels = torch.randn(4, 3, size, size, device=device)
    labels = torch.tensor([0, 5, 11, 18], device=device)

    def step(fast):
        def run():
            set_paths(method, fused=fast, shared=fast)
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                logits = method(pixels)
            F.cross_entropy(logits[0].float(), labels).backward()
            optimizer.step()
        return run

    times = fastest({"before": step(False), "after": step(True)}, repeats, timer)
    row_name = f"MaPLe training step (M=2, J={depth}, batch 4, C={len(PETS_BASE)})"
    return [(row_name, "before: open_clip blocks", times["before"], None),
            (row_name, "after: fused + shared prefix", times["after"], times["before"] / times["after"])]


def main(argv: list[str] | None = None) -> int:
    rows = measure(argv)
    return 2 if rows is None else 0


def measure(argv: list[str] | None = None) -> list[tuple[str, str, float, float | None]] | None:
    """Run the benchmark, print its progress and table, and return the rows (workload, variant, seconds, speed-up
    over the workload's first variant or None for that one); None when the device is missing."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ViT-B-16", help="open_clip architecture, random weights (default ViT-B-16)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--classes", type=int, nargs="+", default=[19, 100, 500],
                   help="class counts of the text rows (19 = OxfordPets' base classes; default 19 100 500)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repeats of every row (default: 3 at C <= 19, 2 up to C = 100 and for the towers and MaPLe, 1 above)")
    p.add_argument("--skip", nargs="*", default=[], choices=["text", "towers", "maple"], help="sections to skip")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("No CUDA device visible to torch.")
        return None
    timer = Timer(device)
    if device.type == "cuda":
        def autocast():
            return torch.autocast("cuda", dtype=torch.float16)
    else:
        autocast = contextlib.nullcontext
    backbone = load_backbone(BackboneConfig(args.model, None), device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    print(f"step_speed: {args.model} (random weights) on {where}, torch {torch.__version__}", flush=True)

    def repeats_for(classes: int) -> int:
        if args.repeats is not None:
            return args.repeats
        return 3 if classes <= 19 else 2 if classes <= 100 else 1

    start = time.perf_counter()
    rows: list[tuple] = []
    sections = []
    if "text" not in args.skip:
        sections += [lambda c=c: text_rows(backbone, c, repeats_for(c), timer, autocast) for c in args.classes]
    if "towers" not in args.skip:
        sections.append(lambda: tower_rows(backbone, repeats_for(100), timer, autocast))
    if "maple" not in args.skip:
        sections.append(lambda: maple_rows(backbone, repeats_for(100), timer, autocast))
    for section in sections:
        for row in section():
            rows.append(row)
            ratio = f"{row[3]:.2f}x" if row[3] is not None else "1.00x"
            print(f"  {row[0]} | {row[1]}: {row[2]:.3f} s ({ratio})", flush=True)

    print(f"\n## step_speed: {args.model}, {where} ({time.perf_counter() - start:.0f} s; best of the repeats)\n")
    print("| workload | variant | seconds | speed-up vs first variant |")
    print("|---|---|---|---|")
    for row_name, variant, seconds, ratio in rows:
        print(f"| {row_name} | {variant} | {seconds:.3f} | {'-' if ratio is None else f'{ratio:.2f}x'} |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
