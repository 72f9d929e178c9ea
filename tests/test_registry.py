"""A method is one class: a text-side method defined and registered in one place (here, this file) trains
lone and batched, is offered by the command line, printed by the report and depth-adjusted on the world, with no
other file touched."""

import re
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run, run_group
from atlas_fast.app.catalogue import method_names
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, OptimRecipe
from atlas_fast.methods.registry import METHODS, method_class, register_method
from helpers import small_pets

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class ShiftConfig(MethodConfig):
    template: str = "a photo of a {}."
    depth: int = 2  # no meaning for this method: shows how a prompt-depth option is declared


def shift_recipe(family: str, setting: str, shots: int, dataset: str):
    return ShiftConfig(), OptimRecipe(epochs=3, batch_size=4, lr=0.5)


class TextShift(PromptMethod):
    """A toy text method: the zero-shot class text features plus one learned shift per run."""

    name = "toy-shift"
    printed_name = "TextShift"
    recipe_function = staticmethod(shift_recipe)
    config_class = ShiftConfig
    supports_batched_runs = True
    depth_options = ("depth",)

    def __init__(self, backbone, classnames, config: ShiftConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.shift = nn.Parameter(torch.zeros(self.num_runs, 1, backbone.embed_dim))
        self.set_classnames(classnames)

    def set_classnames(self, classnames) -> None:
        self.classnames = tuple(classnames)
        with torch.no_grad():
            text = self.backbone.encode_text([self.config.template.format(c) for c in classnames]).float()
        self.register_buffer("zero_shot_text", F.normalize(text, dim=-1).to(self.shift.device), persistent=False)

    def text_features(self) -> torch.Tensor:
        return self.zero_shot_text.unsqueeze(0) + self.shift


@pytest.fixture(scope="module")
def toy_method():
    entry = register_method(TextShift)
    yield entry
    METHODS.pop(TextShift.name)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_pets(tmp_path_factory, "registry")


def config(data, results, seed=1):
    return TrainConfig("OxfordPets", data / "data", BackboneConfig("atlas-tiny", None), method="toy-shift", shots=3,
                       seed=seed, device="cpu", cache_root=data / "cache", results_dir=data / results,
                       progress=False)


def test_a_registered_method_trains_alone_and_batched(toy_method, data):
    assert method_class("toy-shift") is toy_method is TextShift and "toy-shift" in method_names(learning_only=True)
    alone = [run(config(data, "alone", seed)) for seed in (1, 2)]
    assert all(not r["skipped"] for r in alone)
    assert alone[0]["config"]["method_config"] == {"num_runs": 1, "template": "a photo of a {}.", "depth": 2}
    assert alone[0]["epochs"][-1]["loss"] < alone[0]["epochs"][0]["loss"]  # the shift learns
    batched = run_group([config(data, "batched", seed) for seed in (1, 2)])
    assert [r["timings"]["batch_runs"] for r in batched] == [2, 2]
    for b, a in zip(batched, alone):
        assert b["key"] == a["key"]
        assert b["metrics"]["base"] == pytest.approx(a["metrics"]["base"], abs=1e-5)
    assert run(config(data, "alone"))["skipped"]


def test_the_command_line_report_and_world_derive_from_the_entry(toy_method, data, capsys):
    from atlas_fast.cli import main
    from atlas_fast.report.rows import method_name
    from atlas_fast.app.options import world_method_options

    status = main(["train", "--method", "toy-shift", "--dataset", "OxfordPets", "--data-root", str(data / "data"),
                   "--model", "atlas-tiny", "--pretrained", "none", "--shots", "3", "--device", "cpu",
                   "--cache-root", str(data / "cache"), "--results-dir", str(data / "cli"), "--no-progress"])
    assert status == 0 and re.search(r"OxfordPets toy-shift( \[[^\]]*\])? seed 1: base", capsys.readouterr().out)
    assert method_name("toy-shift") == "TextShift"
    assert "toy-shift:depth=4" in world_method_options() and "maple:depth=4" in world_method_options()


def test_registration_checks_the_class():
    class Deeper(TextShift):
        name = "toy-deeper"
        printed_name = "Deeper"
        recipe_function = staticmethod(shift_recipe)
        depth_options = ("layers",)

    class Unnamed(TextShift):  # would register under its base's name, recipe and printed name
        depth_options = ()

    class PixelsByHand(TextShift):  # reads pixels without the pixel contract (no pixel_classifier for the engine)
        name = "toy-pixels"
        printed_name = "PixelsByHand"
        recipe_function = staticmethod(shift_recipe)
        reads_pixels = True

    with pytest.raises(ValueError, match="depth options \\['layers'\\] are not fields of ShiftConfig"):
        register_method(Deeper)
    with pytest.raises(ValueError, match="Unnamed must declare name, printed_name, recipe_function itself"):
        register_method(Unnamed)
    with pytest.raises(ValueError, match="PixelsByHand must read pixels exactly when it derives from PixelMethod"):
        register_method(PixelsByHand)
    assert "toy-deeper" not in METHODS and "toy-pixels" not in METHODS
    with pytest.raises(ValueError, match="Unknown prompt method 'nope'; known: .*coop"):
        method_class("nope")


def test_the_static_method_catalogue_agrees_with_the_registry():
    """The command line reads method names from the method files without importing torch; that reading must give
    exactly the registry's shipped methods."""
    import atlas_fast.methods  # noqa: F401  (registers every shipped method)
    from atlas_fast.app.catalogue import declared_methods

    shipped = {name: cls.learns for name, cls in METHODS.items() if cls.__module__.startswith("atlas_fast.methods.")}
    assert declared_methods() == dict(sorted(shipped.items()))
    assert set(method_names(learning_only=True)) >= {name for name, learns in shipped.items() if learns}


def test_train_help_names_every_pixel_method_as_the_registry_declares_it(capsys):
    """``atlas-fast train --help`` says which methods train on pixels from the catalogue, which follows inherited
    class attributes as Python does (CoPrompt's reads_pixels is IVLP's through MaPLe): a hand list there named 4 of
    the 11 (no MMRL, CoPrompt, PromptKD, CLIP-LoRA or KDPL's pixel hosts)."""
    import atlas_fast.methods  # noqa: F401  (registers every shipped method)
    from atlas_fast.app.catalogue import pixel_method_names
    from atlas_fast.cli import main

    pixels = sorted(name for name, cls in METHODS.items()
                    if cls.__module__.startswith("atlas_fast.methods.") and cls.reads_pixels)
    assert pixel_method_names() == pixels and {"coprompt", "mmrl++", "promptkd", "kdpl-maple"} <= set(pixels)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{', '.join(pixels)} prompt or adapt the image encoder and train on pixels" in text.replace("- ", "-")


def test_capability_tests_cover_every_registered_method_that_declares_it(monkeypatch):
    """The batched and pixel-path tests take their methods from the registry (tests/registry_cases.py): a newly
    registered method that batches on pixels is a case at once, in the slow suite when its file already has one in
    the default run, in the default run when its file is new."""
    from atlas_fast.methods.registry import METHODS
    from atlas_fast.methods.maple import MaPLe
    from registry_cases import batches_pixels, cases, reads_pixels

    def names(params, slow):
        return [p.values[0] for p in params if any(m.name == "slow" for m in p.marks) == slow]

    assert names(cases(reads_pixels), False) + names(cases(reads_pixels), True) != []
    assert set(names(cases(batches_pixels), False)) >= {"ivlp", "maple", "promptsrc"}
    assert "dept-maple" in names(cases(batches_pixels), False) and "mmrl++" in names(cases(batches_pixels), True)
    sibling = type("MaPLeSibling", (MaPLe,), {"name": "maple-sibling", "__module__": MaPLe.__module__})
    elsewhere = type("Elsewhere", (MaPLe,), {"name": "elsewhere", "__module__": "plugin.elsewhere"})
    monkeypatch.setitem(METHODS, "maple-sibling", sibling)
    monkeypatch.setitem(METHODS, "elsewhere", elsewhere)
    assert "maple-sibling" in names(cases(batches_pixels), True)
    assert "elsewhere" in names(cases(batches_pixels), False)
