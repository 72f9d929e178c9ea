"""``atlas-fast report``: finished records under a results folder -> grouped tables (mean ± population std over
seeds, H of the means), LaTeX for a paper, CSV and plots; damaged records are skipped with a warning naming them."""

import argparse
import csv
import json
import shutil
import statistics
import subprocess

import matplotlib.text
import pytest

from atlas_fast.report.collect import report_folder
from atlas_fast.report.results_folder import collect_records
from atlas_fast.cli.report import add_parser as add_report_command, run_report_command
from atlas_fast.report.figures import curves_figure, plot_rows, rows_figure, series_figure
from atlas_fast.report.formats import latex_table, markdown_table
from atlas_fast.report.rows import TableRow
from atlas_fast.report.stats import paired_difference
from atlas_fast.engine.evaluate import harmonic_mean
from atlas_fast.atlas.variants import alternation_period

SCHEDULES = {"coop": ({"name": "onehot"}, None), "atlas": ({"name": "atlas", "period": 2}, "ls"),
             "isl": ({"name": "atlas", "period": 2}, "isl")}


def _recipe_epochs(method, setting, shots, dataset):
    """The epochs of the method's paper recipe (10 where it has none)."""
    from atlas_fast.methods import METHODS
    from atlas_fast.methods.config import MissingRecipe

    try:
        return METHODS[method].recipe_function("paper", setting, shots, dataset)[1].epochs
    except MissingRecipe:
        return 10


def record(dataset, method, variant, seed, metrics, setting="base2new", shots=16, created="2024-01-01T00:00:00",
           **config_changes):
    """A finished record as :func:`atlas_fast.engine.record.build_record` and ``ResultStore.save`` write it (the
    fields the report and the validity checks read)."""
    schedule, soft = SCHEDULES[variant]
    if schedule["name"] == "atlas":  # the paper's K of the setting: no row is marked for another K
        schedule = {**schedule, "period": alternation_period(setting)}
    epochs = _recipe_epochs(method, setting, shots, dataset)  # full-recipe runs: no row is marked as shortened
    config = {"dataset": dataset, "backbone": {"model": "ViT-B-16", "pretrained": "openai"}, "method": method,
              "method_config": {"n_ctx": 4}, "recipe_family": "paper", "recipe": {"epochs": epochs, "lr": 0.002},
              "setting": setting, "shots": shots, "seed": seed, "subsample": "base" if setting == "base2new" else "all",
              "soft_labels": None if soft is None else {"kind": soft, "alpha": 0.1}, "schedule": schedule,
              "views": epochs, "aug_seed": 0, "eval_every_epoch": False, "device": "cpu", "precision": "fp32"}
    for dotted, value in config_changes.items():
        *parents, leaf = dotted.split("__")
        target = config
        for part in parents:
            target = target[part]
        target[leaf] = value
    zero_shot = {k: 50.0 for k in metrics}
    return {"key": f"{dataset}{method}{variant}{seed}{setting}{shots}{sorted(config_changes.items())}",
            "config_key": "k", "status": "finished", "created": created, "config": config,
            "backbone": {"fingerprint": "fp", "architecture": "ViT-B-16", "description": "d"},
            "data": {"dataset": dataset, "fingerprint": "data"}, "metrics": {**metrics, "zero_shot": zero_shot},
            "epochs": [], "timings": {}, "learned": "x.pt", "learned_blake2b": "0"}


def write(root, rec, name=None):
    c = rec["config"]
    name = name or (f"{c['method']}-{c['schedule']['name']}-{c['setting']}-{c['shots']}shot-seed{c['seed']}-"
                    f"{abs(hash(rec['key'])) % 10**12:012d}")
    path = root / c["dataset"] / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


