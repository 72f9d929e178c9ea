"""MMRL equals a literal re-implementation of its official code (yunncheng/MMRL: ``trainers/mmrl.py``'s
representation learner, ``CustomCLIP`` and ``MMRL_Loss``; ``clip/model_mmrl.py``'s blocks, which insert the tokens
after the first token at the first representation layer and replace them at the later ones, rebuild the text's
causal mask over the longer sequence, and the vision tower's two projections) on the same random weights: the token
ids, the logits of both branches, the test-time logits of base and new classes, every loss term and the gradient of
every learned tensor, at the official init and at a moved point, each with a negative control that must be caught.
Also: end-to-end training from ``atlas-fast train`` and the Python API with and without ATLaS-ISL, the recipes, and
which loss terms take the label schedule's targets."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.methods.config import MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.mmrl import MMRLConfig, MMRLppConfig, mmrl_recipe, mmrlpp_recipe
from equivalence import assert_caught, assert_equivalent, assert_gradient_equivalent, report_ratios
from atlas_fast.atlas.criterion import LossCriterion
from helpers import cross_entropy_criterion, eight_class_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: extra threads only contend

BASE = ["cat", "great_crested_newt", "dog"]
NEW = ["sea_lion", "pug"]
TEMPLATE = "a photo of a {}, a type of pet."


def build(backbone, moved, name="mmrl", runs=1, **changes):
    torch.manual_seed(0)
    base = (MMRLppConfig(beta=0.6) if name == "mmrl++" else MMRLConfig())
    config = dataclasses.replace(base, **{"rep_dim": 16, "template": TEMPLATE, "reg_weight": 0.7, **changes})
    method = build_method(name, backbone, BASE, config, runs)
    if moved:
        with torch.no_grad():
            for param in method.parameters():
                param.add_(0.05 * torch.randn_like(param))
    return method


# --- the reference, literally (sequence-first blocks as the official model_mmrl.py runs them) ------------------------
def reference_block(block, x, mask):
    """``x + attention(ln_1(x)); x + mlp(ln_2(x))`` on (L, N, w), the official block's own arithmetic."""
    assert isinstance(block.ls_1, torch.nn.Identity) and isinstance(block.ls_2, torch.nn.Identity)
    h = block.ln_1(x).transpose(0, 1)  # open_clip's attention is batch-first
    x = x + block.attn(h, h, h, need_weights=False, attn_mask=mask)[0].transpose(0, 1)
    return x + block.mlp(block.ln_2(x))


def causal(width):
    mask = torch.empty(width, width)
    mask.fill_(float("-inf"))
    return mask.triu_(1)


def reference_learner(p, layers, plus=False):
    """MultiModalRepresentationLearner.forward: per representation layer, the tokens through its two Linears;
    MMRL++ (``MultiModalRepresentationLearner_pp``): through the shared weight plus the layer's A B, with its bias."""
    def linear(tower, i):
        if not plus:
            return F.linear(p["rep_tokens"], p[f"{tower}_map_weight"][i].t(), p[f"{tower}_map_bias"][i])
        weight = p[f"{tower}_map_weight"].t() + p[f"{tower}_residual_a"][i] @ p[f"{tower}_residual_b"][i]
        return F.linear(p["rep_tokens"], weight, p[f"{tower}_map_bias"][i])

    return [linear("text", i) for i in range(layers)], [linear("vision", i) for i in range(layers)]


def reference_insert(x, tokens, layer, rep_layers, k, counter, add=False, beta=None):
    """The official ResidualAttentionBlock's insertion (LND): after the first token at the first representation
    layer, in place of positions 1..K at the later ones (MMRL++, ``beta``: blended with the previous layer's output
    there; ``add``: a wrong variant that adds instead)."""
    if layer not in rep_layers:
        return x, counter
    context = tokens[counter].expand(x.shape[1], -1, -1).permute(1, 0, 2)
    if layer == rep_layers[0]:
        x = torch.cat([x[:1], context, x[1:]], dim=0)
    elif beta is not None:
        x = torch.cat([x[:1], beta * context + (1 - beta) * x[1:1 + k], x[1 + k:]], dim=0)
    elif add:
        x = torch.cat([x[:1], x[1:1 + k] + context, x[1 + k:]], dim=0)
    else:
        x = torch.cat([x[:1], context, x[1 + k:]], dim=0)
    return x, counter + 1


