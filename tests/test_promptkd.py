"""PromptKD equals a literal re-implementation of its official trainer (zhengli97/PromptKD trainers/promptkd.py with
clip/model.py's IVLP towers): the teacher's class-prompt tokens, its prompted text and image features and its logits
at its own temperature, the student's prompted image tower, its projector (1x1 convs, BatchNorm2d on the batch's
statistics while training and the running ones at test), its logits on the teacher's text, the distillation loss
``w T^2 KL_sum / numel`` and the gradient of every learned tensor, at the initialisation and a moved point, with a
tiny teacher of another architecture. Negative controls (prompts without their phrase, the teacher's deep text prompts
left out, the teacher at the student's temperature, BatchNorm's running statistics in training, the batch's at test,
a "batchmean" KL, no T^2, the reverse KL) are caught. The teacher's prompted view features come from a cache file
keyed by its weights and prompts; its prompts load from a record or the official checkpoint, and a missing or
mismatched teacher is refused at planning; PromptKD trains on every training image of the domain and refuses label
schedules."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
from atlas_fast.methods.config import MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.promptkd import PromptKD, PromptKDConfig, promptkd_recipe
from atlas_fast.methods.promptkd_teacher import load_teacher
from equivalence import assert_caught, assert_equivalent, assert_gradient_equivalent, report_ratios
from helpers import assert_same_calibration, cross_entropy_criterion, small_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: extra threads only contend

# Gradients relative to their largest entry: the prompted tower's fused attention sums in another order than the
# blocks' own forward, and the BatchNorm over a handful of images divides those float32 differences by the batch's
# spread (its controls differ by far more).
GRAD_ATOL = 5e-5
# At ViT-B/16's shapes float32 itself is that far from the exact gradients: against a float64 run of the official
# computation, the official float32 code is off by up to 7.6e-5 (visual prompts) and 2.6e-4 (the projector's first
# map) of each gradient's largest entry, atlas_fast's by 1.0e-4 and 2.5e-4 (random ViT-B/16 weights, 3 images).
VIT_GRAD_ATOL = 5e-4
# A padded run's 3 rows go through other matrix kernels than its 3-row batch alone, and the BatchNorm over 3 rows
# divides those float32 roundings by their spread (up to 1.0e-4 of the largest entry here; 0 at 4 and 5 rows).
BATCHED_GRAD_ATOL = 2e-4

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]
TEACHER = dict(teacher="atlas-tiny-teacher", teacher_pretrained="none", teacher_prompts="none",
               teacher_depth_text=2, teacher_depth_vision=2)
CONFIG = PromptKDConfig(depth_vision=2, kd_weight=10.0, temperature=2.0, **TEACHER)


# --- the official trainer, literally (clip/model.py's IVLP blocks on open_clip's modules) ---------------------------
def official_vision(visual, pixels, vpt, deep):
    """VisionTransformer.forward of the IVLP design: prompts appended after the patches, replaced at the input of
    blocks 1..J-1, the class token's output projected."""
    x = visual.conv1(pixels)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    cls = visual.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1])
    x = torch.cat([cls, x], dim=1) + visual.positional_embedding
    n = vpt.shape[0]
    x = visual.ln_pre(torch.cat([x, vpt.expand(x.shape[0], -1, -1)], dim=1))
    for i, block in enumerate(visual.transformer.resblocks):
        if 1 <= i <= len(deep):
            x = torch.cat([x[:, :-n], deep[i - 1].expand(x.shape[0], -1, -1)], dim=1)
        x = block(x)
    return visual.ln_post(x[:, 0]) @ visual.proj


def official_prompt_ids(backbone, names, prefix="a photo of a"):
    return backbone.tokenizer([f"{prefix} {n.replace('_', ' ')}." for n in names])


def official_text(backbone, ctx, deep, names):
    """VLPromptLearner + TextEncoder: [SOT][ctx][class tokens][.][EOT] over all 77 positions, the deep prompts
    replacing positions 1..M at the input of blocks 1..J-1, the EOT token's output projected."""
    model, n = backbone.model, ctx.shape[0]
    ids = official_prompt_ids(backbone, names)
    with torch.no_grad():
        embedding = model.token_embedding(ids)
    x = torch.cat([embedding[:, :1], ctx.expand(len(names), -1, -1), embedding[:, 1 + n:]], dim=1)
    x = x + model.positional_embedding
    for i, block in enumerate(model.transformer.resblocks):
        if 1 <= i <= len(deep):
            x = torch.cat([x[:, :1], deep[i - 1].expand(len(names), -1, -1), x[:, 1 + n:]], dim=1)
        x = block(x, attn_mask=model.attn_mask)
    x = model.ln_final(x)
    return x[torch.arange(len(names)), ids.argmax(dim=-1)] @ model.text_projection


