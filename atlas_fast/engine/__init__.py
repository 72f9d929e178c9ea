"""The run engine: plan (spec) -> feed -> loop -> evaluate -> record. ``run``/``run_group`` are its entry points."""

from atlas_fast.engine.config import TrainConfig
from atlas_fast.engine.pipeline import evaluate_saved, run, run_group, run_specs
from atlas_fast.engine.spec import RunSpec, plan_run

__all__ = ["RunSpec", "TrainConfig", "evaluate_saved", "plan_run", "run", "run_group", "run_specs"]
