"""CoPrompt equals a literal re-implementation of its official trainer (ShuvenduRoy/CoPrompt trainers/coprompt.py and
its MaPLe towers in clip/model.py: 77-token prompts with the first M words of "a photo of a" learnable, deep text
prompts replacing positions 1..M of blocks 1..J-1, visual prompts = Linear maps of the text prompts appended after
the patches, the image adapter mixed in at 0.1 and the text adapter at 0.2, CE + W [(1 - mean cos(t, g_k)) +
(1 - mean cos(v, u))] with g_k the k-th description's frozen text features and u the frozen image features of a
second view) in token ids, logits, every loss term and the gradient of every learned tensor, at the official init and
at a moved point; the negative controls (class names tokenized with '_', the adapters' ratios swapped, the adapter's
last ReLU left out, the frozen features of the same view, another description, the consistency at weight 1, every
gradient of the cross-entropy alone) are caught at the same tolerance. Also: the second view's features
come from the cache, the descriptions file is checked before any work, runs train end to end (command line and
Python API, with and without ATLaS-ISL) and batched runs equal runs trained alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.atlas.criterion import LossCriterion
from atlas_fast.methods.config import MissingRecipe
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.coprompt import CoPromptConfig, coprompt_recipe, description_index
from equivalence import assert_caught, assert_equivalent, assert_gradient_equivalent, report_ratios
from helpers import small_pets, tiny_pets_config

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSNAMES = ["cat", "sea_lion", "golden retriever dog"]
DESCRIPTIONS = {"cat": ["a small furry pet with whiskers.", "a cat has pointed ears.", "it purrs."],
                "sea lion": ["a marine mammal on the rocks.", "it has flippers.", "it barks loudly."],
                "golden retriever dog": ["a friendly dog with golden fur.", "a large retriever.", "it fetches."]}


def write_descriptions(path: Path, classnames, count: int = 3) -> Path:
    """A small descriptions file in the official layout ({name with spaces: [descriptions]})."""
    table = {name.replace("_", " "): [f"a photo of {name.replace('_', ' ')}, description {k}." for k in range(count)]
             for name in classnames}
    path.write_text(json.dumps(table))
    return path


@pytest.fixture(scope="module")
def descriptions(tmp_path_factory):
    path = tmp_path_factory.mktemp("coprompt") / "descriptions.json"
    path.write_text(json.dumps(DESCRIPTIONS))
    return path


def build(backbone, path, moved, runs=1, **changes):
    torch.manual_seed(0)
    config = CoPromptConfig(descriptions=str(path), **{"n_ctx": 2, "depth": 2, "consistency_weight": 2.0, **changes})
    method = build_method("coprompt", backbone, CLASSNAMES, config, runs)
    if moved:
        with torch.no_grad():
            for param in method.parameters():
                param.add_(0.05 * torch.randn_like(param))
    return method


def official_leaves(method):
    """The official model's learned tensors (its own layouts: nn.Linear weights (out, in)) with the values of
    ``method``'s run 0, as fresh leaves."""
    r0 = {name: t.detach()[0].clone() for name, t in method.named_parameters()}
    leaves = {"ctx": r0["ctx"], "compound_prompts_text": r0["deep_text"],
              "proj.weight": r0["coupling_weight"][0].t(), "proj.bias": r0["coupling_bias"][0],
              "compound_projections.weight": r0["coupling_weight"][1:].transpose(1, 2),
              "compound_projections.bias": r0["coupling_bias"][1:],
              "adapter_image.fc.0.weight": r0["image_adapter_down"].t(),
              "adapter_image.fc.2.weight": r0["image_adapter_up"].t(),
              "adapter_text.fc.0.weight": r0["text_adapter_down"].t(),
              "adapter_text.fc.2.weight": r0["text_adapter_up"].t()}
    return {name: value.contiguous().requires_grad_(True) for name, value in leaves.items()}


