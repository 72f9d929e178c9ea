"""The old home of the report's tables, figures and printed lines, split into rooms of one job:
:mod:`atlas_fast.report.rows` (rows and aggregation), :mod:`atlas_fast.report.formats` (Markdown, LaTeX, CSV and the
lines ``train``/``eval`` print) and :mod:`atlas_fast.report.figures` (plots); a run's printed name is
:func:`atlas_fast.engine.deviations.run_name`. Each old name still works here, with a deprecation warning."""

from atlas_fast.renames import moved_names

__getattr__ = moved_names(__name__, {
    "method_name": "atlas_fast.report.rows:method_name",
    "variant_label": "atlas_fast.report.rows:variant_label",
    "strategy_label": "atlas_fast.report.rows:strategy_label",
    "TableRow": "atlas_fast.report.rows:TableRow",
    "aggregate": "atlas_fast.report.rows:aggregate",
    "deviation_marks": "atlas_fast.report.rows:deviation_marks",
    "best_cells": "atlas_fast.report.rows:best_cells",
    "display_label": "atlas_fast.report.rows:display_label",
    "paired_differences": "atlas_fast.report.rows:paired_differences",
    "epoch_curves": "atlas_fast.report.rows:epoch_curves",
    "train_results": "atlas_fast.report.formats:train_results",
    "eval_result_line": "atlas_fast.report.formats:eval_result_line",
    "deviation_sentences": "atlas_fast.report.formats:deviation_sentences",
    "markdown_table": "atlas_fast.report.formats:markdown_table",
    "latex_escape": "atlas_fast.report.formats:latex_escape",
    "latex_label": "atlas_fast.report.formats:latex_label",
    "latex_table": "atlas_fast.report.formats:latex_table",
    "CSV_FIELDS": "atlas_fast.report.formats:CSV_FIELDS",
    "csv_lines": "atlas_fast.report.formats:csv_lines",
    "paired_csv_fields": "atlas_fast.report.formats:paired_csv_fields",
    "write_csv": "atlas_fast.report.formats:write_csv",
    "PLOT_STYLE": "atlas_fast.report.figures:PLOT_STYLE",
    "PLOT_FORMATS": "atlas_fast.report.figures:PLOT_FORMATS",
    "save_figure": "atlas_fast.report.figures:save_figure",
    "rows_figure": "atlas_fast.report.figures:rows_figure",
    "plot_rows": "atlas_fast.report.figures:plot_rows",
    "curves_figure": "atlas_fast.report.figures:curves_figure",
    "plot_curves": "atlas_fast.report.figures:plot_curves",
    "series_figure": "atlas_fast.report.figures:series_figure",
    "plot_series": "atlas_fast.report.figures:plot_series",
    "plot_soft_label_case_study": "atlas_fast.report.figures:plot_soft_label_case_study",
    "run_name": "atlas_fast.engine.deviations:run_name",
})