def official_projector(method, train=True):
    """Feature_Trans_Module_two_layer(D_s, D_t) holding the method's tensors (as leaves with their own grads)."""
    d_t, d_s = method.proj_w1.shape[1:]
    proj = nn.Sequential(nn.Conv2d(d_s, d_t, 1), nn.BatchNorm2d(d_t), nn.ReLU(inplace=True), nn.Conv2d(d_t, d_t, 1))
    with torch.no_grad():
        proj[0].weight.copy_(method.proj_w1[0].view(d_t, d_s, 1, 1))
        proj[0].bias.copy_(method.proj_b1[0])
        proj[1].weight.copy_(method.proj_gamma[0])
        proj[1].bias.copy_(method.proj_beta[0])
        proj[1].running_mean.copy_(method.proj_running_mean[0])
        proj[1].running_var.copy_(method.proj_running_var[0])
        proj[3].weight.copy_(method.proj_w2[0].view(d_t, d_t, 1, 1))
        proj[3].bias.copy_(method.proj_b2[0])
    return proj.train(train)


def official_loss(stu_logits, tea_logits, weight, temperature, reduction="sum", squared=True, reverse=False):
    """forward_backward: KD_WEIGHT * KL(softmax(tea / T) || log_softmax(stu / T)) summed * T * T / numel."""
    if reverse:
        stu_logits, tea_logits = tea_logits, stu_logits
    kl = F.kl_div(F.log_softmax(stu_logits / temperature, dim=1), F.softmax(tea_logits / temperature, dim=1),
                  reduction=reduction)
    kl = kl * (temperature * temperature if squared else 1.0)
    return weight * (kl / stu_logits.numel() if reduction == "sum" else kl)


@pytest.fixture()
def teacher_at_another_temperature(monkeypatch):
    """The tiny teacher's logit scale moved off the student's (both start at 1/0.07), so that scoring the teacher at
    the student's temperature differs from the official (its own). PromptKD's prompted teachers kept by an earlier
    test may wrap a teacher CLIP the backbone store has since let go, so they are set aside: the method's teacher is
    then built on the one moved here."""
    import atlas_fast.methods.promptkd_teacher as promptkd_teacher

    monkeypatch.setattr(promptkd_teacher, "_TEACHERS", {})
    monkeypatch.setattr(promptkd_teacher, "_TEACHER_TEXT", {})
    teacher = shared_backbone(BackboneConfig("atlas-tiny-teacher", None))
    saved = teacher.model.logit_scale.detach().clone()
    teacher.model.logit_scale.data.fill_(math.log(40.0))
    yield
    teacher.model.logit_scale.data.copy_(saved)


def build(student, config, moved):
    torch.manual_seed(0)
    method = build_method("promptkd", student, CLASSNAMES, config)
    if moved:
        with torch.no_grad():
            for param in method.parameters():
                param.add_(0.05 * torch.randn_like(param))
            method.proj_running_mean.add_(0.3 * torch.randn_like(method.proj_running_mean))
            method.proj_running_var.mul_(1.5).add_(0.2)
    return method


