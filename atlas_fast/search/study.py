"""A hyper-parameter search: an Optuna study over a run's fields, ATLaS knobs and method options, selected on the
validation split, stored where several processes can share and resume it.

    from atlas_fast.search import SearchConfig, integers, run_search, uniform
    result = run_search(SearchConfig(base, {"alpha": uniform(0.1, 1.0), "K": integers(1, 5)}, objective="H"))

A trial's value is the mean over its datasets and seeds of the objective on the few-shot **validation** split; the
test split is never read during the study. Pruning, batched trials, storage, take-over of dead trials and
determinism: docs/search.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from atlas_fast.engine.config import TrainConfig
from atlas_fast.errors import Interrupted, UsageError, install_extra
from atlas_fast.search.space import Choice, Param, Range, apply_values, check_space, describe_space, grid_values
from atlas_fast.vocabulary import OBJECTIVES, PRUNERS, SAMPLERS

# Who trained a trial (a trial user attribute), to tell the processes of a shared study apart.
PROCESS = f"{socket.gethostname()}:{os.getpid()}"
# Trials a GPU batch asks at once: its runs fill one group of the sweep's default size (atlas_fast.sweep.grid).
GPU_GROUP_RUNS = 12


@dataclass
class SearchConfig:
    """A study: ``base`` (the run every trial starts from: method, setting, shots, soft labels, paths) and
    ``space`` (name -> :class:`~atlas_fast.search.space.Range` / :class:`~atlas_fast.search.space.Choice`), trained on
    ``datasets`` (default: the base's) x ``seeds`` and selected on ``objective`` over the validation split.

    ``n_trials`` is the size of the study (trials of every state, whichever process ran them); ``sampler`` tpe,
    random or grid (every point of a space of choices/integers/stepped ranges); ``pruner`` hyperband, halving
    (successive halving), median or none. ``storage``: an Optuna storage URL (None: SQLite beside the results);
    ``study_name`` (None: derived from the definition). ``batch_trials``: trials asked and trained together (None:
    12 runs' worth on a GPU, 1 on the CPU). ``final_seeds``: the seeds the best configuration is retrained with and
    tested on after the study (None: ``seeds``); ``finalize=False`` leaves that to another process."""

    base: TrainConfig
    space: Mapping[str, Param]
    datasets: Sequence[str] | None = None
    seeds: Sequence[int] = (1,)
    objective: str = "accuracy"
    n_trials: int = 50
    sampler: str = "tpe"
    pruner: str = "hyperband"
    sampler_seed: int = 0
    storage: str | None = None
    study_name: str | None = None
    batch_trials: int | None = None
    final_seeds: Sequence[int] | None = None
    finalize: bool = True
    heartbeat_seconds: float = 20.0
    grace_seconds: float = 120.0
    lock_timeout: float = 60.0

    def __post_init__(self) -> None:
        from atlas_fast.data.datasets import find_dataset_spec
        from atlas_fast.search.storage import check_storage_url
        from atlas_fast.sweep.grid import distinct

        self.space = dict(self.space)
        self.datasets = tuple(self.datasets or (self.base.dataset,))
        self.seeds = tuple(self.seeds)
        if not self.seeds:
            raise UsageError("a search needs at least one seed.")
        # a seed or dataset given twice would count twice in every trial's mean (and the final retrain)
        distinct([d if ":" in d else getattr(find_dataset_spec(d), "name", d) for d in self.datasets], "--datasets")
        distinct(self.seeds, "--seeds")
        if self.final_seeds is not None:
            distinct(self.final_seeds, "--final-seeds")
        if self.storage is not None:
            check_storage_url(self.storage)
        if self.objective not in OBJECTIVES:
            raise UsageError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}.")
        if self.sampler not in SAMPLERS:
            raise UsageError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}.")
        if self.pruner not in PRUNERS:
            raise UsageError(f"pruner must be one of {', '.join(PRUNERS)}, got {self.pruner!r}.")
        if self.n_trials < 1:
            raise UsageError(f"n_trials must be >= 1, got {self.n_trials}.")
        if self.batch_trials is not None and self.batch_trials < 1:
            raise UsageError(f"batch_trials must be >= 1, got {self.batch_trials}.")
        if not 0 < self.heartbeat_seconds < self.grace_seconds:
            raise UsageError(f"heartbeat_seconds ({self.heartbeat_seconds}) must be > 0 and below grace_seconds "
                             f"({self.grace_seconds}): a live trial must never look dead.")

    @property
    def evaluate(self) -> tuple[str, ...]:
        """The class sets a trial is evaluated on: those the objective reads, and the training set."""
        train = self.base.train_subsample
        needed = {"accuracy": (), "base": ("base",), "new": ("new",), "H": ("base", "new"), "all": ("all",)}
        return tuple(dict.fromkeys((train,) + needed[self.objective]))

    @property
    def objective_set(self) -> str:
        return self.base.train_subsample if self.objective == "accuracy" else self.objective

    def trial_config(self, values: Mapping[str, Any], dataset: str, seed: int) -> TrainConfig:
        """The run of a trial with ``values`` on ``dataset`` with ``seed`` (no record is written for it)."""
        config = apply_values(self.base, values)
        return dataclasses.replace(config, dataset=dataset, seed=seed, evaluate=self.evaluate,
                                   eval_every_epoch=False)

    def definition(self) -> dict[str, Any]:
        """What makes two studies the same: everything that changes a trial's value or the sampler's choices."""
        base = self.base
        return {"method": base.method, "setting": base.setting, "recipe": base.recipe_family, "shots": base.shots,
                "backbone": base.backbone.to_dict(), "data_root": str(Path(base.data_root).expanduser().absolute()),
                "subsample": base.train_subsample, "schedule": base.schedule.describe(),
                "soft_labels": base.soft_labels.to_dict() if base.soft_labels is not None else None,
                "method_options": base.method_options, "epochs": base.epochs, "batch_size": base.batch_size,
                "lr": base.lr, "views": base.views, "aug_seed": base.aug_seed, "precision": base.precision,
                "space": describe_space(self.space), "datasets": list(self.datasets), "seeds": list(self.seeds),
                "objective": self.objective, "sampler": self.sampler, "pruner": self.pruner,
                "sampler_seed": self.sampler_seed}

    def name(self) -> str:
        if self.study_name:
            return self.study_name
        digest = hashlib.blake2b(json.dumps(self.definition(), sort_keys=True, default=str).encode(),
                                 digest_size=6).hexdigest()
        return f"{self.base.method}-{'+'.join(self.datasets)}-{self.objective}-{digest}"

    def folder(self) -> Path:
        """Where the study's outputs (and its default SQLite storage) live."""
        return Path(self.base.results_dir).expanduser() / "search" / self.name()

    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(self.folder() / 'study.db').absolute()}"


@dataclass
class SearchResult:
    """What a finished study gives: its best trial's values, value and configuration, the files written and, when
    the best configuration was retrained, the test records."""

    study_name: str
    storage: str
    best_params: dict[str, Any]
    best_value: float
    best_config: TrainConfig
    command: str
    files: dict[str, Path] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    trials: int = 0
    epochs: int = 0
    trials_now: int | None = None  # trials this call trained (None: not known, the study was only read)


def preflight(search: SearchConfig) -> int:
    """Everything checked before the storage is opened or anything trained (space, objective, every dataset's and
    seed's validation split, reading no feature); returns one trial's epochs over its datasets (the pruners'
    resource)."""
    from atlas_fast.engine.group import batches_runs
    from atlas_fast.engine.spec import evaluation_subsamples, plan_run, resolve_recipe
    from atlas_fast.search.trials import check_validation

    base = search.base
    method_config, recipe = resolve_recipe(base, search.datasets[0])
    check_space(search.space, base, method_config, search.datasets[0])
    if search.objective in ("base", "new", "H") and base.setting != "base2new":
        raise UsageError(f"objective {search.objective!r} is not defined in the {base.setting} setting: its runs "
                         f"train and are evaluated on {base.train_subsample!r} classes, with no base/new split; "
                         f"valid: accuracy, all.")
    defined = evaluation_subsamples(base.train_subsample, method_config, search.evaluate)
    if not set(search.evaluate) <= set(defined):
        raise UsageError(f"objective {search.objective!r}: {base.method} with class-specific context is evaluated "
                         f"on its training classes only; use objective accuracy.")
    if search.sampler == "grid":
        grid_values(search.space)
    listings: dict = {}
    epochs = 0
    for dataset in search.datasets:
        for seed in search.seeds:
            spec = plan_run(search.trial_config({}, dataset, seed), listings=listings)
            check_validation(spec)
        epochs += spec.optim_recipe.epochs
    if "epochs" in search.space:
        high = search.space["epochs"]
        epochs = int(max(high.values) if isinstance(high, Choice) else high.high) * len(search.datasets)
    if not batches_runs(spec.method, spec.method_config):  # its seeds train one after the other, a step per epoch of each
        epochs *= len(search.seeds)
    return epochs


def make_sampler(search: SearchConfig, number: int):
    """The sampler of trial ``number``, seeded from ``sampler_seed`` and the number (so a resumed study draws what
    an uninterrupted one would)."""
    import numpy as np
    import optuna

    seed = int(np.random.SeedSequence([search.sampler_seed, number]).generate_state(1)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if search.sampler == "grid":
            # one seed for every trial: it orders the grid, which must stay the same from trial to trial
            return _grid_sampler(optuna)(grid_values(search.space), seed=search.sampler_seed)
        if search.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, constant_liar=(search.batch_trials or 1) > 1)


def _grid_sampler(optuna):
    """Optuna's grid sampler without its stop at the last grid point: that stop works only inside
    ``study.optimize``, and here the study ends when it holds ``n_trials`` trials (the grid's size)."""

    class StudyGrid(optuna.samplers.GridSampler):
        def after_trial(self, study, trial, state, values) -> None:
            pass

    return StudyGrid


def make_pruner(search: SearchConfig, max_steps: int):
    import optuna

    if search.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(max_steps, 1), reduction_factor=3)
    if search.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    if search.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


