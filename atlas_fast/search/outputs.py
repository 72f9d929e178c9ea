"""What a study leaves a researcher: the trials table (CSV), Optuna's plots (optimisation history, parameter
importances, parallel coordinates; PNG and PDF), the best trial as a :class:`~atlas_fast.engine.config.TrainConfig`
(``best.json``) with the ``atlas-fast train`` line that reruns it (``best_command.txt``), and, after the study, the
best configuration retrained on the final seeds and tested: normal records that ``atlas-fast report`` reads.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shlex
import warnings
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.engine.config import TrainConfig
from atlas_fast.errors import UsageError
from atlas_fast.files import atomic_write
from atlas_fast.search.space import apply_values
from atlas_fast.search.study import SearchConfig, SearchResult
from atlas_fast.vocabulary import CLASS_SETS, GRAPH_STEPS

PLOTS = ("optimization_history", "param_importances", "parallel_coordinate")


def best_config(search: SearchConfig, params: dict[str, Any]) -> TrainConfig:
    """The base run with the best trial's values: a normal run (its record is tested and named as any other)."""
    return apply_values(search.base, params)


def command_line(config: TrainConfig, seeds: Sequence[int]) -> str:
    """The ``atlas-fast train`` line that trains ``config`` with ``seeds`` (the record names match)."""
    from atlas_fast.atlas.schedules import Alternating, Joint, OneHot

    pretrained = config.backbone.pretrained
    argv = ["atlas-fast", "train", "--dataset", config.dataset, "--data-root", str(config.data_root),
            "--model", config.backbone.model, "--pretrained", "none" if pretrained is None else str(pretrained),
            "--methods", config.method, "--recipe", config.recipe_family, "--setting", config.setting,
            "--shots", str(config.shots), "--seeds", *map(str, seeds)]
    if config.subsample is not None:
        argv += ["--subsample", config.subsample]
    soft = config.soft_labels
    if soft is not None:
        argv += ["--atlas", soft.kind, "--theta", repr(soft.theta), "--tau-c", repr(soft.tau_c),
                 "--alpha", repr(soft.alpha), "--delta", soft.delta, "--w", repr(soft.w)]
        if soft.top_k is not None:
            argv += ["--top-k", str(soft.top_k)]
    if isinstance(config.schedule, Alternating):
        argv += ["--K", str(config.schedule.period)]
    elif isinstance(config.schedule, Joint):
        argv += ["--schedule", "joint"]
    elif not isinstance(config.schedule, OneHot):
        raise UsageError(f"the {config.schedule.name!r} schedule has no command line here; rerun the best "
                         f"configuration from best.json in Python.")
    for name in ("epochs", "batch_size", "lr", "views"):
        value = getattr(config, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", repr(value) if isinstance(value, float) else str(value)]
    if config.aug_seed:
        argv += ["--aug-seed", str(config.aug_seed)]
    if config.method_config is not None:
        raise UsageError("a base run with a whole method_config object has no command line; use method_options.")
    if config.method_options:
        argv += ["--method-option", *(f"{config.method}:{k}={v}" for k, v in config.method_options.items())]
    if config.evaluate is not None:
        raise UsageError("a base run with an evaluate list has no command line here; rerun it in Python.")
    argv += ["--device", config.device, "--precision", config.precision, "--cache-root", str(config.cache_root),
             "--results-dir", str(config.results_dir)]
    if config.graph_steps is not None:  # the study's choice (flag or environment), kept by the rerun
        argv += ["--graph-steps", next(name for name, value in GRAPH_STEPS.items() if value is config.graph_steps)]
    return shlex.join(argv)


def config_json(config: TrainConfig) -> dict[str, Any]:
    """A TrainConfig as JSON (nested configs as dicts, the schedule described)."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if hasattr(value, "to_dict"):
            value = value.to_dict()
        elif f.name == "schedule":
            value = value.describe()
        elif dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        elif isinstance(value, Path):
            value = str(value)
        out[f.name] = value
    return out


def write_text(path: Path, text: str) -> None:
    """A study's output file, written atomically (a failure names the file and leaves it as it was)."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_trials_csv(study, path: Path) -> Path:
    """One row per trial: number, state, value, the parameters, epochs trained, seconds, error."""
    trials = study.get_trials(deepcopy=False)
    params = sorted({name for t in trials for name in t.params})
    handle = io.StringIO(newline="")
    writer = csv.writer(handle)
    writer.writerow(["number", "state", "value", *params, "last_step", "epochs", "seconds", "error"])
    for t in trials:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() \
            if t.datetime_complete and t.datetime_start else ""
        writer.writerow([t.number, t.state.name, "" if t.value is None else f"{t.value:.4f}",
                         *[t.params.get(name, "") for name in params],
                         "" if t.last_step is None else t.last_step, t.user_attrs.get("epochs", ""),
                         seconds if seconds == "" else f"{seconds:.2f}", t.user_attrs.get("error", "")])
    write_text(path, handle.getvalue())
    return path


def write_plots(study, folder: Path) -> dict[str, Path]:
    """Optuna's matplotlib plots as PNG and PDF; a plot the study cannot have yet (importances need two completed
    trials that differ) is left out with a note on stderr."""
    import sys

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as optuna_plots

    files = {}
    for name in PLOTS:
        kwargs = {}
        if name == "param_importances":  # PED-ANOVA needs nothing beyond Optuna (fANOVA needs scikit-learn)
            kwargs["evaluator"] = optuna.importance.PedAnovaImportanceEvaluator()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = getattr(optuna_plots, f"plot_{name}")(study, **kwargs)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            print(f"note: no {name} plot yet ({exc})", file=sys.stderr)
            continue
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        figure.set_size_inches(8, 5)
        figure.tight_layout()
        for suffix in ("png", "pdf"):
            path = folder / f"{name}.{suffix}"
            figure.savefig(path, dpi=120)
            files[f"{name}.{suffix}"] = path
        plt.close(figure)
    return files


def best_so_far(study) -> list[tuple[int, float]]:
    """(epochs spent, best value so far) after each finished trial, in the order trials finished: the curve a
    search is judged by against a grid's."""
    from optuna.trial import TrialState

    finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and t.datetime_complete]
    finished.sort(key=lambda t: (t.datetime_complete, t.number))
    spent, best, curve = 0, float("-inf"), []
    for t in finished:
        spent += int(t.user_attrs.get("epochs", 0))
        if t.state == TrialState.COMPLETE and t.value is not None:
            best = max(best, t.value)
        curve.append((spent, best))
    return curve


