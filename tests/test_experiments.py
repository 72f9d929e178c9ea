"""Experiment modules and paper tables end to end on the tiny model (outputs written, rows as the paper names them)."""


import re

import pytest

from atlas_fast.report.formats import latex_table, markdown_table
from atlas_fast.report.rows import aggregate, variant_name
from atlas_fast.experiments import table3_base_to_new, table_ablation, table_cross_dataset
from atlas_fast.experiments.common import run_experiment
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
    table = run_experiment(table3_base_to_new, _args(tmp_path, data_root) + ["--zero-shot", *TEXT_METHODS])
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    variants = ["| + ATLaS", "| + ATLaS-CSL", "| + ATLaS-ISL"]
    assert [line.split(" | ")[0] for line in lines[1:]] == [
        "| CLIP (zero-shot)", "| CoOp", *variants, "| CoCoOp", *variants, "| DePT", *variants]
    # each block's changes are measured against its own baseline row
    h = {i: float(line.split(" | ")[-2].split()[0]) for i, line in enumerate(lines[1:])}
    assert f"({h[6] - h[5]:+.2f})" in lines[7] and f"({h[10] - h[9]:+.2f})" in lines[11]
    # and paired by seed (2 seeds here): the mean per-seed difference with its 95 % interval, none for a baseline
    assert lines[0].endswith("| ΔH (95 % CI) |") and lines[2].endswith("|  |")
    assert lines[7].split(" | ")[-1].count("[") == 1 and "over 2 seeds with a 95 % t interval" in table
    assert (tmp_path / "out" / "table3_base_to_new.csv").read_text().startswith("group,method,variant,seeds")
    for suffix in ("md", "tex", "png", "pdf"):
        assert (tmp_path / "out" / f"table3_base_to_new.{suffix}").stat().st_size > 0
    tex = (tmp_path / "out" / "table3_base_to_new.tex").read_text()
    assert tex.count(r"\midrule") == 4 and r"\label{tab:table3-base-to-new}" in tex
    records = list((tmp_path / "results" / "OxfordPets").glob("*.json"))
    assert len(records) == 26  # (3 methods x 4 variants + zero-shot) x 2 seeds
    # `atlas-fast report` on the same folder finds the same rows and numbers in the pipeline's records
    from atlas_fast.report.collect import report_folder

    report = report_folder(tmp_path / "results", out=tmp_path / "report")
    report_lines = [line for line in report.splitlines() if line.startswith("| OxfordPets | ")]
    assert [line.split(" | ", 2)[2] for line in report_lines] == [line.split(" | ", 1)[1] for line in lines[1:]]
    # a second call reuses every finished run
    before = {p: p.stat().st_mtime_ns for p in records}
    run_experiment(table3_base_to_new, _args(tmp_path, data_root) + ["--zero-shot", *TEXT_METHODS])
    assert {p: p.stat().st_mtime_ns for p in records} == before


def _at_the_recipe(record, **soft):
    """The record as if its run had followed its method's recipe and the paper's presets (views = epochs, 16 shots,
    ViT-B/16), with the soft-label values ``soft`` changed."""
    import dataclasses

    from atlas_fast.methods import METHODS

    c = record["config"]
    _, recipe = METHODS[c["method"]].recipe_function(c["recipe_family"], c["setting"], c["shots"], c["dataset"])
    config = {**c, "recipe": dataclasses.asdict(recipe), "views": recipe.epochs,
              "backbone": {**c["backbone"], "model": "ViT-B-16"}}
    if soft:
        config["soft_labels"] = {**c["soft_labels"], **soft}
    return {**record, "config": config}


