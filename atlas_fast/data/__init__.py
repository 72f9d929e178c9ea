"""Datasets: the 15 CoOp benchmarks and a user's own data as :class:`DatasetSplits` (their on-disk layouts in
``layouts``, the registry in ``datasets``), few-shot and base/new subsets."""

from atlas_fast.data.base import DatasetSplits, Datum, classnames_from
from atlas_fast.data.datasets import (
    DATASETS,
    atlas_template,
    zeroshot_template,
    DatasetSpec,
    list_datasets,
    load_dataset,
    load_folder_dataset,
    register_split_json_dataset,
    registered_datasets,
)
from atlas_fast.data.fewshot import fewshot_subset, sample_per_class, subsample_classes
from atlas_fast.data.layouts import DatasetFormatError, DatasetLayoutError
from atlas_fast.data.templates import (
    ATLAS_TEMPLATES,
    CUSTOM_TEMPLATES,
    DEFAULT_TEMPLATE,
)

__all__ = [
    "ATLAS_TEMPLATES", "CUSTOM_TEMPLATES", "DATASETS", "DEFAULT_TEMPLATE", "DatasetFormatError", "DatasetLayoutError",
    "DatasetSpec", "DatasetSplits", "Datum", "atlas_template", "classnames_from", "fewshot_subset",
    "list_datasets", "load_dataset", "load_folder_dataset", "register_split_json_dataset", "registered_datasets",
    "sample_per_class", "subsample_classes", "zeroshot_template",
]
