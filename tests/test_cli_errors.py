"""The command line's stumbles answered directly: a method or dataset typo is named even when other required options
are missing, in a line or two without the usage; ``report`` on a folder without records names the nearest folder
that has them; the world's datasets imply the world's CLIP; warnings are one line without source, and none for a
default the user did not choose; ``experiment --list`` prints whole summaries; a mismatched torch/torchvision pair
is one error line. That these refusals import no torch is checked in tests/test_cli_start.py."""

import argparse
import json
import warnings

import pytest

from atlas_fast.cli import build_parser, main
from layouts import make_oxford_pets


def _refusal(argv, capsys) -> list[str]:
    assert main(argv) == 2
    return capsys.readouterr().err.strip().splitlines()


def test_a_method_typo_is_named_without_the_other_required_options(capsys):
    lines = _refusal(["train", "--method", "coopp"], capsys)
    assert len(lines) == 2, lines  # the error and the --debug hint: not 22 lines of usage
    assert lines[0].startswith("error: unknown method 'coopp'") and "coop, " in lines[0] and "--dataset" not in lines[0]


def test_search_names_a_method_typo_without_the_other_required_options(capsys):
    lines = _refusal(["search", "--method", "coopp"], capsys)
    assert len(lines) == 2 and lines[0].startswith("error: unknown method 'coopp'")


def test_a_dataset_typo_is_named_without_the_data_root(capsys):
    lines = _refusal(["train", "--dataset", "OxfordPetz"], capsys)
    assert len(lines) == 2 and lines[0].startswith("error: unknown dataset 'OxfordPetz'") and "OxfordPets" in lines[0]


def test_eval_names_a_dataset_typo_as_parsed(capsys):
    lines = _refusal(["eval", "--dataset", "NoSuchSet"], capsys)
    assert "unknown dataset 'NoSuchSet'" in lines[0]


