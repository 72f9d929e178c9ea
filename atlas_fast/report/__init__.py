"""Results as a paper shows them: :mod:`~atlas_fast.report.tables` (tables in Markdown, LaTeX and CSV, plots, and
the lines ``train``/``eval`` print) and :mod:`~atlas_fast.report.collect` (``atlas-fast report``: every finished run
of a results folder as those tables). Nothing here trains; the run pipeline never imports this package."""
