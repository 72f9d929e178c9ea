"""Appendix Tables A1-A3: base-to-new results of each method with ATLaS, ATLaS-CSL and ATLaS-ISL on each dataset.

    atlas-fast experiment table_a_per_dataset --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

The same runs and options as Table III (finished records are shared: ``--methods``, ``--zero-shot``), plus
PromptSRC's block (the appendix's PromptSRC rows), one table per dataset after the average, one block of rows per
method.
"""

from __future__ import annotations

import argparse

from atlas_fast.experiments import table3_base_to_new
from atlas_fast.experiments.common import PAPER_METHODS, method_args, publish, write_text
from atlas_fast.report.formats import csv_lines, latex_label, latex_table, markdown_table
from atlas_fast.report.rows import aggregate
from atlas_fast.report.stats import counted

PAPER = "Appendix Tables A1-A3 (per dataset)"
plan = table3_base_to_new.plan


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Table III's options; the appendix's methods add PromptSRC (pixel path, frozen features from the cache)."""
    method_args(p, PAPER_METHODS + ("promptsrc",))


def report(args: argparse.Namespace, records: list[dict]) -> str:
    average, title = aggregate(records, by_method=True), f"Average over {counted(len(args.datasets), 'dataset')}"
    sections = [markdown_table(average, title)]
    latex = [latex_table(average, caption=title, label="tab:table-a-average")]
    lines = [{"dataset": "Average", **line} for line in csv_lines(average)]
    for dataset in dict.fromkeys(r["config"]["dataset"] for r in records):
        rows = aggregate([r for r in records if r["config"]["dataset"] == dataset], by_method=True)
        sections.append(markdown_table(rows, dataset))
        latex.append(latex_table(rows, caption=dataset, label=latex_label(f"table-a-{dataset}")))
        lines += [{"dataset": dataset, **line} for line in csv_lines(rows)]
    write_text(args.out, "table_a_per_dataset.tex", "\n\n".join(latex))
    write_text(args.out, "table_a_per_dataset.csv", _csv_text(lines))
    return publish(args.out, "table_a_per_dataset.md", "\n\n".join(sections))


def _csv_text(lines: list[dict]) -> str:
    """The rows of every table as CSV text (one header: every table has the same columns)."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(lines[0]) if lines else ["dataset"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(lines)
    return buffer.getvalue().rstrip("\n")
