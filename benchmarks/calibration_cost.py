"""What calibration costs a run's evaluation, and what saved predictions cost on disk, measured side by side in one run.

A CoOp module (random prompts, the backbone's text tower) is evaluated on N cached test features of C classes, as a
run's evaluation is: once for accuracy alone (:func:`atlas_fast.engine.evaluate.score_method` without calibration,
what evaluation was before), once with the calibration figures (per-image confidence, NLL and Brier kept as the
logits stream, the reliability bins and ECE), and once as a run now evaluates (the figures, plus the temperature
fitted on a held-out split of 4 images per class and the figures after it); the three are interleaved ``--rounds``
times and the median of each is printed. The disk cost of ``--save-predictions`` is the size of the ``.npz`` a run
writes for 1,000 test images at C = 1,000 (``predictions_bytes``, counted, not timed)::

    PYTHONPATH=. python benchmarks/calibration_cost.py [--model atlas-world] [--classes 1000] [--images 10000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.engine.calibration import per_image_scores
from atlas_fast.engine.evaluate import EvalSet, score_method
from atlas_fast.engine.record import predictions_bytes
import atlas_fast.methods.base as method_base
from atlas_fast.methods.registry import build_method


def timed(function) -> float:
    clock = time.perf_counter()
    function()
    return time.perf_counter() - clock


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="atlas-world", help="open_clip model (default atlas-world, random weights)")
    p.add_argument("--classes", type=int, default=1000, help="C (default 1000, ImageNet's)")
    p.add_argument("--images", type=int, default=10000, help="N test images (default 10000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is printed (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--held-out-per-class", type=int, default=4,
                   help="images per class of the held-out split the temperature is fitted on (default 4, the "
                        "protocol's few-shot validation split; ImageNet, whose validation split is its test split, "
                        "fits none)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    backbone = load_backbone(BackboneConfig(args.model, None), "cpu")
    classnames = [f"class {i}" for i in range(args.classes)]
    method = build_method("coop", backbone, classnames)
    dim = backbone.embed_dim
    test = EvalSet("all", tuple(classnames), torch.randn(args.images, dim), torch.randint(0, args.classes,
                                                                                       (args.images,)))
    k = args.held_out_per_class
    held = EvalSet("val", tuple(classnames), torch.randn(k * args.classes, dim),
                   torch.arange(args.classes).repeat_interleave(k))
    cases = {
        "accuracy only (before)": lambda: score_method(method, [test]),
        "+ calibration figures": lambda: score_method(method, [test], calibrate=True),
        "+ figures and temperature scaling (a run now)": lambda: score_method(method, [test], calibrate=True,
                                                                              held_out=held),
    }
    for case in cases.values():  # warm-up: first calls allocate
        case()
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, case in cases.items():
            seconds[name].append(timed(case))
    base = statistics.median(seconds["accuracy only (before)"])
    logits = score_method(method, [test], keep_logits=True)["all"].logits
    chunk = method_base.EVAL_BATCH  # as the evaluation streams them

    def per_image_pass() -> None:
        for start in range(0, args.images, chunk):
            per_image_scores(logits[:, start:start + chunk], test.labels[start:start + chunk])

    alone = statistics.median(timed(per_image_pass) for _ in range(args.rounds))
    print(f"### Evaluation of CoOp on {args.images} cached test features, C = {args.classes} ({args.model}, "
          f"{args.threads} thread(s), median of {args.rounds} interleaved rounds)\n")
    print("| evaluation | seconds | vs accuracy only |\n|---|---:|---:|")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {100 * (median - base) / base:+.1f} % |")
    print(f"\nThe per-image figures alone (per_image_scores over the {args.images} x {args.classes} logits in the "
          f"evaluation's chunks of {chunk} images): {alone:.3f} s, {100 * alone / base:.1f} % of the accuracy-only evaluation (timed on "
          f"their own, so less exposed to the machine's load than the difference of two totals).")
    n, c = 1000, 1000
    arrays = {"new_logits": torch.randn(n, c).numpy(), "new_labels": torch.randint(0, c, (n,)).numpy()}
    size = len(predictions_bytes(arrays))
    print(f"\nSaved predictions (--save-predictions), one class set of {n} test images at C = {c}: {size:,} bytes "
          f"({size / 1e6:.3f} MB; the logits are N x C x 4 bytes = {n * c * 4:,}, the labels N x 8 = {n * 8:,}); a "
          f"run writes one such pair per evaluated class set (base, new, all in base-to-new).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
