"""Views study: base/new/H of CoOp and CoOp + ATLaS with V cached views per image against one fresh view per epoch.

Starts ``atlas_fast/experiments/views_study.py``: ``python -m experiments.views_study --help``.
"""

from experiments import run_when_main

run_when_main(__name__, 'views_study')