def check(student, method, prefix, pixels, grad_atol=GRAD_ATOL):
    """Every quantity of one training step and the test-time logits against the official trainer."""
    teacher = method.teacher
    tea_model, prompts = teacher.model.clip, teacher.model.prompts
    config = method.config
    # the teacher's class prompts: token ids (the SOT, the class tokens after the context, the EOT position)
    prompts.set_classnames(CLASSNAMES)
    ids = official_prompt_ids(teacher, CLASSNAMES)
    n = prompts.n_ctx
    used = prompts.class_prompts.token_suffix.shape[1] + 1 + n
    with torch.no_grad():
        embedding = tea_model.token_embedding(ids)
    assert torch.equal(prompts.eot_index, ids.argmax(dim=-1))
    assert_equivalent(f"{prefix} teacher prompt tokens", prompts.class_prompts.token_suffix,
                      embedding[:, 1 + n:used], atol=0, rtol=0)
    bare = teacher.tokenizer([f"{c.replace('_', ' ')}." for c in CLASSNAMES])
    assert not torch.equal(bare.argmax(dim=-1), prompts.eot_index), "control: prompts without their phrase"
    # the teacher's text and image features and logits (its own temperature)
    t_ctx, t_deep = prompts.ctx[0], list(prompts.deep_text[0])
    text = F.normalize(official_text(teacher, t_ctx, t_deep, CLASSNAMES), dim=-1)
    assert_equivalent(f"{prefix} teacher text", method.teacher_text(), text)
    assert_caught("teacher text without its deep prompts", method.teacher_text(),
                  F.normalize(official_text(teacher, t_ctx, [], CLASSNAMES), dim=-1))
    with torch.no_grad():
        t_image = official_vision(tea_model.visual, pixels, prompts.vision_ctx[0], list(prompts.deep_vision[0]))
    cached = teacher.encode_image(pixels)  # what the feed's cache file holds for these views
    assert_equivalent(f"{prefix} teacher image features", cached, t_image, atol=1e-5)
    tea_logits = tea_model.logit_scale.exp() * F.normalize(t_image, dim=-1) @ text.t()
    assert_equivalent(f"{prefix} teacher logits", method.teacher_logits(cached), tea_logits, atol=1e-4)
    at_student = student.model.logit_scale.exp() * F.normalize(t_image, dim=-1) @ text.t()
    assert_caught("teacher at the student's temperature", method.teacher_logits(cached), at_student)

    # the student's step, official: prompted image tower, projector in training mode, logits on the teacher's text
    p = {name: t.detach()[0].clone().requires_grad_(True) for name, t in method.named_parameters()}
    deep = list(p["deep_vision"].unbind(0)) if "deep_vision" in p else []
    proj = official_projector(method)  # its BatchNorm's running statistics, before the step updates them
    stu_image = official_vision(student.model.visual, pixels, p["vision_ctx"], deep)
    conv_w1 = p["proj_w1"].view(*p["proj_w1"].shape, 1, 1)
    conv_w2 = p["proj_w2"].view(*p["proj_w2"].shape, 1, 1)

    def projected(x, bn_training=True, bn=proj[1]):
        h = F.conv2d(x[..., None, None], conv_w1, p["proj_b1"])
        h = F.batch_norm(h, bn.running_mean.clone(), bn.running_var.clone(), p["proj_gamma"], p["proj_beta"],
                         training=bn_training, momentum=0.1, eps=1e-5)
        return F.conv2d(F.relu(h), conv_w2, p["proj_b2"]).flatten(1)

    scale = student.model.logit_scale.exp()
    stu_logits = scale * F.normalize(projected(stu_image), dim=-1) @ text.t()
    method.train()
    labels = torch.zeros(len(pixels), dtype=torch.long)
    loss = method.training_loss((pixels, cached), labels, cross_entropy_criterion(labels))
    loss.backward()
    reference = official_loss(stu_logits, tea_logits, config.kd_weight, config.temperature)
    reference.backward(retain_graph=True)
    assert_equivalent(f"{prefix} loss", loss, reference)
    with torch.no_grad():
        assert_caught("KL 'batchmean' (over B, not B x C)", loss,
                      official_loss(stu_logits, tea_logits, config.kd_weight, config.temperature, "batchmean"))
        assert_caught("no T^2", loss, official_loss(stu_logits, tea_logits, config.kd_weight, config.temperature,
                                                    squared=False))
        assert_caught("reverse KL", loss, official_loss(stu_logits, tea_logits, config.kd_weight, config.temperature,
                                                        reverse=True))
    wrong_bn = official_loss(scale * F.normalize(projected(stu_image, bn_training=False), dim=-1) @ text.t(),
                             tea_logits, config.kd_weight, config.temperature)
    assert_caught("BatchNorm's running statistics in training", loss, wrong_bn)
    grads = {name: p[name].grad.clone() for name in p}
    for param in p.values():
        param.grad = None
    wrong_bn.backward()
    for name, param in method.named_parameters():
        scale_g = grads[name].abs().max()
        if name == "proj_b1":  # the bias before a training BatchNorm: its gradient is 0 (the batch mean removes it)
            reference_scale = grads["proj_w1"].abs().max()
            assert_equivalent(f"{prefix} grad {name} (0)", param.grad[0] / reference_scale,
                              torch.zeros_like(grads[name]), atol=grad_atol)
            assert_equivalent(f"{prefix} grad {name} (0, official)", grads[name] / reference_scale,
                              torch.zeros_like(grads[name]), atol=grad_atol)
            assert_caught(f"grad {name} with BatchNorm's running statistics", param.grad[0] / reference_scale,
                          p[name].grad / reference_scale, atol=grad_atol, rtol=0)
            continue
        assert_gradient_equivalent(f"{prefix} grad {name}", param.grad[0], grads[name], atol=grad_atol)
        assert_caught(f"grad {name} with BatchNorm's running statistics", param.grad[0] / scale_g,
                      p[name].grad / scale_g, atol=grad_atol, rtol=0)

    # test time: the projector on its running statistics (the official model.eval())
    method.eval()
    with torch.no_grad():
        eval_logits = method(pixels)[0]
        proj_eval = official_projector(method, train=False)
        official_eval = scale * F.normalize(proj_eval(official_vision(
            student.model.visual, pixels, method.vision_ctx[0],
            list(method.deep_vision[0]) if method.deep_vision is not None else [])[..., None, None]).flatten(1),
            dim=-1) @ text.t()
        assert_equivalent(f"{prefix} test logits", eval_logits, official_eval, atol=1e-4)
        assert_caught("batch statistics at test", eval_logits, stu_logits.detach(), atol=1e-4)
    method.train()


