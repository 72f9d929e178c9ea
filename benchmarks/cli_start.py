"""How long the command line takes to answer ``--help`` and to refuse a bad argument or name (method, dataset,
experiment, results folder), beside the cost of importing torch (what every answer cost before the CLI stopped
importing it), measured side by side in one run.

    python benchmarks/cli_start.py [--repeats 5]

Prints CPU seconds (user + system of the child process, the median of the repeats) per command and its ratio to
``import torch``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

COMMANDS = {
    "atlas-fast --help": ["-m", "atlas_fast.cli", "--help"],
    "atlas-fast train --help": ["-m", "atlas_fast.cli", "train", "--help"],
    "atlas-fast train (missing --data-root)": ["-m", "atlas_fast.cli", "train", "--dataset", "OxfordPets"],
    "atlas-fast train --method-option typo": ["-m", "atlas_fast.cli", "train", "--dataset", "OxfordPets",
                                             "--data-root", "data", "--method-option", "depth"],
    "atlas-fast train --method typo (no --dataset)": ["-m", "atlas_fast.cli", "train", "--method", "coopp"],
    "atlas-fast train --method typo --dataset --data-root": ["-m", "atlas_fast.cli", "train", "--method", "coopp",
                                                             "--dataset", "OxfordPets", "--data-root", "data"],
    "atlas-fast train --dataset typo": ["-m", "atlas_fast.cli", "train", "--dataset", "OxfordPetz"],
    "atlas-fast train --seeds 1 1": ["-m", "atlas_fast.cli", "train", "--dataset", "OxfordPets", "--data-root",
                                     "data", "--seeds", "1", "1"],
    "atlas-fast experiment (unknown name)": ["-m", "atlas_fast.cli", "experiment", "table9"],
    "atlas-fast experiment --list": ["-m", "atlas_fast.cli", "experiment", "--list"],
    "atlas-fast experiment NAME --help": ["-m", "atlas_fast.cli", "experiment", "table3_base_to_new", "--help"],
    "python -m atlas_fast.experiments NAME --help": ["-m", "atlas_fast.experiments", "fig_sensitivity", "--help"],
    "atlas-fast experiment NAME --methods typo": ["-m", "atlas_fast.cli", "experiment", "table_cross_dataset",
                                                  "--methods", "coopp"],
    "atlas-fast experiment NAME (missing --data-root)": ["-m", "atlas_fast.cli", "experiment", "table3_base_to_new"],
    "atlas-fast report (missing folder)": ["-m", "atlas_fast.cli", "report", "no-such-results-folder"],
    "python -c 'import torch, open_clip'": ["-c", "import torch, open_clip"],
}


def cpu_seconds(args: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    results = {name: statistics.median(cpu_seconds(command) for _ in range(args.repeats))
               for name, command in COMMANDS.items()}
    reference = results["python -c 'import torch, open_clip'"]
    print(f"| command | CPU s (median of {args.repeats}) | vs importing torch + open_clip |")
    print("|---|---:|---:|")
    for name, seconds in results.items():
        print(f"| `{name}` | {seconds:.2f} | {seconds / reference:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
