"""CLIP-LoRA equals a literal re-implementation of its official code (loralib/layers.py's PlainMultiheadAttentionLoRA
with LinearLoRA q/k/v(/o) projections, sequence-first, 77-token prompts of "a photo of a {}.", the image tower run
block by block, logits 100 cos, CE) in token ids, logits, the loss and the gradient of every adapter, at the
initialisation (B = 0: CLIP's own logits, no gradient for A) and at a moved point, with adapters on both towers, on
one, and on the output projection; the dropout sits on each adapter's input only; the cached path (clip-lora-text)
equals the pixel path with the text tower adapted. Negative controls (LoRA's usual α / r scaling, dropout on the
frozen path, the adapters of another block) are caught at the same tolerance."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.methods.config import OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.clip_lora import (CLIPLoRA, CLIPLoRAConfig, CLIPLoRAText, CLIPLoRATextConfig, adapted_blocks,
                                          clip_lora_recipe)
from helpers import cross_entropy_criterion
from equivalence import assert_caught, assert_equivalent, assert_gradient_equivalent, report_ratios
from helpers import pixel_test_logits

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: extra threads only contend

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]


@pytest.fixture(scope="module")
def world_random():
    """The world CLIP's shapes (2 heads per tower, 4 blocks) with random weights."""
    return load_backbone(BackboneConfig("atlas-world", None))


class ReferenceLoRA:
    """The official adapters of one tower: per adapted block, LinearLoRA q/k/v/o around the block's own weights.
    ``a``/``b``: {block index: (targets, r, w) / (targets, w, r)}; ``wrong``: one detail changed (negative control)."""

    def __init__(self, a, b, targets, alpha, rank, dropout, training, wrong=""):
        self.a, self.b, self.targets = a, b, targets
        self.scaling = alpha / (rank if wrong == "alpha/r" else math.sqrt(rank))
        self.dropout, self.training, self.wrong = dropout, training, wrong

    def linear(self, x, weight, bias, block, letter):
        """LinearLoRA.forward with dropout: W x + b + (dropout(x) @ (B A)^T) * scaling; a projection without an
        adapter is the block's plain Linear."""
        if block not in self.a or letter not in self.targets:
            return F.linear(x, weight, bias)
        x_lora = F.dropout(x, self.dropout, self.training) if self.training and self.dropout > 0 else x
        if self.wrong == "dropout on W x":
            x = x_lora
        j = self.targets.index(letter)
        return F.linear(x, weight, bias) + x_lora @ (self.b[block][j] @ self.a[block][j]).t() * self.scaling

    def attention(self, attn, x, attn_mask, block):
        """PlainMultiheadAttentionLoRA.forward_module (sequence-first, scaled_dot_product_attention)."""
        tgt_len, bsz, embed_dim = x.shape
        heads = attn.num_heads
        head_dim = embed_dim // heads
        w, bias = attn.in_proj_weight, attn.in_proj_bias
        q, k, v = (self.linear(x, w[i * embed_dim:(i + 1) * embed_dim], bias[i * embed_dim:(i + 1) * embed_dim],
                               block, letter) for i, letter in enumerate("qkv"))
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0).unsqueeze(0)
        q, k, v = (t.view(tgt_len, bsz * heads, head_dim).transpose(0, 1).reshape(bsz, heads, tgt_len, head_dim)
                   for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, 0.0, False)
        out = out.permute(2, 0, 1, 3).contiguous().view(bsz * tgt_len, embed_dim)
        out = self.linear(out, attn.out_proj.weight, attn.out_proj.bias, block, "o")
        return out.view(tgt_len, bsz, embed_dim)

    def tower(self, transformer, x, attn_mask):
        """The residual blocks over sequence-first states, adapted ones through :meth:`attention`."""
        for i, block in enumerate(transformer.resblocks):
            h = block.ln_1(x)
            if i in self.a:
                x = x + self.attention(block.attn, h, attn_mask, i)
            else:  # CLIP's own attention (open_clip's modules are batch-first)
                h = h.transpose(0, 1)
                x = x + block.attn(h, h, h, need_weights=False, attn_mask=attn_mask)[0].transpose(0, 1)
            x = x + block.mlp(block.ln_2(x))
        return x


