"""KDPL equals a literal re-implementation of its official trainers (miccunifi/KDPL trainers/*_kdpl.py and
kdpl_utils.py: the teacher's zero-shot logits of the same images at the student's temperature, the class-agnostic
sampling of the K classes with the highest batch-mean teacher probability, the student's logits on the sampled
prompts, 1/2 KL(teacher || student) + 1/2 KL(student || teacher) "batchmean", PromptSRC's self-regulating terms)
in the teacher's and the student's logits, the loss and the gradient of every learned tensor, on the official init
and a moved point, with a tiny teacher of another architecture. Negative controls (the reverse KL left out, the
teacher at its own temperature, the K least likely classes) are caught. The teacher's view features come from a
cache file keyed by the teacher's own fingerprint; KDPL refuses label schedules."""

from __future__ import annotations

import dataclasses
import math
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
from atlas_fast.data.templates import IMAGENET_TEMPLATES
from atlas_fast.methods.config import MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import METHODS, build_method
from atlas_fast.methods.kdpl import (KDPLCoCoOpConfig, KDPLCoOpConfig, KDPLMaPLeConfig, KDPLPromptSRCConfig,
                                     kdpl_coop_recipe, kdpl_maple_recipe, kdpl_promptsrc_recipe, read_classnames)
from equivalence import assert_caught, assert_equivalent, assert_gradient_equivalent, report_ratios
from helpers import cross_entropy_criterion, reference_text_features, small_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: extra threads only contend

CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]
DICTIONARY = ["cat", "dog", "boxer", "tabby cat", "sea lion", "newt", "lizard", "pug", "eagle", "owl", "shark"]
TEMPLATE = "a photo of a {}, a type of pet."
TEACHER = dict(teacher="atlas-tiny-teacher", teacher_pretrained="none")
CONFIGS = {"kdpl-coop": KDPLCoOpConfig(ctx_init="a photo of a", teacher_template=TEMPLATE, **TEACHER),
           "kdpl-cocoop": KDPLCoCoOpConfig(ctx_init="a photo of a", teacher_template=TEMPLATE, **TEACHER),
           "kdpl-maple": KDPLMaPLeConfig(n_ctx=2, depth=2, teacher_template=TEMPLATE, **TEACHER),
           "kdpl-promptsrc": KDPLPromptSRCConfig(depth_text=2, depth_vision=2, teacher_template=TEMPLATE, **TEACHER)}


@pytest.fixture(scope="module")
def dictionary_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kdpl") / "classnames.csv"
    path.write_text("ClassName\n" + "\n".join(DICTIONARY) + "\n")
    return path


def build(tiny, name, moved, **changes):
    torch.manual_seed(0)
    method = build_method(name, tiny, CLASSNAMES, dataclasses.replace(CONFIGS[name], **changes))
    if moved:
        with torch.no_grad():
            for param in method.parameters():
                param.add_(0.05 * torch.randn_like(param))
    return method


def reference_teacher_logits(teacher, student_scale, template, names, pixels):
    """CustomCLIPTeacher.forward: the teacher's normalised image and (precomputed) text features, at the student's
    logit scale."""
    text = teacher.model.encode_text(teacher.tokenizer([template.format(c.replace("_", " ")) for c in names]))
    image = teacher.model.visual(pixels)
    return student_scale * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).t()


def reference_sampling(teacher_logits, k):
    """kdpl_utils.sampling: the K classes of the largest batch-mean teacher probability (numpy's argpartition)."""
    probabilities = torch.softmax(teacher_logits.detach(), dim=1).numpy().mean(axis=0)
    return torch.from_numpy(np.argpartition(probabilities, -k)[-k:])


def reference_kdpl(student_logits, teacher_logits, reverse=True):
    teacher, student = F.log_softmax(teacher_logits, dim=-1), F.log_softmax(student_logits, dim=-1)
    forward = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
    return 0.5 * forward + (0.5 * F.kl_div(teacher, student, log_target=True, reduction="batchmean") if reverse
                            else 0.0)


