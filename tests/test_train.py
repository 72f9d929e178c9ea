"""Training loop, lr schedule, evaluation and result records on the tiny model and a synthetic OxfordPets."""

import json
import math

import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine.evaluate import harmonic_mean, top1_accuracy
from atlas_fast.methods.config import OptimRecipe
from atlas_fast.atlas.schedules import Alternating, OneHot
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.engine import TrainConfig, run
from atlas_fast.engine.loop import lr_at_epoch
from helpers import tiny_pets_config
from layouts import make_oxford_pets

TINY = BackboneConfig("atlas-tiny", None)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_lr_schedule_matches_dassl_examples():
    # docs/protocol.md, section Optimisation: E=10, base 0.002 (CoCoOp)
    recipe = OptimRecipe(epochs=10, batch_size=1, lr=0.002)
    expected = [1e-5, .002, .001951, .001809, .001588, .001309, .001, .000691, .000412, .000191]
    assert [lr_at_epoch(recipe, e) for e in range(10)] == pytest.approx(expected, abs=5e-7)
    # E=5, 0.0035 (MaPLe) and E=2, 0.0026 (MaPLe xd): the warmup epoch counts inside E
    maple = OptimRecipe(epochs=5, batch_size=4, lr=0.0035)
    assert [lr_at_epoch(maple, e) for e in range(5)] == pytest.approx(
        [1e-5, .0035, .003166, .002291, .001209], abs=5e-7)
    assert [lr_at_epoch(OptimRecipe(epochs=2, batch_size=4, lr=0.0026), e) for e in range(2)] == [1e-5, 0.0026]
    # E=20, 0.0025 (PromptSRC): the last epoch is 6.1e-5, never 0
    assert lr_at_epoch(OptimRecipe(epochs=20, batch_size=4, lr=0.0025), 19) == pytest.approx(6.1e-5, abs=5e-7)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        lr_at_epoch(recipe, 10)


def test_accuracy_and_harmonic_mean():
    logits = torch.tensor([[[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]]])
    assert top1_accuracy(logits, torch.tensor([1, 0, 0, 0])).tolist() == [75.0]
    assert harmonic_mean(80.0, 60.0) == pytest.approx(2 * 80 * 60 / 140)
    assert harmonic_mean(0.0, 0.0) == 0.0


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("pets")
    make_oxford_pets(root / "data", n_classes=8, n_train=4, n_val=2, n_test=3, size=36)
    return root


def tiny_config(root, **changes):
    return tiny_pets_config(root, **{"epochs": 8, "views": 2, **changes})


def test_end_to_end_loss_falls_and_record_is_complete(pets):
    record = run(tiny_config(pets, results_dir=pets / "results-e2e"))
    losses = [row["loss"] for row in record["epochs"]]
    assert len(losses) == 8
    assert losses[-1] < losses[0] - 0.1, losses
    assert [row["soft"] for row in record["epochs"]] == [False] * 8
    metrics = record["metrics"]
    for name in ("base", "new", "all"):  # a share of the test images: k / N * 100 for a whole k
        correct = metrics[name] * record["data"]["num_test"][name] / 100
        assert correct == pytest.approx(round(correct), abs=1e-6)
    assert metrics["H"] == pytest.approx(harmonic_mean(metrics["base"], metrics["new"]))
    assert set(metrics["zero_shot"]) == {"base", "new", "all", "H"}
    fingerprint = record["data"].pop("fingerprint")
    assert len(fingerprint) == 32 and record["key"] != record["config_key"]
    assert record["data"] == {"dataset": "OxfordPets", "num_train": 16, "num_classes": 4, "content_hash": False,
                              "classnames": ["dog_a", "breed_b_cat", "dog_c", "breed_d_cat"],
                              "shots_used": {"min": 4, "max": 4}, "num_test": {"base": 12, "new": 12, "all": 24}}
    # the last partial batch is kept: 16 items at batch 3 -> 6 steps; the record says what ran
    assert record["config"]["recipe"]["batch_size"] == 3 and record["config"]["views"] == 2
    on_disk = json.loads(open(record["path"]).read())
    assert on_disk["status"] == "finished" and on_disk["metrics"] == metrics
    learned = torch.load(record["path"].replace(".json", ".pt"), weights_only=True)
    assert any(t.shape[-1] > 0 for t in learned.values())
    assert not list((pets / "results-e2e").rglob("*.tmp"))


