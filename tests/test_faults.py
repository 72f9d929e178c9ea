"""Fault injection: bad inputs, damaged files, full disks and kills never give wrong numbers or lose finished work.

Each test names the fault it injects (issue 7 lists them); the README's "What atlas_fast guarantees" section sums
them up. Everything runs on the tiny random CLIP and a few 8-pixel images.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import pwd
import re
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

# Only names that existed before issue 7, so that this suite runs (and fails where it should) on the old code too.
from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.cache import CacheError, FeatureCache, MissingFeaturesError
from atlas_fast.cli import main
from atlas_fast.data import fewshot_subset, load_dataset
from atlas_fast.data.layouts import DatasetFormatError, DatasetLayoutError
from atlas_fast.engine import TrainConfig, run
from helpers import assert_same_calibration
from layouts import make_class_folders, make_imagenet, make_imagenet_sketch, make_oxford_pets, write_image

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = BackboneConfig("atlas-tiny", None)


@pytest.fixture(scope="module")
def backbone():
    return load_backbone(TINY)


def pets_items(data_root: Path, split: str = "train"):
    return list(getattr(load_dataset("OxfordPets", data_root), split))


def direct(backbone, items, view: int = 0) -> torch.Tensor:
    from atlas_fast.clip.transforms import load_views

    spec = backbone.transform
    return backbone.encode_image(torch.cat([load_views(d.impath, d.key, [view], spec) for d in items])).float()


def build(cache, backbone, items, **kwargs):
    return cache.build(backbone, "OxfordPets", items, num_workers=0, progress=False, **kwargs)


def config(root: Path, data: Path, **changes) -> TrainConfig:
    base = dict(dataset="OxfordPets", data_root=data, backbone=TINY, shots=2, seed=1, epochs=2, views=1,
                batch_size=4, lr=0.05, cache_root=root / "cache", results_dir=root / "results", progress=False)
    return TrainConfig(**{**base, **changes})


def cli_train(root: Path, data: Path, dataset: str = "OxfordPets", *extra: str) -> list[str]:
    return ["train", "--dataset", dataset, "--data-root", str(data), "--model", "atlas-tiny", "--pretrained", "none",
            "--shots", "2", "--epochs", "2", "--batch-size", "4", "--views", "1", "--cache-root", str(root / "cache"),
            "--results-dir", str(root / "results"), "--no-progress", *extra]


@pytest.fixture()
def pets(tmp_path) -> Path:
    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=3, n_val=1, n_test=2, size=8)
    return tmp_path / "data"


# --------------------------------------------------------------------------------------------- data identity


def test_two_folder_datasets_with_one_name_never_share_features_or_records(tmp_path):
    """projA/data and projB/data: same dataset name, same relative paths, different images."""
    for project, seed in (("projA", 0), ("projB", 7)):
        make_class_folders(tmp_path / project / "data", classes=("ant", "bee", "cat", "dog"), n_train=2, n_val=0,
                           n_test=2, seed=seed)
    shared = dict(dataset="folder:data", setting="few_shot")
    first = run(config(tmp_path, tmp_path / "projA", **shared))
    second = run(config(tmp_path, tmp_path / "projB", **shared))
    alone = run(config(tmp_path / "alone", tmp_path / "projB", **shared))
    assert not second["skipped"] and second["path"] != first["path"]
    assert second["metrics"] == alone["metrics"] and second["data"]["fingerprint"] == alone["data"]["fingerprint"]
    # moving the data root changes nothing: the finished record is found again
    shutil.move(tmp_path / "projB", tmp_path / "moved")
    assert run(config(tmp_path, tmp_path / "moved", **shared))["skipped"]


def test_an_image_replaced_in_place_is_encoded_again(pets, tmp_path, backbone):
    items = pets_items(pets)[:4]
    cache = FeatureCache(tmp_path / "cache")
    build(cache, backbone, items)
    write_image(Path(items[1].impath), seed=999, size=8)  # same path, new pixels (and size/mtime)
    with pytest.raises(MissingFeaturesError, match="changed on disk"):
        cache.load(backbone, "OxfordPets", items, views=[0])
    report = build(cache, backbone, items)
    assert (report.encoded, report.reused) == (1, 3)
    loaded = cache.load(backbone, "OxfordPets", items, views=[0])[:, 0]
    assert torch.allclose(loaded, direct(backbone, items), atol=2e-3 * loaded.abs().max())


def test_content_hash_catches_an_edit_that_keeps_size_and_mtime(pets, tmp_path, backbone):
    items = pets_items(pets)[:2]
    by_content = FeatureCache(tmp_path / "content", content_hash=True)
    by_stat = FeatureCache(tmp_path / "stat")
    build(by_content, backbone, items)
    build(by_stat, backbone, items)
    path = Path(items[0].impath)
    before = path.stat()
    edited = bytearray(path.read_bytes())
    edited[-3] ^= 0xFF  # a same-size edit, then the old mtime restored (what some sync tools do)
    path.write_bytes(bytes(edited))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(MissingFeaturesError, match="changed on disk"):
        by_content.load(backbone, "OxfordPets", items, views=[0])
    by_stat.load(backbone, "OxfordPets", items, views=[0])  # the documented limit of the default (size, mtime)


def test_a_finished_run_is_not_returned_for_missing_or_changed_data(pets, tmp_path, capsys):
    assert main(cli_train(tmp_path, pets)) == 0
    capsys.readouterr()
    assert main(cli_train(tmp_path, tmp_path / "nonexistent")) == 2
    captured = capsys.readouterr()
    assert "base " not in captured.out and "error: dataset folder of OxfordPets not found" in captured.err
    # an image of the run replaced in place: trained again, not skipped
    test_key = json.loads((pets / "oxford_pets" / "split_zhou_OxfordPets.json").read_text())["test"][0][0]
    write_image(pets / "oxford_pets" / "images" / test_key, seed=4242, size=8)
    assert main(cli_train(tmp_path, pets)) == 0
    assert "skipped" not in capsys.readouterr().out


def test_a_stored_fewshot_subset_follows_edits_of_its_split_file(pets, tmp_path):
    split_path = pets / "oxford_pets" / "split_zhou_OxfordPets.json"
    splits = load_dataset("OxfordPets", pets)
    store = tmp_path / "store"
    fewshot_subset(splits, 2, seed=1, store_dir=store)
    split = json.loads(split_path.read_text())
    for label in range(4):  # one more, undrawn-yet image per class: the draw from the new lists differs
        name = f"extra_{label}.jpg"
        write_image(pets / "oxford_pets" / "images" / name, seed=500 + label, size=8)
        cname = next(c for _, lab, c in split["train"] if lab == label)
        split["train"].insert(0, [name, label, cname])
    split_path.write_text(json.dumps(split))
    edited = load_dataset("OxfordPets", pets)
    assert fewshot_subset(edited, 2, seed=1, store_dir=store).train == fewshot_subset(edited, 2, seed=1).train
    split["train"].reverse()  # classes reordered (first appearance changes): drawn afresh again
    split_path.write_text(json.dumps(split))
    reordered = load_dataset("OxfordPets", pets)
    assert fewshot_subset(reordered, 2, seed=1, store_dir=store).train == fewshot_subset(reordered, 2, seed=1).train


# ------------------------------------------------------------------------------------- corruption, disks


def test_garbage_inside_the_feature_file_is_detected_and_named(pets, tmp_path, backbone, capsys):
    items = pets_items(pets)
    cache = FeatureCache(tmp_path / "cache")
    path = build(cache, backbone, items).path
    with h5py.File(path, "r") as f:
        offset = f["features"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as f:  # overwrite bytes in the middle of the stored features of rows 0..63
        f.seek(offset + 200)
        f.write(b"\x5a" * 16)
    with pytest.raises(CacheError, match=r"rows 0-11 .*fail their checksum"):
        cache.load(backbone, "OxfordPets", items, views=[0])
    assert main(["cache", "info", "--verify", "--cache-root", str(tmp_path / "cache")]) == 1
    assert re.search(r"PROBLEM .*features of view 0: rows 0-11 fail their checksum", capsys.readouterr().out)


def test_truncated_and_old_format_cache_files_are_clear_errors(pets, tmp_path, backbone):
    items = pets_items(pets)[:4]
    cache = FeatureCache(tmp_path / "cache")
    path = build(cache, backbone, items).path
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 1
    with pytest.raises(CacheError, match="format_version 1.*delete the file"):
        cache.load(backbone, "OxfordPets", items, views=[0])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CacheError, match=f"{re.escape(str(path))}.*delete it"):
        build(cache, backbone, items)


def _fill_until_the_file_limit(root: str, items, limit: int, queue) -> None:
    import resource

    torch.set_num_threads(1)
    encode_all = FeatureCache._encode_all

    def encode_all_on_a_filling_disk(self, *args, **kwargs):  # the disk fills up once encoding has begun
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes get EFBIG
        return encode_all(self, *args, **kwargs)

    FeatureCache._encode_all = encode_all_on_a_filling_disk
    try:
        cache = FeatureCache(root)
        cache.transaction_seconds = 0  # one transaction per batch
        cache.build(load_backbone(TINY), "OxfordPets", items, num_views=1, batch_size=8, num_workers=0,
                    progress=False)
        queue.put("finished")
    except CacheError as exc:
        queue.put(f"{type(exc).__name__}: {exc}")


def test_running_out_of_space_mid_build_keeps_finished_batches(tmp_path, backbone, monkeypatch):
    data = tmp_path / "data"
    make_oxford_pets(data, n_classes=40, n_train=5, n_val=0, n_test=1, size=8)
    items = pets_items(data)  # 200 images x 2 views, committed 4 images per transaction
    needs = []  # file size before each write transaction of an unrestricted build, plus what it may add
    commit = FeatureCache._commit

    def recording_commit(self, path, rows, views, features, *rest):
        from atlas_fast.cache.space import chunk_bytes

        needs.append(path.stat().st_size + chunk_bytes(rows, views, features.shape[-1], 2))
        return commit(self, path, rows, views, features, *rest)

    monkeypatch.setattr(FeatureCache, "_commit", recording_commit)
    reference = FeatureCache(tmp_path / "reference")
    reference.transaction_seconds = 0  # one transaction per batch, as in the child
    build(reference, backbone, items, num_views=1, batch_size=8)
    monkeypatch.undo()
    # the first transaction after the fifth that needs more room than any before it runs into the file-size limit
    fails_at = next(j for j in range(5, len(needs)) if needs[j] > max(needs[:j]))
    queue = mp.get_context("fork").Queue()
    child = mp.get_context("fork").Process(target=_fill_until_the_file_limit,
                                           args=(str(tmp_path / "cache"), items, needs[fails_at] - 1, queue))
    child.start()
    child.join(120)
    message = queue.get(timeout=5) if not queue.empty() else "nothing reported"
    assert child.exitcode == 0, f"the builder died (exit code {child.exitcode}): {message}"
    assert message.startswith("CacheSpaceError: Out of space") and "kept and readable" in message, message
    cache = FeatureCache(tmp_path / "cache")
    with pytest.raises(MissingFeaturesError) as missing:
        cache.load(backbone, "OxfordPets", items, views=[0, 1])
    finished = [d for d in items if (d.key, 0) not in set(missing.value.missing)]
    assert len(finished) == 4 * fails_at  # every committed transaction, and it reads back exactly
    expected = FeatureCache(tmp_path / "reference").load(backbone, "OxfordPets", finished, views=[0, 1])
    assert torch.equal(cache.load(backbone, "OxfordPets", finished, views=[0, 1]), expected)
    report = build(cache, backbone, items, num_views=1, batch_size=8)  # space is back: only the rest is encoded
    assert report.encoded == len(missing.value.missing) == 2 * (len(items) - len(finished))
    assert cache.verify_file(report.path) == []


def test_a_build_that_cannot_fit_is_refused_before_encoding(pets, tmp_path, backbone, monkeypatch):
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("atlas_fast.cache.space.shutil.disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    encoded = []
    monkeypatch.setattr(backbone, "encode_image", lambda pixels: encoded.append(1))
    with pytest.raises(CacheError, match=r"needs about .* but only 1000 B is free"):
        build(FeatureCache(tmp_path / "cache"), backbone, pets_items(pets))
    assert not encoded


def _as_reader_without_write_access(target, *args):
    """Run ``target`` in a child that cannot write: as user 'nobody' when we are root (root ignores modes)."""
    def child(queue):
        torch.set_num_threads(1)
        if os.geteuid() == 0:
            os.setgid(pwd.getpwnam("nobody").pw_gid)
            os.setuid(pwd.getpwnam("nobody").pw_uid)
        try:
            queue.put(("ok", target(*args)))
        except Exception as exc:  # reported to the parent
            queue.put(("error", f"{type(exc).__name__}: {exc}"))

    queue = mp.get_context("fork").Queue()
    process = mp.get_context("fork").Process(target=child, args=(queue,))
    process.start()
    process.join(120)
    return queue.get(timeout=5)


def _build_and_load(root: str, items):
    cache = FeatureCache(root)
    backbone = load_backbone(TINY)
    report = cache.build(backbone, "OxfordPets", items, num_views=1, num_workers=0, progress=False)
    return report.encoded, report.reused, cache.load(backbone, "OxfordPets", items, views=[0, 1]).shape[0]


def test_a_complete_cache_in_a_read_only_folder_is_usable(backbone):
    base = Path(tempfile.mkdtemp(prefix="atlas-readonly-"))  # world-readable, unlike pytest's tmp_path
    try:
        os.chmod(base, 0o755)
        make_oxford_pets(base / "data", n_classes=2, n_train=3, n_val=0, n_test=1, size=8)
        items = pets_items(base / "data")
        build(FeatureCache(base / "cache"), backbone, items, num_views=1)
        for path in (base / "cache").rglob("*"):
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        (base / "cache").chmod(0o555)
        assert _as_reader_without_write_access(_build_and_load, str(base / "cache"), items) == ("ok", (0, 12, 6))
        unseen = dataclasses.replace(items[0], key="images/unseen.jpg")  # a key the cache does not hold
        status, message = _as_reader_without_write_access(_build_and_load, str(base / "cache"), items + [unseen])
        assert status == "error" and "read-only" in message and "lacks 2 of the 14" in message
    finally:
        for path in [base, *base.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(base)


# ------------------------------------------------------------------------------------- late checks, records


def test_an_unwritable_results_folder_fails_before_training(pets, tmp_path, monkeypatch):
    (tmp_path / "blocked").write_text("a file where the results folder should be")
    monkeypatch.setattr("atlas_fast.engine.group.train_runs",
                        lambda *a, **k: pytest.fail("training started although the record cannot be written"))
    with pytest.raises(OSError, match="results folder .*blocked.* is not writable"):
        run(config(tmp_path, pets, results_dir=tmp_path / "blocked" / "results"))


def test_a_damaged_record_is_moved_aside_and_the_run_redone(pets, tmp_path, capsys):
    first = run(config(tmp_path, pets))
    path = Path(first["path"])
    path.write_text(path.read_text()[:200])  # truncated by a crash of another tool, a full disk, ...
    again = run(config(tmp_path, pets))
    assert not again["skipped"] and again["metrics"] == first["metrics"]
    assert "moved it to" in capsys.readouterr().err and len(list(path.parent.glob("*.invalid-*"))) == 1
    record = json.loads(path.read_text())
    record["metrics"]["base"] = float("nan")  # NaN is not JSON; a record never holds it
    path.write_text(json.dumps(record))
    assert not run(config(tmp_path, pets))["skipped"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask  # the user's umask, not mkstemp's 0600


def test_truncated_side_files_are_named_or_recomputed(pets, tmp_path, capsys):
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset

    atlas = dict(schedule=Alternating(2), soft_labels=soft_label_preset("base2new", "csl"))
    first = run(config(tmp_path, pets, **atlas))
    (stored,) = (tmp_path / "cache" / "softlabels").glob("*.pt")
    stored.write_bytes(stored.read_bytes()[:100])  # soft labels are a cache: recomputed, the same numbers
    again = run(config(tmp_path, pets, results_dir=tmp_path / "again", **atlas))
    assert again["metrics"] == first["metrics"] and "recomputing them" in capsys.readouterr().err
    (subset,) = (tmp_path / "cache" / "OxfordPets" / "split_fewshot").glob("shot_2-seed_1-*.json")
    subset.write_text(subset.read_text()[:40])  # a few-shot subset may have been chosen by hand: named, not redrawn
    assert main(cli_train(tmp_path, pets)) == 2
    assert f"error: stored few-shot subset {subset}" in capsys.readouterr().err
    learned = Path(first["path"]).with_suffix(".pt")
    learned.write_bytes(learned.read_bytes()[:100])
    assert main(["eval", "--record", first["path"], "--dataset", "OxfordPets", "--data-root", str(pets),
                 "--cache-root", str(tmp_path / "cache"), "--no-progress"]) == 2
    assert f"Learned tensors {learned}" in capsys.readouterr().err


def test_no_test_images_for_the_new_classes_is_an_error_before_training(pets, tmp_path, capsys):
    split_path = pets / "oxford_pets" / "split_zhou_OxfordPets.json"
    split = json.loads(split_path.read_text())
    split["test"] = [entry for entry in split["test"] if entry[1] < 2]  # classes 2, 3 (new) lose their test images
    split_path.write_text(json.dumps(split))
    assert main(cli_train(tmp_path, pets)) == 2
    assert "no test images for the 'new' classes" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_fewer_images_than_shots_are_recorded(pets, tmp_path, capsys):
    record = run(config(tmp_path, pets, shots=4, setting="few_shot"))  # 3 train images per class
    assert record["data"]["shots_used"] == {"min": 3, "max": 3}
    assert "every class has fewer than 4 training images; the run uses 3 per class" in capsys.readouterr().err


def test_a_negative_seed_is_refused(pets, tmp_path, capsys):
    assert main(cli_train(tmp_path, pets, "OxfordPets", "--seed", "-1")) == 2
    assert "seed must be >= 0, got -1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        fewshot_subset(load_dataset("OxfordPets", pets), 2, seed=-1)


# ------------------------------------------------------------------------------------- untrusted split files


def _edit_split(pets: Path, edit) -> None:
    path = pets / "oxford_pets" / "split_zhou_OxfordPets.json"
    split = json.loads(path.read_text())
    edit(split)
    path.write_text(json.dumps(split))


def test_split_paths_cannot_leave_the_dataset_folder(pets, tmp_path):
    write_image(pets / "secret.jpg", seed=1, size=8)  # beside oxford_pets/, outside the dataset folder
    _edit_split(pets, lambda split: split["train"][0].__setitem__(0, "../../secret.jpg"))
    with pytest.raises(DatasetFormatError, match=r"train\[0\].*leaves the dataset folder"):
        load_dataset("OxfordPets", pets)


def test_dataset_names_cannot_write_outside_the_roots(tmp_path, capsys):
    make_class_folders(tmp_path / "a" / "data", n_val=0)
    outside = tmp_path / "a" / "data" / "sub"
    outside.mkdir()
    for dataset in ("folder:..", "folder:data/.."):
        assert main(cli_train(outside, outside, dataset)) == 2
        assert "ends in its own name" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "a" / "data").iterdir()) == ["sub", "test", "train"]
    assert list(outside.iterdir()) == []


def test_a_label_with_two_class_names_is_an_error(pets):
    def rename(split):
        label = split["train"][0][1]
        entry = next(e for e in split["test"] if e[1] == label)
        entry[2] = "renamed_class"

    _edit_split(pets, rename)
    with pytest.raises(DatasetFormatError, match=r"test\[\d+\] gives label \d+ the class name 'renamed_class'"):
        load_dataset("OxfordPets", pets)


def test_an_empty_class_folder_is_an_error_not_a_nameless_class(tmp_path):
    make_imagenet(tmp_path, n_classes=4)
    (tmp_path / "imagenet" / "images" / "train" / "n01440765").mkdir()  # sorts between classes 0 and 1
    (tmp_path / "imagenet" / "images" / "val" / "n01440765").mkdir()
    with (tmp_path / "imagenet" / "classnames.txt").open("a") as f:
        f.write("n01440765 empty class\n")
    with pytest.raises(DatasetLayoutError, match="n01440765 holds no images"):
        load_dataset("ImageNet", tmp_path)
    make_imagenet_sketch(tmp_path, n_classes=3)
    (tmp_path / "imagenet-sketch" / "images" / "n01440764").rename(tmp_path / "gone")
    (tmp_path / "imagenet-sketch" / "images" / "n01440764").mkdir()
    with pytest.raises(DatasetLayoutError, match="holds no images"):
        load_dataset("ImageNetSketch", tmp_path)


# ------------------------------------------------------------------------------------- errors a user can act on


def test_cli_errors_are_one_line_with_exit_status_2(tmp_path, capsys):
    assert main(cli_train(tmp_path, tmp_path / "nowhere")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dataset folder of OxfordPets not found") and "Traceback" not in err
    assert main(["--debug", *cli_train(tmp_path, tmp_path / "nowhere")]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert main([*cli_train(tmp_path, tmp_path / "nowhere"), "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["random", "truncated", "other_architecture"])
def test_checkpoint_errors_name_the_file_and_the_architecture(pets, tmp_path, capsys, content):
    from atlas_fast.clip.checkpoints import CHECKPOINT_DIR

    shipped = CHECKPOINT_DIR / "atlas-world.safetensors"
    path = tmp_path / {"random": "weights.pt", "truncated": "weights.safetensors",
                       "other_architecture": "world.safetensors"}[content]
    path.write_bytes({"random": lambda: np.random.default_rng(0).bytes(4096),
                      "truncated": lambda: shipped.read_bytes()[:50_000],
                      "other_architecture": shipped.read_bytes}[content]())
    with pytest.raises(ValueError) as error:  # atlas_fast.clip.checkpoints.CheckpointError
        load_backbone(BackboneConfig("atlas-tiny", str(path)))
    message = str(error.value)
    assert str(path) in message and "'atlas-tiny' (embed 64; vision width 64, 2 layers" in message
    assert "weights_only" not in message
    assert main(["cache", "build", "--dataset", "OxfordPets", "--data-root", str(pets), "--model", "atlas-tiny",
                 "--pretrained", str(path), "--cache-root", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: Cannot load checkpoint {path}") and "Traceback" not in err


# ------------------------------------------------------------------------------------- kills (work today too)


def _kill_9_once_hanging(target, *args) -> None:
    """Run ``target(*args, flag)`` in a forked child and SIGKILL it as soon as it has touched ``flag``."""
    flag = Path(tempfile.mkdtemp(prefix="atlas-kill-")) / "hanging"
    child = mp.get_context("fork").Process(target=target, args=(*args, str(flag)))
    child.start()
    deadline = time.time() + 120
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    shutil.rmtree(flag.parent)


def _build_and_hang(root: str, items, flag: str) -> None:
    torch.set_num_threads(1)
    backbone = load_backbone(TINY)
    encode = backbone.encode_image
    calls = {"n": 0}

    def encode_then_hang(pixels):
        calls["n"] += 1
        if calls["n"] == 3:  # two batches committed (by the writer thread: waited for); killed encoding the third
            deadline = time.time() + 60
            while _done_count(cache, backbone, items) < 8 and time.time() < deadline:
                time.sleep(0.01)
            Path(flag).touch()
            time.sleep(600)
        return encode(pixels)

    backbone.encode_image = encode_then_hang
    cache = FeatureCache(root)
    cache.transaction_seconds = 0  # every batch committed as it comes
    cache.build(backbone, "OxfordPets", items, batch_size=4, num_workers=0, progress=False)


def _done_count(cache: FeatureCache, backbone, items) -> int:
    from atlas_fast.cache.locking import flock, lock_path

    path = cache.path_for(backbone, "OxfordPets")
    if not path.exists():
        return 0
    with flock(lock_path(path), exclusive=False), h5py.File(path, "r") as f:
        return int(f["done"][...].sum())


def test_kill_9_during_a_build_resumes_exactly(pets, tmp_path, backbone):
    items = pets_items(pets)  # 12 images, 3 batches of 4
    _kill_9_once_hanging(_build_and_hang, str(tmp_path / "cache"), items)
    cache = FeatureCache(tmp_path / "cache")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the killed child's batches and threads: the same bits
    try:
        assert build(cache, backbone, items, batch_size=4).encoded == 4
        uninterrupted = FeatureCache(tmp_path / "uninterrupted")
        build(uninterrupted, backbone, items, batch_size=4)
    finally:
        torch.set_num_threads(threads)
    loaded = cache.load(backbone, "OxfordPets", items, views=[0])[:, 0]
    assert torch.equal(loaded, uninterrupted.load(backbone, "OxfordPets", items, views=[0])[:, 0])
    assert torch.allclose(loaded, direct(backbone, items), atol=2e-3 * loaded.abs().max())


def _sweep_and_hang(root: str, data: str, flag: str) -> None:
    import atlas_fast.engine.group as run_module
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.sweep import Execution, run_grid
    from atlas_fast.atlas.schedules import OneHot

    torch.set_num_threads(1)
    loop = run_module.train_runs
    calls = {"n": 0}

    def train_then_hang(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the first run is recorded; killed while training the second
            Path(flag).touch()
            time.sleep(600)
        return loop(*args, **kwargs)

    run_module.train_runs = train_then_hang
    # one run per group (batch_runs=1): the sweep is killed inside its second group
    run_grid(config(Path(root), Path(data)), ["OxfordPets"], [LabelVariant("baseline", OneHot())], [1, 2, 3],
             progress=False, execution=Execution("local", batch_runs=1))


def test_kill_9_during_a_sweep_resumes_with_the_unfinished_runs(pets, tmp_path):
    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.sweep import run_grid

    _kill_9_once_hanging(_sweep_and_hang, str(tmp_path), str(pets))
    records = run_grid(config(tmp_path, pets), ["OxfordPets"], [LabelVariant("baseline", OneHot())], [1, 2, 3],
                       progress=False)
    assert [r["skipped"] for r in records] == [True, False, False]
    fresh = run(config(tmp_path / "fresh", pets, seed=2))["metrics"]
    assert {k: v for k, v in records[1]["metrics"].items() if k != "calibration"} == (
        {k: v for k, v in fresh.items() if k != "calibration"})
    assert_same_calibration(records[1]["metrics"]["calibration"], fresh["calibration"])
