"""benchmarks/step_speed.py runs end to end (a smoke test on the tiny model, not a timing)."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_speed_runs_on_the_tiny_model(capsys):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "step_speed.py"
    spec = importlib.util.spec_from_file_location("step_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.measure(["--model", "atlas-tiny", "--classes", "19", "30", "--repeats", "1"])
    assert [variant for row_name, variant, _, _ in rows if row_name.startswith("text fwd+bwd, C=30")] == [
        "plain", "shared prefix", "shared prefix + length groups"]
    assert all(seconds > 0 for _, _, seconds, _ in rows)
    assert len(module.synthetic_classnames(500)) == 500
    out = capsys.readouterr().out
    assert "| MaPLe training step (M=2, J=2, batch 4, C=19) | after: fused + shared prefix |" in out
