"""Result records: one JSON file per training run, plus the learned tensors beside it.

A record is named by a hash of the run's configuration, backbone fingerprint and data fingerprint
(:mod:`atlas_fast.data.identity`), so an identical run on unchanged data is skipped and a run on changed data never
returns another run's numbers. Files are written atomically. A record that fails validation
(:mod:`atlas_fast.engine.validity`) counts as missing, with a warning; writing the new one moves it aside
(``<name>.json.invalid-<time>``). This module is the one writer of records.

Layout under ``results_dir`` (default ``results/``)::

    <dataset>/<method>-<schedule>-<setting>-<shots>shot-seed<seed>-<hash12>.json   the record
    <dataset>/<method>-<schedule>-<setting>-<shots>shot-seed<seed>-<hash12>.pt     learned tensors (torch.save)
    <dataset>/<...>-<hash12>.predictions.npz   per-image predictions (``save_predictions`` only)

Record fields: ``key`` (full hash of configuration, backbone and data), ``config_key`` (configuration and backbone
only), ``status`` ("finished"), ``config``, ``backbone`` (fingerprint, architecture, description), ``data`` (dataset,
``fingerprint``, counts, ``shots_used``), ``metrics`` (final: base/new/all/H, ``calibration`` per class set, zero-shot
references), ``reliability`` (per class set, image count, correct predictions and summed confidence in each of the 15
confidence bins), ``epochs`` (per-epoch loss, lr, soft-label flag, optional accuracies, steps replayed and run
eagerly), ``timings`` (seconds per stage), ``graphs`` (:func:`graph_summary`), ``versions``, ``provenance``
(:func:`atlas_fast.engine.seal.provenance`), ``created`` (UTC ISO time), ``learned`` (file name of the ``.pt``),
``learned_blake2b`` (the checksum of its bytes, checked when it is read) and ``seal`` (the checksum of every other
field, :mod:`atlas_fast.engine.seal`; a record from before seals is used with a warning). With ``save_predictions``
the record also names its ``predictions`` file (``S_logits`` (N, C) float32 and ``S_labels`` (N,) int64 per
evaluated class set S, numpy's ``.npz``) and holds the checksum of its bytes (``predictions_blake2b``).

A run of a group that fails on its own gets no record but a failure note, ``<stem>.json.failed``
(:func:`save_failure`), which the report lists and a later record of the run replaces.
"""

from __future__ import annotations

import io
import json
import platform
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from atlas_fast.engine.run_identity import evaluated_sets, identity_fields
from atlas_fast.engine.seal import is_sealed, provenance, sealed
from atlas_fast.engine.validity import non_finite, read_record, stored_record_problems, warn_unsealed
from atlas_fast.files import atomic_write, blake2b_hex, check_folder_name, check_writable, file_blake2b

if TYPE_CHECKING:
    from atlas_fast.clip.backbones import Backbone
    from atlas_fast.engine.spec import RunSpec


def package_versions() -> dict[str, str]:
    """Versions of what determines the numbers, for the record."""
    import numpy
    import open_clip

    import atlas_fast

    return {"python": platform.python_version(), "torch": torch.__version__, "open_clip": open_clip.__version__,
            "numpy": numpy.__version__, "atlas_fast": atlas_fast.__version__}


FAILED_SUFFIX = ".failed"  # a failure note is <stem>.json.failed, beside where the record would be


