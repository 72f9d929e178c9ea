"""One run of a group that stops being finite (or raises in its own slice) never costs its group (issue 44): it is
stopped and written as a failed run, the other runs train on and are recorded exactly as without it, the command
exits non-zero naming the failed run by its printed name, and the same command trains only that run again."""

import dataclasses
import json

import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run_group
from atlas_fast.engine.record import load_learned
from atlas_fast.engine.step import RunState, TrainStep
from atlas_fast.errors import RunsFailed
from layouts import make_oxford_pets

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolation")
    make_oxford_pets(root / "data", n_classes=4, n_train=4, n_val=2, n_test=2, size=32)
    return root


def _configs(root, results, seeds=(1, 2, 3), **changes):
    common = dict(dataset="OxfordPets", data_root=root / "data", backbone=BackboneConfig("atlas-tiny", None),
                  shots=4, epochs=2, views=1, batch_size=4, lr=0.05, device="cpu", cache_root=root / "cache",
                  results_dir=root / results, progress=False)
    return [TrainConfig(**{**common, **changes}, seed=seed) for seed in seeds]


def poison(monkeypatch, seed: int | None = None, epoch: int = 1, call: int = 1, position: int | None = None):
    """From the ``call``-th step of ``epoch`` on, the run with ``seed`` (or at ``position`` of the module) gets NaN
    learned tensors (in a group, only its slice): a diverging run, injected, that goes on taking part in the group's
    steps until the epoch ends."""
    init, step = RunState.__init__, TrainStep.__call__
    seen = {"calls": 0}

    def remember_seed(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.injected_seed = args[4] if len(args) > 4 else kwargs["seed"]

    def poisoned(self, step_epoch, *args, **kwargs):
        if step_epoch == epoch:
            seen["calls"] += 1
            if seen["calls"] == call:
                for r, run in enumerate(self.runs):
                    if (r == position) if position is not None else getattr(run, "injected_seed", None) == seed:
                        with torch.no_grad():
                            param = next(iter(self.method.trainable_parameters()))
                            param.view(self.method.num_runs, -1)[r].fill_(float("nan"))
        return step(self, step_epoch, *args, **kwargs)

    monkeypatch.setattr(RunState, "__init__", remember_seed)
    monkeypatch.setattr(TrainStep, "__call__", poisoned)


def _same(a, b):
    """Two records of one run, bit for bit: per-epoch losses, metrics and learned tensors."""
    assert a["key"] == b["key"]
    assert [e["loss"] for e in a["epochs"]] == [e["loss"] for e in b["epochs"]]
    assert a["metrics"] == b["metrics"]
    learned_a, learned_b = load_learned(a["path"]), load_learned(b["path"])
    assert learned_a.keys() == learned_b.keys() and all(torch.equal(learned_a[k], learned_b[k]) for k in learned_a)


def test_a_diverging_run_costs_its_group_nothing_and_is_retried_alone(pets, monkeypatch):
    clean = run_group(_configs(pets, "clean"))
    poison(monkeypatch, seed=2)
    with pytest.raises(RunsFailed) as caught:
        run_group(_configs(pets, "poisoned"))
    message = str(caught.value)
    assert message.startswith("1 of 3 run(s) failed (the other runs' records are written; run the same command "
                              "again to train only the failed ones):")
    (failure,) = caught.value.failures
    assert failure.name.endswith(" seed 2")
    assert f"  {failure.name}: Training diverged in epoch 1 (step " in message
    # where it stopped: epoch 1, the group's optimiser steps by the end of that epoch, its lr, epoch 0's loss
    assert (failure.epoch, failure.seed, failure.step) == (1, 2, 4)
    assert failure.lr == pytest.approx(clean[1]["epochs"][1]["lr"])
    assert failure.last_loss == pytest.approx(clean[1]["epochs"][0]["loss"], abs=0)
    note = json.loads(open(failure.note).read())
    assert note["status"] == "failed" and note["name"] == failure.name and note["seed"] == 2
    assert (note["epoch"], note["step"], note["last_finite_loss"]) == (1, 4, failure.last_loss)
    # the healthy runs: recorded, bit-equal to the same group trained without the diverging run's NaN
    healthy = caught.value.records
    assert healthy[1] is None
    _same(healthy[0], clean[0])
    _same(healthy[2], clean[2])
    assert not list((pets / "poisoned").rglob("*seed2*.json"))  # no record describes the diverged run
    from atlas_fast.report.collect import report_folder

    markdown = report_folder(pets / "poisoned", formats=["md"])
    assert f"- {failure.note}: {failure.name}: Training diverged in epoch 1" in markdown
    # the same call again trains only the failed run (the others are skipped), and its record replaces the note
    monkeypatch.undo()
    again = run_group(_configs(pets, "poisoned"))
    assert [r["skipped"] for r in again] == [True, False, True]
    assert again[1]["key"] == clean[1]["key"]  # trained alone now: equal to its group run up to float reordering
    assert [e["loss"] for e in again[1]["epochs"]] == pytest.approx([e["loss"] for e in clean[1]["epochs"]], abs=1e-5)
    assert not list((pets / "poisoned").rglob("*.failed"))


def test_the_command_exits_non_zero_naming_the_failed_run_and_retries_only_it(pets, monkeypatch, capsys):
    from atlas_fast.cli import main

    args = ["train", "--dataset", "OxfordPets", "--data-root", str(pets / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "4", "--epochs", "2", "--batch-size", "4", "--views", "1",
            "--lr", "0.05", "--cache-root", str(pets / "cache"), "--results-dir", str(pets / "cli"),
            "--no-progress", "--seeds", "1", "2", "3"]
    poison(monkeypatch, seed=3, epoch=0, call=1)  # the first epoch: no finite loss before
    assert main([*args, "--batch-runs", "3"]) == 2
    out, err = capsys.readouterr()
    assert "seed 1: base" in out and "seed 2: base" in out and "seed 3" not in out  # the healthy runs, printed
    assert "1 of 3 run(s) failed" in err
    assert ("\n  OxfordPets coop [epochs=2, batch=4, lr=0.05, shots=4, views=1, backbone=atlas-tiny] seed 3: Training "
            "diverged in epoch 0 (step 2, lr 1.00e-05; no finite epoch before): the loss or the learned tensors are "
            "no longer finite; lower the lr (0.05) or use precision='fp32' [") in err, err
    assert "[3/3] OxfordPets coop" in err and "seed 3: FAILED: Training diverged in epoch 0" in err
    monkeypatch.undo()
    grouped = sorted((pets / "cli" / "OxfordPets").glob("*.json"))
    assert len(grouped) == 2
    before = {path: path.stat().st_mtime_ns for path in grouped}
    assert main([*args, "--batch-runs", "3"]) == 0  # the same command: only seed 3 trains
    assert "seed 3: base" in capsys.readouterr().out
    assert len(list((pets / "cli" / "OxfordPets").glob("*.json"))) == 3
    assert {path: path.stat().st_mtime_ns for path in grouped} == before
    assert not list((pets / "cli").rglob("*.failed"))


@pytest.mark.slow  # a study on the world's CLIP: about 10 s here
def test_a_diverging_search_trial_fails_alone_and_its_group_is_not_trained_again(monkeypatch, tmp_path):
    """A search trains trials as one group: the trial whose run diverges fails (its error names the run, epoch, step,
    lr and last finite loss), the other trial completes with exactly the value it has without it, and the group is
    trained once (it used to be trained again trial by trial)."""
    pytest.importorskip("optuna", reason="the search needs optuna (the search extra)")
    from atlas_fast.engine import loop
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.search import SearchConfig, run_study, uniform
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    generate_benchmark(tmp_path / "data", ["WorldPhotos"], sizes=SplitSizes(train=2, val=1, test=1), progress=False)
    base = TrainConfig(dataset="WorldPhotos", data_root=tmp_path / "data",
                       backbone=BackboneConfig("atlas-world", "atlas-world"), shots=2, epochs=2, views=1,
                       batch_size=8, lr=0.002, method_options={"n_ctx": 4}, schedule=Alternating(2),
                       soft_labels=soft_label_preset("base2new", "isl"), device="cpu", cache_root=tmp_path / "cache",
                       results_dir=tmp_path / "results", progress=False)

    def study(name):
        return run_study(SearchConfig(base=dataclasses.replace(base, results_dir=tmp_path / name),
                                      space={"alpha": uniform(0.1, 1.0)}, objective="base", n_trials=2,
                                      pruner="none", sampler="random", batch_trials=2, finalize=False),
                         progress=False)

    clean = study("clean")
    calls = []
    train = loop.train_runs
    monkeypatch.setattr("atlas_fast.engine.group.train_runs", lambda *a, **k: calls.append(1) or train(*a, **k))
    poison(monkeypatch, position=1, epoch=1)
    poisoned = study("poisoned")
    assert len(calls) == 1  # one group, trained once
    (good, bad) = poisoned.trials
    assert good.state.name == "COMPLETE" and good.value == clean.trials[0].value  # bit-equal
    assert good.intermediate_values == clean.trials[0].intermediate_values
    assert bad.state.name == "FAIL"
    assert bad.user_attrs["error"].startswith("WorldPhotos coop")
    assert "seed 1: Training diverged in epoch 1 (step " in bad.user_attrs["error"]
    # a run whose own inputs raise fails its trial too; the other trial trains, alone now (float reordering only)
    monkeypatch.undo()
    from atlas_fast.engine import group

    prepare, seen = group.prepare_inputs, []

    def damaged(spec, *args, **kwargs):
        seen.append(spec)
        if len(seen) == 2:
            raise ValueError("image x.png of the second trial cannot be decoded")
        return prepare(spec, *args, **kwargs)

    monkeypatch.setattr(group, "prepare_inputs", damaged)
    good, bad = study("inputs").trials
    assert good.state.name == "COMPLETE" and good.value == pytest.approx(clean.trials[0].value, abs=1e-4)
    assert bad.state.name == "FAIL" and bad.user_attrs["error"].endswith(
        "seed 1: ValueError: image x.png of the second trial cannot be decoded")


@pytest.mark.slow  # two groups of four pixel runs: about 4 s here
def test_a_pixel_group_that_forks_loses_only_the_runs_of_the_diverged_trunk(tmp_path, monkeypatch):
    """Batched pixel runs (IVLP), with seed 1's plain and ATLaS runs sharing epoch 0 as one trunk run: the trunk
    diverges in epoch 0, so both of its forked runs fail (each named), and seeds 2 and 3 are recorded as in the same
    group without the NaN, at the tolerances of a group against lone runs (tests/test_batched.py): steps where the
    failed runs sit out take the per-run loss path, a float reordering."""
    from test_batched import _assert_equal_records
    from test_batched_pixels import pixel_configs

    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=5, n_val=1, n_test=2, size=32)
    clean = run_group(pixel_configs(tmp_path, "ivlp", "clean"))
    poison(monkeypatch, seed=1, epoch=0, call=2)
    with pytest.raises(RunsFailed) as caught:
        run_group(pixel_configs(tmp_path, "ivlp", "poisoned"))
    assert str(caught.value).startswith("2 of 4 run(s) failed")
    assert [(f.seed, f.epoch) for f in caught.value.failures] == [(1, 0), (1, 0)]
    assert "coop" not in caught.value.failures[0].name and "ATLaS" in caught.value.failures[1].name
    records = caught.value.records
    assert records[:2] == [None, None]
    _assert_equal_records(records[2:], clean[2:])


def test_a_run_whose_own_inputs_raise_is_a_failed_run_and_its_group_trains_on(pets, monkeypatch):
    """A run whose own slice raises (here its inputs: a damaged image of its few-shot subset) fails alone; a lone run
    raises its own error, as before."""
    from atlas_fast.engine import group
    from atlas_fast.engine.pipeline import run

    prepare = group.prepare_inputs

    def damaged(spec, *args, **kwargs):
        if spec.config.seed == 2:
            raise ValueError("image data/oxford_pets/images/x_2.jpg cannot be decoded (truncated)")
        return prepare(spec, *args, **kwargs)

    monkeypatch.setattr(group, "prepare_inputs", damaged)
    with pytest.raises(RunsFailed, match=r"(?s)1 of 2 run\(s\) failed.*seed 2: ValueError: image "
                                         r"data/oxford_pets/images/x_2.jpg cannot be decoded"):
        run_group(_configs(pets, "inputs", seeds=(1, 2), epochs=2))
    assert len(list((pets / "inputs").rglob("*seed1*.json"))) == 1
    with pytest.raises(ValueError, match="x_2.jpg cannot be decoded"):
        run(_configs(pets, "inputs", seeds=(2,), epochs=2)[0])
