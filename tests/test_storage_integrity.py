"""Reliability round 3: stored artefacts carry checksums, images keep their values, untrusted split files are
validated in bounded memory, generators delete only what they wrote, the cache refuses sizes that cannot fit and
names the file at fault.

Each test injects one fault into files written by atlas_fast (bytes flipped inside a payload so that the file still
loads) or feeds one hostile input, and checks that it is detected and named. Everything runs without a model except
the cache tests (the tiny random CLIP on 8-pixel images).
"""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.cache import CacheError, FeatureCache
from atlas_fast.data import fewshot_subset, load_dataset
from atlas_fast.data.layouts import DatasetFormatError
from atlas_fast.engine.record import ResultStore, load_learned
from layouts import make_oxford_pets

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def pets(tmp_path) -> Path:
    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=3, n_val=1, n_test=2, size=8)
    return tmp_path / "data"


def flip_bytes_inside(path: Path, payload: bytes, count: int = 8) -> None:
    """Overwrite ``count`` bytes in the middle of ``payload`` where it is stored in ``path`` (the file's structure,
    zip headers and all, stays intact, so the file still loads)."""
    data = bytearray(path.read_bytes())
    start = data.find(payload)
    assert start >= 0, "payload not found in the file"
    middle = start + len(payload) // 2
    data[middle:middle + count] = bytes(b ^ 0x5A for b in data[middle:middle + count])
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- 1. checksums of stored artefacts


def _record(key: str = "k" * 32) -> dict:
    return {"key": key, "config": {"method": "coop", "method_config": {}, "backbone": {"model": "atlas-tiny"},
                                   "shots": 2, "seed": 1},
            "backbone": {"fingerprint": "b" * 32}, "metrics": {"base": 50.0, "zero_shot": {"base": 40.0}},
            "data": {"fingerprint": "f" * 32}}


def test_a_damaged_learned_tensor_file_is_refused_naming_it_and_its_run_redone(tmp_path, capsys):
    store = ResultStore(tmp_path / "results")
    ctx = torch.arange(4096, dtype=torch.float32)
    path = store.save("OxfordPets", "run", _record(), {"ctx": ctx.clone()})
    learned = path.with_suffix(".pt")
    assert re.fullmatch(r"[0-9a-f]{64}", json.loads(path.read_text())["learned_blake2b"])
    assert torch.equal(load_learned(path)["ctx"], ctx) and store.find("OxfordPets", "run", "k" * 32) is not None

    flip_bytes_inside(learned, ctx.numpy().tobytes())
    assert not torch.equal(torch.load(learned, weights_only=True)["ctx"], ctx)  # torch.load alone does not notice
    with pytest.raises(ValueError, match=f"Learned tensors {re.escape(str(learned))} .*checksum"):
        load_learned(path)
    capsys.readouterr()
    assert store.find("OxfordPets", "run", "k" * 32) is None  # the pair is damaged: the run is redone
    err = capsys.readouterr().err
    assert str(learned) in err and "checksum" in err and "redone" in err
    assert path.exists() and learned.exists()  # a lookup moves nothing
    store.save("OxfordPets", "run", _record(), {"ctx": ctx.clone()})  # the run redone: the damaged pair moves aside
    assert "moved it to" in capsys.readouterr().err and torch.equal(load_learned(path)["ctx"], ctx)
    assert len(list(path.parent.glob("run.json.invalid-*"))) == len(list(path.parent.glob("run.pt.invalid-*"))) == 1


def test_a_record_without_a_checksum_is_used_with_a_warning(tmp_path, capsys):
    store = ResultStore(tmp_path / "results")
    path = store.save("OxfordPets", "old", _record(), {"ctx": torch.ones(3)})
    record = json.loads(path.read_text())
    del record["learned_blake2b"], record["seal"]  # as written before checksums (and seals)
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert store.find("OxfordPets", "old", "k" * 32) is not None
    assert torch.equal(load_learned(path)["ctx"], torch.ones(3))
    err = capsys.readouterr().err
    assert "no checksum" in err and str(path.with_suffix(".pt")) in err and f"{path} has no seal" in err


def _softlabel_inputs():
    from types import SimpleNamespace

    from atlas_fast.data.base import DatasetSplits, Datum

    items = tuple(Datum(impath=f"/x/{i}.jpg", label=i % 3, classname=f"c{i % 3}", key=f"{i}.jpg") for i in range(6))
    splits = DatasetSplits(name="Toy", dataset_dir=Path("/x"), train=items, val=(), test=items,
                           classnames=("c0", "c1", "c2"), template="a photo of a {}.")
    return SimpleNamespace(fingerprint="b" * 32), splits, torch.zeros(6, 4)