def reference_text(backbone, tokens, names, rep_layers, k, shift=True, add=False, beta=None):
    """TextEncoder_MMRL.forward on the template's 77-token prompts (``shift=False``: pooled at the EOT without the
    +K, a wrong variant)."""
    model = backbone.model
    ids = backbone.tokenizer([TEMPLATE.format(n.replace("_", " ")) for n in names])
    x = (model.token_embedding(ids) + model.positional_embedding).permute(1, 0, 2)
    mask, counter = model.attn_mask, 0
    for i, block in enumerate(model.transformer.resblocks):
        x, counter = reference_insert(x, tokens, i + 1, rep_layers, k, counter, add, beta)
        if i + 1 >= rep_layers[0]:
            mask = causal(x.shape[0])
        x = reference_block(block, x, mask)
    x = model.ln_final(x.permute(1, 0, 2))
    eot = ids.argmax(dim=-1) + (k if shift else 0)
    return x[torch.arange(x.shape[0]), eot] @ model.text_projection, ids


def reference_image(backbone, pixels, tokens, proj_rep, rep_layers, k, mean_first=False, beta=None):
    """The official VisionTransformer.forward (model "MMRL"): class-token and representation features
    (``mean_first``: the mean taken before ln_post, a wrong variant)."""
    visual = backbone.model.visual
    x = visual.conv1(pixels)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    x = torch.cat([visual.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1]), x], dim=1)
    x = visual.ln_pre(x + visual.positional_embedding).permute(1, 0, 2)
    counter = 0
    for i, block in enumerate(visual.transformer.resblocks):
        x, counter = reference_insert(x, tokens, i + 1, rep_layers, k, counter, beta=beta)
        x = reference_block(block, x, None)
    x = x.permute(1, 0, 2)
    rep = (visual.ln_post(x[:, 1:1 + k].mean(dim=1)) if mean_first else visual.ln_post(x[:, 1:1 + k]).mean(dim=1))
    return visual.ln_post(x[:, 0]) @ visual.proj, rep @ proj_rep


def reference_loss(logits, logits_rep, image, text, image_clip, text_clip, label, weight, alpha=0.7, text_term=True):
    """MMRL_Loss.forward."""
    loss = alpha * F.cross_entropy(logits, label) + (1 - alpha) * F.cross_entropy(logits_rep, label)
    loss = loss + weight * (1 - torch.mean(F.cosine_similarity(image, image_clip, dim=1)))
    if text_term:
        loss = loss + weight * (1 - torch.mean(F.cosine_similarity(text, text_clip, dim=1)))
    return loss


def reference_forward(backbone, p, pixels, names, config, **wrong):
    """CustomCLIP.forward: logits, logits_rep, logits_fusion and the normalised features."""
    layers = len(backbone.model.transformer.resblocks)
    rep_layers = list(range(layers - config.depth + 1, layers + 1))
    k = config.n_rep_tokens
    plus = isinstance(config, MMRLppConfig)
    beta = config.beta if plus and not wrong.get("replace") else None
    text_tokens, vision_tokens = reference_learner(p, config.depth, plus)
    text, ids = reference_text(backbone, text_tokens, names, rep_layers, k, shift=wrong.get("shift", True),
                               add=wrong.get("add", False), beta=beta)
    visual = backbone.model.visual
    proj_rep = visual.proj + p["proj_lora_a"] @ p["proj_lora_b"] if plus else p["rep_projection"]
    image, rep = reference_image(backbone, pixels, vision_tokens, proj_rep, rep_layers, k,
                                 mean_first=wrong.get("mean_first", False), beta=beta)
    image, rep, text = (F.normalize(v, dim=-1) for v in (image, rep, text))
    logits, logits_rep = 100. * image @ text.t(), 100. * rep @ text.t()
    return dict(logits=logits, logits_rep=logits_rep, fusion=config.alpha * logits + (1 - config.alpha) * logits_rep,
                image=image, text=text, ids=ids)


