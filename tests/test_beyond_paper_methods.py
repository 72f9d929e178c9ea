"""CLIP-LoRA, TCP and KDPL end to end: ``atlas-fast train`` and ``run`` base-to-new with and without ATLaS-ISL on a
synthetic OxfordPets (tiny random CLIP, a tiny teacher of another architecture for KDPL), the schedule over
optimiser steps (AdamW, cosine per step, stopping inside an epoch), and KDPL's refusal of label schedules."""

import json
import re
from pathlib import Path

import pytest
import torch

from atlas_fast.atlas.schedules import Alternating
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.cli import main
from atlas_fast.engine import run
from atlas_fast.engine.evaluate import harmonic_mean
from atlas_fast.engine.loop import build_optimizer, set_step_lr
from atlas_fast.engine.optim import RunsAdam
from atlas_fast.methods.config import OptimRecipe
from atlas_fast.methods.registry import build_method
from helpers import eight_class_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")

TEACHER = ("teacher=atlas-tiny-teacher", "teacher_pretrained=none")
OPTIONS = {"tcp": ("depth=2",), "clip-lora": (), "clip-lora-text": (), "kdpl-coop": TEACHER,
           "kdpl-cocoop": TEACHER, "kdpl-maple": (*TEACHER, "depth=2"),
           "kdpl-promptsrc": (*TEACHER, "depth_text=2", "depth_vision=2")}
NUMBER = r"(\d+\.\d\d)"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return eight_class_pets(tmp_path_factory, "beyond")


def train(root, method, *extra):
    options = ("--method-option", *OPTIONS[method]) if OPTIONS[method] else ()
    return main(["train", "--dataset", "OxfordPets", "--data-root", str(root / "data"), "--model", "atlas-tiny",
                 "--pretrained", "none", "--method", method, "--shots", "4", "--epochs", "2", "--batch-size", "4",
                 "--views", "2", "--cache-root", str(root / "cache"), "--results-dir", str(root / "results"),
                 "--no-progress", *options, *extra])


def printed(out, label):
    line = re.search(rf"OxfordPets {re.escape(label)}(?: \[[^\]]*\])? seed 1: base {NUMBER}  new {NUMBER}  H {NUMBER}",
                     out)
    assert line, out
    return tuple(map(float, line.groups()))


SLOW = pytest.mark.slow


# The default suite trains TCP from the command line; the Python API trains CLIP-LoRA (below) and KDPL
# (tests/test_kdpl.py); every method's command line is in the slow suite.
@pytest.mark.parametrize("method", ["tcp", *(pytest.param(name, marks=SLOW) for name in (
    "clip-lora", "kdpl-coop", "kdpl-maple", "clip-lora-text", "kdpl-cocoop", "kdpl-promptsrc"))])
def test_train_base_to_new_with_and_without_atlas_isl(root, capsys, method):
    assert train(root, method) == 0
    plain = printed(capsys.readouterr().out, method)
    assert plain[2] == pytest.approx(harmonic_mean(plain[0], plain[1]), abs=0.01)
    status = train(root, method, "--atlas", "isl")
    captured = capsys.readouterr()
    if method.startswith("kdpl"):  # label-free: a label schedule has nothing to act on
        assert status == 2 and "trains without labels" in captured.err
        return
    assert status == 0
    atlas = printed(captured.out, f"{method}+ATLaS-ISL (K=2)")
    record = json.loads(Path(re.findall(r"record: (\S+\.json)", captured.out)[-1]).read_text())
    assert atlas == tuple(round(record["metrics"][name], 2) for name in ("base", "new", "H"))
    assert [e["soft"] for e in record["epochs"]] == [False, True]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["tcp", "clip-lora", "kdpl-coop"])
