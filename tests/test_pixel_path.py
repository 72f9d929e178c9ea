"""The pixel input path end to end on the tiny model and a synthetic OxfordPets: seeded views are the cached views,
PromptSRC reads its frozen features from the cache, runs are deterministic and evaluable on new classes, and ATLaS
reaches the pixel methods: every registered method that reads pixels (tests/registry_cases.py says which run by
default)."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
from atlas_fast.cache import FeatureCache
from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
from atlas_fast.engine import evaluate_saved
from atlas_fast.engine.evaluate import harmonic_mean
from atlas_fast.engine.feed import CachedViews, PixelBatch, PixelViews
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.coop import CoOpConfig
from atlas_fast.methods.dept import DePTMaPLeConfig
from atlas_fast.methods.ivlp import IVLPConfig
from atlas_fast.methods.maple import MaPLeConfig
from atlas_fast.methods.promptsrc import PromptSRCConfig
from atlas_fast.engine.pixels import ImageViews
from atlas_fast.atlas.schedules import Alternating
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.engine import TrainConfig, run
from helpers import cross_entropy_criterion, pixel_test_logits
from layouts import make_oxford_pets
from registry_cases import cases, reads_pixels, small_options

TINY = BackboneConfig("atlas-tiny", None)
CONFIGS = {"ivlp": IVLPConfig(n_ctx_text=2, n_ctx_vision=2, depth_text=2, depth_vision=2),
           "maple": MaPLeConfig(n_ctx=2, depth=2),
           "promptsrc": PromptSRCConfig(depth_text=2, depth_vision=2, gpa_mean=2, gpa_std=1),
           "dept-maple": DePTMaPLeConfig(n_ctx=2, depth=2)}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("pixel-pets")
    make_oxford_pets(root / "data", n_classes=6, n_train=3, n_val=1, n_test=2, size=36)
    return root


def pixel_config(root, method, **changes):
    base = dict(dataset="OxfordPets", data_root=root / "data", backbone=TINY, method=method,
                method_config=CONFIGS.get(method), shots=3, seed=1, epochs=3, views=2, batch_size=4, lr=0.02,
                cache_root=root / "cache", results_dir=root / "results", progress=False, workers=0)
    return TrainConfig(**{**base, **changes})


def train_items(root):
    full = load_dataset("OxfordPets", root / "data")
    fewshot = fewshot_subset(full, 3, 1, store_dir=root / "cache" / full.name / "split_fewshot")
    return subsample_classes(fewshot, "base")


def test_pixel_views_are_the_cached_views(pets):
    """Decoded view v of an image, encoded by the frozen CLIP, is the cached feature of view v."""
    backbone = shared_backbone(TINY)
    split = train_items(pets)
    cache = FeatureCache(pets / "cache")
    cache.build(backbone, "OxfordPets", split.train, num_views=2, progress=False)
    images = ImageViews(split.train, backbone, workers=0)
    order = torch.randperm(len(split.train), generator=torch.Generator().manual_seed(0))
    for view in (0, 1, 2):
        cached = cache.load(backbone, "OxfordPets", split.train, views=[view])[:, 0]
        for pixels, index in images.batches(view, order, 4):
            torch.testing.assert_close(backbone.encode_image(pixels), cached[index], rtol=2e-3, atol=2e-3)
    one = next(images.batches(1, None, 2))[0]
    assert not torch.equal(one, next(images.batches(2, None, 2))[0])  # another view is other pixels


def test_promptsrc_reads_its_frozen_features_from_the_cache(pets):
    """The loss with the cached frozen features of a batch's views is the loss computed from its pixels."""
    backbone = shared_backbone(TINY)
    split = train_items(pets)
    cache = FeatureCache(pets / "cache")
    cache.build(backbone, "OxfordPets", split.train, num_views=2, progress=False)
    frozen = CachedViews(cache, backbone, "OxfordPets", split.train, 2, 0)
    inputs = PixelViews(ImageViews(split.train, backbone, workers=0), 2, frozen)
    torch.manual_seed(0)
    method = build_method("promptsrc", backbone, split.classnames, CONFIGS["promptsrc"])
    labels = torch.tensor([d.label for d in split.train])
    for epoch in (0, 1):
        batch, index = next(inputs.batches(epoch, torch.arange(len(labels)), 4))
        assert isinstance(batch, PixelBatch) and batch.frozen_features.shape == (len(index), backbone.embed_dim)

        criterion = cross_entropy_criterion(labels[index])
        from_cache = method.training_loss(batch, labels[index], criterion)
        computed = method.training_loss(batch.pixels, labels[index], criterion)
        torch.testing.assert_close(from_cache, computed, rtol=1e-3, atol=1e-4)


