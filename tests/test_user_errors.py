"""Every user error is one ``error:`` line naming the file or value, exit status 2, and is found before any work:
cache errors, devices, model names, experiment names and options, damaged records, and errors inside sweep workers."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from atlas_fast.cli import main
from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run
from atlas_fast.engine.spec import plan_run
from atlas_fast.errors import RunFailed
from helpers import small_pets

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_pets(tmp_path_factory, "user_errors")


def one_error_line(capsys, *fragments: str) -> str:
    """The error the command printed: one ``error:`` line (plus the --debug hint) with every fragment in it."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and "--debug" in err[1], err
    for fragment in fragments:
        assert fragment in err[0], err[0]
    return err[0]


def cache_args(data, *extra):
    return ["cache", "build", "--dataset", "OxfordPets", "--data-root", str(data / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--cache-root", str(data / "cache-cli"), "--workers", "0", "--split", "test",
            *extra]


def train_args(data, *extra):
    return ["train", "--dataset", "OxfordPets", "--data-root", str(data / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "2", "--epochs", "2", "--cache-root", str(data / "cache"),
            "--results-dir", str(data / "results"), "--no-progress", *extra]


def test_a_cache_error_is_one_line(data, capsys):
    assert main(cache_args(data)) == 0
    capsys.readouterr()
    assert main(cache_args(data, "--storage-dtype", "float32")) == 2  # into the float16 file built just now
    one_error_line(capsys, "float16", str(data / "cache-cli"))


def test_devices_that_do_not_exist_are_refused_before_any_work(data, capsys):
    absent = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU: none on a machine without one
    for device, fragment in (("bogus", "'bogus' is not a torch device"), (absent, "CUDA device(s) on this machine")):
        assert main(train_args(data, "--device", device)) == 2
        one_error_line(capsys, fragment)
        assert main(cache_args(data, "--device", device)) == 2
        one_error_line(capsys, fragment)
    assert not (data / "results").exists()


def test_graph_steps_on_where_no_graph_applies_is_one_error_line(data, capsys, monkeypatch):
    """The refusal says what asked for graphs and the way out in the command line's words (the flag, and the
    environment variable where that is what said on), not only the Python API's."""
    monkeypatch.delenv("ATLAS_FAST_GRAPH_STEPS", raising=False)
    assert main(train_args(data, "--device", "cpu", "--graph-steps", "on")) == 2
    line = one_error_line(capsys, "needs a CUDA device; this run is on cpu", "--graph-steps on",
                          "use --graph-steps auto", "graph_steps=None or False")
    assert "ATLAS_FAST_GRAPH_STEPS" not in line
    monkeypatch.setenv("ATLAS_FAST_GRAPH_STEPS", "on")
    assert main(train_args(data, "--device", "cpu")) == 2
    one_error_line(capsys, "needs a CUDA device; this run is on cpu", "ATLAS_FAST_GRAPH_STEPS=on in the environment",
                   "use --graph-steps auto")
    monkeypatch.delenv("ATLAS_FAST_GRAPH_STEPS")
    assert not (data / "results").exists()
    assert main(train_args(data, "--device", "cpu", "--graph-steps", "off", "--seeds", "1",
                           "--results-dir", str(data / "results-eager"))) == 0  # eager steps: it trains
    assert list((data / "results-eager").rglob("*.json"))


def test_graph_steps_on_off_cuda_is_refused_before_the_world_is_generated(tmp_path, capsys):
    """An experiment with --world and the demo refuse --graph-steps on on the CPU before they write the world (they
    generated its images, 8 MB and seconds of CPU, and then refused at the first run's plan)."""
    world = tmp_path / "world"
    assert main(["experiment", "table_calibration", "--world", "--data-root", str(world), "--datasets",
                 "WorldPhotos", "--methods", "coop", "--seeds", "1", "--device", "cpu", "--graph-steps", "on",
                 "--results-dir", str(tmp_path / "results"), "--no-progress"]) == 2
    one_error_line(capsys, "needs a CUDA device; this run is on cpu", "--graph-steps on")
    assert main(["demo", "--data-root", str(world), "--cache-root", str(tmp_path / "cache"), "--results-dir",
                 str(tmp_path / "results"), "--device", "cpu", "--graph-steps", "on", "--no-progress"]) == 2
    one_error_line(capsys, "needs a CUDA device; this run is on cpu", "--graph-steps on")
    assert not world.exists()


def test_an_unknown_model_is_refused_with_the_closest_names(data, capsys):
    assert main(train_args(data, "--model", "ViT-B-61")) == 2
    one_error_line(capsys, "Unknown model 'ViT-B-61'", "did you mean ViT-B-16")


def test_an_experiment_checks_its_targets_and_output_before_the_first_run(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("atlas_fast.engine.group.train_runs",
                        lambda *a, **k: pytest.fail("a run trained before the options were checked"))
    common = ["experiment", "table_cross_dataset", "--data-root", str(data / "data"), "--datasets", "OxfordPets",
              "--model", "atlas-tiny", "--pretrained", "none", "--seeds", "1", "--epochs", "2", "--methods", "coop",
              "--cache-root", str(data / "cache"), "--results-dir", str(tmp_path / "results")]
    assert main(common + ["--targets", "NoSuchSet", "--out", str(tmp_path / "out")]) == 2
    one_error_line(capsys, "NoSuchSet")
    (tmp_path / "file").write_text("a file where the output folder should be")
    assert main(common + ["--targets", "OxfordPets", "--out", str(tmp_path / "file" / "out")]) == 2
    one_error_line(capsys, "--out folder", "not writable")


def test_eval_of_a_record_lacking_a_field_names_the_field(data, tmp_path, capsys):
    record = run(TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=2,
                             device="cpu", cache_root=data / "cache", results_dir=data / "results", progress=False))
    broken = json.loads(open(record["path"]).read())
    del broken["backbone"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    shutil.copy(record["path"].replace(".json", ".pt"), tmp_path / broken["learned"])
    assert main(["eval", "--record", str(path), "--dataset", "OxfordPets", "--data-root", str(data / "data"),
                 "--cache-root", str(data / "cache"), "--no-progress"]) == 2
    one_error_line(capsys, str(path), "lacks backbone.fingerprint")


def test_a_workers_user_error_comes_back_as_its_message(data, tmp_path):
    """What a Ray task or SLURM job returns when its group fails on the user's data: the message, not the stack."""
    from atlas_fast.sweep import grid
    from atlas_fast.engine.record import FailedRun
    from atlas_fast.sweep.executors import WorkerFailure, train_specs

    copy = tmp_path / "data"
    shutil.copytree(data / "data", copy)
    spec = plan_run(TrainConfig("OxfordPets", copy, BackboneConfig("atlas-tiny", None), shots=2, epochs=2,
                                device="cpu", cache_root=tmp_path / "cache", results_dir=tmp_path / "results",
                                progress=False))
    victim = spec.data.train_split.train[0].impath
    open(victim, "wb").write(b"not an image")  # damaged after planning, before the worker reads it
    (failure,) = train_specs([spec])  # the run's own inputs: a failed run (issue 44), its message only
    assert isinstance(failure, FailedRun) and failure.error is None
    assert victim in failure.reason and "Traceback" not in failure.reason

    class FailingExecutor:
        def map(self, groups):
            yield 0, [failure]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grid, "make_executor", lambda name, **options: FailingExecutor())
        with pytest.raises(RunFailed, match=f"(?s)1 of 1 run\\(s\\) failed .*OxfordPets coop .*seed 1: .*{victim}"):
            grid.run_configs([spec.config], grid.Execution("ray"), progress=False)
    # a failure of the whole group (not of one run's slice) still comes back as the worker's message
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grid, "make_executor", lambda name, **options: type("Failing", (), {
            "map": lambda self, groups: iter([(0, WorkerFailure(f"OSError: {victim}: disk gone"))])})())
        with pytest.raises(RunFailed, match=f"a worker failed on OxfordPets coop .*{victim}"):
            grid.run_configs([spec.config], grid.Execution("ray"), progress=False)


def test_a_record_from_before_n_ctx_followed_the_phrase_still_evaluates(data, tmp_path):
    """Older CoOp records say n_ctx=16 beside the phrase "a photo of a" (4 tokens were learned); the phrase wins."""
    from atlas_fast.engine import evaluate_saved

    record = run(TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=2,
                             device="cpu", cache_root=data / "cache", results_dir=data / "results", progress=False))
    old = json.loads(open(record["path"]).read())
    assert old["config"]["method_config"]["n_ctx"] == 4 and old["config"]["method_config"]["ctx_init"]
    old["config"]["method_config"]["n_ctx"] = 16
    del old["seal"]  # older records carry no seal
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    shutil.copy(record["path"].replace(".json", ".pt"), tmp_path / old["learned"])
    result = evaluate_saved(path, "OxfordPets", data / "data", subsample="base", cache_root=data / "cache",
                            progress=False)
    assert result["accuracy"] == pytest.approx(record["metrics"]["base"])


def test_epochs_that_leave_no_epoch_after_warmup_draw_a_warning(data):
    config = TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=1,
                         device="cpu", cache_root=data / "cache", results_dir=data / "results", progress=False)
    with pytest.warns(UserWarning, match="1 epoch\\(s\\) with 1 warmup epoch\\(s\\) .* Train at least 2 epochs"):
        plan_run(config)


def test_an_extra_is_installed_by_a_command_that_works_from_a_checkout(tmp_path, monkeypatch):
    """From a source tree the package name on an index is not this checkout: the hint installs the checkout's extra
    (a path that works from any folder; `.` from the checkout itself)."""
    from pathlib import Path

    import atlas_fast
    from atlas_fast.errors import install_extra

    checkout = Path(atlas_fast.__file__).resolve().parent.parent
    assert (checkout / "setup.py").is_file()  # the suite runs from a checkout
    monkeypatch.chdir(tmp_path)
    assert install_extra("search") == f"pip install -e '{checkout}[search]'"
    monkeypatch.chdir(checkout)
    assert install_extra("ray") == "pip install -e '.[ray]'"
