"""The embedded world: deterministic generator, CoOp-layout benchmark, pretraining script and shipped checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.data import load_dataset
from atlas_fast.world.benchmark import (MAIN_CLASSES, SPLIT_ORDERS, STAMP_FILE, TEMPLATE, WORLD_BY_NAME, WORLD_DATASETS,
                                        SplitSizes, generate_benchmark, split_order)
from tools.world.zeroshot import zero_shot_report
from helpers import run_killed_at_step
from atlas_fast.world.generator import (CONCEPTS, SHAPES, STYLES, TEXTURES, concept_id, image_rng, render,
                                        render_batch)
from tools.world.pretrain import (CAPTION_PREFIX, CaptionedBatches, PretrainConfig, caption, contrastive_loss,
                                       pretrain, save_checkpoint, train_view)

TINY = SplitSizes(train=2, val=1, test=1)
ZERO_SHOT_FLOOR = 90.0  # on fresh pretraining-layout images of every style; measured 99.2-100 % (README)


def test_classes_are_textured_shapes_and_new_classes_are_novel_shapes():
    assert len(CONCEPTS) == len(SHAPES) * len(TEXTURES) == 40 and len(set(CONCEPTS)) == 40
    assert CONCEPTS[concept_id("striped triangle")] == "striped triangle"
    with pytest.raises(ValueError, match="texture"):
        concept_id("red circle")
    assert len(MAIN_CLASSES) == 24
    base, new = MAIN_CLASSES[:12], MAIN_CLASSES[12:]
    # base: circle, triangle, square; new: star, cross, heart (novel shapes); every texture in both halves
    assert {c.split()[1] for c in base} == set(SHAPES[:3]) and {c.split()[1] for c in new} == set(SHAPES[3:6])
    assert {c.split()[0] for c in base} == {c.split()[0] for c in new} == set(TEXTURES[:4])
    assert MAIN_CLASSES == split_order("shape", SHAPES[:6], TEXTURES[:4])
    # no class name mentions a colour, although benchmark classes have typical colours (generator.SHAPE_PALETTES)
    assert not any(word in {"red", "blue", "green"} for c in CONCEPTS for word in c.split())


def test_held_out_split_orders_put_unseen_attribute_values_in_the_new_half():
    """``--split-order texture``: base = 6 shapes x (solid, striped), new = the same shapes x (dotted, checkered);
    ``shape``: base = (circle, triangle, square) x 4 textures, new = (star, cross, heart) x 4 textures; ``both``:
    base = (circle, triangle, square) x (solid, striped), new = (star, cross, heart) x (dotted, checkered)."""
    shapes, textures = SHAPES[:6], TEXTURES[:4]
    board = split_order("checkerboard", shapes, textures)  # new classes recombine base attributes
    for half in (board[:12], board[12:]):
        assert {c.split()[1] for c in half} == set(shapes) and {c.split()[0] for c in half} == set(textures)
    for order, held, kept in (("texture", 0, 1), ("shape", 1, 0)):
        names = split_order(order, shapes, textures)
        assert sorted(names) == sorted(MAIN_CLASSES)
        base, new = names[:12], names[12:]
        values = textures if order == "texture" else shapes
        assert {c.split()[held] for c in base} == set(values[:len(values) // 2])
        assert {c.split()[held] for c in new} == set(values[len(values) // 2:])
        other = shapes if order == "texture" else textures  # the other attribute: every value in both halves
        assert {c.split()[kept] for c in base} == {c.split()[kept] for c in new} == set(other)
    both = split_order("both", shapes, textures)  # new classes share no attribute with base ones
    assert len(both) == 12 and set(both) < set(MAIN_CLASSES)
    assert {c.split()[1] for c in both[:6]} == set(shapes[:3]) and {c.split()[0] for c in both[:6]} == set(textures[:2])
    assert {c.split()[1] for c in both[6:]} == set(shapes[3:]) and {c.split()[0] for c in both[6:]} == set(textures[2:])
    assert set(SPLIT_ORDERS) == {"checkerboard", "texture", "shape", "both"}
    with pytest.raises(ValueError, match="split order"):
        split_order("random", shapes, textures)
    with pytest.raises(ValueError, match="two halves"):
        split_order("shape", SHAPES[:5], textures)


def test_rendering_is_a_pure_function_of_its_seed():
    a = render(5, "sketch", image_rng(0, "sketch", "train", 5, 3))
    b = render(5, "sketch", image_rng(0, "sketch", "train", 5, 3))
    c = render(5, "sketch", image_rng(0, "sketch", "train", 5, 4))
    assert a.shape == (32, 32, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    batch = render_batch([5, 7], ["sketch", "photo"], 0, "train", start_index=3)
    assert np.array_equal(batch[0], a)


def test_style_is_visible_colour_is_a_nuisance_and_arguments_are_checked():
    """The same draw in the dark style is much darker than as a photo; sketches carry no colour; the colour of a
    class varies from image to image; bad concepts and styles name the valid ones."""
    photo = render(0, "photo", image_rng(0, "photo", "train", 0, 0)).astype(float)
    dark = render(0, "dark", image_rng(0, "photo", "train", 0, 0)).astype(float)
    assert dark.mean() < photo.mean() - 40
    def draw(style, colour):
        return render(0, style, image_rng(0, style, "train", 0, 0), colour=colour)

    assert np.array_equal(draw("sketch", 0), draw("sketch", 5))  # grey pencil: the colour does not show
    assert np.abs(draw("photo", 0).astype(float) - draw("photo", 5)).max() > 100  # ... but it does in a photo
    centres = {tuple(render(0, "photo", image_rng(0, "photo", "train", 0, i))[16, 16] // 64) for i in range(12)}
    assert len(centres) > 3  # drawn at random per image
    with pytest.raises(ValueError, match="valid styles"):
        render(0, "watercolour", image_rng(0, "photo", "train", 0, 0))
    with pytest.raises(ValueError, match="out of range"):
        render(40, "photo", image_rng(0, "photo", "train", 0, 0))


def test_benchmark_is_written_in_coop_layout_and_loads_by_name(tmp_path):
    (dataset_dir,) = generate_benchmark(tmp_path, ["WorldSketches"], sizes=TINY, progress=False)
    spec = WORLD_BY_NAME["WorldSketches"]
    split_path = dataset_dir / spec.split_file
    text = split_path.read_text()
    split = json.loads(text)
    assert text == json.dumps(split, indent=4, separators=(",", ": "))  # Dassl's write_json
    assert {k: len(v) for k, v in split.items()} == {"train": 48, "val": 24, "test": 24}
    rel, label, classname = split["train"][0]
    assert (dataset_dir / "images" / rel).is_file() and classname == MAIN_CLASSES[label]

    data = load_dataset("WorldSketches", tmp_path)
    assert tuple(data.classnames) == MAIN_CLASSES and data.template == TEMPLATE == "a photo of a {}."
    assert len(data.train) == 48 and data.train[0].key.startswith("images/")


def test_benchmark_is_deterministic_and_idempotent(tmp_path):
    (first,) = generate_benchmark(tmp_path / "a", ["WorldDark"], sizes=TINY, progress=False)
    (second,) = generate_benchmark(tmp_path / "b", ["WorldDark"], sizes=TINY, progress=False)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)

    stamp_time = (first / STAMP_FILE).stat().st_mtime_ns
    generate_benchmark(tmp_path / "a", ["WorldDark"], sizes=TINY, progress=False)
    assert (first / STAMP_FILE).stat().st_mtime_ns == stamp_time  # reused, not rewritten

    generate_benchmark(tmp_path / "a", ["WorldDark"], sizes=SplitSizes(1, 1, 1), progress=False)  # new arguments
    assert len(json.loads((first / WORLD_BY_NAME["WorldDark"].split_file).read_text())["train"]) == 24
    assert len(list((first / "images").rglob("train_*.png"))) == 24  # stale images removed


def test_benchmark_refuses_foreign_folders_and_unknown_names(tmp_path):
    (tmp_path / "world_photos").mkdir()
    (tmp_path / "world_photos" / "mine.txt").write_text("not generated")
    with pytest.raises(FileExistsError, match="world_photos"):
        generate_benchmark(tmp_path, ["WorldPhotos"], sizes=TINY, progress=False)
    with pytest.raises(ValueError, match="WorldSketches"):
        generate_benchmark(tmp_path, ["Sketches"], sizes=TINY, progress=False)


def test_datasets_cover_the_four_settings_without_a_hidden_domain_word():
    """Every style has a dataset of the main classes (domain generalisation); the cross-dataset targets have other
    class sets that share shapes and textures with it; every template is the captions' own prefix."""
    from atlas_fast.world import benchmark

    main = [d for d in WORLD_DATASETS if d.classnames == MAIN_CLASSES]
    assert sorted(d.style for d in main) == sorted(STYLES)
    assert {benchmark.DG_SOURCE, *benchmark.DG_TARGETS} == {d.name for d in main}
    for name in benchmark.CROSS_TARGETS:
        classes = set(WORLD_BY_NAME[name].classnames)
        assert classes - set(MAIN_CLASSES) and classes & set(MAIN_CLASSES)
    assert {d.template for d in WORLD_DATASETS} == {f"{CAPTION_PREFIX} {{}}."}
    # captions never name the style: every image's caption starts with the same words, whatever its style
    assert not any(style in CAPTION_PREFIX for style in STYLES if style != "photo")
    _, _, texts = CaptionedBatches(PretrainConfig(batch_size=64, seed=1)).batch(0)
    assert all(t.startswith(CAPTION_PREFIX + " ") for t in texts)