def official_grads(p):
    """The official leaves' gradients in ``CoPrompt``'s layouts (R dropped), by parameter name."""
    return {"ctx": p["ctx"].grad, "deep_text": p["compound_prompts_text"].grad,
            "coupling_weight": torch.cat([p["proj.weight"].grad.t().unsqueeze(0),
                                          p["compound_projections.weight"].grad.transpose(1, 2)]),
            "coupling_bias": torch.cat([p["proj.bias"].grad.unsqueeze(0), p["compound_projections.bias"].grad]),
            "image_adapter_down": p["adapter_image.fc.0.weight"].grad.t(),
            "image_adapter_up": p["adapter_image.fc.2.weight"].grad.t(),
            "text_adapter_down": p["adapter_text.fc.0.weight"].grad.t(),
            "text_adapter_up": p["adapter_text.fc.2.weight"].grad.t()}


def official_adapter(x, fc0, fc2, last_relu=True):
    """Adapter.forward: Linear(bias=False) -> ReLU -> Linear(bias=False) -> ReLU."""
    hidden = F.linear(F.relu(F.linear(x, fc0)), fc2)
    return F.relu(hidden) if last_relu else hidden


def official_text(backbone, p, classnames, prompt_prefix):
    """MultiModalPromptLearner.forward + TextEncoder over all 77 positions, the MaPLe text blocks (deep prompt k
    replaces positions 1..M at the input of block k); returns (token ids, prompts, features)."""
    model = backbone.model
    names = [c.replace("_", " ") for c in classnames]
    ids = backbone.tokenizer([f"{prompt_prefix} {n}." for n in names])
    with torch.no_grad():
        embedding = model.token_embedding(ids)
    ctx, m, count = p["ctx"], p["ctx"].shape[0], len(names)
    prompts = torch.cat([embedding[:, :1], ctx.unsqueeze(0).expand(count, -1, -1), embedding[:, 1 + m:]], dim=1)
    x = prompts + model.positional_embedding
    deep = p["compound_prompts_text"]
    for i, block in enumerate(model.transformer.resblocks):
        if 1 <= i <= len(deep):
            x = torch.cat([x[:, :1], deep[i - 1].unsqueeze(0).expand(count, -1, -1), x[:, 1 + m:]], dim=1)
        x = block(x, attn_mask=model.attn_mask)
    x = model.ln_final(x)
    return ids, prompts, x[torch.arange(count), ids.argmax(dim=-1)] @ model.text_projection


def official_image(backbone, p, pixels):
    """VisionTransformer_MaPLe.forward: [CLS, patches] + positions, the shared visual context proj(ctx) appended,
    ln_pre, the blocks (the last M tokens replaced by proj_k(deep text prompt k) at block k), ln_post of CLS, proj."""
    visual = backbone.model.visual
    x = visual.conv1(pixels)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    cls = visual.class_embedding.to(x.dtype) + torch.zeros(x.shape[0], 1, x.shape[-1], dtype=x.dtype)
    x = torch.cat([cls, x], dim=1) + visual.positional_embedding.to(x.dtype)
    shared = F.linear(p["ctx"], p["proj.weight"], p["proj.bias"])
    m = shared.shape[0]
    x = visual.ln_pre(torch.cat([x, shared.unsqueeze(0).expand(x.shape[0], -1, -1)], dim=1))
    deep = [F.linear(t, w, b) for t, w, b in zip(p["compound_prompts_text"], p["compound_projections.weight"],
                                                 p["compound_projections.bias"])]
    for i, block in enumerate(visual.transformer.resblocks):
        if 1 <= i <= len(deep):
            x = torch.cat([x[:, :-m], deep[i - 1].unsqueeze(0).expand(x.shape[0], -1, -1)], dim=1)
        x = block(x)
    return visual.ln_post(x[:, 0]) @ visual.proj


def official_descriptions(backbone, table, classnames):
    """gpt_clip_classifier: per class, its descriptions' normalised frozen text features, stacked at dim 1."""
    rows = [F.normalize(backbone.model.encode_text(backbone.tokenizer(table[c.replace("_", " ")])), dim=-1)
            for c in classnames]
    return torch.stack(rows, dim=1)


