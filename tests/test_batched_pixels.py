"""R pixel runs (IVLP, MaPLe, PromptSRC, DePT-MaPLe, MMRL) trained as one module give every run the record of training it
alone: per-epoch losses, learned tensors and metrics at the tolerances of tests/test_batched.py, for runs that differ
in seed, shots, label schedule and soft labels."""

import pytest
import torch

from atlas_fast.atlas.schedules import Atlas, OneHot
from atlas_fast.atlas.softlabels import atlas_preset
from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run
from atlas_fast.engine.pipeline import run_group
from atlas_fast.methods.dept import DePTMaPLeConfig
from atlas_fast.methods.ivlp import IVLPConfig
from atlas_fast.methods.maple import MaPLeConfig
from atlas_fast.methods.mmrl import MMRLConfig
from atlas_fast.methods.promptsrc import PromptSRCConfig
from layouts import make_oxford_pets
from test_batched import _assert_equal_records

TINY = BackboneConfig("atlas-tiny", None)

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = {"ivlp": IVLPConfig(n_ctx_text=2, n_ctx_vision=2, depth_text=2, depth_vision=2),
           "maple": MaPLeConfig(n_ctx=2, depth=2),
           "promptsrc": PromptSRCConfig(depth_text=2, depth_vision=2, gpa_mean=2, gpa_std=1),
           "dept-maple": DePTMaPLeConfig(n_ctx=2, depth=2),
           "mmrl": MMRLConfig(depth=1, rep_dim=16)}


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched-pixels")
    make_oxford_pets(root / "data", n_classes=4, n_train=5, n_val=1, n_test=2, size=32)
    return root


def pixel_configs(root, method, results):
    common = dict(dataset="OxfordPets", data_root=root / "data", backbone=TINY,
                  method=method, method_config=CONFIGS[method], epochs=3, views=2, batch_size=3, lr=0.02,
                  device="cpu", cache_root=root / "cache", results_dir=root / results, progress=False, workers=0)
    return [
        TrainConfig(**common, seed=1, shots=4, schedule=OneHot()),
        TrainConfig(**common, seed=1, shots=4, schedule=Atlas(2), soft_labels=atlas_preset("base2new", "csl")),
        TrainConfig(**common, seed=2, shots=2, schedule=Atlas(2), soft_labels=atlas_preset("base2new", "isl")),
        TrainConfig(**common, seed=3, shots=5, schedule=Atlas(1), soft_labels=atlas_preset("base2new", "ls")),
    ]


# MMRL's two runs already differ in batch size (shots 2 and 5); its four-run case is in the slow suite
@pytest.mark.parametrize("method,runs", [(method, runs) for runs in (4, 2) for method in CONFIGS
                                         if (method, runs) != ("mmrl", 4)]
                         + [pytest.param("mmrl", 4, marks=pytest.mark.slow)])
def test_batched_pixel_runs_equal_runs_trained_alone(pets, method, runs):
    configs = pixel_configs(pets, method, f"alone-{method}")[-runs:]
    alone = [run(config) for config in configs]
    batched = run_group(pixel_configs(pets, method, f"batched-{method}-{runs}")[-runs:])
    assert all(r["timings"]["batch_runs"] == runs for r in batched)
    _assert_equal_records(batched, alone)


@pytest.mark.parametrize("method", ["maple", "promptsrc"])
def test_runs_that_share_their_first_epochs_fork_and_equal_unforked_training(pets, method, monkeypatch):
    """A seed's plain run and its ATLaS variants (K = 2, 3) train alike in epoch 0: the group trains one trunk run
    per seed for it, then forks; every record (losses, learned tensors, PromptSRC's GPA, metrics) equals the group
    trained without the fork."""
    import atlas_fast.engine.pipeline as pipeline

    common = dict(dataset="OxfordPets", data_root=pets / "data", backbone=TINY, method=method,
                  method_config=CONFIGS[method], epochs=3, views=3, batch_size=3, lr=0.02, device="cpu",
                  cache_root=pets / "cache", progress=False, workers=0, shots=4)

    def group(results):
        return [TrainConfig(**common, results_dir=pets / results, seed=1, schedule=OneHot()),
                TrainConfig(**common, results_dir=pets / results, seed=1, schedule=Atlas(2),
                            soft_labels=atlas_preset("base2new", "csl")),
                TrainConfig(**common, results_dir=pets / results, seed=1, schedule=Atlas(3),
                            soft_labels=atlas_preset("base2new", "isl")),
                TrainConfig(**common, results_dir=pets / results, seed=2, schedule=OneHot())]

    forks = []
    real_plan = pipeline.plan_fork
    monkeypatch.setattr(pipeline, "plan_fork", lambda *a: forks.append(real_plan(*a)) or forks[-1])
    forked = run_group(group(f"forked-{method}"))
    assert forks == [([0, 3], [0, 0, 0, 1], 0)]  # two trunk runs (seeds 1 and 2) for epoch 0
    monkeypatch.setattr(pipeline, "plan_fork", lambda *a: None)
    unforked = run_group(group(f"unforked-{method}"))
    _assert_equal_records(forked, unforked)
    assert [e["soft"] for e in forked[1]["epochs"]] == [False, True, False]
