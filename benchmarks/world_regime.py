"""Is a candidate world benchmark in real CLIP's prompt-tuning regime? (issue 19) CoOp and zero-shot only.

    python benchmarks/world_regime.py                       # the shipped benchmark (WorldPhotos' design)
    python benchmarks/world_regime.py --style dark --layout 7 11 5 20 3 1.5 --split-order texture --colours any

Generates the main 24 classes (12 with ``--split-order both``) in ``--style`` with the candidate layout (radius
lo/hi, shift, tilt, clutter, noise x), label order (``--split-order``: which classes form the base half, see
``atlas_fast.world.benchmark.split_order``) and colours (``--colours``) under ``--work``, then measures on it, with
``--checkpoint`` (default: the shipped world CLIP):

* the teacher on the base training images: ISL argmax = label (%), CSL off-target mass (%, tau_c = 0.05);
* CoOp base-to-new at the paper's recipe (200 epochs, a fresh view per epoch, 4 tokens from "a photo of a"),
  seeds as given, new-class accuracy after every epoch: zero-shot base/new, CoOp base/new per seed, the largest
  single-epoch change of new-class accuracy per seed;
* how far the learned contexts move the class text features from zero-shot's (cosine), against random contexts.

No ATLaS run is made here: the layout is chosen on these numbers alone. One JSON line per candidate is appended to
``--out``. Caches and results go under ``--work`` (outside the repository).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed
from atlas_fast.world.benchmark import BENCHMARK_LAYOUT, COLOUR_MODES, SPLIT_ORDERS  # noqa: E402


def coop_text_shift(backbone, classnames, contexts) -> dict:
    """How far CoOp's learned context moves the class text features: the mean cosine between each class's feature
    with a learned context and with the zero-shot one ("a photo of a"), over the base half and the new half (mean
    over the learned ``contexts``), and the same for random contexts of the initial context's norm (the text tower's
    leverage: near 1 when the tower ignores what precedes the class name)."""
    import torch.nn.functional as F

    from atlas_fast.methods.coop import PAPER_CTX_INIT, CoOp, CoOpConfig

    model = CoOp(backbone, list(classnames), CoOpConfig(ctx_init=PAPER_CTX_INIT))
    half = (len(classnames) + 1) // 2
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        zero_shot = model.text_features()[0]
        init = model.ctx.detach().clone()

        def cosines(ctx: torch.Tensor) -> torch.Tensor:
            model.ctx.copy_(ctx.reshape(init.shape).to(init.dtype))
            return (model.text_features()[0] * zero_shot).sum(-1)

        learned = torch.stack([cosines(ctx) for ctx in contexts])
        norm = init.float().norm(dim=-1, keepdim=True)
        rand = torch.stack([cosines(F.normalize(torch.randn(init.shape, generator=gen), dim=-1) * norm)
                            for _ in range(3)])
    return {"coop_cos_to_zero_shot_base_new": [round(learned[:, :half].mean().item(), 4),
                                               round(learned[:, half:].mean().item(), 4)],
            "random_ctx_cos_to_zero_shot": round(rand.mean().item(), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--style", default="photo")
    shipped = BENCHMARK_LAYOUT
    p.add_argument("--layout", type=float, nargs=6, default=[*shipped.radius, shipped.max_shift, shipped.max_tilt,
                                                              shipped.max_clutter, shipped.noise],
                   metavar=("R_LO", "R_HI", "SHIFT", "TILT", "CLUTTER", "NOISE"))
    p.add_argument("--shots", type=int, default=16)
    p.add_argument("--split-order", default="shape", choices=SPLIT_ORDERS,
                   help="base/new split: checkerboard (new = unseen combinations of base attributes), texture/shape "
                        "(new classes carry the held-out half of that attribute's values; shape is the shipped "
                        "order) or both (new classes share no attribute with base ones: 12 of the 24 classes)")
    p.add_argument("--colours", default="shape-palette", choices=COLOUR_MODES,
                   help="shape-palette (shipped): each shape in one of its two typical colours "
                        "(generator.SHAPE_PALETTES), which no class name says; any: colour uniform (a nuisance)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--epochs", type=int, default=None, help="default: the paper's recipe (200)")
    p.add_argument("--checkpoint", default="atlas-world", help="a world CLIP (default: the shipped one)")
    p.add_argument("--work", type=Path, default=Path("/tmp/world19"))
    p.add_argument("--out", type=Path, default=Path("/tmp/world19/regime.jsonl"))
    p.add_argument("--no-coop", action="store_true", help="teacher and zero-shot only")
    args = p.parse_args()
    torch.set_num_threads(1)

    from atlas_fast import TrainConfig, run_group
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.data import register_split_json_dataset
    from atlas_fast.world.benchmark import IMAGE_FOLDER, SplitSizes, WorldDataset, split_order, write_dataset
    from atlas_fast.world.generator import SHAPES, TEXTURES, Layout
    from tools.world.properties import teacher_properties

    r0, r1, shift, tilt, clutter, noise = args.layout
    layout = Layout(radius=(r0, r1), max_shift=shift, max_tilt=tilt, max_clutter=int(clutter), noise=noise)
    tag = f"{args.style}_r{r0:g}-{r1:g}_s{shift:g}_t{tilt:g}_c{int(clutter)}_n{noise:g}".replace(".", "p")
    if args.split_order != "checkerboard":  # (the checkerboard keeps its earlier name, so its data is reused)
        tag += f"_{args.split_order}"
    if args.colours != "any":
        tag += "_palette"
    name = "Regime" + "".join(part.capitalize() for part in tag.split("_")).replace("-", "to")
    classnames = split_order(args.split_order, SHAPES[:6], TEXTURES[:4])
    dataset = WorldDataset(name, f"regime_{tag}", args.style, classnames, colours=args.colours)
    data_root = args.work / "data"
    write_dataset(dataset, data_root, SplitSizes(32, 4, 50), progress=False, layout=layout)
    register_split_json_dataset(dataset.name, dataset.folder, IMAGE_FOLDER, dataset.template,
                                split_file=dataset.split_file)
    backbone_cfg = BackboneConfig("atlas-world", args.checkpoint)
    backbone = load_backbone(backbone_cfg)
    teacher = teacher_properties(dataset.name, data_root, backbone)
    from atlas_fast.atlas.softlabels import soft_label_preset, class_soft_labels
    from atlas_fast.data import load_dataset
    from atlas_fast.data.fewshot import subsample_classes

    splits = subsample_classes(load_dataset(dataset.name, data_root), "base")
    with torch.no_grad():
        text = backbone.encode_text(splits.prompts()).float()
    csl = class_soft_labels(text, soft_label_preset("base2new", "csl").tau_c)
    row = {"style": args.style, "layout": args.layout, "shots": args.shots, "split_order": args.split_order,
           "colours": args.colours,
           "logit_scale": round(teacher.logit_scale, 2), "checkpoint": args.checkpoint,
           "teacher_base_train_acc": round(teacher.accuracy, 1),
           "isl_argmax_is_label": round(teacher.isl_argmax_is_label, 1),
           "csl_off_target_mass": round(100 * (1 - csl.diag().mean().item()), 2)}
    if not args.no_coop:
        start = time.time()
        configs = [TrainConfig(dataset=dataset.name, data_root=data_root, backbone=backbone_cfg, method="coop",
                               setting="base2new", shots=args.shots, seed=s, epochs=args.epochs,
                               eval_every_epoch=True, cache_root=args.work / "cache",
                               results_dir=args.work / "results", progress=False) for s in args.seeds]
        records = run_group(configs)
        curves = [[e["accuracy"]["new"] for e in r["epochs"] if "accuracy" in e] for r in records]
        row.update({
            "seeds": args.seeds,
            "zs_base": round(statistics.fmean(r["metrics"]["zero_shot"]["base"] for r in records), 2),
            "zs_new": round(statistics.fmean(r["metrics"]["zero_shot"]["new"] for r in records), 2),
            "coop_base": [round(r["metrics"]["base"], 2) for r in records],
            "coop_new": [round(r["metrics"]["new"], 2) for r in records],
            "max_epoch_jump_new": [round(max(abs(b - a) for a, b in zip(c, c[1:])), 2) for c in curves],
            "new_curve_every_20": [[round(c[i], 1) for i in range(0, len(c), 20)] + [round(c[-1], 1)] for c in curves],
            "coop_seconds": round(time.time() - start),
        })
        from atlas_fast.engine.record import load_learned

        by_key = {json.loads(p.read_text())["key"]: p for p in (args.work / "results" / dataset.name).glob("*.json")}
        contexts = [load_learned(by_key[r["key"]])["ctx"] for r in records]
        row.update(coop_text_shift(backbone, classnames, contexts))
    print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
