"""What a run's configuration changes from its method's recipe and the paper's presets, as every printed name
shows it: ``[θ=0.3, epochs=2, views=1, backbone=atlas-tiny]``.

A name such as ``+ ATLaS-ISL`` names a variant, not the numbers it ran with; a run at θ = 0.3, shortened to 2 epochs
or on another backbone must not read like the paper's. :func:`run_deviations` compares a run's *described*
configuration with the paper's soft-label presets and ATLaS period for its setting, the method's recipe (and views =
epochs), and the paper's 16 shots (few-shot tables are per shot count) and backbone.

Only printed text uses it: names, keys and metrics of runs are unchanged. The keys are the record's dotted config
fields (``soft_labels.theta``, ``recipe.epochs``, ``schedule.period``...), so a report that already names a field
in its row (a sweep over α) can leave it out here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Iterable, Mapping, Sequence

# The paper's shots in the settings whose tables are not per shot count, and its backbone.
PAPER_SHOTS = 16
PAPER_BACKBONE = "ViT-B-16"
# How a field is printed (the soft labels' Greek letters as in the paper).
PRINTED_NAMES = {"soft_labels.theta": "θ", "soft_labels.tau_c": "τ_c", "soft_labels.alpha": "α",
                 "soft_labels.delta": "δ", "soft_labels.w": "w", "soft_labels.top_k": "top_k", "schedule.period": "K",
                 "recipe.epochs": "epochs", "recipe.iterations": "iterations", "recipe.batch_size": "batch",
                 "recipe.lr": "lr", "shots": "shots",
                 "views": "views", "backbone.model": "backbone"}


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _recipe(config: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The method's own method config and optimisation recipe for the run's family, setting, shots and dataset, as
    dicts (None where there is none)."""
    from atlas_fast.methods.config import MissingRecipe
    from atlas_fast.methods.registry import METHODS

    entry = METHODS.get(config.get("method", ""))
    if entry is None:
        return None, None
    try:
        method_config, recipe = entry.recipe_function(config.get("recipe_family", "paper"), config["setting"],
                                                      config["shots"], config["dataset"])
    except MissingRecipe as missing:  # no optimisation recipe; the method's config is still its own
        return dataclasses.asdict(missing.method_config) if missing.method_config is not None else None, None
    except (KeyError, ValueError, TypeError):
        return None, None
    return (dataclasses.asdict(method_config) if method_config is not None else None), dataclasses.asdict(recipe)


# Run fields a described configuration (a record's ``config``) holds only when they are not these defaults
# (:func:`atlas_fast.engine.spec.describe`): a record without one ran with the default.
UNSTORED_DEFAULTS = {"fewshot_order": "coop"}


def run_deviations(config: Mapping[str, Any]) -> dict[str, str]:
    """Dotted config field -> printed ``name=value`` for every field of ``config`` (a record's ``config``) that
    differs from its method's recipe or the paper's presets, in the order θ, τ_c, α, δ, w, top_k, K, epochs, batch,
    lr, shots, fewshot_order, views, backbone, then the method's options (``depth=2``: every field of its method
    config that is not the recipe's). Fields a record lacks are not compared."""
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.atlas.variants import ALTERNATION_PERIODS

    import atlas_fast.methods  # noqa: F401  (registers the methods)

    found: dict[str, Any] = {}
    setting = config.get("setting")
    soft = config.get("soft_labels")
    if isinstance(soft, Mapping) and setting in ALTERNATION_PERIODS:
        try:
            preset = dataclasses.asdict(soft_label_preset(setting, soft["kind"]))
        except (KeyError, ValueError, TypeError):
            preset = {}
        for name in ("theta", "tau_c", "alpha", "delta", "w", "top_k"):
            if name in preset and name in soft and soft[name] != preset[name]:
                found[f"soft_labels.{name}"] = soft[name]
    schedule = config.get("schedule") or {}
    if schedule.get("name") == "atlas" and setting in ALTERNATION_PERIODS:
        if schedule.get("period") != ALTERNATION_PERIODS[setting]:
            found["schedule.period"] = schedule.get("period")
    own_method, own = _recipe(config)
    recipe = config.get("recipe") or {}
    if own is not None:
        names = ["epochs", "batch_size", "lr"]
        if own.get("iterations"):  # a schedule over iterations: its epochs follow from the training images
            names.remove("epochs")
            if recipe.get("iterations", own["iterations"]) != own["iterations"]:  # shortened: say to what
                found["recipe.epochs"], found["recipe.iterations"] = recipe.get("epochs"), recipe["iterations"]
        for name in names:
            if name in recipe and recipe[name] != own[name]:
                found[f"recipe.{name}"] = recipe[name]
    if setting in ("base2new", "cross_dataset") and config.get("shots") not in (None, PAPER_SHOTS):
        found["shots"] = config["shots"]
    for name, default in UNSTORED_DEFAULTS.items():  # CLIP-LoRA's K-shot draw: other training images
        if config.get(name, default) != default:
            found[name] = config[name]
    if "views" in config and "epochs" in recipe and config["views"] != recipe["epochs"]:
        found["views"] = config["views"]
    model = (config.get("backbone") or {}).get("model")
    if model is not None and model != PAPER_BACKBONE:
        found["backbone.model"] = model
    method_config = config.get("method_config")
    if isinstance(method_config, Mapping) and own_method is not None:  # --method-option, KDPL's teacher, ...
        for name, value in method_config.items():
            if name in own_method and _json(value) != _json(own_method[name]):
                found[f"method_config.{name}"] = value
    return {key: f"{PRINTED_NAMES.get(key, key.rpartition('.')[2])}={_text(value)}" for key, value in found.items()}


