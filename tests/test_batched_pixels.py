"""R pixel runs trained as one module give every run the record of training it alone: per-epoch losses, learned
tensors and metrics at the tolerances of tests/test_batched.py, for runs that differ in seed, shots, label schedule
and soft labels. The methods are every registered one that batches on pixels (tests/registry_cases.py); the default
run trains groups of 2 runs of each file's first such method and a group of 4 of the first such method overall, the
slow suite groups of 2 and 4 of every one."""

import pytest
import torch

from atlas_fast.atlas.schedules import Alternating, OneHot
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run
from atlas_fast.engine.pipeline import run_group
from atlas_fast.methods.registry import method_class
from layouts import make_oxford_pets
from registry_cases import NOISY, batches_pixels, capable, cases, small_options
from test_batched import _assert_equal_records

TINY = BackboneConfig("atlas-tiny", None)

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched-pixels")
    make_oxford_pets(root / "data", n_classes=4, n_train=5, n_val=1, n_test=2, size=32)
    return root


def options(root, method):
    from atlas_fast.data import load_dataset

    return small_options(method, root / "data", load_dataset("OxfordPets", root / "data").classnames)


def pixel_configs(root, method, results):
    common = dict(dataset="OxfordPets", data_root=root / "data", backbone=TINY,
                  method=method, method_options=options(root, method), epochs=3, views=2, batch_size=3, lr=0.02,
                  device="cpu", cache_root=root / "cache", results_dir=root / results, progress=False, workers=0)
    if not method_class(method).uses_labels:  # a label-free method's runs differ in seed (no schedules to vary)
        return [TrainConfig(**common, seed=seed, shots=4) for seed in (1, 4, 2, 3)]
    return [
        TrainConfig(**common, seed=1, shots=4, schedule=OneHot()),
        TrainConfig(**common, seed=1, shots=4, schedule=Alternating(2), soft_labels=soft_label_preset("base2new", "csl")),
        TrainConfig(**common, seed=2, shots=2, schedule=Alternating(2), soft_labels=soft_label_preset("base2new", "isl")),
        TrainConfig(**common, seed=3, shots=5, schedule=Alternating(1), soft_labels=soft_label_preset("base2new", "ls")),
    ]


def _groups():
    """Groups of 2 runs per :func:`registry_cases.cases`; groups of 4 in the slow suite, but for the first method
    (the 2-run groups already differ in seed, shots, schedule, soft labels and batch size)."""
    first = capable(batches_pixels)[0]
    return ([pytest.param(p.values[0], 2, id=f"{p.id}-2", marks=p.marks) for p in cases(batches_pixels)]
            + [pytest.param(name, 4, id=f"{name}-4", marks=() if name == first else pytest.mark.slow)
               for name in capable(batches_pixels)])


@pytest.mark.parametrize("method,runs", _groups())
def test_batched_pixel_runs_equal_runs_trained_alone(pets, method, runs):
    configs = pixel_configs(pets, method, f"alone-{method}")[-runs:]
    alone = [run(config) for config in configs]
    batched = run_group(pixel_configs(pets, method, f"batched-{method}-{runs}")[-runs:])
    assert all(r["timings"]["batch_runs"] == runs for r in batched)
    _assert_equal_records(batched, alone, method in NOISY)


@pytest.mark.parametrize("method", ["maple", "promptsrc"])
def test_runs_that_share_their_first_epochs_fork_and_equal_unforked_training(pets, method, monkeypatch):
    """A seed's plain run and its ATLaS variants (K = 2, 3) train alike in epoch 0: the group trains one trunk run
    per seed for it, then forks; every record (losses, learned tensors, PromptSRC's GPA, metrics) equals the group
    trained without the fork."""
    import atlas_fast.engine.group as group_module
    from atlas_fast.engine.group import ForkPlan

    common = dict(dataset="OxfordPets", data_root=pets / "data", backbone=TINY, method=method,
                  method_options=options(pets, method), epochs=3, views=3, batch_size=3, lr=0.02, device="cpu",
                  cache_root=pets / "cache", progress=False, workers=0, shots=4)

    def group(results):
        return [TrainConfig(**common, results_dir=pets / results, seed=1, schedule=OneHot()),
                TrainConfig(**common, results_dir=pets / results, seed=1, schedule=Alternating(2),
                            soft_labels=soft_label_preset("base2new", "csl")),
                TrainConfig(**common, results_dir=pets / results, seed=1, schedule=Alternating(3),
                            soft_labels=soft_label_preset("base2new", "isl")),
                TrainConfig(**common, results_dir=pets / results, seed=2, schedule=OneHot())]

    forks = []
    real_plan = group_module.plan_fork
    monkeypatch.setattr(group_module, "plan_fork", lambda *a: forks.append(real_plan(*a)) or forks[-1])
    forked = run_group(group(f"forked-{method}"))
    assert forks == [ForkPlan([0, 3], [0, 0, 0, 1], 0)]  # two trunk runs (seeds 1 and 2) for epoch 0
    monkeypatch.setattr(group_module, "plan_fork", lambda *a: None)
    unforked = run_group(group(f"unforked-{method}"))
    _assert_equal_records(forked, unforked)
    assert [e["soft"] for e in forked[1]["epochs"]] == [False, True, False]
