"""Property-based tests of everything that parses user input: whatever it is given, the option parsers and typed
configs, the split-JSON and class-folder readers, the record loader and ``report``'s collector return a result or
raise a user error (one ``error:`` line on the command line), never anything else.

Kept small (a few dozen examples each, no deadline) so that all of them run in seconds in the default suite.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from atlas_fast.errors import user_errors

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
NUMBERS = (st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([0, 1, -1, 2**32, 2**64, 1e300, 1e-300, float("nan"), float("inf")]))
# Class-name material that collides under CLIP's tokenizer cleaning: case, runs of blanks, '_', NFC/NFD accents.
NAME_TEXT = st.text(alphabet="aAbB _é\u0301\u00a0", min_size=1, max_size=6)


def user_error_or_result(call, *args, **kwargs):
    """``call``'s result, or None when it raised a user error; anything else fails the test."""
    try:
        return call(*args, **kwargs)
    except user_errors():
        return None


# ------------------------------------------------------------------------------------------------ option parsers


@FAST
@given(items=st.lists(st.text(max_size=12), max_size=4), method=st.sampled_from(["coop", "maple", ""]))
def test_method_option_parser(items, method):
    from atlas_fast.app.options import method_options

    options = user_error_or_result(method_options, items, method)
    assert options is None or all(isinstance(k, str) and isinstance(v, str) for k, v in options.items())


@FAST
@given(value=st.text(max_size=20))
def test_split_option_parser(value):
    import argparse

    from atlas_fast.cli.cache import _split_names

    try:
        names = _split_names(value)
    except argparse.ArgumentTypeError:
        return
    assert names and set(names) <= {"train", "val", "test"}


@FAST
@given(option=st.sampled_from(["n_ctx", "ctx_init", "csc", "class_token_position", "kg_weight", "depth",
                               "head_lambda", "head_lr_scale", "fusion", "gpa_std", "num_runs", "bogus"]),
       value=st.text(max_size=10) | NUMBERS.map(str),
       method=st.sampled_from(["coop", "kgcoop", "dept-coop", "maple", "promptsrc"]))
def test_method_config_options(option, value, method):
    from atlas_fast.engine.spec import with_options
    from atlas_fast.methods.registry import method_class

    entry = method_class(method)
    config, _ = entry.recipe_function("paper", "base2new", 16, "OxfordPets")
    changed = user_error_or_result(with_options, config, {option: value})
    if changed is not None:
        assert all(math.isfinite(v) for v in vars(changed).values() if isinstance(v, float))


@FAST
@given(field=st.sampled_from(["shots", "seed", "aug_seed", "epochs", "views", "batch_size", "lr", "workers"]),
       value=NUMBERS)
def test_train_config_numbers(field, value):
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig

    config = user_error_or_result(TrainConfig, "OxfordPets", "data", BackboneConfig("atlas-tiny", None),
                                  **{field: value})
    if config is not None:  # what is accepted is finite and in a range torch and JSON can hold
        from atlas_fast.engine.config import MAX_LR

        bound = MAX_LR if field == "lr" else 2**32  # a seed or count fits 32 bits; lr only needs to stay finite
        assert math.isfinite(getattr(config, field)) and abs(getattr(config, field)) <= bound


@FAST
@given(field=st.sampled_from(["theta", "tau_c", "alpha", "w", "top_k"]), value=NUMBERS)
def test_soft_label_numbers(field, value):
    from atlas_fast.atlas.softlabels import SoftLabelConfig

    config = user_error_or_result(SoftLabelConfig, "mix", **{field: value})
    if config is not None:
        assert math.isfinite(getattr(config, field))
        json.dumps(config.to_dict(), allow_nan=False)  # a record can hold it


@FAST
@given(value=NUMBERS | st.none())
def test_gpu_counts(value):
    from atlas_fast.sweep.grid import check_gpus

    try:
        check_gpus(value)
    except ValueError as exc:
        assert "--gpus-per-group" in str(exc) and len(str(exc)) < 200
        return
    assert value is None or (math.isfinite(value) and value >= 0)


# ----------------------------------------------------------------------------------- split-JSON and folder readers


ENTRY = st.one_of(
    st.tuples(st.sampled_from(["a.jpg", "b.jpg", "../x.jpg", "/abs.jpg", "", "missing.jpg"]),
              st.integers(-2, 5) | st.sampled_from(["1", "1.0", "x", 1.5, True, None, 10**12]),
              NAME_TEXT | st.sampled_from(["", " "])).map(list),
    JSON)


@FAST
@given(split=st.dictionaries(st.sampled_from(["train", "val", "test", "other"]), st.lists(ENTRY, max_size=6) | JSON,
                             max_size=4) | JSON)
def test_split_json_reader(split):
    from atlas_fast.data import load_dataset

    with tempfile.TemporaryDirectory() as root:
        images = Path(root) / "oxford_pets" / "images"
        images.mkdir(parents=True)
        for name in ("a.jpg", "b.jpg"):
            (images / name).write_bytes(b"\xff\xd8")
        (images.parent / "split_zhou_OxfordPets.json").write_text(json.dumps(split))
        data = user_error_or_result(load_dataset, "OxfordPets", root)
    if data is not None:
        assert data.test and all(name.strip() for name in data.classnames)


