"""Progress: a line per finished run (also in logs), bars only on a terminal, nothing with progress off."""

import re

import pytest

from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig
from atlas_fast.atlas.schedules import OneHot
from atlas_fast.atlas.variants import LabelVariant
from atlas_fast.sweep import Execution, run_grid
from helpers import small_pets

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_pets(tmp_path_factory, "progress")


def grid(data, results, progress):
    base = TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), shots=2, epochs=2,
                       device="cpu", cache_root=data / results / "cache", results_dir=data / results, progress=False)
    return run_grid(base, ["OxfordPets"], [LabelVariant("CoOp", OneHot())], [1, 2], progress=progress,
                    execution=Execution("local", batch_runs=1))


def test_a_log_gets_one_line_per_run_and_no_bars(data, capsys):
    records = grid(data, "log", progress=True)
    err = capsys.readouterr().err
    assert "2 run(s): 0 finished, 2 to train in 2 group(s) (R = 1, 1) (local)" in err
    for i, record in enumerate(records, 1):
        metrics = record["metrics"]
        assert (f"[{i}/2] OxfordPets coop [epochs=2, shots=2, backbone=atlas-tiny] seed {i}: "
                f"base {metrics['base']:.2f}  new {metrics['new']:.2f}  "
                f"H {metrics['H']:.2f}") in err
    assert re.search(r"\[1/2\] .* seed 1: .*; [\d.]+ s so far, about [\d.]+ s left\n", err), err  # groups of one
    assert re.search(r"\[2/2\] .* seed 2: .*; [\d.]+ s so far\n", err), err
    assert "cache: encoded" in err and "views/s" in err  # the cache build's rate, once
    assert "\r" not in err  # no redrawn bars in a file


def test_a_terminal_gets_bars_and_no_progress_is_quiet(data, capsys, monkeypatch):
    monkeypatch.setattr("atlas_fast.progress.interactive", lambda: True)
    grid(data, "tty", progress=True)
    err = capsys.readouterr().err
    assert "runs:" in err and "train coop" in err  # the sweep's bar and the group's epoch bar
    grid(data, "quiet", progress=False)
    assert capsys.readouterr().err == ""


def test_a_run_from_python_says_how_its_epochs_go_where_no_bar_can_redraw(tmp_path_factory, capsys, monkeypatch):
    """The README's Python loop printed nothing for the ~36 s of a run's training (bars need a terminal): where
    standard error is no terminal, ``run`` prints a line about its epochs every so often, as the cache build does."""
    from atlas_fast.engine import loop, run
    from helpers import small_pets, tiny_pets_config

    monkeypatch.setattr(loop, "EPOCH_LINE_SECONDS", 0.0)  # a line after every epoch (10 s apart by default)
    root = small_pets(tmp_path_factory, "epoch_lines")
    run(tiny_pets_config(root, epochs=3, progress=True))
    err = capsys.readouterr().err
    assert "train coop: 1 of 3 epochs (33 %)" in err and "train coop: 2 of 3 epochs (67 %)" in err
