"""Printed names say what a run is: the method of every report row, what a run changes from its recipe and the
paper's presets (θ, K, epochs, shots, views, backbone...) in run lines, dry runs, ``train``'s summary and the report,
``train``'s summary as a valid Markdown table with ±, and API records printed without float32 noise."""

import json
import re

import numpy as np
import pytest

from helpers import small_pets, tiny_pets_config

from atlas_fast.atlas.variants import label_variant
from atlas_fast.engine.deviations import deviation_note, run_deviations, runs_deviations, table_marks


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    return small_pets(tmp_path_factory, "names")


def isl_config(root, method, **changes):
    variant = label_variant("base2new", "isl", **changes.pop("soft", {}))
    options = {"depth": 2} if method == "maple" else None  # MaPLe's 9 prompt layers exceed the tiny towers
    return tiny_pets_config(root, method=method, method_options=options, soft_labels=variant.soft_labels,
                            schedule=variant.schedule, **changes)


@pytest.fixture(scope="module")
def mixed_sweep(pets):
    """KgCoOp + ATLaS-ISL and MaPLe + ATLaS-ISL, no plain-method run: the sweep whose report lost the method."""
    from atlas_fast.sweep import run_configs

    records = run_configs([isl_config(pets, "kgcoop"), isl_config(pets, "maple")], progress=False)
    return pets, records


def _table_rows(markdown):
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in markdown.splitlines()
            if line.startswith("|") and not line.startswith("|---")]


def test_a_mixed_method_sweep_without_plain_rows_names_each_rows_method(mixed_sweep, tmp_path):
    from atlas_fast.report.collect import report_folder

    root, _ = mixed_sweep
    markdown = report_folder(root / "results", out=tmp_path / "report", formats=["md", "tex", "csv"])
    names = [row[1] for row in _table_rows(markdown)[1:]]
    assert len(names) == 2
    assert sorted(name.split(" [")[0] for name in names) == ["KgCoOp + ATLaS-ISL", "MaPLe + ATLaS-ISL"]
    assert "MaPLe + ATLaS-ISL [depth=2]" in names  # its --method-option, which changes MaPLe's recipe
    tex = (tmp_path / "report" / "report.tex").read_text()
    assert "KgCoOp + ATLaS-ISL" in tex and "MaPLe + ATLaS-ISL" in tex
    assert not re.search(r"^\s*\+ ATLaS", tex, re.M)  # no row begins without its method
    assert "what every run of the table changes from its method's recipe" in markdown


def test_report_rows_mark_what_differs_from_the_recipe_and_presets(mixed_sweep, tmp_path):
    from atlas_fast.report.collect import report_folder

    root, _ = mixed_sweep
    markdown = report_folder(root / "results", out=tmp_path / "report", formats=["md", "tex", "csv"])
    names = [row[1] for row in _table_rows(markdown)[1:]]
    kgcoop = next(name for name in names if name.startswith("KgCoOp"))
    assert "MaPLe + ATLaS-ISL [depth=2]" in names  # its own --method-option, beside the marks every row shares
    # the tiny runs are shortened to 2 epochs, 1 view, batch 3, lr 0.05, 4 shots, on the tiny backbone; θ and K are
    # the paper's, so they are not marked. Every row shares those marks: they are said once, under the table and in
    # the LaTeX caption, not on each row (MaPLe's row keeps its own depth)
    shared = "[epochs=2, batch=3, lr=0.05, shots=4, views=1, backbone=atlas-tiny]"
    assert kgcoop == "KgCoOp + ATLaS-ISL"
    assert f"; {shared}: what every run of the table changes from its method's recipe" in markdown
    caption = next(line for line in (tmp_path / "report" / "report.tex").read_text().splitlines() if "caption" in line)
    assert f"; {shared}: what every run of the table changes" in caption
    body = (tmp_path / "report" / "report.tex").read_text().split(r"\midrule", 1)[1]
    assert "epochs=2" not in body
    csv = (tmp_path / "report" / "report.csv").read_text()
    assert f"KgCoOp + ATLaS-ISL {shared}" in csv  # a CSV line stands alone: every mark in full


def test_deviations_compare_with_the_methods_recipe_and_the_papers_presets(mixed_sweep):
    _, records = mixed_sweep
    config = json.loads(json.dumps(records[0]["config"]))
    recipe = {"epochs": 100, "batch_size": 128, "lr": 0.002}  # KgCoOp's base-to-new recipe ...
    full = {**config, "recipe": {**config["recipe"], **recipe}, "views": 100, "shots": 16,
            "backbone": {**config["backbone"], "model": "ViT-B-16"}}  # ... with the paper's shots and backbone
    assert run_deviations(full) == {}
    shortened = {**full, "recipe": {**full["recipe"], "epochs": 10}, "views": 10}
    assert run_deviations(shortened) == {"recipe.epochs": "epochs=10"}
    other = {**full, "soft_labels": {**full["soft_labels"], "theta": 0.3, "alpha": 0.5},
             "schedule": {"name": "atlas", "period": 1}}
    assert deviation_note(other) == " [θ=0.3, α=0.5, K=1]"
    assert deviation_note(other, leave_out={"soft_labels.alpha"}) == " [θ=0.3, K=1]"


