"""The method benchmark script runs and its two paths agree (a smoke test on the tiny model, not a timing)."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_method_speed_paths_agree_on_the_tiny_model(capsys):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "method_speed.py"
    spec = importlib.util.spec_from_file_location("method_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--model", "atlas-tiny", "--classes", "3", "--steps", "1", "--eval-images", "5",
                        "--eval-sequences", "7", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "| CoCoOp | 3 | 1 | 48 |" in out and "| DePT-CoOp | 3 | 4 | 12 |" in out
    assert "losses and logits agree between the paths: True" in out
