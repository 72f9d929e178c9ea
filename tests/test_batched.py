"""R runs trained as one module give the records of the same runs trained alone: learned tensors, per-epoch losses
and metrics at 1e-5, for runs that differ in seed, shots (training-set size), label schedule and soft labels. The
methods are every registered one that batches on cached features (tests/registry_cases.py says which run by
default)."""


import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine.group import stack_runs
from atlas_fast.engine.pipeline import run_group
from atlas_fast.methods.registry import method_class
from atlas_fast.methods.coop import CoOpConfig
from atlas_fast.engine.record import load_learned
from atlas_fast.atlas.schedules import Alternating, OneHot, OnlineLabelSmoothing
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.engine import TrainConfig, run
from helpers import assert_same_calibration
from layouts import make_oxford_pets
from registry_cases import batches_cached_features, cases, small_options

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched")
    make_oxford_pets(root / "data", n_classes=6, n_train=7, n_val=2, n_test=3, size=32)
    return root


def _configs(root, results, method_config=None, method="coop", method_options=None):
    common = dict(dataset="OxfordPets", data_root=root / "data", backbone=BackboneConfig("atlas-tiny", None),
                  method=method, epochs=4, views=2, batch_size=4, lr=0.05, device="cpu", cache_root=root / "cache",
                  results_dir=root / results, progress=False, method_config=method_config,
                  method_options=method_options or None)
    if not method_class(method).uses_labels:  # a label-free method's runs differ in seed and shots only
        return [TrainConfig(**common, seed=seed, shots=shots) for seed, shots in ((1, 5), (2, 2), (3, 7), (1, 4))]
    return [
        TrainConfig(**common, seed=1, shots=5, schedule=OneHot()),
        TrainConfig(**common, seed=2, shots=2, schedule=Alternating(2), soft_labels=soft_label_preset("base2new", "csl")),
        TrainConfig(**common, seed=3, shots=7, schedule=Alternating(1), soft_labels=soft_label_preset("base2new", "isl"),
                    eval_every_epoch=True),
        TrainConfig(**common, seed=1, shots=4, schedule=OnlineLabelSmoothing()),
    ]


def _assert_equal_records(batched, alone, noisy=False):
    """Batched records equal lone ones: learned tensors to 1e-5 and calibration figures to 1e-3, or for a ``noisy``
    method (:data:`registry_cases.NOISY`) to 2e-4 and 2e-3."""
    for b, a in zip(batched, alone):
        assert b["key"] == a["key"] and b["path"] != a["path"] and b["config"] == a["config"]
        assert b["data"] == a["data"]
        assert [e["loss"] for e in b["epochs"]] == pytest.approx([e["loss"] for e in a["epochs"]], abs=1e-5)
        assert [e["soft"] for e in b["epochs"]] == [e["soft"] for e in a["epochs"]]
        assert b["metrics"].keys() == a["metrics"].keys()
        for name in b["metrics"].keys() - {"zero_shot", "calibration"}:
            assert b["metrics"][name] == pytest.approx(a["metrics"][name], abs=1e-5)
        assert b["metrics"]["zero_shot"] == a["metrics"]["zero_shot"]
        assert_same_calibration(b["metrics"]["calibration"], a["metrics"]["calibration"], abs=2e-3 if noisy else 1e-3)
        per_epoch = [e.get("accuracy") for e in b["epochs"]]
        assert per_epoch == [e.get("accuracy") for e in a["epochs"]]
        for name, tensor in load_learned(b["path"]).items():
            # float32 defaults: atol 1e-5 plus rtol 1.3e-6 (float reordering in the R x C text pass on values ~10)
            torch.testing.assert_close(tensor, load_learned(a["path"])[name], atol=2e-4 if noisy else 1e-5,
                                       rtol=1.3e-6, msg=lambda text, name=name: f"{name}: {text}")


@pytest.mark.parametrize("method", cases(batches_cached_features))
def test_batched_runs_equal_runs_trained_alone(pets, method):
    _check_batched_equals_alone(pets, method, None, f"{method}-recipe")


def test_batched_runs_with_class_specific_random_contexts_equal_runs_trained_alone(pets):
    """CoOp's other initialisation (random class-specific contexts) batches as its paper init does."""
    _check_batched_equals_alone(pets, "coop", CoOpConfig(n_ctx=3, csc=True), "coop-csc")


def _check_batched_equals_alone(pets, method, method_config, suffix):
    options = small_options(method, pets / "data", []) if method_config is None else {}
    alone = [run(config) for config in _configs(pets, f"alone-{suffix}", method_config, method, options)]
    assert len({r["data"]["num_train"] for r in alone}) == 4  # the training sets differ in size
    batched = run_group(_configs(pets, f"batched-{suffix}", method_config, method, options))
    assert all(r["timings"]["batch_runs"] == 4 for r in batched)
    _assert_equal_records(batched, alone)
    # the learned tensors moved away from their (seeded) initialisation, differently per run
    first, second = (load_learned(r["path"]) for r in batched[:2])
    assert any(not torch.allclose(first[name], second[name]) for name in first)


@pytest.mark.parametrize("method", ["kgcoop"])  # the engine's split, the same for any method
def test_methods_that_cannot_batch_train_their_runs_one_by_one(pets, method, monkeypatch):
    from atlas_fast.methods.registry import method_class

    monkeypatch.setattr(method_class(method), "supports_batched_runs", False)  # e.g. a method of a plugin
    configs = _configs(pets, f"alone-{method}", method=method)[:2]
    with pytest.warns(UserWarning, match=f"{method} does not support batched runs"):
        batched = run_group(configs)
    assert [r["timings"]["batch_runs"] for r in batched] == [1, 1]
    assert [r["key"] for r in batched] == [run(c)["key"] for c in configs]


def test_a_group_skips_finished_runs_and_resumes_the_rest(pets):
    configs = _configs(pets, "resume")
    done = run(configs[1])
    records = run_group(configs)
    assert [r["skipped"] for r in records] == [False, True, False, False]
    assert records[1]["key"] == done["key"]
    assert all(r["skipped"] for r in run_group(configs))


def test_runs_that_cannot_share_a_module_are_refused(pets):
    from atlas_fast.engine.pipeline import train_group
    from atlas_fast.engine.spec import plan_run

    configs = _configs(pets, "mixed")
    other = TrainConfig(**{**configs[0].__dict__, "lr": 0.01})
    with pytest.raises(ValueError, match="cannot train as one group: they differ in recipe "):
        train_group([plan_run(configs[0]), plan_run(other)])


def test_tensors_without_a_runs_dimension_cannot_be_stacked():
    with pytest.raises(ValueError, match="no leading runs dimension"):
        stack_runs([{"w": torch.zeros(3, 2)}, {"w": torch.zeros(3, 2)}])