def test_views_too_large_to_preload_are_read_once_per_epoch_for_the_runs_sharing_them(pets, monkeypatch):
    """Views above the preload budget are read epoch by epoch: the runs of a group on the same images (a seed's
    label variants, each with its own PixelViews over one CachedViews) read each epoch's view from the cache once,
    not once per run, and get the cache's features of that view."""
    import atlas_fast.engine.feed as feed

    backbone = shared_backbone(TINY)
    split = train_items(pets)
    cache = FeatureCache(pets / "cache")
    cache.build(backbone, "OxfordPets", split.train, num_views=2, progress=False)
    monkeypatch.setattr(feed, "PRELOAD_BYTES", 0)
    frozen = CachedViews(cache, backbone, "OxfordPets", split.train, 2, 0)
    reads = []
    real_load = cache.load
    monkeypatch.setattr(cache, "load", lambda *args, **kwargs: reads.append(kwargs["views"]) or real_load(*args,
                                                                                                        **kwargs))
    runs = [PixelViews(ImageViews(split.train, backbone, workers=0), 2, frozen) for _ in range(4)]
    order = torch.arange(len(split.train))
    for epoch in (0, 1, 2):
        for inputs in runs:
            batch, index = next(inputs.batches(epoch, order, 4))
            expected = real_load(backbone, "OxfordPets", split.train, views=[1 + epoch % 2])[:, 0][index]
            assert torch.equal(batch.frozen_features, expected)
    assert reads == [[1], [2], [1]]  # one read per epoch for the four runs


@pytest.mark.parametrize("method", cases(reads_pixels))
def test_pixel_method_end_to_end_with_and_without_atlas(pets, method):
    """A run trains and evaluates on base, new and all classes, its saved learned tensors evaluate as it did, and
    ATLaS changes the soft epochs of a method that trains on labels (a label-free one refuses label schedules)."""
    from atlas_fast.methods.registry import method_class

    options = small_options(method, pets / "data", load_dataset("OxfordPets", pets / "data").classnames)
    config = pixel_config(pets, method, method_config=None, method_options=options, results_dir=pets / f"e2e-{method}")
    plain = run(config)
    labels = method_class(method).uses_labels
    atlas = run(replace(config, schedule=Alternating(2), soft_labels=soft_label_preset("base2new", "ls"))) if labels else None
    for record in filter(None, (plain, atlas)):
        metrics = record["metrics"]
        assert set(metrics) >= {"base", "new", "all", "H"}
        assert metrics["H"] == pytest.approx(harmonic_mean(metrics["base"], metrics["new"]))
        assert record["data"]["num_test"] == {"base": 6, "new": 6, "all": 12}
        assert all(torch.isfinite(torch.tensor(row["loss"])) for row in record["epochs"])
        assert record["config"]["method"] == method
    if atlas is not None:
        assert [row["soft"] for row in atlas["epochs"]] == [False, True, False]
        assert [row["loss"] for row in plain["epochs"]][1] != [row["loss"] for row in atlas["epochs"]][1]
    # the saved learned tensors evaluate on the new classes exactly as the run did
    again = evaluate_saved(plain["path"], "OxfordPets", pets / "data", subsample="new",
                            cache_root=pets / "cache", device="cpu", progress=False)
    assert again["accuracy"] == pytest.approx(plain["metrics"]["new"])


def test_pixel_runs_are_deterministic_per_seed(pets):
    first = run(pixel_config(pets, "maple", results_dir=pets / "det1"))
    again = run(pixel_config(pets, "maple", results_dir=pets / "det2"))
    other = run(pixel_config(pets, "maple", results_dir=pets / "det3", seed=2))
    assert [r["loss"] for r in first["epochs"]] == [r["loss"] for r in again["epochs"]]
    assert first["metrics"] == again["metrics"]
    assert [r["loss"] for r in first["epochs"]] != [r["loss"] for r in other["epochs"]]