@dataclass(frozen=True)
class FailedRun:
    """A run of a group that failed on its own and has no record: the reason (one line), where it diverged (None
    for a failure that is not a divergence), its failure note (None when it could not be written) and, in the
    process that failed, the exception (not sent from a worker)."""

    name: str
    stem: str
    dataset: str
    seed: int
    reason: str
    epoch: int | None = None
    step: int | None = None
    lr: float | None = None
    last_loss: float | None = None
    note: str | None = None
    error: BaseException | None = None

    def line(self) -> str:
        """``OxfordPets coop seed 2: Training diverged in epoch 1 (...)``: the run and why, for the error line."""
        return f"{self.name}: {self.reason}"

    def sendable(self) -> "FailedRun":
        """This failure without its exception object, to send from a worker process (only the message travels)."""
        return replace(self, error=None)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ResultStore:
    """Finished run records under ``root``, looked up by name stem (see the module docstring)."""

    def __init__(self, root: str | Path = "results") -> None:
        self.root = Path(root)

    def record_path(self, dataset: str, stem: str) -> Path:
        check_folder_name(dataset, self.root)
        return self.root / dataset / f"{stem}.json"

    def learned_path(self, dataset: str, stem: str) -> Path:
        return self.record_path(dataset, stem).with_suffix(".pt")

    def check_writable(self, dataset: str) -> None:
        """Raise ``PermissionError`` now, before training, if the record could not be written later."""
        check_writable(self.record_path(dataset, "x").parent, "The results folder")

    def find(self, dataset: str, stem: str, key: str | None = None) -> dict[str, Any] | None:
        """The finished record with this name (and full ``key``), or None; a lookup changes no file. A record
        without its learned tensors, or invalid (named in a warning), counts as missing."""
        path = self.record_path(dataset, stem)
        if not path.is_file():
            return None
        record, problems, _ = stored_record_problems(path, key)
        if problems:
            print(f"warning: result record {path} is invalid ({problems[0]}); the run will be redone (the record is "
                  f"moved aside when the new one is written).", file=sys.stderr)
            return None
        learned = self.learned_path(dataset, stem)
        if record is None or not learned.is_file():
            return None
        if "learned_blake2b" not in record:
            print(f"warning: result record {path} has no checksum of its learned tensors (written before "
                  f"atlas_fast stored one); {learned} is used unverified.", file=sys.stderr)
        if not is_sealed(record):
            warn_unsealed(path)
        return record

    def predictions_path(self, dataset: str, stem: str) -> Path:
        return self.record_path(dataset, stem).with_suffix(PREDICTIONS_SUFFIX)

    def save(self, dataset: str, stem: str, record: dict[str, Any], learned: dict[str, torch.Tensor],
             predictions: dict[str, Any] | None = None) -> Path:
        """Write the learned tensors, then the record (so a record never points at a missing ``.pt``). A record
        with non-finite metrics is refused (not valid JSON). An invalid record already under the name is moved aside
        first (its tensors too when they are the damaged part); a valid one is replaced."""
        bad = non_finite(record.get("metrics", {}))
        if bad:
            raise ValueError(f"Run {stem}: metric(s) {', '.join(bad)} are not finite numbers (NaN/inf); the record is "
                             f"not written. An evaluation set without test images gives this.")
        learned_path = self.learned_path(dataset, stem)
        buffer = io.BytesIO()
        torch.save(learned, buffer)
        payload = buffer.getvalue()
        saved_predictions = None
        if predictions is not None:
            saved_predictions = predictions_bytes(predictions)
            record = {**record, "predictions": self.predictions_path(dataset, stem).name,
                      "predictions_blake2b": blake2b_hex(saved_predictions)}
        # The record's text is made first: a value JSON cannot hold raises here, before any file is written.
        try:
            record = sealed({**record, "status": "finished", "learned": learned_path.name,
                             "learned_blake2b": blake2b_hex(payload)})
        except ValueError as exc:  # a NaN or infinity in the configuration or the per-epoch values
            raise ValueError(f"Run {stem}: its record cannot be written as JSON ({exc}); nothing was written.") from exc
        text = json.dumps(record, indent=2, sort_keys=False, allow_nan=False).encode()
        path = self.record_path(dataset, stem)
        self._move_invalid_aside(path, record.get("key"))
        atomic_write(learned_path, lambda f: f.write(payload))
        if saved_predictions is not None:
            atomic_write(self.predictions_path(dataset, stem), lambda f: f.write(saved_predictions))
        atomic_write(path, lambda f: f.write(text))
        path.with_name(path.name + FAILED_SUFFIX).unlink(missing_ok=True)  # an earlier failure of the run: redone
        return path

    @staticmethod
    def _move_invalid_aside(path: Path, key: str | None) -> None:
        """Move an invalid record at ``path`` aside with a warning, so the record being written does not destroy it."""
        if not path.is_file():
            return
        _, problems, damaged = stored_record_problems(path, key)
        if not problems:
            return
        time_tag = utc_now().replace(":", "")
        aside = path.with_name(f"{path.name}.invalid-{time_tag}")
        path.replace(aside)
        moved = aside.name
        learned = path.with_suffix(".pt")
        if damaged:
            learned.replace(learned.with_name(f"{learned.name}.invalid-{time_tag}"))
            moved = f"{aside.name} (and its tensors to {learned.name}.invalid-{time_tag})"
        print(f"warning: result record {path} was invalid ({problems[0]}); moved it to {moved} before writing the "
              f"run's new record.", file=sys.stderr)


