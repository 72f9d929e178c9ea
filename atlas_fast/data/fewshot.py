"""Subsets of a dataset as the CoOp protocol derives them: K-shot sampling, then the base/new class split. The
draw (Dassl's ``generate_fewshot_dataset`` with a fresh ``random.Random(seed)``, never the global RNG), the stored
file and the base/new split are specified in docs/protocol.md (sections Few-shot sampling, Base and new classes).

Subsets are stored as portable JSON named by the fingerprint of the ordered (path, label) lists they were drawn
from, so an edited split file names another file and gets a fresh draw; a stored subset that does not fit its name
or the current lists is an error, never reused. A stored subset carries a BLAKE2b ``checksum``: one that fails it is
refused naming the file, not silently redrawn, so runs sharing a store use the same subset or stop. A subset without
a checksum (written by hand) is used with a warning; in a read-only folder the subset is drawn, used and not kept
(with a warning naming the file).

Both take an optional ``memo``: a dict kept with the full listing while a sweep is planned, so what every run of
the sweep derives alike from the shared lists is computed once per sweep rather than once per run; results are the
same.
"""

from __future__ import annotations

import errno
import json
import math
import random
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from atlas_fast.data.base import DatasetSplits, Datum, classnames_from
from atlas_fast.data.identity import items_fingerprint
from atlas_fast.files import JsonFileError, atomic_write, blake2b_hex, read_json
from atlas_fast.vocabulary import CLASS_SETS, FEWSHOT_ORDERS, FewShotOrder

MAX_VAL_SHOTS = 4
T = TypeVar("T")
# Seeds are 32-bit, as numpy's and Dassl's are (a larger one fails inside torch once a run seeds its generators).
MAX_SEED = 2**32 - 1


def sample_per_class(items: Sequence[Datum], num_shots: int, rng: random.Random, repeat: bool = False
                     ) -> list[Datum]:
    """Dassl's ``generate_fewshot_dataset`` on one list, drawing from ``rng``: a class short of ``num_shots`` gives
    all its items (``repeat=False``, Dassl's default) or ``num_shots`` drawn with replacement (``repeat=True``, the
    default of CLIP-LoRA's copy of it)."""
    by_label: dict[int, list[Datum]] = defaultdict(list)  # insertion order = order of first appearance
    for item in items:
        by_label[item.label].append(item)
    sampled: list[Datum] = []
    for group in by_label.values():
        if len(group) >= num_shots:
            sampled.extend(rng.sample(group, num_shots))
        else:
            sampled.extend(rng.choices(group, k=num_shots) if repeat else group)
    return sampled


def draw_subset(splits: DatasetSplits, num_shots: int, seed: int, order: FewShotOrder = "coop"
                ) -> tuple[list[Datum], list[Datum]]:
    """The K-shot training and min(K, 4)-shot validation lists of ``seed``, in ``order``: ``"coop"`` (training first,
    then validation; a list whose validation is its test list samples training only) or ``"clip-lora"``
    (validation first, a class short of the shots repeated; ImageNet draws K + min(K, 4) images of each class from
    its training list at once and trains on the first K)."""
    rng = random.Random(seed)
    val_shots = min(num_shots, MAX_VAL_SHOTS)
    if order == "coop":
        train = sample_per_class(splits.train, num_shots, rng)
        val = list(splits.val) if splits.val_is_test else sample_per_class(splits.val, val_shots, rng)
        return train, val
    if order != "clip-lora":
        raise ValueError(f"few-shot order must be one of {', '.join(FEWSHOT_ORDERS)}, got {order!r}.")
    if splits.val_is_test:
        by_label: dict[int, list[Datum]] = defaultdict(list)
        for item in splits.train:
            by_label[item.label].append(item)
        short = [(label, len(group)) for label, group in by_label.items() if len(group) < num_shots + val_shots]
        if short:
            raise ValueError(f"{splits.name}: class {short[0][0]} has {short[0][1]} training images, fewer than the "
                             f"{num_shots} + {val_shots} CLIP-LoRA's order draws from each class of a dataset whose "
                             f"validation list is its test list; use --fewshot-order coop or fewer --shots.")
        train = [d for group in by_label.values() for d in rng.sample(group, num_shots + val_shots)[:num_shots]]
        return train, list(splits.val)
    val = sample_per_class(splits.val, val_shots, rng, repeat=True)
    return sample_per_class(splits.train, num_shots, rng, repeat=True), val


def fewshot_source(splits: DatasetSplits) -> str:
    """Fingerprint (32 hex) of what a few-shot draw depends on: the ordered (key, label) lists of train and val."""
    return items_fingerprint(splits.train)[:16] + items_fingerprint(splits.val)[:16]


