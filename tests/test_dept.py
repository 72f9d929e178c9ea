"""DePT on CoOp / CoCoOp / KgCoOp from cached features equals a literal re-implementation of DePT's trainers
(elp_coop.py, elp_cocoop.py, elp_kgcoop.py: pixels through the image tower, 77-token prompts class by class and for
CoCoOp image by image, FiLM + linear over [text rows of the true classes; image rows], the [y; y] labels) in the
loss and in the gradient of every learned tensor; the staged lr groups, the test-time fusion and soft targets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.methods import METHODS
from atlas_fast.methods.config import MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.dept import (DePTCoCoOpConfig, DePTCoOpConfig, DePTKgCoOpConfig, dept_cocoop_recipe,
                                     dept_coop_recipe, dept_kgcoop_recipe)
from atlas_fast.atlas.schedules import soft_cross_entropy
from atlas_fast.atlas.criterion import LossCriterion
from helpers import assert_gradients_close, cross_entropy_criterion, reference_text_features

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]
TEMPLATE = "a photo of a {}, a type of pet."
CONFIGS = {"dept-coop": DePTCoOpConfig(n_ctx=3),
           "dept-cocoop": DePTCoCoOpConfig(n_ctx=2),
           "dept-kgcoop": DePTKgCoOpConfig(ctx_init="a photo of a", kg_weight=2.0, template=TEMPLATE)}


def build(tiny, name, classnames=CLASSNAMES, runs=1, **changes):
    """A DePT method with FiLM and meta-net moved off their init, so every tensor's role shows in the gradients."""
    import dataclasses

    torch.manual_seed(0)
    method = build_method(name, tiny, classnames, dataclasses.replace(CONFIGS[name], **changes), runs)
    with torch.no_grad():
        for param in method.head_parameters()[:4]:
            param.add_(0.1 * torch.randn_like(param))
        method.base.ctx.add_(0.05 * torch.randn_like(method.base.ctx))
        if hasattr(method.base, "meta_bias2"):
            method.base.meta_bias2.add_(0.05 * torch.randn_like(method.base.meta_bias2))
    return method


def leaves(method):
    return {name: p.detach()[0].clone().requires_grad_(True) for name, p in method.named_parameters()}


def reference_dept(backbone, method, pixels, labels, p, text_targets=None, image_targets=None):
    """Literal DePT: returns (similarity logits, training loss). ``p`` holds the learned tensors of run 0 (leaves).
    Targets default to the reference's hard [y; y]; soft rows replace them where given."""
    model, cfg, base = backbone.model, method.config, method.base
    scale = model.logit_scale.exp()
    image_raw = model.encode_image(pixels)
    image = F.normalize(image_raw, dim=-1)
    ctx = p["base.ctx"]
    if method.name == "dept-cocoop":
        text_raw, logits = [], []
        for f in image:
            bias = F.linear(F.relu(F.linear(f, p["base.meta_weight1"], p["base.meta_bias1"])),
                            p["base.meta_weight2"], p["base.meta_bias2"])
            t = reference_text_features(backbone, ctx + bias, CLASSNAMES, base.prompt_prefix, normalize=False)
            text_raw.append(t)
            logits.append(scale * f @ F.normalize(t, dim=-1).t())
        logits = torch.stack(logits)
        text_rows = torch.stack([t[y] for t, y in zip(text_raw, labels)])
    else:
        text_raw = reference_text_features(backbone, ctx, CLASSNAMES, base.prompt_prefix, normalize=False)
        logits = scale * image @ F.normalize(text_raw, dim=-1).t()
        text_rows = text_raw[labels]
    rows = torch.cat([text_rows * p["film_text_scale"] + p["film_text_bias"],
                      image_raw * p["film_image_scale"] + p["film_image_bias"]])
    head = F.linear(rows, p["linear_weight"], p["linear_bias"])
    if image_targets is None:
        head_loss, sim_loss = F.cross_entropy(head, torch.cat([labels, labels])), F.cross_entropy(logits, labels)
    else:
        head_loss = soft_cross_entropy(head, torch.cat([text_targets, image_targets]))
        sim_loss = soft_cross_entropy(logits, image_targets)
    loss = (1 - cfg.head_lambda) * sim_loss + cfg.head_lambda * head_loss
    if method.name == "dept-kgcoop":
        with torch.no_grad():
            ids = backbone.tokenizer([TEMPLATE.format(c.replace("_", " ")) for c in CLASSNAMES])
            old = F.normalize(model.encode_text(ids), dim=-1)
        loss = loss + cfg.kg_weight * (1 - torch.nn.CosineSimilarity(dim=1, eps=1e-07)(text_raw, old).mean())
    return logits, loss


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loss_and_every_gradient_match_the_full_forward(tiny, name):
    method = build(tiny, name)
    pixels = torch.randn(3, 3, 32, 32)
    labels = torch.tensor([2, 0, 2])
    loss = method.training_loss(tiny.encode_image(pixels), labels, cross_entropy_criterion(labels)).sum()
    loss.backward()
    p = leaves(method)
    _, reference = reference_dept(tiny, method, pixels, labels, p)
    reference.backward()
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)
    for param_name, param in method.named_parameters():
        assert_gradients_close(param.grad[0], p[param_name].grad)


