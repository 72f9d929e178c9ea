"""``atlas-fast demo``'s lines: a progress line with the time so far and about how much is left for every long
phase (the runs: tests/test_progress.py; κ here), and a total that counts the whole command, with where it went."""

import re
from pathlib import Path

import pytest

DURATION = r"(?:[\d.]+ s|\d+ min \d+ s)"


def test_the_total_counts_the_command_from_its_start_and_says_where_it_went(monkeypatch):
    from atlas_fast.app import demo

    monkeypatch.setattr("atlas_fast.progress.process_seconds", lambda: 200.0)
    trained = [{"timings": {"inputs": 30.0}, "skipped": False}, {"timings": {"inputs": 10.5}, "skipped": False}]
    phases = {"start-up": 2.5, "world": 1.0, "runs": 150.0, "κ": 40.0, "table and plot": 3.0}
    assert demo.time_line(phases, trained) == (
        "Total time: 3 min 20 s from the command's start (start-up 2.5 s; world 1.0 s; 2 runs 2 min 30 s: feature "
        "cache and inputs 40 s, training and evaluation 1 min 49 s; κ 40 s; table and plot 3.0 s)")
    reused = [{**record, "skipped": True} for record in trained]
    assert "; runs 2 min 30 s: every run was finished already;" in demo.time_line(phases, reused)


def test_kappa_says_how_far_it_is_run_by_run(monkeypatch, capsys):
    """The κ phase took 14 silent minutes on the demo: a line per run measured, with the time so far and left."""
    from atlas_fast.app import demo
    from atlas_fast.app import kappa_runs
    from atlas_fast.atlas.variants import paper_variants
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig

    monkeypatch.setattr(kappa_runs, "run_kappa", lambda *args, **kwargs: [])
    monkeypatch.setattr(kappa_runs, "kappa_sentence", lambda rows, records, dataset: "")
    config = demo.DemoConfig(seeds=(1, 2))
    base = TrainConfig("WorldPhotos", Path("data"), BackboneConfig("atlas-world", "atlas-world"))
    variants = paper_variants("base2new")
    records = [{"config": {"method": "coop", "schedule": v.schedule.describe(),
                           "soft_labels": v.soft_labels and {"kind": v.soft_labels.kind}}}
               for v in variants for _ in config.seeds]
    assert demo.kappa_sentences(base, config, variants, records, progress=True) == []
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 8
    assert re.fullmatch(rf"κ \[1/8\] WorldPhotos CoOp seed 1: {DURATION} so far, about {DURATION} left", lines[0])
    assert re.fullmatch(rf"κ \[8/8\] WorldPhotos \+ ATLaS-ISL seed 2: {DURATION} so far", lines[-1])


@pytest.mark.slow  # a whole tiny demo with κ: about 30 s on a loaded 2-core machine
def test_a_tiny_demo_prints_every_phase_and_its_total(tmp_path, capsys):
    from atlas_fast.app.demo import DemoConfig, run_demo
    from atlas_fast.world.benchmark import SplitSizes

    config = DemoConfig(data_root=tmp_path / "world", cache_root=tmp_path / "cache", results_dir=tmp_path / "demo",
                        seeds=(1,), shots=2, sizes=SplitSizes(train=2, val=1, test=1), epochs=2, kappa=True,
                        plot=tmp_path / "demo" / "table.png")
    report = run_demo(config, progress=True)
    err = capsys.readouterr().err
    assert "demo 3/4: κ of Theorem 1" in err and "demo 4/4: the table" in err
    assert re.search(rf"\[4/4\] WorldPhotos coop\+ATLaS-ISL .* seed 1: base .*; {DURATION} so far", err), err
    assert re.search(rf"κ \[4/4\] WorldPhotos \+ ATLaS-ISL seed 1: {DURATION} so far$", err, re.M), err
    assert re.fullmatch(rf"Total time: {DURATION} from the command's start \(start-up {DURATION}; world {DURATION}; "
                        rf"4 runs {DURATION}: feature cache and inputs {DURATION}, training and evaluation "
                        rf"{DURATION}; κ {DURATION}; table and plot {DURATION}\)", report.splitlines()[-1])
