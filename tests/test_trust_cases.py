"""Issue 26, one test per case: numbers never counted twice or taken from an edited record, inputs that cannot mean
two things, every numeric option checked up front, no traceback left, errors that quote at most a short prefix.

Every test runs on the tiny random CLIP and small synthetic datasets; most stop at the validation they test.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
import unicodedata
from pathlib import Path

import pytest
import torch

from atlas_fast.cli import main
from atlas_fast.clip.backbones import BackboneConfig, load_backbone, shared_backbone
from atlas_fast.data import fewshot_subset, load_dataset
from atlas_fast.data.layouts import DatasetFormatError
from atlas_fast.engine import TrainConfig
from atlas_fast.engine.record import ResultStore
from helpers import small_pets
from layouts import imagenet_classnames, make_imagenet, make_oxford_pets, write_classnames

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_pets(tmp_path_factory, "trust")


def one_error_line(capsys, *fragments: str, limit: int = 600) -> str:
    """The command's error: one ``error:`` line (plus the --debug hint), short, with every fragment in it."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and "--debug" in err[1], err
    assert len(err[0]) <= limit, f"{len(err[0])} characters"
    for fragment in fragments:
        assert fragment in err[0], err[0]
    return err[0]


def train_args(data, *extra, results="results"):
    return ["train", "--dataset", "OxfordPets", "--data-root", str(data / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "2", "--epochs", "2", "--cache-root", str(data / "cache"),
            "--results-dir", str(data / results), "--no-progress", *extra]


def experiment_args(data, *extra):
    return ["experiment", "table3_base_to_new", "--data-root", str(data / "data"), "--datasets", "OxfordPets",
            "--model", "atlas-tiny", "--pretrained", "none", "--methods", "coop", "--epochs", "2", "--views", "1",
            "--cache-root", str(data / "cache"), "--results-dir", str(data / "results-exp"),
            "--out", str(data / "out"), "--no-progress", *extra]


def write_pets_with_names(root, names):
    """OxfordPets whose class ``i`` is called ``names[i]``."""
    dataset_dir = make_oxford_pets(root, n_classes=len(names), n_train=2, n_val=1, n_test=1, size=8)
    path = dataset_dir / "split_zhou_OxfordPets.json"
    split = json.loads(path.read_text())
    for items in split.values():
        for entry in items:
            entry[2] = names[entry[1]]
    path.write_text(json.dumps(split))
    return root


# ------------------------------------------------------------------------------------------ wrong numbers, silently


def test_experiment_refuses_a_seed_given_twice(data, capsys):
    assert main(experiment_args(data, "--seeds", "1", "1", "2")) == 2
    one_error_line(capsys, "--seeds lists 1 twice")
    assert not (data / "results-exp").exists()


def test_train_refuses_a_seed_given_twice(data, capsys):
    assert main(train_args(data, "--seeds", "1", "1", "2")) == 2
    one_error_line(capsys, "--seeds lists 1 twice")
    assert not (data / "results").exists()


@pytest.mark.parametrize("argv", [["train", "--dataset", "OxfordPets", "--data-root", "d", "--seeds", "1", "1"],
                                  ["train", "--dataset", "OxfordPets", "--data-root", "d", "--methods", "coop", "coop"],
                                  ["demo", "--datasets", "WorldPhotos", "WorldPhotos"]])
def test_a_value_given_twice_is_refused_as_the_line_is_parsed(argv):
    """Before anything is imported or read (tests/test_cli_start.py: without torch)."""
    from atlas_fast.cli import build_parser
    from atlas_fast.errors import UsageError

    with pytest.raises(UsageError, match="lists .* twice"):
        build_parser().parse_args(argv)


def test_a_sweep_refuses_the_same_run_twice(data):
    from atlas_fast.errors import UsageError
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.sweep import grid_configs, plan_sweep
    from atlas_fast.atlas.schedules import OneHot

    base = TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=2,
                       device="cpu", cache_root=data / "cache", results_dir=data / "results", progress=False)
    with pytest.raises(UsageError, match="seeds lists 2 twice"):
        grid_configs(base, ["OxfordPets"], [LabelVariant("plain", OneHot())], [2, 2])
    with pytest.raises(UsageError, match="variants .* twice"):
        grid_configs(base, ["OxfordPets"], [LabelVariant("a", OneHot()), LabelVariant("b", OneHot())], [1])
    with pytest.raises(UsageError, match="lists the run OxfordPets coop .* twice"):  # a grid point given twice
        plan_sweep([base, base])


