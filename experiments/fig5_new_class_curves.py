"""Per-epoch new-class accuracy of CoOp under the LS strategies: LS / ATLaS, CSL / ATLaS-CSL, ISL / ATLaS-ISL.

Starts ``atlas_fast/experiments/fig5_new_class_curves.py``: ``python -m experiments.fig5_new_class_curves --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'fig5_new_class_curves')