def reference_student_logits(tiny, method, p, names, pixels):
    """The student's logits for the classes ``names``: CoOp's and CoCoOp's literal forward (77-token prompts class
    by class, and image by image for CoCoOp); MaPLe's and PromptSRC's through a plain model with the same tensors
    (their own equivalence with the references is tests/test_deep_prompts.py's)."""
    model = tiny.model
    if method.name in ("kdpl-coop", "kdpl-cocoop"):
        image = F.normalize(model.encode_image(pixels), dim=-1)
        if method.name == "kdpl-coop":
            text = reference_text_features(tiny, p["ctx"], names, method.base.prompt_prefix)
            return model.logit_scale.exp() * image @ text.t()
        rows = []
        for f in image:
            bias = F.linear(F.relu(F.linear(f, p["meta_weight1"], p["meta_bias1"])), p["meta_weight2"],
                            p["meta_bias2"])
            text = reference_text_features(tiny, p["ctx"] + bias, names, method.base.prompt_prefix)
            rows.append(model.logit_scale.exp() * f @ text.t())
        return torch.stack(rows)
    base = build_method(method.name.removeprefix("kdpl-"), tiny, names, method.config)
    for name in list(base._parameters) + [n for n, _ in base.named_parameters() if "." not in n]:
        if name in p:  # the reference's leaves, with their graph, in place of the base's own tensors
            base._parameters.pop(name, None)
            setattr(base, name, p[name].unsqueeze(0))
    return base, base.similarity_logits(F.normalize(base.image_batch(pixels), dim=-1), base.text_features())


def check(tiny, method, prefix, agnostic, pixels, dictionary=None, templates=IMAGENET_TEMPLATES):
    """Loss and gradients of ``method`` against the reference trainer on ``pixels`` (the teacher's and the student's
    features as the feed serves them)."""
    teacher = method.teacher
    extra = teacher.encode_image(pixels)
    if method.reads_frozen_features:
        extra = torch.cat([tiny.encode_image(pixels), extra], dim=-1)
    inputs = (pixels, extra) if method.reads_pixels else torch.cat([tiny.encode_image(pixels), extra], dim=-1)
    labels = torch.zeros(len(pixels), dtype=torch.long)
    loss = method.training_loss(inputs, labels, cross_entropy_criterion(labels))
    loss.backward()
    p = {name: t.detach()[0].clone().requires_grad_(True) for name, t in method.base.named_parameters()}
    scale = tiny.model.logit_scale.exp()
    names, template = (dictionary, "a photo of a {}.") if agnostic else (CLASSNAMES, method.config.teacher_template)
    teacher_logits = reference_teacher_logits(teacher, scale, template, names, pixels)
    assert_equivalent(f"{prefix} teacher logits", method.teacher_logits(extra[..., -teacher.embed_dim:]),
                      teacher_logits, atol=1e-4)
    kept = reference_sampling(teacher_logits, method.config.k_max) if agnostic else torch.arange(len(names))
    student = reference_student_logits(tiny, method, p, [names[i] for i in kept], pixels)
    extra_terms = 0.0
    if isinstance(student, tuple):
        base, student = student
        if method.name == "kdpl-promptsrc":  # L_SCL with the kept classes' frozen text targets
            classes = [names[i] for i in kept]
            t0 = tiny.encode_text([t.format(c.replace("_", " ")) for t in templates for c in classes])
            t0 = F.normalize(t0.view(len(templates), len(classes), -1).mean(0), dim=-1)
            v0 = F.normalize(tiny.encode_image(pixels), dim=-1)
            t, v = base.text_features()[0], F.normalize(base.image_batch(pixels), dim=-1)[0]
            z0 = scale * v0 @ t0.t()
            kl = F.kl_div(F.log_softmax(student[0], 1), F.log_softmax(z0, 1), reduction="sum", log_target=True)
            extra_terms = 25 * F.l1_loss(t, t0) + 10 * F.l1_loss(v, v0) + kl / student[0].numel()
        student = student[0]
    reference = reference_kdpl(student, teacher_logits[:, kept]) + extra_terms
    reference.backward()
    assert_equivalent(f"{prefix} loss", loss, reference)
    for name, param in method.base.named_parameters():
        assert_gradient_equivalent(f"{prefix} grad {name}", param.grad[0], p[name].grad)
    with torch.no_grad():
        assert_caught("forward KL only", loss, reference_kdpl(student, teacher_logits[:, kept], reverse=False)
                      + extra_terms)
        own = reference_teacher_logits(teacher, teacher.model.logit_scale.exp(), template, names, pixels)
        assert_caught("teacher at its own temperature", loss, reference_kdpl(student, own[:, kept]) + extra_terms)
        if agnostic:
            least = torch.softmax(teacher_logits, 1).mean(0).topk(len(kept), largest=False).indices
            wrong = reference_student_logits(tiny, method, p, [names[i] for i in least], pixels)
            wrong = wrong[1][0] if isinstance(wrong, tuple) else wrong
            assert_caught("the K least likely classes", loss, reference_kdpl(wrong, teacher_logits[:, least]))