@pytest.mark.parametrize("first, second", [
    (unicodedata.normalize("NFC", "Café"), unicodedata.normalize("NFD", "Café")),
    ("Sea Lion", "sea lion"),
    ("red  fox", "red fox"),
    ("sea_lion", "sea lion"),
])
def test_class_names_the_tokenizer_cannot_tell_apart_are_refused_naming_both(tmp_path, first, second):
    assert first != second
    tokenizer = load_backbone(BackboneConfig("atlas-tiny", None)).tokenizer
    prompts = [f"a photo of a {name.replace('_', ' ')}." for name in (first, second)]
    assert torch.equal(*tokenizer(prompts))  # the collision is real: CLIP sees one prompt
    write_pets_with_names(tmp_path, ["dog", first, "cat", second])
    with pytest.raises(DatasetFormatError, match="same text to CLIP's tokenizer") as error:
        load_dataset("OxfordPets", tmp_path)
    assert repr(first) in str(error.value) and repr(second) in str(error.value)
    write_pets_with_names(tmp_path / "fine", ["dog", first, "cat", "bird"])
    assert load_dataset("OxfordPets", tmp_path / "fine").classnames[1] == first


def test_a_name_written_twice_as_in_clips_imagenet_list_loads_with_a_warning_and_trains(tmp_path, capsys):
    """CLIP's ImageNet names (copied by CoOp's classnames.txt) hold "missile" and "sunglasses" twice: the reference
    code trains and evaluates with them, so the reader keeps them (one warning) and a base-to-new run with ATLaS-CSL
    goes through."""
    dataset_dir = make_imagenet(tmp_path, n_classes=6, n_train=2, n_val=1)
    pairs = imagenet_classnames(6)
    pairs[1], pairs[4] = (pairs[1][0], "missile"), (pairs[4][0], "missile")
    write_classnames(dataset_dir / "classnames.txt", pairs)
    with pytest.warns(UserWarning, match="classes 1 and 4 'missile' are named alike"):
        assert [load_dataset("ImageNet", tmp_path).classnames[i] for i in (1, 4)] == ["missile", "missile"]
    args = ["train", "--dataset", "ImageNet", "--data-root", str(tmp_path), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "2", "--epochs", "2", "--cache-root", str(tmp_path / "cache"),
            "--results-dir", str(tmp_path / "results"), "--no-progress", "--atlas", "csl"]
    assert main(args) == 0, capsys.readouterr().err
    assert "1 and 4 'missile' are named alike" in capsys.readouterr().err


def test_a_checkpoint_rewritten_with_the_same_size_and_mtime_is_fingerprinted_again(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "tiny.safetensors"
    first_model = load_backbone(BackboneConfig("atlas-tiny", None, init_seed=1)).model
    save_file({k: v.contiguous() for k, v in first_model.state_dict().items()}, str(path))
    config = BackboneConfig("atlas-tiny", str(path))
    first = shared_backbone(config)
    before = path.stat()
    other = load_backbone(BackboneConfig("atlas-tiny", None, init_seed=4))
    with open(path, "r+b") as f:  # rewritten in place: same size
        f.write(open_bytes(other))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same modification time
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    assert shared_backbone(config).fingerprint == other.fingerprint != first.fingerprint


def open_bytes(backbone) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in backbone.model.state_dict().items()})


# ------------------------------------------------------------------------------------------------ sealed records


