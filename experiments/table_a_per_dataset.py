"""Appendix Tables A1-A3: base-to-new results of each method with ATLaS, ATLaS-CSL and ATLaS-ISL on each dataset.

Starts ``atlas_fast/experiments/table_a_per_dataset.py``: ``python -m experiments.table_a_per_dataset --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'table_a_per_dataset')
