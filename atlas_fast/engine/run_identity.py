"""What makes two runs the same run, with no heavy import (the report reads it).

A run is named by a hash of its described configuration, the backbone fingerprint and the data fingerprint
(:mod:`atlas_fast.engine.spec`). Which class sets are evaluated after training is not part of it: evaluation changes
no learned tensor, so a record evaluated on more sets answers a request for fewer, and a set a record lacks is
evaluated later on its saved prompts. A legacy record's ``"evaluate": [...]`` is left out by
:func:`record_identity`, so it and the same run's newer record have one identity.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from atlas_fast.vocabulary import CLASS_SETS

# Fields of a described configuration that never make two runs different.
NOT_IDENTITY = ("evaluate",)


def identity_fields(described: dict[str, Any]) -> dict[str, Any]:
    """``described`` without the fields that are not part of a run's identity."""
    return {k: v for k, v in described.items() if k not in NOT_IDENTITY}


def config_key(described: dict[str, Any], backbone_fingerprint: str) -> str:
    """A stable hash of the run's described configuration and the backbone fingerprint."""
    canonical = json.dumps({"config": described, "backbone": backbone_fingerprint}, sort_keys=True, default=str)
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def data_record_key(key: str, data_fingerprint: str) -> str:
    """The record's full key: the configuration key (:func:`config_key`) joined with the data fingerprint."""
    return hashlib.blake2b(f"{key}:{data_fingerprint}".encode(), digest_size=16).hexdigest()


def record_identity(record: dict[str, Any]) -> str:
    """The identity of the run a record holds: its key recomputed from its configuration (less the fields of
    :data:`NOT_IDENTITY`), backbone and data fingerprints. Equal to ``record["key"]`` for every record named since
    evaluation stopped naming runs; a legacy record named with ``evaluate`` gets the key its run has now."""
    key = config_key(identity_fields(record["config"]), record["backbone"]["fingerprint"])
    return data_record_key(key, record["data"]["fingerprint"])


def evaluated_sets(record: dict[str, Any]) -> list[str]:
    """The class sets a record holds final accuracies for, in base/new/all order."""
    metrics = record.get("metrics") or {}
    return [name for name in CLASS_SETS if name in metrics]


def one_record_per_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with each run once (by :func:`record_identity`): of several records of one run (a legacy record
    and its run's newer one), the one evaluated on the most class sets, then the newest; order kept otherwise.
    Records that lack what an identity needs are kept as they are."""
    best: dict[str, int] = {}
    for i, record in enumerate(records):
        try:
            identity = record_identity(record)
        except (KeyError, TypeError):
            identity = f"#{i}"
        rank = (len(evaluated_sets(record)), str(record.get("created", "")))
        kept = best.get(identity)
        if kept is None or rank > (len(evaluated_sets(records[kept])), str(records[kept].get("created", ""))):
            best[identity] = i
    keep = set(best.values())
    return [record for i, record in enumerate(records) if i in keep]
