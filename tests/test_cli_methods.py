"""``atlas-fast train --method M`` for every text-side method, with and without ATLaS-ISL, base-to-new on a synthetic
OxfordPets (tiny random CLIP) and on the embedded world (the shipped atlas-world CLIP); DePT's saved head in
cross-dataset evaluation; the staged lr of the loop."""

import json
import re
from pathlib import Path

import pytest

from atlas_fast.cli import main
from atlas_fast.engine.loop import build_optimizer, lr_at_epoch, set_epoch_lr
from atlas_fast.engine.evaluate import harmonic_mean
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.dept import dept_coop_recipe
from atlas_fast.world.benchmark import SplitSizes, generate_benchmark
from layouts import make_imagenet, make_oxford_pets

pytestmark = pytest.mark.usefixtures("one_thread")

METHODS = ("zsclip", "coop", "cocoop", "kgcoop", "dept-coop", "dept-cocoop", "dept-kgcoop")
NUMBER = r"(\d+\.\d\d)"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("methods")
    make_oxford_pets(root / "data", n_classes=6, n_train=4, n_val=2, n_test=3, size=36)
    make_imagenet(root / "data", n_classes=4, n_train=3, n_val=2, size=36)
    generate_benchmark(root / "data", ["WorldSketches"], sizes=SplitSizes(train=2, val=1, test=1), progress=False)
    return root


def train_args(root, dataset, method, *extra, backbone=("atlas-tiny", "none")):
    return ["train", "--dataset", dataset, "--data-root", str(root / "data"), "--model", backbone[0],
            "--pretrained", backbone[1], "--method", method, "--shots", "4", "--epochs", "2", "--batch-size", "4",
            "--views", "2", "--cache-root", str(root / "cache"), "--results-dir", str(root / "results"),
            "--no-progress", *extra]


DEVIATIONS = r"(?: \[[^\]]*\])?"  # what a run changes from the recipe and presets (tests/test_report_names.py)


def base_new_h(out, dataset, label):
    line = re.search(rf"{dataset} {re.escape(label)}{DEVIATIONS} seed 1: base {NUMBER}  new {NUMBER}  H {NUMBER}", out)
    assert line, out
    return tuple(map(float, line.groups()))


@pytest.mark.parametrize("dataset, backbone", [("OxfordPets", ("atlas-tiny", "none")),
                                               ("WorldSketches", ("atlas-world", "atlas-world"))])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_base_to_new_with_and_without_atlas(root, capsys, dataset, backbone, method):
    shots = ("--shots", "2") if dataset == "WorldSketches" else ()  # 24 world classes: keep CoCoOp's B x C small
    assert main(train_args(root, dataset, method, *shots, backbone=backbone)) == 0
    plain = base_new_h(capsys.readouterr().out, dataset, method)
    if method == "zsclip":
        assert main(train_args(root, dataset, method, "--atlas", "isl", backbone=backbone)) == 2
        assert "learns nothing" in capsys.readouterr().err
        return
    assert main(train_args(root, dataset, method, *shots, "--atlas", "isl", backbone=backbone)) == 0
    out = capsys.readouterr().out
    atlas = base_new_h(out, dataset, f"{method}+ATLaS-ISL (K=2)")
    for values in (plain, atlas):  # the printed line is the record's metrics
        assert values[2] == pytest.approx(harmonic_mean(values[0], values[1]), abs=0.01)
    record = json.loads(Path(re.findall(r"record: (\S+\.json)", out)[-1]).read_text())
    assert atlas == tuple(round(record["metrics"][name], 2) for name in ("base", "new", "H"))
    assert [e["soft"] for e in record["epochs"]] == [False, True]  # K = 2 over 2 epochs: the second is soft


def test_dept_head_fuses_on_the_source_classes_and_not_on_another_dataset(root, capsys):
    args = train_args(root, "ImageNet", "dept-coop", "--setting", "cross_dataset", "--shots", "2")
    assert main(args) == 0
    out = capsys.readouterr().out
    source = float(re.search(rf"ImageNet dept-coop{DEVIATIONS} seed 1: all {NUMBER}", out).group(1))
    record = re.search(r"record: (\S+\.json)", out).group(1)
    for dataset, pattern in (("ImageNet", r"ImageNet \(all, 4 classes"), ("OxfordPets", r"OxfordPets \(all, 6 classes")):
        assert main(["eval", "--record", record, "--dataset", dataset, "--data-root", str(root / "data"),
                     "--cache-root", str(root / "cache"), "--no-progress"]) == 0
        out = capsys.readouterr().out
        match = re.search(rf"{pattern}, \d+ test images\): accuracy {NUMBER}", out)
        assert match, out
        if dataset == "ImageNet":  # the record's evaluation (fused with the head) is reproduced from the saved tensors
            assert float(match.group(1)) == pytest.approx(source, abs=0.01)


def test_missing_recipes_need_all_three_of_epochs_batch_and_lr(root, capsys):
    args = train_args(root, "OxfordPets", "cocoop", "--setting", "few_shot")
    args.remove("--epochs"), args.remove("2")
    assert main(args) == 2
    assert "no 'few_shot' recipe" in capsys.readouterr().err
    assert main(args + ["--epochs", "1", "--lr", "0.002"]) == 0
    assert re.search(rf"OxfordPets cocoop{DEVIATIONS} seed 1: all {NUMBER}", capsys.readouterr().out)


def test_staged_lr_scales_the_head_but_not_the_shared_warmup(tiny):
    config, recipe = dept_coop_recipe("paper", "base2new", 16, "OxfordPets")
    method = build_method("dept-coop", tiny, ["a", "b"], config)
    optimizer = build_optimizer(method, recipe)
    assert [g["lr_scale"] for g in optimizer.groups] == [1.0, 6.5]
    assert [lr_at_epoch(recipe, 0, s) for s in (1.0, 6.5)] == [1e-5, 1e-5]
    assert lr_at_epoch(recipe, 1, 6.5) == pytest.approx(0.0035 * 6.5)  # 0.02275, docs/method-zoo.md, section DePT
    assert lr_at_epoch(recipe, 1) == pytest.approx(0.0035)
    set_epoch_lr(optimizer, recipe, 1)
    assert [lr.item() for lr in optimizer.lrs] == pytest.approx([0.0035, 0.0035 * 6.5])
