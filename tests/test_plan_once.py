"""A run is planned once: one plan and one data fingerprint per run and one dataset listing per sweep, for a lone
run, a batched sweep and a Ray sweep (whose workers plan nothing); finished runs are found without training."""

import os
from pathlib import Path

import pytest

import counting
from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run
from atlas_fast.atlas.schedules import OneHot
from atlas_fast.atlas.variants import LabelVariant
from atlas_fast.sweep import Execution, run_grid
from helpers import assert_same_calibration, small_pets

pytestmark = pytest.mark.usefixtures("one_thread")
SEEDS = [1, 2, 3]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_pets(tmp_path_factory, "plan_once")


@pytest.fixture
def counts(tmp_path, monkeypatch):
    path = tmp_path / "counts.txt"
    monkeypatch.setenv(counting.COUNTS_VARIABLE, str(path))
    import atlas_fast.data.datasets as datasets
    import atlas_fast.data.identity as identity
    import atlas_fast.engine.pipeline as pipeline
    import atlas_fast.engine.spec as spec

    for module, name in ((spec, "load_run_data"), (datasets.DatasetSpec, "load"), (identity, "subset_fingerprint"),
                         (pipeline, "train_group")):
        monkeypatch.setattr(module, name, getattr(module, name))  # undone after the test
    counting.install()
    return path


def config(data, results, **changes):
    return TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=2, views=2,
                       device="cpu", cache_root=data / "cache", results_dir=data / results, progress=False,
                       content_hash=True, **changes)


def test_a_lone_run_plans_lists_and_fingerprints_once(data, counts):
    record = run(config(data, "lone"))
    assert not record["skipped"]
    assert counting.read(counts) == {"driver": {"plan": 1, "listing": 1, "fingerprint": 1, "train": 1},
                                     "workers": {}}


def test_a_batched_sweep_plans_each_run_once(data, counts):
    records = run_grid(config(data, "sweep"), ["OxfordPets"], [LabelVariant("CoOp", OneHot())], SEEDS, progress=False,
                       execution=Execution("local", batch_runs=3))
    assert [r["timings"]["batch_runs"] for r in records] == [3, 3, 3]
    expected = {"plan": 3, "listing": 1, "fingerprint": 3, "train": 1}  # one listing, one group of three
    assert counting.read(counts) == {"driver": expected, "workers": {}}
    run_grid(config(data, "sweep"), ["OxfordPets"], [LabelVariant("CoOp", OneHot())], SEEDS, progress=False,
             execution=Execution("local", batch_runs=3))  # all finished: planned again, nothing trained
    assert counting.read(counts)["driver"] == {"plan": 6, "listing": 2, "fingerprint": 6, "train": 1}


def test_ray_workers_plan_nothing(data, counts):
    import ray

    tests = str(Path(__file__).parent)
    package_root = str(Path(__file__).resolve().parents[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "counting.install",
                          "env_vars": {"PYTHONPATH": os.pathsep.join([tests, package_root]),
                                       counting.COUNTS_VARIABLE: str(counts)}})
    try:
        records = run_grid(config(data, "ray"), ["OxfordPets"], [LabelVariant("CoOp", OneHot())], SEEDS, progress=False,
                           execution=Execution("ray", batch_runs=1, options={"workers": 2}))
    finally:
        ray.shutdown()
    assert not any(r["skipped"] for r in records) and len({r["key"] for r in records}) == 3
    found = counting.read(counts)
    assert found["driver"] == {"plan": 3, "listing": 1, "fingerprint": 3}
    assert found["workers"] == {"train": 3}, f"Ray workers planned again (or did not train): {found['workers']}"


def test_a_group_reads_its_test_features_and_zero_shot_references_once(data, monkeypatch):
    """The test split does not depend on the seed: a group of three runs checks the test images against the cache,
    reads each evaluation set and computes the zero-shot references once, and each run's metrics are the lone run's."""
    import atlas_fast.engine.feed as feed
    import atlas_fast.engine.pipeline as pipeline

    calls = {"eval": 0, "zero_shot": 0}

    def counted(kind, function):
        def wrapper(*args, **kwargs):
            calls[kind] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(feed, "evaluation_set", counted("eval", feed.evaluation_set))
    monkeypatch.setattr(pipeline, "zero_shot_references", counted("zero_shot", pipeline.zero_shot_references))
    grouped = run_grid(config(data, "shared-eval"), ["OxfordPets"], [LabelVariant("CoOp", OneHot())], SEEDS,
                       progress=False, execution=Execution("local", batch_runs=3))
    # base, new and all, once for the group; and the base classes' validation split (the temperature's), once for the
    # three seeds here: every seed takes all of its images (fewer per class than the shots)
    assert calls == {"eval": 4, "zero_shot": 1}
    lone = run(config(data, "shared-eval-lone", seed=2))
    assert {k: v for k, v in lone["metrics"].items() if k != "calibration"} == (
        {k: v for k, v in grouped[1]["metrics"].items() if k != "calibration"})
    assert_same_calibration(lone["metrics"]["calibration"], grouped[1]["metrics"]["calibration"])


def test_a_group_checks_each_training_set_against_the_cache_once(data, monkeypatch):
    """A seed's label variants train on the same images: a group of 2 seeds x 2 variants checks the cache for the
    training views of each seed's images once (2 checks, not 4: PromptSRC's check covers all V + 1 views)."""
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.cache import FeatureCache

    checked = []
    real = FeatureCache.build

    def counted(self, backbone, dataset, items, num_views=0, **kwargs):
        if num_views > 0:  # training views (the test split is built at view 0)
            checked.append(tuple(d.impath for d in items))
        return real(self, backbone, dataset, items, num_views=num_views, **kwargs)

    monkeypatch.setattr(FeatureCache, "build", counted)
    variants = [LabelVariant("CoOp", OneHot()), LabelVariant("ls", Alternating(2), soft_label_preset("base2new", "ls"))]
    records = run_grid(config(data, "train-checks"), ["OxfordPets"], variants, SEEDS[:2], progress=False,
                       execution=Execution("local", batch_runs=4))
    assert [r["timings"]["batch_runs"] for r in records] == [4] * 4
    assert len(checked) == 2 and len(set(checked)) == 2
