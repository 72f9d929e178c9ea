"""A small grid through a local Ray instance and through submitit's local executor gives the records of a local run
(same names, configs, metrics and learned tensors)."""

import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine.record import load_learned
from atlas_fast.atlas.variants import label_variant
from atlas_fast.sweep import Execution, run_grid
from atlas_fast.engine import TrainConfig
from helpers import small_pets

pytestmark = pytest.mark.usefixtures("one_thread")
VARIANTS = [label_variant("base2new", "none"), label_variant("base2new", "csl")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_pets(tmp_path_factory, "executors")


def _grid(data, results: str, execution: Execution | None):
    base = TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=2, views=2,
                       device="cpu", cache_root=data / "cache", results_dir=data / results, progress=False)
    return run_grid(base, ["OxfordPets"], VARIANTS, [1, 2], progress=False, execution=execution)


@pytest.fixture(scope="module")
def local_records(data):
    return _grid(data, "local", Execution("local", batch_runs=2))


def _assert_same(records, reference):
    assert [r["key"] for r in records] == [r["key"] for r in reference]
    for record, expected in zip(records, reference):
        assert not record["skipped"] and record["path"] != expected["path"]
        assert record["config"] == expected["config"]
        for name in ("base", "new", "all", "H"):
            assert record["metrics"][name] == pytest.approx(expected["metrics"][name], abs=1e-5)
        learned, reference_learned = load_learned(record["path"]), load_learned(expected["path"])
        for name, tensor in learned.items():
            torch.testing.assert_close(tensor, reference_learned[name], atol=1e-5, rtol=0)


def test_ray_executor_matches_a_local_run(data, local_records):
    import ray  # in the test extra, like submitit

    try:
        records = _grid(data, "ray", Execution("ray", batch_runs=1, options={"workers": 2, "num_cpus": 2}))
    finally:
        ray.shutdown()
    _assert_same(records, local_records)


def test_submitit_local_executor_matches_a_local_run(data, local_records, tmp_path):
    options = {"folder": tmp_path / "submitit", "cluster": "local", "gpus_per_node": 0, "cpus_per_task": 1,
               "timeout_min": 10}
    records = _grid(data, "slurm", Execution("slurm", batch_runs=2, options=options))
    _assert_same(records, local_records)
    assert len(list((tmp_path / "submitit").glob("*_result.pkl"))) == 2  # one array task per group of 2 runs


def test_a_second_sweep_skips_every_finished_run(data, local_records):
    again = _grid(data, "local", Execution("local", batch_runs=2))
    assert all(r["skipped"] for r in again) and [r["key"] for r in again] == [r["key"] for r in local_records]


def test_bad_executor_options_name_the_valid_ones():
    from atlas_fast.sweep.executors import make_executor

    with pytest.raises(ValueError, match="valid: .*gpus_per_group"):
        make_executor("ray", gpu_per_group=1)
    with pytest.raises(ValueError, match="executor must be one of"):
        Execution("dask")
