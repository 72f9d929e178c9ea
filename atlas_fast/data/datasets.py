"""The registry of datasets: the 15 CoOp benchmarks, datasets that plugins and users register, and a user's own
folder or split file named on the command line.

Each dataset is a :class:`DatasetSpec`: a registry name (CoOp's ``DATASET.NAME``), the CoOp config file name (an
alias), its folder under the data root, the on-disk layout that reads its train/val/test lists
(:mod:`atlas_fast.data.layouts`), and the ATLaS template. ``DatasetSplits.classnames`` follows Dassl's rule (names
of the *train* list; the test list for test-only sets).
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from atlas_fast.data.base import DatasetSplits, check_distinct_classnames, classnames_from
from atlas_fast.data.layouts import (AircraftLayout, ClassFolderLayout, DatasetFormatError, DatasetLayoutError,
                                     ImageNetLayout, ImageNetV2Layout, Layout, SplitJsonLayout, WnidFolderLayout)
from atlas_fast.data.templates import ATLAS_TEMPLATES, CUSTOM_TEMPLATES, DEFAULT_TEMPLATE
from atlas_fast.errors import did_you_mean

FOLDER_PREFIX = "folder:"
SPLIT_PREFIX = "split:"


@dataclass(frozen=True)
class DatasetSpec:
    """One registered dataset: registry name, folder under the data root, layout, ATLaS template, CoOp alias."""

    name: str
    folder: str
    layout: Layout
    template: str
    config_name: str | None = None

    def load(self, data_root: str | Path) -> DatasetSplits:
        """Read the full train/val/test lists (no few-shot or class subsampling)."""
        root = Path(os.path.abspath(os.path.expanduser(str(data_root))))
        dataset_dir = root / self.folder
        if not dataset_dir.is_dir():
            raise DatasetLayoutError(f"dataset folder of {self.name} not found: {dataset_dir}\n"
                                     f"Expected layout:\n{self.layout.tree(dataset_dir)}")
        train, val, test = self.layout.read(dataset_dir)
        if not test:
            raise DatasetLayoutError(f"{self.name}: no test images found under {dataset_dir}\n"
                                     f"Expected layout:\n{self.layout.tree(dataset_dir)}")
        reference = test if self.layout.test_only else train
        labels = {d.label for d in reference}
        if labels and max(labels) >= len(reference):  # the names would hold gaps: refuse before sizing them by label
            split = "test" if self.layout.test_only else "train"
            first = next(d for d in reference if d.label == max(labels))
            raise DatasetFormatError(
                f"{self.name}: label {first.label} of {first.key} in {dataset_dir} is beyond the {len(labels)} "
                f"class(es) of its {split} list; labels must run 0..{len(labels) - 1} with every class present and "
                f"named.")
        classnames = classnames_from(reference)
        unnamed = [label for label, name in enumerate(classnames) if not name.strip()]
        if unnamed:
            split = "test" if self.layout.test_only else "train"
            raise DatasetFormatError(
                f"{self.name}: label(s) {unnamed[:5]} of {dataset_dir} have no {split} image (or an empty class "
                f"name); labels must run 0..{len(classnames) - 1} with every class present and named.")
        try:
            check_distinct_classnames(classnames, f"{self.name} ({dataset_dir})")
        except ValueError as exc:
            raise DatasetFormatError(str(exc)) from None
        return DatasetSplits(name=self.name, dataset_dir=dataset_dir, train=tuple(train), val=tuple(val),
                             test=tuple(test), classnames=classnames, template=self.template,
                             val_is_test=self.layout.val_is_test)


def _split_json(name: str, config_name: str, folder: str, image_prefix: str) -> DatasetSpec:
    return DatasetSpec(name, folder, SplitJsonLayout(image_prefix, f"split_zhou_{name}.json"), ATLAS_TEMPLATES[name],
                       config_name)


_BUILTIN_SPECS = (
    DatasetSpec("ImageNet", "imagenet", ImageNetLayout(), ATLAS_TEMPLATES["ImageNet"], "imagenet"),
    _split_json("Caltech101", "caltech101", "caltech-101", "101_ObjectCategories"),
    _split_json("OxfordPets", "oxford_pets", "oxford_pets", "images"),
    _split_json("StanfordCars", "stanford_cars", "stanford_cars", ""),
    _split_json("OxfordFlowers", "oxford_flowers", "oxford_flowers", "jpg"),
    _split_json("Food101", "food101", "food-101", "images"),
    DatasetSpec("FGVCAircraft", "fgvc_aircraft", AircraftLayout(), ATLAS_TEMPLATES["FGVCAircraft"], "fgvc_aircraft"),
    _split_json("SUN397", "sun397", "sun397", "SUN397"),
    _split_json("DescribableTextures", "dtd", "dtd", "images"),
    _split_json("EuroSAT", "eurosat", "eurosat", "2750"),
    _split_json("UCF101", "ucf101", "ucf101", "UCF-101-midframes"),
    DatasetSpec("ImageNetV2", "imagenetv2", ImageNetV2Layout(), ATLAS_TEMPLATES["ImageNetV2"], "imagenetv2"),
    DatasetSpec("ImageNetSketch", "imagenet-sketch", WnidFolderLayout("images"), ATLAS_TEMPLATES["ImageNetSketch"],
                "imagenet_sketch"),
    DatasetSpec("ImageNetA", "imagenet-adversarial", WnidFolderLayout("imagenet-a"), ATLAS_TEMPLATES["ImageNetA"],
                "imagenet_a"),
    DatasetSpec("ImageNetR", "imagenet-rendition", WnidFolderLayout("imagenet-r"), ATLAS_TEMPLATES["ImageNetR"],
                "imagenet_r"),
)
#: The 15 benchmarks' registry names in CoOp's table order (what `atlas-fast data check` looks for).
BUILTIN_DATASETS = tuple(spec.name for spec in _BUILTIN_SPECS)

#: The 11 datasets of the papers' base-to-new, few-shot and cross-dataset (target) tables, in the papers' order.
ELEVEN = ("ImageNet", "Caltech101", "OxfordPets", "StanfordCars", "OxfordFlowers", "Food101", "FGVCAircraft",
          "SUN397", "DescribableTextures", "EuroSAT", "UCF101")

#: registry name -> spec; the 15 benchmarks plus datasets added with :func:`register_split_json_dataset` (read it
#: through :func:`registered_datasets`, which first lets the installed plugins register theirs).
DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in _BUILTIN_SPECS}

#: Entry-point group of dataset plugins: each entry point names a function of no arguments that registers datasets
#: (with :func:`register_split_json_dataset`). The embedded world registers its benchmark this way, so this package
#: never imports the world; another package can add its datasets the same way.
DATASET_PLUGINS = "atlas_fast.datasets"
_plugins_loaded = False


def registered_datasets() -> dict[str, DatasetSpec]:
    """The registry, after every installed dataset plugin has registered its datasets (once per process)."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for entry_point in importlib.metadata.entry_points(group=DATASET_PLUGINS):
            entry_point.load()()
    return DATASETS


