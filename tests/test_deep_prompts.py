"""Structural checks of the deep-prompt methods (IVLP, MaPLe, PromptSRC): they fail if a prompt is injected in the
wrong place, gets a positional embedding, is added instead of replacing, or if gradients reach the frozen CLIP."""

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.methods.config import MissingRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.coop import CoOpConfig
from atlas_fast.methods.dept import dept_maple_recipe
from atlas_fast.methods.ivlp import IVLPConfig, ivlp_recipe
from atlas_fast.methods.maple import MaPLeConfig, maple_recipe
from atlas_fast.methods.promptsrc import PromptSRCConfig, gpa_weights, promptsrc_recipe
from atlas_fast.clip.prompted_towers import PromptedVisionEncoder
from helpers import cross_entropy_criterion

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES = ["cat", "sea_lion", "golden retriever dog"]
TINY_IVLP = IVLPConfig(n_ctx_text=2, n_ctx_vision=3, depth_text=2, depth_vision=2)


def pixels(n=4, size=32, seed=0):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def randomize(method, seed=1):
    """Random values in every learned tensor (the tests must not pass by prompts being zero or equal)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in method.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return method


def test_unprompted_vision_tower_is_clip(tiny):
    x = pixels()
    torch.testing.assert_close(PromptedVisionEncoder(tiny)(x)[0], tiny.encode_image(x), rtol=0, atol=0)


def test_ivlp_without_vision_prompts_and_deep_text_equals_cached_coop(tiny):
    """IVLP with vision depth 0 and text depth 1 is CoOp with the same context: its logits from pixels equal CoOp's
    logits from the cached (frozen) image features of those pixels."""
    torch.manual_seed(0)
    coop = build_method("coop", tiny, CLASSES, CoOpConfig(ctx_init="a photo of a"))
    ivlp = build_method("ivlp", tiny, CLASSES, IVLPConfig(n_ctx_text=4, depth_text=1, depth_vision=0))
    torch.testing.assert_close(ivlp.ctx, coop.ctx)  # same init rule when all the init words are learnable
    randomize(ivlp)
    with torch.no_grad():
        coop.ctx.copy_(ivlp.ctx)
    x = pixels()
    expected = coop(tiny.encode_image(x))
    torch.testing.assert_close(ivlp(x), expected, rtol=0, atol=1e-6)  # CoOp normalises its text twice: 1 ulp
    assert [n for n, _ in ivlp.named_parameters()] == ["ctx"]


def test_ivlp_keeps_the_unlearned_init_words_as_fixed_text(tiny):
    """M = 2 of "a photo of a": ctx = embeddings of "a photo", and "of a" stays in the prompt as fixed tokens."""
    ivlp = build_method("ivlp", tiny, ["cat"], IVLPConfig(n_ctx_text=2, depth_text=1, depth_vision=0))
    ids = tiny.tokenizer(["a photo of a cat."])[0]
    embeddings = tiny.model.token_embedding(ids)
    torch.testing.assert_close(ivlp.ctx[0], embeddings[1:3])
    prompt = ivlp.prompt_embeddings()[0, 0]
    torch.testing.assert_close(prompt, embeddings[:prompt.shape[0]])
    assert int(ivlp.eot_index[0]) == int(ids.argmax())


def _record_blocks(transformer):
    """Record the input and output of every block (batch-first) while a forward runs."""
    inputs, outputs, handles = [], [], []
    for block in transformer.resblocks:
        handles.append(block.register_forward_pre_hook(lambda module, args, kwargs: inputs.append(args[0].detach()),
                                                       with_kwargs=True))
        handles.append(block.register_forward_hook(lambda module, args, output: outputs.append(output.detach())))
    return inputs, outputs, handles


@pytest.mark.parametrize("name,depth", [("ivlp", 2), ("ivlp", 1), ("maple", 2), ("maple", 1)])
def test_prompts_sit_in_their_slots_without_positional_embedding(tiny, name, depth):
    """Vision: [CLS, patches, P_v] enters ln_pre with P_v exactly the prompts (no positional embedding); at the input
    of block i < J the last M_v tokens ARE the deep prompts (replaced, not added) and every other token is the
    previous block's output; from block J on, inputs are the previous outputs unchanged. Text: the same with
    positions 1..M (ctx + positional embedding at the input)."""
    torch.manual_seed(0)
    config = (IVLPConfig(n_ctx_text=2, n_ctx_vision=3, depth_text=depth, depth_vision=depth) if name == "ivlp"
              else MaPLeConfig(n_ctx=2, depth=depth))
    method = randomize(build_method(name, tiny, CLASSES, config))
    visual = tiny.model.visual
    ln_pre_inputs = []
    handle = visual.ln_pre.register_forward_pre_hook(lambda module, args: ln_pre_inputs.append(args[0].detach()))
    vision_in, vision_out, vision_handles = _record_blocks(visual.transformer)
    text_in, text_out, text_handles = _record_blocks(tiny.model.transformer)
    try:
        with torch.no_grad():
            method(pixels(2))
    finally:
        for h in [handle] + vision_handles + text_handles:
            h.remove()

    vision_ctx, vision_deep = method.vision_prompts()
    m_v, patches = vision_ctx.shape[1], visual.grid_size[0] * visual.grid_size[1]
    x = ln_pre_inputs[0]
    assert x.shape[1] == 1 + patches + m_v
    torch.testing.assert_close(x[:, -m_v:], vision_ctx[0].expand(2, -1, -1), rtol=0, atol=0)
    with torch.no_grad():
        embedded = PromptedVisionEncoder(tiny).embed(pixels(2))
    torch.testing.assert_close(x[:, :1 + patches], embedded, rtol=0, atol=0)  # CLS at 0, patches + positions
    assert len(vision_deep) == depth - 1
    for i in range(1, len(visual.transformer.resblocks)):
        torch.testing.assert_close(vision_in[i][:, :-m_v], vision_out[i - 1][:, :-m_v], rtol=0, atol=0)
        slot = vision_deep[i - 1][0].expand(2, -1, -1) if i < depth else vision_out[i - 1][:, -m_v:]
        torch.testing.assert_close(vision_in[i][:, -m_v:], slot, rtol=0, atol=0)

    ctx, text_deep = method.text_prompts()
    m, classes = ctx.shape[1], len(CLASSES)
    positional = tiny.model.positional_embedding[1:1 + m]
    torch.testing.assert_close(text_in[0][:, 1:1 + m], (ctx[0] + positional).expand(classes, -1, -1))
    for i in range(1, len(tiny.model.transformer.resblocks)):
        outside = torch.cat([text_in[i][:, :1], text_in[i][:, 1 + m:]], dim=1)
        torch.testing.assert_close(outside, torch.cat([text_out[i - 1][:, :1], text_out[i - 1][:, 1 + m:]], dim=1),
                                   rtol=0, atol=0)
        slot = text_deep[i - 1][0].expand(classes, -1, -1) if i < depth else text_out[i - 1][:, 1:1 + m]
        torch.testing.assert_close(text_in[i][:, 1:1 + m], slot, rtol=0, atol=0)


def test_deep_text_prompts_keep_the_eot_truncation_exact(tiny):
    """Running only the first max(EOT)+1 positions with deep text prompts equals a full 77-token pass written out
    here block by block with the full causal mask."""
    torch.manual_seed(0)
    method = randomize(build_method("ivlp", tiny, CLASSES, TINY_IVLP))
    truncated = method.text_encoder(method.prompt_embeddings(), method.eot_index, method.text_prompts()[1])[0]
    model = tiny.model
    ids = tiny.tokenizer([f"{method.prompt_prefix} {c.replace('_', ' ')}." for c in CLASSES])
    full = model.token_embedding(ids)
    ctx, deep = method.text_prompts()
    m = ctx.shape[1]
    x = torch.cat([full[:, :1], ctx[0].expand(len(CLASSES), -1, -1), full[:, 1 + m:]], dim=1)
    x = x + model.positional_embedding
    for i, block in enumerate(model.transformer.resblocks):
        if 1 <= i < 1 + len(deep):
            x = torch.cat([x[:, :1], deep[i - 1][0].expand(len(CLASSES), -1, -1), x[:, 1 + m:]], dim=1)
        x = block(x, attn_mask=model.attn_mask)
    x = model.ln_final(x)[torch.arange(len(CLASSES)), ids.argmax(-1)] @ model.text_projection
    torch.testing.assert_close(truncated, x, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,config", [("ivlp", TINY_IVLP), ("maple", MaPLeConfig(n_ctx=2, depth=2)),
                                         ("promptsrc", PromptSRCConfig(depth_text=2, depth_vision=2))])
def test_gradients_reach_only_the_prompts(tiny, name, config):
    torch.manual_seed(0)
    method = build_method(name, tiny, CLASSES, config)
    for p in tiny.model.parameters():
        p.grad = None
    loss = F.cross_entropy(method(pixels())[0], torch.tensor([0, 1, 2, 0]))
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in tiny.model.parameters())
    for param_name, p in method.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, param_name


def test_maple_vision_gradients_flow_into_the_text_prompts(tiny):
    """MaPLe has no visual parameters of its own: a loss on the image features alone trains the text prompts."""
    torch.manual_seed(0)
    method = build_method("maple", tiny, CLASSES, MaPLeConfig(n_ctx=2, depth=2))
    method.image_batch(pixels()).sum().backward()
    assert method.ctx.grad.abs().sum() > 0 and method.deep_text.grad.abs().sum() > 0


@pytest.fixture(scope="module")
def vit_b16():
    """ViT-B/16 with random weights: the widths (512 text, 768 vision) the references' parameter counts assume."""
    return load_backbone(BackboneConfig("ViT-B-16", None))


