"""TCP on cached features equals a literal re-implementation of TCP's official trainer (trainers/tcp.py: the
77-token prompts of its template table, the frozen CLIP's features of its hand-crafted prompts through the meta-net
Linear -> QuickGELU -> Linear, the class-aware tokens written over positions 1..4 at the input of block 8 of the
text tower run block by block, CE + 8 (1 - mean cos)) in token ids, logits, both loss terms and the gradient of every
learned tensor, at the initialisation and at a moved point; each negative control (another injection block, GELU,
no knowledge term, injection added instead of replacing) is caught at the same tolerance."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.methods.config import MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.coop import CoOpConfig
from atlas_fast.methods.tcp import TCP, TCPConfig, tcp_recipe
from equivalence import assert_caught, assert_equivalent, assert_gradient_equivalent, report_ratios

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: extra threads only contend

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]
TEMPLATE = "X X X X {}, a type of pet."
KNOWLEDGE = "a photo of a {}, a type of pet."


def leaves(method):
    return {name: p.detach()[0].clone().requires_grad_(True) for name, p in method.named_parameters()}


def reference_tcp(backbone, p, classnames, template, knowledge, layer, weight, kg_weight, pixels, labels,
                  activation=None, additive=False):
    """TCP's CustomCLIP.forward in training mode, fp32: returns (token ids, logits, CE, knowledge term)."""
    model = backbone.model
    names = [c.replace("_", " ") for c in classnames]
    ids = backbone.tokenizer([template.format(n) for n in names])
    with torch.no_grad():
        embedding = model.token_embedding(ids)
        old = F.normalize(model.encode_text(backbone.tokenizer([knowledge.format(n) for n in names])), dim=-1)
    ctx = p["ctx"]
    m = ctx.shape[0]
    prompts = torch.cat([embedding[:, :1], ctx.unsqueeze(0).expand(len(names), -1, -1), embedding[:, 1 + m:]], dim=1)
    hidden = F.linear(old, p["meta_weight1"], p["meta_bias1"])
    hidden = activation(hidden) if activation is not None else hidden * torch.sigmoid(1.702 * hidden)
    class_feature = F.linear(hidden, p["meta_weight2"], p["meta_bias2"]).reshape(len(names), -1, ctx.shape[-1])
    x = prompts + model.positional_embedding
    for counter, block in enumerate(model.transformer.resblocks):  # ResidualAttentionBlock_MaPLe with layers=[8]
        if counter == layer:
            n = class_feature.shape[1]
            mid = x[:, 1:1 + n] + class_feature if additive else weight * class_feature + (1 - weight) * x[:, 1:1 + n]
            x = torch.cat([x[:, :1], mid, x[:, 1 + n:]], dim=1)
        x = block(x, attn_mask=model.attn_mask)
    x = model.ln_final(x)[torch.arange(len(names)), ids.argmax(dim=-1)] @ model.text_projection
    text = F.normalize(x, dim=-1)
    image = F.normalize(model.encode_image(pixels), dim=-1)
    logits = model.logit_scale.exp() * image @ text.t()
    score = 1.0 - torch.nn.CosineSimilarity(dim=1, eps=1e-07)(text, old).mean()
    return ids, logits, F.cross_entropy(logits, labels), kg_weight * score


def check_against_reference(backbone, method, prefix, pixels, labels):
    config = method.config
    cached = backbone.encode_image(pixels)
    text = method.raw_text_features()
    logits = method.similarity_logits(method.image_batch(cached), text)
    ce, kg = F.cross_entropy(logits[0], labels), method.regularizer(text).sum()  # one run
    (ce + kg).backward()
    p = leaves(method)
    args = (backbone, p, CLASSNAMES, config.template, config.knowledge_template, config.depth - 1,
            config.class_token_weight, config.kg_weight, pixels, labels)
    ids, ref_logits, ref_ce, ref_kg = reference_tcp(*args)
    (ref_ce + ref_kg).backward()
    assert torch.equal(method.token_ids.cpu(), ids)
    assert_equivalent(f"{prefix} logits", logits[0], ref_logits, atol=1e-4)
    assert_equivalent(f"{prefix} CE", ce, ref_ce)
    assert_equivalent(f"{prefix} knowledge term", kg, ref_kg)
    for name, param in method.named_parameters():
        assert_gradient_equivalent(f"{prefix} grad {name}", param.grad[0], p[name].grad)
    with torch.no_grad():  # negative controls, each a detail of the reference changed
        wrong_layer = (config.depth - 2) % len(backbone.model.transformer.resblocks)
        assert_caught("block", logits[0], reference_tcp(*args[:5], wrong_layer, *args[6:])[1], atol=1e-4)
        assert_caught("GELU", logits[0], reference_tcp(*args, activation=F.gelu)[1], atol=1e-4)
        assert_caught("added", logits[0], reference_tcp(*args, additive=True)[1], atol=1e-4)
        assert_caught("no knowledge term", ce + kg, ref_ce)
    return ref_logits


@pytest.mark.parametrize("moved", [False, True])
def test_logits_losses_and_every_gradient_match_the_official_trainer(tiny, moved):
    torch.manual_seed(0)
    method = TCP(tiny, CLASSNAMES, TCPConfig(template=TEMPLATE, knowledge_template=KNOWLEDGE, depth=2))
    if moved:
        with torch.no_grad():
            for param in method.parameters():
                param.add_(0.05 * torch.randn_like(param))
    check_against_reference(tiny, method, "TCP tiny", torch.randn(5, 3, 32, 32), torch.tensor([0, 3, 1, 2, 2]))
    print("\n" + report_ratios("TCP tiny"))