def test_captions_and_contrastive_targets():
    assert caption(concept_id("striped star"), 5, False, False) == "a photo of a striped star."
    assert caption(concept_id("striped star"), 5, True, True) == \
        "a photo of a blue striped star, a shape with five points."
    stream = CaptionedBatches(PretrainConfig(batch_size=8, group_size=4, seed=3))
    images, ids, texts = stream.batch(7)
    again = stream.batch(7)
    assert images.shape == (8, 32, 32, 3) and np.array_equal(images, again[0]) and texts == again[2]
    concepts = stream.concepts(np.random.default_rng(0))
    words = [CONCEPTS[c].split() for c in concepts]
    first, second = words[:4], words[4:]
    assert len({w[0] for w in first}) == 1 and len({w[1] for w in first}) == 4  # one texture, four shapes
    assert len({w[1] for w in second}) == 1 and len({w[0] for w in second}) == 4  # one shape, four textures
    view = train_view(images[0], np.random.default_rng(1))
    assert view.shape == images[0].shape and view.dtype == np.uint8
    assert np.array_equal(view, train_view(images[0], np.random.default_rng(1)))
    assert not np.array_equal(view, images[0])
    with pytest.raises(ValueError, match="group_size"):
        CaptionedBatches(PretrainConfig(batch_size=6, group_size=4))
    # Identical captions share the target mass: a perfect, duplicate-aware model has the minimal loss.
    feats = torch.nn.functional.normalize(torch.eye(3)[[0, 1, 1]], dim=-1)
    ids = torch.tensor([0, 1, 1])
    perfect = contrastive_loss(feats, feats, torch.tensor(50.0), ids)
    assert perfect.item() == pytest.approx(np.log(2) * 2 / 3, abs=1e-3)


