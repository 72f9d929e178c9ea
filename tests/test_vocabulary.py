"""One word, one home: the run's vocabulary is spelled once (atlas_fast.vocabulary), and every old name of a word that
was renamed or moved still works, with a DeprecationWarning naming the new one."""

import ast
import dataclasses
import functools
import importlib
from pathlib import Path

import pytest

from atlas_fast import vocabulary

PACKAGE = Path(__file__).resolve().parents[1]
SOURCES = [*sorted((PACKAGE / "atlas_fast").rglob("*.py")), *sorted((PACKAGE / "experiments").glob("*.py"))]
# Every tuple of the vocabulary with more than one word: none may be spelled again anywhere else.
SPELLED_ONCE = {name: value for name, value in vars(vocabulary).items()
                if name.isupper() and isinstance(value, tuple) and len(value) > 1}


@functools.lru_cache(maxsize=None)
def word_lists(path: Path) -> tuple[list[tuple[int, tuple[str, ...]]], list[int]]:
    """(line, value) of every tuple or list of string constants in a source file, and the lines of its literal
    ``choices=`` (parsed once for both tests)."""
    lists, choices = [], []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) > 1 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            lists.append((node.lineno, tuple(e.value for e in node.elts)))
        elif isinstance(node, ast.keyword) and node.arg == "choices" and isinstance(node.value, (ast.Tuple, ast.List)):
            choices.append(node.value.lineno)
    return lists, choices


def test_no_word_list_of_the_vocabulary_is_spelled_elsewhere():
    """A list of settings, recipe families, class sets, precisions, soft-label kinds, schedules or executors written
    out anywhere but the vocabulary (in any order) is a copy that would drift: import it instead."""
    spelled = {frozenset(value): name for name, value in SPELLED_ONCE.items()}
    copies = [f"{path.relative_to(PACKAGE)}:{line} spells {spelled[frozenset(value)]} {value}"
              for path in SOURCES if path.name != "vocabulary.py"
              for line, value in word_lists(path)[0] if frozenset(value) in spelled]
    assert copies == []


def test_no_command_spells_its_choices():
    """Every ``choices=`` of the command line and the experiments names a constant (the vocabulary's, or its owner's
    such as the report's FORMATS), never a literal list."""
    assert [f"{path.relative_to(PACKAGE)}:{line}" for path in SOURCES for line in word_lists(path)[1]] == []


# (module, old name, new home "module:name") of every module-level name that was renamed or moved.
MOVED = [
    ("atlas_fast.engine.config", "SETTINGS", "atlas_fast.vocabulary:SETTINGS"),
    ("atlas_fast.engine.config", "EVALUATION_SETS", "atlas_fast.vocabulary:CLASS_SETS"),
    ("atlas_fast.engine.config", "PRECISIONS", "atlas_fast.vocabulary:PRECISIONS"),
    ("atlas_fast.methods.base", "RECIPE_FAMILIES", "atlas_fast.vocabulary:RECIPE_FAMILIES"),
    ("atlas_fast.methods.coop", "Family", "atlas_fast.vocabulary:RecipeFamily"),
    ("atlas_fast.methods.coop", "Setting", "atlas_fast.vocabulary:Setting"),
    ("atlas_fast.atlas.softlabels", "KINDS", "atlas_fast.vocabulary:SOFT_LABEL_KINDS"),
    ("atlas_fast.atlas.softlabels", "DELTAS", "atlas_fast.vocabulary:DELTAS"),
    ("atlas_fast.atlas.variants", "SOFT_CHOICES", "atlas_fast.vocabulary:SOFT_LABEL_CHOICES"),
    ("atlas_fast.atlas.variants", "SCHEDULE_CHOICES", "atlas_fast.vocabulary:SCHEDULE_CHOICES"),
    ("atlas_fast.cache", "PRECISIONS", "atlas_fast.vocabulary:CACHE_PRECISIONS"),
    ("atlas_fast.data", "SUBSAMPLE_MODES", "atlas_fast.vocabulary:CLASS_SETS"),
    ("atlas_fast.data.datasets", "get_spec", "atlas_fast.data.datasets:dataset_spec"),
    ("atlas_fast.data.datasets", "find_spec", "atlas_fast.data.datasets:find_dataset_spec"),
    ("atlas_fast.data.datasets", "IMAGE_SUFFIXES", "atlas_fast.data.layouts:IMAGE_SUFFIXES"),
    ("atlas_fast.sweep", "Variant", "atlas_fast.atlas.variants:LabelVariant"),
    ("atlas_fast.sweep.grid", "Variant", "atlas_fast.atlas.variants:LabelVariant"),
    ("atlas_fast.engine.record", "record_problems", "atlas_fast.engine.validity:record_problems"),
    ("atlas_fast.experiments.common", "world_method_options", "atlas_fast.app.options:world_method_options"),
    ("atlas_fast.report.tables", "aggregate", "atlas_fast.report.rows:aggregate"),
    ("atlas_fast.report.tables", "markdown_table", "atlas_fast.report.formats:markdown_table"),
    ("atlas_fast.report.tables", "plot_rows", "atlas_fast.report.figures:plot_rows"),
    ("atlas_fast.report.tables", "run_name", "atlas_fast.engine.deviations:run_name"),
]


