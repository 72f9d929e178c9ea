"""Beyond the paper: base-to-new of CLIP-LoRA, TCP, KDPL (on CoOp, CoCoOp, MaPLe, PromptSRC), MMRL, CoPrompt and
PromptKD with and without
ATLaS.

    atlas-fast experiment beyond_base_to_new --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt
    atlas-fast experiment beyond_base_to_new --world --kinds isl

One block of rows per method, each with its own published recipe (docs/method-zoo.md), 16 shots, seeds 1-3 and the
paper's base-to-new presets (K=2, θ=0.1, τ_c=0.05, α=0.1):

* CLIP-LoRA and TCP train with a cross-entropy: the plain method, then + ATLaS with each soft-label kind of
  ``--kinds`` (default LS, CSL, ISL).
* MMRL trains with two cross-entropies (its class-token and its representation-token logits), both of which take
  ATLaS's targets: the plain method, then + ATLaS with each kind.
* KDPL learns from its teacher without labels, so ATLaS has nothing to act on in it: its block compares the base
  method (trained with KDPL's schedule, as the KDPL authors train their baselines) plain and + ATLaS with each kind
  against KDPL on that base, the same prompts distilled from a larger CLIP's zero-shot predictions. ATLaS-ISL uses
  the student CLIP's own zero-shot predictions (with the labels); KDPL a teacher's (without them).
* PromptKD distils a PromptSRC teacher on a larger CLIP into the student without labels, so ATLaS cannot act on it
  either: its block is the student's labelled counterpart, PromptSRC on the student's CLIP (trained on PromptKD's
  schedule, 20 epochs, batch 8, lr 0.005, which is also the official teacher's), plain and + ATLaS with each kind,
  against PromptKD.

CoPrompt reads LLM-written class descriptions: ``--method-option coprompt:descriptions=FOLDER`` (one
``<dataset>.json`` or the official repository's ``<name>_prompt.json`` per dataset; none are shipped); with
``--world`` they default to the world's own (atlas_fast.world.descriptions: each class's typical colours and shape
attribute), written under the data root. Its block is CoPrompt plain and + ATLaS; ATLaS's targets reach its
cross-entropy only (its consistency terms are unchanged).

The KDPL teacher is ``--method-option teacher=MODEL teacher_pretrained=TAG|FILE|none`` (default: open_clip's
ViT-H-14-quickgelu with DFN-5B weights, the paper's); with ``--world`` it defaults to the world's own CLIP (no larger
world CLIP exists, so there the teacher's predictions are the student's zero-shot ones). PromptKD's teacher adds
``teacher_prompts=RECORD|FILE|none`` (a PromptSRC record trained on the teacher's CLIP, the official checkpoint, or
the prompts' initialisation); with ``--world`` it defaults to the world's CLIP with its prompts at their
initialisation at depth 4 unless ``--method-option promptkd:teacher_prompts=...`` names them. Each row is named by its
method and variant ("KDPL-CoOp", "CoOp + ATLaS-ISL"); the changes of a block are paired by seed against its first
row.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, base_config, method_args, write_table
from atlas_fast.vocabulary import PAPER_SOFT_LABEL_KINDS

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Beyond the paper (CLIP-LoRA, TCP, KDPL, MMRL, CoPrompt, PromptKD)"
METHODS = ("clip-lora", "tcp", "kdpl-coop", "kdpl-cocoop", "kdpl-maple", "kdpl-promptsrc", "mmrl", "coprompt",
           "promptkd")


def add_arguments(p: argparse.ArgumentParser) -> None:
    method_args(p, METHODS)
    p.add_argument("--kinds", nargs="+", choices=PAPER_SOFT_LABEL_KINDS, default=list(PAPER_SOFT_LABEL_KINDS),
                   help="the ATLaS soft-label kinds of each block (default: %(default)s)")


def teacher_options(args: argparse.Namespace, method: str) -> list[str]:
    """With ``--world``, KDPL's and PromptKD's teacher is the world's CLIP unless ``--method-option`` names one
    (PromptKD's with its prompts at their initialisation, at the world's depth 4, unless its prompts are named)."""
    from atlas_fast.app.options import WORLD_BACKBONE, WORLD_TOWER_LAYERS, method_options
    from atlas_fast.methods.registry import method_class

    given = method_options(args.method_option, method) or {}
    if not args.world:
        return []
    options = [] if "teacher" in given else [f"{method}:teacher={WORLD_BACKBONE[0]}",
                                             f"{method}:teacher_pretrained={WORLD_BACKBONE[1]}"]
    fields = {f.name for f in dataclasses.fields(method_class(method).config_class)}
    if "teacher_prompts" in fields and "teacher_prompts" not in given:
        options += [f"{method}:teacher_prompts=none", f"{method}:teacher_depth_text={WORLD_TOWER_LAYERS}",
                    f"{method}:teacher_depth_vision={WORLD_TOWER_LAYERS}"]
    return options


def description_options(args: argparse.Namespace, method: str) -> list[str]:
    """With ``--world``, CoPrompt's class descriptions are the world's (atlas_fast.world.descriptions, written under
    the data root) unless ``--method-option`` names some."""
    from atlas_fast.app.options import method_options

    given = method_options(args.method_option, method) or {}
    if not args.world or "descriptions" in given:
        return []
    from pathlib import Path

    from atlas_fast.world.descriptions import write_descriptions

    folder = write_descriptions(Path(args.data_root) / "coprompt_descriptions", args.datasets)
    return [f"{method}:descriptions={folder.absolute()}"]


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    return [config for method in args.methods for config in method_block(args, method)]


def method_block(args: argparse.Namespace, method: str) -> list[TrainConfig]:
    """The runs of ``method``'s block, in a fixed order."""
    from atlas_fast.app.options import method_options
    from atlas_fast.methods.registry import method_class
    from atlas_fast.sweep import paper_variants, grid_configs

    variants = paper_variants("base2new", args.kinds)
    entry = method_class(method)
    if method == "coprompt":  # its class descriptions: a folder of one file per dataset
        options = method_options(args.method_option + description_options(args, method), method)
        return grid_configs(base_config(args, "base2new", method=method, method_options=options, evaluate=BASE_NEW),
                            args.datasets, variants, args.seeds)
    if entry.uses_labels:
        return grid_configs(base_config(args, "base2new", method=method, evaluate=BASE_NEW), args.datasets, variants,
                            args.seeds)
    options = method_options(args.method_option + teacher_options(args, method), method)
    student = base_config(args, "base2new", method=method, method_options=options, evaluate=BASE_NEW)
    configs = []
    for dataset in args.datasets:  # the base method on the distillation's own schedule, then the distillation
        _, recipe = entry.recipe_function(args.recipe_family, "base2new", 16, dataset)
        base = base_config(args, "base2new", method=entry.base_class.name, evaluate=BASE_NEW)
        base = dataclasses.replace(base, epochs=args.epochs or recipe.epochs, batch_size=recipe.batch_size,
                                   lr=recipe.lr)
        configs += grid_configs(base, [dataset], variants, args.seeds)
        configs += grid_configs(student, [dataset], variants[:1], args.seeds)
    return configs


def row_name(config: dict) -> str:
    """``CLIP-LoRA``, ``CLIP-LoRA + ATLaS-ISL``, ``KDPL-CoOp``: the method's printed name and its variant."""
    from atlas_fast.report.rows import method_name, variant_name

    variant = variant_name(config)
    name = method_name(config["method"])
    return f"{name} {variant}" if variant.startswith("+") else name


def report(args: argparse.Namespace, records: list[dict]) -> str:
    from atlas_fast.methods.registry import method_class
    from atlas_fast.report.rows import aggregate, method_name

    rows, start = [], 0
    for method in args.methods:  # the records come in plan order, block by block
        count = len(method_block(args, method))
        entry = method_class(method)
        block = method_name(method) if entry.uses_labels else (
            f"{method_name(method)} vs {method_name(entry.base_class.name)} + ATLaS")
        for row in aggregate(records[start:start + count], name_of=row_name):
            row.block = block
            rows.append(row)
        start += count
    title = (f"Beyond the paper: base-to-new with ATLaS (mean over {len(args.datasets)} datasets, {len(args.seeds)} "
             f"seeds)")
    return write_table(rows, "beyond_base_to_new", title, args.out)