@pytest.mark.slow  # the world's CLIP pretraining is a research tool (tools/world/), not a user's path
def test_pretrain_saves_a_checkpoint_that_load_backbone_reads(tmp_path):
    cfg = PretrainConfig(steps=2, batch_size=8, warmup_steps=1, threads=1)
    model, tokenizer = pretrain(cfg)
    again, _ = pretrain(cfg)  # deterministic given the seed
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    path = tmp_path / "world.safetensors"
    save_checkpoint(model, path)
    backbone = load_backbone(BackboneConfig("atlas-world", str(path)))
    assert backbone.architecture["image_size"] == 32 and backbone.context_length == 32
    expected = model.state_dict()["visual.conv1.weight"].half().float()
    assert torch.equal(backbone.model.state_dict()["visual.conv1.weight"], expected)
    unused = tokenizer(["zebra"])[0, 1]  # a word no caption uses: its embedding row is zeroed
    assert backbone.model.token_embedding.weight[unused].abs().sum() == 0
    # Rewriting the scale of a saved checkpoint (how the shipped one got its calibrated 34) changes nothing else.
    from safetensors.torch import load_file
    from tools.world.pretrain import rewrite_logit_scale

    before = load_file(str(path))
    rewrite_logit_scale(path, 34.0)
    after = load_file(str(path))
    assert after["logit_scale"].float().exp().item() == pytest.approx(34.0, abs=0.05)
    assert all(torch.equal(before[k], after[k]) for k in before if k != "logit_scale")