def official_loss(backbone, p, config, prompt_prefix, pixels, second, labels, k, table, image_ratio=0.1,
                  text_ratio=0.2, last_relu=True):
    """CustomCLIP.forward in training mode, fp32: (ids, prompts, logits, CE, text term, image term, total)."""
    ids, prompts, text = official_text(backbone, p, CLASSNAMES, prompt_prefix)
    image = official_image(backbone, p, pixels)
    image = image_ratio * official_adapter(image, p["adapter_image.fc.0.weight"], p["adapter_image.fc.2.weight"],
                                           last_relu) + (1 - image_ratio) * image
    text = text_ratio * official_adapter(text, p["adapter_text.fc.0.weight"], p["adapter_text.fc.2.weight"],
                                         last_relu) + (1 - text_ratio) * text
    image, text = image / image.norm(dim=-1, keepdim=True), text / text.norm(dim=-1, keepdim=True)
    logits = backbone.model.logit_scale.exp() * image @ text.t()
    with torch.no_grad():
        pre_text = official_descriptions(backbone, table, CLASSNAMES)[k]
        pre_image = backbone.model.encode_image(second)
    pre_text = pre_text / pre_text.norm(dim=-1, keepdim=True)
    pre_image = pre_image / pre_image.norm(dim=-1, keepdim=True)
    ce = F.cross_entropy(logits, labels)
    if config.consistency == "cosine":
        cos = torch.nn.CosineSimilarity(dim=1, eps=1e-07)
        text_term, image_term = 1.0 - torch.mean(cos(text, pre_text)), 1.0 - torch.mean(cos(image, pre_image))
    else:
        text_term, image_term = F.mse_loss(text, pre_text), F.mse_loss(image, pre_image)
    return ids, prompts, logits, ce, text_term, image_term, ce + config.consistency_weight * (text_term + image_term)


def check(backbone, method, prefix, pixels, second, labels, table):
    """Token ids, logits, every loss term and every gradient of ``method`` against the official trainer; the
    negative controls must fail at the same tolerances."""
    config = method.config
    k = int(description_index(method.description_seed, method.description_step, len(next(iter(table.values())))))
    seen = {}

    def cross_entropy(logits, run):
        seen["logits"] = logits
        seen["ce"] = F.cross_entropy(logits, labels)
        return seen["ce"]

    criterion = LossCriterion(cross_entropy, [len(labels)])
    loss = method.training_loss((pixels, backbone.encode_image(second)), labels, criterion)
    loss.backward()
    assert int(method.description_step) == 1  # the step was counted
    with torch.no_grad():
        text = F.normalize(method.raw_text_features(), dim=-1)
        image = F.normalize(method.image_batch(pixels), dim=-1)
        index = torch.tensor([k])
        text_term, image_term = method.consistency_terms(text, image, backbone.encode_image(second), index)
    p = official_leaves(method)
    args = (backbone, p, config, method.prompt_prefix, pixels, second, labels, k, table)
    ids, prompts, logits, ce, ref_text, ref_image, total = official_loss(*args)
    total.backward()
    n_used = method.class_prompts.token_suffix.shape[1] + 1 + method.n_ctx
    assert torch.equal(method.eot_index.cpu(), ids.argmax(dim=-1))  # the EOT of the same token ids
    assert_equivalent(f"{prefix} prompt embeddings (token ids)", method.prompt_embeddings()[0], prompts[:, :n_used],
                      atol=0, rtol=0)
    assert_equivalent(f"{prefix} logits", seen["logits"], logits, atol=1e-4)
    assert_equivalent(f"{prefix} CE", seen["ce"], ce)
    assert_equivalent(f"{prefix} text consistency", text_term[0], ref_text)
    assert_equivalent(f"{prefix} image consistency", image_term[0], ref_image)
    assert_equivalent(f"{prefix} loss", loss, total)
    grads = official_grads(p)
    assert sorted(grads) == sorted(name for name, _ in method.named_parameters())
    for name, param in method.named_parameters():
        assert_gradient_equivalent(f"{prefix} grad {name}", param.grad[0], grads[name])
    # negative control of every gradient: the reference's gradient of its cross-entropy alone
    plain = official_leaves(method)
    official_loss(backbone, plain, *args[2:])[3].backward()
    for name, wrong in official_grads(plain).items():
        scale = grads[name].abs().max()
        assert_caught(f"grad {name} without the consistency terms", method.get_parameter(name).grad[0] / scale,
                      wrong / scale, rtol=0)
    with torch.no_grad():  # negative controls: one detail of the reference changed each
        swapped = official_loss(*args, image_ratio=0.2, text_ratio=0.1)
        assert_caught("adapter ratios swapped", seen["logits"], swapped[2], atol=1e-4)
        linear = official_loss(*args, last_relu=False)
        assert_caught("adapter without its last ReLU", seen["logits"], linear[2], atol=1e-4)
        same_view = official_loss(*args[:5], pixels, *args[6:])
        assert_caught("frozen features of the same view", image_term[0], same_view[5])
        other = official_loss(*args[:7], (k + 1) % 3, table)
        assert_caught("another description", text_term[0], other[4])
        assert_caught("consistency at weight 1, not W", loss, ce + ref_text + ref_image)
        kept = backbone.tokenizer([f"{method.prompt_prefix} {c}." for c in CLASSNAMES])  # '_' not read as ' '
        assert not torch.equal(kept[:, :n_used], ids[:, :n_used])


