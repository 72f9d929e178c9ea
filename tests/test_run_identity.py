"""A run is one run whatever asked for it (issue 27): the evaluated class sets never split a run's identity. A
record evaluated on more sets answers a request for fewer; a missing set is evaluated on the saved prompts without
retraining; `train` and `experiment` share their runs; `report` lists a run once, legacy records included."""

import json
import shutil

import pytest

from atlas_fast.engine import pipeline, run, run_group
from atlas_fast.engine.record import ResultStore, read_record
from atlas_fast.engine.run_identity import one_record_per_run, record_identity
from atlas_fast.engine.spec import plan_run
from helpers import eight_class_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    return eight_class_pets(tmp_path_factory, "pets")


def config(root, results="results", **changes):
    return tiny_pets_config(root, results_dir=root / results, **changes)


def no_training(monkeypatch):
    def refuse(specs):
        raise AssertionError(f"{[s.stem for s in specs]} were trained again")

    monkeypatch.setattr(pipeline, "train_group", refuse)


def test_record_names_of_configs_without_evaluate_are_unchanged(pets):
    # The names these configs had before evaluation stopped naming runs (content hashes: independent of mtimes).
    default = plan_run(config(pets, content_hash=True))
    assert default.stem == "coop-onehot-base2new-4shot-seed1-ce8ec44a8ab7"
    assert default.record_key == "ce8ec44a8ab76ec70b520b733969687b"
    assert plan_run(config(pets, content_hash=True, setting="few_shot")).record_key == (
        "cc420ad33db6d8b0ac417334c1473b9b")
    assert "evaluate" not in default.described
    # asking for fewer sets is the same run; its old name is still looked up
    fewer = plan_run(config(pets, content_hash=True, evaluate=("base", "new")))
    assert fewer.stem == default.stem and list(fewer.data.splits) == ["base", "new"]
    assert ("coop-onehot-base2new-4shot-seed1-1d388900b442", "1d388900b4428bd2c373662fd6293624") in (
        fewer.legacy_stems())


def test_a_request_for_fewer_sets_finds_the_fuller_record(pets, monkeypatch):
    full = run(config(pets, "fuller"))
    no_training(monkeypatch)
    fewer = run(config(pets, "fuller", evaluate=("base", "new")))
    assert fewer["skipped"] and fewer["path"] == full["path"]
    assert fewer["metrics"] == full["metrics"] and "evaluated_later" not in fewer


def test_a_missing_set_is_evaluated_on_the_saved_prompts_without_retraining(pets, monkeypatch):
    reference = run(config(pets, "reference"))  # the run evaluated on every set when it trained
    fewer = run(config(pets, "later", evaluate=("base", "new")))
    assert set(fewer["metrics"]) == {"base", "new", "H", "calibration", "zero_shot"}
    learned = (pets / "later" / "OxfordPets" / f"{plan_run(config(pets, 'later')).stem}.pt").read_bytes()
    no_training(monkeypatch)
    completed = run(config(pets, "later"))
    assert completed["skipped"] and completed["path"] == fewer["path"]
    for name in ("base", "new", "all", "H"):
        assert completed["metrics"][name] == pytest.approx(reference["metrics"][name], abs=1e-9)
        assert completed["metrics"]["zero_shot"][name] == pytest.approx(reference["metrics"]["zero_shot"][name])
    assert completed["data"]["num_test"] == reference["data"]["num_test"]
    assert completed["evaluated_later"][0]["sets"] == ["all"]
    # written back through the store: valid, checksummed, the learned tensors untouched
    stem = plan_run(config(pets, "later")).stem
    on_disk = ResultStore(pets / "later").find("OxfordPets", stem, key=completed["key"])
    assert on_disk is not None and on_disk["metrics"] == completed["metrics"]
    assert (pets / "later" / "OxfordPets" / f"{stem}.pt").read_bytes() == learned
    assert sorted(p.name for p in (pets / "later" / "OxfordPets").iterdir()) == [f"{stem}.json", f"{stem}.pt"]


def test_the_same_run_asked_twice_in_one_group_trains_once(pets, monkeypatch):
    trained = []
    real = pipeline.train_group
    monkeypatch.setattr(pipeline, "train_group", lambda specs: trained.append(len(specs)) or real(specs))
    fewer, full = run_group([config(pets, "twice", evaluate=("base", "new")), config(pets, "twice")])
    assert trained == [1] and fewer["path"] == full["path"] and "all" in full["metrics"]