def reference_lora(backbone, method, pixels, labels, wrong="", tower_wrong=None):
    """The official run_lora step in fp32 (text and image features as lora.py computes them): returns (token ids,
    logits, CE loss, leaves {parameter name: tensor of run 0})."""
    model, config = backbone.model, method.config
    p = {name: t.detach()[0].clone().requires_grad_(True) for name, t in method.named_parameters()}
    adapters = {}
    for tower in ("text", "vision"):
        if f"{tower}_lora_a" in p:
            blocks = method.blocks[tower]
            if wrong == "other block" and tower == tower_wrong:
                blocks = blocks[1:] + blocks[:1]
            adapters[tower] = ReferenceLoRA({i: p[f"{tower}_lora_a"][j] for j, i in enumerate(blocks)},
                                            {i: p[f"{tower}_lora_b"][j] for j, i in enumerate(blocks)},
                                            config.targets, config.alpha, config.rank, config.dropout,
                                            method.training, wrong)
    none = ReferenceLoRA({}, {}, "", 1.0, 1, 0.0, False)
    ids = backbone.tokenizer([config.template.format(c.replace("_", " ")) for c in CLASSNAMES])
    x = (model.token_embedding(ids) + model.positional_embedding).permute(1, 0, 2)
    x = adapters.get("text", none).tower(model.transformer, x, model.attn_mask).permute(1, 0, 2)
    text = model.ln_final(x)[torch.arange(len(ids)), ids.argmax(dim=-1)] @ model.text_projection
    visual = model.visual
    v = visual.conv1(pixels)
    v = v.reshape(v.shape[0], v.shape[1], -1).permute(0, 2, 1)
    v = torch.cat([visual.class_embedding.view(1, 1, -1).expand(v.shape[0], -1, -1), v], dim=1)
    v = visual.ln_pre(v + visual.positional_embedding).permute(1, 0, 2)
    v = adapters.get("vision", none).tower(visual.transformer, v, None).permute(1, 0, 2)
    image = visual.ln_post(v[:, 0]) @ visual.proj
    logits = 100 * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).t()
    return ids, logits, F.cross_entropy(logits, labels), p


