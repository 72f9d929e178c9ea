"""One word, one home: the run's vocabulary is spelled once (atlas_fast.vocabulary), and a word that was renamed or
moved has no old spelling left in Python (no alias layer)."""

import ast
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
def word_lists(path: Path) -> tuple[list[tuple[int, tuple[str, ...]]], list[int], list[tuple[int, str]]]:
    """(line, value) of every tuple or list of string constants in a source file, the lines of its literal
    ``choices=`` and (line, flag) of each option it declares with ``add_argument("--flag", ...)`` (parsed once for
    the three tests)."""
    lists, choices, flags = [], [], []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) > 1 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            lists.append((node.lineno, tuple(e.value for e in node.elts)))
        elif isinstance(node, ast.keyword) and node.arg == "choices" and isinstance(node.value, (ast.Tuple, ast.List)):
            choices.append(node.value.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args
              and isinstance(node.args[0], ast.Constant)):
            flags.append((node.lineno, node.args[0].value))
    return lists, choices, flags


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


# (module, old name) of module-level names that were renamed or moved: no alias answers them any more (one name per
# word; the old spelling is an AttributeError, not a second way in).
RETIRED = [
    ("atlas_fast.engine.config", "SETTINGS"), ("atlas_fast.engine.config", "EVALUATION_SETS"),
    ("atlas_fast.engine.config", "PRECISIONS"), ("atlas_fast.methods.base", "RECIPE_FAMILIES"),
    ("atlas_fast.methods.coop", "Family"), ("atlas_fast.methods.coop", "Setting"),
    ("atlas_fast.atlas.softlabels", "KINDS"), ("atlas_fast.atlas.softlabels", "DELTAS"),
    ("atlas_fast.atlas.variants", "SOFT_CHOICES"), ("atlas_fast.atlas.variants", "SCHEDULE_CHOICES"),
    ("atlas_fast.cache", "PRECISIONS"), ("atlas_fast.data", "SUBSAMPLE_MODES"),
    ("atlas_fast.data.datasets", "get_spec"), ("atlas_fast.data.datasets", "find_spec"),
    ("atlas_fast.data.datasets", "IMAGE_SUFFIXES"), ("atlas_fast.sweep", "Variant"),
    ("atlas_fast.sweep.grid", "Variant"), ("atlas_fast.engine.record", "record_problems"),
    ("atlas_fast.experiments.common", "world_method_options"),
    # a printed name is a name, not a label; ATLaS's schedule is Alternating, the --atlas kind a soft_kind
    ("atlas_fast.atlas.variants", "row_label"), ("atlas_fast.atlas.variants", "run_label"),
    ("atlas_fast.atlas.variants", "ablation_row_label"), ("atlas_fast.report.rows", "variant_label"),
    ("atlas_fast.report.rows", "strategy_label"), ("atlas_fast.report.rows", "display_label"),
    ("atlas_fast.report.grouping", "label_records"), ("atlas_fast.atlas.schedules", "Atlas"),
    ("atlas_fast.atlas.variants", "atlas_variant"), ("atlas_fast.atlas.variants", "atlas_variants"),
    ("atlas_fast.atlas.variants", "atlas_period"), ("atlas_fast.atlas.variants", "ATLAS_PERIODS"),
    ("atlas_fast.atlas.softlabels", "atlas_preset"), ("atlas_fast.vocabulary", "SOFT_LABEL_SCHEDULES"),
]


@pytest.mark.parametrize("module,old", RETIRED, ids=[f"{m}.{o}" for m, o in RETIRED])
def test_an_old_name_is_gone(module, old):
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), old)


def test_no_alias_layer_is_left():
    """No module answers old names (no renames module, no report.tables, no DeprecationWarning alias); old field
    names of the dataclasses are unknown keywords and attributes."""
    from atlas_fast.engine.config import TrainConfig
    from atlas_fast.methods.coop import CoOp
    from atlas_fast.report.rows import TableRow

    for module in ("atlas_fast.renames", "atlas_fast.report.tables"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(module)
    assert [path for path in SOURCES if "DeprecationWarning" in path.read_text(encoding="utf-8")] == [
        PACKAGE / "atlas_fast" / "cli" / "__init__.py"]  # which only lists it among the developer warnings it hides
    with pytest.raises(TypeError, match="recipe"):
        TrainConfig("OxfordPets", "data", recipe="original")
    config = TrainConfig("OxfordPets", "data", recipe_family="original")
    assert not hasattr(config, "recipe") and not hasattr(TableRow("x", {}, section="Average"), "group")
    assert not hasattr(TableRow("x", {}), "label")
    assert not hasattr(CoOp, "recipe")
    with pytest.raises(ValueError, match="recipe_family must be one of"):
        TrainConfig("OxfordPets", "data", recipe_family="papers")


# Flags of the tables' spelling that mean something else in one command (not the option of the tables).
OTHER_MEANING = {("experiments/fig3_soft_label_case_study.py", "--top-k"),  # soft-label entries drawn per row
                 ("atlas_fast/cli/report.py", "--methods")}  # a filter of the records found (any spelling found)


def test_each_option_is_declared_once():
    """The label-schedule and execution options and ``--methods`` are declared in app/options.py alone; a command
    that offers one adds it from there (the ATLaS flags were written again in ``train``, ``--atlas`` in
    ``search``, ``--batch-runs`` and ``--estimate`` in ``train`` and the experiments, with two helps). The rule that
    pairs a schedule with soft labels is written once, too (the command line, the variants and the config each
    checked it)."""
    from atlas_fast.app.options import EXECUTION_OPTIONS, LABEL_OPTIONS

    owned = {flag for table in (LABEL_OPTIONS, EXECUTION_OPTIONS) for flags, _ in table.values() for flag in flags}
    owned.add("--methods")
    where = {path: path.relative_to(PACKAGE).as_posix() for path in SOURCES}
    assert [f"{where[path]}:{line} {flag}" for path in SOURCES for line, flag in word_lists(path)[2]
            if flag in owned and where[path] != "atlas_fast/app/options.py"
            and (where[path], flag) not in OTHER_MEANING] == []
    rule = [path.name for path in SOURCES if "trains on soft labels" in path.read_text(encoding="utf-8")]
    assert rule == ["schedules.py"]
