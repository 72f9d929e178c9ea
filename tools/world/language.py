"""The world CLIP's second pretraining stage: teach its text tower a language whose words before the noun matter.

    python -m tools.world.language --checkpoint STAGE1.safetensors \
        --out atlas_fast/checkpoints/atlas-world.safetensors

Why (issue 19): after the first stage (:mod:`tools.world.pretrain`, every caption "a photo of a ...") the text
tower ignored what precedes the class name, so CoOp's learned context could only shift every class alike, and prompt
tuning never overfit the base classes as it does on real CLIP. Real language has words whose visual meaning depends
on the noun ("a ripe banana" is yellow, "a ripe tomato" red); a tower that knows them answers a context before the
class name with a different shift for every class, which is what lets a shared context fit each base class on its
own, at the new classes' expense.

This stage trains the text side only (token and positional embeddings, text transformer, ln_final, projection) from
the first stage's checkpoint; the image tower and the logit scale stay frozen, so zero-shot accuracy with the
template is kept. Images, batches (groups sharing a texture or a shape, CoOp training views), the loss and the
learning-rate schedule are the first stage's; the captions differ:

* half carry a *noun adjective* (:data:`NOUN_ADJECTIVES`, "ripe", "royal", ...) that names one colour per shape from a
  fixed random table (:data:`NOUN_ADJECTIVE_COLOURS`), and the image is drawn in that colour;
* the others are :func:`varied_caption`: a varied prefix of 0-4 words, then, in random order, the colour word and/or a
  shape adjective, then the class name (a quarter of them the first stage's own captions), so the tower reads words at
  the positions where CoOp's context sits.

Deterministic given the arguments and ``--threads`` on one machine; resumable like the first stage (``--resume``).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.clip.text_encoder import PromptTextEncoder
from atlas_fast.world.generator import COLOURS, CONCEPTS, SHAPES, TEXTURES
from tools.world.pretrain import (CaptionedBatches, PretrainConfig, _lr_at, _param_groups, caption,
                                       caption_loss, load_state, print_zero_shot_reports, round_to_saved_precision,
                                       save_checkpoint, save_state)
from tools.world.zeroshot import pixels_to_tensor


@dataclass(frozen=True)
class LanguageConfig:
    """Everything that determines the second stage's checkpoint: the first stage's checkpoint and the training."""

    checkpoint: str  # the first stage's checkpoint (a path, or a name load_backbone knows)
    steps: int = 2000
    batch_size: int = 128
    lr: float = 3e-4
    warmup_steps: int = 50
    seed: int = 0
    captions: str = "noun-adjectives"  # or "varied": without noun adjectives (the third step of issue 19)
    threads: int = 2
    checkpoint_every: int = 200  # save the training state (for --resume) this often, in steps (0: never)
    eval_per_class: int = 10

    def __post_init__(self) -> None:
        if self.captions not in CAPTION_SCHEMES:
            raise ValueError(f"captions must be one of {CAPTION_SCHEMES}, got {self.captions!r}")

    def batches(self) -> PretrainConfig:
        """The first stage's batch settings with this stage's schedule and seed."""
        return replace(PretrainConfig(), steps=self.steps, batch_size=self.batch_size, lr=self.lr,
                       warmup_steps=self.warmup_steps, seed=self.seed, threads=self.threads)


CAPTION_SCHEMES: tuple[str, ...] = ("noun-adjectives", "varied")
# Fields that change no trained weight: a run may be resumed with other values of these.
_RESUMABLE_CHANGES = {"threads", "checkpoint_every", "eval_per_class"}

# Prefixes of 0-4 words: only the first is the first stage's (and every world dataset's template).
PREFIXES: tuple[str, ...] = ("a photo of a", "a picture of a", "an image of a", "this is a", "there is a", "a",
                             "the", "")
# One adjective per shape, implied by the shape (generator.SHAPE_ATTRIBUTES): varies the words, not the content.
SHAPE_ADJECTIVES: dict[str, str] = {"circle": "round", "triangle": "three-cornered", "square": "four-cornered",
                                    "star": "five-pointed", "cross": "four-armed", "heart": "one-pointed",
                                    "diamond": "four-cornered", "moon": "two-pointed"}
KEEP_PRETRAIN_CAPTION = 0.25  # share of varied captions that stay pretrain.caption(..., say_attribute=False)
COLOUR_PROB = 0.7
ADJECTIVE_PROB = 0.5
# Adjectives whose colour depends on the noun: row a is the colour index adjective a names for each shape of
# generator.SHAPES (a fixed random table; no relation to the benchmark palettes of generator.SHAPE_PALETTES).
NOUN_ADJECTIVES: tuple[str, ...] = ("ripe", "wild", "royal", "fresh", "rusty", "sunny", "frozen", "lucky")
NOUN_ADJECTIVE_COLOURS = np.random.default_rng(1919).integers(0, len(COLOURS), (len(NOUN_ADJECTIVES), len(SHAPES)))
NOUN_ADJECTIVE_PROB = 0.5


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


def noun_adjective_caption(concept: int, adjective: int, rng: np.random.Generator) -> str:
    """"<prefix> <noun adjective> <texture> <shape>." (the image is drawn in the colour the table gives)."""
    texture, shape = CONCEPTS[concept].split(" ")
    prefix = PREFIXES[int(rng.integers(len(PREFIXES)))]
    return " ".join(w for w in (prefix, NOUN_ADJECTIVES[adjective], texture, shape) if w) + "."


class LanguageBatches(CaptionedBatches):
    """The first stage's batch stream (same concept groups, colours, styles, rendering and training views) with this
    stage's captions; batch ``step`` is a pure function of ``(seed, step)``."""

    stream = (19,)  # streams apart from the first stage's
    render_seed_offset = 19

    def __init__(self, cfg: PretrainConfig, noun_adjectives: bool = True, start_step: int = 0):
        super().__init__(cfg, start_step=start_step)
        self.noun_adjectives = noun_adjectives

    def recolour(self, rng: np.random.Generator, concepts: np.ndarray,
                 colours: np.ndarray) -> tuple[np.ndarray, object]:
        """Half of the images get a noun adjective (-1: none) and are drawn in the colour it names for their shape."""
        adjectives = np.full(len(concepts), -1)
        if not self.noun_adjectives:
            return colours, adjectives
        chosen = np.flatnonzero(rng.random(len(concepts)) < NOUN_ADJECTIVE_PROB)
        adjectives[chosen] = rng.integers(0, len(NOUN_ADJECTIVES), len(chosen))
        colours = colours.copy()
        for i in chosen:
            colours[i] = NOUN_ADJECTIVE_COLOURS[adjectives[i], int(concepts[i]) // len(TEXTURES)]
        return colours, adjectives

    def captions(self, rng: np.random.Generator, concepts: np.ndarray, colours: np.ndarray, extra: object) -> list[str]:
        return [noun_adjective_caption(int(c), int(a), rng) if a >= 0 else varied_caption(int(c), int(k), rng)
                for c, k, a in zip(concepts, colours, extra)]


def train_language(cfg: LanguageConfig, state_dir: Path | None = None,
                   resume: bool = False) -> tuple[torch.nn.Module, object]:
    """Train the text side of the CLIP in ``cfg.checkpoint`` and return it (eval mode) and its tokenizer; see the module
    docstring. With ``state_dir`` the training state is saved there every ``cfg.checkpoint_every`` steps and at the
    end; with ``resume`` training continues from it and ends with the same weights as an uninterrupted run."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    batches = cfg.batches()
    backbone = load_backbone(BackboneConfig("atlas-world", cfg.checkpoint))
    model = backbone.model
    scale = model.logit_scale.exp().item()
    text_names = {n for n, _ in model.named_parameters() if not n.startswith("visual.") and n != "logit_scale"}
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in text_names)
    groups = [{**g, "params": [q for q in g["params"] if q.requires_grad]}
              for g in _param_groups(model, batches.weight_decay)]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)
    start = 0
    if resume:
        if state_dir is None:
            raise ValueError("resume needs the output folder of the run to resume (state_dir)")
        state = load_state(state_dir, cfg, _RESUMABLE_CHANGES)
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["torch_rng"])
            start = state["step"]
            print(f"resuming from step {start} of {cfg.steps} ({state_dir})", flush=True)
    trained = sum(p.numel() for n, p in model.named_parameters() if n in text_names)
    print(f"training {len(text_names)} text tensors ({trained} parameters); image tower and logit scale "
          f"({scale:.2f}) frozen", flush=True)
    mean, std = model.visual.image_mean, model.visual.image_std
    loader = torch.utils.data.DataLoader(
        LanguageBatches(batches, cfg.captions == "noun-adjectives", start_step=start), batch_size=None,
        num_workers=1, prefetch_factor=4)
    text_tower = PromptTextEncoder(backbone)
    model.train()
    model.visual.eval()
    bar = tqdm(zip(range(start, cfg.steps), loader), total=cfg.steps, initial=start, desc="language stage",
               mininterval=10)
    for step, (images, caption_ids, texts) in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, batches)
        with torch.no_grad():
            img = model.encode_image(pixels_to_tensor(np.asarray(images), mean, std), normalize=True)
        loss = caption_loss(model, backbone.tokenizer, text_tower, img, texts, caption_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        done = step + 1
        if state_dir is not None and (done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            save_state(state_dir, done, model, optimizer, cfg)
    model.eval()
    assert math.isclose(model.logit_scale.exp().item(), scale)  # frozen
    return model, backbone.tokenizer


def main(argv: list[str] | None = None) -> None:
    defaults = asdict(LanguageConfig(checkpoint=""))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="the first stage's checkpoint (python -m "
                   "tools.world.pretrain --out ...)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint file (.safetensors)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="folder for the resumable training state (default: <out without suffix>.state/)")
    p.add_argument("--resume", action="store_true", help="continue from the state in --state-dir")
    p.add_argument("--no-eval", action="store_true", help="skip the zero-shot reports")
    for name, value in defaults.items():
        if name != "checkpoint":
            kwargs = {"choices": CAPTION_SCHEMES} if name == "captions" else {}
            p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, **kwargs)
    args = p.parse_args(argv)
    if args.out.suffix != ".safetensors":
        p.error(f"--out must end in .safetensors (got {args.out})")
    if Path(args.checkpoint).resolve() == args.out.resolve():
        p.error("--out must differ from --checkpoint (the first stage's checkpoint is this stage's input)")
    cfg = LanguageConfig(**{k: getattr(args, k) for k in defaults})
    start = time.time()
    state_dir = args.state_dir or args.out.with_suffix(".state")
    model, tokenizer = train_language(cfg, state_dir=state_dir, resume=args.resume)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, args.out)
    print(f"trained the text side for {cfg.steps} steps in {(time.time() - start) / 60:.1f} min -> {args.out}",
          flush=True)
    if not args.no_eval:
        round_to_saved_precision(model)
        print_zero_shot_reports(model, tokenizer, cfg.eval_per_class, "After the language stage: ")


if __name__ == "__main__":
    main()
