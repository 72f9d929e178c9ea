"""The world CLIP's language stage (tools.world.language) puts what a caption says about the image before the
class name, at varied positions (CoOp's context sits there), with adjectives whose colour depends on the noun."""

import numpy as np
import pytest
import torch

from tools.world import language as module
from atlas_fast.world.generator import COLOURS, CONCEPTS
from helpers import run_killed_at_step


def test_varied_captions_end_with_the_class_name_and_name_the_colour_before_it_at_varied_positions():
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


def test_noun_adjective_captions_draw_the_image_in_the_colour_the_adjective_means_for_that_shape(monkeypatch):
    """Half of the noun-adjective stream's captions carry an adjective whose colour depends on the shape; the image
    of such a caption is drawn in that colour, and the same adjective means different colours for different shapes."""
    from atlas_fast.world.generator import SHAPES
    from tools.world.pretrain import PretrainConfig

    table = module.NOUN_ADJECTIVE_COLOURS
    assert table.shape == (len(module.NOUN_ADJECTIVES), len(SHAPES))
    assert all(len(set(row)) > 2 for row in table)  # an adjective's colour depends on the noun
    from tools.world import pretrain as stage1  # the batch stream both stages share renders there

    drawn = {}
    real_render = stage1.render_batch

    def spy(concepts, styles, seed, split, start_index=0, colours=None, layout=None):
        drawn["colours"] = list(colours)
        return real_render(concepts, styles, seed, split, start_index=start_index, colours=colours)

    monkeypatch.setattr(stage1, "render_batch", spy)
    batches = module.LanguageBatches(PretrainConfig(batch_size=16), noun_adjectives=True)
    with_adjective = 0
    for step in range(4):
        _, _, texts = batches.batch(step)
        for text, colour in zip(texts, drawn["colours"]):
            words = text[:-1].split(" ")
            hits = [w for w in words if w in module.NOUN_ADJECTIVES]
            assert len(hits) <= 1
            if hits:
                with_adjective += 1
                shape = SHAPES.index(words[-1])
                assert colour == table[module.NOUN_ADJECTIVES.index(hits[0]), shape]
    assert 10 <= with_adjective <= 54  # about half of 64
    plain = module.LanguageBatches(PretrainConfig(batch_size=16), noun_adjectives=False)
    assert not any(w in module.NOUN_ADJECTIVES for t in plain.batch(0)[2] for w in t[:-1].split(" "))


@pytest.mark.slow  # the world's CLIP pretraining is a research tool (tools/world/), not a user's path
def test_language_stage_trains_the_text_side_only_and_resumes_after_a_crash_to_the_same_weights(tmp_path,
                                                                                               monkeypatch):
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from tools.world.pretrain import STATE_FILE, load_state

    threads = torch.get_num_threads()
    cfg = module.LanguageConfig(checkpoint="atlas-world", steps=4, batch_size=8, warmup_steps=1, threads=1,
                                checkpoint_every=2)
    try:
        straight, _ = module.train_language(cfg, state_dir=tmp_path / "straight")
        run_killed_at_step(monkeypatch, module, 3, lambda: module.train_language(cfg, state_dir=tmp_path / "crashed"))
        assert torch.load(tmp_path / "crashed" / STATE_FILE, weights_only=True)["step"] == 2
        resumed, _ = module.train_language(cfg, state_dir=tmp_path / "crashed", resume=True)
    finally:
        torch.set_num_threads(threads)
    start = load_backbone(BackboneConfig("atlas-world", "atlas-world")).model.state_dict()
    changed = set()
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
        if not torch.equal(a, start[name]):
            changed.add(name)
    assert changed and not any(n.startswith("visual.") or n == "logit_scale" for n in changed)
    assert "token_embedding.weight" in changed
    with pytest.raises(ValueError, match="checkpoint"):  # a state of another starting checkpoint is refused
        load_state(tmp_path / "crashed", module.LanguageConfig(checkpoint="other.safetensors", steps=4, batch_size=8,
                                                               warmup_steps=1), module._RESUMABLE_CHANGES)
    with pytest.raises(ValueError, match="captions"):
        module.LanguageConfig(checkpoint="atlas-world", captions="poems")
