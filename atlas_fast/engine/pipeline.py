"""Train runs and record them: the pipeline

    plan (:mod:`~atlas_fast.engine.spec`) -> feed (:mod:`~atlas_fast.engine.feed`) -> loop
    (:mod:`~atlas_fast.engine.loop`) -> evaluate (:mod:`~atlas_fast.engine.evaluate`) -> record
    (:mod:`~atlas_fast.engine.record`)

A lone run is a group of one: ``run(config) == run_group([config])[0]``; grouping is a pure speed knob (records
equal those of runs trained alone, up to float reordering); finished runs are skipped (docs/architecture.md); a run
that fails on its own is written as failed while the others go on (docs/guarantees.md).
A sweep is a plain loop over configs::

    from atlas_fast import TrainConfig, run_group
    records = run_group([TrainConfig("OxfordPets", "data", seed=s, soft_labels=soft_label_preset("base2new"),
                                     schedule=Alternating(2)) for s in (1, 2, 3)])

Epoch ``e`` reads cached augmented view ``1 + (e mod V)``. Runs are deterministic per seed on the CPU; on a GPU the
forward runs under fp16 autocast with a gradient scaler.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from atlas_fast.cache import FeatureCache
from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
from atlas_fast.engine.config import TrainConfig, resolve_device
from atlas_fast.engine.evaluate import (SetScores, evaluate_method, run_metrics, score_method, summarize,
                                        zero_shot_references)
from atlas_fast.engine.feed import VALIDATION, evaluation_set
from atlas_fast.engine.group import RunGroup, batches_runs, check_group, prepare_group_inputs
from atlas_fast.engine.loop import Divergence
from atlas_fast.engine.record import (FailedRun, ResultStore, RunRecord, adopt_legacy_record, build_record,
                                      finished_record, load_learned, rewrite_record, save_failure, save_record,
                                      split_snapshots, utc_now, with_snapshots)
from atlas_fast.engine.run_identity import evaluated_sets
from atlas_fast.engine.spec import STORED_ONLY, RunSpec, load_run_data, plan_run
from atlas_fast.engine.validity import CALIBRATION, SAVED_RUN_FIELDS, check_seal, missing_fields, read_record
from atlas_fast.errors import RunsFailed, user_errors
from atlas_fast.methods.registry import method_class
from atlas_fast.threads import small_step_threads
from atlas_fast.vocabulary import CLASS_SETS, HARMONIC_MEAN


def run(config: TrainConfig) -> dict[str, Any]:
    """Train and evaluate one run, or return the finished record of an identical earlier run.

    Returns the record (see :mod:`atlas_fast.engine.record`); ``record["metrics"]`` holds base/new/H
    (base-to-new) or all (few-shot, cross-dataset), each in percent, and ``zero_shot`` references with the dataset's
    CLIP template. It is a dict whose printed form rounds floats to 6 significant digits (:class:`RunRecord`)."""
    return run_group([config])[0]


def run_group(configs: Sequence[TrainConfig]) -> list[dict[str, Any]]:
    """Plan every config once, then train (or reuse) the runs as one group (one by one, with a warning, where the
    method cannot batch); records in the order of ``configs``. Failed runs raise after the others are written (see
    :func:`raise_failures`)."""
    listings: dict = {}
    specs = [plan_run(config, listings=listings) for config in configs]
    results = run_specs(specs, warn_unbatched=True)
    raise_failures(results)
    return [RunRecord(record) for record in results]


def raise_failures(results: Sequence[Any]) -> None:
    """Raise for the :class:`FailedRun` entries of ``results``: a lone run's own exception, else
    :class:`~atlas_fast.errors.RunsFailed` naming each failed run by its printed name, and why."""
    failed = [r for r in results if isinstance(r, FailedRun)]
    if not failed:
        return
    if len(results) == 1 and failed[0].error is not None:
        raise failed[0].error
    records = [None if isinstance(r, FailedRun) else RunRecord(r) for r in results]
    raise RunsFailed(failure_message(failed, len(results)), failed, records)


def failure_message(failed: Sequence[FailedRun], total: int) -> str:
    """The error of a command whose runs failed: each by its printed name and reason."""
    lines = "\n".join(f"  {f.line()}" + (f" [{f.note}]" if f.note else "") for f in failed)
    return (f"{len(failed)} of {total} run(s) failed (the other runs' records are written; run the same command "
            f"again to train only the failed ones):\n{lines}")


def split_finished(specs: Sequence[RunSpec], complete: bool = True
                   ) -> tuple[list[dict[str, Any] | None], list[int]]:
    """Each spec's finished record (None where there is none) and the indices of the runs still to train: the one
    place where finished runs are skipped. With ``complete`` the sets a record lacks are evaluated on its saved
    prompts (:func:`complete_record`; a dry run passes False)."""
    records = []
    for spec in specs:
        record = finished_record(spec) or adopt_legacy_record(spec)
        if record is not None and complete:
            record = complete_record(spec, record)
        records.append(record)
    return records, [i for i, record in enumerate(records) if record is None]


def missing_sets(spec: RunSpec, record: dict[str, Any]) -> list[str]:
    """The class sets ``spec`` asks for that ``record`` holds no accuracy for."""
    return [name for name in spec.data.splits if name not in evaluated_sets(record)]


def uncalibrated_sets(spec: RunSpec, record: dict[str, Any]) -> list[str]:
    """The class sets ``spec`` asks for that ``record`` holds an accuracy but no calibration figures for."""
    calibrated = (record.get("metrics") or {}).get(CALIBRATION) or {}
    return [name for name in evaluated_sets(record) if name in spec.data.splits and name not in calibrated]


def complete_record(spec: RunSpec, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with what ``spec`` asks for and it lacks (class sets, calibration, with ``save_predictions`` the
    predictions of every set) evaluated on its saved learned tensors and written back, no retraining; unchanged when
    it holds them all. Per-epoch accuracies stay those of the sets evaluated then."""
    missing = missing_sets(spec, record)
    keep = spec.config.save_predictions and "predictions" not in record or bool(missing and "predictions" in record)
    rescored = list(spec.data.splits) if keep else [
        name for name in spec.data.splits if name in missing or name in uncalibrated_sets(spec, record)]
    if not rescored:
        return record
    clock = time.perf_counter()
    path = Path(record["path"])
    learned = load_learned(path)
    backbone = spec.backbone()
    if backbone.fingerprint != record["backbone"]["fingerprint"]:
        raise ValueError(f"The backbone {backbone.describe()} differs from the one {path} was trained with.")
    scores, sets = rescore_saved(spec, record, learned, backbone, rescored, keep)
    metrics = dict(record["metrics"])
    zero_shot = dict(metrics.pop("zero_shot"))
    calibration = dict(metrics.pop(CALIBRATION, None) or {})
    fresh = run_metrics(scores, 0)
    for name in missing:
        metrics[name] = fresh[name]
    if missing:
        zero_shot.update(zero_shot_references(backbone, [s for s in sets if s.name in missing], spec.dataset))
    calibration.update(fresh.get(CALIBRATION, {}))
    others = {k: v for k, v in metrics.items() if k not in CLASS_SETS and k != HARMONIC_MEAN}
    accuracies = summarize({name: metrics[name] for name in CLASS_SETS if name in metrics})
    references = summarize({name: zero_shot[name] for name in CLASS_SETS if name in zero_shot})
    data = dict(record["data"])
    data["num_test"] = {**data.get("num_test", {}),
                        **{name: len(spec.data.splits[name].test) for name in missing}}
    later = list(record.get("evaluated_later", [])) + [
        {"sets": missing, "calibrated": [name for name in rescored if name not in missing], "created": utc_now(),
         "seconds": round(time.perf_counter() - clock, 4)}]
    ordered = {name: calibration[name] for name in CLASS_SETS if name in calibration}
    completed = {**record, "metrics": {**accuracies, **others, CALIBRATION: ordered, "zero_shot": references},
                 "reliability": {**(record.get("reliability") or {}), **reliability(scores, 0)}, "data": data,
                 "evaluated_later": later}
    return rewrite_record(spec, path.stem, completed, learned, run_predictions(scores, 0) if keep else None)


