"""`atlas-fast data standins`: the 15 benchmarks in their real layouts with their real class names and published split
sizes, small generated images. The full sizes are checked on the plan (no 1.3 M files are written); the written
ones at a small test fraction, through the readers the runs use and through `atlas-fast data check`."""

import json
import threading

import pytest
from PIL import Image

from atlas_fast.cli import main
from atlas_fast.data import load_dataset
from atlas_fast.data.check import PUBLISHED_SIZES
from atlas_fast.data.datasets import BUILTIN_DATASETS, dataset_spec
from atlas_fast.world.standin_plan import StandinRequest, plan_standin, real_classes
from atlas_fast.world.standins import MANIFEST, read_manifest, write_standin

FRACTION = 0.002
TRAIN_PER_CLASS = 1


def expected_size(published: int, classes: int) -> int:
    """The rule the generator states: every class keeps an image, else the rounded fraction."""
    return max(classes, int(FRACTION * published + 0.5))


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """All 15 at a small fraction, written once by the command (its output kept for the tests)."""
    root = tmp_path_factory.mktemp("standins")
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["data", "standins", str(root), "--test-fraction", str(FRACTION), "--train-per-class",
                       str(TRAIN_PER_CLASS)])
    assert status == 0
    return root, out.getvalue()


def test_the_planned_full_counts_are_the_published_table():
    assert set(PUBLISHED_SIZES) == set(BUILTIN_DATASETS)
    for name in BUILTIN_DATASETS:
        published = PUBLISHED_SIZES[name]
        counts = plan_standin(name, full_train=True).counts()
        assert counts == {split: getattr(published, split) for split in ("classes", "train", "val", "test")
                          if getattr(published, split) is not None}, name
        names = [classname for _, classname in real_classes(name)]
        assert len(names) == published.classes, name
        # CLIP's ImageNet list (CoOp's classnames.txt) names two pairs alike; every other list is distinct
        repeated = sorted({n for n in names if names.count(n) > 1}) if "ImageNet" in name else []
        assert len(set(names)) == len(names) - len(repeated), name
        assert repeated in ([], ["missile", "sunglasses"]), name


def test_the_published_sizes_follow_from_coops_split_rules():
    """Where CoOp's dataset code splits a known per-class count, the table must be what it gives: DTD (120 images a
    class: 50 % train, 20 % val, the rest test), Food-101 (1,000 a class, the same rule), SUN397 (partition 1: 50
    training and 50 test images a class, 20 % of the training ones to val); Caltech101's three splits add up to its
    8,242 images outside BACKGROUND_Google and Faces_easy; FGVC-Aircraft's are its three list files."""
    def coop_split(per_class, classes, p_train=0.5, p_val=0.2):
        train, val = round(per_class * p_train), round(per_class * p_val)
        return classes * train, classes * val, classes * (per_class - train - val)

    def sizes(name):
        s = PUBLISHED_SIZES[name]
        return s.train, s.val, s.test

    assert sizes("DescribableTextures") == coop_split(120, 47)
    assert sizes("Food101") == coop_split(1000, 101)
    assert sizes("SUN397") == (397 * 40, 397 * 10, 397 * 50)
    assert sum(sizes("Caltech101")) == 8_242 and PUBLISHED_SIZES["Caltech101"].classes == 100
    assert sizes("FGVCAircraft") == (3_334, 3_333, 3_333)
    assert PUBLISHED_SIZES["ImageNet"].val is None and PUBLISHED_SIZES["ImageNet"].test == 50_000


def test_the_written_counts_follow_the_stated_fraction_and_the_manifest_says_so(standins):
    root, out = standins
    assert f"test and val splits {FRACTION:g} of each (at least 1 per class)" in out
    assert f"{TRAIN_PER_CLASS} training image(s) per class" in out and "not the real ones" in out
    for name in BUILTIN_DATASETS:
        published = PUBLISHED_SIZES[name]
        manifest = json.loads((root / dataset_spec(name).folder / MANIFEST).read_text())
        expected = {"classes": published.classes, "test": expected_size(published.test, published.classes)}
        if published.val is not None:
            expected["val"] = expected_size(published.val, published.classes)
        if published.train is not None:
            expected["train"] = TRAIN_PER_CLASS * published.classes
        assert manifest["counts"] == expected, name
        assert manifest["standin"] is True and manifest["complete"] is True
        assert manifest["request"] == {"test_fraction": FRACTION, "train_per_class": TRAIN_PER_CLASS, "seed": 0,
                                       "image_size": 32}
        assert manifest["published"]["test"] == published.test
        assert f"{name}: written: {published.classes:,} classes" in out