def test_damaged_stored_soft_labels_are_recomputed_with_a_warning_naming_the_file(tmp_path, capsys):
    from atlas_fast.atlas.softlabels import SoftLabelConfig, compute_soft_labels

    backbone, splits, features = _softlabel_inputs()
    config = SoftLabelConfig(kind="ls", theta=0.3)
    rows = compute_soft_labels(config, backbone, splits, features, store_dir=tmp_path)
    (stored,) = tmp_path.glob("ls-*.pt")
    flip_bytes_inside(stored, rows.numpy().tobytes())
    assert not torch.equal(torch.load(stored, weights_only=True)["rows"], rows)  # loads, with other values
    capsys.readouterr()
    again = compute_soft_labels(config, backbone, splits, features, store_dir=tmp_path)
    assert torch.equal(again, rows)
    assert f"stored soft labels {stored}" in capsys.readouterr().err
    assert torch.equal(torch.load(stored, weights_only=True)["rows"], rows)  # replaced by the recomputed rows
    assert torch.equal(compute_soft_labels(config, backbone, splits, features, store_dir=tmp_path), rows)
    assert capsys.readouterr().err == ""


def test_a_damaged_stored_fewshot_subset_is_refused_naming_the_file(pets, tmp_path, capsys):
    splits = load_dataset("OxfordPets", pets)
    store = tmp_path / "store"
    drawn = fewshot_subset(splits, 2, seed=1, store_dir=store)
    (path,) = store.glob("shot_2-seed_1-*.json")
    assert fewshot_subset(splits, 2, seed=1, store_dir=store).train == drawn.train
    record = json.loads(path.read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", record["checksum"])
    # one drawn image swapped for another image of the train split: the file still parses and every key exists
    other = next(d.key for d in splits.train if d.key not in record["train"])
    text = path.read_text().replace(record["train"][0], other)
    path.write_text(text)
    with pytest.raises(ValueError, match=f"stored few-shot subset {re.escape(str(path))} .*checksum.*delete it"):
        fewshot_subset(splits, 2, seed=1, store_dir=store)
    # without a checksum (written by hand or before checksums) it is used after the check against the lists
    record = json.loads(path.read_text())
    del record["checksum"]
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert fewshot_subset(splits, 2, seed=1, store_dir=store).train[0].key == other
    assert f"stored few-shot subset {path} has no checksum" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- 2. images keep their values


def _decoded(path: Path) -> np.ndarray:
    from atlas_fast.clip.transforms import read_image

    image = read_image(path)
    assert image.mode == "RGB"
    return np.asarray(image)


def test_16_bit_and_wide_images_keep_their_values(tmp_path):
    grey16 = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1031)  # 0 .. 64953
    expected = (grey16 >> 8).astype(np.uint8)
    Image.fromarray(grey16).save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode == "I;16"
    assert np.array_equal(_decoded(tmp_path / "grey16.png"), np.repeat(expected[..., None], 3, axis=2))
    Image.fromarray(grey16).save(tmp_path / "grey16.tif")
    assert np.array_equal(_decoded(tmp_path / "grey16.tif")[..., 1], expected)
    big_endian = Image.frombytes("I;16B", (8, 8), grey16.astype(">u2").tobytes())
    big_endian.save(tmp_path / "grey16b.tif")
    assert np.array_equal(_decoded(tmp_path / "grey16b.tif")[..., 2], expected)

    wide = Image.fromarray(grey16.astype(np.int32))  # mode "I" holding 16-bit values
    assert wide.mode == "I"
    wide.save(tmp_path / "wide.tif")
    assert np.array_equal(_decoded(tmp_path / "wide.tif")[..., 0], expected)
    narrow = Image.fromarray((grey16 >> 8).astype(np.int32))  # mode "I" holding 8-bit values: kept as they are
    narrow.save(tmp_path / "narrow.tif")
    assert np.array_equal(_decoded(tmp_path / "narrow.tif")[..., 0], expected)

    unit = Image.fromarray(grey16.astype(np.float32) / 65535)  # mode "F" in [0, 1]
    unit.save(tmp_path / "unit.tif")
    assert np.abs(_decoded(tmp_path / "unit.tif")[..., 0].astype(int) - np.round(grey16 / 257)).max() == 0
    scale255 = Image.fromarray((grey16 >> 8).astype(np.float32))  # mode "F" in [0, 255], Pillow's own convention
    scale255.save(tmp_path / "scale255.tif")
    assert np.array_equal(_decoded(tmp_path / "scale255.tif")[..., 0], expected)