CASES = [(False, "cosine"), (True, "cosine"), pytest.param(True, "mse", marks=pytest.mark.slow)]


@pytest.mark.parametrize("moved,consistency", CASES)
def test_token_ids_logits_loss_terms_and_every_gradient_match_the_official_trainer(tiny, descriptions, moved,
                                                                                  consistency):
    method = build(tiny, descriptions, moved, consistency=consistency)
    if not moved:  # the official init: the first M words' embeddings of "a photo of a"
        ids = tiny.tokenizer(["a photo of a"])
        torch.testing.assert_close(method.ctx[0], tiny.model.token_embedding(ids)[0, 1:3], rtol=0, atol=0)
    generator = torch.Generator().manual_seed(1)
    pixels, second = torch.randn(3, 3, 32, 32, generator=generator), torch.randn(3, 3, 32, 32, generator=generator)
    check(tiny, method, f"CoPrompt tiny{' moved' if moved else ''} {consistency}", pixels, second,
          torch.tensor([0, 2, 1]), DESCRIPTIONS)
    print("\n" + report_ratios("CoPrompt tiny"))


@pytest.mark.slow
def test_vit_b16_shapes_match_the_official_trainer(descriptions):
    """The reference's widths (512 text, 768 vision, 224 px), random weights, J = 9, M = 2, a moved point."""
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone

    backbone = load_backbone(BackboneConfig("ViT-B-16", None))
    method = build(backbone, descriptions, True, depth=9)
    adapters = sum(p.numel() for name, p in method.named_parameters() if "adapter" in name)
    assert adapters == 262_144  # docs/method-zoo.md, section CoPrompt: 4 x 512 x 128
    generator = torch.Generator().manual_seed(1)
    pixels, second = torch.randn(2, 3, 224, 224, generator=generator), torch.randn(2, 3, 224, 224,
                                                                                 generator=generator)
    check(backbone, method, "CoPrompt ViT-B/16", pixels, second, torch.tensor([0, 2]), DESCRIPTIONS)
    print("\n" + report_ratios("CoPrompt ViT-B/16"))