@pytest.mark.parametrize("text_targets", ["mirror", "onehot"])
def test_soft_targets_reach_the_similarity_and_head_terms(tiny, text_targets):
    method = build(tiny, "dept-coop", head_text_targets=text_targets)
    pixels = torch.randn(4, 3, 32, 32)
    labels = torch.tensor([1, 0, 3, 1])
    soft = torch.softmax(torch.randn(4, 4), dim=-1)
    loss = method.training_loss(tiny.encode_image(pixels), labels,
                                LossCriterion(lambda z, r: soft_cross_entropy(z, soft), [4])).sum()
    text = soft if text_targets == "mirror" else F.one_hot(labels, 4).float()
    _, reference = reference_dept(tiny, method, pixels, labels, leaves(method), text_targets=text,
                                  image_targets=soft)
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)


def test_staged_lr_groups_cover_every_learned_tensor_once(tiny):
    method = build(tiny, "dept-cocoop")
    prompts, head = method.param_groups()
    assert (prompts["lr_scale"], head["lr_scale"]) == (1.0, 6.5)
    assert {id(p) for p in prompts["params"]} == {id(p) for n, p in method.named_parameters() if n.startswith("base.")}
    assert {id(p) for p in head["params"]} == {id(p) for n, p in method.named_parameters()
                                               if n.startswith(("film_", "linear_"))}
    assert sum(len(g["params"]) for g in (prompts, head)) == len(method.trainable_parameters()) == 11


@pytest.mark.parametrize("name", ["dept-coop", "dept-cocoop"])
def test_fusion_on_the_head_classes_and_similarity_elsewhere(tiny, name):
    method = build(tiny, name)
    method.base.eval_sequences = 6  # CoCoOp: evaluation in chunks through the base's own path
    features = torch.randn(5, tiny.embed_dim)
    lam = method.config.head_lambda
    p = leaves(method)

    def similarity():
        with torch.no_grad():
            return method.base(features)[0]

    head = F.linear(features * p["film_image_scale"] + p["film_image_bias"], p["linear_weight"], p["linear_bias"])
    torch.testing.assert_close(method.eval_logits(features)[0], (1 - lam) * similarity() + lam * head.detach(),
                               atol=1e-5, rtol=1e-5)
    method.set_classnames(["boxer", "abyssinian"])  # new classes: the head does not apply
    torch.testing.assert_close(method.eval_logits(features)[0], similarity(), atol=1e-5, rtol=1e-5)
    method.set_classnames(["great_crested_newt", "sea_lion"])  # an ordered subset (ImageNet-A/-R): its head rows
    torch.testing.assert_close(method.eval_logits(features)[0],
                               (1 - lam) * similarity() + lam * head.detach()[:, [1, 3]], atol=1e-5, rtol=1e-5)
    method.set_classnames(["sea_lion", "cat"])  # same names in another order are another problem: no head
    torch.testing.assert_close(method.eval_logits(features)[0], similarity(), atol=1e-5, rtol=1e-5)
    method.set_classnames(CLASSNAMES)
    with torch.no_grad():
        torch.testing.assert_close(method(features), method.eval_logits(features), atol=1e-5, rtol=1e-5)


