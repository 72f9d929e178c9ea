"""Pretrain the small CLIP of the generated world, contrastively, on freshly rendered image-caption pairs.

    python -m atlas_fast.world.pretrain --out atlas_fast/checkpoints/atlas-world.safetensors

remakes the shipped checkpoint (deterministic given ``--seed`` and ``--threads`` on one machine). The model is
open_clip's own CLIP built from ``atlas_fast/model_configs/atlas-world.json`` and the text goes through open_clip's
real BPE tokenizer. Each step draws a new batch: a class, a style and a size per image, captioned
"<style prefix> [<size>] <colour> <shape>." so the prefix words describe what the image looks like.
The checkpoint is an open_clip state dict in fp16 (``load_backbone`` casts it back to fp32); token-embedding rows
of words that never occur in a caption are zeroed, which changes no trained behaviour and lets the file compress.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from tqdm import tqdm

from atlas_fast.backbones import MODEL_CONFIG_DIR, Backbone, BackboneConfig, Preprocessing
from atlas_fast.text_encoder import PromptTextEncoder, eot_positions
from atlas_fast.world.evaluate import NEUTRAL_PREFIX, pixels_to_tensor, zero_shot_report
from atlas_fast.world.generator import CLASSNAMES, COLOURS, SHAPES, SIZES, STYLES, render_batch

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "checkpoints" / "atlas-world.safetensors"


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that determines the checkpoint."""

    model: str = "atlas-world"
    steps: int = 3000
    batch_size: int = 128
    lr: float = 1.5e-3
    weight_decay: float = 0.1
    warmup_steps: int = 100
    size_word_prob: float = 0.5  # how often a caption also says "small"/"large" (never "medium")
    shapes_per_group: int = 4  # a batch is groups of one colour and style in this many different shapes
    crop_prob: float = 0.5  # share of images seen as a CoOp training view (random resized crop + flip)
    seed: int = 0
    threads: int = 1  # intra-op threads; more only pays on idle cores (contended OpenMP threads crawl)
    eval_per_class: int = 10


def caption(label: int, style_index: int, size: str, say_size: bool) -> str:
    size_word = f"{size} " if say_size and size != "medium" else ""
    return f"{STYLES[style_index].prefix} {size_word}{CLASSNAMES[label]}."