# Per-seed (base, new) of a base-to-new sweep: two datasets, two methods, plain and + ATLaS, seeds 1-3.
SWEEP = {
    ("OxfordPets", "coop", "coop"): [(90.0, 80.0), (92.0, 82.0), (91.0, 78.0)],
    ("OxfordPets", "coop", "atlas"): [(91.0, 84.0), (90.0, 86.0), (92.0, 85.0)],
    ("OxfordPets", "cocoop", "coop"): [(89.0, 85.0), (88.0, 87.0), (90.0, 86.0)],
    ("OxfordPets", "cocoop", "atlas"): [(89.5, 88.0), (88.5, 88.0), (90.5, 88.0)],
    ("EuroSAT", "coop", "coop"): [(80.0, 50.0), (84.0, 56.0), (82.0, 53.0)],
    ("EuroSAT", "coop", "atlas"): [(81.0, 60.0), (83.0, 58.0), (82.0, 62.0)],
    ("EuroSAT", "cocoop", "coop"): [(78.0, 60.0), (80.0, 62.0), (79.0, 61.0)],
    ("EuroSAT", "cocoop", "atlas"): [(78.0, 64.0), (79.0, 66.0), (80.0, 65.0)],
}


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "results"
    for (dataset, method, variant), values in SWEEP.items():
        for seed, (base, new) in enumerate(values, 1):
            write(root, record(dataset, method, variant, seed,
                               {"base": base, "new": new, "all": (base + new) / 2, "H": harmonic_mean(base, new)}))
    # few-shot (4 and 16 shots, one dataset) and cross-dataset (source accuracy) records in the same folder
    for shots, accuracies in ((4, {"coop": [60.0, 64.0], "isl": [63.0, 66.0]}),
                              (16, {"coop": [70.0, 72.0], "isl": [73.0, 74.0]})):
        for variant, values in accuracies.items():
            for seed, value in enumerate(values, 1):
                write(root, record("EuroSAT", "coop", variant, seed, {"all": value}, setting="few_shot", shots=shots))
    for seed, value in enumerate([71.0, 72.0], 1):
        write(root, record("ImageNet", "coop", "coop", seed, {"all": value}, setting="cross_dataset"))
    return root


def _table(markdown, heading):
    """The ``| ... |`` lines of the table under ``## heading`` (header first, separator dropped)."""
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and "---" not in line]


def _mean_std(values):
    return f"{statistics.fmean(values):.2f} ± {statistics.pstdev(values):.2f}"


def test_rows_are_grouped_by_dataset_method_and_variant_with_mean_and_population_std(sweep, tmp_path):
    markdown = report_folder(sweep, out=tmp_path / "out")
    table = _table(markdown, "Base-to-new generalisation, 16 shots")
    assert table[0] == ["Dataset", "Method", "base", "new", "H", "ΔH (95 % CI)"]
    assert [row[:2] for row in table[1:]] == [
        [group, label] for group in ("OxfordPets", "EuroSAT", "Average")
        for label in ("CoOp", "+ ATLaS", "CoCoOp", "+ ATLaS")]  # paper's dataset order, plain method first, Average last
    cells = {(row[0], i): row for i, row in enumerate(table[1:])}
    pets_coop = cells[("OxfordPets", 0)]
    bases, news = zip(*SWEEP[("OxfordPets", "coop", "coop")])
    assert pets_coop[2:4] == [_mean_std(bases), _mean_std(news)]  # population std (pstdev), not the sample one
    assert statistics.pstdev(bases) != statistics.stdev(bases)
    # H is the harmonic mean of the mean base and new accuracies, not the mean of per-seed H
    h = harmonic_mean(statistics.fmean(bases), statistics.fmean(news))
    assert pets_coop[4] == f"{h:.2f}"
    assert f"{h:.2f}" != f"{statistics.fmean(harmonic_mean(b, n) for b, n in zip(bases, news)):.2f}"
    # + ATLaS's change in H is measured against its own method's plain row
    atlas = cells[("OxfordPets", 1)]
    assert atlas[4].endswith(f"({float(atlas[4].split()[0]) - h:+.2f})")
    # ... and, paired by seed, as the mean of the per-seed H differences with its 95 % t interval
    per_seed_h = {v: [harmonic_mean(b, n) for b, n in SWEEP[("OxfordPets", "coop", v)]] for v in ("coop", "atlas")}
    assert atlas[5] == paired_difference(per_seed_h["atlas"], per_seed_h["coop"]).cell() and pets_coop[5] == ""
    assert "over 3 seeds with a 95 % t interval" in markdown
    # the Average averages the per-dataset means; its H is that of the averaged base and new
    means = {d: [statistics.fmean(v[i] for v in SWEEP[(d, "coop", "coop")]) for i in (0, 1)]
             for d in ("OxfordPets", "EuroSAT")}
    base, new = (statistics.fmean(means[d][i] for d in means) for i in (0, 1))
    average = cells[("Average", 8)]
    assert [cell.split(" ±")[0] for cell in average[2:5]] == [f"{base:.2f}", f"{new:.2f}",
                                                             f"{harmonic_mean(base, new):.2f}"]
    # few-shot tables per shot count and the cross-dataset table show the class set's accuracy
    four = _table(markdown, "Few-shot classification, 4 shots")
    # paired differences 3 and 2: mean 2.5, s = 0.7071, t(0.975, 1) = 12.706 -> half-width 6.353
    assert four == [["Dataset", "Method", "all", "Δall (95 % CI)"], ["EuroSAT", "CoOp", _mean_std([60.0, 64.0]), ""],
                    ["EuroSAT", "+ ATLaS-ISL", f"{_mean_std([63.0, 66.0])} (+2.50)", "+2.50 [-3.85, +8.85]"]]
    assert _table(markdown, "Cross-dataset transfer, source dataset, 16 shots")[1] == [
        "ImageNet", "CoOp", _mean_std([71.0, 72.0])]
    assert (tmp_path / "out" / "report.md").read_text().strip() == markdown.strip()