@pytest.fixture()
def teacher_at_another_temperature():
    """The tiny teacher's logit scale moved off the student's (both start at 1/0.07), so that a teacher scored at
    its own temperature differs from the reference's (the student's)."""
    teacher = shared_backbone(BackboneConfig("atlas-tiny-teacher", None))
    saved = teacher.model.logit_scale.detach().clone()
    teacher.model.logit_scale.data.fill_(math.log(40.0))
    yield
    teacher.model.logit_scale.data.copy_(saved)


SLOW = pytest.mark.slow
CASES = [("kdpl-coop", True, False), pytest.param("kdpl-coop", False, False, marks=SLOW),
         pytest.param("kdpl-coop", True, True, marks=SLOW), ("kdpl-cocoop", False, True),
         pytest.param("kdpl-cocoop", True, False, marks=SLOW), pytest.param("kdpl-maple", False, True, marks=SLOW),
         ("kdpl-maple", True, True), ("kdpl-promptsrc", False, True),
         pytest.param("kdpl-promptsrc", True, True, marks=SLOW)]


@pytest.fixture()
def three_templates(monkeypatch):
    """PromptSRC's frozen text targets average the 60 ImageNet templates: three of them check the same formula at a
    twentieth of the text-tower passes (and the per-process store of targets starts empty)."""
    from atlas_fast.methods import promptsrc

    monkeypatch.setattr(promptsrc, "IMAGENET_TEMPLATES", IMAGENET_TEMPLATES[:3])
    monkeypatch.setattr(promptsrc, "_TEMPLATE_FEATURES", {})
    return IMAGENET_TEMPLATES[:3]


@pytest.mark.usefixtures("teacher_at_another_temperature")
@pytest.mark.parametrize("name,agnostic,moved", CASES)
def test_loss_and_every_gradient_match_the_official_trainer(tiny, dictionary_file, three_templates, name, agnostic,
                                                            moved):
    changes = dict(class_agnostic=True, agnostic_classnames=str(dictionary_file), k_max=5) if agnostic else {}
    method = build(tiny, name, moved, **changes)
    torch.manual_seed(1)
    check(tiny, method, f"KDPL tiny {name}{' CA' if agnostic else ''}", agnostic, torch.randn(3, 3, 32, 32),
          DICTIONARY, three_templates)
    print("\n" + report_ratios(f"KDPL tiny {name}"))


