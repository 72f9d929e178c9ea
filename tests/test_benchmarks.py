"""The method benchmark script runs and its two paths agree (a smoke test on the tiny model, not a timing)."""

import importlib.util
import json
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


def load_benchmark(name: str):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paper_scale_prices_the_table_from_its_units_and_again_from_its_json(capsys, tmp_path):
    """A smoke test on the tiny model (not a timing): the units of two datasets and two methods at their real C,
    the table priced, the JSON written, and the same table priced again from the JSON measuring nothing."""
    module = load_benchmark("paper_scale")
    out = tmp_path / "units.json"
    args = ["--model", "atlas-tiny", "--datasets", "EuroSAT", "OxfordPets", "--methods", "coop", "ivlp",
            "--steps", "1", "--eval-images", "2", "--device", "cpu"]
    assert module.main([*args, "--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert "| EuroSAT | coop | 5 | 32 | 4 |" in first and "| OxfordPets | ivlp | 19 | 4 | 4 |" in first
    assert "| ivlp | 24 | 4 | " in first  # a pixel method batches its runs like the cached ones
    assert "### Table III on this machine (cpu): 48 of 48 runs priced" in first  # 2 x 2 methods x 4 x 3
    saved = json.loads(out.read_text())
    assert saved["result"]["runs_priced"] == 48 and saved["result"]["table3_seconds"] > 0
    assert module.main([*args, "--units-from", str(out)]) == 0
    second = capsys.readouterr().out
    assert "skipped" not in second.split("### Table III")[1]
    total = [line for line in second.splitlines() if line.startswith("| **total** |")]
    assert total == [line for line in first.splitlines() if line.startswith("| **total** |")]


def test_paper_scale_refuses_an_unknown_dataset(capsys):
    module = load_benchmark("paper_scale")
    with pytest.raises(SystemExit):
        module.main(["--model", "atlas-tiny", "--datasets", "Nowhere"])
    assert "'Nowhere' has no published split sizes" in capsys.readouterr().err


def test_cached_step_work_counts_a_graphed_steps_host_work(capsys):
    """A smoke test on the tiny model: a graphed step dispatches nothing on the host between replays and reads
    nothing back, where the step before this change read the gradient scaler's overflow flag back under AMP."""
    module = load_benchmark("cached_step_work")
    assert module.main(["--sections", "host", "--methods", "coop", "--host-runs", "2"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| coop | ")]
    assert [row[2].strip() for row in rows] == ["fp32", "AMP"]
    assert all(row[4].strip().startswith("0 / 0 (") for row in rows)
    assert [row[5].strip().split(" / ")[1] for row in rows] == ["0", "1"]


@pytest.mark.slow
def test_cached_step_work_counts_fewer_flops_with_length_groups(capsys):
    module = load_benchmark("cached_step_work")
    assert module.main(["--sections", "flops", "--model", "atlas-tiny", "--methods", "coop", "--classes", "500",
                        "--runs", "12"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| coop | 500 |")]
    assert float(line.split("|")[6].strip().rstrip("x")) < 0.6  # graph groups / padded


def test_gpu_checks_first_contact_overflow_row_judges_against_torchs_grad_scaler(monkeypatch):
    """The GPU check's injected-overflow row on the CPU (eager): atlas_fast's optimiser equals torch's SGD +
    GradScaler (ok); with a different backoff factor injected it does not (FAIL). A graph_steps fallback warning
    inside any check is a FAIL row of its own."""
    import warnings

    import atlas_fast.engine.optim as optim

    module = load_benchmark("gpu_check")
    module.SETUP.update(device="cpu", model="atlas-tiny")
    module.ROWS.clear()
    module.check_overflow()
    assert module.ROWS[-1][:3] == ("first contact: injected overflow vs torch's GradScaler", "ok", "eager: equal")
    monkeypatch.setattr(optim, "BACKOFF_FACTOR", 0.25)
    module.check_overflow()
    assert module.ROWS[-1][1:3] == ("FAIL", "eager: DIFFERENT")

    @module.guarded("a check")
    def falls_back():
        warnings.warn("graph_steps: capturing a step of coop failed: ...; these runs train eagerly")
        module.row("a check", "ok")

    falls_back()
    assert module.ROWS[-2][:2] == ("a check", "ok")
    assert module.ROWS[-1][:2] == ("a check: graph fallback", "FAIL")


def test_faiss_sizes_prints_every_search_it_prices(capsys):
    """benchmarks/faiss_sizes.py at small sizes (not a timing): the CSL search, the whole CSL matrix, and ISL's
    products by torch and through faiss, each with its shape."""
    module = load_benchmark("faiss_sizes")
    assert module.main(["--classes", "20", "--images", "50", "--dim", "16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| CSL: faiss IndexFlatIP, k = C | 20 x 20 x 16 |" in out
    assert "| CSL: class_soft_labels (whole) | 20 x 20 |" in out
    assert "| ISL: torch N x C inner products + softmax | 50 x 20 x 16 |" in out
    assert "| ISL's search through faiss IndexFlatIP, k = C | 50 x 20 x 16 |" in out


def test_gpu_check_sh_help_prints_its_usage_and_runs_nothing(tmp_path):
    """``bash benchmarks/gpu_check.sh --help`` says what the script does and exits 0 without checking or running
    anything: it ran the doctor (a minute) and then the checks with --help passed on, and where torch is missing it
    said MISSING instead. ``PYTHON=false`` stands for a Python without torch, so no check could start."""
    import os
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
    done = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": "false"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--smoke" in done.stdout and "--wheels DIR" in done.stdout and "Exit status" in done.stdout
    assert "atlas-fast doctor\n" not in done.stdout and "MISSING" not in done.stdout + done.stderr
    assert not done.stdout.startswith("#!")


@pytest.mark.slow
def test_pinned_runs_are_identical_twice_and_a_changed_field_is_a_difference(capsys, tmp_path):
    """benchmarks/pinned_runs.py on two of its cases (a lone and a batched CoOp): two runs write identical summaries
    (compare exits 0); a changed loss and a missing run are named, field by field, and compare exits 1."""
    module = load_benchmark("pinned_runs")
    first, second, changed = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    for out in (first, second):
        assert module.main(["--out", str(out), "--only", "lone/coop", "batched/coop",
                            "--work", str(tmp_path / "work")]) == 0
    assert module.main(["--compare", str(first), str(second)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("3 runs: identical")
    summary = json.loads(first.read_text())
    assert {"lone/coop#0", "batched/coop#0", "batched/coop#1"} <= summary["runs"].keys()
    assert summary["runs"]["batched/coop#1"]["batch_runs"] == 2 and summary["runs"]["lone/coop#0"]["tensors"]["ctx"]
    summary["runs"]["lone/coop#0"]["epochs"][1]["loss"] += 1e-7
    del summary["runs"]["batched/coop#1"]
    changed.write_text(json.dumps(summary))
    assert module.main(["--compare", str(first), str(changed)]) == 1
    out = capsys.readouterr().out
    assert "lone/coop#0: 1 difference(s)\n  epochs[1].loss:" in out and "batched/coop#1: 1 difference(s)" in out
    assert out.rstrip().endswith("3 runs, 2 differ")