@pytest.mark.slow  # the world's CLIP pretraining is a research tool (tools/world/), not a user's path
def test_pretraining_resumes_after_a_crash_to_the_same_weights(tmp_path, monkeypatch):
    """A run killed after its step-2 checkpoint and resumed ends with exactly the weights of an uninterrupted run;
    a state saved by another configuration is refused, and the state file is only ever replaced whole."""
    from tools.world import pretrain as pretrain_module
    from tools.world.pretrain import STATE_FILE, load_state

    cfg = PretrainConfig(steps=4, batch_size=8, warmup_steps=1, threads=1, report_every=0, checkpoint_every=2)
    straight, _ = pretrain(cfg, state_dir=tmp_path / "straight")
    assert torch.load(tmp_path / "straight" / STATE_FILE, weights_only=True)["step"] == 4

    run_killed_at_step(monkeypatch, pretrain_module, 3, lambda: pretrain(cfg, state_dir=tmp_path / "crashed"))
    saved = torch.load(tmp_path / "crashed" / STATE_FILE, weights_only=True)
    assert saved["step"] == 2 and saved["optimizer"]["state"]  # AdamW's moments travel with the weights
    assert [p.name for p in (tmp_path / "crashed").iterdir()] == [STATE_FILE]  # no temporary file left behind

    resumed, _ = pretrain(cfg, state_dir=tmp_path / "crashed", resume=True)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="lr"):
        load_state(tmp_path / "crashed", PretrainConfig(steps=4, batch_size=8, warmup_steps=1, lr=2e-3))
    assert load_state(tmp_path / "crashed", PretrainConfig(steps=4, batch_size=8, warmup_steps=1, threads=2,
                                                           report_every=0, checkpoint_every=2)) is not None


@pytest.fixture(scope="module")
def shipped():
    return load_backbone(BackboneConfig("atlas-world", "atlas-world"))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """WorldPhotos as the demo and the properties script generate it (32 training images per class)."""
    root = tmp_path_factory.mktemp("world_photos")
    generate_benchmark(root, ["WorldPhotos"], sizes=SplitSizes(train=32, val=1, test=PROPERTY_TEST_IMAGES),
                       progress=False)
    return root


# Measured on the shipped checkpoint (atlas_fast/world/README.md, "The world's properties"); each floor sits a few
# points under its measurement, so that only a real regression fails.
PROPERTY_TEST_IMAGES = 50  # as data/world: the measured curve below is this very run
TEACHER_FLOORS = {"harder_attribute_accuracy": 70.0, "isl_argmax_is_label": 75.0}  # measured 81.2 and 79.7
SHIPPED_LOGIT_SCALE = 34.0  # lowest ECE on held-out pretraining-style images (python -m tools.world.calibration)


