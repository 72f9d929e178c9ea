"""Paired statistics (atlas_fast.report.stats) and where they appear: the tables' Δ column in Markdown, LaTeX and CSV
and the demo's verdict."""

import csv

import pytest

from atlas_fast.app.demo import verdict
from atlas_fast.report.formats import latex_table, markdown_table, write_csv
from atlas_fast.report.rows import TableRow, paired_differences
from atlas_fast.report.stats import PairedDifference, paired_by_seed, paired_difference

# Hand-worked: differences 2, 4, 1, 4 -> mean 2.75, sample variance 6.75 / 3 = 2.25 (s = 1.5), standard error
# 1.5 / sqrt(4) = 0.75, t(0.975, 3) = 3.18245 -> half-width 2.38684, interval [0.36316, 5.13684].
VARIANT, BASELINE = [72.0, 75.0, 71.0, 74.0], [70.0, 71.0, 70.0, 70.0]


def test_the_interval_matches_a_hand_computed_example():
    paired = paired_difference(VARIANT, BASELINE)
    assert paired.mean == pytest.approx(2.75) and paired.seeds == 4
    assert paired.low == pytest.approx(0.36316, abs=1e-4) and paired.high == pytest.approx(5.13684, abs=1e-4)
    assert paired.direction() == "raises" and paired.cell() == "+2.75 [+0.36, +5.14]"


def test_the_direction_says_raises_lowers_or_no_difference():
    assert paired_difference([1.0, 2.0, 3.0], [2.0, 3.5, 4.2]).direction() == "lowers"
    # differences 1, -1, 2: the interval holds 0
    undecided = paired_difference([71.0, 69.0, 72.0], [70.0, 70.0, 70.0])
    assert undecided.low < 0 < undecided.high and undecided.direction() == "no difference at 95 %"


def test_one_seed_has_no_interval_and_says_so():
    single = paired_difference([75.0], [70.0])
    assert single == PairedDifference(5.0, None, None, 1)
    assert single.direction() == "one seed: no interval" and single.cell() == "+5.00 (1 seed)"


def test_pairs_are_matched_by_seed_and_need_a_common_seed():
    paired = paired_by_seed({1: 72.0, 2: 75.0, 3: 71.0, 4: 74.0, 9: 0.0}, {4: 70.0, 3: 70.0, 2: 71.0, 1: 70.0})
    assert paired == paired_difference(VARIANT, BASELINE)
    assert paired_by_seed({1: 1.0}, {2: 1.0}) is None
    with pytest.raises(ValueError, match="pairs"):
        paired_difference([1.0, 2.0], [1.0])


def _rows(seeds=(1, 2, 3, 4)):
    def row(name, values, spread):
        per_seed = {s: v for s, v in zip(seeds, values)}
        mean = sum(per_seed.values()) / len(per_seed)
        return TableRow(name, {"base": mean + 10, "H": mean}, {"base": spread, "H": spread}, len(seeds),
                        ("Pets",), per_seed={"H": per_seed})

    return [row("CoOp", BASELINE, 0.4), row("+ ATLaS", VARIANT, 1.6)]


def test_markdown_carries_the_paired_column_and_a_note_of_the_seeds():
    table = markdown_table(_rows())
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert lines[0] == "| Method | base | H | ΔH (95 % CI) |"
    assert lines[2].endswith("|  |") and lines[3].endswith("| +2.75 [+0.36, +5.14] |")
    assert "over 4 seeds with a 95 % t interval" in table
    single = markdown_table(_rows(seeds=(1,)))
    assert "| +2.00 (1 seed) |" in single and "on the one seed there is: no interval" in single


def test_latex_keeps_booktabs_plus_minus_and_bold_best_with_the_paired_column():
    tex = latex_table(_rows(), caption="Paired", label="tab:paired")
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex and r"\vline" not in tex
    assert r"\begin{tabular}{lccc}" in tex  # Method, base, H, ΔH
    assert r"$\pm$" in tex and r"\textbf{83.00}" in tex and r"\textbf{73.00}" in tex  # + ATLaS is best
    assert r"Method & base & H & $\Delta$H (95 \% CI) \\" in tex
    assert r"+2.75 {\scriptsize[+0.36, +5.14]} \\" in tex


def test_csv_gives_the_paired_difference_and_its_interval(tmp_path):
    path = write_csv(_rows(), tmp_path / "t.csv")
    with open(path) as f:
        lines = list(csv.DictReader(f))
    assert lines[0]["paired_diff"] == "" and lines[0]["H"] == "70.2500"
    assert (lines[1]["paired_metric"], lines[1]["paired_diff"], lines[1]["paired_seeds"]) == ("H", "2.7500", "4")
    assert float(lines[1]["ci95_low"]) == pytest.approx(0.36316, abs=1e-4)
    assert paired_differences(_rows())[0] is None


def _record(variant, seed, base, new):
    schedule = {"name": "onehot"} if variant == "coop" else {"name": "atlas", "period": 2}
    soft = None if variant == "coop" else {"kind": variant}
    return {"config": {"dataset": "WorldPhotos", "seed": seed, "method": "coop", "schedule": schedule,
                       "soft_labels": soft}, "metrics": {"base": base, "new": new}}


def test_the_demo_verdict_reads_the_interval():
    records = [_record("coop", s, 90.0, n) for s, n in ((1, 50.0), (2, 52.0), (3, 51.0))]
    records += [_record("isl", s, 90.0, n) for s, n in ((1, 60.0), (2, 63.0), (3, 61.0))]
    records += [_record("csl", s, 90.0, n) for s, n in ((1, 51.0), (2, 51.0), (3, 52.0))]
    text = verdict(records)
    assert "ATLaS-ISL: raises new-class accuracy by 10.33 [" in text
    assert "ATLaS-CSL: no difference at 95 % in new-class accuracy (+0.33 [" in text
    assert "over 3 seeds with its 95 % t interval" in text
    one = verdict([_record("coop", 1, 90.0, 50.0), _record("isl", 1, 90.0, 60.0)])
    assert "one seed" in one and "[" not in one
    other = [{**r, "config": {**r["config"], "dataset": "WorldSketches"}} for r in records]
    both = verdict(records + other)  # seeds pair within a dataset: each dataset gets its own sentences
    assert both.startswith("On WorldPhotos: Against CoOp (") and " On WorldSketches: Against CoOp (" in both
    assert both.count("over 3 seeds") == 2
