"""CoOp on cached features equals the reference computation (pixels through the image tower, 77-token prompts built
class by class as CoOp's PromptLearner does), in logits and in the gradient of the context."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.methods import METHODS
from atlas_fast.methods.config import OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.cocoop import CoCoOpConfig
from atlas_fast.methods.coop import CoOp, CoOpConfig, coop_recipe
from atlas_fast.methods.dept import DePTCoOpConfig, DePTKgCoOpConfig
from atlas_fast.methods.ivlp import IVLPConfig
from atlas_fast.methods.kgcoop import KgCoOpConfig
from helpers import reference_text_features

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]


@pytest.mark.parametrize("position,csc", [("end", False), ("middle", False), ("front", False), ("end", True)])
def test_cached_feature_logits_and_ctx_gradients_match_full_forward(tiny, position, csc):
    torch.manual_seed(0)
    method = CoOp(tiny, CLASSNAMES, CoOpConfig(n_ctx=4, csc=csc, class_token_position=position))
    pixels = torch.randn(6, 3, 32, 32)
    labels = torch.tensor([0, 1, 2, 3, 1, 2])

    logits = method(tiny.encode_image(pixels))
    F.cross_entropy(logits[0], labels).backward()

    ctx = method.ctx.detach()[0].clone().requires_grad_(True)
    image_features = F.normalize(tiny.model.encode_image(pixels), dim=-1)
    text_features = reference_text_features(tiny, ctx, CLASSNAMES, method.prompt_prefix, position)
    reference = tiny.model.logit_scale.exp() * image_features @ text_features.t()
    F.cross_entropy(reference, labels).backward()

    assert logits.shape == (1, 6, 4)
    torch.testing.assert_close(logits[0], reference, atol=1e-4, rtol=1e-5)
    scale = ctx.grad.abs().max()
    assert scale > 0
    torch.testing.assert_close(method.ctx.grad[0] / scale, ctx.grad / scale, atol=1e-5, rtol=0)


@pytest.mark.parametrize("position,template", [("end", "a photo of a {}."), ("middle", "a photo {} of a."),
                                               ("front", "{} a photo of a.")])
def test_init_phrase_sets_m_and_embeddings_and_positions(tiny, position, template):
    method = build_method("coop", tiny, CLASSNAMES, CoOpConfig(ctx_init="a_photo of a",
                                                               class_token_position=position))
    assert method.n_ctx == 4 and method.ctx.shape == (1, 4, tiny.architecture["text_width"])
    expected_ctx = tiny.model.token_embedding(tiny.tokenizer(["a photo of a"]))[0, 1:5]
    torch.testing.assert_close(method.ctx[0].detach(), expected_ctx)
    # at init the learned prompt *is* the phrase, so CoOp's text features are CLIP's for the literal strings
    literal = [template.format(n.replace("_", " ")) for n in CLASSNAMES]
    torch.testing.assert_close(method.text_features()[0], F.normalize(tiny.encode_text(literal), dim=-1),
                               atol=1e-5, rtol=1e-5)


def test_runs_are_independent_models(tiny):
    torch.manual_seed(1)
    batched = CoOp(tiny, CLASSNAMES, CoOpConfig(n_ctx=3), runs=2)
    features = torch.randn(5, tiny.embed_dim)
    logits = batched(features)
    assert logits.shape == (2, 5, 4)
    for run in range(2):
        single = CoOp(tiny, CLASSNAMES, CoOpConfig(n_ctx=3))
        single.load_checkpoint_state({"ctx": batched.ctx.detach()[run:run + 1]})
        torch.testing.assert_close(single(features)[0], logits[run], atol=1e-5, rtol=1e-5)
    assert not torch.equal(batched.ctx[0], batched.ctx[1])


def test_csc_shapes_and_class_set_guard(tiny):
    method = CoOp(tiny, CLASSNAMES, CoOpConfig(n_ctx=5, csc=True), runs=3)
    width = tiny.architecture["text_width"]
    assert method.ctx.shape == (3, 4, 5, width)
    assert method.text_features().shape == (3, 4, tiny.embed_dim)
    assert sum(p.numel() for p in method.trainable_parameters()) == 3 * 4 * 5 * width
    method.set_classnames(["a", "b", "c", "d"])  # same count is fine
    with pytest.raises(ValueError, match="built for 4 classes and cannot be used for 2"):
        method.set_classnames(["a", "b"])
    with pytest.raises(ValueError, match="csc=True needs random init"):
        CoOpConfig(csc=True, ctx_init="a photo of a")


def test_new_class_set_keeps_ctx_and_checkpoints_hold_only_ctx(tiny):
    torch.manual_seed(2)
    method = CoOp(tiny, CLASSNAMES, CoOpConfig(n_ctx=4))
    with torch.no_grad():
        method.ctx.add_(torch.randn_like(method.ctx))  # pretend it was trained
    before = method.ctx.detach().clone()
    new = ["boxer", "american_pit_bull_terrier", "abyssinian"]
    method.set_classnames(new)
    assert torch.equal(method.ctx.detach(), before)
    reference = reference_text_features(tiny, before[0], new, method.prompt_prefix, "end")
    torch.testing.assert_close(method.text_features()[0], reference, atol=1e-5, rtol=1e-5)

    state = method.state_for_checkpoint()
    assert set(state) == {"ctx"}
    restored = build_method("coop", tiny, ["x", "y"], CoOpConfig(n_ctx=4))
    restored.load_checkpoint_state(state)
    restored.set_classnames(new)
    torch.testing.assert_close(restored.text_features(), method.text_features())
    with pytest.raises(ValueError, match="has shape"):
        build_method("coop", tiny, new, CoOpConfig(n_ctx=16)).load_checkpoint_state(state)


def test_frozen_clip_is_not_part_of_the_method(tiny):
    method = CoOp(tiny, CLASSNAMES, CoOpConfig(n_ctx=2))
    assert [name for name, _ in method.named_parameters()] == ["ctx"]
    assert METHODS["coop"] is CoOp and not CoOp.reads_pixels
    with pytest.raises(ValueError, match=r"\(B, 64\)"):
        method(torch.randn(2, 3, 32, 32))


def test_recipes_follow_the_protocol():
    config, recipe = coop_recipe("paper", "base2new", 16, "OxfordPets")
    assert config.context_length == 4 and config.init_words == "a photo of a"
    assert recipe == OptimRecipe(epochs=200, batch_size=32, lr=0.002, momentum=0.9, weight_decay=5e-4,
                                 warmup_epochs=1, warmup_lr=1e-5, scheduler="cosine")
    assert coop_recipe("paper", "base2new", 16, "ImageNet")[1].epochs == 50
    assert [coop_recipe("paper", "few_shot", k, "DTD")[1].epochs for k in (1, 2, 4, 8, 16)] == [50, 100, 100, 200, 200]
    assert coop_recipe("original", "few_shot", 8, "ImageNet")[1].epochs == 50
    original, _ = coop_recipe("original", "few_shot", 4, "EuroSAT")
    assert (original.context_length, original.init_words, original.csc) == (16, "", False)
    assert coop_recipe("paper", "few_shot", 2, "EuroSAT")[0].context_length == 4
    assert coop_recipe("original", "cross_dataset", 16, "ImageNet")[1].epochs == 50
    with pytest.raises(ValueError, match=r"K in \[1, 2, 4, 8, 16\]"):
        coop_recipe("paper", "few_shot", 3, "DTD")
    with pytest.raises(ValueError, match="'paper' or 'original'"):
        coop_recipe("mine", "few_shot", 1, "DTD")


def test_n_ctx_that_the_init_phrase_would_override_is_refused():
    """The reference learns one token per init word whatever n_ctx says; a config claiming otherwise is refused."""
    assert CoOpConfig(ctx_init="a photo of a").n_ctx == 4  # resolved, so records state the real M
    assert CoOpConfig(n_ctx=4, ctx_init="a photo of a").n_ctx == 4
    assert CoOpConfig().n_ctx == 16 and CoOpConfig(n_ctx=8).n_ctx == 8
    for config_class in (CoOpConfig, CoCoOpConfig, KgCoOpConfig, DePTCoOpConfig, DePTKgCoOpConfig):
        with pytest.raises(ValueError, match=r"n_ctx=8 cannot take effect.*4 tokens would be learned.*ctx_init=''"):
            config_class(n_ctx=8, ctx_init="a photo of a")
    with pytest.raises(ValueError, match="n_ctx must be >= 1"):
        CoOpConfig(n_ctx=0)


def test_class_prompts_longer_than_the_context_are_refused_by_name(tiny):
    """open_clip's tokenizer cuts a long prompt at the context length, so two long names that differ only after the
    cut would be encoded identically; building the prompts refuses it and names the class."""
    long_a, long_b = "very " * 80 + "long cat", "very " * 80 + "long dog"
    ids = tiny.tokenizer([f"a photo of a {long_a}.", f"a photo of a {long_b}."])
    assert torch.equal(ids[0], ids[1])  # what would happen silently
    for name, config in (("coop", CoOpConfig(n_ctx=4)), ("cocoop", CoCoOpConfig(ctx_init="a photo of a")),
                         ("ivlp", IVLPConfig(depth_text=1, depth_vision=0))):
        with pytest.raises(ValueError, match=r"class 'very very.*long dog'.*does not fit.*77 tokens"):
            build_method(name, tiny, ["cat", long_b], config)
    method = build_method("coop", tiny, ["cat"], CoOpConfig(n_ctx=4))
    with pytest.raises(ValueError, match="long cat"):
        method.set_classnames(["dog", long_a])
    # a prompt of exactly the context length fits
    fits = " ".join(["cat"] * (77 - 2 - 4 - 1))
    assert int(build_method("coop", tiny, [fits], CoOpConfig(n_ctx=4)).eot_index[0]) == 76


def test_zero_shot_prompts_longer_than_the_context_are_refused(tiny):
    with pytest.raises(ValueError, match=r"the text 'a photo of a very.*does not fit"):
        tiny.encode_text(["a photo of a cat.", "a photo of a " + "very " * 80 + "long cat."])
    assert tiny.encode_text(["a photo of a cat."]).shape == (1, tiny.embed_dim)