def test_a_tables_marks_say_once_what_every_row_changes_and_the_rest_per_row(mixed_sweep):
    """The experiment tables' marks: a row's runs' deviations (each once, a field whose runs differ with each value),
    what every row shares on the table, the rest on the row; nothing shared or nothing at all: nothing on the table."""
    _, records = mixed_sweep
    config = json.loads(json.dumps(records[0]["config"]))
    full = {**config, "recipe": {**config["recipe"], "epochs": 100, "batch_size": 128, "lr": 0.002}, "views": 100,
            "shots": 16, "backbone": {**config["backbone"], "model": "ViT-B-16"}}  # KgCoOp's recipe, the paper's rest
    short = {**full, "recipe": {**full["recipe"], "epochs": 10}, "views": 10}
    theta = {**short, "soft_labels": {**short["soft_labels"], "theta": 0.3}}
    assert runs_deviations([full, full]) == ()
    assert runs_deviations([full, short, theta]) == (("recipe.epochs", "epochs=10"), ("soft_labels.theta", "θ=0.3"))
    assert runs_deviations([theta, {**short, "recipe": {**short["recipe"], "epochs": 5}, "views": 5}],
                           leave_out={"soft_labels.theta"}) == (("recipe.epochs", "epochs=10"),
                                                                ("recipe.epochs", "epochs=5"))
    rows = [runs_deviations([short]), runs_deviations([theta])]
    assert table_marks(rows) == (" [epochs=10]", ["", " [θ=0.3]"])
    assert table_marks([runs_deviations([full]), *rows]) == ("", ["", " [epochs=10]", " [θ=0.3, epochs=10]"])
    assert table_marks([()]) == ("", [""]) and table_marks([]) == ("", [])


def test_theta_is_in_run_lines_dry_run_lines_and_the_train_summary(mixed_sweep):
    from atlas_fast.engine import plan_run
    from atlas_fast.report.formats import train_results
    from atlas_fast.sweep import describe_plan, run_configs
    from atlas_fast.sweep.grid import plan_sweep

    root, _ = mixed_sweep
    configs = [isl_config(root, "kgcoop", soft={"theta": theta}, epochs=3, results_dir=root / "theta")
               for theta in (0.1, 0.3)]  # results of their own: the report tests read the mixed sweep's folder
    names = [plan_run(config).name for config in configs]
    assert names[0] == "OxfordPets kgcoop+ATLaS-ISL (K=2) [epochs=3, batch=3, lr=0.05, shots=4, views=1, " \
                        "backbone=atlas-tiny] seed 1"
    assert names[1] == names[0].replace("[epochs", "[θ=0.3, epochs")
    dry = describe_plan(plan_sweep(configs), 4)
    assert "to run    OxfordPets kgcoop+ATLaS-ISL (K=2) [θ=0.3, epochs=3" in dry
    records = run_configs(configs[1:], progress=False)
    summary = train_results("OxfordPets", ["kgcoop"], [1], records)
    assert "OxfordPets kgcoop+ATLaS-ISL (K=2) [θ=0.3, epochs=3" in summary.splitlines()[0]
    assert "| OxfordPets | kgcoop+ATLaS-ISL (K=2) [θ=0.3, epochs=3" in summary


def test_train_summary_is_a_markdown_table_with_mean_and_std(mixed_sweep):
    from atlas_fast.report.formats import train_results

    _, records = mixed_sweep
    two_seeds = [records[0], {**records[0], "metrics": {**records[0]["metrics"], "base": 75.0, "new": 25.0}}]
    summary = train_results("OxfordPets", ["kgcoop"], [1, 2], two_seeds)
    lines = summary.splitlines()
    head = lines.index("| dataset | method | seeds | base | new | H |")
    assert lines[head - 1] == "" and lines[head + 1] == "|---|---|---|---:|---:|---:|"
    row = [cell.strip() for cell in lines[head + 2].strip("|").split("|")]
    base = [records[0]["metrics"]["base"], 75.0]
    new = [records[0]["metrics"]["new"], 25.0]
    assert row[2] == "1,2" and row[3] == f"{np.mean(base):.2f} ± {np.std(base):.2f}"
    assert row[4] == f"{np.mean(new):.2f} ± {np.std(new):.2f}"
    mean_base, mean_new = np.mean(base), np.mean(new)
    assert row[5] == f"{2 * mean_base * mean_new / (mean_base + mean_new):.2f}"  # H of the means, no ±
    assert "Mean ± population std over seeds" in lines[-1]


