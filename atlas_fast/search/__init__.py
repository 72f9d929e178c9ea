"""Hyper-parameter search over a run's fields, ATLaS knobs and method options with Optuna, selected on the
validation split, pruned from per-epoch validation accuracy, batched on a GPU, stored in a shareable storage
(``atlas-fast search``; docs/search.md)."""

from atlas_fast.search.space import Choice, Range, choice, integers, log_uniform, parse_param, uniform
from atlas_fast.search.run import run_search
from atlas_fast.search.study import SearchConfig, SearchResult, run_study
from atlas_fast.vocabulary import OBJECTIVES, PRUNERS, SAMPLERS

__all__ = ["Choice", "OBJECTIVES", "PRUNERS", "Range", "SAMPLERS", "SearchConfig", "SearchResult", "choice",
           "integers", "log_uniform", "parse_param", "run_search", "run_study", "uniform"]