@pytest.mark.usefixtures("teacher_at_another_temperature")
@pytest.mark.parametrize("moved", [False, True])
def test_every_quantity_matches_the_official_trainer(tiny, moved):
    method = build(tiny, CONFIG, moved)
    torch.manual_seed(1)
    check(tiny, method, f"PromptKD tiny{' moved' if moved else ''}", torch.randn(5, 3, 32, 32))
    print("\n" + report_ratios("PromptKD tiny"))


def test_the_running_statistics_follow_torch_s_batchnorm(tiny):
    """One training forward updates the running mean and (unbiased) variance as BatchNorm2d does; a batch of one
    leaves the variance (the official loader never forms such a batch)."""
    method = build(tiny, CONFIG, moved=True)
    proj = official_projector(method)
    pixels = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        features = method.image_encoder(pixels, *method.vision_prompts())
        proj(features[0][..., None, None])
        method.project(features)
    assert_equivalent("PromptKD running mean", method.proj_running_mean[0], proj[1].running_mean, atol=1e-6)
    assert_equivalent("PromptKD running var", method.proj_running_var[0], proj[1].running_var, atol=1e-6)
    var = method.proj_running_var.clone()
    with torch.no_grad():
        method.project(features[:, :1])
    assert torch.equal(method.proj_running_var, var) and torch.isfinite(method.proj_running_mean).all()
    state = method.state_for_checkpoint()
    assert {"proj_running_mean", "proj_running_var"} <= set(state)
    other = build(tiny, CONFIG, moved=False)
    other.load_checkpoint_state(state)
    assert torch.equal(other.proj_running_var, method.proj_running_var)


def official_checkpoint(prompts, path, width_cut=0):
    """A Dassl checkpoint of PromptSRC's CustomCLIP as the official teacher ships it (keys of clip/model.py)."""
    state = {"prompt_learner.ctx": prompts.ctx[0].detach().clone(),  # noqa: the buffers below are ignored
             "image_encoder.VPT": prompts.vision_ctx[0].detach().clone()[..., width_cut:],
             "prompt_learner.token_prefix": torch.zeros(3, 1, 8)}
    for i, t in enumerate(prompts.deep_text[0], start=1):
        state[f"text_encoder.transformer.resblocks.{i}.VPT_shallow"] = t.detach().clone()
    for i, t in enumerate(prompts.deep_vision[0], start=1):
        state[f"image_encoder.transformer.resblocks.{i}.VPT_shallow"] = t.detach().clone()[..., width_cut:]
    torch.save({"state_dict": state, "epoch": 20}, path)
    return path


def test_teacher_prompts_load_from_the_official_checkpoint_and_mismatches_are_refused(tiny, tmp_path_factory):
    """The official Dassl checkpoint's prompts are the teacher's (and so is its fingerprint); a missing, unreadable,
    foreign or ill-fitting teacher is refused when the run is planned, before anything is encoded, naming the
    option."""
    import json

    from atlas_fast.engine.spec import plan_run

    root = small_pets(tmp_path_factory, "promptkd-teacher")
    none = load_teacher(CONFIG, "cpu")
    torch.manual_seed(3)
    prompts = none.model.prompts
    moved = {name: t.detach() + 0.1 * torch.randn_like(t) for name, t in prompts.named_parameters()}
    dassl = official_checkpoint(_Prompts(moved), tmp_path_factory.mktemp("dassl") / "model-best.pth.tar")
    from_file = load_teacher(dataclasses.replace(CONFIG, teacher_prompts=str(dassl)), "cpu")
    for name, tensor in from_file.model.prompts.named_parameters():
        assert torch.equal(tensor.detach(), moved[name]), name
    assert from_file.fingerprint != none.fingerprint  # the cache files of two teachers' views never mix

    def planned(**options):
        return plan_run(tiny_pets_config(root, method="promptkd", method_options={**TEACHER, "depth_vision": 2,
                                                                                   **options}))

    with pytest.raises(ValueError, match=r"PromptKD needs its teacher's prompts: --method-option teacher_prompts="):
        planned(teacher_prompts="")
    with pytest.raises(FileNotFoundError, match=r"teacher_prompts .*nowhere.pt is not a file"):
        dataclasses.replace(CONFIG, teacher_prompts=str(root / "nowhere.pt"))  # the config's own check
    record = root / "student.json"  # a record of a run on another backbone than the teacher's
    record.write_text(json.dumps({"config": {"method": "promptsrc", "backbone": {"model": "atlas-tiny",
                                                                                 "pretrained": None}}}))
    with pytest.raises(ValueError, match=r"trained on atlas-tiny \(random init\), but the teacher is "
                                         r"atlas-tiny-teacher .*teacher=MODEL teacher_pretrained="):
        planned(teacher_prompts=str(record))
    narrow = official_checkpoint(_Prompts(moved), tmp_path_factory.mktemp("dassl") / "narrow.pth.tar", 8)
    with pytest.raises(ValueError, match=r"teacher prompts \(Dassl checkpoint .*narrow.pth.tar\) do not fit the "
                                         r"teacher atlas-tiny-teacher.*teacher_prompts=RECORD\|FILE\|none"):
        planned(teacher_prompts=str(narrow))
    # a teacher that cannot be loaded names the teacher's options (an unknown model read only "Unknown model")
    with pytest.raises(ValueError, match=r"PromptKD's teacher atlas-tny \(none\) cannot be loaded: Unknown model "
                                         r"'atlas-tny'.*did you mean atlas-tiny.*--method-option teacher=MODEL"):
        planned(teacher="atlas-tny")
    # the initial teacher's shapes are PromptKD's teacher_* options, named as the user sets them (PromptSRC's own
    # field names alone sent users to depth_text=, the student's option space)
    with pytest.raises(ValueError, match=r"teacher_prompts=none\): PromptSRC: depth_text must be in \[1, 3\] \(the tower has 3 blocks\), got 9; "
                                         r"PromptSRC's field X is PromptKD's option teacher_X: set them with "
                                         r"--method-option .*teacher_depth_text=J"):
        planned(teacher_depth_text=9)
    with pytest.raises(ValueError, match=r"teacher_prompts=none\): PromptSRCConfig.depth_vision must be .*got -1; "
                                         r".*teacher_depth_vision=J"):
        dataclasses.replace(CONFIG, teacher_depth_vision=-1)  # the config's own check
    wrong = tmp_path_factory.mktemp("dassl") / "other.pth"
    torch.save({"state_dict": {"weight": torch.zeros(2)}}, wrong)
    with pytest.raises(ValueError, match=r"is not a PromptSRC prompt-learner checkpoint"):
        PromptKD.check_before_work(dataclasses.replace(CONFIG, teacher_prompts=str(wrong)), tiny)
    assert not list(root.rglob("*.h5"))  # nothing was encoded for the refused runs