def test_same_seed_same_result_other_seed_other(pets):
    first = run(tiny_config(pets, results_dir=pets / "r1"))
    again = run(tiny_config(pets, results_dir=pets / "r2"))
    other = run(tiny_config(pets, results_dir=pets / "r3", seed=2))
    assert not again["skipped"]
    assert [r["loss"] for r in first["epochs"]] == [r["loss"] for r in again["epochs"]]
    assert first["metrics"] == again["metrics"]
    learned_a = torch.load(first["path"].replace(".json", ".pt"), weights_only=True)
    learned_b = torch.load(again["path"].replace(".json", ".pt"), weights_only=True)
    for name in learned_a:
        assert torch.equal(learned_a[name], learned_b[name])
    assert [r["loss"] for r in first["epochs"]] != [r["loss"] for r in other["epochs"]]


def test_identical_config_is_skipped(pets, monkeypatch):
    config = tiny_config(pets, results_dir=pets / "skip", epochs=3)
    first = run(config)
    assert not first["skipped"]

    def fail(*args, **kwargs):
        raise AssertionError("an identical finished run must not train again")

    monkeypatch.setattr("atlas_fast.engine.group.train_runs", fail)
    second = run(tiny_config(pets, results_dir=pets / "skip", epochs=3, progress=True))
    assert second["skipped"] and second["key"] == first["key"] and second["metrics"] == first["metrics"]
    with pytest.raises(AssertionError, match="must not train"):
        run(tiny_config(pets, results_dir=pets / "skip", epochs=3, lr=0.01))


def test_config_validation():
    with pytest.raises(ValueError, match="set soft_labels"):
        TrainConfig("OxfordPets", "data", schedule=Alternating(2))
    with pytest.raises(ValueError, match="never uses them"):
        TrainConfig("OxfordPets", "data", schedule=OneHot(), soft_labels=soft_label_preset("base2new", "ls"))
    with pytest.raises(ValueError, match="setting must be one of"):
        TrainConfig("OxfordPets", "data", setting="b2n")
    with pytest.raises(ValueError, match=r"views must be in \[1, 10000\].*got 0"):
        TrainConfig("OxfordPets", "data", views=0)
    with pytest.raises(ValueError, match=r"views must be in \[1, 10000\].*got 1000000000000"):
        TrainConfig("OxfordPets", "data", views=10**12)  # refused before any memory is asked for
    for lr in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="lr override must be a finite number > 0"):
            TrainConfig("OxfordPets", "data", lr=lr)


@pytest.mark.parametrize("schedule, kind, soft_flags", [
    ("atlas2", "csl", [False, True, False, True]),
    ("atlas3", "mix", [False, False, True, False]),
    ("atlas1", "isl", [True, True, True, True]),
    ("joint", "ls", [True, True, True, True]),
    ("ols", None, [False] * 4),
    ("tfkd", None, [False] * 4),
])
def test_every_schedule_trains(pets, schedule, kind, soft_flags):
    from atlas_fast.atlas.schedules import Joint, OnlineLabelSmoothing, TeacherFreeKD

    build = {"atlas2": lambda: Alternating(2), "atlas3": lambda: Alternating(3), "atlas1": lambda: Alternating(1), "joint": Joint,
             "ols": OnlineLabelSmoothing, "tfkd": TeacherFreeKD}[schedule]
    soft = soft_label_preset("base2new", kind) if kind else None
    # a non-default aug_seed puts the train views in their own cache file (soft labels read view 0 from it)
    record = run(tiny_config(pets, results_dir=pets / f"sched-{schedule}", epochs=4, schedule=build(),
                             soft_labels=soft, aug_seed=3 if schedule == "atlas3" else 0))
    assert [row["soft"] for row in record["epochs"]] == soft_flags
    assert all(math.isfinite(row["loss"]) for row in record["epochs"])
    assert record["config"]["schedule"]["name"] == build().name
    assert (record["config"]["soft_labels"] or {}).get("kind") == kind


