"""R compatible runs trained as one module (one text-encoder pass over R x C prompts per step).

Placeholder until train.run is split into plan -> inputs -> loop -> evaluate -> record: trains the runs one by one.
"""

from __future__ import annotations

from typing import Any, Sequence

from atlas_fast.train import TrainConfig, run


def run_batch(configs: Sequence[TrainConfig]) -> list[dict[str, Any]]:
    """Train (or reuse) every run of a group and return the records in order."""
    return [run(config) for config in configs]
