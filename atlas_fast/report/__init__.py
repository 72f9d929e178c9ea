"""Results as a paper shows them, in rooms of one job: :mod:`~atlas_fast.report.rows` (a table's rows from records,
aggregated as the papers do), :mod:`~atlas_fast.report.formats` (Markdown, LaTeX and CSV, and the lines
``train``/``eval`` print), :mod:`~atlas_fast.report.figures` (plots), :mod:`~atlas_fast.report.stats` (paired
differences), :mod:`~atlas_fast.report.results_folder` (a results folder's records, and those left out),
:mod:`~atlas_fast.report.grouping` (each record's table and row), :mod:`~atlas_fast.report.collect` (``atlas-fast
report``: those tables written) and :mod:`~atlas_fast.report.verify` (``--verify``). Nothing here trains; the run
pipeline never imports this package."""