def test_experiment_tables_mark_what_their_runs_change_from_the_recipe(tmp_path):
    """Table III of runs shortened to 2 epochs on the tiny backbone says so after its title (Markdown, LaTeX caption)
    and in every CSV line, in the words of ``atlas-fast report``; a row whose runs change more (θ) is marked after its
    name; runs at the recipe and the paper's presets are not marked at all."""
    import csv

    from atlas_fast.experiments.common import build_parser
    from atlas_fast.sweep import run_configs

    data_root = tmp_path / "data"
    make_oxford_pets(data_root, n_classes=4, n_train=4, n_val=2, n_test=3, size=32)
    argv = ["--data-root", str(data_root), "--datasets", "OxfordPets", "--model", "atlas-tiny", "--pretrained", "none",
            "--seeds", "1", "--epochs", "2", "--cache-root", str(tmp_path / "cache"), "--results-dir",
            str(tmp_path / "results"), "--out", str(tmp_path / "out"), "--methods", "coop"]
    table = run_experiment(table3_base_to_new, argv)
    out = tmp_path / "out"

    def outputs():
        tex = (out / "table3_base_to_new.tex").read_text()
        caption = next(line for line in tex.splitlines() if r"\caption" in line)
        with open(out / "table3_base_to_new.csv", newline="") as f:
            variants = [line["variant"] for line in csv.DictReader(f)]
        return (out / "table3_base_to_new.md").read_text(), tex, caption, variants

    shortened = " [epochs=2, backbone=atlas-tiny]"
    markdown, tex, caption, variants = outputs()
    assert markdown == table + "\n"
    assert markdown.startswith(f"**Base-to-new with ATLaS (mean over 1 dataset, 1 seed){shortened}**")
    assert ("[...] after the title: what every run of the table changes from its method's recipe or the paper's "
            "presets.") in markdown
    assert caption.strip().startswith(r"\caption{Base-to-new with ATLaS (mean over 1 dataset, 1 seed). Mean over 1 seed")
    assert f";{shortened}: what every run of the table changes from its method's recipe" in caption
    assert "t interval" not in caption and "on the one seed there is: no interval" in caption  # one seed, no CI
    assert variants == [f"{name}{shortened}" for name in ("CoOp", "+ ATLaS", "+ ATLaS-CSL", "+ ATLaS-ISL")]

    args = build_parser(table3_base_to_new).parse_args(argv)
    records = run_configs(table3_base_to_new.plan(args), progress=False)  # finished: read back, in plan order
    assert all(r.get("skipped") for r in records)
    at_recipe = [_at_the_recipe(r) for r in records]
    markdown = table3_base_to_new.report(args, at_recipe)
    _, tex, caption, variants = outputs()
    assert "[" not in markdown.splitlines()[0] and "recipe or the paper's presets" not in markdown
    assert "[" not in caption and "recipe or the paper's presets" not in tex
    assert variants == ["CoOp", "+ ATLaS", "+ ATLaS-CSL", "+ ATLaS-ISL"]

    theta = [_at_the_recipe(r, theta=0.3) if r["config"]["soft_labels"] and r["config"]["soft_labels"]["kind"] == "isl"
             else r for r in at_recipe]
    markdown = table3_base_to_new.report(args, theta)
    _, tex, caption, variants = outputs()
    assert "| + ATLaS-ISL [θ=0.3] | " in markdown and "| + ATLaS-CSL | " in markdown
    assert "[...] after a row's name: what its runs change from the method's recipe or the paper's presets" in markdown
    assert r"+ ATLaS-ISL [$\theta$=0.3] &" in tex and "after a row's name" in caption
    assert variants[-1] == "+ ATLaS-ISL [θ=0.3]" and variants[:3] == ["CoOp", "+ ATLaS", "+ ATLaS-CSL"]


def test_ablation_rows_are_named_like_the_paper():
    assert [table_ablation.ablation_name(_config(v)) for v in table_ablation.variants()] == [
        "CoOp (baseline)", "+ vanilla LS", "+ vanilla LS + y", "+ ATLaS", "+ CSL", "+ CSL + y", "+ ATLaS-CSL",
        "+ ISL", "+ ISL + y", "+ ATLaS-ISL"]


def test_cross_dataset_module_has_a_block_per_method(tmp_path):
    data_root = tmp_path / "data"
    make_imagenet(data_root, n_classes=4, n_train=3, n_val=2, size=32)
    make_oxford_pets(data_root, n_classes=4, n_train=4, n_val=2, n_test=3, size=32)
    args = _args(tmp_path, data_root)
    args[args.index("OxfordPets")] = "ImageNet"
    table = run_experiment(table_cross_dataset, args + ["--seeds", "1", "--methods", "cocoop", "dept-coop", "--zero-shot",
                                             "--targets", "OxfordPets"])
    rows = [line.split(" | ")[0] for line in table.split("\n\n")[0].splitlines()[2:]]
    variants = ["| + ATLaS", "| + ATLaS-CSL", "| + ATLaS-ISL"]
    assert rows == ["| CLIP (zero-shot)", "| CoCoOp", *variants, "| DePT", *variants]
    # one seed: each variant's paired difference to its method's plain row, without an interval
    assert table.splitlines()[4].endswith(" (1 seed) |") and "on the one seed there is: no interval" in table


