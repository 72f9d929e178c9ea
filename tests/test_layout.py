"""The layout promised to users: the experiment modules live in the top-level ``experiments/`` folder, exist once,
and run as ``atlas_fast.experiments`` from any folder."""

import subprocess
import sys
from pathlib import Path

import atlas_fast.experiments

REPO = Path(__file__).resolve().parents[1]


def test_the_experiment_modules_are_the_top_level_folder_and_exist_once():
    assert Path(atlas_fast.experiments.__file__).resolve().parent == REPO / "experiments"
    assert not (REPO / "atlas_fast" / "experiments").exists()
    assert "table3_base_to_new" in atlas_fast.experiments.experiment_names()


def test_the_experiments_run_from_another_folder(tmp_path):
    listing = subprocess.run([sys.executable, "-m", "atlas_fast.experiments", "--list"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "table3_base_to_new" in listing.stdout and "Table III" in listing.stdout