def pruner_steps(search: SearchConfig) -> Callable[[int], bool]:
    """The steps at which the pruner can stop a trial (the validation split is evaluated there): every step for the
    median pruner, the rungs 1, 3, 9, 27, ... for halving and Hyperband, none without pruning."""
    if search.pruner == "median":
        return lambda step: True
    if search.pruner == "none":
        return lambda step: False
    return lambda step: step >= 1 and 3 ** round(math.log(step, 3)) == step


def suggest(trial, space: Mapping[str, Param]) -> dict[str, Any]:
    """The trial's values of every parameter (stored values for a trial taken over)."""
    values = {}
    for name, param in space.items():
        if isinstance(param, Choice):
            values[name] = trial.suggest_categorical(name, list(param.values))
        elif param.integer:
            values[name] = trial.suggest_int(name, int(param.low), int(param.high), log=param.log,
                                             step=int(param.step or 1))
        else:
            values[name] = trial.suggest_float(name, param.low, param.high, log=param.log, step=param.step)
    return values


def run_study(search: SearchConfig, progress: bool = True):
    """Run (or resume, or join) the study until it holds ``n_trials`` finished trials; returns the optuna study.
    Everything is checked before the storage is touched."""
    return run_trials(search, progress)[0]


def run_trials(search: SearchConfig, progress: bool = True):
    """:func:`run_study`, returning (the optuna study, the trials this call trained: 0 when a finished study is run
    again and nothing was left to run)."""

    max_steps = preflight(search)
    try:
        import optuna  # noqa: F401 (the extra's check, before the storage is opened)
    except ImportError:
        raise UsageError(f"a search needs Optuna, which the search extra installs: {install_extra('search')}") from None
    from atlas_fast.search.storage import close_storage, open_storage

    storage = open_storage(search.storage_url(), search.name(), search.definition(), search.lock_timeout)
    try:
        return _trials_in(storage, search, progress, max_steps)
    finally:
        close_storage(storage)


