"""Sweeps: grids of runs planned once, grouped and sent to an executor (this process, Ray, SLURM)."""

from atlas_fast.atlas.variants import paper_variants
from atlas_fast.sweep.grid import (DEFAULT_BATCH_RUNS, Execution, describe_plan, grid_configs, plan_sweep,
                                   run_configs, run_grid)
from atlas_fast.vocabulary import EXECUTORS

__all__ = ["DEFAULT_BATCH_RUNS", "EXECUTORS", "Execution", "paper_variants", "describe_plan",
           "grid_configs", "plan_sweep", "run_configs", "run_grid"]