def test_every_8_bit_mode_becomes_the_expected_rgb(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    cases = {
        "rgba.png": (Image.fromarray(np.dstack([rgb, np.full((6, 6), 7, np.uint8)]), "RGBA"), rgb),
        "la.png": (Image.fromarray(np.dstack([rgb[..., 0], rgb[..., 1]]), "LA"),
                   np.repeat(rgb[..., :1], 3, axis=2)),
        "grey.png": (Image.fromarray(rgb[..., 0]), np.repeat(rgb[..., :1], 3, axis=2)),
        "palette.png": (Image.fromarray(rgb).quantize(colors=256, method=Image.Quantize.FASTOCTREE), None),
        "cmyk.tif": (Image.fromarray(np.dstack([255 - rgb, np.zeros((6, 6), np.uint8)]), "CMYK"), rgb),
        "bilevel.png": (Image.fromarray(rgb[..., 0] > 127), np.repeat((rgb[..., :1] > 127) * 255, 3, axis=2)),
    }
    for name, (image, expected) in cases.items():
        image.save(tmp_path / name)
        if expected is None:  # a palette image: each pixel is its palette entry's colour
            expected = np.asarray(image.convert("RGB"))
        assert np.array_equal(_decoded(tmp_path / name), expected), name
    la = Image.fromarray(np.dstack([rgb[..., 0], np.full((6, 6), 255, np.uint8)]), "LA").convert("La")
    from atlas_fast.clip.transforms import to_rgb

    assert np.array_equal(np.asarray(to_rgb(la))[..., 0], rgb[..., 0])  # Pillow cannot convert "La" to RGB itself


# ------------------------------------------------------------------- 3. split files validated in bounded memory


def test_a_huge_label_in_a_split_file_is_refused_without_allocating_by_its_value(pets):
    path = pets / "oxford_pets" / "split_zhou_OxfordPets.json"
    split = json.loads(path.read_text())
    split["train"][2][1] = 30_000_000
    split["train"][2][2] = "a_new_class"
    path.write_text(json.dumps(split))
    tracemalloc.start()
    try:
        with pytest.raises(DatasetFormatError, match=rf"{re.escape(str(path))}: entry train\[2\].*30000000"):
            load_dataset("OxfordPets", pets)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"validating a 1 KiB split file peaked at {peak / 2**20:.0f} MiB"


def test_labels_must_run_from_zero_over_the_named_classes(pets):
    path = pets / "oxford_pets" / "split_zhou_OxfordPets.json"
    split = json.loads(path.read_text())
    for entries in split.values():
        for entry in entries:
            if entry[1] == 3:
                entry[1] = 7  # four classes named 0, 1, 2, 7: label 7 has no place in a 4-class head
    path.write_text(json.dumps(split))
    with pytest.raises(DatasetFormatError, match=r"entry \w+\[\d+\] has label 7.*4 class"):
        load_dataset("OxfordPets", pets)


# ----------------------------------------------------------------------- 4. generators delete only their files


def test_regenerating_the_world_keeps_the_users_files(tmp_path):
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    (folder,) = generate_benchmark(tmp_path, ["WorldSymbols"], sizes=SplitSizes(2, 1, 1), progress=False)
    mine = [folder / "images" / "my_notes.txt", folder / "images" / "solid_star" / "my_photo.png",
            folder / "images" / "my_class" / "a.png", folder / "README.mine"]
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("the user's own file")
    generate_benchmark(tmp_path, ["WorldSymbols"], sizes=SplitSizes(1, 1, 1), progress=False)  # other counts
    assert all(p.read_text() == "the user's own file" for p in mine)
    assert sorted(p.name for p in (folder / "images" / "solid_star").iterdir()) == [
        "my_photo.png", "test_0000.png", "train_0000.png", "val_0000.png"]  # train_0001.png (ours) removed
    split = json.loads((folder / "split_zhou_WorldSymbols.json").read_text())
    assert all((folder / "images" / rel).is_file() for entries in split.values() for rel, _, _ in entries)
    (folder / "images" / "solid_star" / "my_photo.png").unlink()
    generate_benchmark(tmp_path, ["WorldSymbols"], sizes=SplitSizes(3, 1, 1), progress=False)
    assert all(p.is_file() for p in mine[:1] + mine[2:])


def test_a_world_folder_from_before_the_file_list_is_cleaned_by_its_stamp(tmp_path):
    from atlas_fast.world.benchmark import MANIFEST_FILE, SplitSizes, generate_benchmark

    (folder,) = generate_benchmark(tmp_path, ["WorldSymbols"], sizes=SplitSizes(2, 1, 1), progress=False)
    (folder / MANIFEST_FILE).unlink()  # as written by the generator before it kept a file list
    (folder / "images" / "solid_star" / "mine.png").write_text("the user's own file")
    generate_benchmark(tmp_path, ["WorldSymbols"], sizes=SplitSizes(1, 1, 1), progress=False)
    assert (folder / "images" / "solid_star" / "mine.png").is_file()
    assert not (folder / "images" / "solid_star" / "train_0001.png").exists()


def _generate_symbols(root: str, train: int) -> None:
    from atlas_fast.world.benchmark import SplitSizes, generate_benchmark

    generate_benchmark(root, ["WorldSymbols"], sizes=SplitSizes(train, 1, 1), progress=False)


def test_two_processes_generating_one_world_folder_wait_for_each_other(tmp_path):
    import multiprocessing as mp

    from atlas_fast.world.benchmark import STAMP_FILE

    context = mp.get_context("fork")
    workers = [context.Process(target=_generate_symbols, args=(str(tmp_path), 2)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    folder = tmp_path / "world_symbols"
    split = json.loads((folder / "split_zhou_WorldSymbols.json").read_text())
    assert (folder / STAMP_FILE).is_file() and len(split["train"]) == 20
    assert all((folder / "images" / rel).is_file() for entries in split.values() for rel, _, _ in entries)


# --------------------------------------------------------------------------- 5, 6. cache bounds and messages


@pytest.fixture(scope="module")
def backbone():
    return load_backbone(BackboneConfig("atlas-tiny", None))


def test_a_views_count_that_cannot_fit_is_a_one_line_error(pets, tmp_path, backbone, monkeypatch):
    items = list(load_dataset("OxfordPets", pets).train)[:2]
    cache = FeatureCache(tmp_path / "cache")
    with pytest.raises(ValueError, match=r"^views 1000000000000 .*valid range is 0\.\.\d+[^\n]*$"):
        cache.build(backbone, "OxfordPets", items, num_views=10**12, num_workers=0, progress=False)
    per_view = 2 * backbone.embed_dim * 2  # two images, float16
    with monkeypatch.context() as patch:  # below the sanity cap, the free disk space bounds the views
        patch.setattr("atlas_fast.cache.space.free_bytes", lambda folder: 100 * per_view)
        with pytest.raises(ValueError, match=r"^views 500 is out of range for 2 images: the valid range is 0\.\.99 "):
            cache.build(backbone, "OxfordPets", items, num_views=500, num_workers=0, progress=False)
    with monkeypatch.context() as patch:  # and the available memory what one load may return
        patch.setattr("atlas_fast.cache.space.available_memory", lambda: 100)
        with pytest.raises(ValueError, match=r"^views: loading 1 views of 2 images needs"):
            cache.load(backbone, "OxfordPets", items, views=[0])
    cache.build(backbone, "OxfordPets", items, num_views=1, num_workers=0, progress=False)
    with pytest.raises(ValueError, match=r"^views\W.*valid range is 0\.\.\d+[^\n]*$"):
        cache.load(backbone, "OxfordPets", items, views=range(10**12))
    with pytest.raises(ValueError, match=r"^view 1000000000000 .*valid range is 0\.\.\d+[^\n]*$"):
        cache.load(backbone, "OxfordPets", items, views=[0, 10**12])


def test_listing_a_missing_cache_root_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "typo"))):
        FeatureCache(tmp_path / "typo").entries(verify=True)
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "typo"))):
        FeatureCache(tmp_path / "typo").info(verify=True)
    (tmp_path / "empty").mkdir()
    assert "No feature cache files" in FeatureCache(tmp_path / "empty").info()