def _trials_in(storage, search: SearchConfig, progress: bool, max_steps: int):
    """:func:`run_trials` on an opened storage."""
    import optuna
    from optuna.trial import TrialState

    from atlas_fast.search.storage import (DEFINITION_ATTR, HEARTBEAT_ATTR, RELEASED, Heartbeat, dead_trials,
                                           wait_for_verdicts)
    from atlas_fast.search.trials import Reporter, TrialWork, mean, train_batch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = search.name()
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize", load_if_exists=True,
                                pruner=make_pruner(search, max_steps))
    if DEFINITION_ATTR not in study.user_attrs:
        study.set_user_attr(DEFINITION_ATTR, json.loads(json.dumps(search.definition(), default=str)))
    study_id = storage.get_study_id_from_name(name)
    batch = search.batch_trials or _default_batch(search)
    listings: dict = {}
    trained = 0

    def trial_id(trial) -> int:
        return storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)

    def on_report(work: TrialWork, step: int, value: float) -> bool:
        trial = work.trial
        last = max(work.reported, default=-1)
        if step < last:  # a trial taken over: this step was reported, and passed, before its process died
            return False
        if step not in work.reported:
            trial.report(value, step)
            work.reported[step] = value
        if trial.should_prune():
            trial.set_user_attr("epochs", work.epochs)
            trial.set_user_attr("process", PROCESS)
            if _tell(study, trial, progress, state=TrialState.PRUNED):
                _say(progress, f"trial {trial.number}: pruned at step {step} ({search.objective} {value:.2f})")
            return True
        return False

    wait_for_verdicts(study, search.heartbeat_seconds, search.grace_seconds)
    import sqlalchemy.exc

    in_flight: list = []  # the trials this process is training now
    try:
        with Heartbeat(storage, search.heartbeat_seconds) as heartbeat:
            while True:
                in_flight.clear()
                works = in_flight  # (the same list: on Ctrl-C, these trials are handed back)
                for trial, silent, reported in dead_trials(study, storage, study_id, search.grace_seconds, heartbeat,
                                                           batch):
                    stopped = "was interrupted" if math.isinf(silent) else f"stopped {silent:.0f} s ago"
                    _say(progress, f"trial {trial.number}: its process {stopped}; training it again")
                    works.append(_work(search, trial, reported))
                while len(works) < batch and len(study.get_trials(deepcopy=False)) < search.n_trials:
                    study.sampler = make_sampler(search, len(study.get_trials(deepcopy=False)))
                    trial = study.ask()
                    heartbeat.beat(trial_id(trial))
                    works.append(_work(search, trial, {}))
                if not works:
                    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if not running:
                        break
                    time.sleep(min(search.heartbeat_seconds, 5.0))  # others' trials: wait for them, or their death
                    continue
                heartbeat.track([trial_id(work.trial) for work in works])
                train_batch(works, search.datasets, Reporter(search.objective_set, on_report, pruner_steps(search)),
                            listings)
                trained += len(works)
                for work in works:
                    trial = work.trial
                    if work.pruned:
                        continue
                    trial.set_user_attr("epochs", work.epochs)
                    trial.set_user_attr("process", PROCESS)
                    if work.error is not None:
                        trial.set_user_attr("error", work.error)
                        if _tell(study, trial, progress, state=TrialState.FAIL):
                            _say(progress, f"trial {trial.number}: failed ({work.error.splitlines()[0]})")
                        continue
                    value = mean(work.finals)
                    if _tell(study, trial, progress, values=value):
                        _say(progress, f"trial {trial.number}: {search.objective} {value:.2f}  {trial.params}")
                heartbeat.track([])
                works.clear()
    except sqlalchemy.exc.OperationalError as exc:  # e.g. locked past the timeout by another process
        raise UsageError(f"storage {search.storage_url()}: {str(getattr(exc, 'orig', exc)).splitlines()[0]}; "
                         f"the trials in flight are taken over when the study runs again.") from None
    except KeyboardInterrupt:  # Ctrl-C (the heartbeat has stopped): the next process takes its trials over at once
        released = 0
        for work in in_flight:
            try:
                storage.set_trial_system_attr(trial_id(work.trial), HEARTBEAT_ATTR, RELEASED)
                released += 1
            except Exception:  # told already: nothing to hand back
                pass
        finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                               TrialState.FAIL)))
        raise Interrupted(f"{finished} of {search.n_trials} trial(s) of study {name} finished (kept in "
                          f"{search.storage_url()}; the {released} in flight are trained again)") from None
    if not trained:
        _say(progress, f"nothing left to run: the study already holds its {search.n_trials} trial(s)")
    return study, trained


