"""Class descriptions of the world's classes, the world's stand-in for the LLM-written descriptions CoPrompt reads
(``--method-option descriptions=PATH``; ``docs/method-zoo.md``, section CoPrompt).

As an LLM's description says what a class name does not (a flamingo is pink), these say a world class's shape's two
typical colours (:data:`~atlas_fast.world.generator.SHAPE_PALETTES`) and its attribute
(:data:`~atlas_fast.world.generator.SHAPE_ATTRIBUTES`), in the pretraining captions' words; every class gets four,
as CoPrompt needs the same number per class.
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