def test_parameter_counts_at_vit_b16_widths(vit_b16):
    """docs/method-zoo.md, section Common CLIP pieces: MaPLe M=2 J=9 3,555,072 (J=3 1,185,024); IVLP 2+2 J=12 30,720;
    IVLP (and PromptSRC) 4+4 J=9 46,080 (J=3 15,360)."""
    def count(name, config):
        method = build_method(name, vit_b16, ["cat", "dog"], config)
        return sum(p.numel() for p in method.parameters() if p.requires_grad)

    assert count("maple", MaPLeConfig(n_ctx=2, depth=9)) == 3_555_072
    assert count("maple", MaPLeConfig(n_ctx=2, depth=3)) == 1_185_024
    assert count("ivlp", IVLPConfig()) == 30_720
    assert count("ivlp", IVLPConfig(n_ctx_text=4, n_ctx_vision=4, depth_text=9, depth_vision=9)) == 46_080
    assert count("ivlp", IVLPConfig(n_ctx_text=4, n_ctx_vision=4, depth_text=3, depth_vision=3)) == 15_360


def test_promptsrc_learns_exactly_ivlps_tensors(tiny):
    """PromptSRC's parameters are IVLP 4 + 4's (so its ViT-B/16 counts are the IVLP ones above)."""
    config = dict(n_ctx_text=4, n_ctx_vision=4, depth_text=2, depth_vision=2)
    shapes = [{n: tuple(p.shape) for n, p in build_method(name, tiny, CLASSES, cls(**config)).named_parameters()}
              for name, cls in (("ivlp", IVLPConfig), ("promptsrc", PromptSRCConfig))]
    assert shapes[0] == shapes[1]