def check(backbone, method, prefix, pixels, labels):
    config = method.config
    one_hot = cross_entropy_criterion(labels)
    frozen = backbone.encode_image(pixels)
    loss = method.training_loss((pixels, frozen), labels, one_hot)
    loss.backward()
    p = {name: t.detach()[0].clone().requires_grad_(True) for name, t in method.named_parameters()}
    ref = reference_forward(backbone, p, pixels, BASE, config)
    model = backbone.model
    with torch.no_grad():
        image_clip = F.normalize(model.visual(pixels), dim=-1)
        text_clip = F.normalize(model.encode_text(ref["ids"]), dim=-1)
    ids = ref["ids"][:, :method.token_ids.shape[1]]
    assert torch.equal(method.token_ids.cpu(), ids) and not ref["ids"][:, ids.shape[1]:].any()
    terms = method.loss_terms(pixels, frozen)
    assert_equivalent(f"{prefix} logits", terms["logits"][0], ref["logits"], atol=1e-4)
    assert_equivalent(f"{prefix} rep logits", terms["rep_logits"][0], ref["logits_rep"], atol=1e-4)
    assert_equivalent(f"{prefix} image cos", terms["image_cos"][0],
                      F.cosine_similarity(ref["image"], image_clip, dim=1))
    assert_equivalent(f"{prefix} text cos", terms["text_cos"][0], F.cosine_similarity(ref["text"], text_clip, dim=1))
    reference = reference_loss(ref["logits"], ref["logits_rep"], ref["image"], ref["text"], image_clip, text_clip,
                               labels, config.reg_weight)
    reference.backward()
    assert_equivalent(f"{prefix} loss", loss, reference)
    for name, param in method.named_parameters():
        assert_gradient_equivalent(f"{prefix} grad {name}", param.grad[0], p[name].grad)
    with torch.no_grad():  # test time: the fusion on the classes it trained on, the class-token logits elsewhere
        method.eval()
        assert_equivalent(f"{prefix} test logits base", method(pixels)[0], ref["fusion"], atol=1e-4)
        method.set_classnames(NEW)
        new = reference_forward(backbone, p, pixels, NEW, config)
        assert_equivalent(f"{prefix} test logits new", method(pixels)[0], new["logits"], atol=1e-4)
        assert_caught("fusion on new classes", method(pixels)[0], new["fusion"], atol=1e-4)
        method.set_classnames(BASE)
        method.train()
        args = (ref["image"], ref["text"], image_clip, text_clip, labels, config.reg_weight)
        assert_caught("branch weights swapped", loss,
                      reference_loss(ref["logits"], ref["logits_rep"], *args, alpha=1 - config.alpha))
        assert_caught("no text regulariser", loss,
                      reference_loss(ref["logits"], ref["logits_rep"], *args, text_term=False))
        no_image = reference_loss(ref["logits"], ref["logits_rep"], *args) - config.reg_weight * (
            1 - F.cosine_similarity(ref["image"], image_clip, dim=1).mean())
        assert_caught("no image regulariser", loss, no_image)
        flipped = F.normalize(model.visual(pixels.flip(-1)), dim=-1)  # the frozen features of another view
        assert_caught("image regulariser toward another view", terms["image_cos"][0],
                      F.cosine_similarity(ref["image"], flipped, dim=1))
    # gradients: the reference with the branch weights swapped gives other gradients for every learned tensor
    q = {name: t.detach().clone().requires_grad_(True) for name, t in p.items()}
    swapped = reference_forward(backbone, q, pixels, BASE, config)
    reference_loss(swapped["logits"], swapped["logits_rep"], swapped["image"], swapped["text"], image_clip, text_clip,
                   labels, config.reg_weight, alpha=1 - config.alpha).backward()
    for name, param in method.named_parameters():
        scale = p[name].grad.abs().max()
        if scale == 0:  # MMRL++'s A factors at init (B = 0): zero in both, checked zero above
            continue
        assert_caught(f"grad {name} with the branch weights swapped", param.grad[0] / scale, q[name].grad / scale,
                      rtol=0.0)
        deeper = ({"replace": True} if isinstance(config, MMRLppConfig) else {"add": True},) if config.depth > 1 else ()
        for wrong in ({"shift": False}, {"mean_first": True}) + deeper:
            other = reference_forward(backbone, p, pixels, BASE, config, **wrong)
            key = "logits_rep" if "mean_first" in wrong else "logits"
            assert_caught(f"{wrong}", terms[key.replace("logits_rep", "rep_logits")][0], other[key], atol=1e-4)


