"""The text fine-tune probe (benchmarks/world_text_finetune.py) puts what it says about the image before the class
name, at varied positions (the point of the probe: CoOp's context sits there)."""

import importlib.util
from pathlib import Path

import numpy as np

from atlas_fast.world.generator import COLOURS, CONCEPTS


def _module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "world_text_finetune.py"
    spec = importlib.util.spec_from_file_location("world_text_finetune", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_varied_captions_end_with_the_class_name_and_name_the_colour_before_it_at_varied_positions():
    module = _module()
    rng = np.random.default_rng(0)
    positions = set()
    for i in range(400):
        concept, colour = i % len(CONCEPTS), i % len(COLOURS)
        text = module.varied_caption(concept, colour, rng)
        assert text.endswith(f" {CONCEPTS[concept]}.") or text == f"{CONCEPTS[concept]}."
        words = text[:-1].split(" ")
        if COLOURS[colour][0] in words:
            positions.add(words.index(COLOURS[colour][0]))
            assert words.index(COLOURS[colour][0]) < len(words) - 2
    assert {0, 1, 2, 3, 4}.issubset(positions)  # the colour word is not always at one place