def rescore_saved(spec: RunSpec, record: dict[str, Any], learned: dict[str, torch.Tensor], backbone,
                  names: Sequence[str], keep_logits: bool) -> tuple[dict[str, SetScores], list]:
    """A finished run's scores on the class sets ``names``, from its saved learned tensors, scored as the run scored
    itself (temperature fitted on its validation split where that is not the test split)."""
    config, train_split = spec.config, spec.data.train_split
    cache = FeatureCache(config.cache_root, content_hash=config.content_hash)
    wanted = [(name, spec.data.splits[name], "test") for name in names]
    if not spec.data.fewshot.val_is_test and train_split.val:
        wanted.append((VALIDATION, train_split, "val"))
    sets = []
    for name, split, part in wanted:
        cache.build(backbone, spec.dataset, getattr(split, part), num_views=0, progress=config.progress)
        sets.append(evaluation_set(name, split, backbone, cache, spec.method, config.workers, spec.device, part))
    held_out = sets.pop() if len(sets) > len(names) else None
    trained_on = record.get("data", {}).get("classnames") or train_split.classnames
    method = spec.method.build(backbone, trained_on, spec.method_config).to(spec.device)
    method.load_checkpoint_state(split_snapshots(learned)[0])
    return score_method(method, sets, spec.amp, config.progress, calibrate=True, keep_logits=keep_logits,
                        held_out=held_out), sets


