"""KgCoOp on cached features equals the reference (full image tower, 77-token prompts class by class, w_c from CLIP's
encode_text of the template, CE + W * (1 - mean cos) with CosineSimilarity(eps=1e-7)) in loss and ctx gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.methods.config import MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.kgcoop import KgCoOp, KgCoOpConfig, kgcoop_recipe
from helpers import assert_gradients_close, cross_entropy_criterion, reference_text_features

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]
TEMPLATE = "a photo of a {}, a type of pet."


def reference_kg_loss(backbone, pixels, labels, ctx, classnames, prompt_prefix, template, weight):
    """DePT/KgCoOp trainers/kgcoop.py CustomCLIP.forward + forward_backward (fp32)."""
    model = backbone.model
    image = F.normalize(model.encode_image(pixels), dim=-1)
    text = reference_text_features(backbone, ctx, classnames, prompt_prefix)
    logits = model.logit_scale.exp() * image @ text.t()
    with torch.no_grad():
        ids = backbone.tokenizer([template.format(c.replace("_", " ")) for c in classnames])
        old = F.normalize(model.encode_text(ids), dim=-1)
    score = 1.0 - torch.nn.CosineSimilarity(dim=1, eps=1e-07)(text, old).mean()
    return logits, F.cross_entropy(logits, labels) + weight * score


@pytest.mark.parametrize("weight", [8.0, 2.0])
def test_loss_and_ctx_gradient_match_the_full_forward(tiny, weight):
    torch.manual_seed(0)
    method = KgCoOp(tiny, CLASSNAMES, KgCoOpConfig(ctx_init="a photo of a", kg_weight=weight, template=TEMPLATE))
    with torch.no_grad():  # move away from the init phrase so the cosine term has a gradient
        method.ctx.add_(0.05 * torch.randn_like(method.ctx))
    pixels = torch.randn(5, 3, 32, 32)
    labels = torch.tensor([0, 3, 1, 2, 2])

    loss = method.training_loss(tiny.encode_image(pixels), labels, cross_entropy_criterion(labels)).sum()
    loss.backward()
    ctx = method.ctx.detach()[0].clone().requires_grad_(True)
    logits, reference = reference_kg_loss(tiny, pixels, labels, ctx, CLASSNAMES, method.prompt_prefix, TEMPLATE,
                                          weight)
    reference.backward()

    torch.testing.assert_close(method(tiny.encode_image(pixels))[0], logits, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)
    assert_gradients_close(method.ctx.grad[0], ctx.grad)
    assert loss > F.cross_entropy(logits, labels) + 1e-6  # the knowledge term is really there


def test_targets_follow_the_class_set_and_the_term_vanishes_at_the_template(tiny):
    # ctx = "a photo of a" and the template "a photo of a {}." give t_c = w_c: the KG term is 0
    method = build_method("kgcoop", tiny, CLASSNAMES, KgCoOpConfig(ctx_init="a photo of a"))
    text = method.raw_text_features()
    assert float(method.regularizer(text).detach()) == pytest.approx(0.0, abs=1e-5)
    method.set_classnames(["boxer", "abyssinian"])
    assert method.hand_crafted_features().shape == (2, tiny.embed_dim)
    assert [name for name, _ in method.named_parameters()] == ["ctx"]


def test_config_validation_and_recipes():
    with pytest.raises(ValueError, match="kg_weight"):
        KgCoOpConfig(kg_weight=-1.0)
    with pytest.raises(ValueError, match="one '{}'"):
        KgCoOpConfig(template="a photo")
    config, recipe = kgcoop_recipe("original", "base2new", 16, "DescribableTextures")
    assert (config.kg_weight, config.context_length, config.template) == (
        8.0, 4, "a photo of a {}, a type of texture.")
    assert recipe == OptimRecipe(epochs=100, batch_size=128, lr=0.002)
    xd_config, xd = kgcoop_recipe("paper", "cross_dataset", 16, "ImageNet")
    assert (xd_config.kg_weight, xd.epochs, xd.batch_size, xd.lr) == (2.0, 10, 4, 0.0035)
    with pytest.raises(MissingRecipe):
        kgcoop_recipe("paper", "few_shot", 16, "ImageNet")
