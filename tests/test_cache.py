"""The HDF5 feature cache on CPU with the tiny model: incremental, resumable, self-checking, safe across processes."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.cache import CacheError, CacheMismatchError, FeatureCache, MissingFeaturesError
from atlas_fast.cache.build import write_cells
from atlas_fast.cache.read import read_view
from atlas_fast.data.base import Datum
from atlas_fast.clip.transforms import ImageReadError, load_views
from tests.layouts import make_oxford_pets

TINY = BackboneConfig("atlas-tiny", None)
DATASET = "OxfordPets"


def read_items(dataset_dir: Path, split: str) -> list[Datum]:
    """Datum lists straight from the split JSON (the cache only needs impath and key)."""
    entries = json.loads((dataset_dir / "split_zhou_OxfordPets.json").read_text())[split]
    return [Datum(str(dataset_dir / "images" / rel), label, cname, f"images/{rel}") for rel, label, cname in entries]


@pytest.fixture(scope="module")
def backbone():
    return load_backbone(TINY)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    return make_oxford_pets(tmp_path_factory.mktemp("data"), n_classes=3, n_train=4, n_val=1, n_test=2)


@pytest.fixture(scope="module")
def train(dataset_dir) -> list[Datum]:
    return read_items(dataset_dir, "train")  # 12 images


def direct_features(backbone, items: list[Datum], view: int, aug_seed: int = 0) -> torch.Tensor:
    spec = backbone.transform_for(aug_seed)
    pixels = torch.cat([load_views(d.impath, d.key, [view], spec) for d in items])
    return backbone.encode_image(pixels).float()


def build(cache: FeatureCache, backbone, items, **kwargs):
    kwargs.setdefault("num_workers", 0)
    kwargs.setdefault("progress", False)
    return cache.build(backbone, DATASET, items, **kwargs)


def test_builds_are_incremental(tmp_path, backbone, train):
    cache = FeatureCache(tmp_path / "cache")
    first = build(cache, backbone, train[:8], num_views=2)
    assert (first.encoded, first.reused) == (8 * 3, 0) and first.path.is_file()
    again = build(cache, backbone, train[:8], num_views=2)
    assert (again.encoded, again.reused) == (0, 24)
    more_views = build(cache, backbone, train[:8], num_views=4)
    assert (more_views.encoded, more_views.reused) == (8 * 2, 24)
    new_subset = build(cache, backbone, train[4:], num_views=4)  # 4 known images, 4 new ones
    assert (new_subset.encoded, new_subset.reused) == (4 * 5, 4 * 5)
    assert new_subset.path == first.path
    features = cache.load(backbone, DATASET, train, views=range(5))
    assert features.shape == (12, 5, backbone.embed_dim) and features.dtype == torch.float32


def test_features_equal_a_direct_forward_pass(tmp_path, backbone, train):
    items = train[:6]
    for dtype, tolerance in (("float16", 2e-3), ("float32", 1e-5)):
        cache = FeatureCache(tmp_path / dtype, storage_dtype=dtype)
        build(cache, backbone, items, num_views=2, batch_size=4)
        order = [5, 0, 3, 1, 4, 2]  # any order of items, any subset of views
        loaded = cache.load(backbone, DATASET, [items[i] for i in order], views=[2, 0])
        for j, view in enumerate((2, 0)):
            expected = direct_features(backbone, [items[i] for i in order], view)
            scale = expected.abs().max()
            assert torch.allclose(loaded[:, j], expected, atol=tolerance * scale, rtol=0), dtype
        with h5py.File(cache.path_for(backbone, DATASET), "r") as f:
            assert f["features"].dtype == dtype and f.attrs["storage_dtype"] == dtype


def test_views_are_distinct_and_the_same_whatever_the_batching_or_worker(tmp_path, backbone, train):
    a = FeatureCache(tmp_path / "a")
    b = FeatureCache(tmp_path / "b", storage_dtype="float32")
    build(a, backbone, train[:4], num_views=3, batch_size=64)
    build(b, backbone, list(reversed(train[:4])), num_views=1, batch_size=1)
    build(b, backbone, train[:4], num_views=3, batch_size=3, num_workers=1)  # decoded in a worker process
    fa = a.load(backbone, DATASET, train[:4], views=range(4))
    fb = b.load(backbone, DATASET, train[:4], views=range(4))
    assert torch.allclose(fa, fb, atol=2e-3 * fb.abs().max())
    assert not torch.allclose(fb[:, 1], fb[:, 2]) and not torch.allclose(fb[:, 0], fb[:, 1])


def test_missing_features_error_names_what_and_how(tmp_path, backbone, train):
    cache = FeatureCache(tmp_path / "cache")
    with pytest.raises(MissingFeaturesError, match="12 of 12") as nothing_yet:
        cache.load(backbone, DATASET, train, views=[0])
    assert "atlas-fast cache build --dataset OxfordPets --model atlas-tiny --pretrained none" in str(nothing_yet.value)
    build(cache, backbone, train[:10], num_views=1)
    with pytest.raises(MissingFeaturesError, match="4 of 24") as partly:
        cache.load(backbone, DATASET, train, views=[0, 1])
    assert set(partly.value.missing) == {(d.key, v) for d in train[10:] for v in (0, 1)}
    with pytest.raises(MissingFeaturesError, match="--views 2"):
        cache.load(backbone, DATASET, train[:10], views=[2])


def test_other_weights_or_transform_are_never_reused(tmp_path, backbone, train):
    cache = FeatureCache(tmp_path / "cache")
    path = build(cache, backbone, train[:4]).path
    other = load_backbone(BackboneConfig("atlas-tiny", None, init_seed=1))
    assert other.fingerprint != backbone.fingerprint
    assert cache.path_for(other, DATASET) != path
    with pytest.raises(MissingFeaturesError):
        cache.load(other, DATASET, train[:4], views=[0])
    assert cache.path_for(backbone, DATASET, aug_seed=1) != path  # another augmentation seed, another file

    # A file moved under another backbone's name is detected by its attributes, on load and on build.
    shutil.copy(path, cache.path_for(other, DATASET))
    with pytest.raises(CacheMismatchError, match="disagree with its location"):
        cache.load(other, DATASET, train[:4], views=[0])
    with pytest.raises(CacheMismatchError):
        build(cache, other, train[:4])

    # A tampered attribute is detected too.
    with h5py.File(path, "a") as f:
        description = json.loads(f.attrs["transform"])
        description["views1+"]["scale"] = [0.5, 1.0]
        f.attrs["transform"] = json.dumps(description, sort_keys=True)
    with pytest.raises(CacheMismatchError, match="'transform'"):
        cache.load(backbone, DATASET, train[:4], views=[0])
    # A foreign HDF5 file in the cache's place is refused, not overwritten.
    foreign = cache.path_for(backbone, DATASET, aug_seed=5)
    foreign.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(foreign, "w") as f:
        f["something"] = [1, 2, 3]
    with pytest.raises(CacheMismatchError, match="not an atlas_fast feature cache"):
        build(cache, backbone, train[:4], aug_seed=5)
    damaged = cache.path_for(backbone, DATASET, aug_seed=6)
    damaged.write_bytes(b"\x00" * 100)
    with pytest.raises(CacheError, match="delete it"):
        cache.load(backbone, DATASET, train[:4], views=[0], aug_seed=6)
    problems = {e.path.name: e.problem for e in cache.entries()}
    assert problems[cache.path_for(other, DATASET).name] is not None


def test_precision_and_storage_dtype_are_not_mixed(tmp_path, backbone, train):
    build(FeatureCache(tmp_path / "cache"), backbone, train[:2])
    with pytest.raises(CacheMismatchError, match="precision"):
        build(FeatureCache(tmp_path / "cache"), backbone, train[2:4], precision="bf16")
    with pytest.raises(CacheMismatchError, match="float16"):
        build(FeatureCache(tmp_path / "cache", storage_dtype="float32"), backbone, train[2:4])


@pytest.mark.parametrize("workers", [0, 1])
def test_unreadable_image_is_named(tmp_path, backbone, train, workers):
    broken = tmp_path / "images" / "broken_cat.jpg"
    broken.parent.mkdir()
    broken.write_bytes(b"\xff\xd8 truncated")
    items = train[:3] + [Datum(str(broken), 0, "cat", "images/broken_cat.jpg")]
    with pytest.raises(ImageReadError, match="broken_cat.jpg"):
        build(FeatureCache(tmp_path / "cache"), backbone, items, num_workers=workers)


def test_an_interrupted_build_resumes(tmp_path, backbone, train, monkeypatch):
    cache = FeatureCache(tmp_path / "cache")
    calls = {"n": 0}
    encode = backbone.encode_image

    def failing_encoder(pixels):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated interruption")
        return encode(pixels)

    monkeypatch.setattr(backbone, "encode_image", failing_encoder)
    with pytest.raises(KeyboardInterrupt):
        build(cache, backbone, train, batch_size=4)  # 3 batches of 4 images; the third fails
    monkeypatch.undo()
    with pytest.raises(MissingFeaturesError, match="4 of 12"):
        cache.load(backbone, DATASET, train, views=[0])
    resumed = build(cache, backbone, train, batch_size=4)
    assert (resumed.encoded, resumed.reused) == (4, 8)
    expected = direct_features(backbone, train, 0)
    loaded = cache.load(backbone, DATASET, train, views=[0])[:, 0]
    assert torch.allclose(loaded, expected, atol=2e-3 * expected.abs().max())


def test_entries_and_info_list_the_cache(tmp_path, backbone, train):
    cache = FeatureCache(tmp_path / "cache")
    build(cache, backbone, train[:6], num_views=2)
    build(cache, backbone, train[6:], num_views=0)
    (entry,) = cache.entries()
    assert (entry.dataset, entry.num_images, entry.view_counts) == (DATASET, 12, [12, 6, 6])
    assert entry.backbone_fingerprint == backbone.fingerprint and entry.problem is None
    assert entry.size_bytes == entry.path.stat().st_size > 0
    text = cache.info()
    assert "OxfordPets" in text and "v0:12 v1-2:6" in text and "32px bicubic aug_seed=0" in text
    assert backbone.fingerprint[:12] in text and entry.transform_fingerprint[:12] in text
    (tmp_path / "empty").mkdir()
    assert "No feature cache" in FeatureCache(tmp_path / "empty").info()
    with pytest.raises(FileNotFoundError, match="missing"):  # a mistyped root is not an empty cache
        FeatureCache(tmp_path / "missing").info()


def _build_in_process(root: str, items: list[Datum]) -> int:
    torch.set_num_threads(1)  # a forked child must not reuse the parent's OpenMP pool
    backbone = load_backbone(TINY)
    return FeatureCache(root, storage_dtype="float32").build(backbone, DATASET, items, num_views=1, batch_size=2,
                                                            num_workers=0, progress=False).encoded


def test_concurrent_builders_and_readers_share_one_file(tmp_path, backbone, dataset_dir, train):
    """Two builder processes on overlapping items: no duplicate work, no corruption; a reader polling meanwhile
    only ever sees complete, correct features (or a clean MissingFeaturesError)."""
    items = train + read_items(dataset_dir, "test")  # 18 images
    root = str(tmp_path / "cache")
    cache = FeatureCache(root, storage_dtype="float32")
    expected = direct_features(backbone, items, 0)
    # fork: the children inherit the imported modules (spawning would re-import torch and open_clip, ~10 s each).
    with mp.get_context("fork").Pool(2) as pool:
        pending = pool.starmap_async(_build_in_process, [(root, items[:12]), (root, items[6:])])
        seen_complete = 0
        while not pending.ready():
            try:
                loaded = cache.load(backbone, DATASET, items[6:12], views=[0])[:, 0]
            except MissingFeaturesError:
                time.sleep(0.02)
                continue
            assert torch.allclose(loaded, expected[6:12], atol=1e-5 * expected.abs().max())
            seen_complete += 1
        encoded = pending.get(timeout=120)
    assert sum(encoded) == 18 * 2  # each (image, view) encoded exactly once across the two processes
    loaded = cache.load(backbone, DATASET, items, views=[0, 1])
    assert torch.allclose(loaded[:, 0], expected, atol=1e-5 * expected.abs().max())
    assert torch.allclose(loaded[:, 1], direct_features(backbone, items, 1), atol=1e-5 * expected.abs().max())


@pytest.mark.parametrize("rows", [[5, 2, 7, 2, 3], [3000, 1, 1500, 1]])  # dense block / sparse fancy-index paths
def test_cell_writes_and_row_reads_in_any_order(rows):
    with h5py.File("mem.h5", "w", driver="core", backing_store=False) as f:
        ds = f.create_dataset("features", shape=(3200, 3, 4), dtype="float32", chunks=(64, 1, 4))
        rows_a = np.array(rows)
        unique_rows = np.unique(rows_a)
        views = np.arange(len(unique_rows)) % 3
        values = np.arange(len(unique_rows) * 4, dtype="float32").reshape(-1, 4) + 1
        write_cells(ds, unique_rows, views, values)
        expected = np.zeros((3200, 3, 4), dtype="float32")
        expected[unique_rows, views] = values
        assert np.array_equal(ds[...], expected)
        done = f.create_dataset("done", shape=(3200, 3), maxshape=(None, None), dtype=bool, chunks=(1024, 8))
        write_cells(done, unique_rows, views, True)
        assert np.array_equal(done[...], (expected != 0).any(axis=2))
        for v in range(3):
            assert np.array_equal(read_view(ds, rows_a, v), expected[rows_a, v])
        whole = (np.array([3101, 3100, 3101, 3100]), np.array([1, 1, 2, 2]))  # fill rows 3100-3101 x views 1-2
        write_cells(ds, *whole, values[:1].repeat(4, axis=0) + 7)
        expected[whole] = values[:1] + 7
        assert np.array_equal(ds[...], expected)


def _torchvision_views(impath: str, key: str, views: list[int], spec) -> torch.Tensor:
    """Views as the cache computed them before 8-bit pixels: torchvision's functions on PIL images, one by one."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    from atlas_fast.clip.transforms import random_resized_crop_params, read_image, view_seed

    image, size, out = read_image(impath), spec.image_size, []
    for view in views:
        if view == 0:
            pil = TF.center_crop(TF.resize(image, size, interpolation=InterpolationMode.BICUBIC), [size, size])
        else:
            generator = torch.Generator().manual_seed(view_seed(spec.aug_seed, key, view))
            top, left, h, w = random_resized_crop_params(image.width, image.height, spec.crop_scale,
                                                         spec.crop_ratio, generator)
            pil = TF.resized_crop(image, top, left, h, w, [size, size], interpolation=InterpolationMode.BICUBIC)
            if torch.rand(1, generator=generator).item() < spec.flip_p:
                pil = TF.hflip(pil)
        out.append(TF.normalize(TF.to_tensor(pil), spec.mean, spec.std))
    return torch.stack(out)