def _make_legacy(results, dataset_dir, stem, legacy_stem, legacy_key):
    """Rename a record to the name a run with evaluate=("base", "new") had before, as older versions wrote it."""
    record = read_record(dataset_dir / f"{stem}.json")
    fields = {k: v for k, v in record.items() if k not in ("status", "learned", "learned_blake2b")}
    fields["key"] = legacy_key
    fields["config"] = {**record["config"], "evaluate": ["base", "new"]}
    import torch

    tensors = torch.load(dataset_dir / f"{stem}.pt", weights_only=True)
    ResultStore(results).save("OxfordPets", legacy_stem, fields, tensors)
    (dataset_dir / f"{stem}.json").unlink()
    (dataset_dir / f"{stem}.pt").unlink()


def test_a_legacy_record_is_taken_over_and_the_report_lists_the_run_once(pets, monkeypatch, capsys):
    from atlas_fast.report.grouping import name_records
    from atlas_fast.report.results_folder import collect_records

    results = pets / "legacy"
    spec = plan_run(config(pets, "legacy", evaluate=("base", "new")))
    run(config(pets, "legacy", evaluate=("base", "new")))
    legacy_key = _legacy_hash(spec, ["base", "new"])  # the name this run had with evaluate=("base", "new")
    legacy_stem = next(s for s, k in spec.legacy_stems() if k == legacy_key)
    _make_legacy(results, results / "OxfordPets", spec.stem, legacy_stem, legacy_key)
    assert [r["path"].rsplit("/", 1)[-1] for r in collect_records(results)] == [f"{legacy_stem}.json"]

    no_training(monkeypatch)
    taken = run(config(pets, "legacy"))  # the default run: its legacy record lacks "all"
    assert taken["skipped"] and taken["path"].endswith(f"{spec.stem}.json")
    assert taken["adopted_from"] == f"{legacy_stem}.json" and "all" in taken["metrics"]
    assert "evaluate" not in taken["config"] and record_identity(taken) == taken["key"] == spec.record_key

    # both files are there; the report shows the run once, with no "evaluate=" in its name
    records = collect_records(results)
    assert len(list((results / "OxfordPets").glob("*.json"))) == 2 and len(records) == 1
    assert "all" in records[0]["metrics"]
    # (the tiny run's own changes from CoOp's recipe are marked, tests/test_report_names.py)
    assert [r["name"] for r in name_records(records)] == [
        "CoOp [epochs=2, batch=3, lr=0.05, shots=4, views=1, backbone=atlas-tiny]"]
    assert "two records" not in capsys.readouterr().err


def _legacy_hash(spec, sets):
    from atlas_fast.engine.run_identity import config_key, data_record_key

    return data_record_key(config_key({**spec.described, "evaluate": sets}, spec.backbone_fingerprint),
                           spec.data.fingerprint)


def test_one_record_per_run_keeps_the_fullest_then_the_newest():
    def record(created, sets, fingerprint="d", **config):
        metrics = {name: 50.0 for name in sets}
        return {"config": {"method": "coop", **config}, "backbone": {"fingerprint": "b"},
                "data": {"fingerprint": fingerprint}, "metrics": metrics, "created": created}

    legacy = record("2026-01-02", ["base", "new"], evaluate=["base", "new"])
    full = record("2026-01-01", ["base", "new", "all"])
    newer = record("2026-01-03", ["base", "new", "all"])
    other_data = record("2026-01-01", ["base", "new"], fingerprint="e")
    assert one_record_per_run([legacy, full, other_data]) == [full, other_data]
    assert one_record_per_run([full, newer, legacy]) == [newer]


def test_train_and_experiment_share_their_runs(pets, tmp_path, monkeypatch, capsys):
    """`train` evaluates base, new and all; `experiment fig_sensitivity` asks for base and new of the same runs."""
    from atlas_fast.cli import main
    from atlas_fast.atlas.variants import alternation_period

    data = pets / "data"
    common = ["--data-root", str(data), "--model", "atlas-tiny", "--pretrained", "none", "--epochs", "2",
              "--views", "2", "--cache-root", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results"),
              "--no-progress"]
    assert main(["train", "--dataset", "OxfordPets", "--atlas", "isl", "--seeds", "1", *common]) == 0
    records = sorted((tmp_path / "results" / "OxfordPets").glob("*.json"))
    assert len(records) == 1 and "all" in json.loads(records[0].read_text())["metrics"]
    before = records[0].stat().st_mtime_ns
    capsys.readouterr()
    experiment = ["experiment", "fig_sensitivity", "--param", "K", "--values", str(alternation_period("base2new")),
                  "--datasets", "OxfordPets", "--seeds", "1", "--out", str(tmp_path / "out"), *common]
    assert main([*experiment, "--dry-run"]) == 0
    assert "1 runs: 1 finished, 0 to run" in capsys.readouterr().out
    no_training(monkeypatch)
    assert main(experiment) == 0
    assert sorted((tmp_path / "results" / "OxfordPets").glob("*.json")) == records
    assert records[0].stat().st_mtime_ns == before  # it holds more than the experiment asked for: untouched
    shutil.rmtree(tmp_path / "out")
