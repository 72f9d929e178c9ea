"""Sensitivity figure: base / new / H of CoOp + ATLaS (θ), + ATLaS-CSL (1/τ_c), + ATLaS-ISL (α and K).

Starts ``atlas_fast/experiments/fig_sensitivity.py``: ``python -m experiments.fig_sensitivity --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'fig_sensitivity')
