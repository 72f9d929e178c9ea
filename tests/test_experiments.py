"""Experiment modules and paper tables end to end on the tiny model (outputs written, rows as the paper names them)."""


import pytest

from atlas_fast.report import aggregate, latex_table, markdown_table, variant_label
from experiments import table3_base_to_new, table_ablation, table_cross_dataset, table_promptsrc
from layouts import make_imagenet, make_oxford_pets


pytestmark = pytest.mark.usefixtures("one_thread")
TEXT_METHODS = ["--methods", "coop", "cocoop", "dept-coop"]  # the default adds IVLP and MaPLe (test below)


def _args(tmp_path, data_root):
    return ["--data-root", str(data_root), "--datasets", "OxfordPets", "--model", "atlas-tiny", "--pretrained",
            "none", "--seeds", "1", "2", "--epochs", "2", "--views", "2", "--cache-root", str(tmp_path / "cache"),
            "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "out")]


def test_table3_module_writes_markdown_latex_and_plot(tmp_path):
    data_root = tmp_path / "data"
    make_oxford_pets(data_root, n_classes=4, n_train=4, n_val=2, n_test=3, size=32)
    table = table3_base_to_new.main(_args(tmp_path, data_root) + ["--zero-shot", *TEXT_METHODS])
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    variants = ["| + ATLaS", "| + ATLaS-CSL", "| + ATLaS-ISL"]
    assert [line.split(" | ")[0] for line in lines[1:]] == [
        "| CLIP (zero-shot)", "| CoOp", *variants, "| CoCoOp", *variants, "| DePT", *variants]
    # each block's changes are measured against its own baseline row
    h = {i: float(line.split(" | ")[-1].split()[0]) for i, line in enumerate(lines[1:])}
    assert f"({h[6] - h[5]:+.2f})" in lines[7] and f"({h[10] - h[9]:+.2f})" in lines[11]
    for suffix in ("md", "tex", "png"):
        assert (tmp_path / "out" / f"table3_base_to_new.{suffix}").stat().st_size > 0
    assert (tmp_path / "out" / "table3_base_to_new.tex").read_text().count(r"\midrule") == 4
    records = list((tmp_path / "results" / "OxfordPets").glob("*.json"))
    assert len(records) == 26  # (3 methods x 4 variants + zero-shot) x 2 seeds
    # a second call reuses every finished run
    before = {p: p.stat().st_mtime_ns for p in records}
    table3_base_to_new.main(_args(tmp_path, data_root) + ["--zero-shot", *TEXT_METHODS])
    assert {p: p.stat().st_mtime_ns for p in records} == before


def test_ablation_rows_are_named_like_the_paper():
    assert [table_ablation.ablation_label(_config(v)) for v in table_ablation.variants()] == [
        "CoOp (baseline)", "+ vanilla LS", "+ vanilla LS + y", "+ ATLaS", "+ CSL", "+ CSL + y", "+ ATLaS-CSL",
        "+ ISL", "+ ISL + y", "+ ATLaS-ISL"]


def test_cross_dataset_module_has_a_block_per_method(tmp_path):
    data_root = tmp_path / "data"
    make_imagenet(data_root, n_classes=4, n_train=3, n_val=2, size=32)
    make_oxford_pets(data_root, n_classes=4, n_train=4, n_val=2, n_test=3, size=32)
    args = _args(tmp_path, data_root)
    args[args.index("OxfordPets")] = "ImageNet"
    table = table_cross_dataset.main(args + ["--seeds", "1", "--methods", "cocoop", "dept-coop", "--zero-shot",
                                             "--targets", "OxfordPets"])
    rows = [line.split(" | ")[0] for line in table.splitlines()[2:]]
    variants = ["| + ATLaS", "| + ATLaS-CSL", "| + ATLaS-ISL"]
    assert rows == ["| CLIP (zero-shot)", "| CoCoOp", *variants, "| DePT", *variants]


def test_every_registered_method_has_a_printed_name():
    from atlas_fast.methods import RECIPES
    from atlas_fast.report import METHOD_NAMES

    assert set(METHOD_NAMES) == set(RECIPES)


def test_ablation_runs_for_another_method(tmp_path):
    assert table_ablation.ablation_label({**_config(table_ablation.variants()[0]), "method": "dept-coop"}) == \
        "DePT (baseline)"


def _config(variant):
    return {"method": "coop", "schedule": variant.schedule.describe(),
            "soft_labels": None if variant.soft_labels is None else {"kind": variant.soft_labels.kind}}


def test_aggregate_averages_seeds_then_datasets_and_takes_h_of_the_means():
    def record(dataset, seed, base, new, kind=None):
        schedule = {"name": "onehot"} if kind is None else {"name": "atlas", "period": 2}
        return {"config": {"method": "coop", "dataset": dataset, "seed": seed, "schedule": schedule,
                           "soft_labels": None if kind is None else {"kind": kind}},
                "metrics": {"base": base, "new": new}}

    records = [record("A", 1, 80, 60), record("A", 2, 90, 70), record("B", 1, 50, 50),
               record("A", 1, 82, 66, "isl"), record("B", 1, 52, 58, "isl")]
    coop, isl = aggregate(records)
    assert coop.label == "CoOp" and isl.label == "+ ATLaS-ISL" == variant_label(records[3]["config"])
    assert coop.metrics["base"] == pytest.approx((85 + 50) / 2)
    assert coop.metrics["new"] == pytest.approx((65 + 50) / 2)
    b, n = coop.metrics["base"], coop.metrics["new"]
    assert coop.metrics["H"] == pytest.approx(2 * b * n / (b + n))
    assert coop.spread["base"] == pytest.approx((5 + 0) / 2)  # population std over seeds, averaged over datasets
    table = markdown_table([coop, isl])
    h_isl = isl.metrics["H"] - coop.metrics["H"]
    assert f"({h_isl:+.2f})" in table
    assert r"\begin{tabular}" in latex_table([coop, isl])


def test_table3_has_ivlp_and_maple_blocks_and_the_promptsrc_appendix_runs(tmp_path):
    """The multi-modal methods are blocks of Table III (on the pixel path); --method-option fits their depth to the
    tiny backbone's 2 blocks. The PromptSRC appendix module prints a block per dataset and their average."""
    data_root = tmp_path / "data"
    make_oxford_pets(data_root, n_classes=4, n_train=3, n_val=1, n_test=2, size=32)
    args = _args(tmp_path, data_root)
    args[args.index("--seeds") + 1:args.index("--seeds") + 3] = ["1"]
    table = table3_base_to_new.main(args + ["--methods", "ivlp", "maple", "--method-option", "maple:depth=2",
                                            "ivlp:depth_text=2", "ivlp:depth_vision=2"])
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ")][1:]
    variants = ["| + ATLaS", "| + ATLaS-CSL", "| + ATLaS-ISL"]
    assert rows == ["| IVLP", *variants, "| MaPLe", *variants]
    table = table_promptsrc.main(args + ["--method-option", "depth_text=2", "depth_vision=2", "gpa_mean=2"])
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ")][1:]
    assert rows == [f"| {block}: {label}" for block in ("OxfordPets", "Average (1 datasets)")
                    for label in ("PromptSRC", "+ ATLaS", "+ ATLaS-CSL", "+ ATLaS-ISL")]