def _json(value: Any) -> Any:
    """A value as a record stores it (tuples are lists in JSON), so a stored config compares equal to its own."""
    return list(value) if isinstance(value, tuple) else value


def _note(items: Iterable[str]) -> str:
    items = list(items)
    return f" [{', '.join(items)}]" if items else ""


def deviation_note(config: Mapping[str, Any], leave_out: Collection[str] = ()) -> str:
    """`` [θ=0.3, epochs=2]``: :func:`run_deviations` as a printed name's suffix (empty when the run follows the recipe
    and presets), without the fields ``leave_out`` (ones the name already says)."""
    return _note(text for key, text in run_deviations(config).items() if key not in leave_out)


def run_name(config: Mapping[str, Any]) -> str:
    """A run's printed name, the one place it is built: ``coop+ATLaS-ISL (K=2) [θ=0.3, epochs=2]``, its variant as
    the ``train`` command prints it (:func:`~atlas_fast.atlas.variants.run_variant_name`, which names K) and what it
    changes from its method's recipe and the paper's presets (:func:`deviation_note`). ``config`` is a run's
    described configuration (``RunSpec.described``, a record's ``config``)."""
    from atlas_fast.atlas.variants import run_variant_name

    name = run_variant_name(config["method"], config["schedule"], (config.get("soft_labels") or {}).get("kind"))
    return name + deviation_note(config, leave_out={"schedule.period"})  # run_variant_name names K


Deviations = tuple[tuple[str, str], ...]  # (dotted field, printed ``name=value``) pairs, each once


def runs_deviations(configs: Iterable[Mapping[str, Any]], leave_out: Collection[str] = ()) -> Deviations:
    """What the runs of one table row change (:func:`run_deviations` of each, first seen first; a field whose runs
    differ, e.g. per-dataset recipes, is listed with each value), without the fields ``leave_out``."""
    found: dict[tuple[str, str], None] = {}
    for config in configs:
        found.update({(key, text): None for key, text in run_deviations(config).items() if key not in leave_out})
    return tuple(found)


def table_marks(rows: Sequence[Deviations]) -> tuple[str, list[str]]:
    """The marks of a table whose rows' runs change ``rows`` (:func:`runs_deviations` per row): what every row
    changes alike, once for the table (`` [epochs=2, backbone=atlas-tiny]``, for its title), and per row the rest
    as the suffix of its name (`` [θ=0.3]``); both empty where nothing differs from the recipes and presets."""
    shared = [item for item in rows[0] if all(item in row for row in rows[1:])] if rows else []
    own = [_note(text for key, text in row if (key, text) not in shared) for row in rows]
    return _note(text for _, text in shared), own


def deviation_legend(table_note: str = "", in_title: bool = False) -> str:
    """The sentence that explains the marks: of rows (``[...] after a row's name: ...``) or, given the mark a whole
    table shares (:func:`table_marks`), of that table (naming it, or pointing at the title that shows it)."""
    if not table_note:
        return ("[...] after a row's name: what its runs change from the method's recipe or the paper's presets (θ, "
                "τ_c, α, δ, K, epochs, batch, lr, shots, views, backbone, the method's options)")
    where = "[...] after the title" if in_title else table_note.strip()
    return f"{where}: what every run of the table changes from its method's recipe or the paper's presets"