class CaptionedBatches(torch.utils.data.IterableDataset):
    """An endless, deterministic stream of (images uint8 (B,32,32,3), caption ids (B,), captions) batches.

    Batch ``step`` depends only on ``(seed, step)``, so a data-loader worker renders ahead without changing results.
    """

    def __init__(self, cfg: PretrainConfig, start_step: int = 0):
        if not 1 <= cfg.shapes_per_group <= len(SHAPES) or cfg.batch_size % cfg.shapes_per_group:
            raise ValueError(f"shapes_per_group={cfg.shapes_per_group} must be in [1, {len(SHAPES)}] and divide "
                             f"batch_size={cfg.batch_size}")
        self.cfg = cfg
        self.start_step = start_step

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        b = self.cfg.batch_size
        rng = np.random.default_rng([self.cfg.seed, step])
        # Same colour and style, different shapes: every image meets in-batch negatives that differ only in shape,
        # the attribute a ViT learns last (with independent draws it learned colour and style, not shape).
        g = self.cfg.shapes_per_group
        colours = np.repeat(rng.integers(0, len(COLOURS), b // g), g)
        styles = np.repeat(rng.integers(0, len(STYLES), b // g), g)
        shapes = np.concatenate([rng.permutation(len(SHAPES))[:g] for _ in range(b // g)])
        labels = shapes * len(COLOURS) + colours
        sizes = [("small", "medium", "large")[i] for i in rng.integers(0, 3, b)]
        say_size = rng.random(b) < self.cfg.size_word_prob
        images = render_batch(labels, [STYLES[s].name for s in styles], sizes, self.cfg.seed, "pretrain",
                              start_index=step * b)
        for i in np.flatnonzero(rng.random(b) < self.cfg.crop_prob):
            images[i] = train_view(images[i], rng)
        texts = [caption(int(lab), int(s), size, bool(say)) for lab, s, size, say in zip(labels, styles, sizes, say_size)]
        _, caption_ids = np.unique(np.array(texts), return_inverse=True)
        return images, caption_ids, texts

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, list[str]]]:
        step = self.start_step
        while True:
            yield self.batch(step)
            step += 1


def train_view(image: np.ndarray, rng: np.random.Generator, scale: tuple[float, float] = (0.08, 1.0),
               ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> np.ndarray:
    """Dassl's training augmentation (random resized crop, bicubic, horizontal flip p=0.5) drawn from ``rng``.

    Prompt tuning trains on such views (``atlas_fast.transforms``); a CLIP that never saw one gives features off its
    own distribution there, and every prompt method then learns from noise."""
    size = image.shape[0]
    area = size * size
    top, left, h, w = 0, 0, size, size  # torchvision's fallback: the whole image
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= size and 0 < ch <= size:
            top, left, h, w = int(rng.integers(0, size - ch + 1)), int(rng.integers(0, size - cw + 1)), ch, cw
            break
    view = Image.fromarray(image).crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BICUBIC)
    if rng.random() < 0.5:
        view = view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(view)


def all_caption_words() -> list[str]:
    """Every caption the stream can produce (their tokens are the embedding rows pretraining touches)."""
    texts = [f"{s.prefix} {size}{colour} {shape}." for s in STYLES for size in ("", "small ", "large ")
             for colour, _ in COLOURS for shape in SHAPES]
    return texts + [f"{NEUTRAL_PREFIX} {c}." for c in CLASSNAMES]


def contrastive_loss(img: torch.Tensor, txt: torch.Tensor, scale: torch.Tensor, caption_ids: torch.Tensor) -> torch.Tensor:
    """Symmetric CLIP loss whose targets spread evenly over identical captions (duplicates are not negatives)."""
    logits = scale * img @ txt.T
    same = (caption_ids[:, None] == caption_ids[None, :]).float()
    targets = same / same.sum(1, keepdim=True)
    return 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets))


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on gains, biases, embeddings and the logit scale (as open_clip's training does)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "embedding" in name or "logit_scale" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))


def pretrain(cfg: PretrainConfig) -> tuple[nn.Module, object]:
    """Train from scratch and return the model (fp32, eval mode) and its tokenizer."""
    torch.set_num_threads(cfg.threads)
    open_clip.add_model_config(MODEL_CONFIG_DIR)
    torch.manual_seed(cfg.seed)
    model = open_clip.create_model(cfg.model, pretrained=None)
    tokenizer = open_clip.get_tokenizer(cfg.model)
    mean, std = model.visual.image_mean, model.visual.image_std
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)
    loader = torch.utils.data.DataLoader(CaptionedBatches(cfg), batch_size=None, num_workers=1, prefetch_factor=4)
    # Captions are ~12 tokens of the 32-token context: under the causal mask the text tower needs only the positions
    # up to the last EOT, which PromptTextEncoder runs (the same features and gradients, at about half the cost).
    text_tower = PromptTextEncoder(Backbone(model, tokenizer, Preprocessing(model.visual.image_size[0]),
                                            BackboneConfig(cfg.model, None, cfg.seed), architecture={}))
    model.train()
    bar = tqdm(zip(range(cfg.steps), loader), total=cfg.steps, desc="pretrain atlas-world")
    for step, (images, caption_ids, texts) in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, cfg)
        img = model.encode_image(pixels_to_tensor(np.asarray(images), mean, std), normalize=True)
        ids = tokenizer(list(texts))
        txt = F.normalize(text_tower(model.token_embedding(ids), eot_positions(model, ids)), dim=-1)
        loss = contrastive_loss(img, txt, model.logit_scale.exp(), torch.as_tensor(caption_ids))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", scale=f"{model.logit_scale.exp().item():.1f}")
    model.eval()
    _zero_unused_token_rows(model, tokenizer)
    return model, tokenizer


@torch.no_grad()
def _zero_unused_token_rows(model: nn.Module, tokenizer) -> None:
    used = torch.unique(tokenizer(all_caption_words()))
    keep = torch.zeros(model.token_embedding.weight.shape[0], dtype=torch.bool)
    keep[used] = True
    model.token_embedding.weight[~keep] = 0.0


def save_checkpoint(model: nn.Module, path: Path) -> None:
    """An open_clip state dict in fp16, as safetensors (open_clip's ``load_checkpoint`` reads it directly)."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path))


def main(argv: list[str] | None = None) -> None:
    defaults = PretrainConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint file (.safetensors)")
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    if args.out.suffix != ".safetensors":
        parser.error(f"--out must end in .safetensors (got {args.out}); a .pt would be read as an OpenAI checkpoint")
    cfg = PretrainConfig(**{k: getattr(args, k) for k in asdict(defaults)})
    start = time.time()
    model, tokenizer = pretrain(cfg)
    minutes = (time.time() - start) / 60
    save_checkpoint(model, args.out)
    # Report what the saved (fp16-rounded) weights do, as load_backbone will see them.
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.half().float())
    report = zero_shot_report(model, tokenizer, per_class=cfg.eval_per_class)
    print(f"pretrained {cfg} in {minutes:.1f} min -> {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    print(report.format())


if __name__ == "__main__":
    main()