def test_the_description_index_is_each_run_s_own_and_counts_only_its_steps(tiny, descriptions):
    """Run r's k depends on its seed and its own step count: a run that sits a step out (batch size 0 in a group)
    does not advance, so it draws what it would draw alone; the sequence covers the descriptions."""
    method = build(tiny, descriptions, False, runs=2)
    method.description_seed.copy_(torch.tensor([11, 11]))
    first = method.take_description_step([3, 0])
    assert first[0] == first[1] and method.description_step.tolist() == [1, 0]
    second = method.take_description_step([3, 3])
    assert second[1] == first[1] and method.description_step.tolist() == [2, 1]  # run 1 draws its step 0 again
    assert second[0] == description_index(torch.tensor(11), torch.tensor(1), 3)
    seq = [int(description_index(torch.tensor(5), torch.tensor(s), 3)) for s in range(60)]
    assert set(seq) == {0, 1, 2} and seq != sorted(seq)


def test_recipes():
    config, recipe = coprompt_recipe("original", "base2new", 16, "OxfordPets")
    assert (config.n_ctx, config.depth, config.consistency_weight, recipe.epochs, recipe.batch_size, recipe.lr) == (
        2, 12, 0.1, 8, 4, 0.0035)
    assert (config.image_adapter_ratio, config.text_adapter_ratio, config.consistency) == (0.1, 0.2, "cosine")
    config, recipe = coprompt_recipe("original", "base2new", 16, "Food101")
    assert (config.n_ctx, config.depth, config.consistency_weight, recipe.epochs) == (4, 9, 0.5, 5)
    config, recipe = coprompt_recipe("paper", "base2new", 16, "EuroSAT")
    assert (config.n_ctx, config.depth, config.consistency_weight) == (4, 12, 0.1)
    assert coprompt_recipe("original", "base2new", 16, "WorldSketches")[0].depth == 9  # the config's defaults
    config, recipe = coprompt_recipe("original", "cross_dataset", 16, "ImageNet")
    assert (config.n_ctx, config.depth, config.consistency_weight, recipe.epochs) == (4, 12, 8.0, 8)
    with pytest.raises(MissingRecipe):
        coprompt_recipe("paper", "few_shot", 4, "OxfordPets")
    with pytest.raises(ValueError, match="consistency must be one of cosine, mse"):
        CoPromptConfig(consistency="l1")


def pets_options(path, **more):
    return {"descriptions": str(path), "depth": 2, **more}


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = small_pets(tmp_path_factory, "coprompt-pets")
    from atlas_fast.data import load_dataset

    names = load_dataset("OxfordPets", root / "data").classnames
    write_descriptions(root / "descriptions.json", names)
    return root


@pytest.mark.parametrize("content,error", [
    (None, r"missing\.json: cannot be read"),
    ("{not json", r"bad\.json: is invalid JSON \(line 1"),
    ("[1, 2]", r"bad\.json: expected a JSON object"),
    ({"dog a": ["x"]}, r"bad\.json: class 'breed_b_cat' has no descriptions \(looked up as 'breed b cat': no entry\)"),
    ("unequal", r"bad\.json: every class needs the same number of descriptions"),
    ("", r"CoPrompt needs its class descriptions: --method-option descriptions=PATH")])
def test_a_bad_descriptions_file_is_refused_when_the_run_is_planned(pets, tmp_path, content, error):
    """Before any weights are loaded or features encoded: planning refuses it, naming the file and the class."""
    from atlas_fast.engine.spec import plan_run

    path = tmp_path / ("missing.json" if content is None else "bad.json")
    if content == "unequal":
        table = json.loads((pets / "descriptions.json").read_text())
        first = next(iter(table))
        table[first] = table[first][:1]
        path.write_text(json.dumps(table))
    elif isinstance(content, dict):
        path.write_text(json.dumps(content))
    elif content:
        path.write_text(content)
    options = pets_options("" if content == "" else path)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=error):
        plan_run(tiny_pets_config(pets, method="coprompt", method_options=options, cache_root=cache))
    assert not list(cache.rglob("*.h5"))  # nothing encoded


