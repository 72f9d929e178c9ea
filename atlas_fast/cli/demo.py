"""``atlas-fast demo``: the README's first command (the comparison itself is :mod:`atlas_fast.app.demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from atlas_fast.app.options import Distinct, add_options, add_progress, add_seeds, command_graph_steps


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast demo``."""
    from atlas_fast.app.demo import DemoConfig
    from atlas_fast.world.benchmark import BASE_TO_NEW

    defaults = DemoConfig(graph_steps=None)  # (not read from the environment while the parser is built)
    demo = subparsers.add_parser(
        "demo", help="base-to-new CoOp vs CoOp + ATLaS (-CSL, -ISL) on the embedded world, 3 seeds (CPU, minutes)",
        description="Generate the embedded world benchmark (or reuse it), build the feature cache with the shipped "
                    "atlas-world CLIP, train CoOp, + ATLaS, + ATLaS-CSL and + ATLaS-ISL on the base classes over "
                    "3 seeds, and print a table shaped like the paper's Table III (plus a plot and LaTeX). It runs "
                    "on one CPU thread unless --threads N (before or after the command) says otherwise, so that its "
                    "table does not depend on the machine's thread count (docs/threads.md).")
    demo.add_argument("--data-root", type=Path, default=defaults.data_root,
                      help=f"where the world benchmark is written (default {defaults.data_root})")
    demo.add_argument("--cache-root", type=Path, default=defaults.cache_root,
                      help=f"feature cache folder (default {defaults.cache_root})")
    demo.add_argument("--results-dir", type=Path, default=defaults.results_dir,
                      help=f"result records, table and plot (default {defaults.results_dir})")
    demo.add_argument("--datasets", nargs="+", default=list(defaults.datasets), action=Distinct,
                      help=f"world datasets (default {' '.join(defaults.datasets)}; any of "
                           f"{' '.join(BASE_TO_NEW)})")
    add_seeds(demo, defaults.seeds)
    demo.add_argument("--views", type=int, default=defaults.views,
                      help="cached augmented views per training image (default: one per epoch, the faithful "
                           "setting; fewer is faster, see docs/views-study.md)")
    demo.add_argument("--epochs", type=int, default=None, help="override the CoOp recipe's 200 epochs")
    demo.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    add_options(demo, ("graph_steps",))
    demo.add_argument("--kappa", action="store_true", help="also measure κ of Theorem 1 for each soft label")
    add_progress(demo)
    # One CPU thread unless --threads says otherwise: the table then does not depend on the machine's thread count
    # (the README's, bit for bit, on the machine it was made on), and on cores other jobs share one thread is the
    # faster (docs/threads.md)
    demo.set_defaults(func=run_demo_command, default_threads=1)


def run_demo_command(args: argparse.Namespace) -> int:
    graph_steps = command_graph_steps(args)  # a bad environment variable is named before torch is imported
    from atlas_fast.app.demo import DemoConfig, run_demo

    config = DemoConfig(graph_steps=graph_steps, data_root=args.data_root, cache_root=args.cache_root, results_dir=args.results_dir,
                        datasets=tuple(args.datasets), seeds=tuple(args.seeds), views=args.views,
                        epochs=args.epochs, device=args.device, plot=args.results_dir / "table3_base2new.png",
                        kappa=args.kappa)
    print(run_demo(config, progress=not args.no_progress))
    return 0
