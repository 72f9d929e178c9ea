"""Few-shot figure: CoOp vs + ATLaS / -CSL / -ISL for K = 1, 2, 4, 8, 16 shots (all classes, δ always 1).

Starts ``atlas_fast/experiments/fig_few_shot.py``: ``python -m experiments.fig_few_shot --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'fig_few_shot')
