"""The units a plan needs, each under its key (:mod:`~atlas_fast.pricing.unit_keys`), and measuring them: :func:`needed_units` lists the keys :func:`~atlas_fast.pricing.estimate.price` reads
for a plan's facts; :func:`measure_units` reads each from the calibration store
(:mod:`atlas_fast.pricing.calibration`) or measures it once on this machine (:mod:`atlas_fast.pricing.units`, a
run's; :mod:`atlas_fast.pricing.command_units`, the command's around its runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from atlas_fast.pricing.facts import PlanFacts
from atlas_fast.pricing.timing import Unit
from atlas_fast.pricing.unit_keys import (CUT_KEY, DECODE_KEY, ENCODE_KEY, EXIT_KEY, LOAD_KEY, LOADER_KEY, REPORT_KEY,
                                          ZERO_SHOT, config_digest, encode_key, eval_key, overhead_key, soft_key,
                                          step_key)

DECODE_SAMPLE = 8  # image files of a dataset its decode unit is timed on
EVAL_IMAGES_FACTOR = 4  # an evaluation unit is timed on up to this many times the plan's largest test set
EVAL_IMAGES_FLOOR = 256  # ... and on at least this many images


def encode_parts(facts: PlanFacts) -> tuple[tuple[str, int, int, int], ...]:
    """(cut unit, views per encoder batch, features, images) of what the cache build encodes: only the parts with
    features to encode (a dataset whose cache is already full, e.g. the demo's, needs no decode unit and is priced at
    nothing)."""
    from atlas_fast.cache.build import BATCH_VIEWS

    parts = facts.encode_parts or ((CUT_KEY, BATCH_VIEWS, facts.features_to_encode, facts.images_to_decode),)
    return tuple(part for part in parts if part[2])


def needed_units(facts: PlanFacts) -> list[str]:
    """Every unit key :func:`price` reads for ``facts``, each once, in a fixed order."""
    keys: list[str] = [LOAD_KEY] + ([REPORT_KEY] if facts.report else [])
    for cut, batch, _, _ in encode_parts(facts):
        keys += [encode_key(batch), cut]
    for g in facts.groups:
        if g.learns:
            keys.append(step_key(g.method, g.classes, g.batch, g.runs, g.config_digest))
            if g.trunk_epochs:
                keys.append(step_key(g.method, g.classes, g.batch, g.trunk_runs, g.config_digest))
        keys.append(overhead_key(g.method, g.classes, g.config_digest))
        for e in g.eval_sets:
            keys += [eval_key(g.method, e.classes, g.config_digest, g.runs), eval_key(ZERO_SHOT, e.classes)]
        if g.reads_pixels:
            keys += [g.decode, LOADER_KEY]
        for kind, images in zip(g.soft_labels, g.train_images):
            if kind not in (None, "ls"):
                keys.append(soft_key(kind, g.classes, images))
    if facts.ends_process:  # last: timed once this process holds what the others loaded, as the run's will
        keys.append(EXIT_KEY)
    return list(dict.fromkeys(keys))


def measure_units(facts: PlanFacts, store, backbone, specs: Sequence[Any],
                  report: Callable[[Path], Any] | None = None) -> dict[str, Unit]:
    """Every unit :func:`price` needs for ``facts``, from ``store`` (a
    :class:`~atlas_fast.pricing.calibration.CalibrationStore`) or measured now on ``backbone`` with the planned runs'
    class names and method configs (``specs``); ``report`` writes a sample of the command's report into a folder
    (the report unit's work, when ``facts.report``)."""
    from atlas_fast.pricing import command_units, units as measure

    configs = {config_digest(s.method_config): s.method_config for s in specs}
    names: dict[int, list[str]] = {}
    for spec in specs:
        for split in spec.data.splits.values():
            names.setdefault(split.num_classes, list(split.classnames))
    amp = bool(specs[0].amp) if specs else False
    samples: dict[str, list[str]] = {}
    for spec in specs:
        files = [d.impath for d in (*spec.data.train_split.train[:DECODE_SAMPLE // 2],
                                    *spec.data.fewshot.test[:DECODE_SAMPLE // 2])]
        samples.setdefault(spec.dataset, files[:DECODE_SAMPLE])

    def classnames(count: int) -> list[str]:
        return names.get(count) or measure.synthetic_classnames(count)

    def measurer(key: str):
        kind, *rest = key.split("/")
        if key == LOAD_KEY:
            return lambda: command_units.measure_backbone_load(backbone.config, backbone.device)
        if key == REPORT_KEY:
            return lambda: command_units.measure_report(report)
        if key == EXIT_KEY:
            return command_units.measure_exit
        if kind in (DECODE_KEY, CUT_KEY):  # on a sample of the dataset's own files, train and test, where named
            files = samples[rest[0]] if rest else ()
            return lambda: command_units.measure_decode(backbone, images=files, pixels=kind == CUT_KEY)
        if key == LOADER_KEY:
            return lambda: command_units.measure_loader_start(backbone)
        fields = {part.split("=")[0]: part.split("=")[1] for part in rest if "=" in part}
        digest = rest[-1] if kind in ("step", "eval", "overhead") else ""
        config = configs.get(digest)
        if kind == ENCODE_KEY:
            return lambda: command_units.measure_encode(backbone, batch=int(fields["B"]))
        classes = int(fields["C"])
        if kind == "step":
            return lambda: measure.measure_step(backbone, rest[0], classnames(classes), int(fields["B"]),
                                                int(fields["R"]), config=config, amp=amp)
        if kind == "eval":
            return lambda: measure.measure_eval(backbone, rest[0], classnames(classes), config=config, amp=amp,
                                                runs=int(fields.get("R", 1)), max_images=eval_images(key))
        if kind == "overhead":
            return lambda: measure.measure_run_overhead(backbone, rest[0], classnames(classes), config=config)
        if kind == "soft":
            return lambda: measure.measure_soft_labels(backbone, rest[0], classnames(classes), int(fields["N"]))
        raise ValueError(f"unknown unit key {key!r}")

    # an evaluation unit is timed on up to EVAL_IMAGES_FACTOR x the largest test set the plan evaluates with it (a
    # stored one timed on fewer is measured again): the calibration of a small job stays small
    tested: dict[str, int] = {}
    for g in facts.groups:
        for e in g.eval_sets:
            for key in (eval_key(g.method, e.classes, g.config_digest, g.runs), eval_key(ZERO_SHOT, e.classes)):
                tested[key] = max(tested.get(key, 0), e.images)

    def eval_images(key: str) -> int:
        return min(measure.MAX_EVAL_IMAGES, max(EVAL_IMAGES_FLOOR, EVAL_IMAGES_FACTOR * tested.get(key, 0)))

    def enough(key: str):
        if key not in tested:
            return None
        return lambda unit: not unit.images or unit.images >= eval_images(key)  # 0: timed before the cap

    return {key: store.unit(key, measurer(key), enough(key)) for key in needed_units(facts)}
