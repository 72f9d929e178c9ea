"""R compatible runs trained as one module: one text-encoder pass over R x C prompts per step.

A sweep's group (see :mod:`atlas_fast.sweep`) shares the dataset, backbone, method, method config and resolved recipe;
each run keeps its own few-shot subset (sizes may differ), data order, initialisation, label schedule, soft labels and
record. :func:`run_batch` plans every run (finished ones are returned as they are), prepares each run's inputs as
:func:`atlas_fast.train.run` does, initialises run r exactly as a lone run with its seed would be, stacks the learned
tensors along their leading R dimension, trains them together (:func:`atlas_fast.loop.train_batched_epochs`) and
then evaluates and records each run on its own, from its slice. Each record equals the record of the run trained
alone (up to float reordering) and has the same name, so batching is a pure speed knob: a sweep may be resumed with
another ``batch_runs``.

Methods opt in with ``PromptMethod.supports_batched_runs``; a group of any other method trains its runs one by one.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Sequence

import torch

from atlas_fast.evaluate import evaluate_method, evaluate_run, summarize
from atlas_fast.inputs import RunInputs, prepare_inputs
from atlas_fast.loop import RunState, train_batched_epochs
from atlas_fast.methods.base import PromptMethod
from atlas_fast.plan import RunPlan, plan_run
from atlas_fast.results import build_record
from atlas_fast.train import TrainConfig, run


def shared_fields(plan: RunPlan) -> tuple:
    """What every run of a batched group must share."""
    return (plan.dataset, plan.backbone.fingerprint, plan.config.method, repr(plan.method_config), plan.recipe,
            plan.config.train_subsample, plan.device, plan.amp)


def run_batch(configs: Sequence[TrainConfig]) -> list[dict[str, Any]]:
    """Train (or reuse) every run of a group and return the records in order (see the module docstring)."""
    from atlas_fast.methods import METHODS

    plans = [plan_run(config) for config in configs]
    records: list[dict[str, Any] | None] = []
    for plan in plans:
        existing = plan.finished()
        records.append(None if existing is None else {**existing, "skipped": True, "path": str(plan.record_path)})
    todo = [i for i, record in enumerate(records) if record is None]
    method_class = METHODS.get(plans[0].config.method)
    if len(todo) > 1 and (method_class is None or not method_class.supports_batched_runs):
        warnings.warn(f"{plans[0].config.method} does not support batched runs: its runs train one by one.")
    if len(todo) == 1 or (todo and not method_class.supports_batched_runs):
        for i in todo:
            records[i] = run(configs[i])
    elif todo:
        for i, record in zip(todo, train_group([plans[i] for i in todo])):
            records[i] = record
    return records  # type: ignore[return-value]


def train_group(plans: Sequence[RunPlan]) -> list[dict[str, Any]]:
    """Train R >= 1 planned runs as one module and write each run's record."""
    from atlas_fast.methods import build_method

    reference = shared_fields(plans[0])
    for plan in plans[1:]:
        if shared_fields(plan) != reference:
            raise ValueError(f"Runs {plans[0].stem} and {plan.stem} cannot train as one batch: dataset, backbone, "
                             f"method, method config, recipe, class subset, device and precision must be equal.")
    first = plans[0]
    for plan in plans:
        plan.store.check_writable(plan.dataset)  # fail now, not after training
    start = time.perf_counter()
    inputs: list[RunInputs] = []
    input_seconds = []
    for plan in plans:
        clock = time.perf_counter()
        inputs.append(prepare_inputs(plan))
        input_seconds.append(round(time.perf_counter() - clock, 4))
    classnames = inputs[0].train_split.classnames
    if any(i.train_split.classnames != classnames for i in inputs):
        raise ValueError(f"The runs of a batch must train on the same classes ({first.dataset}).")

    singles = []
    for plan in plans:  # run r starts exactly where a lone run with its seed starts
        torch.manual_seed(plan.config.seed)
        singles.append(build_method(plan.config.method, first.backbone, classnames, plan.method_config)
                       .to(first.device))
    method = build_method(first.config.method, first.backbone, classnames,
                          dataclasses.replace(first.method_config, num_runs=len(plans))).to(first.device)
    method.load_checkpoint_state(stack_runs([single.state_for_checkpoint() for single in singles]))

    def per_epoch_eval(epoch: int) -> list[dict[str, Any]]:
        rows = []
        for r, (plan, single) in enumerate(zip(plans, singles)):
            if not plan.config.eval_every_epoch:
                rows.append({})
                continue
            load_run(single, method, r)
            accuracies = {n: v[0] for n, v in evaluate_method(single, inputs[r].eval_sets, first.amp).items()}
            rows.append({"accuracy": summarize(accuracies)})
        return rows

    states = [RunState(i.train_inputs, i.labels, i.soft_rows, dataclasses.replace(p.config.schedule), p.config.seed,
                       first.device) for p, i in zip(plans, inputs)]
    clock = time.perf_counter()
    logs = train_batched_epochs(method, states, first.recipe, first.device, first.amp,
                                any(p.config.progress for p in plans), per_epoch_eval)
    train_seconds = round(time.perf_counter() - clock, 4)

    records = []
    for r, (plan, single, run_inputs, log) in enumerate(zip(plans, singles, inputs, logs)):
        clock = time.perf_counter()
        load_run(single, method, r)
        metrics = evaluate_run(single, run_inputs.eval_sets, plan.backbone, run_inputs.full.name, plan.amp,
                               plan.config.progress)
        timings = {"inputs": input_seconds[r], "train": train_seconds, "batch_runs": len(plans),
                   "evaluate": round(time.perf_counter() - clock, 4),
                   "seconds_per_epoch": train_seconds / plan.recipe.epochs,
                   "group_total": round(time.perf_counter() - start, 4)}
        data = {"dataset": run_inputs.full.name, "fingerprint": plan.data.fingerprint,
                "content_hash": plan.config.content_hash, "num_train": len(run_inputs.labels),
                "num_classes": len(classnames), "classnames": list(classnames), "shots_used": plan.data.shots_used,
                "num_test": {s.name: len(s.labels) for s in run_inputs.eval_sets}}
        record = build_record(plan.record_key, plan.described, plan.backbone,
                              {"data_root": str(plan.config.data_root), "cache_root": str(plan.config.cache_root)},
                              data, metrics, log, timings, config_key=plan.key)
        path = plan.store.save(plan.dataset, plan.stem, record, single.state_for_checkpoint())
        records.append({**record, "status": "finished", "skipped": False, "path": str(path)})
    return records


def stack_runs(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Learned tensors of R single runs (leading dim 1) -> one state with leading dim R."""
    for name, tensor in states[0].items():
        if tensor.dim() == 0 or tensor.shape[0] != 1:
            raise ValueError(f"Learned tensor {name!r} of shape {tuple(tensor.shape)} has no leading runs dimension; "
                             f"this method cannot be batched.")
    return {name: torch.cat([state[name] for state in states]) for name in states[0]}


def load_run(single: PromptMethod, batched: PromptMethod, r: int) -> None:
    """Copy run ``r``'s slice of the batched method's learned tensors into a one-run method."""
    single.load_checkpoint_state({name: tensor[r:r + 1] for name, tensor in batched.state_for_checkpoint().items()})
