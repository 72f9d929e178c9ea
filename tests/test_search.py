"""Hyper-parameter search (atlas_fast.search, ``atlas-fast search``): the loop's retire hook leaves the other runs of
a group untouched; a small study on the world prunes, batches, writes its outputs and never reads the test split; a
study killed with SIGKILL resumes to the same final study; two processes share one study; bad input is one
``error:`` line before any training, with nothing in an existing study lost."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import torch

from atlas_fast.atlas.schedules import Alternating
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run
from atlas_fast.engine.feed import prepare_inputs
from atlas_fast.engine.group import RunGroup
from atlas_fast.engine.record import load_learned
from atlas_fast.engine.spec import plan_run
from atlas_fast.search import SearchConfig, log_uniform, run_search, run_study, uniform
from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]
EPOCHS = 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """WorldPhotos with 4 train / 2 val / 2 test images per class, for the shipped atlas-world CLIP (which, unlike
    the random tiny one, tells the classes apart, so trials differ and pruning has something to prune)."""
    root = tmp_path_factory.mktemp("search")
    generate_benchmark(root / "data", ["WorldPhotos"], sizes=SplitSizes(train=4, val=2, test=2), progress=False)
    return root


def base_config(root: Path, results: str = "results", **changes) -> TrainConfig:
    fields = dict(dataset="WorldPhotos", data_root=root / "data", backbone=BackboneConfig("atlas-world", "atlas-world"),
                  shots=4, epochs=EPOCHS, views=2, batch_size=8, lr=0.002, schedule=Alternating(2),
                  soft_labels=soft_label_preset("base2new", "isl"), method_options={"n_ctx": 4}, device="cpu",
                  cache_root=root / "cache", results_dir=root / results, progress=False)
    return TrainConfig(**{**fields, **changes})


SPACE = {"alpha": uniform(0.1, 1.0), "lr": log_uniform(1e-3, 30.0)}


def search_config(root: Path, results: str, **changes) -> SearchConfig:
    fields = dict(base=base_config(root, results), space=SPACE, objective="H", n_trials=10, pruner="halving",
                  finalize=False, heartbeat_seconds=0.2, grace_seconds=1.5, lock_timeout=1.0)
    return SearchConfig(**{**fields, **changes})


def trials_by_number(study) -> dict[int, tuple]:
    return {t.number: (t.state.name, t.params, t.value, dict(t.intermediate_values)) for t in study.trials}


# --- the engine hook --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("regroup", [False, True], ids=["sits-out", "regrouped"])
def test_a_retired_run_leaves_the_other_runs_of_its_group_as_if_trained_without_it(world, regroup):
    """Run 1 of a group of three is retired after epoch 1; runs 0 and 2 end with the learned tensors (and epoch
    losses) of the same runs trained alone, and run 1 stops logging. It either sits out the remaining steps in the
    module or (``regroup``) the loop goes on with a module of the two survivors, their optimiser state carried."""
    configs = [base_config(world, "hook", seed=1),
               base_config(world, "hook", seed=2, soft_labels=soft_label_preset("base2new", "csl")),
               base_config(world, "hook", seed=3, schedule=Alternating(1))]
    specs = [plan_run(c) for c in configs]
    backbone = specs[0].backbone()
    group = RunGroup(specs, backbone, [prepare_inputs(s, backbone, {}) for s in specs])
    initial = group.alone[1].state_for_checkpoint()
    asked = []

    def retire(epoch, logs):
        asked.append(epoch)
        return {1} if epoch == 1 else set()

    module = group.method
    logs = group.train(False, retire=retire, shrink=regroup)
    assert asked == list(range(EPOCHS)) and [len(log) for log in logs] == [EPOCHS, 2, EPOCHS]
    if regroup:
        assert group.method is not module and group.method.num_runs == 2 and group.slots == [0, 2]
        learned = {name: tensor[[0, 0, 1]] for name, tensor in group.method.state_for_checkpoint().items()}
    else:
        assert group.method is module
        learned = group.method.state_for_checkpoint()
    for r in (0, 2):
        alone = run(dataclasses.replace(configs[r], results_dir=world / "hook-alone"))
        for name, tensor in load_learned(alone["path"]).items():
            torch.testing.assert_close(learned[name][r:r + 1], tensor, atol=1e-5, rtol=1.3e-6)
        assert [e["loss"] for e in logs[r]] == pytest.approx([e["loss"] for e in alone["epochs"]], abs=1e-5)
    if not regroup:  # the retired run kept the tensors it had after epoch 1: it moved, then stopped
        assert any(not torch.equal(learned[n][1:2], initial[n]) for n in initial)


def test_every_run_retired_ends_the_loop(world):
    spec = plan_run(base_config(world, "hook-all"))
    backbone = spec.backbone()
    group = RunGroup([spec], backbone, [prepare_inputs(spec, backbone, {})])
    logs = group.train(False, retire=lambda e, logs: {0})
    assert len(logs[0]) == 1


# --- a study ----------------------------------------------------------------------------------------------------

def test_small_study_prunes_never_reads_the_test_split_and_writes_its_outputs(world, monkeypatch):
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import load_dataset

    test_items = {d.impath for d in load_dataset("WorldPhotos", world / "data").test}
    val_items = {d.impath for d in load_dataset("WorldPhotos", world / "data").val}
    read: list[str] = []
    for name in ("build", "load"):
        original = getattr(FeatureCache, name)

        def spy(self, backbone, dataset, items, *args, _original=original, **kwargs):
            read.extend(d.impath for d in items)
            return _original(self, backbone, dataset, items, *args, **kwargs)

        monkeypatch.setattr(FeatureCache, name, spy)
    search = search_config(world, "study", finalize=True, n_trials=8)
    study = run_study(search, progress=False)
    assert read and not set(read) & test_items, "a test image was read during the study"
    assert set(read) & val_items  # the trials were selected on the validation split
    states = [t.state.name for t in study.trials]
    assert len(states) == 8 and "PRUNED" in states and "COMPLETE" in states, states
    epochs = {t.number: t.user_attrs["epochs"] for t in study.trials}
    pruned = [epochs[t.number] for t in study.trials if t.state.name == "PRUNED"]
    assert min(pruned) < EPOCHS and max(pruned) <= EPOCHS  # stopped early (the last rung's are stopped at the end)
    assert all(epochs[t.number] == EPOCHS for t in study.trials if t.state.name == "COMPLETE")

    monkeypatch.undo()
    result = run_search(search, progress=False)  # the study is complete: only its outputs and the final runs
    assert result.trials == 8 and result.trials_now == 0 and result.best_value == study.best_value
    assert result.best_config == dataclasses.replace(search.base, lr=study.best_params["lr"],
                                                     soft_labels=dataclasses.replace(search.base.soft_labels,
                                                                                     alpha=study.best_params["alpha"]))
    folder = search.folder()
    assert {p.name for p in folder.iterdir()} >= {
        "study.db", "trials.csv", "best.json", "best_command.txt", "final.md",
        *(f"{n}.{s}" for n in ("optimization_history", "param_importances", "parallel_coordinate")
          for s in ("png", "pdf"))}
    rows = (folder / "trials.csv").read_text().splitlines()
    assert len(rows) == 9 and rows[0].startswith("number,state,value,alpha,lr")
    best = json.loads((folder / "best.json").read_text())
    assert best["split"] == "validation" and best["best_trial"] == study.best_trial.number
    # the final record is a normal test record; the printed command line trains exactly that run
    (record,) = result.records
    assert {"base", "new", "H"} <= record["metrics"].keys()
    from atlas_fast.cli import main

    assert main(shlex.split(result.command)[1:] + ["--no-progress"]) == 0
    from atlas_fast.engine.record import read_record

    assert len(list(Path(record["path"]).parent.glob("*.json"))) == 1  # the command line found the same record
    assert read_record(record["path"])["key"] == record["key"]


def test_batched_trials_equal_trials_trained_one_by_one_and_pruning_leaves_survivors_unchanged(world):
    """Random sampling draws the same values whatever the batch; so trials batched R = 4 equal the same trials
    trained one by one, and with pruning the trials that survive end with exactly their unpruned values."""
    common = dict(sampler="random", n_trials=6)
    alone = run_study(search_config(world, "batch-1", pruner="none", batch_trials=1, **common), progress=False)
    batched = run_study(search_config(world, "batch-4", pruner="none", batch_trials=4, **common), progress=False)
    pruned = run_study(search_config(world, "batch-4-pruned", pruner="halving", batch_trials=4, **common),
                       progress=False)
    for a, b in zip(alone.trials, batched.trials):
        assert a.params == b.params and b.state.name == "COMPLETE"
        assert b.value == pytest.approx(a.value, abs=1e-4)
        assert list(b.intermediate_values.values()) == pytest.approx(list(a.intermediate_values.values()), abs=1e-4)
    states = [t.state.name for t in pruned.trials]
    assert "PRUNED" in states and "COMPLETE" in states, states
    for a, p in zip(batched.trials, pruned.trials):
        assert a.params == p.params
        if p.state.name == "COMPLETE":
            assert p.value == pytest.approx(a.value, abs=1e-4)


def test_a_method_that_does_not_batch_trains_each_run_of_a_trial_alone(world, monkeypatch):
    """A method that trains runs one by one (KgCoOp made so here, as a plugin's method may be): a trial of two seeds
    trains them in turn (steps continue over the second seed) and its value is the mean of the two runs' final
    values."""
    from atlas_fast.methods.registry import method_class

    monkeypatch.setattr(method_class("kgcoop"), "supports_batched_runs", False)
    search = search_config(world, "kgcoop", base=base_config(world, "kgcoop", method="kgcoop", method_options=None),
                           seeds=(1, 2), n_trials=2, batch_trials=2, pruner="none", sampler="random")
    study = run_study(search, progress=False)
    for trial in study.trials:
        steps = trial.intermediate_values
        assert trial.state.name == "COMPLETE" and sorted(steps) == [EPOCHS - 1, 2 * EPOCHS - 1]  # no pruner
        assert trial.value == pytest.approx((steps[EPOCHS - 1] + steps[2 * EPOCHS - 1]) / 2)
        assert trial.user_attrs["epochs"] == 2 * EPOCHS


def test_the_stored_study_opens_through_optunas_api(world):
    search = search_config(world, "open", n_trials=3, pruner="none")
    run_study(search, progress=False)
    study = optuna.load_study(study_name=search.name(), storage=search.storage_url())
    assert len(study.trials) == 3 and study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert study.best_trial.params.keys() == SPACE.keys()
    assert "atlas_fast:definition" in study.user_attrs


# --- several processes: kill -9 and resume, two workers on one study --------------------------------------------

SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    import test_search
    from atlas_fast.search import run_study
    import atlas_fast.search.trials as trials

    root, results, slow = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    if slow:  # slow epochs, so that a test can kill a trial in the middle
        evaluate = trials._validation_objectives
        def slowed(*args, **kwargs):
            time.sleep(slow)
            return evaluate(*args, **kwargs)
        trials._validation_objectives = slowed
    search = test_search.search_config(root, results, storage=sys.argv[4], n_trials=int(sys.argv[5]))
    run_study(search, progress=False)
""")