def test_the_teacher_reads_the_run_s_views_from_its_own_cache_file(tmp_path_factory):
    """The feed caches the teacher's features of the run's views (each the teacher's encoding of exactly the pixels
    of that view) in a file of the teacher's fingerprint; another teacher gets another file, never this one."""
    from atlas_fast.clip.transforms import load_views
    from atlas_fast.engine.feed import prepare_inputs
    from atlas_fast.engine.spec import plan_run

    root = small_pets(tmp_path_factory, "kdpl-cache")
    spec = plan_run(tiny_pets_config(root, method="kdpl-coop", views=2, method_options=TEACHER))
    backbone = spec.backbone()
    inputs = prepare_inputs(spec, backbone).train_inputs
    teacher = build_method("kdpl-coop", backbone, ["x"], spec.method_config).teacher
    items = spec.data.train_split.train
    student_dim = backbone.embed_dim
    for epoch in (0, 1):
        served = inputs.for_epoch(epoch)
        assert served.shape == (len(items), student_dim + teacher.embed_dim)
        pixels = torch.stack([load_views(d.impath, d.key, [1 + epoch], backbone.transform)[0] for d in items[:3]])
        torch.testing.assert_close(served[:3, student_dim:], teacher.encode_image(pixels), atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(served[:3, :student_dim], backbone.encode_image(pixels), atol=2e-3, rtol=2e-3)
    rows, views = inputs.device_rows()  # the joined rows the step gathers its batches from: row n * V + e % V
    assert views == 2 and torch.equal(rows[1::2], inputs.for_epoch(1)) and torch.equal(rows[0::2], inputs.for_epoch(0))
    files = sorted(p.name for p in (root / "cache" / "OxfordPets").glob("*.h5"))
    assert any(f.startswith(teacher.fingerprint[:12]) for f in files) and len(files) == 2
    other = plan_run(tiny_pets_config(root, method="kdpl-coop", views=2,
                                      method_options=dict(teacher="atlas-tiny", teacher_pretrained="none")))
    prepare_inputs(other, backbone)  # the student itself as teacher: its own file serves both
    assert sorted(p.name for p in (root / "cache" / "OxfordPets").glob("*.h5")) == files


def test_a_teacher_whose_weights_are_missing_is_named_with_the_options_that_choose_it(tiny, tmp_path, monkeypatch):
    from atlas_fast.clip import backbones
    from atlas_fast.clip.open_clip_names import WeightsUnavailableError
    from atlas_fast.clip.weights_files import DOWNLOAD_VARIABLE
    from atlas_fast.methods.kdpl import KDPL

    monkeypatch.setattr(backbones, "cached_weights", lambda *a, **k: None)  # no weights on this machine
    monkeypatch.delenv(DOWNLOAD_VARIABLE, raising=False)
    for pretrained, error in (("openai", WeightsUnavailableError),
                              (str(tmp_path / "missing.pt"), FileNotFoundError)):
        config = dataclasses.replace(CONFIGS["kdpl-coop"], teacher="ViT-B-16", teacher_pretrained=pretrained)
        with pytest.raises(error, match=r"KDPL's teacher ViT-B-16 .*--method-option teacher=MODEL teacher_pretrained="):
            KDPL.view_teacher(config, tiny)


def test_label_schedules_are_refused(tmp_path_factory):
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine import run

    root = small_pets(tmp_path_factory, "kdpl-run")
    with pytest.raises(ValueError, match=r"kdpl-coop trains without labels.*base method \+ ATLaS"):
        run(tiny_pets_config(root, method="kdpl-coop", method_options=TEACHER, schedule=Alternating(2),
                             soft_labels=soft_label_preset("base2new", "isl")))
    # whole runs without labels, alone and as one group: tests/test_batched.py (kdpl-coop)


def test_recipes_and_configs(dictionary_file):
    config, recipe = kdpl_coop_recipe("paper", "base2new", 16, "DescribableTextures")
    assert (config.teacher, config.teacher_pretrained, config.teacher_template) == (
        "ViT-H-14-quickgelu", "dfn5b", "{} texture.")
    assert (config.class_agnostic, config.k_max, config.forward_weight, config.reverse_weight, config.temperature,
            config.context_length) == (False, 1000, 0.5, 0.5, 1.0, 4)
    assert recipe == OptimRecipe(epochs=50, batch_size=32, lr=0.002)
    assert kdpl_maple_recipe("original", "cross_dataset", 16, "ImageNet")[0].n_ctx == 2
    config, recipe = kdpl_promptsrc_recipe("paper", "cross_dataset", 16, "ImageNet")
    assert (config.depth_text, config.gpa_mean, config.gpa_std, recipe.epochs, recipe.lr) == (3, 6.0, 10.0, 20, 0.0025)
    with pytest.raises(MissingRecipe):
        kdpl_coop_recipe("paper", "few_shot", 4, "DTD")
    with pytest.raises(ValueError, match="agnostic_classnames=FILE"):
        KDPLCoOpConfig(class_agnostic=True)
    with pytest.raises(ValueError, match="temperature"):
        KDPLCoOpConfig(temperature=0.0)
    assert read_classnames(dictionary_file) == tuple(DICTIONARY)
    # class-aware runs train as one module (tests/test_batched.py); class-agnostic ones keep their own classes
    agnostic = KDPLCoOpConfig(class_agnostic=True, agnostic_classnames=str(dictionary_file))
    assert METHODS["kdpl-coop"].batches_runs(config) and not METHODS["kdpl-coop"].batches_runs(agnostic)
    from atlas_fast.engine.group import batches_runs  # where sweeps, the pipeline and the search decide a group

    assert batches_runs(METHODS["kdpl-coop"], config) and not batches_runs(METHODS["kdpl-coop"], agnostic)
    with pytest.raises(ValueError, match="class-agnostic KDPL keeps each run's own top-1000 dictionary classes"):
        METHODS["kdpl-coop"](None, CLASSNAMES, agnostic, runs=2)
    with pytest.raises(ValueError, match=re.escape("nowhere.csv cannot be read")):
        read_classnames(dictionary_file.parent / "nowhere.csv")


@pytest.mark.slow
@pytest.mark.parametrize("agnostic", [False, True])
def test_vit_b16_student_with_a_vit_b32_teacher_matches_the_official_trainer(dictionary_file, agnostic):
    """The reference's shapes: a ViT-B/16 student (512-d text, 224 px views) and a 224 px teacher of another
    architecture (ViT-B/32, random weights), KDPL on CoOp."""
    from atlas_fast.clip.backbones import load_backbone

    student = load_backbone(BackboneConfig("ViT-B-16", None))
    changes = dict(class_agnostic=True, agnostic_classnames=str(dictionary_file), k_max=5) if agnostic else {}
    torch.manual_seed(0)
    method = build_method("kdpl-coop", student, CLASSNAMES, dataclasses.replace(
        CONFIGS["kdpl-coop"], teacher="ViT-B-32", teacher_pretrained="none", **changes))
    with torch.no_grad():
        method.base.ctx.add_(0.05 * torch.randn_like(method.base.ctx))
    teacher = method.teacher
    saved = teacher.model.logit_scale.detach().clone()
    teacher.model.logit_scale.data.fill_(math.log(40.0))  # off the student's, so the temperature control can fail
    try:
        check(student, method, f"KDPL ViT-B/16 kdpl-coop{' CA' if agnostic else ''}", agnostic,
              torch.randn(2, 3, 224, 224), DICTIONARY)
    finally:
        teacher.model.logit_scale.data.copy_(saved)
    print("\n" + report_ratios("KDPL ViT-B/16"))


def test_the_teacher_and_its_dictionary_are_checked_before_any_image_is_encoded(tmp_path_factory, capsys):
    """Issue 44: every way the teacher or the class-agnostic dictionary cannot be had is refused when the run is
    planned (no cache file of the student or the teacher is written), each error naming the teacher's own option or
    the file, never the student's --model / --pretrained."""
    from atlas_fast.cli import main

    root = small_pets(tmp_path_factory, "kdpl-checks")
    folder = root / "files"
    folder.mkdir()
    (folder / "garbage.pt").write_bytes(b"not a checkpoint")
    torch.save(shared_backbone(BackboneConfig("atlas-tiny", None), torch.device("cpu")).model.state_dict(),
               folder / "student.bin")  # an open_clip file of another architecture than the teacher's
    shutil.copy(folder / "student.bin", folder / "student.pt")  # the same in OpenAI's layout (it trained unannounced)
    (folder / "latin1.txt").write_bytes("caf\xe9\nna\xefve\n".encode("latin-1"))

    def train(*options):
        return main(["train", "--dataset", "OxfordPets", "--data-root", str(root / "data"), "--model", "atlas-tiny",
                     "--pretrained", "none", "--shots", "2", "--epochs", "2", "--cache-root", str(root / "cache"),
                     "--results-dir", str(root / "results"), "--no-progress", "--method", "kdpl-coop",
                     "--method-option", *options])

    teacher = "teacher=atlas-tiny-teacher"
    cases = [
        (["teacher=ViT-Nope", "teacher_pretrained=none"],
         "error: KDPL's teacher ViT-Nope (none) cannot be loaded: Unknown model 'ViT-Nope'"),
        ([teacher, f"teacher_pretrained={folder / 'missing.pt'}"],
         f"error: --method-option teacher_pretrained: the teacher's checkpoint file not found: "
         f"{folder / 'missing.pt'} (its folder holds garbage.pt, student.bin, student.pt)"),
        ([teacher, f"teacher_pretrained={folder / 'garbage.pt'}"],
         f"error: KDPL's teacher atlas-tiny-teacher ({folder / 'garbage.pt'}) cannot be loaded: Cannot load checkpoint "
         f"{folder / 'garbage.pt'}"),
        ([teacher, f"teacher_pretrained={folder / 'student.bin'}"],
         "its weights do not fit this architecture"),
        ([teacher, f"teacher_pretrained={folder / 'student.pt'}"],
         "it holds a CLIP of another architecture (embed 64; vision width 64, 2 layers, patch 8, 32 px; text width 64, "
         "2 layers). Pass a complete CLIP checkpoint (OpenAI .pt, open_clip .bin/.pt/.safetensors) and the "
         "teacher=MODEL it was trained as."),
        ([teacher, "teacher_pretrained=none", "class_agnostic=true", f"agnostic_classnames={folder / 'none.csv'}"],
         f"error: KDPL's class-agnostic dictionary {folder / 'none.csv'} cannot be read (No such file or directory); "
         f"give a UTF-8 file of class names with --method-option agnostic_classnames=FILE"),
        ([teacher, "teacher_pretrained=none", "class_agnostic=true", f"agnostic_classnames={folder}"],
         f"error: KDPL's class-agnostic dictionary {folder} is a folder, not a file; give a UTF-8 file of class names "
         f"with --method-option agnostic_classnames=FILE"),
        ([teacher, "teacher_pretrained=none", "class_agnostic=true", f"agnostic_classnames={folder / 'latin1.txt'}"],
         f"error: KDPL's class-agnostic dictionary {folder / 'latin1.txt'} is not UTF-8 text (byte b'\\xe9' at offset "
         f"3); give a UTF-8 file of class names with --method-option agnostic_classnames=FILE"),
    ]
    for options, message in cases:
        assert train(*options) == 2, options
        err = capsys.readouterr().err
        assert message in err, (options, err)
        assert "--pretrained" not in err and "--model" not in err and "teacher=naming" not in err, err
        assert not list((root / "cache").rglob("*.h5")), options  # nothing encoded
    # the other architecture's file is named with the teacher's option, not the student's --model
    assert train(teacher, f"teacher_pretrained={folder / 'student.bin'}") == 2
    assert "and the teacher=MODEL it was trained as" in capsys.readouterr().err


def test_a_teacher_of_another_image_size_is_refused_and_a_fitting_one_takes_the_students_transform(tiny):
    """The reference trainers feed the student's preprocessed images to the teacher: KDPL's and PromptKD's teacher
    must take the student's image size, and then encodes with the student's transform."""
    from atlas_fast.methods.teachers import teacher_for_views

    larger = dataclasses.replace(tiny, preprocessing=dataclasses.replace(tiny.preprocessing, image_size=64,
                                                                          mean=(0.5, 0.5, 0.5)))
    with pytest.raises(ValueError, match=r"KDPL's teacher .* takes 64 px images, but the student's views are 32 px"):
        teacher_for_views("KDPL", larger, tiny, "with --method-option teacher=MODEL")
    same_size = dataclasses.replace(tiny, preprocessing=dataclasses.replace(tiny.preprocessing, mean=(0.5, 0.5, 0.5)))
    assert teacher_for_views("KDPL", same_size, tiny, "").preprocessing == tiny.preprocessing
