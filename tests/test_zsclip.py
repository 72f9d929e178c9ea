"""Zero-shot CLIP as a method: CLIP's own encode_image / encode_text on the template, nothing learned."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.engine.evaluate import EvalSet, evaluate_method, zero_shot_accuracy
from atlas_fast.methods.config import OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.zsclip import ZeroShotConfig, zsclip_recipe

CLASSNAMES = ["cat", "great_crested_newt", "dog"]


def test_logits_are_clip_on_the_template_and_match_the_zero_shot_reference(tiny):
    method = build_method("zsclip", tiny, CLASSNAMES, ZeroShotConfig(template="a photo of a {}, a type of pet."))
    assert method.trainable_parameters() == [] and method.state_for_checkpoint() == {}
    pixels = torch.randn(6, 3, 32, 32)
    model = tiny.model
    with torch.no_grad():
        text = F.normalize(model.encode_text(tiny.tokenizer(
            ["a photo of a cat, a type of pet.", "a photo of a great crested newt, a type of pet.",
             "a photo of a dog, a type of pet."])), dim=-1)
        image = F.normalize(model.encode_image(pixels), dim=-1)
        reference = model.logit_scale.exp() * image @ text.t()
        features = tiny.encode_image(pixels)
        torch.testing.assert_close(method(features)[0], reference, atol=1e-4, rtol=1e-5)
    labels = reference.argmax(-1).roll(1)
    eval_set = EvalSet("all", tuple(CLASSNAMES), features, labels)
    accuracy = evaluate_method(method, [eval_set])["all"][0]
    assert accuracy == pytest.approx(zero_shot_accuracy(tiny, eval_set, "a photo of a {}, a type of pet."))


def test_recipe_uses_coops_zero_shot_template():
    config, recipe = zsclip_recipe("paper", "few_shot", 1, "DescribableTextures")
    assert config.template == "{} texture." and recipe == OptimRecipe(epochs=1, batch_size=32, lr=0.002)
    with pytest.raises(ValueError, match="one '{}'"):
        ZeroShotConfig(template="a photo")