def move(method, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in method.named_parameters():
            param.add_(0.3 * torch.randn_like(param) if name.endswith("_b") else 0.05 * torch.randn_like(param))


def check(backbone, config, prefix, moved, pixels, labels):
    torch.manual_seed(0)
    method = CLIPLoRA(backbone, CLASSNAMES, config).eval()
    if moved:
        move(method)
    logits = method(pixels)
    loss = F.cross_entropy(logits[0], labels)
    loss.backward()
    ids, ref_logits, ref_loss, p = reference_lora(backbone, method, pixels, labels)
    ref_loss.backward()
    assert torch.equal(method.token_ids.cpu(), ids)
    assert_equivalent(f"{prefix} logits", logits[0], ref_logits, atol=2e-4)
    assert_equivalent(f"{prefix} CE", loss, ref_loss)
    for name, param in method.named_parameters():
        assert_gradient_equivalent(f"{prefix} grad {name}", param.grad[0], p[name].grad)
        if not moved and name.endswith("_a"):
            assert param.grad.abs().max() == 0  # B = 0 at init: nothing reaches A
    if moved:
        with torch.no_grad():
            tower = config.towers[0]
            assert_caught("alpha/r", logits[0], reference_lora(backbone, method, pixels, labels, "alpha/r")[1], 2e-4)
            assert_caught("other block", logits[0],
                          reference_lora(backbone, method, pixels, labels, "other block", tower)[1], 2e-4)
    else:  # at init the adapted towers are CLIP's own
        zero_shot = 100 * F.normalize(backbone.encode_image(pixels), dim=-1) @ F.normalize(
            backbone.encode_text([config.template.format(c.replace("_", " ")) for c in CLASSNAMES]), dim=-1).t()
        assert_equivalent(f"{prefix} logits at init = zero-shot", logits[0], zero_shot, atol=2e-4)


@pytest.mark.parametrize("encoder,targets,moved", [
    ("both", "qkv", False), ("both", "qkv", True), ("text", "qkvo", True), ("vision", "vo", False),
    pytest.param("text", "qkvo", False, marks=pytest.mark.slow), pytest.param("vision", "vo", True,
                                                                             marks=pytest.mark.slow)])
def test_logits_loss_and_every_gradient_match_the_official_code(tiny, encoder, targets, moved):
    config = CLIPLoRAConfig(encoder=encoder, targets=targets)
    check(tiny, config, f"CLIP-LoRA tiny {encoder}/{targets}", moved, torch.randn(4, 3, 32, 32),
          torch.tensor([0, 3, 1, 2]))


def test_several_heads_and_a_block_subset_match_the_official_code(world_random):
    config = CLIPLoRAConfig(position="half-up", targets="qkvo", rank=3, alpha=2.0)
    check(world_random, config, "CLIP-LoRA world-shaped half-up", True, torch.randn(3, 3, 32, 32),
          torch.tensor([1, 0, 2]))
    print("\n" + report_ratios("CLIP-LoRA"))


def test_dropout_acts_on_each_adapters_input_only(tiny, monkeypatch):
    """With a deterministic stand-in for dropout (a different scaling per call, so that q, k and v must each take
    their own), training mode equals the reference's; dropout on the frozen path as well is caught."""
    calls = []

    def fake_dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        calls.append(p)
        return x * (1.0 + 0.1 * (len(calls) % 3)) / (1 - p)

    monkeypatch.setattr(torch.nn.functional, "dropout", fake_dropout)
    torch.manual_seed(0)
    method = CLIPLoRA(tiny, CLASSNAMES, CLIPLoRAConfig(encoder="text"))
    move(method)
    method.train()
    pixels, labels = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    calls.clear()
    logits = method(pixels)
    ours = len(calls)
    calls.clear()
    reference = reference_lora(tiny, method, pixels, labels)[1]
    assert ours == len(calls) == 3 * 2  # q, k and v of both text blocks, once each
    assert_equivalent("CLIP-LoRA tiny dropout placement", logits[0], reference, atol=2e-4)
    calls.clear()
    assert_caught("dropout on W x", logits[0], reference_lora(tiny, method, pixels, labels, "dropout on W x")[1], 2e-4)
    method.eval()
    calls.clear()
    method(pixels)
    assert not calls  # no dropout at test time


def test_the_cached_path_equals_the_pixel_path(tiny):
    """clip-lora-text on cached features = clip-lora with the text tower adapted on the same pixels."""
    torch.manual_seed(0)
    cached = CLIPLoRAText(tiny, CLASSNAMES, CLIPLoRATextConfig(dropout=0.0))
    pixel = CLIPLoRA(tiny, CLASSNAMES, CLIPLoRAConfig(encoder="text", dropout=0.0))
    move(cached)
    pixel.load_checkpoint_state(cached.state_for_checkpoint())
    pixels, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    loss = cached.training_loss(tiny.encode_image(pixels), labels, cross_entropy_criterion(labels))
    reference = pixel.training_loss(pixels, labels, cross_entropy_criterion(labels))
    (loss + reference).backward()
    assert_equivalent("CLIP-LoRA cached vs pixel loss", loss, reference)
    for (name, a), (_, b) in zip(cached.named_parameters(), pixel.named_parameters()):
        assert_gradient_equivalent(f"CLIP-LoRA cached vs pixel grad {name}", a.grad[0], b.grad[0])
    features = tiny.encode_image(pixels)
    torch.testing.assert_close(cached.eval_logits(features), pixel_test_logits(pixel, pixels),
                               atol=1e-4, rtol=1e-5)
    assert not CLIPLoRAText.reads_pixels and CLIPLoRA.reads_pixels


def test_initialisation_runs_and_class_sets(tiny):
    torch.manual_seed(3)
    method = build_method("clip-lora", tiny, CLASSNAMES, CLIPLoRAConfig(), runs=2)
    a = method.text_lora_a.detach()
    assert a.shape == (2, 2, 3, 2, 64) and a.abs().max() <= 64 ** -0.5 and a.std() > 0.05
    assert method.text_lora_b.abs().max() == 0 and not torch.equal(a[0], a[1])
    move(method)
    pixels = torch.randn(3, 3, 32, 32)
    logits = method.eval()(pixels)
    state = method.state_for_checkpoint()
    assert set(state) == {"text_lora_a", "text_lora_b", "vision_lora_a", "vision_lora_b"}
    for run in range(2):
        single = build_method("clip-lora", tiny, ["x"], CLIPLoRAConfig())
        single.load_checkpoint_state({k: v[run:run + 1] for k, v in state.items()})
        single.set_classnames(CLASSNAMES)
        torch.testing.assert_close(single.eval()(pixels)[0], logits[run], atol=1e-4, rtol=1e-5)


def test_recipe_and_config():
    config, recipe = clip_lora_recipe("paper", "few_shot", 4, "ImageNet")
    assert (config.encoder, config.position, config.targets, config.rank, config.alpha, config.dropout) == (
        "both", "all", "qkv", 2, 1.0, 0.25)
    assert (config.template, config.logit_scale, config.scaling) == ("a photo of a {}.", 100.0, 1 / math.sqrt(2))
    assert recipe == OptimRecipe(epochs=1, batch_size=32, lr=2e-4, weight_decay=1e-2, warmup_epochs=0,
                                 optimizer="adamw", iterations=2000, min_lr=1e-6)
    assert clip_lora_recipe("original", "base2new", 16, "DTD")[1].iterations == 8000
    # the iterations set the epochs once the training images are known (the last partial batch is a step)
    assert recipe.for_training_images(1000).epochs == 63 and recipe.for_training_images(64).epochs == 1000
    assert recipe.for_training_images(100, epochs=3).iterations == 12
    assert adapted_blocks("up", 12) == [8, 9, 10, 11] and adapted_blocks("half-bottom", 4) == [0, 1]
    with pytest.raises(ValueError, match="12-block tower"):
        adapted_blocks("top3", 4)
    for bad, match in ((dict(targets="qx"), "letters"), (dict(encoder="image"), "encoder"), (dict(rank=0), "rank"),
                       (dict(dropout=1.0), "dropout"), (dict(position="top"), "position")):
        with pytest.raises(ValueError, match=match):
            CLIPLoRAConfig(**bad)
    with pytest.raises(ValueError, match="text tower only"):
        CLIPLoRATextConfig(encoder="both")


@pytest.mark.slow
@pytest.mark.parametrize("encoder", ["both"])
def test_vit_b16_shapes_match_the_official_code(encoder):
    backbone = load_backbone(BackboneConfig("ViT-B-16", None))
    for moved in (False, True):
        check(backbone, CLIPLoRAConfig(encoder=encoder), f"CLIP-LoRA ViT-B/16 {encoder}", moved,
              torch.randn(2, 3, 224, 224), torch.tensor([1, 2]))
    print("\n" + report_ratios("CLIP-LoRA ViT-B/16"))