@FAST
@given(classes=st.dictionaries(NAME_TEXT, st.lists(st.sampled_from(["1.png", "2.jpg", "notes.txt"]), max_size=3),
                               min_size=0, max_size=4),
       test_classes=st.lists(NAME_TEXT, max_size=3))
def test_class_folder_reader(classes, test_classes):
    from atlas_fast.data import load_dataset

    with tempfile.TemporaryDirectory() as root:
        dataset = Path(root) / "mine"
        for split, names in (("train", classes), ("test", {c: ["t.png"] for c in test_classes})):
            (dataset / split).mkdir(parents=True, exist_ok=True)
            for classname, files in names.items():
                try:
                    (dataset / split / classname).mkdir(exist_ok=True)
                except OSError:  # a name the file system folds onto another: nothing to test
                    continue
                for file in files:
                    (dataset / split / classname / file).write_bytes(b"x")
        data = user_error_or_result(load_dataset, f"folder:{dataset}", root)
    if data is not None:
        assert len(data.classnames) == len(set(data.classnames))


# ------------------------------------------------------------------------------------ record loader and collector


def _valid_record() -> dict:
    config = {"dataset": "OxfordPets", "backbone": {"model": "atlas-tiny", "pretrained": None}, "method": "coop",
              "method_config": {"n_ctx": 4}, "recipe_family": "paper", "recipe": {"epochs": 2, "lr": 0.002},
              "setting": "base2new", "shots": 16, "seed": 1, "subsample": "base", "soft_labels": None,
              "schedule": {"name": "onehot"}, "views": 2, "aug_seed": 0, "eval_every_epoch": False,
              "device": "cpu", "precision": "fp32"}
    return {"key": "k" * 32, "config_key": "k", "status": "finished", "created": "2024-01-01T00:00:00",
            "config": config, "backbone": {"fingerprint": "fp"}, "data": {"fingerprint": "data"},
            "metrics": {"base": 90.0, "new": 80.0, "H": 84.7, "zero_shot": {"base": 50.0, "new": 50.0}},
            "epochs": [], "timings": {}, "learned": "x.pt", "learned_blake2b": "0"}


PATHS = st.sampled_from(["key", "status", "config", "metrics", "metrics.base", "metrics.zero_shot", "config.seed",
                         "config.shots", "config.dataset", "config.method", "config.setting", "config.schedule",
                         "config.schedule.name", "config.soft_labels", "created", "data", "seal", "backbone"])


def _perturbed(changes: list, seal: bool) -> dict:
    from atlas_fast.engine.seal import sealed

    record = _valid_record()
    record = sealed(record) if seal else record
    for dotted, value in changes:
        *parents, leaf = dotted.split(".")
        target = record
        for part in parents:
            target = target.get(part) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[leaf] = value
    return record


@FAST
@given(content=JSON | st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
       changes=st.lists(st.tuples(PATHS, JSON), max_size=3), seal=st.booleans(), whole=st.booleans())
def test_record_loader(content, changes, seal, whole):
    from atlas_fast.engine.record import ResultStore
    from atlas_fast.engine.validity import read_record, record_problems

    with tempfile.TemporaryDirectory() as root:
        store = ResultStore(root)
        path = store.record_path("OxfordPets", "run")
        path.parent.mkdir(parents=True)
        text = content if whole and isinstance(content, str) else json.dumps(_perturbed(changes, seal))
        path.write_text(text if isinstance(text, str) else json.dumps(text))
        path.with_suffix(".pt").write_bytes(b"")
        record = user_error_or_result(read_record, path)
        if record is not None:
            assert isinstance(record_problems(record), list)
        found = user_error_or_result(store.find, "OxfordPets", "run")
        assert found is None or isinstance(found, dict)


@FAST
@given(records=st.lists(st.tuples(st.lists(st.tuples(PATHS, JSON), max_size=2), st.booleans()), min_size=1,
                        max_size=3))
@example(records=[([("config.seed", "two")], True), ([], True)])  # a foreign record beside ours
def test_report_collector_and_command(records):
    import contextlib
    import io

    from atlas_fast.cli import main

    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "results" / "OxfordPets"
        folder.mkdir(parents=True)
        for index, (changes, seal) in enumerate(records):
            record = _perturbed(changes, seal)
            if isinstance(record.get("config"), dict) and isinstance(record["config"].get("seed"), int):
                record["config"]["seed"] += index  # distinct runs, unless a change made the seed something else
            (folder / f"run{index}.json").write_text(json.dumps(record))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(["report", str(Path(root) / "results"), "--format", "md", "csv"])
            if status == 0:
                status = main(["report", str(Path(root) / "results"), "--verify"])
        errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
        assert status in (0, 1, 2) and "Traceback" not in err.getvalue()
        assert len(errors) == (1 if status == 2 else 0), err.getvalue()


@pytest.mark.parametrize("argv", [["report"], ["report", "/nonexistent/results"]])
def test_report_without_a_folder_is_one_error(argv, capsys):
    from atlas_fast.cli import main

    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse: the usage and its own error line
        status = exit_.code
    assert status == 2 and "Traceback" not in capsys.readouterr().err
