"""``atlas-fast cache build|info`` end to end on a synthetic OxfordPets with the tiny random model."""

from __future__ import annotations

import re

import pytest

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.cache import FeatureCache
from atlas_fast.cli import main
from atlas_fast.data import fewshot_subset, load_dataset
from tests.layouts import make_oxford_pets


@pytest.fixture()
def data_root(tmp_path):
    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=5, n_val=3, n_test=2)
    return tmp_path / "data"


def run_build(data_root, cache_root, capsys, *extra: str) -> tuple[int, int]:
    """Run ``cache build``; return the (encoded, reused) totals it prints."""
    argv = ["cache", "build", "--dataset", "oxford_pets", "--data-root", str(data_root), "--model", "atlas-tiny",
            "--pretrained", "none", "--cache-root", str(cache_root), "--workers", "0", *extra]
    assert main(argv) == 0
    out = capsys.readouterr().out
    encoded, reused = re.search(r"Done: encoded (\d+), reused (\d+)", out).groups()
    return int(encoded), int(reused)


def test_build_twice_encodes_nothing_the_second_time(data_root, tmp_path, capsys):
    cache_root = tmp_path / "cache"
    shots = ["--shots", "2", "--seed", "1", "2", "--views", "2"]
    encoded, reused = run_build(data_root, cache_root, capsys, *shots)
    splits = load_dataset("OxfordPets", data_root)
    subsets = [fewshot_subset(splits, 2, seed) for seed in (1, 2)]
    train_keys = {d.key for s in subsets for d in s.train}
    eval_keys = {d.key for s in subsets for d in s.val + s.test} - train_keys
    assert encoded == 3 * len(train_keys) + len(eval_keys) and reused == 0
    assert run_build(data_root, cache_root, capsys, *shots) == (0, encoded)

    # The stored subsets are the ones the data module draws; the features load for every train view.
    backbone = load_backbone(BackboneConfig("atlas-tiny", None))
    train = list(subsets[0].train)
    features = FeatureCache(cache_root).load(backbone, "OxfordPets", train, views=[0, 1, 2])
    assert features.shape == (len(train), 3, backbone.embed_dim)
    assert len(list((cache_root / "OxfordPets" / "split_fewshot").glob("shot_2-seed_1-*.json"))) == 1

    assert main(["cache", "info", "--cache-root", str(cache_root)]) == 0
    table = capsys.readouterr().out
    assert "OxfordPets" in table and "atlas-tiny (random init)" in table and "1 file(s)" in table


def test_full_splits_and_base_classes(data_root, tmp_path, capsys):
    cache_root = tmp_path / "cache"
    # Base classes of the test split only: 2 of 4 classes x 2 test images, view 0.
    assert run_build(data_root, cache_root, capsys, "--split", "test", "--subsample", "base") == (4, 0)
    # All of train (20 images, views 0..1) and val/test: the 4 base test images are reused.
    assert run_build(data_root, cache_root, capsys, "--views", "1") == (20 * 2 + 12 + 8 - 4, 4)


def test_bad_arguments_are_reported(data_root, tmp_path, capsys):
    assert main(["cache", "build", "--dataset", "OxfordPets", "--data-root", str(data_root), "--shots", "4"]) == 2
    assert "error: --shots and --seeds go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cache", "build", "--dataset", "OxfordPets", "--data-root", str(data_root), "--split", "training"])
    assert "comma list of train,val,test" in capsys.readouterr().err