def test_filters_keep_only_the_datasets_and_methods_asked_for(sweep, tmp_path):
    records = collect_records(sweep, datasets=["oxfordpets"], methods=["cocoop"])
    assert {(r["config"]["dataset"], r["config"]["method"]) for r in records} == {("OxfordPets", "cocoop")}
    assert len(records) == 6
    markdown = report_folder(sweep, out=tmp_path / "out", datasets=["EuroSAT"], methods=["coop"])
    rows = _table(markdown, "Base-to-new generalisation, 16 shots")[1:]
    assert [row[:2] for row in rows] == [["EuroSAT", "CoOp"], ["EuroSAT", "+ ATLaS"]]  # one dataset: no Average
    assert "Cross-dataset" not in markdown and "Few-shot classification, 4 shots" in markdown
    with pytest.raises(ValueError, match="No finished result record .* matching"):
        report_folder(sweep, out=tmp_path / "none", methods=["maple"])


def test_a_damaged_or_unfinished_record_is_skipped_with_a_warning_naming_it(sweep, tmp_path, capsys):
    damaged = sweep / "OxfordPets" / "coop-onehot-base2new-16shot-seed9-damaged.json"
    damaged.write_text('{"config": {"dataset": "OxfordPets"')
    unfinished = write(sweep, {**record("OxfordPets", "coop", "coop", 7, {"base": 1.0, "new": 1.0}),
                               "status": "running"}, name="coop-unfinished")
    records = collect_records(sweep)
    err = capsys.readouterr().err
    assert f"skipped {damaged}" in err and f"skipped {unfinished}" in err and "status" in err
    assert len(records) == 24 + 8 + 2 and all("seed9" not in r["path"] for r in records)
    assert not {r["config"]["seed"] for r in records} & {7, 9}
    assert damaged.exists()  # a report reads; it moves nothing


def test_variants_that_differ_in_configuration_are_separate_rows_and_duplicates_keep_the_newer(tmp_path, capsys):
    """A sensitivity sweep of α writes ``+ ATLaS-ISL`` records that must not be averaged together; a second record
    of the same run and seed (data changed) replaces the older one."""
    root = tmp_path / "results"
    for alpha, new in ((0.1, 70.0), (0.5, 60.0)):
        write(root, record("EuroSAT", "coop", "isl", 1, {"base": 80.0, "new": new}, soft_labels__alpha=alpha))
    write(root, record("EuroSAT", "coop", "coop", 1, {"base": 80.0, "new": 50.0}), name="old")
    newer = write(root, {**record("EuroSAT", "coop", "coop", 1, {"base": 82.0, "new": 52.0},
                                  created="2024-02-01T00:00:00"), "key": "other",
                          "data": {"dataset": "EuroSAT", "fingerprint": "changed data"}}, name="new")
    rows = _table(report_folder(root, out=tmp_path / "out"), "Base-to-new generalisation, 16 shots")[1:]
    assert [(row[1], row[3]) for row in rows] == [
        ("CoOp", "52.00"), ("+ ATLaS-ISL (α=0.1)", "70.00"), ("+ ATLaS-ISL (α=0.5)", "60.00")]
    assert f"using {newer}" in capsys.readouterr().err