def test_maple_deep_coupling_maps_start_as_copies_of_one_layer(tiny):
    torch.manual_seed(0)
    method = build_method("maple", tiny, CLASSES, MaPLeConfig(n_ctx=2, depth=2))
    weight = method.coupling_weight[0]
    assert weight.shape == (2, 64, 64)
    assert not torch.equal(weight[0], weight[1])  # the input map is its own layer
    method = build_method("maple", load_backbone(BackboneConfig("atlas-world", None)), CLASSES,
                          MaPLeConfig(n_ctx=2, depth=3))
    torch.testing.assert_close(method.coupling_weight[0, 1], method.coupling_weight[0, 2], rtol=0, atol=0)


def test_gpa_weights_match_the_reference_table():
    """docs/method-zoo.md, section PromptSRC: b2n (E=20, mu=15, sigma=1) e13 .054, e14 .242, e15 .399, e16 .242, e17
    .054, rest < .005; xd (mu=6, sigma=10) .055 at e1, peak .063 at e6, .024 at e20; few-shot mu=45 sigma=5 peaks at
    .092 at e45."""
    b2n = gpa_weights(15, 1, 20)
    assert b2n.sum().item() == pytest.approx(1.0)
    assert [round(v, 3) for v in b2n[12:17].tolist()] == [0.054, 0.242, 0.399, 0.242, 0.054]
    assert (torch.cat([b2n[:12], b2n[17:]]) < 0.005).all()
    xd = gpa_weights(6, 10, 20)
    assert [round(xd[i].item(), 3) for i in (0, 5, 19)] == [0.055, 0.063, 0.024] and int(xd.argmax()) == 5
    late = gpa_weights(45, 5, 50)
    assert int(late.argmax()) == 44 and round(late.max().item(), 3) == 0.092
    flat = gpa_weights(30, 30, 50)
    assert 0.013 < flat.min().item() < flat.max().item() < 0.0226


