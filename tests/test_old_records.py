"""Records on disk are users' data: a record written by an older atlas_fast (commit 23cca8b, the last before the
alias layer was removed; tests/records/23cca8b/, made by that commit's ``run(tiny_pets_config(...))`` on this
synthetic OxfordPets) is still read, validated, evaluated and reported by today's code. Its field names are today's
(the renames of that time changed Python names only: ``recipe_family`` is the family, ``recipe`` the optimisation
recipe), so the readers need no adapter; it lacks the fields added since (calibration, reliability, graphs)."""

import shutil
from pathlib import Path

import pytest

RECORDS = Path(__file__).resolve().parent / "records" / "23cca8b"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def old_results(tmp_path_factory):
    from layouts import make_oxford_pets

    root = tmp_path_factory.mktemp("old-records")
    make_oxford_pets(root / "data", n_classes=4, n_train=4, n_val=1, n_test=2, size=32)  # helpers.small_pets' data
    shutil.copytree(RECORDS, root / "results")
    return root


def test_a_record_of_23cca8b_is_valid_evaluable_and_reported(old_results):
    from atlas_fast.engine import evaluate_saved
    from atlas_fast.engine.validity import read_record, record_problems
    from atlas_fast.report.collect import report_folder
    from atlas_fast.report.results_folder import collect_records

    path = next((old_results / "results" / "OxfordPets").glob("*.json"))
    record = read_record(path)
    assert {"recipe_family", "recipe"} <= set(record["config"]) and isinstance(record["config"]["recipe"], dict)
    assert "calibration" not in record["metrics"]  # written before calibration was recorded
    assert record_problems(record) == []
    assert [r["key"] for r in collect_records(old_results / "results")] == [record["key"]]
    again = evaluate_saved(str(path), "OxfordPets", old_results / "data", subsample="new",
                           cache_root=old_results / "cache", device="cpu", progress=False)
    assert again["accuracy"] == pytest.approx(record["metrics"]["new"])
    report_folder(old_results / "results", out=old_results / "report")
    table = (old_results / "report" / "report.md").read_text()
    assert "| OxfordPets | CoOp | 50.00 | 50.00 | 50.00 |" in table


def test_today_s_records_use_the_field_names_of_23cca8b(tmp_path):
    """What a record holds under a name, it held under that name at 23cca8b: today's config fields are a superset of
    the old record's (a renamed record field would need an adapter in engine/validity.read_record)."""
    from atlas_fast.engine import run
    from atlas_fast.engine.validity import read_record
    from helpers import tiny_pets_config
    from layouts import make_oxford_pets

    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=4, n_val=1, n_test=2, size=32)
    today = read_record(run(tiny_pets_config(tmp_path, device="cpu"))["path"])
    old = read_record(next((RECORDS / "OxfordPets").glob("*.json")))
    assert set(old["config"]) <= set(today["config"])
    assert set(old) <= set(today)
    assert old["config"] == {k: v for k, v in today["config"].items() if k in old["config"]}