def _record(key: str = "k" * 32) -> dict:
    return {"key": key, "config": {"method": "coop", "method_config": {}, "backbone": {"model": "atlas-tiny"},
                                   "shots": 2, "seed": 1},
            "backbone": {"fingerprint": "b" * 32}, "metrics": {"base": 50.0, "zero_shot": {"base": 40.0}},
            "data": {"fingerprint": "f" * 32}}


def test_an_edited_metric_breaks_the_seal_and_the_run_is_redone(tmp_path, capsys):
    store = ResultStore(tmp_path / "results")
    path = store.save("OxfordPets", "run", _record(), {"ctx": torch.ones(3)})
    assert store.find("OxfordPets", "run", "k" * 32)["metrics"]["base"] == 50.0
    record = json.loads(path.read_text())
    record["metrics"]["base"] = 95.0  # the number a paper would quote
    path.write_text(json.dumps(record, indent=2))
    capsys.readouterr()
    assert store.find("OxfordPets", "run", "k" * 32) is None  # not taken as it is: the run is redone
    err = capsys.readouterr().err
    assert str(path) in err and "seal does not match" in err and path.exists()  # a lookup moves nothing
    store.save("OxfordPets", "run", _record(), {"ctx": torch.ones(3)})  # the run redone: the edited one moves aside
    assert "moved it to" in capsys.readouterr().err and len(list(path.parent.glob("run.json.invalid-*"))) == 1
    assert store.find("OxfordPets", "run", "k" * 32)["metrics"]["base"] == 50.0


def test_a_run_record_carries_its_seal_and_provenance(data, capsys):
    from atlas_fast.engine import run
    from atlas_fast.engine.seal import record_seal

    record = run(TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=2,
                             device="cpu", cache_root=data / "cache", results_dir=data / "results-sealed",
                             progress=False))
    written = json.loads(open(record["path"]).read())
    assert written["seal"] == record_seal(written)
    provenance = written["provenance"]
    assert provenance["device_type"] == "cpu" and provenance["device_name"]
    assert provenance["cuda"] == torch.version.cuda
    assert provenance["git_commit"] is None or len(provenance["git_commit"]) == 40  # None outside a checkout
    assert provenance["git_dirty"] in (None, True, False)
    # `eval` of an edited copy is refused, naming the file
    written["metrics"]["base"] = 100.0
    edited = data / "edited" / Path(record["path"]).name
    edited.parent.mkdir()
    edited.write_text(json.dumps(written))
    shutil.copy(record["path"].replace(".json", ".pt"), edited.parent / written["learned"])
    capsys.readouterr()
    assert main(["eval", "--record", str(edited), "--dataset", "OxfordPets", "--data-root", str(data / "data"),
                 "--cache-root", str(data / "cache"), "--no-progress"]) == 2
    one_error_line(capsys, str(edited), "seal does not match")


def _report_records(root):
    """Three sealed records of two variants (as a sweep writes them), for the report tests."""
    from atlas_fast.engine.seal import sealed
    from test_report import record, write

    paths = []
    for seed, (base, new) in enumerate([(90.0, 80.0), (92.0, 82.0)], start=1):
        for variant, gain in (("coop", 0.0), ("atlas", 2.0)):
            metrics = {"base": base + gain, "new": new + gain}
            paths.append(write(root, sealed(record("OxfordPets", "coop", variant, seed, metrics))))
    return paths


def test_report_skips_a_record_whose_seal_fails_and_verify_finds_every_difference(tmp_path, capsys):
    from atlas_fast.report.collect import report_folder
    from atlas_fast.report.results_folder import collect_records
    from atlas_fast.report.verify import verify_report

    paths = _report_records(tmp_path / "results")
    report_folder(tmp_path / "results", formats=["md", "csv"])
    assert verify_report(tmp_path / "results") == []
    assert main(["report", str(tmp_path / "results"), "--verify"]) == 0
    assert "every seal and table cell checks out" in capsys.readouterr().out

    table = tmp_path / "results" / "report" / "report.csv"
    lines = table.read_text().splitlines()
    lines[1] = lines[1].replace("91.0000", "93.0000", 1)  # a cell edited in the published table
    table.write_text("\n".join(lines) + "\n")
    problems = verify_report(tmp_path / "results")
    assert len(problems) == 1 and "report.csv:2" in problems[0] and "'91.0000'" in problems[0]

    edited = json.loads(paths[0].read_text())
    edited["metrics"]["base"] = 99.0
    paths[0].write_text(json.dumps(edited))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "results"), "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"{paths[0]}: its seal does not match its content" in out
    assert len(collect_records(tmp_path / "results")) == 3  # the report itself skips it ...
    assert f"skipped {paths[0]}" in capsys.readouterr().err  # ... naming the file


