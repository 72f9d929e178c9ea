"""Faults on the newer surfaces (search, estimates, stand-ins, the ImageNet sorter, the thread probe, the report's
readers), injected as a user or a crash would: nothing of the user's is lost, nothing hangs, and every failure is
one line (a warning naming the file and going on, or one ``error:`` line with exit status 2; Ctrl-C: one line and
exit status 130)."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import pwd
import sqlite3
import tempfile
from pathlib import Path

import pytest
import torch

from atlas_fast.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

# JSON nested this deep makes Python's parser (and any recursive walk over it) raise RecursionError.
DEEP = "[" * 100_000 + "]" * 100_000


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def warning_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning:")]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------------ stand-ins

def test_a_standin_rewrite_keeps_the_users_own_files(tmp_path):
    from atlas_fast.data import load_dataset
    from atlas_fast.world.standin_plan import StandinRequest
    from atlas_fast.world.standins import write_standin

    request = StandinRequest(test_fraction=0.01, train_per_class=1)
    write_standin("EuroSAT", tmp_path, request, progress=False)
    dataset = tmp_path / "eurosat"
    (dataset / "notes.txt").write_text("my notes")
    (dataset / "2750" / "River" / "my_own_river.jpg").write_bytes(b"my photo")
    (dataset / "extra" / "deep").mkdir(parents=True)
    (dataset / "extra" / "deep" / "labels.csv").write_text("a,b\n")

    result = write_standin("EuroSAT", tmp_path, StandinRequest(0.01, 1, seed=1), progress=False)
    assert result.action == "rewritten"
    assert (dataset / "notes.txt").read_text() == "my notes"
    assert (dataset / "2750" / "River" / "my_own_river.jpg").read_bytes() == b"my photo"
    assert (dataset / "extra" / "deep" / "labels.csv").read_text() == "a,b\n"
    assert len(load_dataset("EuroSAT", tmp_path).test) == 81


def test_a_standin_whose_files_were_replaced_is_not_rewritten(tmp_path):
    """Real data extracted over a stand-in (its manifest kept): the images it replaced are the user's now."""
    from atlas_fast.world.standin_plan import StandinRequest
    from atlas_fast.world.standins import write_standin

    write_standin("EuroSAT", tmp_path, StandinRequest(0.01, 1), progress=False)
    dataset = tmp_path / "eurosat"
    replaced = sorted((dataset / "2750" / "River").glob("*.jpg"))[0]
    replaced.write_bytes(b"a real satellite image, a little longer than the stand-in's")
    (dataset / "2750" / "River" / "River_99999.jpg").write_bytes(b"another real one")
    before = snapshot(dataset)
    with pytest.raises(FileExistsError, match=replaced.name):
        write_standin("EuroSAT", tmp_path, StandinRequest(0.01, 1, seed=1), progress=False)
    assert snapshot(dataset) == before  # nothing deleted, nothing written


def _write_standin_killed_on_the_third_image(root: str) -> None:
    """In a forked child: write a stand-in and die (as ``kill -9`` would) between an image's write and its rename."""
    from atlas_fast.world import standin_images
    from atlas_fast.world.standin_plan import StandinRequest
    from atlas_fast.world.standins import write_standin

    calls = []

    def replace(source, target):
        calls.append(target)
        if len(calls) == 3:
            os._exit(9)
        os.rename(source, target)

    standin_images.os.replace = replace
    write_standin("EuroSAT", root, StandinRequest(0.01, 1), progress=False)


def test_an_interrupted_standin_writer_leaves_no_temporary_file(tmp_path):
    from atlas_fast.world.standin_plan import StandinRequest
    from atlas_fast.world.standins import write_standin

    child = mp.get_context("fork").Process(target=_write_standin_killed_on_the_third_image, args=(str(tmp_path),))
    child.start()
    child.join(60)
    assert child.exitcode == 9 and list((tmp_path / "eurosat").rglob(".*.tmp"))
    result = write_standin("EuroSAT", tmp_path, StandinRequest(0.01, 1), progress=False)
    assert result.action == "completed"
    assert not list((tmp_path / "eurosat").rglob("*.tmp"))


