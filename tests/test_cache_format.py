"""The feature cache's on-disk format, pinned: a file built today must be read by later code without a rebuild.

The names, attributes, dataset layouts and transform fingerprints checked here are what earlier versions wrote (the
values were taken from the code before the cache became a package); changing any of them orphans every cache that
users have built, so a change here must come with a format_version bump.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import atlas_fast
from atlas_fast.cache import FeatureCache
from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.clip.transforms import TransformSpec
from atlas_fast.data.base import Datum
from tests.layouts import make_oxford_pets

DATASET = "OxfordPets"
ATTRIBUTES = {"atlas_fast_version", "backbone_architecture", "backbone_config", "backbone_fingerprint", "created_utc",
              "dataset", "embed_dim", "encode_precision", "format", "format_version", "keys_digest", "preprocessing",
              "storage_dtype", "transform", "transform_fingerprint"}
# atlas-tiny: 32 px, OpenAI's mean/std. The fingerprint of each augmentation seed names the file.
TINY_TRANSFORM = {0: "5f264ad754bea8709a23df7c31c33890", 3: "a17ef6d63118da580392f6da39821304"}
TINY_PREPROCESSING = ('{"image_size": 32, "interpolation": "bicubic", "mean": [0.48145466, 0.4578275, 0.40821073], '
                      '"std": [0.26862954, 0.26130258, 0.27577711]}')


def tiny_transform_json(aug_seed: int) -> str:
    return ('{"aug_seed": %d, "mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, '
            '0.27577711], "version": 2, "view0": {"interpolation": "bicubic", "kind": '
            '"resize_shorter_side+center_crop", "size": 32}, "views1+": {"flip_p": 0.5, "interpolation": "bicubic", '
            '"kind": "random_resized_crop+horizontal_flip", "ratio": [0.75, 1.3333333333333333], "scale": [0.08, '
            '1.0], "seeding": "torch.Generator(blake2b(aug_seed, key, view))", "size": 32}}' % aug_seed)


@pytest.fixture(scope="module")
def backbone():
    return load_backbone(BackboneConfig("atlas-tiny", None))


@pytest.fixture(scope="module")
def items(tmp_path_factory) -> list[Datum]:
    folder = make_oxford_pets(tmp_path_factory.mktemp("data"), n_classes=2, n_train=3, n_val=0, n_test=1)
    split = json.loads((folder / "split_zhou_OxfordPets.json").read_text())["train"]
    return [Datum(str(folder / "images" / rel), label, name, f"images/{rel}") for rel, label, name in split]


@pytest.mark.parametrize("storage_dtype, aug_seed", [("float16", 0), ("float32", 3)])
def test_a_built_file_has_the_pinned_name_attributes_and_layout(tmp_path, backbone, items, storage_dtype, aug_seed):
    cache = FeatureCache(tmp_path / "cache", storage_dtype=storage_dtype)
    report = cache.build(backbone, DATASET, items, num_views=2, aug_seed=aug_seed, num_workers=0, device="cpu",
                         progress=False)
    name = f"{backbone.fingerprint[:12]}-{TINY_TRANSFORM[aug_seed][:12]}.h5"
    assert report.path == tmp_path / "cache" / DATASET / name
    assert sorted(p.name for p in report.path.parent.iterdir()) == [name, name + ".build.lock", name + ".lock"]

    with h5py.File(report.path, "r") as f:
        assert set(f.attrs) == ATTRIBUTES
        attrs = {k: v.item() if hasattr(v, "item") else v for k, v in f.attrs.items()}
        assert {k: attrs[k] for k in ATTRIBUTES - {"keys_digest", "created_utc"}} == {
            "format": "atlas_fast.feature_cache", "format_version": 2, "dataset": DATASET,
            "backbone_fingerprint": backbone.fingerprint,
            "backbone_config": '{"init_seed": 0, "model": "atlas-tiny", "pretrained": null}',
            "backbone_architecture": json.dumps(backbone.architecture, sort_keys=True),
            "transform_fingerprint": TINY_TRANSFORM[aug_seed], "transform": tiny_transform_json(aug_seed),
            "preprocessing": TINY_PREPROCESSING, "embed_dim": 64, "encode_precision": "fp32",
            "storage_dtype": storage_dtype, "atlas_fast_version": atlas_fast.__version__}
        assert datetime.fromisoformat(attrs["created_utc"]).utcoffset().total_seconds() == 0

        assert set(f) == {"keys", "image_ids", "features", "done"}
        layout = {n: (f[n].shape, str(f[n].dtype), f[n].chunks, f[n].maxshape, f[n].fletcher32) for n in f}
        n = len(items)
        assert layout == {"keys": ((n,), "object", (1024,), (None,), False),
                          "image_ids": ((n,), "object", (1024,), (None,), False),
                          "features": ((n, 3, 64), storage_dtype, (64, 1, 64), (None, None, 64), True),
                          "done": ((n, 3), "bool", (1024, 8), (None, None), True)}
        assert h5py.check_string_dtype(f["keys"].dtype).encoding == "utf-8"
        keys, ids = list(f["keys"].asstr()[...]), list(f["image_ids"].asstr()[...])
        assert sorted(keys) == sorted(d.key for d in items) and f["done"][...].all()
        by_key = {d.key: d for d in items}
        assert ids == [f"{os.stat(by_key[k].impath).st_size}:{os.stat(by_key[k].impath).st_mtime_ns}" for k in keys]
        digest = hashlib.blake2b(digest_size=16)
        digest.update("\n".join(keys).encode())
        digest.update(b"\0")
        digest.update("\n".join(ids).encode())
        assert attrs["keys_digest"] == digest.hexdigest()
        # Readable with h5py alone, as the format's documentation shows: row of a key, view v, cast to float32.
        row = {k: i for i, k in enumerate(keys)}
        by_hand = torch.from_numpy(np.stack([f["features"][row[d.key]].astype("float32") for d in items]))
    assert torch.equal(cache.load(backbone, DATASET, items, views=[0, 1, 2], aug_seed=aug_seed), by_hand)


def test_the_cache_reads_the_transform_the_backbone_carries(tmp_path, backbone, items, monkeypatch):
    assert backbone.transform == TransformSpec.from_preprocessing(backbone.preprocessing)
    assert backbone.transform_for(0) is backbone.transform
    assert backbone.transform_for(3) == TransformSpec.from_preprocessing(backbone.preprocessing, aug_seed=3)

    def derived_again(*args, **kwargs):
        raise AssertionError("the transform was derived again instead of read from the backbone")

    monkeypatch.setattr(TransformSpec, "from_preprocessing", derived_again)
    cache = FeatureCache(tmp_path / "cache")
    report = cache.build(backbone, DATASET, items, num_views=1, aug_seed=3, num_workers=0, progress=False)
    assert report.path.name.endswith(f"-{TINY_TRANSFORM[3][:12]}.h5")
    assert cache.load(backbone, DATASET, items, views=[0, 1], aug_seed=3).shape == (len(items), 2, 64)
    assert [e.transform_fingerprint for e in cache.entries()] == [TINY_TRANSFORM[3]]