SLOW = pytest.mark.slow


@pytest.mark.parametrize("name,depth,moved", [
    ("mmrl", 1, False), ("mmrl", 2, True), ("mmrl++", 2, True), pytest.param("mmrl", 1, True, marks=SLOW),
    pytest.param("mmrl", 2, False, marks=SLOW), pytest.param("mmrl++", 2, False, marks=SLOW),
    pytest.param("mmrl++", 1, True, marks=SLOW)])
def test_logits_loss_and_every_gradient_match_the_official_code(tiny, name, depth, moved):
    """Tiny towers of 2 blocks: depth 1 (tokens at layer 2 only, under it the frozen states) and depth 2 (inserted
    at layer 1, replaced (MMRL) or blended (MMRL++) at layer 2). At MMRL++'s init its residuals' B are zero, so the
    gradient of each A is zero there (in the reference too); the moved point checks them."""
    method = build(tiny, moved, name, depth=depth)
    torch.manual_seed(1)
    check(tiny, method, f"{name} tiny depth {depth}{' moved' if moved else ''}", torch.randn(3, 3, 32, 32),
          torch.tensor([0, 2, 1]))
    print("\n" + report_ratios(f"{name} tiny"))


@pytest.mark.slow
@pytest.mark.parametrize("name,moved", [("mmrl", False), ("mmrl", True), ("mmrl++", True)])
def test_vit_b16_shapes_match_the_official_code(name, moved):
    """The reference's own shapes: ViT-B/16 (random weights), 224 px, K = 5, r = 512, layers 6..12."""
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone

    backbone = load_backbone(BackboneConfig("ViT-B-16", None))
    method = build(backbone, moved, name, rep_dim=512, depth=7)
    count = {"mmrl": 4_992_256, "mmrl++": 813_312}[name]  # docs/method-zoo.md, sections MMRL and MMRL++
    assert sum(p.numel() for p in method.parameters()) == count
    torch.manual_seed(1)
    check(backbone, method, f"{name} ViT-B/16{' moved' if moved else ''}", torch.randn(2, 3, 224, 224),
          torch.tensor([1, 2]))
    print("\n" + report_ratios(f"{name} ViT-B/16"))


def test_official_init(tiny):
    """N(0, 0.02^2) tokens, the J maps of a tower copies of one Linear (PyTorch's init), proj_rep N(0, 1/d_v)."""
    torch.manual_seed(0)
    method = build_method("mmrl", tiny, BASE, MMRLConfig(depth=2))
    assert abs(method.rep_tokens.std().item() - 0.02) < 0.002
    for name in ("text_map_weight", "vision_map_weight", "text_map_bias", "vision_map_bias"):
        tensor = getattr(method, name)[0]
        assert torch.equal(tensor[0], tensor[1]), name
    bound = 512 ** -0.5  # kaiming-uniform(a=sqrt(5)) of Linear(512 -> w): U(-1/sqrt(512), 1/sqrt(512))
    assert method.text_map_weight.abs().max() <= bound and method.text_map_weight.std() > 0.8 * bound / 3 ** 0.5
    width = method.rep_projection.shape[1]
    assert abs(method.rep_projection.std().item() * width ** 0.5 - 1.0) < 0.05