def test_the_consistency_reads_the_cached_features_of_a_second_view(pets, monkeypatch):
    """The cache holds views 1..2V; epoch e's pixels are view 1 + (e mod V) and its frozen features those of view
    V + 1 + (e mod V), the frozen CLIP's encoding of exactly that view's pixels."""
    from atlas_fast.clip.transforms import load_views
    from atlas_fast.engine.feed import PixelBatch, prepare_inputs
    from atlas_fast.engine.spec import plan_run

    spec = plan_run(tiny_pets_config(pets, method="coprompt", views=2, method_options=pets_options(
        pets / "descriptions.json"), workers=0))
    assert spec.method_config.descriptions_checksum  # the run's identity covers the descriptions
    backbone = spec.backbone()
    inputs = prepare_inputs(spec, backbone).train_inputs
    items = spec.data.train_split.train
    order = torch.arange(3)
    for epoch in (0, 1):
        batch, index = next(iter(inputs.batches(epoch, order, 3)))
        assert isinstance(batch, PixelBatch) and index.tolist() == [0, 1, 2]
        views = [[load_views(d.impath, d.key, [v], backbone.transform)[0] for d in items[:3]]
                 for v in (1 + epoch, 3 + epoch)]
        torch.testing.assert_close(batch.pixels, torch.stack(views[0]))
        torch.testing.assert_close(batch.frozen_features, backbone.encode_image(torch.stack(views[1])), atol=2e-3,
                                   rtol=2e-3)
        assert not torch.allclose(batch.frozen_features, backbone.encode_image(torch.stack(views[0])), atol=2e-3)
    # views too large to preload are read epoch by epoch: the same second views
    from atlas_fast.cache import FeatureCache
    from atlas_fast.engine import feed

    second = inputs.frozen
    monkeypatch.setattr(feed, "PRELOAD_BYTES", 0)
    lazy = feed.CachedViews(FeatureCache(spec.config.cache_root), backbone, spec.dataset, items, 2,
                            spec.config.aug_seed, first_view=3)
    assert lazy.preloaded is None and second.preloaded is not None
    for epoch in (0, 1, 2):
        assert torch.equal(lazy.for_epoch(epoch), second.for_epoch(epoch))


def test_python_api_trains_base_to_new_with_and_without_atlas_isl(pets):
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine import run

    options = pets_options(pets / "descriptions.json")
    plain = run(tiny_pets_config(pets, method="coprompt", method_options=options, workers=0))
    atlas = run(tiny_pets_config(pets, method="coprompt", method_options=options, workers=0, schedule=Alternating(2),
                                 soft_labels=soft_label_preset("base2new", "isl")))
    for record in (plain, atlas):
        assert set(record["metrics"]) >= {"base", "new", "H"} and record["epochs"][-1]["loss"] > 0
    assert [e["soft"] for e in atlas["epochs"]] == [False, True]
    assert plain["config"]["method_config"]["descriptions_checksum"]
    # a saved run evaluates without its descriptions (only training reads them), exactly as the run did
    from atlas_fast.engine.pipeline import evaluate_saved

    moved = pets / "descriptions.moved"
    (pets / "descriptions.json").rename(moved)
    try:
        again = evaluate_saved(plain["path"], "OxfordPets", pets / "data", subsample="new", cache_root=pets / "cache",
                               device="cpu", progress=False)
    finally:
        moved.rename(pets / "descriptions.json")
    assert again["accuracy"] == pytest.approx(plain["metrics"]["new"])