class SerialBuilder(FeatureCache):
    """The build loop before the writer thread: torchvision views, encoded and committed one batch at a time, each
    batch's block of cells read, updated and written back in its own transaction."""

    def _encode_all(self, backbone, path, spec, units, todo, batch_size, num_workers, device, precision, progress,
                    desc):
        from atlas_fast.cache.build import _batches
        from atlas_fast.cache.format import open_h5
        from atlas_fast.cache.locking import flock, lock_path

        for batch in _batches(units, batch_size):
            pixels = torch.cat([_torchvision_views(units[i][0].impath, units[i][0].key, units[i][2], spec)
                                for i in batch])
            rows = np.array([units[i][1] for i in batch for _ in units[i][2]])
            views = np.array([v for i in batch for v in units[i][2]])
            with torch.no_grad():
                features = backbone.encode_image(pixels).float().numpy()
            with flock(lock_path(path), exclusive=True), open_h5(path, "a") as f:
                for name, values in (("features", features.astype(f["features"].dtype)), ("done", True)):
                    lo, hi, vlo, vhi = rows.min(), rows.max() + 1, views.min(), views.max() + 1
                    block = f[name][lo:hi, vlo:vhi]
                    block[rows - lo, views - vlo] = values
                    f[name][lo:hi, vlo:vhi] = block
        return {}


