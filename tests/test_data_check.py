"""`atlas-fast data check` on synthetic layouts with each fault users meet in real data (issue 27): ImageNet's val
images not in class folders, a missing split_zhou JSON, a missing classnames.txt, an image that does not decode,
counts that differ from the published split; and the cheap part of it before `train`, `cache build`, `experiment`."""

import shutil
import subprocess
import sys

import pytest

from atlas_fast.cli import main
from atlas_fast.data import check
from atlas_fast.data.check import PUBLISHED_SIZES, SplitSizes, check_dataset
from layouts import (corrupt_image, make_flat_imagenet_val, make_imagenet, make_imagenet_a, make_oxford_pets)


@pytest.fixture
def pets(tmp_path):
    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=3, n_val=2, n_test=2, size=16)
    return tmp_path / "data"


def data_check(capsys, *argv):
    status = main(["data", "check", *argv])
    return status, capsys.readouterr().out


def test_a_sound_dataset_is_ok_and_its_counts_are_compared_with_the_published_split(pets, monkeypatch, capsys):
    status, out = data_check(capsys, "--data-root", str(pets), "--datasets", "OxfordPets")
    assert status == 0 and "OxfordPets: ok" in out and "1 of 1 dataset(s) ok" in out
    # synthetic counts are not CoOp's: one warning per count, the dataset still usable
    assert "warning" in out and "2,944" in out and "3,669" in out
    monkeypatch.setitem(PUBLISHED_SIZES, "OxfordPets", SplitSizes(4, 12, 8, 8))
    result = check_dataset("OxfordPets", pets)
    assert [f.level for f in result.findings] == ["ok"] and result.counts == {
        "classes": 4, "train": 12, "val": 8, "test": 8}
    assert "classes 4/4, train 12/12, val 8/8, test 8/8 (found/published); 28 image(s) decoded" in (
        result.findings[0].what)


def test_counts_short_of_the_published_split_say_so(pets, monkeypatch):
    monkeypatch.setitem(PUBLISHED_SIZES, "OxfordPets", SplitSizes(4, 12, 8, 10))
    result = check_dataset("OxfordPets", pets)
    (warning,) = [f for f in result.findings if f.level == "warning"]
    assert not result.broken and "(found/published): test 8/10." in warning.what
    assert "partial download or extraction" in warning.fix


def test_a_missing_split_file_names_the_file_and_where_it_comes_from(pets, capsys):
    (pets / "oxford_pets" / "split_zhou_OxfordPets.json").unlink()
    status, out = data_check(capsys, "--data-root", str(pets), "--datasets", "OxfordPets")
    assert status == 1 and "OxfordPets: BROKEN" in out
    (line,) = [l for l in out.splitlines() if l.strip().startswith("error")]
    assert "split_zhou_OxfordPets.json not found" in line and "download split_zhou_OxfordPets.json" in line
    assert "CoOp's DATASETS.md" in line and str(pets / "oxford_pets") in line


def test_imagenet_val_not_in_class_folders_is_found_and_sorted_from_the_devkit(tmp_path, capsys):
    data = tmp_path / "data"
    dataset_dir, devkit = make_flat_imagenet_val(data, n_classes=4, n_val=2)
    status, out = data_check(capsys, "--data-root", str(data), "--datasets", "ImageNet")
    assert status == 1
    (line,) = [l for l in out.splitlines() if l.strip().startswith("error")]
    assert "8 image(s) lie directly in images/val/, not in class folders" in line
    assert f"atlas-fast data sort-imagenet-val --data-root {data} --devkit ILSVRC2012_devkit_t12.tar.gz" in line
    # the fix the line names
    assert main(["data", "sort-imagenet-val", "--data-root", str(data), "--devkit", str(devkit)]) == 0
    assert "moved 8 image(s)" in capsys.readouterr().out
    reference = make_imagenet(tmp_path / "reference", n_classes=4, n_train=2, n_val=2)
    assert sorted(p.name for p in (dataset_dir / "images" / "val").iterdir()) == sorted(
        p.name for p in (reference / "images" / "val").iterdir())  # the same class folders
    for wnid_dir in (dataset_dir / "images" / "val").iterdir():
        sorted_pixels = sorted(p.read_bytes() for p in wnid_dir.iterdir())
        assert sorted_pixels == sorted(p.read_bytes() for p in (reference / "images" / "val" / wnid_dir.name).iterdir())
    status, out = data_check(capsys, "--data-root", str(data), "--datasets", "ImageNet")
    assert status == 0 and "test 8/50,000" in out


def test_sorting_refuses_files_the_devkit_does_not_know_and_moves_nothing(tmp_path):
    data = tmp_path / "data"
    dataset_dir, devkit = make_flat_imagenet_val(data, n_classes=2, n_val=1)
    (dataset_dir / "images" / "val" / "holiday.jpg").write_bytes(b"x")
    with pytest.raises(ValueError, match="holiday.jpg"):
        from atlas_fast.data.imagenet_val import sort_validation_images

        sort_validation_images(dataset_dir / "images" / "val", devkit)
    assert not [p for p in (dataset_dir / "images" / "val").iterdir() if p.is_dir()]