def cli_args(pets):
    return ["train", "--dataset", "OxfordPets", "--data-root", str(pets / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--method", "coprompt", "--shots", "4", "--epochs", "2", "--batch-size", "4",
            "--views", "1", "--cache-root", str(pets / "cache"), "--results-dir", str(pets / "cli-results"),
            "--no-progress", "--workers", "0", "--method-option", f"descriptions={pets / 'descriptions.json'}",
            "depth=2"]


def test_the_command_line_names_a_descriptions_file_it_cannot_read(pets, capsys):
    from atlas_fast.cli import main

    bad = cli_args(pets)[:-2] + [f"descriptions={pets / 'nowhere.json'}", "depth=2"]
    assert main(bad) == 2
    assert "nowhere.json: cannot be read" in capsys.readouterr().err


@pytest.mark.slow
def test_command_line_trains_with_and_without_atlas_isl(pets, capsys):
    from atlas_fast.cli import main

    args = cli_args(pets)
    assert main(args) == 0
    assert re.search(r"OxfordPets coprompt\S*(?: \[[^\]]*\])? seed 1: base", capsys.readouterr().out)
    assert main(args + ["--atlas", "isl"]) == 0
    assert re.search(r"OxfordPets coprompt\+ATLaS-ISL \(K=2\)(?: \[[^\]]*\])? seed 1: base", capsys.readouterr().out)


def test_batched_runs_equal_runs_trained_alone(pets):
    """Two runs (another seed, shots and ATLaS-ISL) trained as one module give each the record of training alone,
    its own description sequence included."""
    from atlas_fast.atlas.schedules import Alternating, OneHot
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine import run
    from atlas_fast.engine.pipeline import run_group
    from test_batched import _assert_equal_records

    def configs(results):
        common = dict(method="coprompt", method_options=pets_options(pets / "descriptions.json"), epochs=2, views=2,
                      batch_size=3, lr=0.02, workers=0, results_dir=pets / results)
        return [tiny_pets_config(pets, **common, seed=1, shots=4, schedule=OneHot()),
                tiny_pets_config(pets, **common, seed=2, shots=2, schedule=Alternating(2),
                                 soft_labels=soft_label_preset("base2new", "isl"))]

    alone = [run(config) for config in configs("alone")]
    batched = run_group(configs("batched"))
    assert all(r["timings"]["batch_runs"] == 2 for r in batched)
    _assert_equal_records(batched, alone)


def test_a_folder_of_descriptions_gives_each_dataset_its_file(pets, tmp_path):
    """``descriptions=FOLDER``: ``<dataset>.json`` or the official repository's ``<name>_prompt.json``; the planned
    config names the file it read."""
    from atlas_fast.engine.spec import plan_run
    from atlas_fast.methods.coprompt import descriptions_file

    (tmp_path / "oxford_pets_prompt.json").write_text((pets / "descriptions.json").read_text())
    spec = plan_run(tiny_pets_config(pets, method="coprompt", method_options=pets_options(tmp_path)))
    assert spec.method_config.descriptions == str(tmp_path / "oxford_pets_prompt.json")
    (tmp_path / "OxfordPets.json").write_text("{}")
    assert descriptions_file(tmp_path, "OxfordPets") == tmp_path / "OxfordPets.json"
    with pytest.raises(ValueError, match=r"has no file for DTD \(looked for DTD\.json\)"):
        descriptions_file(tmp_path, "DTD")


def test_the_world_s_descriptions_say_what_its_class_names_do_not():
    from atlas_fast.world.benchmark import WORLD_DATASETS
    from atlas_fast.world.descriptions import class_descriptions

    assert class_descriptions("striped square") == [
        "a photo of a orange striped square.", "a photo of a pink striped square.",
        "a photo of a orange striped square, a shape with four corners.",
        "a photo of a pink striped square, a shape with four corners."]
    assert all(len(class_descriptions(c)) == 4 for d in WORLD_DATASETS for c in d.classnames)
    with pytest.raises(ValueError, match="unknown concept"):
        class_descriptions("striped dragon")


@pytest.mark.slow
def test_trains_on_the_world_with_and_without_atlas_isl_from_the_command_line(tmp_path, capsys):
    """The embedded world with its own descriptions (atlas_fast.world.descriptions), depth cut to its 4 blocks."""
    from atlas_fast.cli import main
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark
    from atlas_fast.world.descriptions import write_descriptions

    generate_benchmark(tmp_path / "world", ["WorldSketches"], sizes=SplitSizes(train=2, val=1, test=1),
                       progress=False)
    folder = write_descriptions(tmp_path / "descriptions", ["WorldSketches"])
    args = ["train", "--dataset", "WorldSketches", "--data-root", str(tmp_path / "world"), "--shots", "2",
            "--epochs", "2", "--views", "2", "--batch-size", "8", "--cache-root", str(tmp_path / "cache"),
            "--results-dir", str(tmp_path / "results"), "--no-progress", "--workers", "0", "--method", "coprompt",
            "--method-option", f"descriptions={folder}"]
    for extra, name in (((), "coprompt"), (("--atlas", "isl"), r"coprompt\+ATLaS-ISL \(K=2\)")):
        assert main(args + list(extra)) == 0
        assert re.search(rf"WorldSketches {name}(?: \[[^\]]*\])? seed 1: base", capsys.readouterr().out)


@pytest.mark.slow
def test_the_beyond_base_to_new_experiment_runs_coprompt_on_the_world(tmp_path):
    """``beyond_base_to_new --world --methods coprompt``: the world's descriptions are written under the data root
    and the block has CoPrompt plain and + ATLaS-ISL."""
    from atlas_fast.experiments import load_experiment
    from test_experiments import run_experiment

    args = ["--world", "--world-images", "3", "1", "2", "--data-root", str(tmp_path / "data"), "--seeds", "1",
            "--epochs", "2", "--views", "1", "--cache-root", str(tmp_path / "cache"), "--results-dir",
            str(tmp_path / "results"), "--out", str(tmp_path / "out"), "--methods", "coprompt", "--kinds", "isl",
            "--datasets", "WorldSketches"]
    text = run_experiment(load_experiment("beyond_base_to_new"), args)
    assert "CoPrompt + ATLaS-ISL" in text and "nan" not in text.lower()
    assert (tmp_path / "data" / "coprompt_descriptions" / "WorldSketches.json").is_file()


@pytest.mark.slow
def test_runs_that_share_their_first_epochs_fork_and_equal_unforked_training(pets, monkeypatch):
    """A seed's plain run and its ATLaS variants train alike in epoch 0: the group trains one trunk run per seed,
    then forks, each fork carrying its trunk's description seed and step count; every record equals the group
    trained without the fork."""
    import atlas_fast.engine.group as group_module
    from atlas_fast.engine.group import ForkPlan
    from atlas_fast.atlas.schedules import Alternating, OneHot
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine.pipeline import run_group
    from test_batched import _assert_equal_records

    def group(results):
        common = dict(method="coprompt", method_options=pets_options(pets / "descriptions.json"), epochs=3, views=3,
                      batch_size=3, lr=0.02, workers=0, shots=4, results_dir=pets / results)
        return [tiny_pets_config(pets, **common, seed=1, schedule=OneHot()),
                tiny_pets_config(pets, **common, seed=1, schedule=Alternating(2),
                                 soft_labels=soft_label_preset("base2new", "csl")),
                tiny_pets_config(pets, **common, seed=1, schedule=Alternating(3),
                                 soft_labels=soft_label_preset("base2new", "isl")),
                tiny_pets_config(pets, **common, seed=2, schedule=OneHot())]

    forks = []
    real_plan = group_module.plan_fork
    monkeypatch.setattr(group_module, "plan_fork", lambda *a: forks.append(real_plan(*a)) or forks[-1])
    forked = run_group(group("forked"))
    assert forks == [ForkPlan([0, 3], [0, 0, 0, 1], 0)]
    monkeypatch.setattr(group_module, "plan_fork", lambda *a: None)
    unforked = run_group(group("unforked"))
    _assert_equal_records(forked, unforked)


@pytest.mark.slow
def test_the_memory_benchmark_s_step_fits_the_planner_s_estimate(capsys):
    """benchmarks/coprompt_memory.py on the tiny model: what autograd keeps for the backward pass of one step is
    within engine/memory.py's per-run estimate (its exit status); ViT-B/16 at C = 1,000 in docs/method-zoo.md."""
    from test_benchmarks import load_benchmark

    assert load_benchmark("coprompt_memory").main(["--classes", "10"]) == 0
    assert "autograd keeps" in capsys.readouterr().out