def start(world: Path, storage: str, slow: float, n_trials: int, tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "study.py"
    script.write_text(SCRIPT.format(tests=str(REPO / "tests")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(script), str(world), "procs", str(slow), storage, str(n_trials)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen) -> None:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]


@pytest.mark.slow  # ~35 s: a subprocess, killed, and two studies
def test_a_study_killed_mid_trial_resumes_to_the_same_final_study(world, tmp_path):
    name = search_config(world, "procs", n_trials=5).name()
    whole, killed = (f"sqlite:///{tmp_path / f}" for f in ("whole.db", "killed.db"))
    process = start(world, killed, 0.3, 5, tmp_path)
    deadline = time.time() + 240
    victim = None
    while victim is None and time.time() < deadline:  # kill it inside trial 1 or later, after its first rung
        time.sleep(0.1)
        try:
            trials = optuna.load_study(study_name=name, storage=killed).trials
        except (KeyError, Exception):  # the study is not created yet
            continue
        running = [t for t in trials if t.state.name == "RUNNING" and t.number >= 1 and
                   len(t.intermediate_values) >= 1]
        if running:
            victim = running[0].number
    assert victim is not None, "the study never reached a trial to kill"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    interrupted = optuna.load_study(study_name=name, storage=killed)
    assert interrupted.trials[victim].state.name == "RUNNING"
    run_study(search_config(world, "procs", storage=whole, n_trials=5), progress=False)  # uninterrupted
    # the same study again: it takes the dead trial over, then goes on
    run_study(search_config(world, "procs", storage=killed, n_trials=5), progress=False)
    resumed = optuna.load_study(study_name=name, storage=killed)
    reference = optuna.load_study(study_name=name, storage=whole)
    assert len(resumed.trials) == len(reference.trials) == 5
    assert resumed.best_value == reference.best_value
    for number, (state, params, value, steps) in trials_by_number(reference).items():
        got = trials_by_number(resumed)[number]
        assert got[:2] == (state, params) and got[2] == pytest.approx(value, abs=1e-6)


@pytest.mark.slow  # ~20 s: a subprocess beside this one
def test_two_processes_share_one_study(world, tmp_path):
    name = search_config(world, "procs", n_trials=6).name()
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    process = start(world, storage, 0.2, 6, tmp_path)
    search = search_config(world, "procs", storage=storage, n_trials=6)
    while True:  # join once the other process has created the study and begun a trial
        time.sleep(0.2)
        try:
            if optuna.load_study(study_name=name, storage=storage).trials:
                break
        except KeyError:
            pass
    run_study(search, progress=False)
    finish(process)
    study = optuna.load_study(study_name=name, storage=storage)
    numbers = [t.number for t in study.trials]
    assert numbers == list(range(len(numbers))) and 6 <= len(numbers) <= 7  # at most one asked in the same instant
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials)
    assert len({t.user_attrs["process"] for t in study.trials}) == 2  # both processes trained trials


