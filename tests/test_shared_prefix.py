"""The fast text and vision paths equal the plain ones: fused attention blocks equal open_clip's blocks, and the
shared-prefix text pass (prefix once per prompt set, class suffixes packed and grouped by length) gives every
method the logits and gradients of the plain pass (open_clip's own blocks over every assembled prompt)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from open_clip.transformer import Transformer

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.cocoop import CoCoOpConfig
from atlas_fast.methods.coop import CoOpConfig
from atlas_fast.methods.dept import DePTCoCoOpConfig, DePTCoOpConfig, DePTKgCoOpConfig, DePTMaPLeConfig
from atlas_fast.methods.ivlp import IVLPConfig
from atlas_fast.methods.kgcoop import KgCoOpConfig
from atlas_fast.methods.maple import MaPLeConfig
from atlas_fast.methods.promptsrc import PromptSRCConfig
from atlas_fast.clip.prompted_towers import fused_attention_supported, run_blocks
from atlas_fast.clip.text_encoder import PromptTextEncoder, length_groups
from helpers import cross_entropy_criterion

pytestmark = pytest.mark.usefixtures("one_thread")
# suffix lengths (class tokens + "." + EOT) from 3 to 7, so there are several length groups
CLASSES = ["cat", "great_crested_newt", "sea lion", "american pit bull terrier", "dog", "newt", "abyssinian"]
TEMPLATE = "a photo of a {}, a type of pet."


def encoders(method):
    base = getattr(method, "base", method)
    return getattr(base, "text_encoder", None), getattr(base, "image_encoder", None)


def set_paths(method, mode):
    """'plain': open_clip's blocks over every prompt; 'shared': shared prefix, one padded group; 'grouped': shared
    prefix and length groups (the default)."""
    text, image = encoders(method)
    text.fused_attention = text.shared_prefix = mode != "plain"
    text.length_groups = mode == "grouped"
    if image is not None:
        image.fused_attention = mode != "plain"


def randomize(method, seed=1):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in method.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return method


def loss_and_grads(method, inputs, labels, mode):
    set_paths(method, mode)
    method.zero_grad()
    loss = method.training_loss(inputs, labels, cross_entropy_criterion(labels, runs=method.num_runs))
    loss.sum().backward()
    with torch.no_grad():
        logits = method(inputs)
    return logits, loss.detach(), {n: p.grad.clone() for n, p in method.named_parameters() if p.grad is not None}


def assert_same(actual, expected):
    (logits_a, loss_a, grads_a), (logits_e, loss_e, grads_e) = actual, expected
    torch.testing.assert_close(logits_a, logits_e, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(loss_a, loss_e, atol=2e-5, rtol=1e-5)
    assert set(grads_a) == set(grads_e) and grads_e
    for name, grad in grads_e.items():
        scale = grad.abs().max()
        assert scale > 0, name
        torch.testing.assert_close(grads_a[name] / scale, grad / scale, atol=2e-5, rtol=0, msg=name)


FEATURE_METHODS = [("coop", CoOpConfig(n_ctx=4)), ("coop", CoOpConfig(ctx_init="a photo of a")),
                   ("cocoop", CoCoOpConfig(ctx_init="a photo of a")),
                   ("kgcoop", KgCoOpConfig(ctx_init="a photo of a", template=TEMPLATE)),
                   ("dept-coop", DePTCoOpConfig(n_ctx=3)), ("dept-cocoop", DePTCoCoOpConfig(n_ctx=2)),
                   ("dept-kgcoop", DePTKgCoOpConfig(ctx_init="a photo of a", kg_weight=2.0, template=TEMPLATE))]
PIXEL_METHODS = [("ivlp", IVLPConfig(n_ctx_text=2, n_ctx_vision=3, depth_text=2, depth_vision=2)),
                 ("maple", MaPLeConfig(n_ctx=2, depth=2)),
                 ("promptsrc", PromptSRCConfig(depth_text=2, depth_vision=2)),
                 ("dept-maple", DePTMaPLeConfig(n_ctx=2, depth=2))]


@pytest.mark.parametrize("runs", [1, 2])
@pytest.mark.parametrize("name,config", FEATURE_METHODS + PIXEL_METHODS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(FEATURE_METHODS + PIXEL_METHODS)])
def test_every_method_gets_the_plain_logits_losses_and_gradients(tiny, name, config, runs):
    torch.manual_seed(0)
    method = randomize(build_method(name, tiny, CLASSES, config, runs))
    labels = torch.tensor([0, 3, 6, 1, 2])
    if not method.reads_pixels:
        inputs = torch.randn(runs, 5, tiny.embed_dim) if runs > 1 and name != "kgcoop" else torch.randn(5, tiny.embed_dim)
    else:
        inputs = torch.randn(5, 3, 32, 32)
    plain = loss_and_grads(method, inputs, labels, "plain")
    calls = []
    text, _ = encoders(method)
    original = text._shared_prefix_pass
    text._shared_prefix_pass = lambda *args: calls.append(1) or original(*args)
    for mode in ("shared", "grouped"):
        assert_same(loss_and_grads(method, inputs, labels, mode), plain)
    assert calls  # the shared-prefix pass did run


def test_shared_prefix_is_exact_in_float64():
    """In float64 the shared-prefix pass agrees with open_clip's blocks to rounding: it is the same function."""
    backbone = load_backbone(BackboneConfig("atlas-tiny", None))
    backbone.model.double()
    for name, config in (("coop", CoOpConfig(ctx_init="a photo of a")),
                         ("ivlp", IVLPConfig(n_ctx_text=2, depth_text=2, depth_vision=0))):
        torch.manual_seed(0)
        method = randomize(build_method(name, backbone, CLASSES, config, runs=2)).double()
        results = []
        for mode in ("plain", "grouped"):
            set_paths(method, mode)
            method.zero_grad()
            features = method.raw_text_features()
            (features * torch.randn(features.shape, generator=torch.Generator().manual_seed(3),
                                    dtype=features.dtype)).sum().backward()
            results.append((features.detach(), method.ctx.grad.clone()))
        torch.testing.assert_close(results[0][0], results[1][0], atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(results[0][1], results[1][1], atol=1e-12, rtol=1e-12)


def test_multi_head_model_and_fixed_words_in_the_prefix():
    """A 2-head text tower (atlas-world) and an IVLP phrase whose unlearned words join the shared prefix."""
    world = load_backbone(BackboneConfig("atlas-world", None))
    torch.manual_seed(0)
    method = randomize(build_method("maple", world, CLASSES, MaPLeConfig(n_ctx=2, depth=3), runs=2))
    assert method.class_prompts.shared_words == 2  # "of a" after the learned "a photo"
    labels = torch.tensor([0, 3, 6, 1])
    pixels = torch.randn(4, 3, 32, 32)
    assert_same(loss_and_grads(method, pixels, labels, "grouped"), loss_and_grads(method, pixels, labels, "plain"))


def test_fallbacks_keep_the_plain_pass(tiny):
    """Class-specific context and other class positions assemble every prompt; so does a tower with a hooked block
    (the hook sees the plain pass) and an encoder subclass that redefines forward."""
    for config in (CoOpConfig(n_ctx=3, csc=True), CoOpConfig(n_ctx=3, class_token_position="middle")):
        method = build_method("coop", tiny, CLASSES, config)
        method.text_encoder.encode_classes = lambda *args: pytest.fail("shared prefix used")
        method.text_features()
    method = build_method("coop", tiny, CLASSES, CoOpConfig(n_ctx=3))
    assert method.text_encoder.shares_prefix()
    seen = []
    handle = tiny.model.transformer.resblocks[1].register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
    try:
        assert not method.text_encoder.shares_prefix()
        method.text_features()
    finally:
        handle.remove()
    assert seen == [(1 * len(CLASSES), int(method.eot_index.max()) + 1, 64)]

    class Mine(PromptTextEncoder):
        def forward(self, prompt_embeddings, eot_index, deep_prompts=()):
            return super().forward(prompt_embeddings, eot_index, deep_prompts)

    assert not Mine(tiny).shares_prefix()


def test_length_groups():
    lengths = [3, 5, 3, 7, 4, 5]
    assert length_groups(lengths, None) == [([0, 1, 2, 3, 4, 5], 7)]
    assert length_groups(lengths, 0.0) == [([0, 2], 3), ([4], 4), ([1, 5], 5), ([3], 7)]  # free groups: exact
    assert length_groups(lengths, 1e6) == [([0, 1, 2, 3, 4, 5], 7)]  # dear groups: one
    # a group saves 2 classes x 2 padded positions = 4 > 3: split there, but not for one padded position
    assert length_groups([1, 1, 3, 4], 3.0) == [([0, 1], 1), ([2, 3], 4)]


@pytest.mark.parametrize("layer_scale", [None, 0.3])
@pytest.mark.parametrize("causal", [True, False])
def test_fused_blocks_equal_open_clips_blocks_in_outputs_and_gradients(layer_scale, causal):
    torch.manual_seed(0)
    tower = Transformer(width=64, layers=2, heads=4, ls_init_value=layer_scale)
    assert all(fused_attention_supported(block) for block in tower.resblocks)
    mask = torch.full((9, 9), float("-inf")).triu(1) if causal else None
    x = torch.randn(3, 9, 64)
    deep = [torch.randn(3, 2, 64)]
    for pooled in (None, torch.tensor([8, 3, 5])):  # every row, or one row per sequence (the last block pooled)
        results = []
        for fused in (False, True):
            tower.zero_grad()
            inputs = x.clone().requires_grad_(True)
            out = run_blocks(tower, inputs, mask, deep, "text", fused=fused, pooled_rows=pooled)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            results.append([out.detach(), inputs.grad] + [p.grad.clone() for p in tower.parameters()])
        assert results[0][0].shape == ((3, 9, 64) if pooled is None else (3, 64))
        for actual, expected in zip(results[1], results[0]):
            scale = expected.abs().max()
            torch.testing.assert_close(actual / scale, expected / scale, atol=1e-5, rtol=0)


def test_fused_blocks_are_used_and_unsupported_blocks_run_their_own_forward(monkeypatch):
    torch.manual_seed(0)
    tower = Transformer(width=32, layers=2, heads=2)
    x = torch.randn(2, 5, 32)
    reference = run_blocks(tower, x, None, [], "vision", fused=False)
    monkeypatch.setattr(torch.nn.MultiheadAttention, "forward", lambda *a, **k: pytest.fail("module attention ran"))
    torch.testing.assert_close(run_blocks(tower, x, None, [], "vision"), reference, atol=1e-6, rtol=1e-6)
    monkeypatch.undo()
    custom = Transformer(width=32, layers=2, heads=2, scale_attn=True)  # open_clip's CustomResidualAttentionBlock
    assert not fused_attention_supported(custom.resblocks[0])
    torch.testing.assert_close(run_blocks(custom, x, None, [], "vision"), custom(x), atol=0, rtol=0)


@pytest.mark.parametrize("name, config", [("coop", CoOpConfig(n_ctx=4, ctx_init="a photo of a")),
                                          ("coop", CoOpConfig(n_ctx=3, csc=True)),
                                          ("cocoop", CoCoOpConfig())], ids=["shared-prefix", "plain", "cocoop"])
def test_a_step_reads_no_values_back_from_the_device_after_the_first(tiny, monkeypatch, name, config):
    """A class set's EOT positions and packing are read to the host once: later passes read nothing back (on a GPU
    every such read waits for the device and forbids capturing the step in a CUDA graph)."""
    from atlas_fast.methods.registry import build_method

    method = build_method(name, tiny, ["cat", "great crested newt", "dog", "sea lion"], config)
    features = torch.randn(3, tiny.embed_dim)
    first = method(features)
    reads = []
    for attribute in ("tolist", "item", "__int__", "__bool__"):
        original = getattr(torch.Tensor, attribute)
        monkeypatch.setattr(torch.Tensor, attribute,
                            lambda self, *a, _name=attribute, _original=original: reads.append(_name) or
                            _original(self, *a))
    second = method(features)
    monkeypatch.undo()
    assert reads == [], f"host reads in a later pass: {reads}"
    torch.testing.assert_close(first, second)
