"""Fig. 3: case study of the soft labels CSL and ISL give training images of one class, drawn as heat maps.

Starts ``atlas_fast/experiments/fig3_soft_label_case_study.py``: ``python -m experiments.fig3_soft_label_case_study --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'fig3_soft_label_case_study')