# --- bad input: one error line, before any training, nothing lost -----------------------------------------------

def cli(world: Path, *extra: str, results: str = "cli") -> list[str]:
    return ["search", "--datasets", "WorldPhotos", "--data-root", str(world / "data"), "--model", "atlas-world",
            "--pretrained", "atlas-world", "--shots", "4", "--epochs", "2", "--views", "1", "--batch-size", "8",
            "--method-option", "n_ctx=4", "--device", "cpu", "--cache-root", str(world / f"{results}-cache"),
            "--results-dir", str(world / results), "--no-progress", "--heartbeat", "0.2", "--lock-timeout", "0.5",
            *extra]


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("args, message", [
    (["--atlas", "isl", "--param", "alpha=1.0:0.1"], "inverted"),
    (["--atlas", "isl", "--param", "alpha=0.5:0.5"], "empty"),
    (["--param", "lr=log:0:0.1"], "log range"),
    (["--param", "depth=1,2"], "coop has no parameter 'depth'"),
    (["--atlas", "isl", "--param", "theta=0.1:0.6"], "isl soft labels do not read"),
    (["--param", "K=int:1:5"], "ATLaS parameters need a run with soft labels"),
    (["--setting", "few_shot", "--objective", "new", "--param", "lr=0.001:0.01"], "not defined in the few_shot"),
    (["--param", "lr=0.001"], "has one value"),
    (["--param", "lr"], "--param takes NAME=SPEC"),
])
def test_bad_study_definitions_are_one_error_line_before_any_training(world, capsys, args, message):
    from atlas_fast.cli import main

    assert main(cli(world, *args, results="bad")) == 2
    (line,) = error_lines(capsys)
    assert message in line
    assert not list((world / "bad-cache").rglob("*.h5")) and not (world / "bad" / "search").exists()


