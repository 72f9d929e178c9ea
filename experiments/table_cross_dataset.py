"""Tables I and II: cross-dataset transfer and domain generalisation of CoOp, CoCoOp, DePT, IVLP and MaPLe with ATLaS

Starts ``atlas_fast/experiments/table_cross_dataset.py``: ``python -m experiments.table_cross_dataset --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'table_cross_dataset')
