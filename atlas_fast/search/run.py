"""A search from start to end: the study (:func:`~atlas_fast.search.study.run_trials`), then its outputs and the
final runs of the best configuration (:mod:`~atlas_fast.search.outputs`)."""

from __future__ import annotations

from atlas_fast.search.outputs import finalize, write_outputs
from atlas_fast.search.storage import close_storage
from atlas_fast.search.study import SearchConfig, SearchResult, run_trials


def run_search(search: SearchConfig, progress: bool = True) -> SearchResult:
    """Run the study (:func:`run_trials`), write its outputs (trials CSV, plots, the best configuration and the
    command line that reruns it) and, with ``finalize``, retrain the best configuration on ``final_seeds`` and test
    it: normal records that ``atlas-fast report`` reads."""
    study, trained = run_trials(search, progress)
    try:
        result = write_outputs(search, study)
    finally:
        close_storage(study)  # the study's file whole now, whatever later holds on to the study
    result.trials_now = trained
    if search.finalize:
        result.records = finalize(search, result, progress)
    return result