def test_bad_storages_are_refused_and_left_as_they_were(world, tmp_path, capsys):
    from atlas_fast.cli import main

    db = tmp_path / "study.db"
    storage = ["--storage", f"sqlite:///{db}", "--study-name", "mine"]
    assert main(cli(world, "--param", "lr=0.001:0.01", "--trials", "1", "--pruner", "none", "--no-final",
                    *storage)) == 0
    assert "(1 trained now)" in capsys.readouterr().out
    assert main(cli(world, "--param", "lr=0.001:0.01", "--trials", "1", "--pruner", "none", "--no-final",
                    *storage)) == 0  # the same finished study again says so
    assert "nothing left to run: study mine already holds its 1 trial" in capsys.readouterr().out
    # the search closed its connections: the write-ahead log is in the file, whatever still holds the study
    assert not Path(f"{db}-wal").exists()
    before = db.read_bytes()

    # another study's definition under the same name
    assert main(cli(world, "--param", "lr=0.001:0.1", "--trials", "1", *storage)) == 2
    (line,) = error_lines(capsys)
    assert "holds another study named 'mine'" in line and "space" in line
    # a locked database
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert main(cli(world, "--param", "lr=0.001:0.01", "--trials", "2", *storage)) == 2
        (line,) = error_lines(capsys)
        assert "locked" in line
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert db.read_bytes() == before
    assert len(optuna.load_study(study_name="mine", storage=f"sqlite:///{db}").trials) == 1
    # not an Optuna storage at all
    other = tmp_path / "notes.db"
    other.write_bytes(b"these are my notes, not a database")
    assert main(cli(world, "--param", "lr=0.001:0.01", "--storage", f"sqlite:///{other}")) == 2
    (line,) = error_lines(capsys)
    assert "not an SQLite database" in line and other.read_bytes() == b"these are my notes, not a database"


def test_search_help_does_not_import_torch():
    probe = ("import sys\nfrom atlas_fast.cli import main\ntry:\n    main(['search', '--help'])\n"
             "except SystemExit:\n    pass\nprint('HEAVY', sorted(m for m in ('torch', 'optuna') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env).stdout
    assert "HEAVY []" in out, out[-500:]


def test_a_search_config_uses_no_deprecated_name():
    """SearchConfig's check of its datasets looked them up through the registry's deprecated ``find_spec``, which
    warned on every search; with DeprecationWarning as an error it builds, and a dataset named twice (two spellings)
    is still refused."""
    import warnings

    from atlas_fast.errors import UsageError

    base = TrainConfig("OxfordPets", "d", backbone=BackboneConfig("atlas-tiny", None), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        SearchConfig(base, {"lr": uniform(0.001, 0.01)}, datasets=["OxfordPets"], seeds=[1])
        with pytest.raises(UsageError, match="twice"):
            SearchConfig(base, {"lr": uniform(0.001, 0.01)}, datasets=["OxfordPets", "oxford_pets"], seeds=[1])
