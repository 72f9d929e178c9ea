"""Table V: computational cost of ATLaS, measured: training time per method and the soft-label overhead.

Starts ``atlas_fast/experiments/table5_cost.py``: ``python -m experiments.table5_cost --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'table5_cost')