def test_missing_classnames_are_named_with_where_they_come_from(tmp_path, capsys):
    data = tmp_path / "data"
    make_imagenet(data, n_classes=3)
    make_imagenet_a(data, present=(1, 2), n_total=3)
    (data / "imagenet" / "classnames.txt").unlink()
    (data / "imagenet-adversarial" / "classnames.txt").unlink()
    status, out = data_check(capsys, "--data-root", str(data), "--datasets", "ImageNet", "ImageNetA")
    errors = [l for l in out.splitlines() if l.strip().startswith("error")]
    assert status == 1 and len(errors) == 2 and "broken: ImageNet, ImageNetA" in out
    assert "classnames.txt not found" in errors[0] and "linked from CoOp's DATASETS.md" in errors[0]
    assert f"cp <data root>/imagenet/classnames.txt {data / 'imagenet-adversarial'}/" in errors[1]


def test_an_image_that_does_not_decode_is_named(pets, capsys):
    bad = sorted((pets / "oxford_pets" / "images").iterdir())[5]
    corrupt_image(bad)
    status, out = data_check(capsys, "--data-root", str(pets), "--datasets", "OxfordPets", "--full")
    (line,) = [l for l in out.splitlines() if l.strip().startswith("error")]
    assert status == 1 and str(bad) in line and "does not decode" in line and "28 image" not in out
    # a sample of none decodes nothing and so sees nothing; the default sample covers this small dataset
    assert data_check(capsys, "--data-root", str(pets), "--datasets", "OxfordPets", "--sample", "0")[0] == 0
    assert data_check(capsys, "--data-root", str(pets), "--datasets", "OxfordPets")[0] == 1


def test_a_malformed_split_file_is_an_error_line_from_the_reader(pets, capsys):
    (pets / "oxford_pets" / "split_zhou_OxfordPets.json").write_text('{"train": [')
    status, out = data_check(capsys, "--data-root", str(pets), "--datasets", "OxfordPets")
    (line,) = [l for l in out.splitlines() if l.strip().startswith("error")]
    assert status == 1 and "invalid JSON" in line and "Fix: correct it; the expected layout is" in line


def test_default_checks_the_benchmarks_present_and_all_lists_every_one(pets, capsys):
    status, out = data_check(capsys, "--data-root", str(pets))
    assert status == 0 and out.splitlines()[0].startswith("OxfordPets: ok")
    assert "not present (not checked): ImageNet, Caltech101" in out
    status, out = data_check(capsys, "--data-root", str(pets), "--datasets", "all", "--sample", "0")
    assert status == 1 and "1 of 15 dataset(s) ok" in out
    assert "dataset folder of ImageNetR not found" in out and "imagenet-r.tar" in out


def test_train_cache_build_and_experiment_check_every_layout_before_any_work(tmp_path, capsys):
    data = tmp_path / "data"
    make_flat_imagenet_val(data, n_classes=2, n_val=1)
    make_oxford_pets(data, n_classes=2, n_train=2, n_val=1, n_test=1, size=8)
    (data / "oxford_pets" / "split_zhou_OxfordPets.json").unlink()
    common = ["--data-root", str(data), "--model", "atlas-tiny", "--pretrained", "none",
              "--cache-root", str(tmp_path / "cache")]
    assert main(["train", "--dataset", "ImageNet", *common, "--results-dir", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 2 image(s) lie directly in images/val/") and "sort-imagenet-val" in err
    assert main(["cache", "build", "--dataset", "OxfordPets", *common]) == 2
    split_file = data / "oxford_pets" / "split_zhou_OxfordPets.json"
    assert capsys.readouterr().err.startswith(
        f"error: split file split_zhou_OxfordPets.json not found: {split_file}. Fix: download split_zhou_OxfordPets.json")
    assert main(["experiment", "table3_base_to_new", "--datasets", "OxfordPets", "ImageNet", "--methods", "coop",
                 *common, "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()  # the first fault, then every other one
    assert "split_zhou_OxfordPets.json not found" in lines[0] and "lie directly in images/val/" in lines[1]
    assert lines[1].startswith("  and: ") and "--datasets OxfordPets ImageNet" in lines[2]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "results").exists()


def test_data_check_runs_without_torch(pets):
    probe = ("import sys\nfrom atlas_fast.cli import main\n"
             f"status = main(['data', 'check', '--data-root', {str(pets)!r}, '--datasets', 'OxfordPets'])\n"
             "print('HEAVY', [m for m in ('torch', 'open_clip', 'h5py') if m in sys.modules], status)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "HEAVY [] 0" in result.stdout, result.stderr[-2000:]


def test_the_cheap_part_lists_no_image(tmp_path, monkeypatch):
    """require_layouts reads no split file and lists no image folder beyond ImageNet's val scan."""
    data = tmp_path / "data"
    make_oxford_pets(data, n_classes=2, n_train=2, n_val=1, n_test=1, size=8)
    shutil.rmtree(data / "oxford_pets" / "images")
    (data / "oxford_pets" / "images").mkdir()  # the images are gone, the folder is there: the full check sees it
    check.require_layouts(["OxfordPets"], data)
    assert check_dataset("OxfordPets", data).broken