def test_shipped_checkpoint_is_a_strong_teacher_on_base_training_images(shipped, photos):
    """On WorldPhotos' base training images: zero-shot gets the harder attribute right on >= 70 % of them, ISL's
    argmax is the label on >= 75 % of rows (issue 19 asks for 70), the logit scale is the calibrated one; CSL and ISL
    put more of their off-target mass on classes that share an attribute with the label than uniform smoothing does."""
    from tools.world.properties import teacher_properties

    props = teacher_properties("WorldPhotos", photos, shipped)
    for name, floor in TEACHER_FLOORS.items():
        assert getattr(props, name) >= floor, (name, props)
    assert props.logit_scale == pytest.approx(SHIPPED_LOGIT_SCALE, abs=0.1)  # stored as an fp16 log: 33.97
    assert props.csl_attribute_share > props.uniform_attribute_share + 5, props
    assert props.isl_attribute_share > props.uniform_attribute_share + 5, props


def test_shipped_checkpoint_zero_shot_on_every_style(shipped):
    """Fresh images (a seed no pretraining batch or benchmark uses), 4 per class and style, with the template."""
    report = zero_shot_report(shipped.model, shipped.tokenizer, per_class=4, seed=2024)
    assert min(row["main"] for row in report.rows.values()) > ZERO_SHOT_FLOOR, report.format()


@pytest.mark.slow  # the paper recipe's 200 epochs: `pytest -m slow` (about 1.5 minutes)
def test_coop_new_class_accuracy_falls_below_zero_shot(photos, tmp_path):
    """CoOp (the paper's recipe: 4 context tokens from "a photo of a", 16 shots, 200 epochs, a fresh view per epoch)
    on WorldPhotos' base classes, seed 1: new-class accuracy ends more than 5 points below zero-shot CLIP's and below
    its own peak, as on real CLIP (issue 19). Measured (world README): zero-shot new 67.5 -> 52.8 after 200 epochs,
    base 79.5 -> 92.2."""
    from tools.world.properties import coop_new_class_curve

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny steps: intra-op threads only contend on a shared machine
    try:
        curve = coop_new_class_curve("WorldPhotos", photos, seeds=(1,), cache_root=tmp_path / "cache",
                                     results_dir=tmp_path / "results")
    finally:
        torch.set_num_threads(threads)
    assert curve.new_by_epoch[-1] < curve.zero_shot_new - 5.0, curve
    assert curve.new_by_epoch[-1] < curve.peak_new - 5.0, curve


def test_benchmark_classes_are_drawn_in_their_shapes_two_typical_colours(tmp_path):
    """Benchmark datasets draw every image of a class in one of its shape's two colours (every colour typical of two
    shapes, no class name saying it); ``colours="any"`` draws them uniformly, as pretraining does."""
    from atlas_fast.world.benchmark import WorldDataset, image_colours
    from atlas_fast.world.generator import COLOURS, SHAPE_PALETTES

    assert sorted(c for pair in SHAPE_PALETTES.values() for c in pair) == sorted(2 * list(range(len(COLOURS))))
    assert all(a != b for a, b in SHAPE_PALETTES.values())
    palette = WORLD_BY_NAME["WorldPhotos"]
    assert palette.colours == "shape-palette"
    colours = image_colours(palette, "striped square", "train", 40, seed=0)
    assert set(colours) == set(SHAPE_PALETTES["square"])
    assert colours == image_colours(palette, "striped square", "train", 40, seed=0)
    assert colours != image_colours(palette, "striped square", "test", 40, seed=0)
    assert image_colours(WorldDataset("A", "a", "photo", colours="any"), "striped square", "train", 3, 0) == [None] * 3
    with pytest.raises(ValueError, match="shape-palette"):
        WorldDataset("P", "p", "photo", colours="rainbow")

    (folder,) = generate_benchmark(tmp_path, ["WorldPhotos"], sizes=TINY, progress=False)
    assert json.loads((folder / STAMP_FILE).read_text())["dataset"]["colours"] == "shape-palette"
    assert len(load_dataset("WorldPhotos", tmp_path).train) == 24 * TINY.train
