"""Table III: base-to-new generalisation of CoOp, CoCoOp, DePT, IVLP and MaPLe, each plain and with ATLaS, ATLaS-CSL

Starts ``atlas_fast/experiments/table3_base_to_new.py``: ``python -m experiments.table3_base_to_new --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'table3_base_to_new')
