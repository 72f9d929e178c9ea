"""Probe for issue 19: fine-tune only the world CLIP's text tower on captions whose words before the class name matter.

    python benchmarks/world_text_finetune.py --steps 800 --out /tmp/world_text/atlas-world-text.safetensors

Why: the shipped world CLIP's text tower barely listens to what precedes the class name (random CoOp contexts leave
class text features at cosine 0.9986 to zero-shot's), probably because every pretraining caption begins with "a photo
of a" (``pretrain.CAPTION_PREFIX``). Real CLIP reads its prefix, which is what lets CoOp's context overfit base classes.
This script tests whether a tower that reads its prefix gives CoOp that leverage: starting from the shipped checkpoint
it trains the text side only (token and positional embeddings, text transformer, ln_final, text projection); the image
tower and the logit scale (the shipped 34) stay frozen. Images, batches (groups sharing a texture or a shape, CoOp
training views), the loss and the learning-rate schedule are pretrain.py's; only the captions differ
(:func:`varied_caption`): a varied prefix of 0-4 words, then, in random order, the image's colour word and/or a shape
adjective, then "<texture> <shape>." — so the colour, which the image shows but the class name does not say, lands
at positions 1-6, where CoOp's context sits. A quarter of the captions stay pretrain.py's own (no attribute) so the
zero-shot template keeps its meaning. The result is written outside the repository; measure it with
``benchmarks/world_regime.py --checkpoint PATH``. Exploration only: nothing shipped changes.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.clip.text_encoder import PromptTextEncoder
from atlas_fast.world.benchmark import BENCHMARK_LAYOUT
from atlas_fast.world.generator import COLOURS, CONCEPTS, STYLES, render_batch
from atlas_fast.world.pretrain import (CaptionedBatches, PretrainConfig, _lr_at, _param_groups, caption,
                                       caption_loss, save_checkpoint, train_view)
from atlas_fast.world.zeroshot import pixels_to_tensor, zero_shot_report

# Prefixes of 0-4 words (chosen once, before any CoOp result): only the first is pretraining's.
PREFIXES: tuple[str, ...] = ("a photo of a", "a picture of a", "an image of a", "this is a", "there is a", "a",
                             "the", "")
# One adjective per shape, from generator.SHAPE_ATTRIBUTES (implied by the shape: varies the words, not the content).
SHAPE_ADJECTIVES: dict[str, str] = {"circle": "round", "triangle": "three-cornered", "square": "four-cornered",
                                    "star": "five-pointed", "cross": "four-armed", "heart": "one-pointed",
                                    "diamond": "four-cornered", "moon": "two-pointed"}
KEEP_PRETRAIN_CAPTION = 0.25  # share of captions that stay pretrain.caption(..., say_attribute=False)
COLOUR_PROB = 0.7
ADJECTIVE_PROB = 0.5


def varied_caption(concept: int, colour: int, rng: np.random.Generator) -> str:
    """"<prefix> <descriptors in random order> <texture> <shape>." (or, with probability 1/4, pretraining's caption)."""
    if rng.random() < KEEP_PRETRAIN_CAPTION:
        return caption(concept, colour, bool(rng.random() < 0.5), False)
    texture, shape = CONCEPTS[concept].split(" ")
    words = []
    if rng.random() < COLOUR_PROB:
        words.append(COLOURS[colour][0])
    if rng.random() < ADJECTIVE_PROB:
        words.append(SHAPE_ADJECTIVES[shape])
    words = [words[i] for i in rng.permutation(len(words))]
    prefix = PREFIXES[int(rng.integers(len(PREFIXES)))]
    return " ".join(w for w in (prefix, *words, texture, shape) if w) + "."


class VariedCaptionBatches(CaptionedBatches):
    """pretrain.py's batch stream (same concept groups, colours, styles, rendering and training views) with
    :func:`varied_caption` captions; batch ``step`` is a pure function of ``(seed, step)``."""

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        b, g = self.cfg.batch_size, self.cfg.group_size
        rng = np.random.default_rng([self.cfg.seed, step, 19])  # a stream apart from pretraining's
        concepts = self.concepts(rng)
        colours = np.repeat(rng.integers(0, len(COLOURS), b // g), g)
        styles = [STYLES[s] for s in np.repeat(rng.integers(0, len(STYLES), b // g), g)]
        images = render_batch(concepts, styles, self.cfg.seed + 19, "pretrain", start_index=step * b,
                              colours=[int(c) for c in colours])
        for i in np.flatnonzero(rng.random(b) < self.cfg.crop_prob):
            images[i] = train_view(images[i], rng)
        texts = [varied_caption(int(c), int(k), rng) for c, k in zip(concepts, colours)]
        _, caption_ids = np.unique(np.array(texts), return_inverse=True)
        return images, caption_ids, texts


def report(model, tokenizer, per_class: int, title: str) -> None:
    for name, layout in (("pretraining", None), ("benchmark", BENCHMARK_LAYOUT)):
        kwargs = {} if layout is None else {"layout": layout}
        rep = zero_shot_report(model, tokenizer, per_class=per_class, **kwargs)
        print(f"\n{title}: zero-shot top-1 (%) on fresh images laid out as {name} images:\n{rep.format()}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="atlas-world", help="starting world CLIP (default: the shipped one)")
    p.add_argument("--out", type=Path, default=Path("/tmp/world_text/atlas-world-text.safetensors"))
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-per-class", type=int, default=10)
    p.add_argument("--no-eval", action="store_true", help="skip the zero-shot reports (for timing runs)")
    args = p.parse_args(argv)
    if Path(args.out).resolve().is_relative_to(Path(__file__).resolve().parents[1]):
        p.error("--out must lie outside the repository (this is a probe; the shipped checkpoint stays as it is)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = replace(PretrainConfig(), steps=args.steps, lr=args.lr, warmup_steps=args.warmup_steps, seed=args.seed,
                  threads=args.threads)

    backbone = load_backbone(BackboneConfig("atlas-world", args.checkpoint))
    model, tokenizer = backbone.model, backbone.tokenizer
    shipped_scale = model.logit_scale.exp().item()
    if not args.no_eval:
        report(model, tokenizer, args.eval_per_class, "before")
    text_names = [n for n, _ in model.named_parameters()
                  if not n.startswith("visual.") and n != "logit_scale"]
    for n, prm in model.named_parameters():
        prm.requires_grad_(n in text_names)
    trained = sum(prm.numel() for n, prm in model.named_parameters() if n in text_names)
    print(f"training {len(text_names)} text tensors ({trained} parameters); image tower and logit scale "
          f"({shipped_scale:.2f}) frozen", flush=True)
    groups = [{**g, "params": [q for q in g["params"] if q.requires_grad]}
              for g in _param_groups(model, cfg.weight_decay)]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)
    mean, std = model.visual.image_mean, model.visual.image_std
    loader = torch.utils.data.DataLoader(VariedCaptionBatches(cfg), batch_size=None, num_workers=1, prefetch_factor=4)
    text_tower = PromptTextEncoder(backbone)
    model.train()
    model.visual.eval()
    start = time.time()
    bar = tqdm(zip(range(cfg.steps), loader), total=cfg.steps, desc="text fine-tune", mininterval=10)
    for step, (images, caption_ids, texts) in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, cfg)
        with torch.no_grad():
            img = model.encode_image(pixels_to_tensor(np.asarray(images), mean, std), normalize=True)
        loss = caption_loss(model, tokenizer, text_tower, img, texts, caption_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if step in (0, 100) or (step + 1) % 200 == 0:
            bar.write(f"step {step + 1}: loss {loss.item():.3f}, {(step + 1) / (time.time() - start):.2f} steps/s, "
                      f"e.g. {texts[0]!r}")
    minutes = (time.time() - start) / 60
    model.eval()
    assert math.isclose(model.logit_scale.exp().item(), shipped_scale)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, args.out)
    print(f"fine-tuned the text side for {cfg.steps} steps in {minutes:.1f} min -> {args.out}", flush=True)
    if not args.no_eval:
        with torch.no_grad():  # report what the saved fp16 weights do
            for tensor in model.state_dict().values():
                if tensor.is_floating_point():
                    tensor.copy_(tensor.half().float())
        report(model, tokenizer, args.eval_per_class, "after")


if __name__ == "__main__":
    main()