def test_verify_checks_the_folder_not_only_the_last_report(tmp_path, capsys):
    """Edit a record, run a plain report (it leaves the record out and rewrites the tables), then verify: it must
    still fail, naming the file; the report lists what it left out under its tables and in sources.json."""
    from atlas_fast.engine.seal import sealed
    from atlas_fast.report.results_folder import SOURCES_FILE
    from test_report import record, write

    results = tmp_path / "results"
    paths = _report_records(results)
    edited = json.loads(paths[0].read_text())
    edited["metrics"]["base"] = 99.0
    paths[0].write_text(json.dumps(edited))
    assert main(["report", str(results), "--format", "md", "csv"]) == 0
    out = capsys.readouterr().out
    assert f"Left out of the tables (1 record file(s)" in out and f"- {paths[0]}: " in out
    sources = json.loads((results / "report" / SOURCES_FILE).read_text())
    assert [item["path"] for item in sources["left_out"]] == [paths[0].relative_to(results).as_posix()]
    assert len(sources["records"]) == 3

    assert main(["report", str(results), "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"verify: {paths[0]}: not a valid finished record (its seal does not match its content" in out
    assert "FAILED, 1 problem(s)" in out

    paths[0].write_text("{ truncated")  # a record that cannot be read at all is named too
    assert main(["report", str(results), "--verify"]) == 1
    assert f"verify: {paths[0]}: not a readable atlas_fast result record" in capsys.readouterr().out

    paths[0].unlink()  # the damaged file gone: the report's tables still check out ...
    assert main(["report", str(results), "--verify"]) == 0
    capsys.readouterr()
    added = write(results, sealed(record("OxfordPets", "coop", "coop", 3, {"base": 91.0, "new": 81.0})))
    assert main(["report", str(results), "--verify"]) == 1  # ... but not a record written after the report
    assert f"verify: {added} is not in the report (written after it?)" in capsys.readouterr().out


def test_records_from_before_seals_still_report_with_a_warning(tmp_path, capsys):
    from atlas_fast.report.collect import report_folder
    from atlas_fast.report.results_folder import collect_records
    from atlas_fast.report.verify import verify_report
    from test_report import record, write

    path = write(tmp_path / "results", record("OxfordPets", "coop", "coop", 1, {"base": 90.0, "new": 80.0}))
    assert len(collect_records(tmp_path / "results")) == 1
    assert f"result record {path} have no seal" in capsys.readouterr().err
    report_folder(tmp_path / "results", formats=["csv"])
    assert any("has no seal" in problem for problem in verify_report(tmp_path / "results"))


# ---------------------------------------------------------------------------------------------- tracebacks left


def test_a_huge_learning_rate_is_refused_before_torch_sees_it(data, capsys):
    assert main(train_args(data, "--lr", "1e300")) == 2
    one_error_line(capsys, "lr", "1e+300")


def test_report_skips_a_foreign_record_whose_seed_is_text(tmp_path, capsys):
    from atlas_fast.report.collect import report_folder
    from test_report import record, write

    write(tmp_path / "results", record("OxfordPets", "coop", "coop", 1, {"base": 90.0, "new": 80.0}))
    foreign = write(tmp_path / "results", record("OxfordPets", "coop", "coop", "two", {"base": 91.0, "new": 81.0}))
    capsys.readouterr()
    assert "| OxfordPets |" in report_folder(tmp_path / "results", formats=["md"])
    err = capsys.readouterr().err
    assert f"skipped {foreign}" in err and "config.seed is 'two', not a whole number" in err
    assert main(["report", str(tmp_path / "results"), "--format", "md"]) == 0


def test_a_subset_file_holding_a_list_is_refused_naming_it(data, tmp_path):
    splits = load_dataset("OxfordPets", data / "data")
    fewshot_subset(splits, 2, seed=1, store_dir=tmp_path)
    (path,) = tmp_path.glob("shot_2-seed_1-*.json")
    stored = json.loads(path.read_text())
    stored["train"][0] = ["a", "list"]
    path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match=f"{path}: its 'train' list holds \\['a', 'list'\\], not an image path"):
        fewshot_subset(splits, 2, seed=1, store_dir=tmp_path)


def test_a_second_world_generator_waits_for_the_first(tmp_path):
    """The first generator holds the lock and has written its manifest's temporary file: the second must wait
    (not refuse the folder as foreign), then generate once the first lets go."""
    from atlas_fast.world.benchmark import LOCK_FILE, MANIFEST_FILE, STAMP_FILE, SplitSizes, generate_benchmark

    folder = tmp_path / "world_dark"
    folder.mkdir()
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    (folder / f".{MANIFEST_FILE}.x1y2.tmp").write_text("{")  # the first one's manifest, half written
    outcome = {}

    def second():
        try:
            outcome["paths"] = generate_benchmark(tmp_path, ["WorldDark"], sizes=SplitSizes(1, 1, 1), progress=False)
        except Exception as exc:  # what the old check did: a false "not written by the world generator"
            outcome["error"] = exc

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive() and not outcome, outcome  # waiting on the lock
    os.close(fd)  # the first one is gone (killed: its temporary file stays)
    thread.join(60)
    assert "error" not in outcome, outcome
    assert (folder / STAMP_FILE).is_file()


# -------------------------------------------------------------------------------------- late or unclear errors


@pytest.mark.parametrize("method, option, fragment", [
    ("kgcoop", "kg_weight=inf", "KgCoOpConfig.kg_weight must be a finite number"),
    ("dept-coop", "head_lr_scale=inf", "DePTCoOpConfig.head_lr_scale must be a finite number"),
    ("kgcoop", "kg_weight=1e300", "KgCoOpConfig.kg_weight must be in"),
])
def test_infinite_method_options_are_refused_naming_them(data, capsys, method, option, fragment):
    cache = data / "cache-methods"
    assert main(train_args(data, "--method", method, "--method-option", option, "--cache-root", str(cache))) == 2
    one_error_line(capsys, fragment)
    assert not cache.exists()  # before anything is encoded


@pytest.mark.parametrize("flags, fragment", [
    (["--atlas", "isl", "--alpha", "inf"], "SoftLabelConfig.alpha"),
    (["--atlas", "csl", "--tau-c", "inf"], "SoftLabelConfig.tau_c"),
    (["--atlas", "csl", "--tau-c", "1e-300"], "SoftLabelConfig.tau_c"),
])
def test_soft_label_options_out_of_range_are_refused_before_any_work(data, capsys, flags, fragment):
    assert main(train_args(data, *flags, results="results-soft")) == 2
    one_error_line(capsys, fragment)
    assert not (data / "results-soft").exists()


def test_a_record_json_cannot_hold_leaves_no_orphan_tensors(tmp_path):
    store = ResultStore(tmp_path / "results")
    record = {**_record(), "config": {**_record()["config"], "soft_labels": {"tau_c": float("inf")}}}
    with pytest.raises(ValueError, match="cannot be written as JSON .*nothing was written"):
        store.save("OxfordPets", "run", record, {"ctx": torch.ones(3)})
    assert not list((tmp_path / "results").rglob("*.pt")) and not list((tmp_path / "results").rglob("*.json"))


def test_cache_build_refuses_a_negative_shot_count(data, capsys):
    assert main(["cache", "build", "--dataset", "OxfordPets", "--data-root", str(data / "data"), "--model",
                 "atlas-tiny", "--pretrained", "none", "--cache-root", str(data / "cache-shots"), "--shots", "-1",
                 "--seeds", "1"]) == 2
    one_error_line(capsys, "--shots must be >= 1, got -1")
    assert not (data / "cache-shots").exists()


def test_a_seed_beyond_32_bits_is_refused_naming_it_before_any_file_is_written(data, capsys):
    assert main(train_args(data, "--seed", str(2**64), results="results-seed")) == 2
    one_error_line(capsys, "seed", str(2**64))
    assert not (data / "results-seed").exists()


def test_gpus_per_group_nan_is_refused_naming_the_option(data, capsys):
    assert main(experiment_args(data, "--executor", "ray", "--gpus-per-group", "nan")) == 2
    one_error_line(capsys, "--gpus-per-group", "nan")


def test_a_dry_run_refuses_an_unknown_target_like_the_real_run(data, tmp_path, capsys):
    args = ["experiment", "table_cross_dataset", "--data-root", str(data / "data"), "--datasets", "OxfordPets",
            "--model", "atlas-tiny", "--pretrained", "none", "--seeds", "1", "--epochs", "2", "--methods", "coop",
            "--cache-root", str(data / "cache"), "--results-dir", str(tmp_path / "results"), "--targets",
            "NoSuchSet", "--out", str(tmp_path / "out")]
    assert main(args + ["--dry-run"]) == 2
    dry = one_error_line(capsys, "NoSuchSet")
    assert main(args) == 2
    assert one_error_line(capsys, "NoSuchSet") == dry


def test_a_huge_class_name_is_refused_in_a_short_line(tmp_path, capsys):
    write_pets_with_names(tmp_path / "data", ["x" * 20_000, "dog", "cat", "bird"])
    args = ["train", "--dataset", "OxfordPets", "--data-root", str(tmp_path / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "2", "--epochs", "2", "--cache-root", str(tmp_path / "cache"),
            "--results-dir", str(tmp_path / "results"), "--no-progress"]
    assert main(args) == 2
    one_error_line(capsys, "does not fit the text tower's context", "(20000 characters)", limit=500)


@pytest.mark.parametrize("flags, fragment", [
    (["--dataset", "x" * 20_000], "unknown dataset 'xxxx"),
    (["--method-option", "n_ctx=" + "7x" * 10_000], "option n_ctx takes a int"),
    (["--method", "m" * 20_000], "unknown method"),
])
def test_errors_quote_a_short_prefix_of_huge_values(data, capsys, flags, fragment):
    args = train_args(data, *flags, results="results-huge")
    if flags[0] == "--dataset":  # replaces the one train_args gives
        args[args.index("--dataset") + 1] = flags[1]
        args = args[:-2]
    assert main(args) == 2
    one_error_line(capsys, fragment, "(20003 characters)", limit=800)


@pytest.mark.parametrize("flags, fragment", [
    (["--atlas", "none", "--schedule", "tfkd", "--tfkd-tau", "1e-300"], "TF-KD temperature tau must be in"),
    (["--batch-size", str(10**12)], "batch_size override must be a whole number"),
    (["--workers", str(10**9)], "workers must be a whole number"),
])
def test_other_numeric_options_are_bounded_up_front(data, capsys, flags, fragment):
    assert main(train_args(data, *flags, results="results-bounds")) == 2
    one_error_line(capsys, fragment)
    assert not (data / "results-bounds").exists()


def test_world_image_counts_are_checked_before_anything_is_generated(tmp_path):
    from atlas_fast.world.benchmark import SplitSizes

    with pytest.raises(ValueError, match="train split must be a whole number in"):
        SplitSizes(-1, 1, 1)


def test_demo_refuses_a_seed_given_twice_before_generating_the_world(tmp_path, capsys):
    assert main(["demo", "--data-root", str(tmp_path / "world"), "--seeds", "1", "1", "--no-progress"]) == 2
    one_error_line(capsys, "--seeds lists 1 twice")
    assert not (tmp_path / "world").exists()
