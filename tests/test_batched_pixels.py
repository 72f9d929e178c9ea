"""R pixel runs (IVLP, MaPLe, PromptSRC, DePT-MaPLe) trained as one module give every run the record of training it
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
from atlas_fast.methods.promptsrc import PromptSRCConfig
from layouts import make_oxford_pets
from test_batched import _assert_equal_records

TINY = BackboneConfig("atlas-tiny", None)

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = {"ivlp": IVLPConfig(n_ctx_text=2, n_ctx_vision=2, depth_text=2, depth_vision=2),
           "maple": MaPLeConfig(n_ctx=2, depth=2),
           "promptsrc": PromptSRCConfig(depth_text=2, depth_vision=2, gpa_mean=2, gpa_std=1),
           "dept-maple": DePTMaPLeConfig(n_ctx=2, depth=2)}


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


@pytest.mark.parametrize("method, runs", [("ivlp", 4), ("maple", 4), ("promptsrc", 4), ("dept-maple", 4),
                                          ("ivlp", 2), ("dept-maple", 2)])
def test_batched_pixel_runs_equal_runs_trained_alone(pets, method, runs):
    configs = pixel_configs(pets, method, f"alone-{method}")[-runs:]
    alone = [run(config) for config in configs]
    batched = run_group(pixel_configs(pets, method, f"batched-{method}-{runs}")[-runs:])
    assert all(r["timings"]["batch_runs"] == runs for r in batched)
    _assert_equal_records(batched, alone)