def _default_batch(search: SearchConfig) -> int:
    from atlas_fast.engine.config import resolve_device
    from atlas_fast.engine.group import batches_runs
    from atlas_fast.methods.registry import method_class

    if resolve_device(search.base.device).type == "cuda" and batches_runs(method_class(search.base.method)):
        return max(1, GPU_GROUP_RUNS // len(search.seeds))
    return 1


def _work(search: SearchConfig, trial, reported: dict[int, float]):
    from atlas_fast.search.trials import TrialWork

    values = suggest(trial, search.space)
    configs = {d: [search.trial_config(values, d, seed) for seed in search.seeds] for d in search.datasets}
    return TrialWork(trial, configs, dict(reported))


def _tell(study, trial, progress: bool, **result) -> bool:
    """Tell the study a trial's end; False when another process, which took it over, had told it already (it is
    counted once)."""
    import optuna

    try:
        study.tell(trial, **result)
        return True
    except optuna.exceptions.UpdateFinishedTrialError:
        _say(progress, f"trial {trial.number}: already finished by another process")
        return False


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(f"[search] {text}", file=sys.stderr, flush=True)


__all__ = ["OBJECTIVES", "PRUNERS", "SAMPLERS", "SearchConfig", "SearchResult", "Range", "Choice", "preflight",
           "run_study", "run_trials"]