def _damage(path: Path, how: str) -> None:
    with h5py.File(path, "a") as f:
        if how in f.attrs:
            del f.attrs[how]
        elif how in f:
            del f[how]
        elif how == "huge_declared_shape":  # a few KiB that declare 10^7 rows: nothing may be sized by that
            for name in ("keys", "image_ids", "features", "done"):
                f[name].resize(10**7, axis=0)
        elif how == "narrow_features":
            del f["features"]
            f.create_dataset("features", shape=(f["keys"].shape[0], 1, 3), maxshape=(None, None, 3), dtype="float16",
                             chunks=(64, 1, 3), fletcher32=True)
        else:
            raise AssertionError(how)


@pytest.mark.parametrize("how", ["backbone_fingerprint", "encode_precision", "storage_dtype", "keys_digest", "keys",
                                 "image_ids", "features", "done", "narrow_features",
                                 "huge_declared_shape"])
def test_every_cache_error_names_the_file(pets, tmp_path, backbone, how):
    items = list(load_dataset("OxfordPets", pets).train)[:4]
    cache = FeatureCache(tmp_path / "cache")
    path = cache.build(backbone, "OxfordPets", items, num_workers=0, progress=False).path
    _damage(path, how)
    for attempt in (lambda: cache.load(backbone, "OxfordPets", items, views=[0]),
                    lambda: cache.build(backbone, "OxfordPets", items, num_views=1, num_workers=0, progress=False)):
        with pytest.raises(CacheError) as caught:
            attempt()
        assert str(path) in str(caught.value), f"{how}: {caught.value}"
        assert "\n" not in str(caught.value)
    (entry,) = cache.entries()
    assert entry.problem and str(path) in entry.problem