class _Prompts:
    """Named prompt tensors with the attribute access of a PromptSRC module (for :func:`official_checkpoint`)."""

    def __init__(self, tensors):
        for name, value in tensors.items():
            setattr(self, name, value)


@pytest.mark.slow
def test_teacher_prompts_load_from_a_promptsrc_record_trained_on_the_teacher(tmp_path_factory):
    """A PromptSRC record trained by atlas_fast on the teacher's CLIP gives the teacher its learned prompts (checked
    against the record's tensors), the same teacher as the same prompts in the official checkpoint's layout."""
    from atlas_fast.engine import run

    root = small_pets(tmp_path_factory, "promptkd-record")
    run(tiny_pets_config(root, method="promptsrc", method_options=dict(depth_text=2, depth_vision=2),
                         backbone=BackboneConfig("atlas-tiny-teacher", None)))
    path = next((root / "results").rglob("promptsrc-*.json"))
    learned = torch.load(path.with_suffix(".pt"), weights_only=True)
    from_record = load_teacher(dataclasses.replace(CONFIG, teacher_prompts=str(path)), "cpu")
    for name, tensor in from_record.model.prompts.named_parameters():
        assert torch.equal(tensor.detach(), learned[name]), name
    dassl = official_checkpoint(from_record.model.prompts, tmp_path_factory.mktemp("dassl") / "model-best.pth.tar")
    from_file = load_teacher(dataclasses.replace(CONFIG, teacher_prompts=str(dassl)), "cpu")
    assert from_file.fingerprint == from_record.fingerprint != load_teacher(CONFIG, "cpu").fingerprint


def test_the_teacher_s_prompted_views_come_from_a_cache_file_of_its_weights_and_prompts(tmp_path_factory):
    """The feed serves the teacher's prompted features of exactly the run's views, from a file keyed by the teacher's
    weights and prompts; another set of prompts gets another file. The student trains on every training image of
    every class (base-to-new: base and new, whatever the shots)."""
    from atlas_fast.clip.transforms import load_views
    from atlas_fast.engine.feed import prepare_inputs
    from atlas_fast.engine.spec import plan_run

    root = small_pets(tmp_path_factory, "promptkd-cache")
    options = {**TEACHER, "depth_vision": 2}
    spec = plan_run(tiny_pets_config(root, method="promptkd", views=2, shots=1, method_options=options))
    train = spec.data.train_split
    assert len(train.train) == 16 and len(train.classnames) == 4  # 4 classes x 4 images, not 2 base x 1 shot
    assert list(spec.data.splits) == ["base", "new", "all"] and len(spec.data.splits["base"].classnames) == 2
    backbone = spec.backbone()
    inputs = prepare_inputs(spec, backbone).train_inputs
    teacher = build_method("promptkd", backbone, ["x"], spec.method_config).teacher
    items = train.train
    served = inputs.frozen.for_epoch(1)
    assert served.shape == (16, teacher.embed_dim)
    pixels = torch.stack([load_views(d.impath, d.key, [2], backbone.transform)[0] for d in items[:3]])
    torch.testing.assert_close(served[:3], teacher.encode_image(pixels), atol=2e-3, rtol=2e-3)
    files = sorted(p.name for p in (root / "cache" / "OxfordPets").glob("*.h5"))
    assert any(f.startswith(teacher.fingerprint[:12]) for f in files)
    other = plan_run(tiny_pets_config(root, method="promptkd", views=2, shots=1,
                                      method_options={**options, "teacher_depth_vision": 3}))
    prepare_inputs(other, backbone)
    assert len(list((root / "cache" / "OxfordPets").glob("*.h5"))) == len(files) + 1


