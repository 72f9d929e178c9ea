"""Which table and row each record is (:func:`name_records`). Rows are grouped by dataset, then method (a block of
rows each, compared with its first row, the plain method), then variant (``CoOp``, ``+ ATLaS``,
``+ ATLaS-CSL``...: :func:`atlas_fast.report.rows.variant_name`); records of one variant whose configurations differ
otherwise (a sensitivity sweep's α, an ``--epochs`` override, another backbone) become separate rows named by what
differs, e.g. ``+ ATLaS-ISL (α=0.3)``, so they are never averaged together; a block without a plain-method row names
the method in each row (``KgCoOp + ATLaS-ISL``), and whatever else a row's runs change from the method's recipe or
the paper's presets follows in brackets (``[epochs=2, θ=0.3]``, :func:`atlas_fast.engine.deviations.run_deviations`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.engine.run_identity import NOT_IDENTITY
from atlas_fast.report.results_folder import warn

# Config fields that never make two records different variants: the grouping keys themselves, where the run ran,
# whether it was also evaluated after every epoch (which changes no final number), and what is not part of a run's
# identity (the class sets a legacy record names as evaluated: a run is one run whatever was evaluated).
_NOT_A_VARIANT = ("seed", "dataset", "setting", "shots", "method", "device", "eval_every_epoch", *NOT_IDENTITY)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"soft_labels.alpha": 0.1, ...}`` (lists as JSON text)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(value) if isinstance(value, list) else value}


def _signature(config: dict[str, Any]) -> dict[str, Any]:
    """The record's variant fields, with the defaults a record does not store filled in (a row of the default few-shot
    order reads ``fewshot_order=coop`` beside a CLIP-LoRA-order row, not ``None``)."""
    from atlas_fast.engine.deviations import UNSTORED_DEFAULTS

    flat = {**UNSTORED_DEFAULTS, **_flat(config)}
    return {k: v for k, v in flat.items() if k.split(".")[0] not in _NOT_A_VARIANT}


def _base_name(config: dict[str, Any]) -> str:
    from atlas_fast.report.rows import method_name, variant_name

    try:
        return variant_name(config)
    except (KeyError, TypeError, AttributeError):  # a schedule or soft-label kind this version does not name
        return f"{method_name(config['method'])} ({config['schedule'].get('name')})"


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """``soft_labels.alpha`` -> ``α``, ``recipe.epochs`` -> ``epochs`` (as the deviation marks print them,
    :data:`atlas_fast.engine.deviations.PRINTED_NAMES`); other keys by their last part unless two end alike (then
    the full dotted name)."""
    from atlas_fast.engine.deviations import PRINTED_NAMES

    ends = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: PRINTED_NAMES.get(k, e if ends.count(e) == 1 else k) for k, e in zip(keys, ends)}


def _value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _sortable(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, str(value))


def name_records(records: Sequence[dict[str, Any]], left_out: list[tuple[Path, str]] | None = None
                  ) -> list[dict[str, Any]]:
    """Records with ``name`` (the row: its name and the marks of what its runs change), ``row_name`` (the name
    alone), ``marks`` (those changes, :func:`atlas_fast.engine.deviations.run_deviations` less what the name says)
    and ``table`` (``(setting, shots)``), in table order (zero-shot CLIP first, then the registry's order; the plain
    method first in its block); one record per seed and row (of two, the newer, with a warning naming both files
    and the older appended to ``left_out`` when given)."""
    from atlas_fast.atlas.variants import row_order
    from atlas_fast.engine.deviations import UNSTORED_DEFAULTS, deviation_note, run_deviations
    from atlas_fast.methods import METHODS
    from atlas_fast.report.rows import method_name

    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    with_plain = set()  # (table, method) blocks that have a plain-method row to name the block
    for record in records:
        c = record["config"]
        groups[((c["setting"], c["shots"]), c["method"], _base_name(c))].append(record)
        if c["schedule"]["name"] == "onehot":
            with_plain.add(((c["setting"], c["shots"]), c["method"]))
    named = []
    for (table, method, base), members in groups.items():
        if (table, method) not in with_plain and base.startswith("+"):
            base = f"{method_name(method)} {base}"  # no "CoOp" row above it says whose "+ ATLaS" this is
        per_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in members:
            per_dataset[record["config"]["dataset"]].append(_signature(record["config"]))
        varying = sorted({k for sigs in per_dataset.values() for k in set().union(*sigs)
                          if len({json.dumps(s.get(k), sort_keys=True) for s in sigs}) > 1})
        names = _short_names(varying)
        for record in members:
            signature = _signature(record["config"])
            values = [signature.get(k) for k in varying]
            suffix = ", ".join(f"{names[k]}={_value_text(v)}" for k, v in zip(varying, values))
            name = f"{base} ({suffix})" if suffix else base
            marks = tuple((k, t) for k, t in run_deviations(record["config"]).items() if k not in varying)
            ranks = [(-1, "") if UNSTORED_DEFAULTS.get(k, ...) == v else _sortable(v) for k, v in zip(varying, values)]
            named.append({**record, "table": table, "name": name + deviation_note(record["config"], varying),
                             "row_name": name, "marks": marks, "_values": ranks})  # a default's row first

    registry = ["zsclip"] + [m for m in METHODS if m != "zsclip"]

    def order(record: dict[str, Any]) -> tuple:
        c = record["config"]
        schedule, soft = c["schedule"], (c.get("soft_labels") or {}).get("kind")
        return (record["table"][0], record["table"][1],
                registry.index(c["method"]) if c["method"] in registry else len(registry), c["method"],
                *row_order(schedule, soft), _sortable(schedule.get("period", 0)),
                record["_values"], record["name"], c["dataset"], c["seed"])

    kept: dict[tuple, dict[str, Any]] = {}
    for record in sorted(named, key=order):
        c = record["config"]
        key = (record["table"], c["dataset"], c["method"], record["name"], c["seed"])
        if key in kept:
            older, newer = sorted([kept[key], record], key=lambda r: str(r.get("created", "")))
            warn(f"two records of {c['dataset']} {record['name']} seed {c['seed']} (trained on other data or "
                  f"by another atlas_fast version?): using {newer['path']}, ignoring {older['path']}.")
            if left_out is not None:
                left_out.append((Path(older["path"]), f"an older record of the same row and seed as {newer['path']}"))
            kept[key] = newer
        else:
            kept[key] = record
    result = sorted(kept.values(), key=order)
    for record in result:
        record.pop("_values", None)
    return result