def list_datasets() -> list[str]:
    """Registry names, the 15 benchmarks first (in CoOp's table order), then plugin- and user-registered ones."""
    return list(registered_datasets())


def _aliases() -> dict[str, str]:
    table = {}
    for spec in registered_datasets().values():
        table[spec.name.lower()] = spec.name
        if spec.config_name:
            table[spec.config_name.lower()] = spec.name
    return table


def find_dataset_spec(name: str) -> DatasetSpec | None:
    """The spec of a registry name or CoOp config name (case-insensitive), or of ``folder:<path>``; None if unknown."""
    if name.startswith(FOLDER_PREFIX):
        path = name[len(FOLDER_PREFIX):]
        folder_name = Path(path).name
        if not path or folder_name in ("", ".", "..") or folder_name.startswith("."):
            raise ValueError(f"{name!r}: give the dataset folder by a path that ends in its own name, e.g. "
                             f"'folder:/data/my_dataset' (its name names the cache and result folders)")
        return DatasetSpec(folder_name, path, ClassFolderLayout(), DEFAULT_TEMPLATE)
    if name.startswith(SPLIT_PREFIX):
        return split_file_spec(name[len(SPLIT_PREFIX):])
    registry_name = _aliases().get(name.lower())
    return DATASETS[registry_name] if registry_name else None