def fewshot_subset(splits: DatasetSplits, num_shots: int, seed: int,
                   store_dir: str | Path | None = None, memo: dict | None = None,
                   order: FewShotOrder = "coop") -> DatasetSplits:
    """K-shot train (and min(K, 4)-shot val) lists, sampled as Dassl does with ``seed``, test untouched.

    ``num_shots < 1`` returns ``splits`` unchanged, as do test-only datasets (no train list). With ``store_dir``,
    the subset is read from ``<store_dir>/shot_{K}-seed_{S}-<source fingerprint[:12]>.json`` when that file exists
    (and checked against the current lists) and written there otherwise. Must run before :func:`subsample_classes`,
    as in CoOp. A negative seed is refused: Python seeds ``Random(-1)`` exactly like ``Random(1)``. ``memo``: see the
    module docstring. ``order``: :func:`draw_subset`'s (stored as ``shot_{K}-seed_{S}-clip-lora-...``)."""
    if num_shots < 1 or not splits.train:
        return splits
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"few-shot seed must be an integer >= 0, got {seed!r} (Python's random.Random(-s) draws "
                         f"the same subset as random.Random(s)).")
    if seed > MAX_SEED:
        raise ValueError(f"few-shot seed must be at most {MAX_SEED} (32 bits), got {seed}.")
    if "shots" in splits.subset or splits.subset.get("classes", "all") != "all":
        raise ValueError(f"{splits.name}: few-shot sampling must run once, on the full class set and before "
                         f"subsample_classes (as in CoOp); these splits are already a subset: {splits.subset}")
    source = _memoized(memo, "fewshot_source", (splits.train, splits.val), lambda: fewshot_source(splits))
    tag = "" if order == "coop" else f"{order}-"
    path = (Path(store_dir) / f"shot_{num_shots}-seed_{seed}-{tag}{source[:12]}.json" if store_dir is not None
            else None)
    if path is not None and path.is_file():
        train, val = _load_stored(path, splits, num_shots, seed, source, memo)
    else:
        train, val = draw_subset(splits, num_shots, seed, order)
        if path is not None:
            try:
                _store(path, splits, num_shots, seed, source, train, None if splits.val_is_test else val)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                print(f"warning: few-shot subset {path} cannot be stored (the folder is read-only: "
                      f"{exc.strerror}); it is drawn from the seed and not kept.", file=sys.stderr)
    return replace(splits, train=tuple(train), val=tuple(val),
                   subset={**splits.subset, "shots": num_shots, "seed": seed,
                           **({"order": order} if order != "coop" else {})})


def shots_used(splits: DatasetSplits) -> dict[str, int]:
    """Fewest and most training images of any class (below K when a class has fewer than K images)."""
    counts: dict[int, int] = defaultdict(int)
    for d in splits.train:
        counts[d.label] += 1
    return {"min": min(counts.values(), default=0), "max": max(counts.values(), default=0)}


def _store(path: Path, splits: DatasetSplits, num_shots: int, seed: int, source: str, train: list[Datum],
           val: list[Datum] | None) -> None:
    """Write atomically (temporary file + rename) so concurrent runs never read a half-written subset."""
    record = {"dataset": splits.name, "shots": num_shots, "seed": seed, "source": source,
              "train": [d.key for d in train]}
    if val is not None:
        record["val"] = [d.key for d in val]
    record["checksum"] = _checksum(record)
    text = json.dumps(record, indent=0).encode()
    atomic_write(path, lambda f: f.write(text))


def _load_stored(path: Path, splits: DatasetSplits, num_shots: int, seed: int,
                 source: str, memo: dict | None = None) -> tuple[list[Datum], list[Datum]]:
    try:  # as large as its lists (kept in memory anyway), but never nested deeper than a subset is
        record = read_json(path, max_bytes=math.inf)
    except JsonFileError as exc:
        raise ValueError(f"stored few-shot subset {path} {exc.reason}; delete it to resample") from None
    expected = {"dataset": splits.name, "shots": num_shots, "seed": seed, "source": source}
    if not isinstance(record, dict):
        raise ValueError(f"stored few-shot subset {path} is not a JSON object; delete it to resample")
    found = {k: record.get(k) for k in expected}
    if found != expected or not isinstance(record.get("train"), list):
        raise ValueError(f"stored few-shot subset {path} is for {found}, not {expected}; delete it to resample")
    train = _lookup_keys(path, "train", record["train"], splits.train, memo)
    if splits.val_is_test:
        val = splits.val
    elif not isinstance(record.get("val"), list):
        raise ValueError(f"stored few-shot subset {path} has no 'val' list; delete it to resample")
    else:
        val = _lookup_keys(path, "val", record["val"], splits.val, memo)
    # Checked last, so that a subset of other data is named as such; what fails only here was damaged or edited.
    if "checksum" not in record:
        print(f"warning: stored few-shot subset {path} has no checksum (written by hand or by an older atlas_fast); "
              f"it is used after checking that its images are in the current lists.", file=sys.stderr)
    elif record["checksum"] != _checksum({k: v for k, v in record.items() if k != "checksum"}):
        raise ValueError(f"stored few-shot subset {path} fails its checksum: the file was damaged or edited after "
                         f"it was drawn; delete it to resample (the same seed draws the same subset)")
    return train, val