def test_csv_latex_and_plots_are_written(sweep, tmp_path):
    out = tmp_path / "out"
    report_folder(sweep, out=out)
    with open(out / "report.csv") as f:
        lines = list(csv.DictReader(f))
    assert list(lines[0]) == ["setting", "shots", "dataset", "method", "variant", "seeds", "datasets", "base",
                              "base_std", "new", "new_std", "H", "H_std", "all", "all_std", "paired_metric",
                              "paired_diff", "ci95_low", "ci95_high", "paired_seeds"]
    four_isl = next(line for line in lines if line["shots"] == "4" and line["variant"] == "+ ATLaS-ISL")
    assert (four_isl["paired_metric"], four_isl["paired_diff"], four_isl["paired_seeds"]) == ("all", "2.5000", "2")
    assert float(four_isl["ci95_low"]) == pytest.approx(2.5 - 6.3531, abs=1e-3)
    pets = next(line for line in lines if line["dataset"] == "OxfordPets" and line["variant"] == "CoOp")
    bases = [b for b, _ in SWEEP[("OxfordPets", "coop", "coop")]]
    assert (pets["method"], pets["seeds"], pets["setting"]) == ("CoOp", "3", "base2new")
    assert float(pets["base"]) == pytest.approx(statistics.fmean(bases), abs=1e-4)
    assert float(pets["base_std"]) == pytest.approx(statistics.pstdev(bases), abs=1e-4)
    assert pets["all"] == "" or float(pets["all"]) > 0
    tex = (out / "report.tex").read_text()
    assert r"\usepackage{booktabs}" in tex.splitlines()[0] and tex.startswith("%")
    for table in tex.split(r"\end{table}")[:-1]:
        assert r"\toprule" in table and r"\bottomrule" in table and r"\label{tab:" in table
        spec = table.split(r"\begin{tabular}{")[1].split("}")[0]
        assert "|" not in spec
    assert {r"\label{tab:base2new}", r"\label{tab:few-shot-4shot}", r"\label{tab:cross-dataset}"} <= {
        line.strip() for line in tex.splitlines()}
    assert r"$\pm$" in tex
    for name in ("base2new", "few_shot", "cross_dataset"):
        for suffix in ("png", "pdf"):
            assert (out / f"{name}.{suffix}").stat().st_size > 0
    assert (out / "few_shot.pdf").read_bytes().startswith(b"%PDF")