def test_the_writer_thread_writes_what_the_serial_loop_wrote(tmp_path, backbone, train, monkeypatch):
    """Same bytes as the build loop before 8-bit views and the writer thread: the views from torchvision, every batch
    its own transaction; here committed in transactions of whole 4-row blocks (the second build decoded in a worker
    process)."""
    monkeypatch.setattr("atlas_fast.cache.build.FEATURE_CHUNK_ROWS", 4)
    new = FeatureCache(tmp_path / "new")
    new.transaction_bytes = 1  # commit each row block as soon as it is complete
    transactions = []
    commit = FeatureCache._commit
    monkeypatch.setattr(FeatureCache, "_commit",
                        lambda self, path, rows, *rest: transactions.append(rows) or commit(self, path, rows, *rest))
    old = SerialBuilder(tmp_path / "old")
    for cache, workers in ((old, 0), (new, 1)):
        build(cache, backbone, train[:10], num_views=3, batch_size=8)
        build(cache, backbone, train, num_views=5, batch_size=8, num_workers=workers)  # new rows and new views
    blocks = [sorted(set((rows // 4).tolist())) for rows in transactions]
    assert blocks[:2] == [[0], [1]] and len(transactions) >= 4  # whole blocks while the build goes on
    with h5py.File(old.path_for(backbone, DATASET), "r") as a, h5py.File(new.path_for(backbone, DATASET), "r") as b:
        for name in ("keys", "image_ids", "features", "done"):
            assert a[name].shape == b[name].shape and np.array_equal(a[name][...], b[name][...]), name
        assert a["done"][...].all()