def run_specs(specs: Sequence[RunSpec], warn_unbatched: bool = False, looked_up: bool = False
              ) -> list[dict[str, Any]]:
    """Train the planned runs that have no finished record, as one group when their method batches, else one by one
    (warned of with ``warn_unbatched``); every run's record in order. A run asked for twice (same record name) trains
    once. ``looked_up``: the caller has just found these runs unfinished, so they are not looked up again."""
    records, todo = ([None] * len(specs), list(range(len(specs)))) if looked_up else split_finished(specs)
    if not todo:
        return records  # type: ignore[return-value]
    first_of: dict[str, int] = {}
    repeats = [i for i in todo if first_of.setdefault(specs[i].stem, i) != i]
    todo = [i for i in todo if i not in repeats]
    method = specs[todo[0]].method
    if len(todo) > 1 and not batches_runs(method, specs[todo[0]].method_config):
        if warn_unbatched:
            warnings.warn(f"{method.name} does not support batched runs: its runs train one by one.")
        groups = [[i] for i in todo]
    else:
        groups = [todo]
    for group in groups:
        for i, record in zip(group, train_group([specs[i] for i in group])):
            records[i] = record  # a FailedRun where the run failed on its own
    for i in repeats:
        records[i] = split_finished([specs[i]])[0][0]
    return records  # type: ignore[return-value]


def train_group(specs: Sequence[RunSpec]) -> list[dict[str, Any] | FailedRun]:
    """Train R >= 1 planned runs as one module (:class:`~atlas_fast.engine.group.RunGroup`), evaluate each and write
    its record. A run that fails on its own is written as failed and returned as a :class:`FailedRun`; the others go
    on as they would without it."""
    check_group(specs)
    results: list[dict[str, Any] | FailedRun | None] = [None] * len(specs)
    for spec in specs:
        ResultStore(spec.config.results_dir).check_writable(spec.dataset)  # fail now, not after training
    start = time.perf_counter()
    backbone = specs[0].backbone()

    def unprepared(r: int, exc: BaseException) -> None:
        results[r] = save_failure(specs[r], f"{type(exc).__name__}: {exc}", exc)

    inputs, seconds = prepare_group_inputs(specs, backbone, unprepared)
    ready = [i for i, run_inputs in enumerate(inputs) if run_inputs is not None]
    if ready:
        group = RunGroup([specs[i] for i in ready], backbone, [inputs[i] for i in ready])
        for i, result in zip(ready, _train_and_record(group, [seconds[i] for i in ready], start)):
            results[i] = result
    return results  # type: ignore[return-value]