def test_without_fusion_the_head_alone_scores_its_classes(tiny):
    method = build(tiny, "dept-coop", fusion=False)
    features = torch.randn(3, tiny.embed_dim)
    p = leaves(method)
    head = F.linear(features * p["film_image_scale"] + p["film_image_bias"], p["linear_weight"], p["linear_bias"])
    torch.testing.assert_close(method.eval_logits(features)[0], head.detach(), atol=1e-5, rtol=1e-5)


def test_checkpoints_hold_the_head_and_runs_are_independent(tiny):
    batched = build(tiny, "dept-coop", runs=2)
    features = torch.randn(2, 5, tiny.embed_dim)
    labels = torch.tensor([0, 1, 2, 3, 0])
    state = batched.state_for_checkpoint()
    assert set(state) == {"base.ctx", "film_text_scale", "film_text_bias", "film_image_scale", "film_image_bias",
                          "linear_weight", "linear_bias"}
    assert state["linear_weight"].shape == (2, 4, tiny.embed_dim)
    losses = batched.training_loss(features, labels.expand(2, -1), cross_entropy_criterion(labels.expand(2, -1)))
    assert losses.shape == (2,)  # each run's own loss
    for run in range(2):
        single = build(tiny, "dept-coop")
        single.load_checkpoint_state({k: v[run:run + 1] for k, v in state.items()})
        alone = single.training_loss(features[run], labels, cross_entropy_criterion(labels))
        assert abs(float((losses[run] - alone.sum()).detach())) < 1e-5
    with pytest.raises(ValueError, match="class set its head was built for"):
        batched.set_classnames(["boxer"])
        batched.training_loss(features, labels, cross_entropy_criterion(labels))
    assert METHODS["dept-kgcoop"].base_class.name == "kgcoop"


def test_recipes():
    original, recipe = dept_coop_recipe("original", "base2new", 16, "OxfordPets")
    assert (original.context_length, original.init_words, original.head_lambda, original.head_lr_scale) == (
        16, "", 0.7, 6.5)
    assert recipe == OptimRecipe(epochs=10, batch_size=4, lr=0.0035)
    assert dept_coop_recipe("paper", "cross_dataset", 16, "ImageNet")[0].init_words == "a photo of a"
    config, recipe = dept_cocoop_recipe("paper", "base2new", 16, "DTD")
    assert (config.context_length, recipe.batch_size, recipe.lr) == (4, 1, 0.002)
    config, recipe = dept_kgcoop_recipe("original", "base2new", 16, "EuroSAT")
    assert (config.kg_weight, config.template, recipe.epochs) == (2.0, "a centered satellite photo of {}.", 10)
    for function in (dept_coop_recipe, dept_cocoop_recipe, dept_kgcoop_recipe):
        with pytest.raises(MissingRecipe):
            function("paper", "few_shot", 16, "DTD")
    with pytest.raises(ValueError, match="head_lambda"):
        DePTCoOpConfig(head_lambda=1.5)
    with pytest.raises(ValueError, match="head_text_targets"):
        DePTCoOpConfig(head_text_targets="prototype")


def test_only_the_similarity_logits_are_observed_by_the_schedule(tiny):
    """OLS learns its targets from the class predictions: DePT's head terms go through the criterion unobserved."""
    method = build(tiny, "dept-coop")
    labels = torch.tensor([1, 0, 3, 1])
    observed = []

    class Recorded(LossCriterion):
        def per_run(self, logits, observe=True):
            observed.append(observe)
            return super().per_run(logits, observe)

    criterion = Recorded(lambda z, r: F.cross_entropy(z, labels), [4])
    method.training_loss(tiny.encode_image(torch.randn(4, 3, 32, 32)), labels, criterion)
    assert len(observed) == 3 and observed.count(True) == 1  # similarity, head text rows, head image rows