def test_a_temporary_file_of_a_dead_writer_is_removed_by_the_next_write(tmp_path):
    from atlas_fast.files import atomic_write, temporary_path

    child = mp.get_context("fork").Process(target=lambda: None)
    child.start()
    child.join()
    target = tmp_path / "record.json"
    with open(temporary_path(target, pid=child.pid), "wb") as f:  # a writer killed before its rename
        f.write(b"half a rec")
    live = temporary_path(target)  # this process's own, as if another thread of it were writing now
    live.write_bytes(b"in progress")
    atomic_write(target, lambda f: f.write(b"{}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name])


# --------------------------------------------------------------------------------------------------------- search

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    root = tmp_path_factory.mktemp("surface-search")
    generate_benchmark(root / "data", ["WorldPhotos"], sizes=SplitSizes(train=2, val=1, test=1), progress=False)
    return root


def search_cli(world: Path, *extra: str, results: str = "cli") -> list[str]:
    return ["search", "--datasets", "WorldPhotos", "--data-root", str(world / "data"), "--model", "atlas-world",
            "--pretrained", "atlas-world", "--shots", "2", "--epochs", "1", "--views", "1", "--batch-size", "8",
            "--method-option", "n_ctx=4", "--device", "cpu", "--cache-root", str(world / f"{results}-cache"),
            "--results-dir", str(world / results), "--no-progress", "--heartbeat", "0.2", "--lock-timeout", "0.5",
            "--trials", "1", "--pruner", "none", *extra]


@pytest.mark.parametrize("args, message", [
    (["--param", "lr=0.001:0.1:1e-7", "--sampler", "grid", "--no-final"], "990,001 points"),
    (["--param", "lr=0.001:0.01", "--storage", "foo"], "storage 'foo' is not a storage URL"),
    (["--param", "lr=0.001:0.01", "--seeds", "1", "1", "--no-final"], "--seeds lists 1 twice"),
    (["--param", "lr=0.001:0.01", "--datasets", "WorldPhotos", "worldphotos", "--no-final"],
     "--datasets lists 'WorldPhotos' twice"),
    (["--param", "lr=0.001:0.01", "--final-seeds", "2", "2", "--no-final"], "--final-seeds lists 2 twice"),
], ids=["grid-too-large", "storage-not-a-url", "seed-twice", "dataset-twice", "final-seed-twice"])
def test_bad_searches_are_one_error_line_before_anything_trains(world, capsys, args, message):
    assert main(search_cli(world, *args, results="bad")) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert message in line
    assert not list((world / "bad-cache").rglob("*.h5")) and not (world / "bad" / "search").exists()
    assert not Path("foo").exists()


def test_a_grid_is_sized_before_it_is_built():
    import time

    from atlas_fast.errors import UsageError
    from atlas_fast.search.space import choice, grid_values, integers, uniform

    clock = time.perf_counter()
    with pytest.raises(UsageError, match=r"99,000,000,001 points"):
        grid_values({"lr": uniform(0.001, 0.1, step=1e-12)})
    with pytest.raises(UsageError, match=r"more than the 100,000"):
        grid_values({"K": integers(1, 1000), "n_ctx": integers(1, 1000), "kind": choice("ls", "csl")})
    assert time.perf_counter() - clock < 1.0
    assert len(grid_values({"K": integers(1, 5), "alpha": uniform(0.1, 1.0, step=0.1)})["alpha"]) == 10


def test_a_study_store_with_a_deeply_nested_value_is_refused_in_one_line(tmp_path):
    import optuna

    from atlas_fast.errors import UsageError
    from atlas_fast.search.storage import DEFINITION_ATTR, open_storage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(storage=url, study_name="mine").set_user_attr(DEFINITION_ATTR, {"method": "coop"})
    with sqlite3.connect(tmp_path / "study.db") as db:
        db.execute("UPDATE study_user_attributes SET value_json = ?", (DEEP,))
    db.close()
    with pytest.raises(UsageError, match="study.db holds a damaged study"):
        open_storage(url, "mine", {"method": "coop"}, 1.0)
    with sqlite3.connect(tmp_path / "study.db") as db:
        assert db.execute("SELECT value_json FROM study_user_attributes").fetchall() == [(DEEP,)]
    db.close()


def test_ctrl_c_in_a_search_is_one_line_and_the_same_command_resumes_at_once(world, capsys, monkeypatch, tmp_path):
    import optuna

    from atlas_fast.search import trials
    from atlas_fast.search.storage import HEARTBEAT_ATTR, dead_trials

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    db = tmp_path / "study.db"
    args = search_cli(world, "--param", "lr=0.001:0.01", "--no-final", "--storage", f"sqlite:///{db}",
                      "--study-name", "s", results="ctrl-c")
    monkeypatch.setattr(trials, "train_batch", interrupted)
    try:
        status = main(args)
    except KeyboardInterrupt:
        status = "KeyboardInterrupt raised"
    err = capsys.readouterr().err
    assert status == 130 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("interrupted:") and "0 of 1 trial(s)" in line and "same command" in line
    (trial,) = optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials
    assert trial.state.name == "RUNNING" and trial.system_attrs[HEARTBEAT_ATTR] == 0  # handed back for the rerun
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
    study_id = study._storage.get_study_id_from_name("s")
    beats = []
    heartbeat = type("Beat", (), {"beat": lambda self, trial_id: beats.append(trial_id)})()
    (taken,) = dead_trials(study, study._storage, study_id, grace_seconds=3600, heartbeat=heartbeat, limit=4)
    assert taken[0].number == 0 and taken[1] == math.inf and beats  # taken over at once, not after the grace period


# -------------------------------------------------------------------------------------------------------- pricing

@pytest.mark.parametrize("damage", [
    {"CTX": ["a", "list"]},
    {"CTX": {"encode": {"peak_host_bytes": 1}}},
    {"CTX": {"encode": {"seconds": "fast"}}},
    {"CTX": {"encode": 3.5}},
    {"CTX": {"encode": {"seconds": -155.4}}},
    {"CTX": {"encode": {"seconds": float("inf")}}},
    {"CTX": {"encode": {"seconds": 1.0, "repeats": 0.5}}},
    {"CTX": {"encode": {"seconds": True}}},
    "DEEP",
], ids=["context-a-list", "no-seconds", "seconds-text", "unit-a-number", "negative", "infinite", "repeats-float",
        "seconds-bool", "deep"])
def test_a_damaged_calibration_is_a_miss_with_one_warning(tmp_path, damage):
    from atlas_fast.pricing.calibration import CALIBRATION_FILE, CalibrationStore
    from atlas_fast.pricing.timing import Unit

    path = tmp_path / CALIBRATION_FILE
    path.parent.mkdir(parents=True)
    path.write_text(DEEP if damage == "DEEP" else json.dumps(damage))
    with pytest.warns(UserWarning) as caught:
        store = CalibrationStore(tmp_path, "CTX")
    assert len(caught) == 1 and str(path) in str(caught[0].message)
    unit = store.unit("encode", lambda: Unit(0.25))
    assert unit.seconds == 0.25 and store.measured == 1
    assert CalibrationStore(tmp_path, "CTX").get("encode") == Unit(0.25)  # replaced by the measured unit


def test_estimate_with_a_plain_file_as_cache_root_is_one_error_naming_it(tmp_path, capsys):
    from layouts import make_oxford_pets

    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=2, n_val=1, n_test=1, size=16)
    root = tmp_path / "cache-root"
    root.write_text("not a folder")
    assert main(estimate_args(tmp_path, root)) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert f"cache root {root} is a file, not a folder" in line
    assert root.read_text() == "not a folder"


def estimate_args(folder: Path, cache_root: Path, seeds=("1",)) -> list[str]:
    return ["train", "--dataset", "OxfordPets", "--data-root", str(folder / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "2", "--epochs", "2", "--batch-size", "4", "--views", "1",
            "--seeds", *seeds, "--cache-root", str(cache_root), "--results-dir", str(folder / "results"),
            "--no-progress", "--estimate"]


def _estimate_as_nobody(folder: str, cache_root: str, queue) -> None:
    """In a forked child: give up root (root ignores file modes), then estimate."""
    import contextlib
    import io

    import traceback

    out, err = io.StringIO(), io.StringIO()
    try:
        torch.set_num_threads(1)
        os.setgid(pwd.getpwnam("nobody").pw_gid)
        os.setuid(pwd.getpwnam("nobody").pw_uid)
        os.environ["XDG_CACHE_HOME"] = os.path.join(folder, "user-cache")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # one thread: a forked child of a process whose OpenMP pool has run may hang in a parallel region
            status = main(["--threads", "1", *estimate_args(Path(folder), Path(cache_root))])
    except BaseException:
        status = traceback.format_exc()
    queue.put((status, out.getvalue(), err.getvalue()))


def test_estimate_on_a_read_only_cache_root_still_prices_the_runs(monkeypatch):
    import shutil

    from atlas_fast.pricing import command_units, units
    from atlas_fast.pricing.timing import Unit
    from layouts import make_oxford_pets

    timed = [(units, "measure_step"), (units, "measure_eval"), (units, "measure_run_overhead"),
             (units, "measure_soft_labels"), (command_units, "measure_encode"), (command_units, "measure_decode"),
             (command_units, "measure_backbone_load"), (command_units, "measure_loader_start"),
             (command_units, "measure_exit")]
    for module, name in timed:  # what is timed is not the point here
        monkeypatch.setattr(module, name, lambda *args, **kwargs: Unit(0.01))

    base = Path(tempfile.mkdtemp(prefix="atlas-readonly-"))  # world-readable, unlike pytest's tmp_path
    try:
        os.chmod(base, 0o777)
        make_oxford_pets(base / "data", n_classes=4, n_train=2, n_val=1, n_test=1, size=16)
        for path in [base, *base.rglob("*")]:
            path.chmod(0o777 if path.is_dir() else 0o644)
        (base / "cache").mkdir(mode=0o555)
        (base / "cache").chmod(0o555)
        queue = mp.get_context("fork").Queue()
        child = mp.get_context("fork").Process(target=_estimate_as_nobody, args=(str(base), str(base / "cache"),
                                                                                  queue))
        child.start()
        try:
            status, out, err = queue.get(timeout=120)
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
        assert status == 0, (status, err)
        assert "| **total** |" in out and not error_lines(err)
        assert not list((base / "cache").iterdir())  # nothing could be, nothing was written
    finally:
        for path in [base, *base.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(base)


# -------------------------------------------------------------------------------------------------------- threads

@pytest.mark.parametrize("entry", [
    {"threads": 0, "time": "NOW"},
    {"threads": 1, "time": "yesterday"},
    {"threads": 100000, "time": "NOW"},
    {"threads": "2", "time": "NOW"},
    {"threads": 2.5, "time": "NOW"},
    {"threads": 1, "time": float("nan")},
    [1, 2],
    "DEEP",
], ids=["zero", "time-text", "100000", "threads-text", "threads-float", "time-nan", "a-list", "deep"])
def test_a_damaged_thread_probe_cache_is_a_miss_with_one_warning(tmp_path, monkeypatch, entry):
    import time

    from atlas_fast import threads

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(threads, "_policy", None)  # restored afterwards
    monkeypatch.setattr(threads, "measure_step_seconds", lambda n: {1: 0.3, 2: 0.1}[n])
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    path = tmp_path / "atlas_fast" / "threads.json"
    path.parent.mkdir()
    if entry == "DEEP":
        path.write_text(DEEP)
    else:
        if isinstance(entry, dict) and entry["time"] == "NOW":
            entry = {**entry, "time": time.time()}
        path.write_text(json.dumps({threads._machine_key(2): entry}))
    with pytest.warns(UserWarning) as caught:
        assert threads.probe_threads(limit=2) == 2
    assert len(caught) == 1 and str(path) in str(caught[0].message)
    assert all(count <= 2 for count in seen)
    assert threads.probe_threads(limit=2) == 2  # measured again and kept: no warning now
    assert json.loads(path.read_text())[threads._machine_key(2)]["threads"] == 2


def test_thread_counts_beyond_the_cpus_never_reach_torch(monkeypatch, capsys, tmp_path):
    from atlas_fast import threads

    for variable in (*threads.THREAD_VARIABLES, threads.POLICY_VARIABLE):
        monkeypatch.setenv(variable, "1")  # (recorded, so that the test leaves the environment as it found it)
        monkeypatch.delenv(variable)
    monkeypatch.setattr(threads, "_policy", None)
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    available = threads.available_cpus().count
    with pytest.warns(UserWarning, match="100000"):
        assert threads.set_threads(100000) == available
    assert seen == [available] and os.environ["OMP_NUM_THREADS"] == str(available)
    monkeypatch.setattr(threads, "probe_threads", lambda: 100000)
    threads.set_threads("auto")
    with threads.small_step_threads("cpu", small_steps=True):
        pass
    assert max(seen) <= available
    capsys.readouterr()
    assert main(["--threads", "100000", "report", str(tmp_path / "no-results")]) == 2  # (no records: one error)
    err = capsys.readouterr().err
    assert max(seen) <= available and "UserWarning" not in err
    assert [line for line in err.splitlines() if line.startswith("warning: 100000 threads asked for")]


# --------------------------------------------------------------------------------------------------------- report

def sealed_record(seed: int) -> dict:
    from atlas_fast.engine.seal import sealed
    from test_inputs_fuzz import _valid_record

    record = _valid_record()
    record["config"]["seed"] = seed
    return sealed(record)


@pytest.fixture()
def results(tmp_path):
    folder = tmp_path / "results" / "OxfordPets"
    folder.mkdir(parents=True)
    for seed in (1, 2):
        (folder / f"run{seed}.json").write_text(json.dumps(sealed_record(seed)))
    return tmp_path / "results"


def test_a_deeply_nested_stray_file_is_skipped_and_the_report_goes_on(results, capsys):
    stray = results / "OxfordPets" / "stray.json"
    stray.write_text(DEEP)
    try:
        status = main(["report", str(results), "--format", "md", "csv"])
    except RecursionError:
        status = "RecursionError"
    err = capsys.readouterr().err
    assert status == 0 and not error_lines(err)
    assert [line for line in warning_lines(err) if str(stray) in line]
    assert (results / "report" / "report.csv").is_file()
    stray.write_text(json.dumps(sealed_record(1)))  # the report's sources are whole; now damage what it names
    (results / "OxfordPets" / "run2.json").write_text(DEEP)
    assert main(["report", str(results), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "run2.json" in out and "verify: FAILED" in out


def test_a_deeply_nested_sources_file_is_one_error_naming_it(results, capsys):
    assert main(["report", str(results), "--format", "csv"]) == 0
    sources = results / "report" / "sources.json"
    sources.write_text(DEEP)
    capsys.readouterr()
    try:
        status = main(["report", str(results), "--verify"])
    except RecursionError:
        status = "RecursionError"
    (line,) = error_lines(capsys.readouterr().err)
    assert status == 2 and str(sources) in line and "nested" in line


def test_a_record_larger_than_the_bound_is_skipped_unread(results, capsys, monkeypatch):
    from atlas_fast import files

    large = results / "OxfordPets" / "large.json"
    record = sealed_record(3)
    record["epochs"] = [{"loss": 1.0}] * 20_000
    large.write_text(json.dumps(record))
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 100_000)
    assert main(["report", str(results), "--format", "md"]) == 0
    (line,) = [line for line in warning_lines(capsys.readouterr().err) if "large.json" in line]
    assert "larger than" in line


def test_guarantees_say_what_detects_a_reforged_seal(results, capsys):
    """A record edited and sealed again passes its own check, but not the seal an earlier report's sources.json
    holds: ``report --verify`` against that report names it. The guarantees page says so."""
    from atlas_fast.engine.seal import record_seal

    assert main(["report", str(results), "--format", "csv"]) == 0
    path = results / "OxfordPets" / "run1.json"
    forged = json.loads(path.read_text())
    forged["metrics"]["base"] = 99.0
    forged["seal"] = record_seal({k: v for k, v in forged.items() if k != "seal"})
    path.write_text(json.dumps(forged))
    capsys.readouterr()
    assert main(["report", str(results), "--verify"]) == 1
    assert "is not the record the report was made from" in capsys.readouterr().out
    text = (Path(__file__).resolve().parents[1] / "docs" / "guarantees.md").read_text()
    section = text.split("### What a seal does not do")[1].split("\n## ")[0]
    assert "sources.json" in section and "report RESULTS_DIR --verify" in section


# ---------------------------------------------------------------------------------------------- the ImageNet sorter

def _devkit_folder(tmp_path, truth: bytes | None = None, meta: dict | None = None) -> tuple[Path, Path]:
    """A flat ImageNet val folder and its devkit extracted to a folder, with the ground truth or meta.mat replaced."""
    import io
    import tarfile

    from scipy.io import savemat

    from layouts import make_flat_imagenet_val

    dataset_dir, archive = make_flat_imagenet_val(tmp_path / "data", n_classes=2, n_val=2)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "devkit", filter="data")
    data = tmp_path / "devkit" / "ILSVRC2012_devkit_t12" / "data"
    if truth is not None:
        (data / "ILSVRC2012_validation_ground_truth.txt").write_bytes(truth)
    if meta is not None:
        buffer = io.BytesIO()
        savemat(buffer, meta)
        (data / "meta.mat").write_bytes(buffer.getvalue())
    return dataset_dir, tmp_path / "devkit"


@pytest.mark.parametrize("truth, meta, message", [
    (None, {"classes": [1, 2]}, "meta.mat has no 'synsets'"),
    (b"2\n2\n1.0\n1\n", None, "ILSVRC2012_validation_ground_truth.txt line 3: '1.0' is not a class number"),
    ("2\n2\n1\n1\n".encode("utf-16"), None, "ILSVRC2012_validation_ground_truth.txt is UTF-16"),
    (b"2\n2\n\n1\n1\n", None, "ILSVRC2012_validation_ground_truth.txt line 3 is empty"),
    (b"1\n" * 50_001, None, "ILSVRC2012_validation_ground_truth.txt holds 50,001 lines"),
], ids=["no-synsets", "float", "utf-16", "blank-line", "too-many-lines"])
def test_a_bad_devkit_is_one_error_naming_the_file_and_line_and_nothing_moves(tmp_path, capsys, truth, meta,
                                                                              message):
    dataset_dir, devkit = _devkit_folder(tmp_path, truth, meta)
    before = sorted(p.name for p in (dataset_dir / "images" / "val").iterdir())
    try:
        status = main(["data", "sort-imagenet-val", "--data-root", str(tmp_path / "data"), "--devkit", str(devkit)])
    except KeyError as exc:
        status = f"KeyError {exc}"
    (line,) = error_lines(capsys.readouterr().err)
    assert status == 2 and message in line
    assert sorted(p.name for p in (dataset_dir / "images" / "val").iterdir()) == before


# --------------------------------------------------------------------------------------------------------- Ctrl-C

def test_ctrl_c_during_training_is_one_line_and_exit_status_130(tmp_path, capsys, monkeypatch):
    from atlas_fast.engine import pipeline
    from layouts import make_oxford_pets

    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=2, n_val=1, n_test=1, size=16)
    calls = []

    def interrupted_in_the_second_group(specs, *args, **kwargs):
        calls.append(specs)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return [{"metrics": {"base": 50.0, "new": 50.0, "H": 50.0}, "timings": {}} for _ in specs]  # (as trained)

    monkeypatch.setattr(pipeline, "run_specs", interrupted_in_the_second_group)
    args = [a for a in estimate_args(tmp_path, tmp_path / "cache", seeds=("1", "2")) if a != "--estimate"]
    try:
        status = main(args + ["--batch-runs", "1"])
    except KeyboardInterrupt:
        status = "KeyboardInterrupt raised"
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert status == 130 and "Traceback" not in err
    assert line == ("interrupted: 1 of 2 run(s) finished (their records are kept); the same command resumes the "
                    "rest.")


def test_ctrl_c_during_an_experiment_is_one_line_and_exit_status_130(tmp_path, capsys, monkeypatch):
    from atlas_fast.engine import pipeline
    from layouts import make_oxford_pets
    from test_pricing import worktree_experiments

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    worktree_experiments()
    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=2, n_val=1, n_test=1, size=16)
    monkeypatch.setattr(pipeline, "run_specs", interrupted)
    try:
        status = main(["experiment", "table3_base_to_new", "--data-root", str(tmp_path / "data"), "--datasets",
                       "OxfordPets", "--model", "atlas-tiny", "--pretrained", "none", "--methods", "coop", "--seeds",
                       "1", "--epochs", "2", "--cache-root", str(tmp_path / "cache"), "--results-dir",
                       str(tmp_path / "results"), "--out", str(tmp_path / "out"), "--no-progress"])
    except KeyboardInterrupt:
        status = "KeyboardInterrupt raised"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("warning:", "note:"))]
    assert status == 130 and len(lines) == 1, err
    assert lines[0].startswith("interrupted: 0 of 4 run(s) finished") and "same command" in lines[0]


# ------------------------------------------------------------------------------------------- the world's own stamp

def test_a_damaged_world_stamp_is_a_miss_the_dataset_is_generated_again(tmp_path):
    from atlas_fast.data import load_dataset
    from atlas_fast.world.benchmark import STAMP_FILE, SplitSizes, generate_benchmark

    sizes = SplitSizes(train=1, val=1, test=1)
    generate_benchmark(tmp_path, ["WorldPhotos"], sizes=sizes, progress=False)
    folder = tmp_path / "world_photos"
    (folder / "notes.txt").write_text("mine")
    (folder / STAMP_FILE).write_text(DEEP)
    with pytest.warns(UserWarning, match=STAMP_FILE):
        generate_benchmark(tmp_path, ["WorldPhotos"], sizes=sizes, progress=False)
    assert json.loads((folder / STAMP_FILE).read_text())["seed"] == 0
    assert (folder / "notes.txt").read_text() == "mine" and len(load_dataset("WorldPhotos", tmp_path).test) == 24