def test_eval_every_epoch_records_curves(pets):
    record = run(tiny_config(pets, results_dir=pets / "curves", epochs=3, eval_every_epoch=True))
    curves = [row["accuracy"] for row in record["epochs"]]
    assert len(curves) == 3 and all(set(c) == {"base", "new", "all", "H"} for c in curves)
    assert curves[-1] == {k: v for k, v in record["metrics"].items() if k not in ("zero_shot", "calibration")}


def test_class_specific_context_is_evaluated_on_base_only(pets):
    from atlas_fast.methods.coop import CoOpConfig

    record = run(tiny_config(pets, results_dir=pets / "csc", epochs=2,
                             method_config=CoOpConfig(n_ctx=2, ctx_init="", csc=True)))
    assert set(record["metrics"]) == {"base", "calibration", "zero_shot"}
    assert set(record["metrics"]["calibration"]) == {"base"}
    assert record["config"]["method_config"]["csc"] is True


def test_divergence_is_reported(pets):
    with pytest.raises(FloatingPointError, match="Training diverged in epoch 1 .*No record is written"):
        run(tiny_config(pets, results_dir=pets / "diverge", epochs=3, lr=1e30))  # the largest lr allowed (MAX_LR)
    assert not list((pets / "diverge").rglob("*.json")) and not list((pets / "diverge").rglob("*.pt"))


def test_learned_tensors_that_stop_being_finite_fail_the_run(pets, monkeypatch):
    """The epoch's mean loss can stay finite while the last step's update is not: the learned tensors are checked
    after every epoch, and no record describes a run whose prompts are damaged."""
    from atlas_fast.methods.coop import CoOp

    step = CoOp.end_epoch

    def poison_last_epoch(self, epoch, num_epochs):
        step(self, epoch, num_epochs)
        if epoch == num_epochs - 1:
            with torch.no_grad():
                self.ctx[..., 0] = float("inf")

    monkeypatch.setattr(CoOp, "end_epoch", poison_last_epoch)
    with pytest.raises(FloatingPointError, match="Training diverged in epoch 2"):
        run(tiny_config(pets, results_dir=pets / "poisoned", epochs=3))
    assert not list((pets / "poisoned").rglob("*.json"))


def test_atlas_with_one_hot_soft_labels_is_plain_coop(pets):
    """Soft labels that equal the one-hot labels (LS with θ = 0) must leave training exactly as CoOp's: the soft
    epochs read the right rows for the right items, and the soft cross-entropy equals the hard one."""
    from atlas_fast.atlas.softlabels import SoftLabelConfig

    coop = run(tiny_config(pets, results_dir=pets / "results-theta0"))
    atlas = run(tiny_config(pets, results_dir=pets / "results-theta0", schedule=Alternating(2),
                            soft_labels=SoftLabelConfig(kind="ls", theta=0.0)))
    assert [row["soft"] for row in atlas["epochs"]] == [False, True] * 4
    assert [row["loss"] for row in atlas["epochs"]] == pytest.approx([row["loss"] for row in coop["epochs"]],
                                                                     rel=1e-5)
    learned = [torch.load(r["path"].replace(".json", ".pt"), weights_only=True) for r in (coop, atlas)]
    torch.testing.assert_close(learned[0], learned[1], rtol=1e-5, atol=1e-6)
    assert atlas["metrics"]["base"] == coop["metrics"]["base"] and atlas["metrics"]["new"] == coop["metrics"]["new"]