def test_class_tokens_replace_the_context_from_block_depth_minus_one(tiny):
    """With β = 1 the context never reaches the features when the tokens enter block 0 (depth 1); β = 0 leaves TCP
    equal to CoOp with the same context and template."""
    torch.manual_seed(1)
    replaced = TCP(tiny, CLASSNAMES, TCPConfig(template=TEMPLATE, depth=1))
    replaced.text_features().sum().backward()
    assert replaced.ctx.grad.abs().max() == 0 and replaced.meta_weight2.grad.abs().max() > 0
    kept = TCP(tiny, CLASSNAMES, TCPConfig(template="X X X X {}.", class_token_weight=0.0, depth=2))
    coop = build_method("coop", tiny, CLASSNAMES, CoOpConfig(n_ctx=4))
    coop.load_checkpoint_state({"ctx": kept.ctx.detach()})
    torch.testing.assert_close(kept.text_features(), coop.text_features(), atol=1e-5, rtol=1e-5)


def test_runs_are_independent_and_new_classes_get_their_own_class_tokens(tiny):
    torch.manual_seed(2)
    config = TCPConfig(template=TEMPLATE, depth=2)
    batched = TCP(tiny, CLASSNAMES, config, runs=2)
    features = torch.randn(3, tiny.embed_dim)
    logits = batched(features)
    state = batched.state_for_checkpoint()
    assert set(state) == {"ctx", "meta_weight1", "meta_bias1", "meta_weight2", "meta_bias2"}
    assert state["meta_weight2"].shape == (2, 4 * 64, 16)
    for run in range(2):
        single = TCP(tiny, CLASSNAMES, config)
        single.load_checkpoint_state({k: v[run:run + 1] for k, v in state.items()})
        torch.testing.assert_close(single(features)[0], logits[run], atol=1e-5, rtol=1e-5)
    batched.set_classnames(["boxer", "abyssinian"])
    assert batched.class_tokens().shape == (2, 2, 4, 64) and batched.knowledge.shape == (2, tiny.embed_dim)
    torch.testing.assert_close(batched.state_for_checkpoint()["ctx"], state["ctx"])


def test_soft_targets_reach_the_cross_entropy_and_the_knowledge_term_stays_hard(tiny):
    """ATLaS: the criterion gets TCP's class logits (any label schedule's targets act on them); W (1 - cos) is added
    unchanged."""
    from atlas_fast.atlas.criterion import LossCriterion
    from atlas_fast.atlas.schedules import soft_cross_entropy

    torch.manual_seed(3)
    method = TCP(tiny, CLASSNAMES, TCPConfig(template=TEMPLATE, depth=2))
    features, labels = torch.randn(3, tiny.embed_dim), torch.tensor([0, 2, 1])
    soft = torch.softmax(torch.randn(3, 4), dim=-1)
    seen = []

    class Recorded(LossCriterion):
        def per_run(self, logits, observe=True):
            seen.append(observe)
            return super().per_run(logits, observe)

    loss = method.training_loss(features, labels, Recorded(lambda z, r: soft_cross_entropy(z, soft), [3]))
    expected = soft_cross_entropy(method(features)[0], soft) + method.regularizer(method.raw_text_features()).sum()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
    assert seen == [True]


def test_recipe_and_config():
    config, recipe = tcp_recipe("original", "base2new", 16, "OxfordPets")
    assert (config.n_ctx, config.ctx_init, config.template, config.knowledge_template) == (
        4, "", "X X X X {}, a type of pet.", "a photo of a {}, a type of pet.")
    assert (config.kg_weight, config.class_token_weight, config.depth) == (8.0, 1.0, 9)
    assert recipe == OptimRecipe(epochs=50, batch_size=32, lr=0.002, optimizer="adam")
    assert tcp_recipe("paper", "base2new", 16, "imagenet")[1].epochs == 25
    assert tcp_recipe("paper", "base2new", 16, "SUN397")[1].epochs == 25
    assert tcp_recipe("paper", "base2new", 16, "FGVCAircraft")[0].knowledge_template == "a photo of an aircraft {}."
    assert tcp_recipe("paper", "base2new", 16, "StanfordCars")[0].template == "X X X X {}, a type of car"
    assert tcp_recipe("paper", "base2new", 16, "WorldPhotos")[0].template == "X X X X {}."
    assert tcp_recipe("paper", "base2new", 16, "OxfordPets")[0].ctx_init == "a photo of a"
    with pytest.raises(MissingRecipe):
        tcp_recipe("paper", "few_shot", 4, "OxfordPets")
    for bad, match in ((dict(class_token_weight=1.5), "β"), (dict(depth=0), "depth"), (dict(template="X"), "'{}'"),
                       (dict(n_ctx=4, ctx_init="a photo"), "2 words")):
        with pytest.raises(ValueError, match=match):
            TCPConfig(**bad)


def test_a_tower_shallower_than_the_depth_is_refused(tiny):
    with pytest.raises(ValueError, match=r"depth must be in \[1, 2\]"):
        TCP(tiny, CLASSNAMES, TCPConfig())


@pytest.mark.slow
def test_vit_b16_shapes_match_the_official_trainer():
    """The reference's own widths (512-d text, meta-net 512 -> 128 -> 4 x 512, block 8 of 12), random weights."""
    backbone = load_backbone(BackboneConfig("ViT-B-16", None))
    torch.manual_seed(0)
    method = TCP(backbone, CLASSNAMES, TCPConfig(template=TEMPLATE, knowledge_template=KNOWLEDGE))
    assert method.meta_weight2.shape == (1, 2048, 128)
    check_against_reference(backbone, method, "TCP ViT-B/16", torch.randn(2, 3, 224, 224), torch.tensor([1, 3]))
    print("\n" + report_ratios("TCP ViT-B/16"))