def test_format_option_writes_only_what_is_asked(sweep, tmp_path):
    report_folder(sweep, out=tmp_path / "out", formats=["md", "pdf"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [  # the Average's plot and each dataset's
        "base2new.pdf", "base2new_EuroSAT.pdf", "base2new_OxfordPets.pdf", "cross_dataset.pdf", "few_shot.pdf",
        "report.md"]


def _rows():
    return [TableRow("CoOp", {"base": 80.0, "new": 60.0, "H": 68.57}, {"base": 1.0, "new": 2.0}, 3, ("A",), "CoOp"),
            TableRow("+ ATLaS", {"base": 79.0, "new": 65.0, "H": 71.32}, {"base": 0.5, "new": 1.5}, 3, ("A",), "CoOp"),
            TableRow("CoCoOp", {"base": 81.0, "new": 66.0, "H": 72.74}, {"base": 1.0, "new": 2.0}, 3, ("A",),
                     "CoCoOp"),
            TableRow("+ ATLaS", {"base": 81.0, "new": 65.0, "H": 72.12}, {"base": 1.0, "new": 2.0}, 3, ("A",),
                     "CoCoOp")]


def test_latex_bolds_the_best_of_each_column_per_method_block_with_std_and_no_vertical_rules():
    tex = latex_table(_rows(), caption="Base-to-new & more_text", label="tab:b2n")
    lines = [line.strip() for line in tex.splitlines()]
    assert lines[0].startswith("%") and "booktabs" in lines[0]
    assert r"\label{tab:b2n}" in lines
    assert any(line.startswith(r"\caption{Base-to-new \& more\_text. Mean over 3 seeds") for line in lines)
    assert r"\begin{tabular}{lccc}" in lines
    body = {line.split(" & ")[0]: line for line in lines if line.endswith(r"\\") and "Method" not in line}
    coop, coop_atlas = [line for line in lines if line.startswith(("CoOp &", "+ ATLaS &"))][:2]
    assert coop.startswith(r"CoOp & \textbf{80.00} {\scriptsize$\pm$1.00} & 60.00")
    assert r"& \textbf{65.00} {\scriptsize$\pm$1.50} & \textbf{71.32} {\scriptsize(+2.75)}" in coop_atlas
    cocoop = body["CoCoOp"]  # 81.00 ties 81.00 in its block: both bold; its H beats the block's other row
    assert cocoop.count(r"\textbf") == 3
    assert tex.count(r"\midrule") == 2  # under the header and between the two method blocks


def test_plots_have_no_title_bars_from_zero_and_readable_fonts(tmp_path):
    figures = [rows_figure(_rows()), series_figure([1, 2, 4], {"CoOp": [60.0, 65.0, 70.0]}, "shots"),
               curves_figure({"CoOp": [60.0, 62.0, 61.0]}, "new")]
    for fig in figures:
        assert not fig.texts and fig._suptitle is None
        assert all(ax.get_title() == "" for ax in fig.axes)
        sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]
        assert sizes and min(sizes) >= 8
    assert figures[0].axes[0].get_ylim()[0] == 0  # bars start at 0
    zoomed = figures[1].axes[0]
    assert zoomed.get_ylim()[0] > 0 and f"axis from {zoomed.get_ylim()[0]:g}" in zoomed.get_ylabel()
    assert rows_figure(_rows(), title="T").axes[0].get_title() == "T"  # a title only when asked for
    path = plot_rows(_rows(), tmp_path / "bars.png")
    assert path.stat().st_size > 0 and (tmp_path / "bars.pdf").read_bytes().startswith(b"%PDF")


@pytest.mark.parametrize("count, seeds", [(3, 1), (3, 3), (10, 3)])
def test_bar_plots_can_be_read_legend_below_no_overlapping_values_no_flat_error_bars(count, seeds):
    """The issue's plot: long legend labels squeezed the axes, values ran into each other ("21.720.820.2") and into
    the error bars, and one-seed rows carried zero-height error bars."""
    rows = [TableRow(f"+ ATLaS-ISL (α=0.{i}) [θ=0.{i}]" if i else "CoOp", {"base": 90.0 - i, "new": 60.0 + i,
                     "H": 72.0 + i / 2}, {"base": 1.5, "new": 0.0, "H": 1.0} if seeds > 1 else {}, seeds, ("A",),
                     "CoOp") for i in range(count)]
    fig = rows_figure(rows)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    axes_box = ax.get_window_extent(renderer)
    assert legend.y1 <= axes_box.y0  # below the axes: the bars keep the figure's width
    values = [t for t in ax.texts if t.get_text()]
    assert values and all(t.get_fontsize() >= 8 for t in values)
    boxes = [t.get_window_extent(renderer) for t in values]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])  # no value runs into another
    caps = [line for line in ax.lines if line.get_marker() not in (None, "None", "")]
    segments = [seg for collection in ax.collections for seg in collection.get_segments()]
    if seeds == 1:
        assert not segments and not caps  # no error bar where one seed gives no spread
    else:
        assert segments and all(abs(seg[1][1] - seg[0][1]) > 0 for seg in segments)  # none of zero height
        tops = {round(float(seg[0][0]), 6): float(seg[:, 1].max()) for seg in segments}  # x -> error bar's top
        for text in values:  # a printed value sits above its bar's error bar, not on it
            x, y = text.xy
            assert y >= tops.get(round(x, 6), y) - 1e-6


def test_markdown_table_without_groups_is_unchanged_in_shape():
    table = markdown_table(_rows(), "T")
    assert table.splitlines()[2] == "| Method | base | new | H |"
    assert "population std" in table