def _train_and_record(group: RunGroup, input_seconds: list[float], start: float
                      ) -> list[dict[str, Any] | FailedRun]:
    """Train a group whose inputs are ready, evaluate each run and write its record (or its failure)."""
    specs, first = group.specs, group.specs[0]
    failed: dict[int, FailedRun] = {}

    def fail(r: int, exc: BaseException | None = None, divergence: Divergence | None = None) -> None:
        if r not in failed:
            reason = (divergence.describe(first.optim_recipe) if divergence is not None
                      else f"{type(exc).__name__}: {exc}")
            failed[r] = save_failure(specs[r], reason, exc or FloatingPointError(f"{reason}. No record is written."),
                                     divergence)

    snapshots: list[dict[int, dict[str, torch.Tensor]]] = [
        {0: single.state_for_checkpoint()} if 0 in spec.config.snapshot_epochs else {}
        for spec, single in zip(specs, group.alone)]

    def per_epoch_eval(epoch: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for r, spec in enumerate(specs):
            rows.append({})
            if r in failed:
                continue
            try:
                if epoch + 1 in spec.config.snapshot_epochs:
                    snapshots[r][epoch + 1] = group.run_method(r).state_for_checkpoint()
                if spec.config.eval_every_epoch:
                    accuracies = {n: v[0] for n, v in evaluate_method(group.run_method(r), group.inputs[r].eval_sets,
                                                                      first.amp).items()}
                    rows[-1] = {"accuracy": summarize(accuracies)}
            except user_errors() as exc:  # this run's own evaluation: it fails, the others go on
                fail(r, exc)
        return rows

    fork = group.fork_plan()  # the runs' shared first epochs trained once, by one trunk run per seed and data
    progress = any(s.config.progress for s in specs)
    clock = time.perf_counter()
    with small_step_threads(first.device.type, small_steps=not first.method.reads_pixels):
        logs = group.train(progress, per_epoch_eval, on_failure=lambda r, divergence: fail(r, divergence=divergence),
                           retire=(lambda epoch, logs: set(failed)) if fork is None else None, fork=fork)
    train_seconds = round(time.perf_counter() - clock, 4)

    records: list[dict[str, Any] | FailedRun] = []
    zero_shots: dict[tuple[int, ...], dict[str, float]] = {}  # per distinct tuple of (shared) evaluation sets
    together, shared_seconds = group.scores(progress, any(spec.config.save_predictions for spec in specs))
    for r, (spec, log) in enumerate(zip(specs, logs)):
        if r in failed:
            records.append(failed[r])
            continue
        try:
            records.append(_record_run(group, r, log, together, zero_shots, shared_seconds, snapshots[r], {
                "plan": spec.plan_seconds, "inputs": input_seconds[r], "train": train_seconds,
                "seconds_per_epoch": train_seconds / spec.optim_recipe.epochs, "batch_runs": len(specs)}, start))
        except user_errors() as exc:  # this run's own evaluation or record: it fails, the others are recorded
            fail(r, exc)
            records.append(failed[r])
    return records


def _record_run(group: RunGroup, r: int, log: list[dict[str, Any]], together: dict[str, SetScores] | None,
                zero_shots: dict, shared_seconds: float, snapshots: dict[int, dict[str, torch.Tensor]],
                timings: dict[str, Any], start: float) -> dict[str, Any]:
    """Evaluate run ``r`` of a trained group (from the group's one pass ``together`` where there is one) and write
    its record."""
    clock = time.perf_counter()
    spec, run_inputs, backbone = group.specs[r], group.inputs[r], group.backbone
    method = group.run_method(r)
    sets = tuple(id(eval_set) for eval_set in run_inputs.eval_sets)
    if sets not in zero_shots:
        zero_shots[sets] = zero_shot_references(backbone, run_inputs.eval_sets, spec.dataset)
    keep = spec.config.save_predictions
    if together is not None:
        scores, at = together, r
    else:
        scores = score_method(method, run_inputs.eval_sets, spec.amp, spec.config.progress, calibrate=True,
                              keep_logits=keep, held_out=run_inputs.held_out)
        at = 0
    metrics = {**run_metrics(scores, at), "zero_shot": zero_shots[sets]}
    timings = {"plan": timings["plan"], "inputs": timings["inputs"], "train": timings["train"],
               "evaluate": round(time.perf_counter() - clock + shared_seconds, 4),
               "seconds_per_epoch": timings["seconds_per_epoch"], "batch_runs": timings["batch_runs"],
               "group_total": round(time.perf_counter() - start, 4)}
    record = build_record(spec, backbone, metrics, log, timings)
    record["reliability"] = reliability(scores, at)
    learned = method.state_for_checkpoint()
    return save_record(spec, record, with_snapshots(learned, snapshots) if snapshots else learned,
                       predictions=run_predictions(scores, at) if keep else None)


def reliability(scores: dict[str, SetScores], r: int) -> dict[str, dict[str, list]]:
    """Run r's reliability table per class set (the record's ``reliability``: image count, correct predictions and
    summed confidence per confidence bin), what the reliability diagrams are drawn from."""
    return {name: s.run_bins(r) for name, s in scores.items() if s.calibration is not None}


def run_predictions(scores: dict[str, SetScores], r: int) -> dict[str, Any]:
    """Run r's per-image predictions to save beside its record: ``S_logits`` (N, C) float32 (the scaled logits the
    softmax is taken of) and ``S_labels`` (N,) int64 per class set S."""
    out: dict[str, Any] = {}
    for name, s in scores.items():
        out[f"{name}_logits"] = s.logits[r].numpy().astype("float32")
        out[f"{name}_labels"] = s.labels.numpy().astype("int64")
    return out


def saved_method_config(entry, fields: dict[str, Any]):
    """The method config a record describes (without ``spec.STORED_ONLY`` fields). A config refused with both
    ``ctx_init`` and ``n_ctx`` is rebuilt without ``n_ctx``: those runs learned one token per word of the phrase."""
    fields = {k: v for k, v in fields.items() if k not in STORED_ONLY}
    try:
        return entry.config_class(**fields)
    except ValueError:
        if not fields.get("ctx_init") or "n_ctx" not in fields:
            raise
        return entry.config_class(**{k: v for k, v in fields.items() if k != "n_ctx"})


def evaluate_saved(record_path: str | Path, dataset: str, data_root: str | Path, subsample: str = "all",
                   shots: int | None = None, seed: int | None = None, cache_root: str | Path = "cache",
                   device: str = "auto", progress: bool = True, save_predictions: bool = False) -> dict[str, Any]:
    """Evaluate a saved run's learned tensors on a dataset's test split (cross-dataset transfer, or another seed's
    new classes), its config planned again for ``dataset``. ``subsample`` picks the class set; ``shots``/``seed``
    (default: the run's own) only define the base/new split. The result holds accuracy, zero-shot reference,
    ``calibration`` (``ece_ts``/``nll_ts`` with the run's own temperature where its record holds one) and
    ``reliability``; ``save_predictions`` writes ``<record>.<dataset>-<subsample>.predictions.npz`` (no seal covers
    it: this command writes no record)."""
    record = read_record(record_path)
    missing = missing_fields(record, SAVED_RUN_FIELDS)
    if missing:
        raise ValueError(f"{record_path} lacks {', '.join(missing)}: it is not a complete atlas_fast record, so its "
                         f"run cannot be rebuilt for evaluation.")
    check_seal(record, record_path)
    saved = record["config"]
    torch_device = resolve_device(device)
    backbone = shared_backbone(BackboneConfig(**saved["backbone"]), torch_device)
    if backbone.fingerprint != record["backbone"]["fingerprint"]:
        raise ValueError(f"The backbone {backbone.describe()} differs from the one {record_path} was trained with "
                         f"({record['backbone']['fingerprint'][:12]}); its learned prompts would be meaningless.")
    entry = method_class(saved["method"])
    config = TrainConfig(dataset, data_root, method=saved["method"], setting="few_shot",
                         shots=saved["shots"] if shots is None else shots, seed=saved["seed"] if seed is None else seed,
                         subsample=subsample, cache_root=cache_root, device=str(torch_device))
    data = load_run_data(config, [subsample], evaluation_only=True)
    split = data.splits[subsample]
    cache = FeatureCache(cache_root)
    cache.build(backbone, data.dataset, split.test, num_views=0, progress=progress)
    eval_set = evaluation_set(subsample, split, backbone, cache, entry, device=torch_device)
    # Built for the classes it was trained on (DePT's head is sized by them), evaluated on the target's.
    trained_on = record.get("data", {}).get("classnames") or split.classnames
    method = entry.build(backbone, trained_on, saved_method_config(entry, saved["method_config"]))
    method = method.to(torch_device)
    method.load_checkpoint_state(split_snapshots(load_learned(record_path))[0])
    amp = saved.get("precision") == "amp" and torch_device.type == "cuda"
    scores = score_method(method, [eval_set], amp, progress, calibrate=True, keep_logits=save_predictions,
                          temperatures=[run_temperature(record)])
    result = {"dataset": data.dataset, "subsample": subsample, "accuracy": scores[subsample].accuracy[0],
              "zero_shot": zero_shot_references(backbone, [eval_set], data.dataset)[subsample],
              "calibration": scores[subsample].run_figures(0), "reliability": scores[subsample].run_bins(0),
              "record": str(record_path), "num_test": len(split.test), "num_classes": len(split.classnames)}
    if save_predictions:
        from atlas_fast.engine.record import PREDICTIONS_SUFFIX, predictions_bytes
        from atlas_fast.files import atomic_write, blake2b_hex

        payload = predictions_bytes(run_predictions(scores, 0))
        target = Path(record_path).with_name(f"{Path(record_path).stem}.{data.dataset}-{subsample}"
                                             f"{PREDICTIONS_SUFFIX}")
        atomic_write(target, lambda f: f.write(payload))
        result.update(predictions=str(target), predictions_blake2b=blake2b_hex(payload))
    return result


def run_temperature(record: dict[str, Any]) -> float | None:
    """The temperature a run fitted on its validation split (its record's figures of the class set it trained
    on), or None (none recorded, or a dataset whose validation split is its test)."""
    trained = (record.get("config") or {}).get("subsample")
    figures = ((record.get("metrics") or {}).get(CALIBRATION) or {}).get(trained) or {}
    return figures.get("temperature")
