"""Pretrain the small CLIP of the generated world, contrastively, on freshly rendered image-caption pairs.

    python -m tools.world.pretrain --out atlas_fast/checkpoints/atlas-world.safetensors

remakes the shipped checkpoint (deterministic given ``--seed`` and ``--threads`` on one machine). The model is
open_clip's own CLIP built from ``atlas_fast/model_configs/atlas-world.json`` and the text goes through open_clip's
real BPE tokenizer. Each step draws a new batch of rendered images captioned "a photo of a [<colour>] <texture>
<shape>[, <attribute>]." (:func:`caption`). This is the first of two stages: :mod:`tools.world.language` then
teaches the text tower words before the class name whose meaning depends on the noun (the shipped checkpoint).
The checkpoint is an open_clip state dict in fp16 (``load_backbone`` casts it back to fp32); token-embedding rows
of words that never occur in a caption are zeroed, which changes no trained behaviour and lets the file compress.
"""

from __future__ import annotations

import argparse
import io
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from tqdm import tqdm

from atlas_fast.files import atomic_write
from atlas_fast.clip.backbones import Backbone, BackboneConfig
from atlas_fast.clip.open_clip_names import MODEL_CONFIG_DIR
from atlas_fast.clip.transforms import Preprocessing
from atlas_fast.clip.text_encoder import PromptTextEncoder, eot_positions
from atlas_fast.world.benchmark import BENCHMARK_LAYOUT
from tools.world.zeroshot import pixels_to_tensor, zero_shot_report
from atlas_fast.world.generator import (COLOURS, CONCEPTS, PRETRAIN_LAYOUT, SHAPE_ATTRIBUTES, SHAPES, STYLES,
                                        TEXTURES, render_batch)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "checkpoints" / "atlas-world.safetensors"


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that determines the checkpoint."""

    model: str = "atlas-world"
    steps: int = 3600
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 200
    colour_word_prob: float = 0.5  # how often a caption also names the (nuisance) colour: an easy first signal
    attribute_prob: float = 0.3  # how often a caption ends with the shape's attribute ("a shape with four corners")
    group_size: int = 4  # a batch is groups of one colour and style that share a texture or a shape
    crop_prob: float = 0.25  # share of images seen as a CoOp training view (random resized crop + flip)
    max_logit_scale: float = 100.0  # CLIP's cap (its learned value); training starts from CLIP's 1 / 0.07
    # The logit scale written to the checkpoint: 34, the scale of lowest expected calibration error of zero-shot
    # predictions on held-out pretraining-style images (``python -m tools.world.calibration``; the learned 27.6
    # is a little under-confident there, CLIP's 100 over-confident). 0 keeps the learned value.
    shipped_logit_scale: float = 34.0
    seed: int = 0
    threads: int = 2  # intra-op threads; more only pays on idle cores (contended OpenMP threads crawl)
    eval_per_class: int = 10
    report_every: int = 600  # print a short zero-shot report this often (0: only at the end)
    checkpoint_every: int = 200  # save the training state (for --resume) this often, in steps (0: never)


CAPTION_PREFIX = "a photo of a"  # every caption's (and every world dataset template's) first words


def caption(concept: int, colour: int, say_colour: bool, say_attribute: bool) -> str:
    """"a photo of a [<colour>] <texture> <shape>[, <attribute>]." (the style is never named)."""
    texture, shape = CONCEPTS[concept].split(" ")
    colour_word = f"{COLOURS[colour][0]} " if say_colour else ""
    attribute = f", {SHAPE_ATTRIBUTES[shape]}" if say_attribute else ""
    return f"{CAPTION_PREFIX} {colour_word}{texture} {shape}{attribute}."


class CaptionedBatches(torch.utils.data.IterableDataset):
    """An endless, deterministic stream of (images uint8 (B,32,32,3), caption ids (B,), captions) batches.

    Batch ``step`` depends only on ``(seed, step)``, so a data-loader worker renders ahead without changing results.
    """

    def __init__(self, cfg: PretrainConfig, start_step: int = 0):
        if not 2 <= cfg.group_size <= len(TEXTURES) or cfg.batch_size % cfg.group_size:
            raise ValueError(f"group_size={cfg.group_size} must be in [2, {len(TEXTURES)}] and divide "
                             f"batch_size={cfg.batch_size}")
        self.cfg = cfg
        self.start_step = start_step

    def concepts(self, rng: np.random.Generator) -> np.ndarray:
        """Groups of ``group_size`` concepts: every other group shares a texture (its shapes differ), the rest share a
        shape (their textures differ), so in-batch negatives differ in exactly the attribute to be learned."""
        g, out = self.cfg.group_size, []
        for i in range(self.cfg.batch_size // g):
            if i % 2 == 0:
                shapes, textures = rng.permutation(len(SHAPES))[:g], np.repeat(rng.integers(len(TEXTURES)), g)
            else:
                shapes, textures = np.repeat(rng.integers(len(SHAPES)), g), rng.permutation(len(TEXTURES))[:g]
            out.append(shapes * len(TEXTURES) + textures)
        return np.concatenate(out)

    # A subclass with other captions (tools.world.language) draws from its own streams and overrides
    # ``recolour`` and ``captions``; the concept groups, styles, rendering and training views stay these.
    stream: tuple[int, ...] = ()  # appended to (seed, step) to key the batch's random stream
    render_seed_offset: int = 0  # added to the seed of the rendered images' own streams

    def recolour(self, rng: np.random.Generator, concepts: np.ndarray,
                 colours: np.ndarray) -> tuple[np.ndarray, object]:
        """The colours to draw the images in, and what the captions need to know of them (here: nothing)."""
        return colours, None

    def captions(self, rng: np.random.Generator, concepts: np.ndarray, colours: np.ndarray, extra: object) -> list[str]:
        """One caption per image (:func:`caption`)."""
        b = len(concepts)
        say_colour = rng.random(b) < self.cfg.colour_word_prob
        say_attribute = rng.random(b) < self.cfg.attribute_prob
        return [caption(int(c), int(k), bool(sc), bool(sa))
                for c, k, sc, sa in zip(concepts, colours, say_colour, say_attribute)]

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        b, g = self.cfg.batch_size, self.cfg.group_size
        rng = np.random.default_rng([self.cfg.seed, step, *self.stream])
        concepts = self.concepts(rng)
        colours = np.repeat(rng.integers(0, len(COLOURS), b // g), g)
        styles = [STYLES[s] for s in np.repeat(rng.integers(0, len(STYLES), b // g), g)]
        colours, extra = self.recolour(rng, concepts, colours)
        images = render_batch(concepts, styles, self.cfg.seed + self.render_seed_offset, "pretrain",
                              start_index=step * b, colours=[int(c) for c in colours])
        for i in np.flatnonzero(rng.random(b) < self.cfg.crop_prob):
            images[i] = train_view(images[i], rng)
        texts = self.captions(rng, concepts, colours, extra)
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

    Prompt tuning trains on such views (``atlas_fast.clip.transforms``); a CLIP that never saw one gives features off its
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
    return [caption(c, k, True, True) for c in range(len(CONCEPTS)) for k in range(len(COLOURS))]


def contrastive_loss(img: torch.Tensor, txt: torch.Tensor, scale: torch.Tensor, caption_ids: torch.Tensor) -> torch.Tensor:
    """Symmetric CLIP loss whose targets spread evenly over identical captions (duplicates are not negatives)."""
    logits = scale * img @ txt.T
    same = (caption_ids[:, None] == caption_ids[None, :]).float()
    targets = same / same.sum(1, keepdim=True)
    return 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets))


def caption_loss(model, tokenizer, text_tower, image_features: torch.Tensor, texts: Sequence[str],
                 caption_ids) -> torch.Tensor:
    """The contrastive loss of a batch's normalised image features against its captions; each distinct caption is
    encoded once (``caption_ids`` index the sorted distinct captions, as np.unique gives them)."""
    ids = tokenizer(sorted(set(texts)))
    text = F.normalize(text_tower(model.token_embedding(ids), eot_positions(model, ids)), dim=-1)
    targets = torch.as_tensor(caption_ids)
    return contrastive_loss(image_features, text[targets], model.logit_scale.exp(), targets)


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


STATE_FILE = "state.pt"  # the training state in a pretraining output folder (see :func:`pretrain`)
# Fields that change no trained weight: a run may be resumed with other values of these.
_RESUMABLE_CHANGES = {"threads", "report_every", "checkpoint_every", "shipped_logit_scale", "eval_per_class"}


def save_state(state_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, cfg) -> None:
    """Atomically write everything that step ``step`` onwards depends on: the weights, AdamW's moments, the step
    count and torch's RNG. The data stream needs no state of its own: batch ``step`` is a pure function of
    ``(seed, step)`` (:class:`CaptionedBatches`), so the loader restarts at ``step``."""
    state = {"step": step, "config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "torch_rng": torch.get_rng_state()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(Path(state_dir) / STATE_FILE, lambda f: f.write(buffer.getvalue()))


def load_state(state_dir: Path, cfg, resumable_changes: set[str] = _RESUMABLE_CHANGES) -> dict | None:
    """The saved state of ``state_dir`` (None if there is none), checked to belong to the same run as ``cfg`` (a
    config dataclass; fields in ``resumable_changes`` may differ)."""
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved, now = state["config"], asdict(cfg)
    differ = {k for k in now if k not in resumable_changes and saved.get(k) != now[k]}
    if differ:
        what = ", ".join(f"{k}: {saved.get(k)!r} there, {now[k]!r} here" for k in sorted(differ))
        raise ValueError(f"{path} was saved by another pretraining run ({what}); resume with its arguments or choose "
                         f"another output folder.")
    return state


def pretrain(cfg: PretrainConfig, state_dir: Path | None = None, resume: bool = False) -> tuple[nn.Module, object]:
    """Train from scratch and return the model (fp32, eval mode) and its tokenizer.

    With ``state_dir`` the training state is saved there every ``cfg.checkpoint_every`` steps and at the end
    (atomically: a crash mid-write leaves the previous state); with ``resume`` training continues from the state
    found there (from scratch if there is none), and ends with the same weights as an uninterrupted run."""
    torch.set_num_threads(cfg.threads)
    open_clip.add_model_config(MODEL_CONFIG_DIR)
    torch.manual_seed(cfg.seed)
    model = open_clip.create_model(cfg.model, pretrained=None)
    tokenizer = open_clip.get_tokenizer(cfg.model)
    mean, std = model.visual.image_mean, model.visual.image_std
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)
    start = 0
    if resume:
        if state_dir is None:
            raise ValueError("resume needs the output folder of the run to resume (state_dir)")
        state = load_state(state_dir, cfg)
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["torch_rng"])
            start = state["step"]
            print(f"resuming from step {start} of {cfg.steps} ({Path(state_dir) / STATE_FILE})")
    loader = torch.utils.data.DataLoader(CaptionedBatches(cfg, start_step=start), batch_size=None, num_workers=1,
                                         prefetch_factor=4)
    # Captions are ~12 tokens of the 32-token context: under the causal mask the text tower needs only the positions
    # up to the last EOT, which PromptTextEncoder runs (the same features and gradients, at about half the cost).
    text_tower = PromptTextEncoder(Backbone(model, tokenizer, Preprocessing(model.visual.image_size[0]),
                                            BackboneConfig(cfg.model, None, cfg.seed), architecture={}))
    model.train()
    bar = tqdm(zip(range(start, cfg.steps), loader), total=cfg.steps, initial=start, desc="pretrain atlas-world")
    for step, (images, caption_ids, texts) in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, cfg)
        img = model.encode_image(pixels_to_tensor(np.asarray(images), mean, std), normalize=True)
        loss = caption_loss(model, tokenizer, text_tower, img, texts, caption_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(cfg.max_logit_scale))
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", scale=f"{model.logit_scale.exp().item():.1f}")
        if cfg.report_every and (step + 1) % cfg.report_every == 0 and step + 1 < cfg.steps:
            report = zero_shot_report(model, tokenizer, per_class=4)
            bar.write(f"step {step + 1}: zero-shot on fresh images (mean over styles) main {report.mean('main'):.1f} "
                      f"shape {report.mean('shape'):.1f} texture {report.mean('texture'):.1f}")
        done = step + 1
        if state_dir is not None and (done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            save_state(state_dir, done, model, optimizer, cfg)
    model.eval()
    _zero_unused_token_rows(model, tokenizer)
    print(f"learned logit scale: {model.logit_scale.exp().item():.2f}")
    if cfg.shipped_logit_scale:
        pin_logit_scale(model, cfg.shipped_logit_scale)
    return model, tokenizer


@torch.no_grad()
def pin_logit_scale(model: nn.Module, value: float) -> None:
    """Set the (exp) logit scale: the temperature of every softmax over image-text similarities; argmax unchanged."""
    model.logit_scale.fill_(math.log(value))


@torch.no_grad()
def _zero_unused_token_rows(model: nn.Module, tokenizer) -> None:
    used = torch.unique(tokenizer(all_caption_words()))
    keep = torch.zeros(model.token_embedding.weight.shape[0], dtype=torch.bool)
    keep[used] = True
    model.token_embedding.weight[~keep] = 0.0


def rewrite_logit_scale(path: Path, value: float) -> None:
    """Rewrite a saved checkpoint with only its logit scale set to ``value`` (every other tensor byte-identical), as
    ``--shipped-logit-scale value`` would have saved it; atomically."""
    from safetensors.torch import load_file, save

    state = load_file(str(path))
    scale = state["logit_scale"]
    state["logit_scale"] = torch.full_like(scale, math.log(value))  # stored as log(scale), in the file's dtype
    data = save(state)
    atomic_write(Path(path), lambda f: f.write(data))


def save_checkpoint(model: nn.Module, path: Path) -> None:
    """An open_clip state dict in fp16, as safetensors (open_clip's ``load_checkpoint`` reads it directly)."""
    from safetensors.torch import save

    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    data = save(state)
    atomic_write(Path(path), lambda f: f.write(data))  # a crash never leaves half a checkpoint


@torch.no_grad()
def round_to_saved_precision(model: nn.Module) -> None:
    """Round the weights as :func:`save_checkpoint` stores them (fp16), so a report shows what load_backbone will."""
    for tensor in model.state_dict().values():
        if tensor.is_floating_point():
            tensor.copy_(tensor.half().float())


def print_zero_shot_reports(model: nn.Module, tokenizer, per_class: int, title: str = "") -> None:
    """Zero-shot top-1 on fresh images laid out as pretraining images and as benchmark images."""
    for name, layout in (("pretraining", PRETRAIN_LAYOUT), ("benchmark", BENCHMARK_LAYOUT)):
        report = zero_shot_report(model, tokenizer, per_class=per_class, layout=layout)
        print(f"\n{title}Zero-shot top-1 (%) on fresh images laid out as {name} images:\n{report.format()}", flush=True)


def main(argv: list[str] | None = None) -> None:
    defaults = PretrainConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint file (.safetensors)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="folder for the resumable training state (default: <out without suffix>.state/)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the state in --state-dir (from scratch if there is none)")
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    if args.out.suffix != ".safetensors":
        parser.error(f"--out must end in .safetensors (got {args.out}); a .pt would be read as an OpenAI checkpoint")
    cfg = PretrainConfig(**{k: getattr(args, k) for k in asdict(defaults)})
    start = time.time()
    state_dir = args.state_dir or args.out.with_suffix(".state")
    model, tokenizer = pretrain(cfg, state_dir=state_dir, resume=args.resume)
    minutes = (time.time() - start) / 60
    save_checkpoint(model, args.out)
    print(f"pretrained {cfg} in {minutes:.1f} min -> {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    round_to_saved_precision(model)
    print_zero_shot_reports(model, tokenizer, cfg.eval_per_class)


if __name__ == "__main__":
    main()
