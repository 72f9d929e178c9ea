"""Fig. 1: new-class test accuracy over training of CoOp, + vanilla LS, + TF-KD, + OLS and + ATLaS (base-to-new).

Starts ``atlas_fast/experiments/fig1_label_smoothing.py``: ``python -m experiments.fig1_label_smoothing --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'fig1_label_smoothing')