def test_api_records_print_without_float32_noise(pets):
    import atlas_fast
    from atlas_fast.engine.record import RunRecord, read_record

    record = atlas_fast.run(tiny_pets_config(pets, epochs=2))
    assert isinstance(record, RunRecord) and isinstance(record, dict)
    assert record["metrics"] == read_record(record["path"])["metrics"]  # the values are the stored ones
    noisy = float(np.float32(100 * 203 / 300))
    assert repr(noisy) == "67.66666412353516"
    printed = repr(RunRecord({**record, "metrics": {**record["metrics"], "base": noisy}}))
    assert "'base': 67.6667" in printed and "67.66666412353516" not in printed
    assert str(record) == repr(record)
    decimals = re.findall(r"\d+\.\d+", str(record))
    assert decimals and all(len(d.replace(".", "").lstrip("0")) <= 6 for d in decimals)  # 6 significant digits


def test_every_method_option_and_kdpl_s_teacher_show_in_the_name():
    """``--method tcp --method-option depth=2`` and KDPL with another teacher change the recipe: the name says so
    (they printed ``tcp [epochs=2, backbone=atlas-tiny]``); the R of a group is no option and stays out."""
    import dataclasses

    import atlas_fast.methods  # noqa: F401  (registers the methods)
    from atlas_fast.engine.deviations import run_name
    from atlas_fast.methods.registry import METHODS

    def described(method, **options):
        method_config, recipe = METHODS[method].recipe_function("paper", "base2new", 16, "OxfordPets")
        return {"method": method, "schedule": {"name": "onehot"}, "setting": "base2new", "shots": 16,
                "dataset": "OxfordPets", "recipe": {**dataclasses.asdict(recipe), "epochs": 2}, "views": 2,
                "method_config": {**dataclasses.asdict(method_config), "num_runs": 3, **options},
                "backbone": {"model": "atlas-tiny"}}

    assert run_name(described("tcp", depth=2)) == "tcp [epochs=2, backbone=atlas-tiny, depth=2]"
    assert run_name(described("kdpl-coop", teacher="ViT-B-32", teacher_pretrained="openai")) == (
        "kdpl-coop [epochs=2, backbone=atlas-tiny, teacher=ViT-B-32, teacher_pretrained=openai]")
    assert run_name(described("tcp")) == "tcp [epochs=2, backbone=atlas-tiny]"


def test_heading_and_plot_say_the_shots_the_runs_had_and_the_note_is_said_once(tmp_path_factory, capsys,
                                                                              monkeypatch):
    """Runs asked for 16 shots of classes that hold 4 training images: the command says so once (it said it once
    per run), and the report's heading and its plot's title give the 4 shots the runs had (the heading read '16
    shots'), the plot with what the table changes from the recipe (it carried no mark)."""
    from atlas_fast.engine import spec
    from atlas_fast.report import figures
    from atlas_fast.report.collect import report_folder
    from atlas_fast.sweep import run_configs

    monkeypatch.setattr(spec, "_SAID", set())  # a note is said once per process: start as a new command does
    root = small_pets(tmp_path_factory, "asked16")
    run_configs([tiny_pets_config(root, shots=16, seed=seed) for seed in (1, 2)], progress=False)
    err = capsys.readouterr().err
    assert err.count("fewer than 16 training images") == 1
    assert ("note: OxfordPets: every class has fewer than 16 training images; the run uses 4 per class (recorded in "
            "the record's data.shots_used).") in err  # it read 'some classes ...; the run uses 4..4 per class'
    titles = []
    drawn = figures.plot_rows
    monkeypatch.setattr(figures, "plot_rows", lambda rows, path, title=None, **kw: (
        titles.append(title), drawn(rows, path, title, **kw))[1])
    markdown = report_folder(root / "results", out=tmp_path_factory.mktemp("asked16_report"), formats=["md", "png"])
    heading = "Base-to-new generalisation, 4 shots per class (16 asked; no class held more)"
    assert f"## {heading}\n" in markdown
    assert titles == [f"{heading} [epochs=2, batch=3, lr=0.05, views=1, backbone=atlas-tiny]"]


def test_clip_lora_s_few_shot_order_shows_in_the_name_and_the_report_names_the_default():
    """``--fewshot-order clip-lora`` trains on other images: its name says so (both orders printed the same
    ``clip-lora-text [epochs=2, ...]``), and a report row of the default order reads ``fewshot_order=coop`` (it read
    ``fewshot_order=None``: the default is not stored)."""
    from atlas_fast.engine.deviations import run_name
    from atlas_fast.report.grouping import name_records

    def described(**changes):
        return {"method": "coop", "schedule": {"name": "onehot"}, "setting": "base2new", "shots": 16,
                "dataset": "OxfordPets", "recipe": {}, "seed": 1, "backbone": {"model": "ViT-B-16"}, **changes}

    assert run_name(described(fewshot_order="clip-lora")) == "coop [fewshot_order=clip-lora]"
    assert run_name(described()) == "coop"
    named = name_records([{"config": described(), "created": "1"},
                              {"config": described(fewshot_order="clip-lora"), "created": "2"},
                              # a legacy record names its evaluated sets: not part of its run, nor of its row
                              {"config": described(seed=2, evaluate=["base", "new"]), "created": "3"}])
    assert [r["name"] for r in named] == ["CoOp (fewshot_order=coop)", "CoOp (fewshot_order=coop)",
                                              "CoOp (fewshot_order=clip-lora)"]
