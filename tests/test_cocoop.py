"""CoCoOp on cached features equals the reference computation (pixels through the image tower, the meta-net on the
normalised feature, then for each image its C 77-token prompts built class by class), in logits and in the
gradients of ctx and of every meta-net tensor; chunked evaluation equals the one-call forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.methods import METHODS
from atlas_fast.methods.config import MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.cocoop import CoCoOp, CoCoOpConfig, cocoop_recipe
from helpers import assert_gradients_close, reference_text_features

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]
LEARNED = ("ctx", "meta_weight1", "meta_bias1", "meta_weight2", "meta_bias2")


def reference_cocoop_logits(backbone, pixels, ctx, w1, b1, w2, b2, classnames, prompt_prefix):
    """CoOp's trainers/cocoop.py CustomCLIP.forward, one image at a time."""
    model = backbone.model
    image_features = F.normalize(model.encode_image(pixels), dim=-1)
    logits = []
    for f in image_features:
        bias = F.linear(F.relu(F.linear(f, w1, b1)), w2, b2)  # meta_net: Linear -> ReLU -> Linear
        text = reference_text_features(backbone, ctx + bias, classnames, prompt_prefix)  # same bias on every token
        logits.append(model.logit_scale.exp() * f @ text.t())
    return torch.stack(logits)


@pytest.mark.parametrize("ctx_init", ["", "a photo of a"])
def test_cached_logits_and_every_gradient_match_the_per_image_full_forward(tiny, ctx_init):
    torch.manual_seed(0)
    method = CoCoOp(tiny, CLASSNAMES, CoCoOpConfig(n_ctx=4 if ctx_init else 3, ctx_init=ctx_init))
    with torch.no_grad():  # a non-trivial meta-net output (PyTorch's init gives small biases)
        method.meta_bias2.add_(0.05 * torch.randn_like(method.meta_bias2))
    pixels = torch.randn(3, 3, 32, 32)
    labels = torch.tensor([0, 3, 1])

    logits = method(tiny.encode_image(pixels))
    F.cross_entropy(logits[0], labels).backward()

    leaves = [getattr(method, name).detach()[0].clone().requires_grad_(True) for name in LEARNED]
    reference = reference_cocoop_logits(tiny, pixels, *leaves, CLASSNAMES, method.prompt_prefix)
    F.cross_entropy(reference, labels).backward()

    assert logits.shape == (1, 3, 4)
    torch.testing.assert_close(logits[0], reference, atol=1e-4, rtol=1e-5)
    for name, leaf in zip(LEARNED, leaves):
        assert_gradients_close(getattr(method, name).grad[0], leaf.grad)


def test_meta_net_shape_follows_the_backbone_and_init_is_pytorch_linear(tiny):
    torch.manual_seed(3)
    method = build_method("cocoop", tiny, CLASSNAMES, CoCoOpConfig(ctx_init="a photo of a"))
    dim, width = tiny.embed_dim, tiny.architecture["text_width"]
    assert method.meta_weight1.shape == (1, dim // 16, dim) and method.meta_weight2.shape == (1, width, dim // 16)
    assert METHODS["cocoop"] is CoCoOp
    torch.manual_seed(3)  # the reference draws ctx (none: init phrase), then linear1, then linear2
    linear1, linear2 = torch.nn.Linear(dim, dim // 16), torch.nn.Linear(dim // 16, width)
    torch.testing.assert_close(method.meta_weight1[0].detach(), linear1.weight.detach())
    torch.testing.assert_close(method.meta_bias2[0].detach(), linear2.bias.detach())
    with pytest.raises(ValueError, match="csc must be False"):
        CoCoOpConfig(csc=True)
    with pytest.raises(ValueError, match="must be 'end'"):
        CoCoOpConfig(class_token_position="front")


def test_chunked_evaluation_equals_one_call_and_is_bounded_by_the_sequence_budget(tiny):
    torch.manual_seed(1)
    method = CoCoOp(tiny, CLASSNAMES, CoCoOpConfig(n_ctx=2))
    features = torch.randn(11, tiny.embed_dim)
    with torch.no_grad():
        whole = method(features)
    calls = []
    original = method.text_encoder.encode_classes
    method.text_encoder.encode_classes = lambda prefix, suffix, *rest: (
        calls.append((*prefix.shape[:2], suffix.shape[0])) or original(prefix, suffix, *rest))
    method.eval_sequences = 9  # 9 // 4 classes = 2 images per text-encoder call
    chunked = method.eval_logits(features)
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    assert calls == [(1, 2, 4)] * 5 + [(1, 1, 4)]  # (R, images, classes) per call


def test_runs_are_independent_and_accept_per_run_batches(tiny):
    torch.manual_seed(2)
    batched = CoCoOp(tiny, CLASSNAMES, CoCoOpConfig(n_ctx=2), runs=2)
    features = torch.randn(2, 3, tiny.embed_dim)  # (R, B, D): each run its own batch
    logits = batched(features)
    assert logits.shape == (2, 3, 4)
    for run in range(2):
        single = CoCoOp(tiny, CLASSNAMES, CoCoOpConfig(n_ctx=2))
        single.load_checkpoint_state({name: getattr(batched, name).detach()[run:run + 1] for name in LEARNED})
        torch.testing.assert_close(single(features[run])[0], logits[run], atol=1e-5, rtol=1e-5)


def test_new_classes_reuse_every_learned_tensor(tiny):
    torch.manual_seed(4)
    method = CoCoOp(tiny, CLASSNAMES, CoCoOpConfig(ctx_init="a photo of a"))
    state = method.state_for_checkpoint()
    assert set(state) == set(LEARNED)
    restored = build_method("cocoop", tiny, ["boxer", "abyssinian"], CoCoOpConfig(ctx_init="a photo of a"))
    restored.load_checkpoint_state(state)
    method.set_classnames(["boxer", "abyssinian"])
    features = torch.randn(4, tiny.embed_dim)
    torch.testing.assert_close(restored(features), method(features))


def test_recipes():
    config, recipe = cocoop_recipe("paper", "base2new", 16, "OxfordPets")
    assert (config.context_length, config.init_words) == (4, "a photo of a")
    assert recipe == OptimRecipe(epochs=10, batch_size=1, lr=0.002)
    assert cocoop_recipe("original", "cross_dataset", 16, "ImageNet") == (config, recipe)
    with pytest.raises(MissingRecipe, match="no 'few_shot' recipe.*epochs, batch size and lr"):
        cocoop_recipe("paper", "few_shot", 4, "DTD")