def test_runs_train_without_labels_on_the_domain_and_label_schedules_are_refused(tmp_path_factory):
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine import run

    root = small_pets(tmp_path_factory, "promptkd-run")
    options = {**TEACHER, "depth_vision": 2}
    with pytest.raises(ValueError, match=r"promptkd trains without labels.*\+ ATLaS"):
        run(tiny_pets_config(root, method="promptkd", method_options=options, schedule=Alternating(2),
                             soft_labels=soft_label_preset("base2new", "isl")))
    record = run(tiny_pets_config(root, method="promptkd", method_options=options))
    assert record["config"]["method_config"]["teacher"] == "atlas-tiny-teacher"
    assert record["data"]["num_train"] == 16 and len(record["data"]["classnames"]) == 4
    assert set(record["metrics"]) >= {"base", "new", "H"} and record["epochs"][-1]["loss"] >= 0
    # a saved run evaluates again through its teacher's text (the projector on its saved running statistics)
    from atlas_fast.engine.pipeline import evaluate_saved

    again = evaluate_saved(record["path"], "OxfordPets", root / "data", subsample="new", cache_root=root / "cache",
                           device="cpu", progress=False)
    assert again["accuracy"] == pytest.approx(record["metrics"]["new"], abs=1e-6)


def test_the_memory_planner_counts_no_text_tower_for_the_student(tiny):
    """PromptKD's classifier is its teacher's fixed text features: its step keeps no text-tower activations, so the
    planner's estimate does not grow with C (it did: 94x autograd's saved bytes at C = 1,000 on the tiny model)."""
    from atlas_fast.engine import memory
    from atlas_fast.methods.ivlp import IVLP

    assert memory.step_bytes_per_run(PromptKD, tiny, 1000, 8, False) == memory.step_bytes_per_run(
        PromptKD, tiny, 1, 8, False) > 0
    assert memory.step_bytes_per_run(IVLP, tiny, 1000, 8, False) > memory.step_bytes_per_run(IVLP, tiny, 1, 8, False)


def test_recipes_and_configs():
    config, recipe = promptkd_recipe("paper", "base2new", 16, "OxfordPets")
    assert (config.n_ctx_vision, config.depth_vision, config.kd_weight, config.temperature, config.teacher,
            config.teacher_pretrained, config.teacher_depth_text, config.teacher_n_ctx_text) == (
        4, 9, 1000.0, 1.0, "ViT-L-14", "openai", 9, 4)
    assert recipe == OptimRecipe(epochs=20, batch_size=8, lr=0.005)
    assert promptkd_recipe("original", "base2new", 16, "DescribableTextures")[0].kd_weight == 200.0
    config, recipe = promptkd_recipe("paper", "cross_dataset", 16, "ImageNet")
    assert (config.depth_vision, config.kd_weight, recipe.epochs) == (3, 1000.0, 20)
    with pytest.raises(MissingRecipe):
        promptkd_recipe("paper", "few_shot", 4, "DescribableTextures")
    with pytest.raises(ValueError, match="temperature"):
        PromptKDConfig(temperature=0.0)
    with pytest.raises(ValueError, match=re.escape("kd_weight")):
        PromptKDConfig(kd_weight=-1.0)


@pytest.mark.slow
def test_vit_b16_student_with_a_vit_b32_teacher_matches_the_official_trainer():
    """The official shapes: a ViT-B/16 student (768-wide tower, 512-d features, 224 px views, depth 9) and a 224 px
    random teacher of another architecture (ViT-B/32, 2-block prompts) through the projector 512 -> 512."""
    from atlas_fast.clip.backbones import load_backbone

    student = load_backbone(BackboneConfig("ViT-B-16", None))
    config = PromptKDConfig(teacher="ViT-B-32", teacher_pretrained="none", teacher_prompts="none",
                            teacher_depth_text=3, teacher_depth_vision=3, temperature=2.0, kd_weight=10.0)
    method = build(student, config, moved=True)
    teacher = method.teacher
    saved = teacher.model.logit_scale.detach().clone()
    teacher.model.logit_scale.data.fill_(math.log(40.0))
    try:
        torch.manual_seed(1)
        check(student, method, "PromptKD ViT-B/16", torch.randn(3, 3, 224, 224), grad_atol=VIT_GRAD_ATOL)
    finally:
        teacher.model.logit_scale.data.copy_(saved)
    print("\n" + report_ratios("PromptKD ViT-B/16"))