def test_each_standin_loads_through_the_readers_with_its_real_classes(standins):
    root, _ = standins
    for name in BUILTIN_DATASETS:
        splits = load_dataset(name, root)
        manifest = read_manifest(root / dataset_spec(name).folder)
        assert splits.num_classes == PUBLISHED_SIZES[name].classes, name
        assert list(splits.classnames) == [classname for _, classname in real_classes(name)], name
        assert len(splits.test) == manifest["counts"]["test"], name
        if not splits.val_is_test and "val" in manifest["counts"]:
            assert len(splits.val) == manifest["counts"]["val"], name
        if "train" in manifest["counts"]:
            assert len(splits.train) == manifest["counts"]["train"], name
        with Image.open(splits.test[-1].impath) as image:
            assert image.format == "JPEG" and image.size == (32, 32)
    names = {name: load_dataset(name, root).classnames for name in ("ImageNet", "Caltech101", "OxfordPets",
                                                                    "StanfordCars", "SUN397", "EuroSAT", "UCF101",
                                                                    "ImageNetA", "FGVCAircraft")}
    assert names["ImageNet"][:3] == ("tench", "goldfish", "great white shark")
    assert names["Caltech101"][:5] == ("face", "leopard", "motorbike", "accordion", "airplane")
    assert names["OxfordPets"][:3] == ("abyssinian", "american_bulldog", "american_pit_bull_terrier")
    assert names["StanfordCars"][0] == "2000 AM General Hummer SUV"
    assert "outdoor apartment_building" in names["SUN397"] and names["SUN397"][0] == "abbey"
    assert names["EuroSAT"][0] == "Annual Crop Land" and names["UCF101"][0] == "Apply_Eye_Makeup"
    assert "Handstand_Pushups" in names["UCF101"] and names["FGVCAircraft"][0] == "707-320"
    assert len(names["ImageNetA"]) == 200 and names["ImageNetA"][0] == dict(real_classes("ImageNet"))["n01498041"]


def test_data_check_finds_all_fifteen_present_and_sound(standins, capsys):
    root, _ = standins
    status = main(["data", "check", "--data-root", str(root), "--datasets", "all", "--sample", "2"])
    out = capsys.readouterr().out
    assert status == 0 and "15 of 15 dataset(s) ok" in out and "error" not in out
    # fewer images than CoOp's split by design: the warning says it is a stand-in, not a partial download
    assert "a stand-in (atlas-fast data standins)" in out and "extract the full archives" not in out


@pytest.mark.parametrize("fraction", ["0", "-0.5", "1.5", "nan"])
def test_a_test_fraction_outside_the_valid_range_is_refused(tmp_path, capsys, fraction):
    status = main(["data", "standins", str(tmp_path / "root"), "--test-fraction", fraction])
    err = capsys.readouterr().err
    assert status == 2 and "error:" in err and "0 < F <= 1" in err
    assert not (tmp_path / "root").exists()
    with pytest.raises(ValueError, match="0 < F <= 1"):
        StandinRequest(test_fraction=float(fraction))


def test_a_rerun_skips_and_other_sizes_rewrite(tmp_path):
    small = StandinRequest(test_fraction=0.01, train_per_class=2)
    first = write_standin("EuroSAT", tmp_path, small, progress=False)
    assert first.action == "written" and first.images_written == 20 + 54 + 81
    again = write_standin("EuroSAT", tmp_path, small, progress=False)
    assert again.action == "skipped" and again.images_written == 0

    larger = StandinRequest(test_fraction=0.02, train_per_class=2)
    rewritten = write_standin("EuroSAT", tmp_path, larger, progress=False)
    assert rewritten.action == "rewritten" and rewritten.images_written == 20 + 108 + 162
    splits = load_dataset("EuroSAT", tmp_path)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (20, 108, 162)
    assert read_manifest(tmp_path / "eurosat")["request"]["test_fraction"] == 0.02
    assert sum(1 for p in (tmp_path / "eurosat" / "2750").rglob("*.jpg")) == 20 + 108 + 162  # nothing stale left


def test_an_interrupted_standin_is_completed_not_reused(tmp_path):
    request = StandinRequest(test_fraction=0.01, train_per_class=2)
    write_standin("DescribableTextures", tmp_path, request, progress=False)
    dataset_dir = tmp_path / "dtd"
    manifest = read_manifest(dataset_dir)
    (dataset_dir / MANIFEST).write_text(json.dumps(manifest | {"complete": False}))  # as a killed run leaves it
    removed = sorted((dataset_dir / "images").rglob("*.jpg"))[:5]
    for path in removed:
        path.unlink()
    result = write_standin("DescribableTextures", tmp_path, request, progress=False)
    assert result.action == "completed" and result.images_written == 5
    assert all(path.is_file() for path in removed) and read_manifest(dataset_dir)["complete"] is True
    assert len(load_dataset("DescribableTextures", tmp_path).test) == 47


def test_a_folder_that_is_not_a_standin_is_never_touched(tmp_path):
    real = tmp_path / "eurosat" / "2750" / "River"
    real.mkdir(parents=True)
    (real / "River_1.jpg").write_bytes(b"a real image")
    with pytest.raises(FileExistsError, match="not a stand-in"):
        write_standin("EuroSAT", tmp_path, StandinRequest(test_fraction=0.01), progress=False)
    assert (real / "River_1.jpg").read_bytes() == b"a real image"
    assert not (tmp_path / "eurosat" / MANIFEST).exists()


def test_two_generators_at_once_write_one_dataset_once(tmp_path):
    request = StandinRequest(test_fraction=0.01, train_per_class=2)
    results = []

    def generate():
        results.append(write_standin("OxfordPets", tmp_path, request, progress=False))

    threads = [threading.Thread(target=generate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.action for r in results) == ["skipped", "written"]
    assert len(load_dataset("OxfordPets", tmp_path).test) == 37


def test_images_are_deterministic_per_seed(tmp_path):
    for root, seed in (("a", 0), ("b", 0), ("c", 1)):
        write_standin("EuroSAT", tmp_path / root, StandinRequest(0.01, 1, seed), progress=False)
    images = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jpg"))
    assert images == sorted(p.relative_to(tmp_path / "c") for p in (tmp_path / "c").rglob("*.jpg"))
    for image in images[:3]:
        assert (tmp_path / "a" / image).read_bytes() == (tmp_path / "b" / image).read_bytes()
        assert (tmp_path / "a" / image).read_bytes() != (tmp_path / "c" / image).read_bytes()