def test_gpa_replaces_the_prompts_by_their_gaussian_average(tiny):
    torch.manual_seed(0)
    method = build_method("promptsrc", tiny, CLASSES, PromptSRCConfig(depth_text=2, depth_vision=2, gpa_mean=2,
                                                                       gpa_std=1))
    snapshots = []
    for epoch in range(3):
        randomize(method, seed=epoch)
        snapshots.append(method.ctx.detach().clone())
        method.end_epoch(epoch, 3)
    method.finish_training()
    weights = gpa_weights(2, 1, 3)
    expected = sum(w * s for w, s in zip(weights.tolist(), snapshots))
    torch.testing.assert_close(method.ctx.detach(), expected)


def test_promptsrc_loss_terms_and_normalisation(tiny):
    """CE + 25 * mean|t - t0| + 10 * mean|v - v0| + KL_sum(p0 || p) / (B * C), with t0 the template average of the
    un-normalised frozen text features and v0 the frozen image features."""
    torch.manual_seed(0)
    method = randomize(build_method("promptsrc", tiny, CLASSES, PromptSRCConfig(depth_text=2, depth_vision=2)))
    x, y = pixels(), torch.tensor([0, 1, 2, 1])
    loss = method.training_loss(x, y, cross_entropy_criterion(y))
    from atlas_fast.data.templates import IMAGENET_TEMPLATES

    t0 = torch.stack([tiny.encode_text([t.format(c.replace("_", " ")) for c in CLASSES]) for t in IMAGENET_TEMPLATES])
    t0 = F.normalize(t0.mean(0), dim=-1)
    v0 = F.normalize(tiny.encode_image(x), dim=-1)
    t, v = method.text_features()[0], F.normalize(method.image_batch(x), dim=-1)[0]
    scale = method.logit_scale  # exp(logit_scale): 100 for released weights, 1/0.07 at random init
    z, z0 = scale * v @ t.T, scale * v0 @ t0.T
    kl = (F.softmax(z0, -1) * (F.log_softmax(z0, -1) - F.log_softmax(z, -1))).sum() / z.numel()
    expected = F.cross_entropy(z, y) + 25 * (t - t0).abs().mean() + 10 * (v - v0).abs().mean() + kl
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    # given the frozen features of the same view (the cache), the loss is the same as computing them
    cached = method.training_loss((x, tiny.encode_image(x)), y, cross_entropy_criterion(y))
    torch.testing.assert_close(cached, loss, rtol=0, atol=0)