def test_train_on_the_world_with_and_without_atlas_isl(root, capsys, method):
    """The embedded world (the shipped atlas-world CLIP, its own teacher for KDPL; TCP's depth cut to its 4 blocks
    as ``train`` does for world datasets)."""
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    generate_benchmark(root / "world", ["WorldSketches"], sizes=SplitSizes(train=2, val=1, test=1), progress=False)
    args = ["train", "--dataset", "WorldSketches", "--data-root", str(root / "world"), "--shots", "2", "--epochs", "2",
            "--views", "2", "--batch-size", "8", "--cache-root", str(root / "cache"), "--results-dir",
            str(root / "world-results"), "--no-progress", "--method", method]
    if method == "kdpl-coop":
        args += ["--method-option", "teacher=atlas-world", "teacher_pretrained=atlas-world"]
    for extra in ((), ("--atlas", "isl")):
        status = main(args + list(extra))
        captured = capsys.readouterr()
        if extra and method == "kdpl-coop":
            assert status == 2 and "trains without labels" in captured.err
        else:
            name = rf"{re.escape(method)}\S*(?: \([^)]*\))?(?: \[[^\]]*\])?"  # + variant (K), [deviations]
            assert status == 0 and re.search(rf"WorldSketches {name} seed 1: base", captured.out), captured.out


def test_python_api_trains_clip_lora_text_over_iterations_with_atlas_isl(root):
    """The recipe's schedule over optimiser steps: ``epochs=2`` trains two whole epochs (8 images, batch 5: 2 steps
    each, the iterations with them) with AdamW; the record keeps the resolved recipe."""
    config = tiny_pets_config(root, method="clip-lora-text", shots=2, batch_size=5, schedule=Alternating(2),
                              soft_labels=soft_label_preset("base2new", "isl"))
    record = run(config)
    recipe = record["config"]["recipe"]
    assert (recipe["optimizer"], recipe["iterations"], recipe["epochs"], recipe["min_lr"]) == ("adamw", 4, 2, 1e-6)
    assert recipe["lr"] == 0.05 and record["epochs"][0]["lr"] == pytest.approx(0.05)
    assert record["epochs"][1]["lr"] == pytest.approx(1e-6 + 0.5 * (0.05 - 1e-6))  # step 2 of 4: half-way down
    assert set(record["metrics"]) >= {"base", "new", "H"} and [e["soft"] for e in record["epochs"]] == [False, True]


def test_a_schedule_over_iterations_stops_inside_an_epoch(tiny):
    """The reference's loop breaks when its step count reaches the iterations: 5 steps of batch 3 over 6 images are
    two whole epochs and one step of the third."""
    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.engine.step import RunState

    class Inputs:
        def batches(self, epoch, order, batch_size):
            for index in order.split(batch_size):
                yield features[index], index

    features = torch.randn(6, tiny.embed_dim)
    method = build_method("clip-lora-text", tiny, ["cat", "dog"])
    recipe = OptimRecipe(epochs=1, batch_size=3, lr=1e-3, warmup_epochs=0, optimizer="adamw", iterations=5,
                         min_lr=1e-6).for_training_images(6)
    assert recipe.epochs == 3
    steps = []
    original = method.training_loss
    method.training_loss = lambda *args: (steps.append(1), original(*args))[1]
    state = RunState(Inputs(), torch.tensor([0, 1, 0, 1, 0, 1]), None, OneHot(), 0, torch.device("cpu"))
    logs = train_runs(TrainingRuns(method, [state]), recipe, torch.device("cpu"), amp=False, progress=False)[0]
    assert len(steps) == 5 and [row["epoch"] for row in logs] == [0, 1, 2]
    optimizer = build_optimizer(method, recipe)
    assert isinstance(optimizer, RunsAdam) and optimizer.decoupled and optimizer.weight_decay == 5e-4
    assert [round(set_step_lr(optimizer, recipe, t), 8) for t in (0, 5)] == [1e-3, 1e-6]
    assert optimizer.lrs[0].item() == pytest.approx(1e-6)