def write_outputs(search: SearchConfig, study) -> SearchResult:
    """Write the trials table, the plots, ``best.json`` and ``best_command.txt`` into the study's folder."""
    from optuna.trial import TrialState

    folder = search.folder()
    folder.mkdir(parents=True, exist_ok=True)
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not completed:
        raise UsageError(f"study {study.study_name}: no trial completed (all were pruned or failed); widen the space "
                         f"or use --pruner none.")
    best = study.best_trial
    config = best_config(search, best.params)
    seeds = tuple(search.final_seeds or search.seeds)
    command = command_line(dataclasses.replace(config, dataset=search.datasets[0]), seeds)
    files = {"trials.csv": write_trials_csv(study, folder / "trials.csv")}
    files.update(write_plots(study, folder))
    spent = sum(int(t.user_attrs.get("epochs", 0)) for t in study.get_trials(deepcopy=False))
    summary = {"study": study.study_name, "storage": search.storage_url(), "objective": search.objective,
               "split": "validation", "best_trial": best.number, "best_value": best.value, "best_params": best.params,
               "trials": len(study.get_trials(deepcopy=False)), "epochs_trained": spent,
               "states": {s.name: len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState},
               "best_config": config_json(config), "command": command}
    write_text(folder / "best.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_text(folder / "best_command.txt", command + "\n")
    files.update({"best.json": folder / "best.json", "best_command.txt": folder / "best_command.txt"})
    return SearchResult(study.study_name, search.storage_url(), dict(best.params), float(best.value), config,
                        command, files, trials=summary["trials"], epochs=spent)


def finalize(search: SearchConfig, result: SearchResult, progress: bool = True) -> list[dict[str, Any]]:
    """Retrain the best configuration on every dataset with the final seeds and test it (normal records, reused
    when they exist); writes ``final.md`` with the test metrics per dataset (mean over seeds)."""
    from atlas_fast.engine.evaluate import harmonic_mean
    from atlas_fast.sweep import Execution, run_configs

    seeds = tuple(search.final_seeds or search.seeds)
    configs = [dataclasses.replace(result.best_config, dataset=d, seed=s) for d in search.datasets for s in seeds]
    records = run_configs(configs, Execution("local"), progress=progress)
    lines = [f"Best of study {result.study_name} (validation {search.objective} {result.best_value:.2f}), "
             f"retrained with seeds {', '.join(map(str, seeds))} and tested:", ""]
    for dataset in search.datasets:
        rows = [r["metrics"] for r in records if r["config"]["dataset"] == dataset or r["data"]["dataset"] == dataset]
        names = [n for n in CLASS_SETS if rows and n in rows[0]]
        means = {n: sum(m[n] for m in rows) / len(rows) for n in names}
        if "base" in means and "new" in means:  # H of the mean accuracies, as the papers' tables do
            means["H"] = harmonic_mean(means["base"], means["new"])
        lines.append(f"- {dataset}: " + "  ".join(f"{n} {v:.2f}" for n, v in means.items()))
    lines += ["", f"records: {', '.join(str(r['path']) for r in records)}"]
    path = search.folder() / "final.md"
    write_text(path, "\n".join(lines) + "\n")
    result.files["final.md"] = path
    return records