def test_the_experiment_block_sets_promptkd_against_promptsrc_plain_and_with_atlas():
    """beyond_base_to_new's PromptKD block: PromptSRC on the student's CLIP on PromptKD's schedule (20 epochs, batch
    8, lr 0.005), plain and + ATLaS, then PromptKD; on the world its teacher is the world's CLIP, its prompts at their
    initialisation at depth 4 unless named."""
    from atlas_fast.experiments import beyond_base_to_new as module
    from atlas_fast.experiments.common import build_parser

    args = build_parser(module).parse_args(["--world", "--methods", "promptkd", "--kinds", "isl", "--datasets",
                                            "WorldSketches", "--seeds", "1", "2"])
    args.method_option = []
    configs = module.method_block(args, "promptkd")
    assert [(c.method, c.schedule.name, c.seed) for c in configs] == [
        ("promptsrc", "onehot", 1), ("promptsrc", "onehot", 2), ("promptsrc", "atlas", 1), ("promptsrc", "atlas", 2),
        ("promptkd", "onehot", 1), ("promptkd", "onehot", 2)]
    assert {(c.epochs, c.batch_size, c.lr) for c in configs[:4]} == {(20, 8, 0.005)}
    assert configs[-1].method_options == {"teacher": "atlas-world", "teacher_pretrained": "atlas-world",
                                          "teacher_prompts": "none", "teacher_depth_text": "4",
                                          "teacher_depth_vision": "4"}
    args.method_option = ["promptkd:teacher_prompts=/records/teacher.json"]
    assert module.method_block(args, "promptkd")[-1].method_options["teacher_prompts"] == "/records/teacher.json"


@pytest.mark.slow
def test_trains_base_to_new_on_the_world_from_the_command_line(tmp_path):
    """``atlas-fast train`` on a world dataset (the world's CLIP as student and teacher, PromptSRC prompts at their
    initialisation), base and new evaluated; ATLaS refused with the reason."""
    from atlas_fast.cli import main
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    generate_benchmark(tmp_path / "data", ["WorldSketches"], sizes=SplitSizes(train=2, val=1, test=1), progress=False)
    common = ["train", "--dataset", "WorldSketches", "--data-root", str(tmp_path / "data"), "--method", "promptkd",
              "--method-option", "teacher=atlas-world", "teacher_pretrained=atlas-world", "teacher_prompts=none",
              "teacher_depth_text=4", "teacher_depth_vision=4", "--epochs", "2", "--views", "1",
              "--cache-root", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "results"), "--no-progress"]
    assert main(common) == 0
    record = next((tmp_path / "results").rglob("promptkd-*.json")).read_text()
    assert '"H"' in record and '"new"' in record
    assert main(common + ["--atlas", "isl"]) != 0


@pytest.mark.slow
def test_the_teacher_benchmark_prints_both_rows_their_ratio_and_the_memory_check(capsys):
    """benchmarks/promptkd_teacher.py on the tiny models (a smoke test, not a timing): the cached-teacher and
    teacher-every-step rows side by side, their time and FLOP ratios, and the step at C = 1,000 beside the planner."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "promptkd_teacher.py"
    spec = importlib.util.spec_from_file_location("promptkd_teacher", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--steps", "1", "--classes", "5", "--batch", "3", "--memory"])
    out = capsys.readouterr().out
    assert "| teacher features cached (atlas_fast) |" in out and "| teacher run every step (official) |" in out
    ratio = float(re.search(r"teacher every step / teacher cached: [\d.]+x time, ([\d.]+)x FLOPs", out).group(1))
    assert ratio > 1.5  # the tiny teacher's image tower costs more than the student's whole step
    assert re.search(r"step at C = 1000, batch 3: autograd keeps [\d.]+ MiB .* the planner estimates", out)


def test_runs_trained_together_equal_runs_trained_alone(tiny):
    """R = 2 runs as one module, one batch each, the second zero-padded (3 of 5 rows its own): each run's loss, the
    gradient of each of its tensors and its BatchNorm's running statistics are those of training it alone."""
    alone = [build(tiny, CONFIG, moved=True), build(tiny, CONFIG, moved=False)]
    together = build_method("promptkd", tiny, CLASSNAMES, CONFIG, runs=2)
    together.load_checkpoint_state({name: torch.cat([a.state_for_checkpoint()[name] for a in alone])
                                    for name in alone[0].state_for_checkpoint()})
    torch.manual_seed(5)
    pixels = torch.randn(2, 5, 3, 32, 32)
    sizes = [5, 3]
    pixels[1, 3:] = 0
    teacher = together.teacher
    features = torch.stack([teacher.encode_image(p) for p in pixels])

    labels = torch.zeros(2, 5, dtype=torch.long)
    losses = together.training_loss((pixels, features), labels, cross_entropy_criterion(labels, sizes))
    losses.sum().backward()
    for r, (method, n) in enumerate(zip(alone, sizes)):
        loss = method.training_loss((pixels[r, :n], features[r, :n]), labels[r, :n], cross_entropy_criterion(labels[r, :n]))
        loss.backward()
        assert_equivalent(f"PromptKD batched loss run {r}", losses[r], loss)
        grads = dict(together.named_parameters())
        for name, param in method.named_parameters():
            if name == "proj_b1":  # 0 but for rounding (the training BatchNorm removes it): against proj_w1's scale
                scale = param.grad.new_tensor(1.0) / dict(method.named_parameters())["proj_w1"].grad.abs().max()
                assert_equivalent(f"PromptKD batched grad {name} run {r}", grads[name].grad[r] * scale,
                                  param.grad[0] * scale, atol=BATCHED_GRAD_ATOL)
                continue
            assert_gradient_equivalent(f"PromptKD batched grad {name} run {r}", grads[name].grad[r], param.grad[0],
                                       atol=BATCHED_GRAD_ATOL)
        for name in ("proj_running_mean", "proj_running_var"):
            assert_equivalent(f"PromptKD batched {name} run {r}", getattr(together, name)[r],
                              getattr(method, name)[0], atol=1e-6)


