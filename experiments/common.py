"""What every experiment module shares: its command-line options, the base run config and writing the outputs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.backbones import BackboneConfig
from atlas_fast.report import TableRow, latex_table, markdown_table, plot_rows
from atlas_fast.train import TrainConfig

# The 11 datasets of the base-to-new, few-shot and cross-dataset (target) tables, in the paper's order.
ELEVEN = ("ImageNet", "Caltech101", "OxfordPets", "StanfordCars", "OxfordFlowers", "Food101", "FGVCAircraft",
          "SUN397", "DescribableTextures", "EuroSAT", "UCF101")


def parser(description: str, datasets: Sequence[str] = ELEVEN) -> argparse.ArgumentParser:
    """Options common to the experiment modules (backbone, data, seeds, recipe overrides, output folder)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data-root", required=True, help="folder holding the datasets in the CoOp layout")
    p.add_argument("--datasets", nargs="+", default=list(datasets), help="default: %(default)s")
    p.add_argument("--model", default="ViT-B-16", help="open_clip model name (default ViT-B-16)")
    p.add_argument("--pretrained", default="openai",
                   help="open_clip tag, checkpoint file (e.g. ~/.cache/clip/ViT-B-16.pt) or 'none'")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--recipe", choices=("paper", "original"), default="paper")
    p.add_argument("--epochs", type=int, default=None, help="override the recipe's epochs (quick looks only)")
    p.add_argument("--views", type=int, default=None, help="cached augmented views (default: one per epoch)")
    p.add_argument("--device", default="auto")
    p.add_argument("--cache-root", default="cache")
    p.add_argument("--results-dir", default="results", help="run records (shared by every experiment)")
    p.add_argument("--out", default="results/experiments", help="where tables and plots are written")
    return p


# The paper's text-side methods (its "DePT" is DePT on CoOp), trained from the feature cache; its multi-modal rows
# run on the pixel path with `--methods ... ivlp maple`.
PAPER_TEXT_METHODS = ("coop", "cocoop", "dept-coop")
# Every method of the paper's Tables I-III: the text-side ones and the multi-modal IVLP and MaPLe (pixel path).
PAPER_METHODS = PAPER_TEXT_METHODS + ("ivlp", "maple")


def method_args(p: argparse.ArgumentParser, default: Sequence[str]) -> None:
    """``--methods`` (one block of rows each) and ``--zero-shot`` (a zero-shot CLIP row first)."""
    from atlas_fast.methods import RECIPES

    p.add_argument("--methods", nargs="+", default=list(default), choices=sorted(set(RECIPES) - {"zsclip"}),
                   help="methods, one block of rows each (default: %(default)s)")
    p.add_argument("--zero-shot", action="store_true", help="add a zero-shot CLIP row (zsclip) first")
    method_option_arg(p)


def method_option_arg(p: argparse.ArgumentParser) -> None:
    """``--method-option [METHOD:]NAME=VALUE`` (read by :func:`method_options`)."""
    p.add_argument("--method-option", nargs="+", action="extend", default=[], metavar="[METHOD:]NAME=VALUE",
                   help="replace a field of a method's recipe config, e.g. maple:depth=3 (all methods without "
                        "METHOD:); for small backbones whose towers are shallower than the recipe's prompt depth")


def method_options(args: argparse.Namespace, method: str) -> dict[str, str] | None:
    """The ``--method-option`` values that apply to ``method`` (``maple:depth=3`` or an unprefixed ``NAME=VALUE``)."""
    options = {}
    for item in getattr(args, "method_option", []):
        target, _, assignment = item.rpartition(":")
        name, sep, value = assignment.partition("=")
        if not sep or not name:
            raise SystemExit(f"--method-option takes [METHOD:]NAME=VALUE, got {item!r}")
        if target in ("", method):
            options[name.replace("-", "_")] = value
    return options or None


def base_config(args: argparse.Namespace, setting: str, shots: int = 16, **changes: Any) -> TrainConfig:
    """The run every row of a table starts from; rows replace the schedule, soft labels, dataset and seed."""
    pretrained = None if args.pretrained.lower() == "none" else args.pretrained
    if "method" in changes and "method_options" not in changes:
        changes["method_options"] = method_options(args, changes["method"])
    return TrainConfig(dataset=args.datasets[0], data_root=args.data_root,
                       backbone=BackboneConfig(args.model, pretrained), recipe=args.recipe, setting=setting,
                       shots=shots, epochs=args.epochs, views=args.views, device=args.device,
                       cache_root=args.cache_root, results_dir=args.results_dir, progress=False, **changes)


def write_table(rows: Sequence[TableRow], name: str, title: str, out: str | Path) -> str:
    """Print the Markdown table and write ``<out>/<name>.{md,tex,png}``; returns the Markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows, title)
    (out / f"{name}.md").write_text(table + "\n")
    (out / f"{name}.tex").write_text(latex_table(rows, caption=title) + "\n")
    plot_rows(rows, out / f"{name}.png", title=title)
    print(table)
    print(f"\nwritten: {out / name}.md, .tex, .png")
    return table
