"""Datasets: the 15 CoOp benchmarks and a user's own data as :class:`DatasetSplits`, few-shot and base/new subsets."""

from atlas_fast.data.base import DatasetSplits, Datum, classnames_from
from atlas_fast.data.datasets import (
    DATASETS,
    DatasetFormatError,
    DatasetLayoutError,
    DatasetSpec,
    list_datasets,
    load_dataset,
    load_folder_dataset,
    register_split_json_dataset,
)
from atlas_fast.data.fewshot import SUBSAMPLE_MODES, fewshot_subset, sample_per_class, subsample_classes
from atlas_fast.data.templates import (
    ATLAS_TEMPLATES,
    CUSTOM_TEMPLATES,
    DEFAULT_TEMPLATE,
    atlas_template,
    zeroshot_template,
)

__all__ = [
    "ATLAS_TEMPLATES", "CUSTOM_TEMPLATES", "DATASETS", "DEFAULT_TEMPLATE", "DatasetFormatError", "DatasetLayoutError",
    "DatasetSpec", "DatasetSplits", "Datum", "SUBSAMPLE_MODES", "atlas_template", "classnames_from", "fewshot_subset",
    "list_datasets", "load_dataset", "load_folder_dataset", "register_split_json_dataset", "sample_per_class",
    "subsample_classes", "zeroshot_template",
]


def _register_builtin_extras() -> None:
    """The embedded world's benchmark datasets (``atlas_fast.world``) are known by name in every process."""
    from atlas_fast.world.benchmark import register_world_datasets

    register_world_datasets()


_register_builtin_extras()