def test_ablation_runs_for_another_method(tmp_path):
    assert table_ablation.ablation_name({**_config(table_ablation.variants()[0]), "method": "dept-coop"}) == \
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
    assert coop.name == "CoOp" and isl.name == "+ ATLaS-ISL" == variant_name(records[3]["config"])
    assert coop.metrics["base"] == pytest.approx((85 + 50) / 2)
    assert coop.metrics["new"] == pytest.approx((65 + 50) / 2)
    b, n = coop.metrics["base"], coop.metrics["new"]
    assert coop.metrics["H"] == pytest.approx(2 * b * n / (b + n))
    assert coop.spread["base"] == pytest.approx((5 + 0) / 2)  # population std over seeds, averaged over datasets
    table = markdown_table([coop, isl])
    h_isl = isl.metrics["H"] - coop.metrics["H"]
    assert f"({h_isl:+.2f})" in table
    assert r"\begin{tabular}" in latex_table([coop, isl])


def test_table3_has_ivlp_and_maple_blocks_and_the_appendix_a_promptsrc_block(tmp_path):
    """The multi-modal methods are blocks of Table III (on the pixel path); --method-option fits their depth to the
    tiny backbone's 2 blocks. The appendix's per-dataset tables add PromptSRC's block."""
    from atlas_fast.experiments import table_a_per_dataset

    data_root = tmp_path / "data"
    make_oxford_pets(data_root, n_classes=4, n_train=3, n_val=1, n_test=2, size=32)
    args = _args(tmp_path, data_root)
    args[args.index("--seeds") + 1:args.index("--seeds") + 3] = ["1"]
    options = ["--method-option", "maple:depth=2", "ivlp:depth_text=2", "ivlp:depth_vision=2",
               "promptsrc:depth_text=2", "promptsrc:depth_vision=2", "promptsrc:gpa_mean=2"]
    table = run_experiment(table3_base_to_new, args + ["--methods", "ivlp", "maple", *options])
    marked = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ")][1:]
    rows = [row.split(" [")[0] for row in marked]  # each block's own --method-option marks its rows
    variants = ["| + ATLaS", "| + ATLaS-CSL", "| + ATLaS-ISL"]
    assert rows == ["| IVLP", *variants, "| MaPLe", *variants]
    assert marked[0] == "| IVLP [depth_text=2, depth_vision=2]" and marked[4] == "| MaPLe [depth=2]"
    table = run_experiment(table_a_per_dataset, args + ["--methods", "maple", "promptsrc", *options])
    average = table.split("\n\n**OxfordPets")[0]  # the title goes on with what every run changes
    rows = [line.split(" | ")[0].split(" [")[0] for line in average.splitlines() if line.startswith("| ")][1:]
    assert rows == ["| MaPLe", *variants, "| PromptSRC", *variants]


# --- every paper item has a module; each new module runs on the embedded world in a small configuration ---------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    root = tmp_path_factory.mktemp("world")
    generate_benchmark(root / "data", ["WorldSketches"], sizes=SplitSizes(train=3, val=1, test=2), progress=False)
    return root


def _world_args(world, tmp_path, *extra):
    return ["--data-root", str(world / "data"), "--datasets", "WorldSketches", "--model", "atlas-world",
            "--pretrained", "atlas-world", "--seeds", "1", "--epochs", "2", "--views", "1",
            "--cache-root", str(world / "cache"), "--results-dir", str(tmp_path / "results"),
            "--out", str(tmp_path / "out"), *extra]


def test_experiment_list_names_a_module_for_every_table_and_figure(capsys):
    from atlas_fast.cli import main
    from atlas_fast.experiments import experiment_table

    assert main(["experiment", "--list"]) == 0
    listing = capsys.readouterr().out
    papers = " ".join(paper for _, paper, _ in experiment_table())
    for item in ("Table I", "Table III", "Table IV", "Table V", "Tables I and II", "Fig. 1", "Fig. 3", "Fig. 4",
                 "Fig. 5", "Fig. 6", "Appendix Tables A1-A3"):
        assert item in papers
    for name, _, _ in experiment_table():
        assert name in listing