def test_report_command_prints_the_markdown_and_exits_0(sweep, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_report_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(sweep), "--out", str(tmp_path / "out"), "--methods", "coop",
                              "--format", "md", "csv"])
    assert run_report_command(args) == 0
    captured = capsys.readouterr()
    assert "## Base-to-new generalisation, 16 shots" in captured.out and "| Average | CoOp |" in captured.out
    assert "CoCoOp" not in captured.out
    assert f"written: {tmp_path / 'out' / 'report.md'}" in captured.err
    # sources.json names the records behind report.csv's cells (what `report --verify` checks)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.csv", "report.md", "sources.json"]
    assert parser.parse_args(["report", str(sweep)]).formats == ["md", "tex", "csv", "png", "pdf"]


def test_the_report_command_line_does_not_import_torch():
    import subprocess
    import sys

    code = ("import argparse, sys; from atlas_fast.cli.report import add_parser as add_report_command; "
            "p = argparse.ArgumentParser(); add_report_command(p.add_subparsers()); "
            "p.parse_args(['report', 'results']); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def _paper_sweep(root, seeds):
    """CoOp, + ATLaS and + ATLaS-ISL at two α on two datasets, every run shortened to 5 epochs on another backbone
    (marks every row shares), ``seeds`` each."""
    for d, dataset in enumerate(("OxfordPets", "EuroSAT")):
        for v, (variant, changes) in enumerate([("coop", {}), ("atlas", {}), ("isl", {"soft_labels__alpha": 0.3}),
                                                ("isl", {"soft_labels__alpha": 0.7})]):
            for seed in seeds:
                metrics = {"base": 80.0 + d + v + seed / 3, "new": 60.0 + 2 * v - seed / 2}
                write(root, record(dataset, "coop", variant, seed, metrics, recipe__epochs=5, views=5,
                                   backbone__model="atlas-world", **changes))
    return root


@pytest.mark.parametrize("seeds", [(1,), (1, 2, 3)])
def test_the_latex_is_pure_ascii_with_shared_marks_in_the_caption_and_the_average_last(tmp_path, seeds):
    """What pdflatex without extra packages reads: no byte outside ASCII (Δ, ±, α in math mode); the marks every row
    shares in the caption, not on each row; the Average section last; no interval spoken of for one seed."""
    root = _paper_sweep(tmp_path / "results", seeds)
    report_folder(root, out=tmp_path / "out", formats=["tex"])
    tex = (tmp_path / "out" / "report.tex").read_text(encoding="utf-8")
    assert tex.isascii(), sorted({ch for ch in tex if not ch.isascii()})
    caption = next(line for line in tex.splitlines() if r"\caption" in line)
    assert "[epochs=5, backbone=atlas-world]: what every run of the table changes" in caption
    rows = [line.strip() for line in tex.splitlines() if line.strip().endswith(r"\\")]
    assert not any("epochs=5" in row for row in rows)
    assert r"+ ATLaS-ISL ($\alpha$=0.3)" in tex and r"$\Delta$H" in tex
    sections = [row.split(" & ")[0] for row in rows[1:] if not row.startswith("&")]
    assert sections == ["OxfordPets", "EuroSAT", "Average"]
    if len(seeds) == 1:
        assert "interval" not in rows[0] and "t interval" not in caption and r"$\pm$" not in tex
        assert "Mean over 1 seed per dataset" in caption
    else:
        assert r"$\Delta$H (95 \% CI)" in rows[0] and "over 3 seeds with a 95 \\% t interval" in caption


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex is not installed here: the report's LaTeX is checked by its ASCII test only")
def test_the_latex_compiles_with_plain_pdflatex_and_booktabs(tmp_path):
    root = _paper_sweep(tmp_path / "results", (1, 2, 3))
    report_folder(root, out=tmp_path / "out", formats=["tex"])
    (tmp_path / "out" / "paper.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n"
                                                "\\begin{document}\n\\input{report.tex}\n\\end{document}\n")
    result = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"],
                            cwd=tmp_path / "out", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    log = (tmp_path / "out" / "paper.log").read_text(errors="replace")
    assert "Missing character" not in log  # every character had a glyph
    assert (tmp_path / "out" / "paper.pdf").read_bytes().startswith(b"%PDF")
