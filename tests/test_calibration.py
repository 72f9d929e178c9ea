"""Calibration in every record (issue 46): top-1 ECE (15 equal-width bins), NLL, Brier and mean confidence from a
method's own scaled logits, computed in the evaluation pass; temperature scaling on the few-shot validation split;
per-image predictions saved on request, covered by the record's seal; old records completed from their prompts."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from atlas_fast.engine import run
from atlas_fast.engine.calibration import (CALIBRATION_BINS, calibration_metrics, fit_temperature,
                                           per_image_scores, summarise)
from atlas_fast.engine.evaluate import top1_accuracy
from atlas_fast.engine.record import ResultStore, read_record
from atlas_fast.engine.spec import plan_run
from atlas_fast.engine.validity import stored_record_problems
from helpers import eight_class_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")


def by_hand(logits, labels, bins=15):
    """ECE (percent), NLL, Brier and confidence (percent) written out with plain Python loops (Guo et al. 2017)."""
    n = len(labels)
    confidences, hits, nll, brier = [], [], 0.0, 0.0
    for row, label in zip(logits, labels):
        top = max(row)
        exps = [math.exp(v - top) for v in row]
        total = sum(exps)
        p = [e / total for e in exps]
        best = max(range(len(p)), key=lambda c: p[c])
        confidences.append(p[best])
        hits.append(1.0 if best == label else 0.0)
        nll += -math.log(p[label])
        brier += sum((p[c] - (1.0 if c == label else 0.0)) ** 2 for c in range(len(p)))
    ece = 0.0
    for b in range(bins):
        lower, upper = b / bins, (b + 1) / bins
        members = [i for i in range(n) if lower < confidences[i] <= upper]
        if members:
            accuracy = sum(hits[i] for i in members) / len(members)
            confidence = sum(confidences[i] for i in members) / len(members)
            ece += len(members) / n * abs(accuracy - confidence)
    return {"ece": 100 * ece, "nll": nll / n, "brier": brier / n, "confidence": 100 * sum(confidences) / n,
            "accuracy": 100 * sum(hits) / n}


def fixed_logits():
    g = torch.Generator().manual_seed(46)
    logits = torch.randn(300, 7, generator=g, dtype=torch.float64) * 4
    labels = torch.randint(0, 7, (300,), generator=g)
    logits[::3, :] += 6 * torch.nn.functional.one_hot(labels[::3], 7)  # some confident hits among the misses
    return logits.float(), labels


def test_ece_nll_brier_match_a_loop_over_bins_to_1e_6():
    logits, labels = fixed_logits()
    expected = by_hand(logits.double().tolist(), labels.tolist())
    got = calibration_metrics(logits, labels)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name
    assert sum(got["bins"]["count"]) == 300 and len(got["bins"]["count"]) == CALIBRATION_BINS
    assert sum(got["bins"]["correct"]) == round(expected["accuracy"] * 3)
    # numpy arrays are scored alike; and with a temperature, as the logits divided by it
    assert calibration_metrics(logits.numpy(), labels.numpy())["ece"] == got["ece"]
    scaled = by_hand((logits.double() / 2.5).tolist(), labels.tolist())
    assert calibration_metrics(logits, labels, temperature=2.5)["nll"] == pytest.approx(scaled["nll"], abs=1e-6)


def test_a_confidence_on_a_bin_edge_falls_in_the_lower_bin():
    # two classes with p = 0.6 exactly: 0.6 = 9/15 is the upper edge of bin 8 (lower < c <= upper)
    logits = torch.tensor([[math.log(0.6), math.log(0.4)]] * 4, dtype=torch.float64)
    scores = per_image_scores(logits, torch.tensor([0, 0, 0, 1]))
    summary = summarise(scores)
    assert summary["bins"]["count"][8] == 4 and summary["ece"] == pytest.approx(15.0)


def test_chunks_give_the_figures_of_the_whole_split():
    from atlas_fast.engine.calibration import PerImage

    logits, labels = fixed_logits()
    parts = [per_image_scores(logits[i:i + 64], labels[i:i + 64]) for i in range(0, 300, 64)]
    assert summarise(PerImage.cat(parts)) == calibration_metrics(logits, labels)


def test_the_fitted_temperature_minimises_the_nll_and_is_refused_without_images():
    logits, labels = fixed_logits()
    t = fit_temperature(logits, labels)
    nll = calibration_metrics(logits, labels, temperature=t)["nll"]
    for other in (t * 0.98, t * 1.02, 1.0):
        assert calibration_metrics(logits, labels, temperature=other)["nll"] > nll
    with pytest.raises(ValueError, match="N >= 1"):
        fit_temperature(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


def saved_predictions(record_path) -> dict[str, np.ndarray]:
    """The per-image predictions a record names, read as a user reads them (numpy)."""
    path = Path(record_path)
    with np.load(path.with_name(read_record(path)["predictions"]), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    return eight_class_pets(tmp_path_factory, "calib")


def test_a_run_records_calibration_and_its_saved_logits_reproduce_it_exactly(pets):
    record = run(tiny_pets_config(pets, save_predictions=True))
    figures = record["metrics"]["calibration"]
    assert set(figures) == {"base", "new", "all"}
    for name in ("base", "new", "all"):
        assert set(figures[name]) == {"ece", "nll", "brier", "confidence", "temperature", "ece_ts", "nll_ts"}
        assert sum(record["reliability"][name]["count"]) == record["data"]["num_test"][name]
    # one temperature per run, fitted on the base classes' validation split, applied to every set
    assert len({figures[name]["temperature"] for name in figures}) == 1
    saved = saved_predictions(record["path"])
    assert sorted(saved) == ["all_labels", "all_logits", "base_labels", "base_logits", "new_labels", "new_logits"]
    for name in ("base", "new", "all"):
        logits, labels = saved[f"{name}_logits"], saved[f"{name}_labels"]
        assert logits.dtype == np.float32 and labels.dtype == np.int64 and logits.shape[0] == labels.shape[0]
        assert top1_accuracy(torch.from_numpy(logits)[None], torch.from_numpy(labels)).item() == (
            record["metrics"][name])
        again = calibration_metrics(logits, labels)
        assert {k: again[k] for k in ("ece", "nll", "brier", "confidence")} == {
            k: figures[name][k] for k in ("ece", "nll", "brier", "confidence")}
        assert again["bins"] == record["reliability"][name]
        scaled = calibration_metrics(logits, labels, temperature=figures[name]["temperature"])
        assert (scaled["ece"], scaled["nll"]) == (figures[name]["ece_ts"], figures[name]["nll_ts"])


def test_saved_predictions_are_covered_by_the_seal(pets):
    record = run(tiny_pets_config(pets, results_dir=pets / "sealed", save_predictions=True))
    path = ResultStore(pets / "sealed").predictions_path("OxfordPets", plan_run(
        tiny_pets_config(pets, results_dir=pets / "sealed")).stem)
    assert read_record(record["path"])["predictions"] == path.name
    assert not stored_record_problems(Path(record["path"]))[1]
    data = bytearray(path.read_bytes())
    data[-200] ^= 1
    path.write_bytes(bytes(data))
    problems = stored_record_problems(Path(record["path"]))[1]
    assert problems == [f"its predictions {path} fail their checksum (the file is damaged or was replaced)"]


def test_an_old_record_without_calibration_is_completed_from_its_saved_prompts(pets, monkeypatch):
    from atlas_fast.engine import pipeline
    from atlas_fast.engine.record import load_learned

    config = tiny_pets_config(pets, results_dir=pets / "old")
    fresh = run(config)
    # the record as written before records held calibration
    fields = {k: v for k, v in read_record(fresh["path"]).items()
              if k not in ("status", "learned", "learned_blake2b", "seal", "reliability")}
    fields["metrics"] = {k: v for k, v in fields["metrics"].items() if k != "calibration"}
    stem = plan_run(config).stem
    ResultStore(pets / "old").save("OxfordPets", stem, fields, load_learned(fresh["path"]))
    monkeypatch.setattr(pipeline, "train_group", lambda specs: pytest.fail("trained again"))
    completed = run(config)
    assert completed["skipped"]
    assert completed["metrics"]["calibration"] == fresh["metrics"]["calibration"]
    assert completed["reliability"] == fresh["reliability"]
    assert completed["evaluated_later"][-1]["calibrated"] == ["base", "new", "all"]
    assert json.loads(open(completed["path"]).read())["metrics"]["calibration"] == fresh["metrics"]["calibration"]


def test_the_calibration_tables_show_a_dash_for_old_records_and_bold_the_lowest_ece(pets, tmp_path):
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.report.figures import plot_reliability
    from atlas_fast.report.formats import csv_lines, latex_table, markdown_table
    from atlas_fast.report.rows import aggregate, calibration_columns

    plain = [run(tiny_pets_config(pets))]  # the first test's run, found again
    smoothed = [run(tiny_pets_config(pets, schedule=Alternating(1), soft_labels=soft_label_preset("base2new", "ls")))]
    # the same variant's run of another seed, as records were written before they held calibration
    old = {**smoothed[0], "config": {**smoothed[0]["config"], "seed": 2}, "reliability": None,
           "metrics": {k: v for k, v in smoothed[0]["metrics"].items() if k != "calibration"}}
    columns = calibration_columns(["ECE", "ECE (T)"])
    rows = aggregate(plain + [smoothed[0], old], metrics=columns)
    assert rows[0].metrics["ECE new"] == plain[0]["metrics"]["calibration"]["new"]["ece"]
    text = markdown_table(rows, "t", paired=columns)
    line = [row for row in text.splitlines() if row.startswith("| + ATLaS")][0]
    assert line.split("|")[2].strip() == "–" and "– = not in the records" in text
    assert "ΔECE base" in text and "ΔECE (T) new" in text
    # the lower ECE is the better one
    both = aggregate(plain + smoothed, metrics=columns)
    lower = min(range(2), key=lambda i: round(both[i].metrics["ECE new"], 2))
    latex = latex_table(both, "t", paired=columns).splitlines()
    cell = [row for row in latex if row.strip().startswith(("CoOp", r"+ ATLaS"))][lower]
    assert r"\textbf{" + f"{both[lower].metrics['ECE new']:.2f}" + "}" in cell
    assert {"ECE base diff", "ECE (T) new ci95_high"} <= set(csv_lines(both, paired=columns)[1])
    path = plot_reliability(plain + smoothed, tmp_path / "reliability.png", "new")
    assert path.stat().st_size > 0 and path.with_suffix(".pdf").stat().st_size > 0
    with pytest.raises(ValueError, match="No reliability table"):
        plot_reliability([old], tmp_path / "none.png", "new")


def test_the_command_line_saves_predictions_reports_calibration_and_verifies_them(pets, capsys):
    from atlas_fast.cli import main

    results = pets / "cli"
    common = ["--dataset", "OxfordPets", "--data-root", str(pets / "data"), "--model", "atlas-tiny", "--pretrained",
              "none", "--shots", "4", "--epochs", "2", "--batch-size", "3", "--views", "1", "--lr", "0.05",
              "--cache-root", str(pets / "cache"), "--results-dir", str(results), "--no-progress"]
    assert main(["train", *common, "--save-predictions"]) == 0
    record_path = next(results.glob("OxfordPets/*.json"))
    predictions = record_path.with_suffix(".predictions.npz")
    assert predictions.is_file() and read_record(record_path)["predictions"] == predictions.name
    capsys.readouterr()
    assert main(["eval", "--record", str(record_path), "--dataset", "OxfordPets", "--data-root", str(pets / "data"),
                 "--subsample", "new", "--cache-root", str(pets / "cache"), "--no-progress", "--save-predictions"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"accuracy \d+\.\d\d  \| ECE \d+\.\d\d, NLL \d+\.\d{3} \(after T = [\d.]+: ECE \d+\.\d\d\)", out)
    evaluated = record_path.with_name(f"{record_path.stem}.OxfordPets-new.predictions.npz")
    assert f"predictions: {evaluated}" in out
    with np.load(evaluated) as saved:  # the new classes again, as the record's own file holds them
        assert np.array_equal(saved["new_logits"], saved_predictions(record_path)["new_logits"])
    assert main(["report", str(results), "--metrics", "new", "ECE new", "ECE (T) new", "--format", "md", "csv"]) == 0
    table = capsys.readouterr().out
    ece = read_record(record_path)["metrics"]["calibration"]["new"]["ece"]
    assert "| ECE new | ECE (T) new |" in table and f"| {ece:.2f} |" in table
    assert main(["report", str(results), "--verify"]) == 0
    data = bytearray(predictions.read_bytes())
    data[-100] ^= 1
    predictions.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["report", str(results), "--verify"]) == 1
    assert f"verify: {record_path}: its predictions {predictions} fail their checksum" in capsys.readouterr().out