def split_file_spec(argument: str) -> DatasetSpec:
    """The dataset of ``split:<dataset folder>/<split file>.json[#<image folder>]``, a CoOp split-JSON dataset read
    without registering it: the JSON's folder names the cache and result folders; image paths are relative to
    ``<image folder>`` under it (default: the folder itself)."""
    path, _, image_prefix = argument.partition("#")
    split = Path(path)
    folder_name = split.parent.name
    if split.suffix != ".json" or folder_name in ("", ".", "..") or folder_name.startswith("."):
        raise ValueError(f"'split:{argument}': give the split file by a path inside its dataset folder, e.g. "
                         f"'split:/data/my_dataset/split_my_dataset.json' or "
                         f"'split:/data/my_dataset/split_my_dataset.json#images' when the JSON paths are relative to "
                         f"its images/ folder")
    return DatasetSpec(folder_name, str(split.parent), SplitJsonLayout(image_prefix.strip("/"), split.name),
                       DEFAULT_TEMPLATE)


def dataset_spec(name: str) -> DatasetSpec:
    """Like :func:`find_dataset_spec`, but an unknown name is an error that lists the valid ones."""
    spec = find_dataset_spec(name)
    if spec is None:
        valid = ", ".join(f"{s.name} ({s.config_name})" if s.config_name else s.name
                          for s in registered_datasets().values())
        hint = did_you_mean(name, [s.name for s in registered_datasets().values()], _aliases())
        raise ValueError(f"unknown dataset {name!r}{hint}; valid names (any case): {valid}, or 'folder:<path>' or "
                         f"'split:<path>/<split file>.json'")
    return spec


def load_dataset(name: str, data_root: str | Path) -> DatasetSplits:
    """Full train/val/test lists of a dataset under ``data_root``.

    ``name``: a registry or CoOp config name (any case), ``folder:<path>`` for a ``{train,val,test}/<class>/`` folder,
    or ``split:<path>/<split file>.json[#<images>]`` (a relative path is taken under ``data_root``)."""
    return dataset_spec(name).load(data_root)


def load_folder_dataset(path: str | Path, template: str = DEFAULT_TEMPLATE) -> DatasetSplits:
    """A user's ``<path>/{train,val,test}/<class>/<images>`` dataset (labels by sorted class folder, val optional)."""
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    return DatasetSpec(path.name, path.name, ClassFolderLayout(), template).load(path.parent)


def register_split_json_dataset(name: str, folder: str, image_prefix: str, template: str,
                                split_file: str | None = None) -> DatasetSpec:
    """Register a dataset stored in CoOp's split-JSON layout under ``<data_root>/<folder>/``.

    ``image_prefix``: the folder the JSON paths are relative to (``""``: ``<folder>`` itself); ``split_file``
    defaults to ``split_zhou_<name>.json``. Re-registering a user dataset replaces it; the 15 benchmarks' names and
    aliases are reserved."""
    if "{}" not in template:
        raise ValueError(f"template {template!r} of dataset {name!r} must contain '{{}}' for the class name")
    if not name or name.startswith(FOLDER_PREFIX) or name.startswith(".") or "/" in name or os.sep in name:
        raise ValueError(f"invalid dataset name {name!r}: it names cache and result folders, so it must be a plain "
                         f"name (no path separators, not starting with '.')")
    reserved = {n.lower() for s in _BUILTIN_SPECS for n in (s.name, s.config_name) if n}
    if name.lower() in reserved:
        raise ValueError(f"dataset name {name!r} is a built-in benchmark; choose another name")
    for existing in [n for n in DATASETS if n.lower() == name.lower()]:
        del DATASETS[existing]
    spec = DatasetSpec(name, folder, SplitJsonLayout(image_prefix.strip("/"), split_file or f"split_zhou_{name}.json"),
                       template)
    DATASETS[name] = spec
    return spec


def atlas_template(name: str) -> str:
    """The ATLaS soft-label template of a dataset (registry or CoOp config name, any case)."""
    return _template_of(ATLAS_TEMPLATES, name)


def zeroshot_template(name: str) -> str:
    """CoOp's zero-shot CLIP template of a dataset (registry or CoOp config name, any case); DTD: ``{} texture.``."""
    return _template_of(CUSTOM_TEMPLATES, name)


def _template_of(table: Mapping[str, str], name: str) -> str:
    spec = find_dataset_spec(name)
    return DEFAULT_TEMPLATE if spec is None else table.get(spec.name, spec.template)