def _record(folder, name="coop-seed1.json"):
    """A minimal valid record (from before seals) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({
        "status": "finished", "key": "k" * 32, "metrics": {"base": 50.0, "zero_shot": {"base": 40.0}},
        "config": {"dataset": "WorldPhotos", "backbone": {"model": "atlas-world"}, "method": "coop",
                   "method_config": {}, "shots": 2, "seed": 1},
        "backbone": {"fingerprint": "b" * 32}, "data": {"fingerprint": "f" * 32}}))


def test_report_on_a_folder_without_records_names_the_nearest_one(tmp_path, capsys):
    _record(tmp_path / "results" / "demo" / "WorldPhotos")  # where the demo writes
    (tmp_path / "results" / "demo" / "report").mkdir()
    assert main(["report", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"No finished result record under {tmp_path / 'results'}" in err
    assert f"nearest folder with records is {tmp_path / 'results' / 'demo'}" in err
    assert f"atlas-fast report {tmp_path / 'results' / 'demo'}" in err


def test_report_on_a_missing_folder_names_a_folder_beside_it(tmp_path, capsys):
    _record(tmp_path / "runs" / "OxfordPets")
    assert main(["report", str(tmp_path / "reslts")]) == 2
    err = capsys.readouterr().err
    assert "reslts does not exist" in err and f"is {tmp_path / 'runs'}:" in err


def test_report_with_nothing_near_says_so(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no folder near it has any" in capsys.readouterr().err


def _backbone(argv):
    from atlas_fast.app.options import resolve_backbone

    args = build_parser().parse_args(argv)
    resolve_backbone(args)
    return args.model, args.pretrained


@pytest.mark.parametrize("extra, expected", [
    ([], ("atlas-world", "atlas-world")),
    (["--pretrained", "none"], ("atlas-world", None)),
    (["--model", "ViT-B-32"], ("ViT-B-32", "openai")),
    (["--model", "atlas-world", "--pretrained", "my.safetensors"], ("atlas-world", "my.safetensors"))])
def test_world_datasets_imply_the_worlds_clip_unless_one_is_given(extra, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.safetensors").write_bytes(b"")  # a weights file is checked as the line is parsed
    assert _backbone(["train", "--dataset", "WorldPhotos", "--data-root", "d", *extra]) == expected
    assert _backbone(["cache", "build", "--dataset", "worldsketches", "--data-root", "d", *extra]) == expected


def test_other_argument_errors_are_one_line_and_a_pointer_to_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--dataset", "OxfordPets"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and lines == ["atlas-fast train: error: the following arguments are required: "
                                               "--data-root", "(`atlas-fast train --help` lists the options)"]


def test_other_datasets_keep_the_papers_clip():
    assert _backbone(["train", "--dataset", "OxfordPets", "--data-root", "d"]) == ("ViT-B-16", "openai")
    assert _backbone(["train", "--dataset", "OxfordPets", "--data-root", "d", "--model", "atlas-world"]) == (
        "atlas-world", "atlas-world")


def test_a_warning_is_one_line_without_its_source(monkeypatch, capsys):
    def warns(args: argparse.Namespace) -> int:
        warnings.warn("the folder looks odd")
        warnings.warn("`torch.jit.load` is deprecated", FutureWarning)  # a library's notice to developers
        return 0

    monkeypatch.setattr("atlas_fast.cli.report.run_report_command", warns)
    assert main(["report", "anything"]) == 0
    assert capsys.readouterr().err == "warning: the folder looks odd\n"
    assert warnings.showwarning.__name__ != "show_warning"  # restored after the command


def test_no_unbatched_warning_unless_batching_was_asked_for(tmp_path, capsys, monkeypatch):
    from atlas_fast.methods.registry import method_class

    monkeypatch.setattr(method_class("kgcoop"), "supports_batched_runs", False)  # as a plugin's method may be
    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=3, n_val=1, n_test=2, size=32)
    argv = ["train", "--dataset", "OxfordPets", "--data-root", str(tmp_path / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--methods", "kgcoop", "--seeds", "1", "2", "--epochs", "1", "--batch-size", "4",
            "--device", "cpu", "--no-progress", "--cache-root", str(tmp_path / "cache"),
            "--results-dir", str(tmp_path / "results")]
    assert main(argv + ["--threads", "1"]) == 0
    assert "batched" not in capsys.readouterr().err  # the default grouping is not the user's choice
    assert main(argv + ["--threads", "1", "--batch-runs", "2"]) == 0  # finished runs: only the warning is new
    warned = [line for line in capsys.readouterr().err.splitlines() if "batched" in line]
    assert warned == ["warning: kgcoop does not support batched runs: --batch-runs 2 trains its seeds one by one."]


def test_experiment_list_prints_whole_summaries(capsys):
    from atlas_fast.cli.experiment import summary
    from atlas_fast.experiments import experiment_names

    assert main(["experiment", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 100 for line in lines if line.startswith("    "))  # wrapped, never cut
    joined = " ".join(line.strip() for line in lines)
    for name in experiment_names():
        what = summary(name)
        assert what.endswith("."), (name, what)  # a whole sentence, not a docstring's first line
        assert what.split(": ", 1)[-1] in joined, name


@pytest.mark.parametrize("torch_version, vision_version, wanted", [
    ("2.14.1", "0.29.1", None), ("2.0.1", "0.15.2", None), ("2.14.1+cpu", "0.29.0+cpu", None),
    ("2.14.1+cpu", "0.28.0+cpu", "0.29"), ("2.13.0", "0.29.1", "0.28"), ("1.13.1", "0.14.1", None)])
def test_a_torch_pair_matches_by_the_release_rule(torch_version, vision_version, wanted):
    from atlas_fast.app.torch_pair import pair_problem

    problem = pair_problem(torch_version, vision_version)
    if wanted is None:
        assert problem is None
    else:
        assert torch_version in problem and vision_version in problem and f'"torchvision=={wanted}.*"' in problem
        assert ("--index-url" in problem) == ("+cpu" in torch_version)


def test_a_mismatched_torch_pair_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr("atlas_fast.app.torch_pair.installed_pair", lambda: ("2.14.1", "0.28.0"))
    assert main(["experiment", "--list"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "torch 2.14.1 and torchvision 0.28.0 do not match" in errors[0]


def test_a_cpu_torch_beside_pypis_torchvision_is_refused_though_their_numbers_match(monkeypatch, capsys):
    """torch 2.13.0+cpu with torchvision 0.28.0 passed (the numbers pair) and the demo died with 'operator
    torchvision::nms does not exist': the builds are compared too, before any import."""
    from atlas_fast.app.torch_pair import build_problem

    monkeypatch.setattr("atlas_fast.app.torch_pair.installed_pair", lambda: ("2.13.0+cpu", "0.28.0"))
    assert main(["experiment", "--list"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "torch 2.13.0+cpu is a CPU build and torchvision 0.28.0" in errors[0]
    assert "torchvision::nms" in errors[0] and '"torchvision==0.28.*" --index-url' in errors[0]
    for same in (("2.14.1", "0.29.1"), ("2.14.1+cu130", "0.29.1+cu130"), ("2.13.0+cpu", "0.28.0+cpu")):
        assert build_problem(*same, platform="linux") is None
    assert build_problem("2.13.0+cpu", "0.28.0", platform="darwin") is None  # PyPI's macOS wheels are CPU builds


def test_torchvision_operators_needing_a_library_torch_lacks_are_found_from_the_files(tmp_path):
    """The installed torchvision's compiled operators (its _C file's ELF needs, read without loading it) against a
    torch folder holding only a CPU build's libraries: the CUDA libraries it lacks are named."""
    import glob
    import importlib.util
    import os

    from atlas_fast.app.torch_pair import library_problem, needed_libraries

    vision = os.path.dirname(importlib.util.find_spec("torchvision").origin)
    compiled = sorted(glob.glob(os.path.join(vision, "_C*.so")))
    if not compiled or "libtorch_cuda.so" not in needed_libraries(compiled[0]):
        pytest.skip("the installed torchvision is not a CUDA build: nothing a CPU torch would lack")
    assert "libtorch_cpu.so" in needed_libraries(compiled[0])
    (tmp_path / "lib").mkdir()
    for name in ("libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so"):  # a CPU torch's
        (tmp_path / "lib" / name).write_bytes(b"")
    problem = library_problem("2.13.0+cpu", "0.28.0", str(tmp_path), vision)
    assert problem is not None and "libtorch_cuda.so" in problem and "libc10_cuda.so" in problem
    assert library_problem("2.14.1", "0.29.1") is None  # this machine's own pair loads


@pytest.mark.parametrize("argv, hint", [
    (["train", "--method", "cooop"], "unknown method 'cooop' (did you mean 'coop'?); valid: "),
    (["train", "--dataset", "OxfordPetz", "--data-root", "d"], "unknown dataset 'OxfordPetz' (did you mean "
                                                               "'OxfordPets'?); valid"),
    (["train", "--dataset", "oxford_petz", "--data-root", "d"], "(did you mean 'OxfordPets'?)"),
    (["experiment", "table3_base_to_nw"], "Unknown experiment 'table3_base_to_nw' (did you mean "
                                          "'table3_base_to_new'?); valid: ")])
def test_a_mistyped_name_is_answered_with_the_nearest_valid_one(argv, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and hint in err, err


def test_a_name_near_nothing_gets_no_suggestion(capsys):
    assert main(["train", "--method", "zzzz"]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'zzzz'; valid: " in err and "did you mean" not in err
