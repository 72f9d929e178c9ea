"""Class descriptions of the world's classes, the world's stand-in for the LLM-written descriptions CoPrompt reads
(``--method-option descriptions=PATH``; ``docs/method-zoo.md``, section CoPrompt).

An LLM asked to describe a flamingo says what its name does not: it is pink, it stands on one leg. The world's
counterpart says what a world class name does not: its shape's two typical colours (the colours a benchmark draws it
in, :data:`~atlas_fast.world.generator.SHAPE_PALETTES`) and what its shape has in common with others (its attribute,
:data:`~atlas_fast.world.generator.SHAPE_ATTRIBUTES`), in the words of the world CLIP's pretraining captions. Every
class gets the same four descriptions, as CoPrompt needs the same number per class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from atlas_fast.files import atomic_write
from atlas_fast.world.generator import COLOURS, SHAPE_ATTRIBUTES, SHAPE_PALETTES, concept_id


def class_descriptions(classname: str) -> list[str]:
    """Four descriptions of a world class ("striped square"): each of its two typical colours, without and with its
    shape's attribute."""
    concept_id(classname)  # an unknown class is an error naming the valid words
    texture, shape = classname.split(" ")
    attribute = SHAPE_ATTRIBUTES[shape]
    colours = [COLOURS[i][0] for i in SHAPE_PALETTES[shape]]
    return ([f"a photo of a {colour} {texture} {shape}." for colour in colours]
            + [f"a photo of a {colour} {texture} {shape}, {attribute}." for colour in colours])


def write_descriptions(folder: Path, datasets: Sequence[str]) -> Path:
    """``<folder>/<dataset>.json`` ({class name: [descriptions]}) for each world dataset; returns the folder (what
    ``descriptions=FOLDER`` reads, one file per dataset)."""
    from atlas_fast.world.benchmark import WORLD_BY_NAME

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in datasets:
        table = {classname: class_descriptions(classname) for classname in WORLD_BY_NAME[name].classnames}
        data = json.dumps(table, indent=1).encode()
        atomic_write(folder / f"{name}.json", lambda f, data=data: f.write(data))
    return folder
