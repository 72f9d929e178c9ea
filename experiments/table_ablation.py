"""Ablation table: soft labels alone (every epoch), jointly with y (two CE terms), and alternating (ATLaS).

Starts ``atlas_fast/experiments/table_ablation.py``: ``python -m experiments.table_ablation --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'table_ablation')