def build_record(spec: RunSpec, backbone: Backbone, metrics: dict[str, Any], epochs: list[dict[str, Any]],
                 timings: dict[str, float]) -> dict[str, Any]:
    """A run's record (the fields of the module docstring, less ``status`` and ``learned``, which
    :meth:`ResultStore.save` adds)."""
    config = spec.config
    return {
        "key": spec.record_key, "config_key": spec.config_key, "created": utc_now(), "config": spec.described,
        "backbone": {"fingerprint": backbone.fingerprint, "description": backbone.describe(),
                     "architecture": backbone.architecture},
        "paths": {"data_root": str(config.data_root), "cache_root": str(config.cache_root)},
        "data": spec.data.describe(config.content_hash), "metrics": metrics, "epochs": epochs, "timings": timings,
        "graphs": graph_summary(epochs), "versions": package_versions(), "provenance": provenance(spec.device),
    }


def graph_summary(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """The record's ``graphs``: whether the steps were CUDA-graphed (``on``), and if so the steps replayed
    (``graphed_steps``) and run eagerly (``eager_steps``), and why the graphs fell back (``fallback``, or None)."""
    if not any("graphed_steps" in epoch for epoch in epochs):
        return {"on": False}
    return {"on": True, "graphed_steps": sum(epoch.get("graphed_steps", 0) for epoch in epochs),
            "eager_steps": sum(epoch.get("eager_steps", 0) for epoch in epochs),
            "fallback": next((epoch["graph_fallback"] for epoch in epochs if "graph_fallback" in epoch), None)}


def _rounded(value: Any) -> Any:
    """``value`` with every float at 6 significant digits (lists and dicts inside it too)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rounded(item) for item in value)
    return value


class RunRecord(dict):
    """A record as the Python API returns it: the stored dict, values unchanged, printed with floats at 6 significant
    digits so ``print(record)`` shows no float32 noise."""

    def __repr__(self) -> str:
        return repr(_rounded(dict(self)))

    __str__ = __repr__


def finished_record(spec: RunSpec) -> dict[str, Any] | None:
    """The finished record of an identical earlier run on the same data, marked ``skipped``, or None."""
    store = ResultStore(spec.config.results_dir)
    record = store.find(spec.dataset, spec.stem, key=spec.record_key)
    if record is None:
        return None
    return {**record, "skipped": True, "path": str(store.record_path(spec.dataset, spec.stem))}


def save_failure(spec: RunSpec, reason: str, error: BaseException | None = None, divergence: Any = None
                 ) -> FailedRun:
    """Write the failure note of a run (``<stem>.json.failed``) and return it as a :class:`FailedRun`;
    ``divergence`` (:class:`~atlas_fast.engine.loop.Divergence`) says where it diverged. A note that cannot be written
    is said in the reason; the failure is returned anyway."""
    where = {} if divergence is None else {"epoch": divergence.epoch, "step": divergence.step,
                                           "lr": divergence.lr, "last_loss": divergence.last_loss}
    failed = FailedRun(spec.name, spec.stem, spec.dataset, spec.config.seed, reason.splitlines()[0] if reason
                       else "failed", error=error, **where)
    store = ResultStore(spec.config.results_dir)
    path = store.record_path(spec.dataset, spec.stem)
    note = path.with_name(path.name + FAILED_SUFFIX)
    fields = {"status": "failed", "key": spec.record_key, "name": spec.name, "dataset": spec.dataset,
              "method": spec.config.method, "seed": spec.config.seed, "reason": failed.reason,
              **{("last_finite_loss" if k == "last_loss" else k): v for k, v in where.items()}, "created": utc_now()}
    try:
        text = json.dumps(fields, indent=2, default=str).encode()  # NaN/inf as JSON's NaN: a note, not a record
        atomic_write(note, lambda f: f.write(text))
    except OSError as exc:
        return replace(failed, reason=f"{failed.reason} (its failure note {note} could not be written: {exc})")
    return replace(failed, note=str(note))


def save_record(spec: RunSpec, record: dict[str, Any], learned: dict[str, torch.Tensor],
                predictions: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write a trained run's record and learned tensors (and its per-image ``predictions`` when given); returns the
    record as a run returns it."""
    path = ResultStore(spec.config.results_dir).save(spec.dataset, spec.stem, record, learned, predictions)
    return {**record, "status": "finished", "skipped": False, "path": str(path)}


# What ResultStore.save (status, the learned file and its checksum, the seal) and a returned run (skipped, path) add
# to a record's own fields.
ADDED_FIELDS = ("status", "learned", "learned_blake2b", "seal", "skipped", "path")


def rewrite_record(spec: RunSpec, stem: str, record: dict[str, Any], learned: dict[str, torch.Tensor],
                   predictions: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write a finished run's record (as read or returned, with changes) again under ``stem``, sealed anew, with new
    ``predictions`` when given; returns it as a skipped run returns it."""
    fields = {k: v for k, v in record.items() if k not in ADDED_FIELDS}
    path = ResultStore(spec.config.results_dir).save(spec.dataset, stem, fields, learned, predictions)
    return {**read_record(path), "skipped": True, "path": str(path)}


def adopt_legacy_record(spec: RunSpec) -> dict[str, Any] | None:
    """The run's finished record under a name it had before evaluation stopped naming runs (the fullest one), written
    again under the run's name (the old files stay; the report counts the run once), or None."""
    store = ResultStore(spec.config.results_dir)
    found = []
    for stem, key in spec.legacy_stems():
        record = store.find(spec.dataset, stem, key=key)
        if record is not None:
            found.append((len(evaluated_sets(record)), stem, record))
    if not found:
        return None
    _, stem, record = max(found, key=lambda item: item[0])
    learned = load_learned(store.record_path(spec.dataset, stem))
    adopted = {**record, "key": spec.record_key, "config_key": spec.config_key,
               "config": identity_fields(record["config"]), "adopted_from": f"{stem}.json"}
    return rewrite_record(spec, spec.stem, adopted, learned)


# Per-image predictions saved beside a record (``save_predictions``).
PREDICTIONS_SUFFIX = ".predictions.npz"


def predictions_bytes(arrays: dict[str, Any]) -> bytes:
    """The ``.npz`` bytes of named arrays (uncompressed: N x C float32 logits do not compress much, and reading
    them back needs no inflating)."""
    import numpy

    buffer = io.BytesIO()
    numpy.savez(buffer, **arrays)
    return buffer.getvalue()


# Snapshots (TrainConfig.snapshot_epochs) sit in the final tensors' file as ``snapshot.<epochs>.<tensor name>``.
SNAPSHOT_PREFIX = "snapshot."


def with_snapshots(final: dict[str, torch.Tensor], snapshots: dict[int, dict[str, torch.Tensor]]
                   ) -> dict[str, torch.Tensor]:
    """One state to save: the final tensors and each snapshot's under ``snapshot.<epochs>.<name>``."""
    return {**final, **{f"{SNAPSHOT_PREFIX}{epochs}.{name}": tensor for epochs, state in snapshots.items()
                        for name, tensor in state.items()}}


def split_snapshots(learned: dict[str, torch.Tensor]
                    ) -> tuple[dict[str, torch.Tensor], dict[int, dict[str, torch.Tensor]]]:
    """The final learned tensors and the snapshots by number of finished epochs (see :func:`with_snapshots`)."""
    final: dict[str, torch.Tensor] = {}
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in learned.items():
        if key.startswith(SNAPSHOT_PREFIX):
            epochs, name = key[len(SNAPSHOT_PREFIX):].split(".", 1)
            snapshots.setdefault(int(epochs), {})[name] = tensor
        else:
            final[key] = tensor
    return final, dict(sorted(snapshots.items()))


def load_learned(record_path: str | Path) -> dict[str, torch.Tensor]:
    """The learned tensors saved beside a record, checked against its ``learned_blake2b`` (unverified, with a warning,
    when the record has none)."""
    record_path = Path(record_path)
    record = read_record(record_path)
    learned = record_path.with_name(record.get("learned", record_path.with_suffix(".pt").name))
    if not learned.is_file():
        raise FileNotFoundError(f"Learned tensors {learned} for record {record_path} are missing.")
    if "learned_blake2b" in record:
        if file_blake2b(learned) != record["learned_blake2b"]:
            raise ValueError(f"Learned tensors {learned} of record {record_path} fail their checksum "
                             f"(learned_blake2b): the file is damaged or was replaced. Train the run again.")
    else:
        print(f"warning: record {record_path} has no checksum of its learned tensors (written before atlas_fast "
              f"stored one); {learned} is loaded unverified.", file=sys.stderr)
    try:
        return torch.load(learned, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, garbage, or pickled code (never executed)
        raise ValueError(f"Learned tensors {learned} of record {record_path} cannot be read ({type(exc).__name__}): "
                         f"the file is damaged or not a tensor checkpoint. Train the run again.") from exc
