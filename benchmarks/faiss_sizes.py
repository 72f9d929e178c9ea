"""What the soft labels' similarity searches cost on the CPU at ImageNet's sizes: the figures behind the choice of
faiss's CPU index (docs/install.md, "Why faiss runs on the CPU").

ATLaS computes its soft labels once per (dataset, backbone), before training:

* **CSL** searches the C class text embeddings against themselves (``IndexFlatIP``, k = C): at ImageNet's
  C = 1,000 and D = 512 that is one 1,000 x 1,000 inner-product search, timed here alone and as the whole
  :func:`atlas_fast.atlas.softlabels.class_soft_labels` (normalise, search, softmax, scatter).
* **ISL** compares each training image's feature with the C class embeddings: N x C inner products, done by torch
  (:func:`~atlas_fast.atlas.softlabels.zero_shot_probabilities`), timed at N = 16,000 (ImageNet's 16 shots) and
  128,000 (128 images per class); beside it the same search through faiss's ``IndexFlatIP`` (k = C), what a GPU
  index would replace.

Each figure is the median of ``--repeats`` after one untimed call, on ``--threads`` CPU threads (default 1, the
machine shared), with the load average printed beside it. Usage::

    python benchmarks/faiss_sizes.py                      # C = 1,000; N = 16,000 and 128,000; D = 512
    python benchmarks/faiss_sizes.py --threads 2 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def timed(function: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``function()`` over ``repeats`` calls, after one untimed call."""
    function()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1000, help="C (default ImageNet's 1,000)")
    parser.add_argument("--images", type=int, nargs="+", default=[16_000, 128_000], help="N for ISL")
    parser.add_argument("--dim", type=int, default=512, help="D (default ViT-B/16's 512)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import faiss
    import numpy as np
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from atlas_fast.atlas.softlabels import class_soft_labels

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    classes = F.normalize(torch.randn(args.classes, args.dim, generator=generator), dim=-1)
    vectors = np.ascontiguousarray(classes.numpy())
    print(f"faiss {faiss.__version__} (GPUs it sees: {faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0})"
          f", torch {torch.__version__}; {args.threads} thread(s); load before: {load()}")
    print()
    print("| search | shape | CPU seconds (median) | per call of a run |")
    print("|---|---|---|---|")

    def csl_search() -> None:
        index = faiss.IndexFlatIP(args.dim)
        index.add(vectors)
        index.search(vectors, args.classes)

    seconds = timed(csl_search, args.repeats)
    print(f"| CSL: faiss IndexFlatIP, k = C | {args.classes} x {args.classes} x {args.dim} | {seconds:.4f} | once "
          f"per dataset and backbone |")
    seconds = timed(lambda: class_soft_labels(classes, 0.5), args.repeats)
    print(f"| CSL: class_soft_labels (whole) | {args.classes} x {args.classes} | {seconds:.4f} | once per dataset "
          f"and backbone |")
    for n in args.images:
        images = F.normalize(torch.randn(n, args.dim, generator=generator), dim=-1)
        seconds = timed(lambda: torch.softmax(100.0 * images @ classes.t(), dim=1), args.repeats)
        print(f"| ISL: torch N x C inner products + softmax | {n} x {args.classes} x {args.dim} | {seconds:.4f} | "
              f"once per dataset, backbone and shots |")
        queries = np.ascontiguousarray(images.numpy())

        def isl_faiss() -> None:
            index = faiss.IndexFlatIP(args.dim)
            index.add(vectors)
            index.search(queries, args.classes)

        seconds = timed(isl_faiss, args.repeats)
        print(f"| ISL's search through faiss IndexFlatIP, k = C | {n} x {args.classes} x {args.dim} | {seconds:.4f} "
              f"| (not used: what a GPU index would replace) |")
    print()
    print(f"load after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
