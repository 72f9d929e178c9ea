"""``atlas-fast train`` / ``atlas-fast eval`` end to end on the tiny model and a synthetic OxfordPets."""

import re

import pytest

from atlas_fast.cli import main
from layouts import make_imagenet, make_oxford_pets


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    make_oxford_pets(root / "data", n_classes=6, n_train=4, n_val=2, n_test=3, size=36)
    make_imagenet(root / "data", n_classes=4, n_train=3, n_val=2, size=36)
    return root


def train_args(root, *extra):
    return ["train", "--dataset", "OxfordPets", "--data-root", str(root / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "4", "--epochs", "4", "--batch-size", "4", "--views", "2",
            "--cache-root", str(root / "cache"), "--results-dir", str(root / "results"), "--no-progress", *extra]


NUMBER = r"(\d+\.\d\d)"
# What train_args changes from the recipe and the paper's presets, as every run line and the summary print it.
TINY = "[epochs=4, batch=4, shots=4, views=2, backbone=atlas-tiny]"
DEVIATIONS = r"(?: \[[^\]]*\])?"  # a run line's deviations, where a test does not pin them


@pytest.mark.parametrize("flags, name", [
    ([], f"coop {TINY}"),
    (["--atlas", "ls"], f"coop+ATLaS (K=2) {TINY}"),
    (["--atlas", "csl"], f"coop+ATLaS-CSL (K=2) {TINY}"),
    (["--atlas", "isl", "--alpha", "0.5"], f"coop+ATLaS-ISL (K=2) {TINY.replace('[', '[α=0.5, ')}"),
])
def test_train_prints_base_new_h(root, capsys, flags, name):
    assert main(train_args(root, *flags)) == 0
    out = capsys.readouterr().out
    line = re.search(rf"OxfordPets {re.escape(name)} seed 1: base {NUMBER}  new {NUMBER}  H {NUMBER}", out)
    assert line, out
    base, new, h = map(float, line.groups())
    assert h == pytest.approx(0.0 if base + new == 0 else 2 * base * new / (base + new), abs=0.01)
    assert "| dataset | method | seeds | base | new | H |\n|---|---|---|---:|---:|---:|\n" in out
    assert re.search(rf"\| OxfordPets \| {re.escape(name)} \| 1 \| {NUMBER} \| {NUMBER} \| {NUMBER} \|", out)


def test_second_identical_run_is_skipped_and_eval_reads_the_record(root, capsys):
    assert main(train_args(root, "--atlas", "csl", "--K", "3", "--seed", "2")) == 0
    first = capsys.readouterr().out
    assert "skipped" not in first
    assert main(train_args(root, "--atlas", "csl", "--K", "3", "--seed", "2")) == 0
    second = capsys.readouterr().out
    assert "(existing record, skipped)" in second
    record = re.search(r"record: (\S+\.json)", second).group(1)
    trained_new = float(re.search(rf"new {NUMBER}", second).group(1))

    assert main(["eval", "--record", record, "--dataset", "OxfordPets", "--data-root", str(root / "data"),
                 "--subsample", "new", "--cache-root", str(root / "cache"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    match = re.search(rf"OxfordPets \(new, 3 classes, 9 test images\): accuracy {NUMBER}", out)
    assert match, out
    assert float(match.group(1)) == pytest.approx(trained_new, abs=0.01)


def test_bad_flag_combinations_are_explained(root, capsys):
    assert main(train_args(root, "--schedule", "joint")) == 2
    assert "error: --schedule joint trains on soft labels: choose them with --atlas" in capsys.readouterr().err
    assert main(train_args(root, "--schedule", "ols", "--atlas", "ls")) == 2
    assert "drop --atlas" in capsys.readouterr().err


def test_cross_dataset_train_on_imagenet_then_eval_on_another_dataset(root, capsys):
    args = train_args(root, "--setting", "cross_dataset", "--atlas", "isl", "--epochs", "3")
    args[args.index("OxfordPets")] = "ImageNet"
    args[args.index("--shots") + 1] = "2"
    assert main(args) == 0
    out = capsys.readouterr().out
    name = re.escape("ImageNet coop+ATLaS-ISL (K=3) [epochs=3, batch=4, shots=2, views=2, backbone=atlas-tiny] seed 1")
    assert re.search(rf"{name}: all {NUMBER}  \| zero-shot CLIP: all {NUMBER}", out), out
    assert "| dataset | method | seeds | all |" in out
    record = re.search(r"record: (\S+\.json)", out).group(1)
    assert main(["eval", "--record", record, record, "--dataset", "oxford_pets", "--data-root", str(root / "data"),
                 "--cache-root", str(root / "cache"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"OxfordPets \(all, 6 classes, 18 test images\): accuracy {NUMBER}", out), out
    assert re.search(rf"mean over 2 runs: {NUMBER}", out)


@pytest.mark.parametrize("method, options", [
    ("maple", ["depth=2"]),
    ("promptsrc", ["depth_text=2", "depth_vision=2", "gpa_mean=3"]),
])
def test_train_pixel_methods_from_the_command_line(root, capsys, method, options):
    """The full-forward methods run from the CLI with and without ATLaS; --method-option fits the recipe's depth
    to the tiny backbone's 2 blocks."""
    for flags, name in (([], method), (["--atlas", "ls"], f"{method}+ATLaS (K=2)")):
        args = train_args(root, "--method", method, "--workers", "0", "--method-option", *options, *flags)
        assert main(args) == 0
        out = capsys.readouterr().out
        line = rf"OxfordPets {re.escape(name)}{DEVIATIONS} seed 1: base {NUMBER}  new {NUMBER}  H {NUMBER}"
        assert re.search(line, out), out


def test_method_options_are_checked(root, capsys):
    assert main(train_args(root, "--method", "maple", "--method-option", "deepth=2")) == 2
    assert "no option 'deepth'" in capsys.readouterr().err
    assert main(train_args(root, "--method", "maple", "--workers", "0")) == 2
    assert "maple: prompt depth(s) depth=9 exceed the towers of atlas-tiny (2 text / 2 vision blocks); lower them " \
           "with --method-option depth=2" in capsys.readouterr().err
    # IVLP names both of its depths at once (it used to fail on depth_text, then on depth_vision)
    assert main(train_args(root, "--method", "ivlp", "--workers", "0")) == 2
    assert "--method-option depth_text=2 depth_vision=2" in capsys.readouterr().err
    # issue 44: a prefix naming no method of the command is refused before any work (it used to be ignored, so a
    # misspelt clip-lora-txt:rank=4 trained with the recipe's rank and exited 0)
    assert main(train_args(root, "--methods", "clip-lora-text", "--method-option", "clip-lora-txt:rank=4")) == 2
    assert ("error: --method-option 'clip-lora-txt:rank=4': 'clip-lora-txt' names no method of this command "
            "(--method clip-lora-text); prefix one of them, or give rank=4 without a prefix for every method."
            in capsys.readouterr().err)
    assert main(train_args(root, "--methods", "ivlp", "--method-option", "ivlp:depth_text=2", "maple:depth=1")) == 2
    assert "'maple' names no method of this command (--method ivlp)" in capsys.readouterr().err
    # the same [METHOD:]NAME=VALUE syntax as the experiments: a prefixed option applies to its method only
    assert main(train_args(root, "--methods", "ivlp", "--method-option", "ivlp:depth_text=2",
                           "ivlp:depth_vision=2", "--workers", "0")) == 0


def test_a_split_json_dataset_trains_from_the_command_line(root, tmp_path, capsys):
    """``--dataset split:<folder>/<split file>.json#<images>``: a CoOp split-JSON dataset without registering it."""
    import shutil

    shutil.copytree(root / "data" / "oxford_pets", tmp_path / "my_pets")
    args = ["train", "--dataset", f"split:{tmp_path / 'my_pets' / 'split_zhou_OxfordPets.json'}#images",
            "--data-root", str(tmp_path), "--model", "atlas-tiny", "--pretrained", "none", "--shots", "2",
            "--epochs", "2", "--cache-root", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results"),
            "--no-progress"]
    assert main(args) == 0
    assert re.search(rf"seed 1: base {NUMBER}  new {NUMBER}", capsys.readouterr().out)
    assert list((tmp_path / "results" / "my_pets").glob("*.json"))  # named after the dataset folder
    bad = ["train", "--dataset", f"split:{tmp_path / 'my_pets'}", "--data-root", str(tmp_path)]
    assert main(bad) == 2
    assert "give the split file by a path inside its dataset folder" in capsys.readouterr().err
