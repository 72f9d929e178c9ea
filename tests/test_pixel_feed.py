"""The pixel feed: views decoded in one pool per command, each distinct (image, view) of a step decoded once for
every run of the group, the same pixels as decoding each image alone; a group evaluated in one pass, each test image
decoded once, with every run's logits equal to its own."""


import pytest
import torch

import atlas_fast.engine.pixels as pixels_module
from atlas_fast.atlas.schedules import Alternating, OneHot
from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
from atlas_fast.clip.transforms import load_views
from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
from atlas_fast.engine import TrainConfig
from atlas_fast.engine.pipeline import run_group
from atlas_fast.engine.pixels import DecodingPool, ImageViews, ViewFeed
from atlas_fast.methods.registry import build_method, method_class
from helpers import pixel_test_logits
from layouts import make_oxford_pets
from registry_cases import SMALL_OPTIONS

TINY = BackboneConfig("atlas-tiny", None)
# each method's config at its small setting for the tiny model (tests/registry_cases.py)
CONFIGS = {name: method_class(name).config_class(**SMALL_OPTIONS[name])
           for name in ("ivlp", "maple", "promptsrc", "dept-maple")}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("pixel-feed")
    make_oxford_pets(root / "data", n_classes=4, n_train=4, n_val=1, n_test=2, size=36)
    return root


def split(root, seed=1):
    full = load_dataset("OxfordPets", root / "data")
    return subsample_classes(fewshot_subset(full, 3, seed, store_dir=root / "split"), "base")


@pytest.mark.parametrize("workers", [0, 1])
def test_views_are_the_pixels_of_each_image_decoded_alone_in_one_pool(pets, workers):
    """Two runs on the same images and a third on others, three passes (epochs) through one pool: every batch is
    bit for bit the views load_views gives, and a pool with worker processes starts them once."""
    from torch.utils.data import dataloader

    backbone = shared_backbone(TINY)
    items, others = split(pets).train, split(pets, seed=2).train
    pool = DecodingPool(workers)
    feed = ViewFeed(pool)
    starts = []
    original = dataloader._MultiProcessingDataLoaderIter.__init__

    def counted(self, *args, **kwargs):
        starts.append(1)
        original(self, *args, **kwargs)

    try:
        dataloader._MultiProcessingDataLoaderIter.__init__ = counted
        for epoch in range(3):
            views = [ImageViews(i, backbone, aug_seed=5, feed=feed) for i in (items, items, others)]
            orders = [torch.randperm(len(v), generator=torch.Generator().manual_seed(epoch + r))
                      for r, v in enumerate(views)]
            streams = [v.batches(1 + epoch, order, 2) for v, order in zip(views, orders)]
            for step in zip(*streams):  # read together, step by step
                for v, (pixels, index) in zip(views, step):
                    alone = torch.stack([load_views(v.items[i].impath, v.items[i].key, [1 + epoch], v.spec)[0]
                                         for i in index.tolist()])
                    assert torch.equal(pixels, alone)
    finally:
        dataloader._MultiProcessingDataLoaderIter.__init__ = original
        pool.close()
    assert len(starts) == (1 if workers else 0)


def test_a_run_left_behind_is_an_error_not_a_second_decode(pets):
    backbone = shared_backbone(TINY)
    items = split(pets).train
    feed = ViewFeed(DecodingPool(0))
    first, second = (ImageViews(items, backbone, feed=feed).batches(1, None, 2) for _ in range(2))
    next(first)
    next(first)
    with pytest.raises(RuntimeError, match="step by step together"):
        next(second)


def test_a_group_decodes_each_view_of_a_step_and_each_test_image_once(pets, monkeypatch):
    """Four runs (two seeds x two label variants; a seed's variants read the same images in the same order):
    training decodes each (image, view) of a step once, evaluation each test image once for base, new and all, and
    each few-shot validation image once (the temperature scaling's)."""
    calls = []

    def counting(impath, key, views, spec):
        calls.append((key, tuple(views)))
        return load_views(impath, key, views, spec)

    monkeypatch.setattr(pixels_module, "load_views", counting)
    common = dict(dataset="OxfordPets", data_root=pets / "data", backbone=TINY, method="maple",
                  method_config=CONFIGS["maple"], shots=3, epochs=2, views=2, batch_size=4, lr=0.02, device="cpu",
                  cache_root=pets / "cache", results_dir=pets / "results-decodes", progress=False, workers=0)
    configs = [TrainConfig(**common, seed=seed, schedule=schedule, soft_labels=soft)
               for seed in (1, 2) for schedule, soft in ((OneHot(), None),
                                                         (Alternating(2), soft_label_preset("base2new", "ls")))]
    records = run_group(configs)
    assert all(r["timings"]["batch_runs"] == 4 for r in records)
    # each step decodes the distinct images of the runs' batches of the step once: a seed's two variants share
    # theirs, and the two seeds' batches share the images they have in common
    trains = [split(pets, seed).train for seed in (1, 2)]
    generators = [torch.Generator().manual_seed(seed) for seed in (1, 2)]
    expected = 0
    for epoch in range(2):
        orders = [torch.randperm(len(train), generator=g) for train, g in zip(trains, generators)]
        for step in range(2):
            expected += len({train[i].key for train, order in zip(trains, orders)
                             for i in order[4 * step:4 * step + 4].tolist()})
    trained = [c for c in calls if c[1] != (0,)]
    assert len(trained) == expected < 4 * 2 * len(trains[0])  # 4 runs x 2 epochs decoding alone
    # evaluation decodes each test image once, and each few-shot validation image of the training classes once (the
    # temperature of the calibration figures is fitted on their logits, scored in the same pass; by design)
    tested = [key for key, views in calls if views == (0,)]
    validation = {item.key for seed in (1, 2) for item in split(pets, seed).val}
    assert validation and validation <= set(tested)
    assert len(tested) == len(set(tested)) == records[0]["data"]["num_test"]["all"] + len(validation)


@pytest.mark.parametrize("method", ["ivlp", "maple", "promptsrc", "dept-maple"])
def test_a_group_evaluated_in_one_pass_gives_each_run_its_own_logits(pets, method):
    """The test logits of R = 3 runs' module (each run's learned tensors its own) equal each run's alone, on the
    training classes and on others."""
    from atlas_fast.engine.group import stacked_method

    backbone = shared_backbone(TINY)
    classes = ["cat", "dog", "sea lion"]
    singles = []
    for seed in range(3):
        torch.manual_seed(seed)
        single = build_method(method, backbone, classes, CONFIGS[method])
        with torch.no_grad():
            for param in single.trainable_parameters():
                param.add_(0.05 * torch.randn_like(param))
        singles.append(single.eval())
    group = stacked_method(method_class(method), backbone, classes, CONFIGS[method],
                           [s.state_for_checkpoint() for s in singles]).eval()
    pixels = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        for names in (classes, ["newt", "horse"]):
            group.set_classnames(names)
            together = pixel_test_logits(group, pixels)
            for r, single in enumerate(singles):
                single.set_classnames(names)
                alone = pixel_test_logits(single, pixels)[0]
                torch.testing.assert_close(together[r], alone, rtol=1e-5, atol=1e-5)