@pytest.mark.slow
def test_a_group_of_runs_equals_its_runs_trained_alone(tmp_path_factory):
    """Through the engine: two seeds of PromptKD trained as one group give each the record of training it alone
    (losses, metrics, learned tensors)."""
    from atlas_fast.engine import run
    from atlas_fast.engine.pipeline import run_group
    from atlas_fast.engine.record import load_learned

    root = small_pets(tmp_path_factory, "promptkd-group")
    options = {**TEACHER, "depth_vision": 2, "kd_weight": 1.0}  # losses near 1: the records' 1e-5 is float32's

    def configs(results):
        return [tiny_pets_config(root, method="promptkd", method_options=options, seed=seed, views=2, epochs=3,
                                 results_dir=root / results) for seed in (1, 2)]

    alone = [run(config) for config in configs("alone")]
    together = run_group(configs("together"))
    assert all(r["timings"]["batch_runs"] == 2 for r in together)
    for b, a in zip(together, alone):  # tests/test_batched.py's comparison, but for proj_b1 (below)
        assert b["key"] == a["key"] and b["config"] == a["config"] and b["data"] == a["data"]
        assert [e["loss"] for e in b["epochs"]] == pytest.approx([e["loss"] for e in a["epochs"]], abs=1e-5)
        for name in b["metrics"].keys() - {"zero_shot", "calibration"}:
            assert b["metrics"][name] == pytest.approx(a["metrics"][name], abs=1e-5)
        assert_same_calibration(b["metrics"]["calibration"], a["metrics"]["calibration"], abs=1e-3)
        own = load_learned(a["path"])
        for name, tensor in load_learned(b["path"]).items():
            # the bias before the training BatchNorm has a gradient of 0 but for rounding: it drifts by float32's
            # noise (1e-5 after 3 epochs), and the running mean with it; the BatchNorm removes it from every output
            drift = name in ("proj_b1", "proj_running_mean")
            torch.testing.assert_close(tensor, own[name], atol=1e-4 if drift else 1e-5, rtol=1.3e-6,
                                       msg=lambda text, name=name: f"{name}: {text}")


def test_the_group_planner_counts_the_resident_teacher(tmp_path_factory, monkeypatch):
    """A group's R leaves room for the teacher's weights beside the student's (they stay on the device for the text
    features of each class set): with memory for 3 runs' steps besides the student alone, the teacher's weights
    lower R."""
    from atlas_fast.engine import memory
    from atlas_fast.engine.spec import plan_run
    from atlas_fast.engine.group import group_size

    root = small_pets(tmp_path_factory, "promptkd-plan")
    spec = plan_run(tiny_pets_config(root, method="promptkd", method_options={**TEACHER, "depth_vision": 2}))
    backbone = spec.backbone()
    per_run = memory.step_bytes_per_run(spec.method, backbone, spec.data.train_split.num_classes,
                                        spec.optim_recipe.batch_size, spec.amp)
    student = memory.frozen_bytes(backbone, spec.amp)
    teacher = memory.frozen_bytes(spec.method.view_teacher(spec.method_config, backbone), spec.amp)
    assert teacher > per_run  # the tiny teacher's weights outweigh a run's step
    monkeypatch.setattr(memory, "device_bytes", lambda device: int((student + 3 * per_run) / memory.DEVICE_SHARE) + 1)
    assert group_size(spec, 8) == max(1, int(3 - teacher / per_run))