def test_unknown_experiment_is_refused_with_the_valid_names(capsys):
    from atlas_fast.cli import main

    assert main(["experiment", "table9"]) == 2
    assert re.search(r"^error: Unknown experiment 'table9'; valid: .*table3_base_to_new", capsys.readouterr().err, re.M)


def test_dry_run_lists_the_runs_and_counts_finished_ones(world, tmp_path, capsys):
    from atlas_fast.cli import main

    args = _world_args(world, tmp_path, "--seeds", "1", "2", "--methods", "coop")
    main(["experiment", "table3_base_to_new", "--dry-run", *args])
    listing = capsys.readouterr().out
    assert "8 runs: 0 finished, 8 to run in 2 group(s) (R = 4, 4), of up to 4 run(s) each" in listing
    assert not (tmp_path / "results").exists()  # nothing trained
    main(["experiment", "table3_base_to_new", *args, "--seeds", "1"])
    main(["experiment", "table3_base_to_new", "--dry-run", *args])
    assert "8 runs: 4 finished, 4 to run" in capsys.readouterr().out.splitlines()[-1]


def test_fig1_and_new_class_curves_plot_per_epoch_new_accuracy(world, tmp_path):
    from atlas_fast.experiments import fig1_label_smoothing, fig5_new_class_curves

    table = run_experiment(fig1_label_smoothing, _world_args(world, tmp_path))
    assert [line.split(" | ")[0] for line in table.splitlines()[2:] if line.startswith("| ")] == [
        "| CoOp", "| + LS", "| + TF-KD", "| + OLS", "| + ATLaS"]
    assert (tmp_path / "out" / "fig1_label_smoothing.png").stat().st_size > 0
    table = run_experiment(fig5_new_class_curves, _world_args(world, tmp_path))
    assert [line.split(" | ")[0] for line in table.splitlines()[2:] if line.startswith("| ")] == [
        "| CoOp", "| + LS", "| + ATLaS", "| + CSL", "| + ATLaS-CSL", "| + ISL", "| + ATLaS-ISL"]
    assert (tmp_path / "out" / "fig5_new_class_curves.png").stat().st_size > 0
    records = list((tmp_path / "results" / "WorldSketches").glob("*.json"))
    assert len(records) == 5 + 7 - 3  # CoOp, + LS and + ATLaS are the same runs in both figures


def test_case_study_draws_csl_and_isl_rows(world, tmp_path):
    from atlas_fast.experiments import fig3_soft_label_case_study

    table = run_experiment(fig3_soft_label_case_study, _world_args(world, tmp_path, "--images", "2", "--top-k", "3"))
    rows = [line for line in table.splitlines()[2:]]
    assert [row.split(" | ")[1] for row in rows] == ["CSL", "ISL", "CSL", "ISL"]
    csl = [row.split(" | ", 2)[2] for row in rows if " | CSL | " in row]
    assert csl[0] == csl[1]  # class-wise: the same row for two images of one class
    assert (tmp_path / "out" / "fig3_soft_label_case_study.png").stat().st_size > 0


def test_an_experiment_that_trains_nothing_says_so_when_estimated(world, tmp_path):
    """``fig3_soft_label_case_study --estimate`` plans no runs: it says that it trains nothing (it was the pricing's
    internal 'estimate_configs: no runs to price (an empty list of configs)')."""
    from atlas_fast.experiments import fig3_soft_label_case_study

    text = run_experiment(fig3_soft_label_case_study, _world_args(world, tmp_path, "--estimate"))
    assert "fig3_soft_label_case_study trains nothing" in text and "estimate_configs" not in text
    assert not (tmp_path / "out" / "fig3_soft_label_case_study.png").exists()  # nor drew anything


def test_cost_table_measures_training_and_soft_label_time(world, tmp_path):
    from atlas_fast.experiments import table5_cost

    table = run_experiment(table5_cost, _world_args(world, tmp_path))
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r[0] for r in rows] == ["| CoOp", "| + ATLaS", "| + ATLaS-CSL", "| + ATLaS-ISL"]
    assert all(float(r[1]) > 0 and float(r[4]) > 0 for r in rows)  # train s/run, infer ms/image
    assert float(rows[0][2]) == 0.0 and float(rows[2][2]) > 0  # CoOp has no soft labels; CSL costs time