def test_mmrlpp_official_init(tiny):
    """MMRL++: one shared map per tower from a fresh Linear, every block's bias that Linear's, the residuals' A
    kaiming-uniform (U(-1/sqrt(rank), 1/sqrt(rank))) and B zero, the projection update A U(-1/8, 1/8) and B zero."""
    torch.manual_seed(0)
    method = build_method("mmrl++", tiny, BASE, MMRLppConfig(depth=2))
    for tower in ("text", "vision"):
        bias = getattr(method, f"{tower}_map_bias")[0]
        assert torch.equal(bias[0], bias[1]) and getattr(method, f"{tower}_map_weight").abs().max() <= 512 ** -0.5
        a = getattr(method, f"{tower}_residual_a")
        assert a.abs().max() <= 0.5 and a.std() > 0.2 and not getattr(method, f"{tower}_residual_b").any()
    assert method.proj_lora_a.abs().max() <= 1 / 8 and method.proj_lora_a.std() > 0.05
    assert not method.proj_lora_b.any()
    # at init the representation tokens are projected by CLIP's own proj
    torch.testing.assert_close(method.representation_projection()[0], tiny.model.visual.proj)


def test_both_classification_terms_take_the_schedule_targets_and_only_z_is_observed(tiny):
    method = build(tiny, True, depth=1)
    calls = []

    class Recorded(LossCriterion):
        def per_run(self, logits, observe=True):
            calls.append((logits.detach().clone(), observe))
            return super().per_run(logits, observe)

    pixels = torch.randn(2, 3, 32, 32)
    method.training_loss(pixels, torch.tensor([0, 1]), Recorded(lambda z, r: z.sum() * 0.0, [2]))
    terms = method.loss_terms(pixels)
    assert [observe for _, observe in calls] == [True, False]
    torch.testing.assert_close(calls[0][0], terms["logits"])
    torch.testing.assert_close(calls[1][0], terms["rep_logits"])
    # the cached frozen features of the view give the loss that computing them gives
    y = torch.tensor([0, 1])
    one_hot = cross_entropy_criterion(y)
    torch.testing.assert_close(method.training_loss((pixels, tiny.encode_image(pixels)), y, one_hot),
                               method.training_loss(pixels, y, one_hot), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mmrl", "mmrl++"])
def test_runs_trained_together_keep_their_own_rows_and_losses(tiny, name):
    """Two runs in one module, the second with a shorter (zero-padded) batch: each run's loss is the one a module
    holding only that run computes on its own rows. (Whole batched runs are compared in tests/test_batched_pixels.py
    for MMRL; MMRL++'s are not: after 3 epochs of AdamW its batched and lone runs' losses agree to 1e-6 but its
    learned tensors differ by up to 4e-5, mostly in the low-rank factors whose B start at zero, above that test's
    tolerance of 1e-5: AdamW's normalised steps enlarge the float reordering of a batched pass.)"""
    together = build(tiny, True, name, depth=2, runs=2)
    pixels, labels = torch.randn(2, 3, 3, 32, 32), torch.tensor([[0, 1, 2], [2, 0, 0]])
    pixels[1, 2] = 0.0

    losses = together.training_loss(pixels, labels, cross_entropy_criterion(labels, (3, 2)))
    for r, n in enumerate((3, 2)):
        single = build(tiny, False, name, depth=2)
        with torch.no_grad():
            for key, param in single.named_parameters():
                param.copy_(dict(together.named_parameters())[key][r:r + 1])
        y = labels[r, :n]
        expected = single.training_loss(pixels[r, :n], y, cross_entropy_criterion(y))
        torch.testing.assert_close(losses[r], expected, rtol=1e-5, atol=1e-5)


def test_recipes():
    config, recipe = mmrl_recipe("paper", "base2new", 16, "OxfordPets")
    assert (config.n_rep_tokens, config.rep_dim, config.depth, config.alpha, config.reg_weight, config.template) == (
        5, 512, 7, 0.7, 0.2, "a photo of a {}, a type of pet.")
    assert recipe == OptimRecipe(epochs=10, batch_size=4, lr=0.001, optimizer="adamw")
    config, recipe = mmrl_recipe("original", "base2new", 16, "ImageNet")
    assert (config.reg_weight, recipe.epochs, recipe.batch_size) == (0.5, 5, 32)
    config, recipe = mmrl_recipe("paper", "base2new", 16, "EuroSAT")
    assert (config.rep_dim, config.reg_weight) == (2048, 0.01)
    config, recipe = mmrl_recipe("paper", "few_shot", 4, "DescribableTextures")
    assert (config.reg_weight, config.template, recipe.epochs, recipe.batch_size) == (6.0, "{} texture.", 50, 32)
    assert mmrl_recipe("paper", "few_shot", 4, "WorldSketches")[0].reg_weight == 0.5
    assert mmrl_recipe("paper", "base2new", 4, "WorldSketches")[0].reg_weight == 1.0
    config, recipe = mmrl_recipe("paper", "cross_dataset", 16, "ImageNet")
    assert (config.reg_weight, recipe.epochs, recipe.warmup_epochs, recipe.batch_size) == (0.2, 1, 0, 32)
    with pytest.raises(ValueError, match="recipe family"):
        mmrl_recipe("mine", "base2new", 16, "ImageNet")
    config, recipe = mmrlpp_recipe("paper", "base2new", 16, "Food101")
    assert (config.beta, config.reg_weight, config.rep_dim, config.res_lora_dim, config.proj_lora_dim) == (
        0.1, 1.0, 512, 4, 64)
    assert recipe == OptimRecipe(epochs=10, batch_size=4, lr=0.001, optimizer="adamw")
    config, recipe = mmrlpp_recipe("paper", "few_shot", 4, "EuroSAT")
    assert (config.beta, config.reg_weight, config.rep_dim, recipe.epochs, recipe.batch_size, recipe.lr) == (
        0.2, 0.01, 512, 100, 32, 0.002)
    config, recipe = mmrlpp_recipe("paper", "cross_dataset", 16, "ImageNet")
    assert (config.beta, config.reg_weight, recipe.epochs, recipe.warmup_epochs) == (0.9, 0.1, 1, 0)
    assert mmrlpp_recipe("paper", "base2new", 16, "WorldPhotos")[0].beta == 0.9
    with pytest.raises(ValueError, match=r"MMRLppConfig.beta must be in \[0, 1\]"):
        MMRLppConfig(beta=-0.1)
    with pytest.raises(ValueError, match=r"MMRLConfig.alpha must be in \[0, 1\]"):
        MMRLConfig(alpha=1.5)
    with pytest.raises(ValueError, match="one '{}'"):
        MMRLConfig(template="a photo")


def test_depth_beyond_the_towers_is_refused_naming_the_option(tiny):
    with pytest.raises(ValueError, match=r"MMRL: depth must be in \[1, 2\]"):
        build_method("mmrl", tiny, BASE, MMRLConfig(depth=7))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return eight_class_pets(tmp_path_factory, "mmrl")


def test_train_base_to_new_from_the_command_line_with_and_without_atlas_isl(root, capsys):
    from atlas_fast.cli import main
    from atlas_fast.engine.evaluate import harmonic_mean

    number = r"(\d+\.\d\d)"
    args = ["train", "--dataset", "OxfordPets", "--data-root", str(root / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--method", "mmrl", "--shots", "2", "--epochs", "2", "--batch-size", "4",
            "--views", "2", "--cache-root", str(root / "cache"), "--results-dir", str(root / "results"),
            "--no-progress", "--method-option", "depth=1", "rep_dim=16"]
    for extra, label in (((), "mmrl"), (("--atlas", "isl"), "mmrl+ATLaS-ISL (K=2)")):
        assert main(args + list(extra)) == 0
        out = capsys.readouterr().out
        line = re.search(rf"OxfordPets {re.escape(label)}(?: \[[^\]]*\])? seed 1: base {number}  new {number}  H "
                         rf"{number}", out)
        assert line, out
        base, new, h = map(float, line.groups())
        assert h == pytest.approx(harmonic_mean(base, new), abs=0.01)
    record = json.loads(Path(re.findall(r"record: (\S+\.json)", out)[-1]).read_text())
    assert [e["soft"] for e in record["epochs"]] == [False, True]
    assert record["config"]["method_config"]["rep_dim"] == 16


@pytest.mark.parametrize("name", ["mmrl", pytest.param("mmrl++", marks=pytest.mark.slow)])
def test_python_api_trains_with_atlas_isl(root, name):
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine import run

    record = run(tiny_pets_config(root, method=name, shots=2, views=2, method_options=dict(depth=2, rep_dim=8),
                                  schedule=Alternating(2), soft_labels=soft_label_preset("base2new", "isl")))
    assert record["config"]["recipe"]["optimizer"] == "adamw"
    assert set(record["metrics"]) >= {"base", "new", "H"} and [e["soft"] for e in record["epochs"]] == [False, True]
    assert all(e["loss"] > 0 for e in record["epochs"])


@pytest.mark.slow
def test_train_on_the_world_with_and_without_atlas_isl(root, capsys):
    """The embedded world (its shipped CLIP, 4-block towers: depth 4 as ``train`` sets for world datasets)."""
    from atlas_fast.cli import main
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    generate_benchmark(root / "world", ["WorldSketches"], sizes=SplitSizes(train=2, val=1, test=1), progress=False)
    args = ["train", "--dataset", "WorldSketches", "--data-root", str(root / "world"), "--shots", "2", "--epochs", "2",
            "--views", "2", "--batch-size", "8", "--cache-root", str(root / "cache"), "--results-dir",
            str(root / "world-results"), "--no-progress", "--method", "mmrl"]
    for extra in ((), ("--atlas", "isl")):
        status = main(args + list(extra))
        out = capsys.readouterr().out
        assert status == 0 and re.search(r"WorldSketches mmrl\S*(?: \([^)]*\))?(?: \[[^\]]*\])? seed 1: base", out), out



@pytest.mark.slow
def test_the_imagenet_step_fits_the_memory_planner_s_estimate():
    """One training step at ImageNet's shapes (ViT-B/16, C = 1,000, the recipe's batch 32, fp32 on the CPU): the
    host memory it adds to a process holding the frozen CLIP stays within what the planner reserves for a run
    (engine/memory.py), so a group the planner sizes fits. Prints both figures."""
    from atlas_fast.cache.space import human_bytes
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.engine import memory
    from atlas_fast.methods.registry import method_class
    from atlas_fast.pricing.timing import host_rss
    from atlas_fast.pricing.units import measure_step

    backbone = load_backbone(BackboneConfig("ViT-B-16", None))
    config, recipe = mmrl_recipe("paper", "base2new", 16, "ImageNet")
    assert recipe.batch_size == 32
    from atlas_fast.world.standin_plan import imagenet_classnames

    names = [name for _, name in imagenet_classnames()]  # ImageNet's own names: its longest prompts
    assert len(names) == 1000
    before = host_rss()
    unit = measure_step(backbone, "mmrl", names, recipe.batch_size, config=config, amp=False, steps=1, warmup=False)
    added = unit.peak_host_bytes - before
    per_run = memory.step_bytes_per_run(method_class("mmrl"), backbone, len(names), recipe.batch_size, amp=False)
    print(f"\nMMRL ImageNet step (C=1000, B=32, fp32 CPU): adds {human_bytes(added)} at its peak (RSS "
          f"{human_bytes(unit.peak_host_bytes)}); the planner reserves {human_bytes(per_run)} per run; "
          f"{unit.seconds:.1f} s/step")
    assert 0 < added <= per_run