def test_training_steps_are_deterministic_per_seed(tiny):
    def train(seed):
        torch.manual_seed(seed)
        method = build_method("maple", tiny, CLASSES, MaPLeConfig(n_ctx=2, depth=2))
        optimizer = torch.optim.SGD(method.parameters(), lr=0.01, momentum=0.9)
        for step in range(3):
            loss = F.cross_entropy(method(pixels(seed=step))[0], torch.tensor([0, 1, 2, 0]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return method.state_for_checkpoint()

    first, second, other = train(1), train(1), train(2)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_runs_are_independent_along_the_run_dimension(tiny):
    """R runs in one module: each run's logits are those of a single-run module holding that run's tensors."""
    torch.manual_seed(0)
    together = randomize(build_method("maple", tiny, CLASSES, MaPLeConfig(n_ctx=2, depth=2), runs=2))
    single = build_method("maple", tiny, CLASSES, MaPLeConfig(n_ctx=2, depth=2))
    with torch.no_grad():
        for name, p in single.named_parameters():
            p.copy_(dict(together.named_parameters())[name][1:2])
        x = pixels()
        torch.testing.assert_close(together(x)[1], single(x)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("config,error", [
    (dict(n_ctx_text=5), "only 4 words"), (dict(depth_text=0), "depth_text must be >= 1"),
    (dict(depth_vision=-1), "depth_vision must be >= 0"), (dict(n_ctx_vision=0), "n_ctx_vision must be >= 1")])
def test_invalid_configs_are_rejected(config, error):
    with pytest.raises(ValueError, match=error):
        IVLPConfig(**config)


def test_depth_beyond_the_tower_is_rejected(tiny):
    with pytest.raises(ValueError, match=r"depth_vision must be in \[0, 2\]"):
        build_method("ivlp", tiny, CLASSES, IVLPConfig(depth_text=2, depth_vision=3))
    with pytest.raises(ValueError, match=r"depth must be in \[1, 2\]"):
        build_method("maple", tiny, CLASSES, MaPLeConfig(depth=9))


def test_recipes():
    config, recipe = maple_recipe("original", "cross_dataset", 16, "ImageNet")
    assert (config.n_ctx, config.depth, recipe.epochs, recipe.lr, recipe.batch_size) == (2, 3, 2, 0.0026, 4)
    config, recipe = maple_recipe("paper", "base2new", 16, "OxfordPets")
    assert (config.n_ctx, config.depth, recipe.epochs, recipe.lr) == (4, 9, 5, 0.0035)
    config, recipe = ivlp_recipe("original", "base2new", 16, "OxfordPets")
    assert (config.n_ctx_text, config.n_ctx_vision, config.depth_text, config.depth_vision) == (2, 2, 12, 12)
    config, recipe = promptsrc_recipe("paper", "cross_dataset", 16, "ImageNet")
    assert (config.depth_text, config.gpa_mean, config.gpa_std, recipe.epochs) == (3, 6.0, 10.0, 20)
    config, recipe = promptsrc_recipe("original", "few_shot", 4, "EuroSAT")
    assert (config.gpa_mean, config.gpa_std, recipe.epochs) == (45.0, 5.0, 50)
    assert promptsrc_recipe("original", "few_shot", 4, "Food101")[0].gpa_mean == 30.0
    with pytest.raises(MissingRecipe, match="no 'few_shot' recipe"):
        maple_recipe("paper", "few_shot", 4, "OxfordPets")
    config, recipe = dept_maple_recipe("original", "base2new", 16, "OxfordPets")
    assert (config.n_ctx, config.depth, config.head_lambda, recipe.epochs, recipe.lr) == (2, 9, 0.7, 10, 0.0035)
    assert dept_maple_recipe("paper", "cross_dataset", 16, "ImageNet")[0].n_ctx == 4


def test_more_learnable_tokens_than_init_words_are_refused_for_every_deep_method():
    """The references fall back to random init when M exceeds the phrase; the configs refuse it instead. Fewer
    tokens than words takes effect (the remaining words stay fixed text), so it is allowed."""
    for make in (lambda m: IVLPConfig(n_ctx_text=m), lambda m: MaPLeConfig(n_ctx=m),
                 lambda m: PromptSRCConfig(n_ctx_text=m)):
        with pytest.raises(ValueError, match="5 learnable tokens but ctx_init 'a photo of a' has only 4 words"):
            make(5)
        make(3)