def test_per_dataset_tables_follow_the_average(world, tmp_path):
    from atlas_fast.experiments import table_a_per_dataset

    text = run_experiment(table_a_per_dataset, _world_args(world, tmp_path, "--methods", "coop", "cocoop"))
    assert text.index("**Average over 1 dataset") < text.index("**WorldSketches")
    assert (tmp_path / "out" / "table_a_per_dataset.tex").stat().st_size > 0


def test_experiments_run_as_a_module_of_the_package_from_any_folder(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import atlas_fast

    env = {**os.environ, "PYTHONPATH": str(Path(atlas_fast.__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-m", "atlas_fast.experiments", "--list"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "table3_base_to_new" in result.stdout and "Table V" in result.stdout


# Small configurations of every module for --world (the benchmark is generated once, at 3/1/2 images per class).
WORLD_MODULE_ARGS = {
    "beyond_base_to_new": ["--methods", "tcp", "kdpl-coop", "--kinds", "isl", "--datasets", "WorldSketches"],
    "beyond_few_shot": ["--methods", "clip-lora-text", "--shots", "1", "--kinds", "isl", "--datasets", "WorldSketches"],
    "fig1_label_smoothing": [],
    "fig3_soft_label_case_study": ["--images", "2", "--top-k", "3"],
    "fig5_new_class_curves": [],
    "fig_few_shot": ["--shots", "1", "2"],
    "fig_sensitivity": ["--param", "K", "--values", "2", "3"],
    "table3_base_to_new": ["--methods", "coop", "maple", "--zero-shot"],
    "table5_cost": [],
    "table_a_per_dataset": ["--methods", "coop", "--datasets", "WorldPhotos", "WorldSymbols"],
    "table_ablation": [],
    "table_calibration": ["--methods", "coop", "--every-epoch", "ls", "--kinds", "isl", "--datasets", "WorldSketches"],
    "table_cross_dataset": ["--methods", "coop", "--zero-shot"],
    "theorem1_kappa": ["--datasets", "WorldSketches", "--snapshot-fractions", "0.5", "--kinds", "csl", "isl"],
    "views_study": ["--view-counts", "1", "0"],
}


def test_every_experiment_module_has_a_small_world_configuration():
    from atlas_fast.experiments import experiment_names

    assert sorted(WORLD_MODULE_ARGS) == experiment_names()


@pytest.fixture(scope="module")
def world_flag_root(tmp_path_factory):
    return tmp_path_factory.mktemp("world_flag")


@pytest.mark.parametrize("name", sorted(WORLD_MODULE_ARGS))
def test_every_experiment_module_runs_on_the_world(name, world_flag_root, tmp_path):
    """``--world`` swaps in the world's datasets for the paper's (WorldPhotos for ImageNet, the cross-dataset and
    domain-generalisation targets for Tables I-II's) and the shipped atlas-world CLIP; each module runs end to end."""
    from atlas_fast.experiments import load_experiment

    args = ["--world", "--world-images", "3", "1", "2", "--data-root", str(world_flag_root / "data"),
            "--seeds", "1", "--epochs", "2", "--views", "1", "--cache-root", str(world_flag_root / "cache"),
            "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "out"), *WORLD_MODULE_ARGS[name]]
    if name in ("table_a_per_dataset", "fig_sensitivity", "fig1_label_smoothing", "fig_few_shot", "table_ablation",
                "views_study", "table3_base_to_new") and "--datasets" not in args:
        args += ["--datasets", "WorldSketches"]  # one of the six base-to-new datasets is enough here
    text = run_experiment(load_experiment(name), args)
    assert text.strip() and "nan" not in text.lower()
    if name == "table_cross_dataset":
        header = text.splitlines()[0]
        for target in ("WorldSymbols", "WorldTiles", "WorldSketches", "WorldDark", "WorldCartoons"):
            assert target in header
    records = [p for p in (tmp_path / "results").rglob("*.json")]
    if name == "fig3_soft_label_case_study":  # draws soft-label rows, trains nothing
        assert "| CSL |" in text and "| ISL |" in text and not records
    else:
        assert records and all("atlas-world" in p.read_text() for p in records)
        # every table says that its runs are shortened to 2 epochs (after its title or its rows' names) and explains
        assert "epochs=2" in text and "recipe or the paper's presets" in text
    if name in ("fig_sensitivity", "views_study"):  # what the table sweeps (K, V) is its first column, not a mark
        assert ("K=" if name == "fig_sensitivity" else "views=") not in text