@pytest.mark.parametrize("module,old,new", MOVED, ids=[f"{m}.{o}" for m, o, _ in MOVED])
def test_an_old_name_still_gives_the_same_object(module, old, new):
    """Renamed or moved: the old name warns, naming the new home, and gives the same object (one definition); a
    module that uses the moved name itself imports it under a private name, so the old one still warns."""
    new_module, _, new_name = new.partition(":")
    owner = importlib.import_module(module)
    assert old not in vars(owner), f"{module}.{old} must warn (issue 44: every alias warns), not be imported back"
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is deprecated; use {new_module}.{new_name}"):
        value = getattr(owner, old)
    assert value is getattr(importlib.import_module(new_module), new_name)


def test_renamed_fields_keep_their_old_names():
    from atlas_fast.engine.config import TrainConfig
    from atlas_fast.report.rows import TableRow

    with pytest.warns(DeprecationWarning, match=r"TrainConfig\(recipe=...\) is deprecated"):
        config = TrainConfig("OxfordPets", "data", recipe="original")
    assert config.recipe_family == "original"
    with pytest.warns(DeprecationWarning, match="TrainConfig.recipe is deprecated; use TrainConfig.recipe_family"):
        assert config.recipe == "original"
    with pytest.warns(DeprecationWarning):
        assert dataclasses.replace(config, recipe="paper").recipe_family == "paper"
    with pytest.raises(ValueError, match="recipe_family must be one of"):
        TrainConfig("OxfordPets", "data", recipe_family="papers")
    # issue 44: the old name and the new one together are refused, naming both (the old one used to win)
    with pytest.raises(TypeError, match=r"TrainConfig got both recipe='paper' \(the old name\) and "
                                        r"recipe_family='original'; give recipe_family only"):
        TrainConfig("OxfordPets", "data", recipe="paper", recipe_family="original")
    with pytest.raises(TypeError, match="got both recipe="):
        TrainConfig("OxfordPets", "data", recipe="paper", recipe_family="paper")  # even when equal
    with pytest.warns(DeprecationWarning, match="TableRow.group is deprecated; use TableRow.section"):
        assert TableRow("x", {}, section="Average").group == "Average"


def test_a_method_declaring_its_recipe_under_the_old_name_still_registers():
    from atlas_fast.methods.base import METHODS, register_method
    from atlas_fast.methods.coop import CoOp, coop_recipe

    class OldStyle(CoOp):
        name = "toy-old-style"
        printed_name = "OldStyle"
        recipe = staticmethod(coop_recipe)

    try:
        with pytest.warns(DeprecationWarning, match="OldStyle declares `recipe`"):
            register_method(OldStyle)
        assert METHODS["toy-old-style"].recipe_function is coop_recipe
    finally:
        METHODS.pop("toy-old-style", None)
    with pytest.warns(DeprecationWarning, match="CoOp.recipe is deprecated; use CoOp.recipe_function"):
        assert CoOp.recipe is coop_recipe