def test_ivlp_on_pixels_trains_like_coop_on_cached_features(pets):
    """IVLP with no visual prompts and text depth 1 is CoOp; trained on the decoded pixels of the seeded views it
    follows CoOp trained on the cached features of those views (up to the cache's fp16 storage)."""
    coop = run(pixel_config(pets, "coop", method_config=CoOpConfig(ctx_init="a photo of a"),
                            results_dir=pets / "coop-vs-ivlp"))
    ivlp = run(pixel_config(pets, "ivlp", method_config=IVLPConfig(n_ctx_text=4, depth_text=1, depth_vision=0),
                            results_dir=pets / "coop-vs-ivlp"))
    assert [r["loss"] for r in ivlp["epochs"]] == pytest.approx([r["loss"] for r in coop["epochs"]], rel=1e-3)
    learned_coop = torch.load(coop["path"].replace(".json", ".pt"), weights_only=True)["ctx"]
    learned_ivlp = torch.load(ivlp["path"].replace(".json", ".pt"), weights_only=True)["ctx"]
    initial = build_method("coop", shared_backbone(TINY), ["cat"], CoOpConfig(ctx_init="a photo of a")).ctx.detach()
    moved = (learned_coop - initial).abs().max().item()
    gap = (learned_ivlp - learned_coop).abs().max().item()
    assert gap < 1e-3 < moved and gap < moved / 20, (gap, moved)
    for name in ("base", "new"):
        assert abs(ivlp["metrics"][name] - coop["metrics"][name]) <= 100 / 6 + 1e-6  # at most one test image


def test_dept_maple_loss_head_and_fusion(pets):
    """DePT on MaPLe: (1 - λ) CE(z) + λ CE(linear([film_t(T[y]); film_v(V)]), [y; y]) with T, V MaPLe's
    un-normalised prompted features; at test, (1 - λ) z + λ head on the training classes, z alone on others."""
    backbone = shared_backbone(TINY)
    classes = ["cat", "dog", "sea lion"]
    torch.manual_seed(0)
    method = build_method("dept-maple", backbone, classes, CONFIGS["dept-maple"])
    with torch.no_grad():
        for param in method.head_parameters()[:4]:
            param.add_(0.1 * torch.randn_like(param))
    pixels, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 2, 1, 2])
    loss = method.training_loss(pixels, labels, cross_entropy_criterion(labels))
    text, image = method.base.raw_text_features()[0], method.base.image_batch(pixels)[0]
    z = method.logit_scale * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
    rows = torch.cat([text[labels] * method.film_text_scale[0] + method.film_text_bias[0],
                      image * method.film_image_scale[0] + method.film_image_bias[0]])
    head = rows @ method.linear_weight[0].T + method.linear_bias[0]
    lam = method.config.head_lambda
    expected = (1 - lam) * F.cross_entropy(z, labels) + lam * F.cross_entropy(head, torch.cat([labels, labels]))
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    loss.backward()
    assert method.base.coupling_weight.grad.abs().sum() > 0 and method.linear_weight.grad.abs().sum() > 0
    with torch.no_grad():
        fused = pixel_test_logits(method, pixels)[0]
        torch.testing.assert_close(fused, (1 - lam) * z + lam * head[len(labels):], rtol=1e-5, atol=1e-5)
        method.set_classnames(["newt", "horse"])
        other = pixel_test_logits(method, pixels)
        torch.testing.assert_close(other, method.base(pixels), rtol=1e-5, atol=1e-6)


def test_pixel_evaluation_in_batches_equals_one_forward(pets, monkeypatch):
    """One pass over two class sets that share their images (chunks of 4: a full and a partial one; the class
    prompts encoded once per set) gives each set the accuracy of one forward over all its images."""
    import atlas_fast.engine.evaluate as evaluate
    from atlas_fast.clip.transforms import load_views

    backbone = shared_backbone(TINY)
    split = train_items(pets)
    torch.manual_seed(0)
    method = build_method("maple", backbone, split.classnames, CONFIGS["maple"])
    with torch.no_grad():
        for param in method.trainable_parameters():  # a trained-looking run: not every image the same class
            param.add_(0.5 * torch.randn_like(param))
    monkeypatch.setattr(evaluate, "EVAL_PIXEL_BATCH", 4)  # 6 test images: a full and a partial batch
    labels = torch.tensor([d.label for d in split.test])
    features = torch.zeros(len(labels), backbone.embed_dim)
    first = ImageViews(split.test[:3], backbone, workers=0)
    sets = [evaluate.EvalSet("base", split.classnames, features, labels, ImageViews(split.test, backbone, workers=0)),
            evaluate.EvalSet("first three", split.classnames[::-1], features[:3], 1 - labels[:3], first)]
    accuracies = {name: scores.accuracy for name, scores in evaluate.pixel_scores(method, sets).items()}
    pixels = torch.cat([load_views(d.impath, d.key, [0], first.spec) for d in split.test])
    with torch.no_grad():
        method.set_classnames(split.classnames)
        logits = method(pixels)[0]
        method.set_classnames(split.classnames[::-1])
        reversed_logits = method(pixels[:3])[0]
    assert accuracies["base"] == pytest.approx([100.0 * (logits.argmax(-1) == labels).float().mean().item()])
    expected = 100.0 * (reversed_logits.argmax(-1) == 1 - labels[:3]).float().mean().item()
    assert accuracies["first three"] == pytest.approx([expected])