def _checksum(record: dict) -> str:
    """BLAKE2b of a subset's canonical JSON (without its ``checksum`` field)."""
    return blake2b_hex(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())


def _lookup_keys(path: Path, split: str, keys: list, items: Sequence[Datum], memo: dict | None = None
                 ) -> list[Datum]:
    wrong = next((k for k in keys if not isinstance(k, str)), None)
    if wrong is not None:
        shown = repr(wrong) if len(repr(wrong)) <= 60 else repr(wrong)[:60] + "..."
        raise ValueError(f"stored few-shot subset {path}: its '{split}' list holds {shown}, not an image path; "
                         f"delete it to resample")
    by_key = _memoized(memo, "by_key", (items,), lambda: _first_by_key(items))
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise ValueError(
            f"stored few-shot subset {path} is stale: {len(missing)} of its {len(keys)} '{split}' images are not in "
            f"the current {split} split (first: {missing[0]!r}); it was made from other data. Delete it to resample.")
    return [by_key[k] for k in keys]


def _first_by_key(items: Sequence[Datum]) -> dict[str, Datum]:
    by_key: dict[str, Datum] = {}
    for d in items:
        by_key.setdefault(d.key, d)
    return by_key


def _memoized(memo: dict | None, name: str, lists: tuple[Sequence[Datum], ...], compute: Callable[[], T],
              extra: tuple = ()) -> T:
    """``compute()``, once per ``memo``, ``name``, ``lists`` and ``extra``. The lists are matched by identity (a
    sweep's runs share the very list objects of its listing) and kept alive with the value, so their identities
    are never taken by other lists while the memo lives."""
    if memo is None:
        return compute()
    slot = (name, tuple(id(items) for items in lists), extra)
    if slot not in memo:
        memo[slot] = (lists, compute())
    return memo[slot][1]


def _relabeled(datum: Datum, label: int) -> Datum:
    """``dataclasses.replace(datum, label=label)``, 7x faster (every field copied; a few-shot plan relabels every
    test image of a dataset for base and new)."""
    copy = object.__new__(Datum)
    copy.__dict__.update(datum.__dict__, label=label)
    return copy


def subsample_classes(splits: DatasetSplits, subsample: str, memo: dict | None = None) -> DatasetSplits:
    """Keep the base (first ceil(n/2)) or new (remaining) classes of the train labels and relabel them from 0.

    ``"all"`` keeps every class and label. The same relabelling filters train, val and test; class names are rebuilt
    from the new train list, so a ``"new"`` model classifies among the new names only. ``memo``: see the module."""
    if subsample not in CLASS_SETS:
        raise ValueError(f"subsample must be one of {CLASS_SETS}, got {subsample!r}")
    if splits.subset.get("classes", "all") != "all":
        raise ValueError(f"{splits.name}: classes were already subsampled ({splits.subset}); start from 'all'")
    if subsample == "all":
        return replace(splits, subset={**splits.subset, "classes": "all"})
    if not splits.train:
        raise ValueError(f"{splits.name} is test-only: it has no train labels to split into base/new classes "
                         f"(use subsample 'all', as CoOp's variants ignore SUBSAMPLE_CLASSES)")
    labels = sorted({d.label for d in splits.train})
    m = math.ceil(len(labels) / 2)
    selected = labels[:m] if subsample == "base" else labels[m:]
    relabel = {old: new for new, old in enumerate(selected)}

    def keep(items: Sequence[Datum]) -> tuple[Datum, ...]:
        return tuple(_relabeled(d, relabel[d.label]) for d in items if d.label in relabel)

    def shared_keep(items: Sequence[Datum]) -> tuple[Datum, ...]:
        return _memoized(memo, "relabelled", (items,), lambda: keep(items), tuple(selected))

    train = keep(splits.train)
    return replace(splits, train=train, val=shared_keep(splits.val), test=shared_keep(splits.test),
                   classnames=classnames_from(train), subset={**splits.subset, "classes": subsample})
