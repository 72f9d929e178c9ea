"""The data layer on tiny synthetic datasets written in the real CoOp layouts (``tests/layouts.py``)."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from atlas_fast.data.fewshot import fewshot_source
from atlas_fast.data import (
    DATASETS,
    DatasetFormatError,
    DatasetLayoutError,
    atlas_template,
    fewshot_subset,
    list_datasets,
    load_dataset,
    load_folder_dataset,
    register_split_json_dataset,
    subsample_classes,
    zeroshot_template,
)
from layouts import (
    AIRCRAFT_VARIANTS,
    imagenet_classnames,
    make_caltech101,
    make_class_folders,
    make_fgvc_aircraft,
    make_imagenet,
    make_imagenet_a,
    make_imagenet_sketch,
    make_imagenetv2,
    make_oxford_pets,
    make_stanford_cars,
)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    make_oxford_pets(root, n_classes=5, n_train=6, n_val=5, n_test=2, size=8)
    make_stanford_cars(root)
    make_caltech101(root)
    make_fgvc_aircraft(root)
    make_imagenet(root)
    make_imagenet_a(root)
    make_imagenet_a(root, present=(0, 5, 6), variant="r")
    make_imagenet_sketch(root)
    make_imagenetv2(root)
    return root


def copy_dataset(data_root: Path, folder: str, tmp_path: Path) -> Path:
    """A private copy of one dataset folder for tests that break it."""
    shutil.copytree(data_root / folder, tmp_path / folder)
    return tmp_path


def label_names(items) -> dict[int, set[str]]:
    table = defaultdict(set)
    for d in items:
        table[d.label].add(d.classname)
    return table


# ------------------------------------------------------------------------------------------------------ registry


def test_names_and_aliases_resolve_case_insensitively(data_root):
    benchmarks = list_datasets()[:15]  # the 15 CoOp benchmarks first, then registered extras (the embedded world)
    assert benchmarks == ["ImageNet", "Caltech101", "OxfordPets", "StanfordCars", "OxfordFlowers", "Food101",
                          "FGVCAircraft", "SUN397", "DescribableTextures", "EuroSAT", "UCF101", "ImageNetV2",
                          "ImageNetSketch", "ImageNetA", "ImageNetR"]
    assert "WorldSketches" in list_datasets()
    for name in ("OxfordPets", "oxford_pets", "OXFORD_PETS", "oxfordpets"):
        assert load_dataset(name, data_root).name == "OxfordPets"
    with pytest.raises(ValueError, match=r"unknown dataset 'pets'.*DescribableTextures \(dtd\).*ImageNetA"):
        load_dataset("pets", data_root)


def test_templates_follow_the_paper_and_coop():
    assert atlas_template("dtd") == "a photo of a {}, a type of texture."
    assert zeroshot_template("DescribableTextures") == "{} texture."
    for name in list_datasets():
        assert "{}" in atlas_template(name) and "{}" in zeroshot_template(name)
        if name != "DescribableTextures":
            assert atlas_template(name) == zeroshot_template(name)
    for name in ("imagenet", "imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r"):
        assert atlas_template(name) == "a photo of a {}."
    assert atlas_template("eurosat") == "a centered satellite photo of {}."


# ------------------------------------------------------------------------------------------------------ layouts


def test_oxford_pets_reads_the_split_json_verbatim(data_root):
    splits = load_dataset("OxfordPets", data_root)
    raw = json.loads((data_root / "oxford_pets" / "split_zhou_OxfordPets.json").read_text())
    for name in ("train", "val", "test"):
        items = getattr(splits, name)
        assert [(d.key, d.label, d.classname) for d in items] == [(f"images/{p}", y, c) for p, y, c in raw[name]]
        assert all(Path(d.impath) == data_root / "oxford_pets" / d.key for d in items)
    assert splits.classnames == ("dog_a", "breed_b_cat", "dog_c", "breed_d_cat", "dog_e")
    assert splits.template == "a photo of a {}, a type of pet."
    assert splits.prompts()[1] == "a photo of a breed b cat, a type of pet."
    assert not splits.val_is_test and splits.subset == {}


def test_stanford_cars_paths_are_relative_to_the_dataset_folder(data_root):
    splits = load_dataset("stanford_cars", data_root)
    assert {d.key.split("/")[0] for d in splits.train + splits.val} == {"cars_train"}
    assert {d.key.split("/")[0] for d in splits.test} == {"cars_test"}
    assert all(Path(d.impath) == data_root / "stanford_cars" / d.key for d in splits.test)
    assert splits.classnames == tuple(f"{2007 + i} Make Model {i}" for i in range(4))  # year first, from the JSON
    first_appearance = list(dict.fromkeys(d.label for d in splits.train))
    assert first_appearance != sorted(first_appearance)  # the layout the few-shot order test relies on


def test_caltech101_labels_and_names_come_from_the_json(data_root):
    splits = load_dataset("Caltech101", data_root)
    assert splits.classnames[:5] == ("face", "leopard", "motorbike", "accordion", "airplane")
    faces = [d for d in splits.train if d.label == 0]
    assert faces and all(d.key.startswith("101_ObjectCategories/Faces/") and d.classname == "face" for d in faces)
    assert not any("BACKGROUND_Google" in d.key for d in splits.train + splits.val + splits.test)


def test_fgvc_aircraft_labels_are_line_indices_of_variants(data_root):
    splits = load_dataset("FGVCAircraft", data_root)
    assert splits.classnames == AIRCRAFT_VARIANTS
    for items in (splits.train, splits.val, splits.test):
        assert all(AIRCRAFT_VARIANTS[d.label] == d.classname for d in items)
        assert all(d.key.startswith("images/") and d.key.endswith(".jpg") for d in items)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (18, 12, 12)


def test_imagenet_labels_by_sorted_folders_names_by_wnid_val_is_test(data_root):
    splits = load_dataset("imagenet", data_root)
    pairs = imagenet_classnames(4)
    assert splits.classnames == tuple(name for _, name in pairs)  # classnames.txt is shuffled on disk
    assert splits.val == splits.test and splits.val_is_test
    assert all(d.key.startswith(f"images/val/{pairs[d.label][0]}/") for d in splits.test)
    assert all(d.key.startswith(f"images/train/{pairs[d.label][0]}/") for d in splits.train)
    keys = [d.key for d in splits.train]
    assert keys == sorted(keys)  # documented deviation: sorted listing
    assert Counter(d.label for d in splits.train) == {0: 3, 1: 3, 2: 3, 3: 3}


def test_imagenet_a_and_r_are_k_way_over_the_present_wnids(data_root):
    pairs = imagenet_classnames(1000)
    for name, folder, present in (("ImageNetA", "imagenet-a", (3, 17, 250, 999)),
                                  ("imagenet_r", "imagenet-r", (0, 5, 6))):
        splits = load_dataset(name, data_root)
        assert splits.train == () and splits.val == ()
        assert splits.classnames == tuple(pairs[i][1] for i in present)
        assert sorted({d.label for d in splits.test}) == list(range(len(present)))
        assert all(d.key.startswith(f"{folder}/{pairs[present[d.label]][0]}/") for d in splits.test)
        assert fewshot_subset(splits, 4, seed=1) is splits


def test_imagenet_sketch_and_v2(data_root):
    pairs = imagenet_classnames(5)
    sketch = load_dataset("imagenet_sketch", data_root)
    assert sketch.classnames == tuple(n for _, n in pairs) and len(sketch.test) == 10 and sketch.train == ()
    v2 = load_dataset("ImageNetV2", data_root)
    assert all(d.key.startswith(f"imagenetv2-matched-frequency-format-val/{d.label}/") for d in v2.test)
    assert v2.classnames == tuple(n for _, n in pairs)


def test_user_folder_layout(tmp_path):
    make_class_folders(tmp_path / "mine", n_val=0)
    for splits in (load_folder_dataset(tmp_path / "mine", template="a {} bug."),
                   load_dataset("folder:mine", tmp_path)):
        assert splits.classnames == ("ant", "moth", "zebra") and splits.val == ()
        assert [d.key for d in splits.test[:2]] == ["test/ant/ant_0.png", "test/ant/ant_1.png"]
    assert load_folder_dataset(tmp_path / "mine", template="a {} bug.").prompts()[0] == "a ant bug."
    assert zeroshot_template(splits.name) == atlas_template(splits.name) == "a photo of a {}."
    (tmp_path / "mine" / "test" / "wasp").mkdir()
    with pytest.raises(DatasetLayoutError, match=r"(?s)mine/test/wasp has no counterpart.*train/<class name>"):
        load_folder_dataset(tmp_path / "mine")


def test_register_split_json_dataset(data_root):
    try:
        spec = register_split_json_dataset("MyPets", "oxford_pets", "images", "a {} pet.",
                                           split_file="split_zhou_OxfordPets.json")
        assert "MyPets" in list_datasets() and spec.name == "MyPets"
        mine, pets = load_dataset("mypets", data_root), load_dataset("OxfordPets", data_root)
        assert mine.train == pets.train and mine.template == "a {} pet." and mine.name == "MyPets"
        assert zeroshot_template("MyPets") == "a {} pet."
        with pytest.raises(ValueError, match="built-in"):
            register_split_json_dataset("dtd", "dtd", "images", "a {}.")
    finally:
        DATASETS.pop("MyPets", None)


# ------------------------------------------------------------------------------------------------------ errors


def test_missing_dataset_folder_shows_the_expected_layout(tmp_path):
    with pytest.raises(DatasetLayoutError) as info:
        load_dataset("dtd", tmp_path)
    message = str(info.value)
    assert str(tmp_path / "dtd") in message and "Expected layout" in message
    assert "images/" in message and "split_zhou_DescribableTextures.json" in message


def test_missing_split_file_and_image_folder_show_the_layout(data_root, tmp_path):
    root = copy_dataset(data_root, "imagenet", tmp_path)
    shutil.rmtree(root / "imagenet" / "images" / "train")
    with pytest.raises(DatasetLayoutError, match=r"(?s)image folder not found: .*images/train\n"
                                                 r"Expected layout:.*classnames.txt"):
        load_dataset("imagenet", root)
    (root / "imagenet" / "images" / "train").mkdir()
    with pytest.raises(DatasetLayoutError, match=r"(?s)hold different class folders.*Expected layout"):
        load_dataset("imagenet", root)
    root = copy_dataset(data_root, "fgvc_aircraft", tmp_path)
    (root / "fgvc_aircraft" / "images_variant_val.txt").unlink()
    with pytest.raises(DatasetLayoutError, match=r"(?s)images_variant_val.txt\nExpected layout:.*variants.txt"):
        load_dataset("fgvc_aircraft", root)


def test_missing_image_file_is_named(data_root, tmp_path):
    root = copy_dataset(data_root, "caltech-101", tmp_path)
    victim = load_dataset("caltech101", root).val[3]
    Path(victim.impath).unlink()
    with pytest.raises(DatasetLayoutError, match=f"{victim.impath}"):
        load_dataset("caltech101", root)


def test_malformed_split_files_name_file_and_line(data_root, tmp_path):
    root = copy_dataset(data_root, "oxford_pets", tmp_path)
    split_file = root / "oxford_pets" / "split_zhou_OxfordPets.json"
    lines = split_file.read_text().splitlines()
    split_file.write_text("\n".join(lines[:5] + ["oops"] + lines[5:]))
    with pytest.raises(DatasetFormatError, match=r"split_zhou_OxfordPets.json:6:"):
        load_dataset("oxford_pets", root)
    split = json.loads("\n".join(lines))
    split["val"][2] = ["x.jpg", "cat"]
    split_file.write_text(json.dumps(split))
    with pytest.raises(DatasetFormatError, match=r"entry val\[2\]"):
        load_dataset("oxford_pets", root)

    root = copy_dataset(data_root, "fgvc_aircraft", tmp_path)
    test_list = root / "fgvc_aircraft" / "images_variant_test.txt"
    test_list.write_text(test_list.read_text() + "1234567 Spitfire\n")
    with pytest.raises(DatasetFormatError, match=r"images_variant_test.txt:13: variant 'Spitfire'"):
        load_dataset("fgvc_aircraft", root)

    root = copy_dataset(data_root, "imagenet-sketch", tmp_path)
    names = root / "imagenet-sketch" / "classnames.txt"
    names.write_text(names.read_text().replace("class 2 name", ""))
    with pytest.raises(DatasetFormatError, match=r"classnames.txt:3: expected '<wnid> <class name>'"):
        load_dataset("imagenet_sketch", root)


# ------------------------------------------------------------------------------------------------------ few-shot


def dassl_fewshot(train, val, num_shots, seed, sample_val=True):
    """A literal re-implementation of Dassl's call pattern on the global ``random`` module."""
    random.seed(seed)

    def generate(data_source, k):
        tracker = defaultdict(list)
        for item in data_source:
            tracker[item.label].append(item)
        dataset = []
        for label, items in tracker.items():
            dataset.extend(random.sample(items, k) if len(items) >= k else items)
        return dataset

    new_train = generate(train, num_shots)
    return new_train, (generate(val, min(num_shots, 4)) if sample_val else list(val))


@pytest.mark.parametrize("name", ["StanfordCars", "OxfordPets", "Caltech101", "FGVCAircraft", "ImageNet"])
@pytest.mark.parametrize("num_shots", [1, 2, 5])
def test_fewshot_matches_dassl_on_the_global_rng(data_root, name, num_shots):
    splits = load_dataset(name, data_root)
    for seed in (1, 2, 3):
        sub = fewshot_subset(splits, num_shots, seed)
        train, val = dassl_fewshot(splits.train, splits.val, num_shots, seed, sample_val=not splits.val_is_test)
        assert list(sub.train) == train and list(sub.val) == val
        assert sub.test == splits.test and sub.subset == {"shots": num_shots, "seed": seed}


def clip_lora_fewshot(train, val, num_shots, seed, val_is_test=False):
    """CLIP-LoRA's dataset readers, literally, on the global ``random`` module: the validation subset (min(K, 4)
    shots) is drawn before the training subset, both with ``repeat=True`` (a class short of the shots is drawn with
    replacement); ImageNet draws K + min(K, 4) images of each class at once and trains on the first K."""
    random.seed(seed)
    val_shots = min(num_shots, 4)

    def generate(data_source, k):
        tracker = defaultdict(list)
        for item in data_source:
            tracker[item.label].append(item)
        dataset = []
        for label, items in tracker.items():
            dataset.extend(random.sample(items, k) if len(items) >= k else random.choices(items, k=k))
        return dataset

    if val_is_test:
        tracker = defaultdict(list)
        for item in train:
            tracker[item.label].append(item)
        return [d for items in tracker.values() for d in random.sample(items, num_shots + val_shots)[:num_shots]], \
            list(val)
    new_val = generate(val, val_shots)
    return generate(train, num_shots), new_val


@pytest.mark.parametrize("name", ["StanfordCars", "OxfordPets", "ImageNet"])
@pytest.mark.parametrize("num_shots", [2, 5])
def test_the_clip_lora_fewshot_order_matches_its_readers_and_is_not_the_default(data_root, name, num_shots,
                                                                              tmp_path):
    """Issue 44: CLIP-LoRA's readers sample validation before training, so with one seed their K-shot training sets
    differ from CoOp's; ``order="clip-lora"`` draws theirs, the default stays CoOp's."""
    splits = load_dataset(name, data_root)
    if splits.val_is_test and num_shots > 1:  # 3 training images per class: K + min(K, 4) = 4 cannot be drawn
        with pytest.raises(ValueError, match=r"has 3 training images, fewer than the \d \+ \d CLIP-LoRA's order"):
            fewshot_subset(splits, num_shots, 1, order="clip-lora")
        num_shots = 1
    differs = False
    for seed in (1, 2, 3):
        sub = fewshot_subset(splits, num_shots, seed, order="clip-lora", store_dir=tmp_path)
        train, val = clip_lora_fewshot(splits.train, splits.val, num_shots, seed, splits.val_is_test)
        assert list(sub.train) == train and list(sub.val) == val
        assert sub.subset == {"shots": num_shots, "seed": seed, "order": "clip-lora"}
        assert fewshot_subset(splits, num_shots, seed, order="clip-lora", store_dir=tmp_path) == sub  # stored
        default = fewshot_subset(splits, num_shots, seed, store_dir=tmp_path)
        assert list(default.train) == dassl_fewshot(splits.train, splits.val, num_shots, seed,
                                                    sample_val=not splits.val_is_test)[0]
        differs |= default.train != sub.train
    assert differs  # the two orders give other training images for the same seed
    assert len(list(tmp_path.glob(f"shot_{num_shots}-seed_1-clip-lora-*.json"))) == 1
    with pytest.raises(ValueError, match="few-shot order must be one of coop, clip-lora, got 'lora'"):
        fewshot_subset(splits, num_shots, 4, order="lora")


def test_fewshot_counts_order_and_determinism(data_root):
    splits = load_dataset("StanfordCars", data_root)  # 5 train / 2 val per class, non-ascending label groups
    sub = fewshot_subset(splits, 4, seed=1)
    assert Counter(d.label for d in sub.train) == {label: 4 for label in range(4)}
    assert Counter(d.label for d in sub.val) == {label: 2 for label in range(4)}  # fewer than min(4, 4): all kept
    assert list(dict.fromkeys(d.label for d in sub.train)) == list(dict.fromkeys(d.label for d in splits.train))
    state = random.getstate()
    assert fewshot_subset(splits, 4, seed=1) == sub
    assert random.getstate() == state  # a private RNG: the global one is left alone
    assert fewshot_subset(splits, 4, seed=2).train != sub.train

    pets = load_dataset("OxfordPets", data_root)  # 6 train / 5 val per class
    sub = fewshot_subset(pets, 8, seed=1)
    groups = defaultdict(list)
    for d in pets.train:  # the list is shuffled; output = all items, grouped by first appearance, in list order
        groups[d.label].append(d)
    assert list(sub.train) == [d for group in groups.values() for d in group] and len(sub.train) == len(pets.train)
    assert Counter(d.label for d in sub.val) == {label: 4 for label in range(5)}  # val shots = min(K, 4)
    assert Counter(d.label for d in fewshot_subset(pets, 3, seed=1).val) == {label: 3 for label in range(5)}
    assert fewshot_subset(pets, 0, seed=1) is pets and fewshot_subset(pets, -1, seed=1) is pets


def test_imagenet_fewshot_keeps_val_as_test(data_root):
    splits = load_dataset("ImageNet", data_root)
    sub = fewshot_subset(splits, 2, seed=1)
    assert len(sub.train) == 8 and sub.val == splits.test == sub.test


def test_stored_subset_is_reused_and_portable(data_root, tmp_path):
    splits = load_dataset("OxfordPets", data_root)
    sub = fewshot_subset(splits, 2, seed=3, store_dir=tmp_path)
    (stored,) = tmp_path.glob("shot_2-seed_3-*.json")
    record = json.loads(stored.read_text())
    assert record["train"] == [d.key for d in sub.train] and record["val"] == [d.key for d in sub.val]
    assert not any(key.startswith("/") for key in record["train"])
    record["train"] = record["train"][::-1]  # a stored subset chosen by hand (no checksum) wins over resampling
    del record["checksum"]  # (an edit that keeps the checksum is refused: tests/test_storage_integrity.py)
    stored.write_text(json.dumps(record))
    assert fewshot_subset(splits, 2, seed=3, store_dir=tmp_path).train == sub.train[::-1]
    assert list(tmp_path.iterdir()) == [stored]

    imagenet = load_dataset("ImageNet", data_root)
    sub = fewshot_subset(imagenet, 1, seed=1, store_dir=tmp_path / "imagenet")
    assert "val" not in json.loads(next((tmp_path / "imagenet").glob("shot_1-seed_1-*.json")).read_text())
    assert fewshot_subset(imagenet, 1, seed=1, store_dir=tmp_path / "imagenet") == sub


def test_stored_subset_of_other_lists_is_redrawn_or_refused(data_root, tmp_path):
    splits = load_dataset("OxfordPets", data_root)
    first = fewshot_subset(splits, 2, seed=1, store_dir=tmp_path)
    other_root = tmp_path / "other"
    make_oxford_pets(other_root, n_classes=5, n_train=6, n_val=5, n_test=2, size=8, seed=1)
    renamed = other_root / "oxford_pets" / "split_zhou_OxfordPets.json"
    renamed.write_text(renamed.read_text().replace("_train", "_trn"))
    for path in (other_root / "oxford_pets" / "images").glob("*_train*"):
        path.rename(path.with_name(path.name.replace("_train", "_trn")))
    other = load_dataset("OxfordPets", other_root)
    drawn = fewshot_subset(other, 2, seed=1, store_dir=tmp_path)  # other lists: drawn afresh, stored beside
    assert drawn.train == fewshot_subset(other, 2, seed=1).train
    assert len(list(tmp_path.glob("shot_2-seed_1-*.json"))) == 2
    assert fewshot_subset(splits, 2, seed=1, store_dir=tmp_path) == first
    # A stored file under another name (copied, renamed) is refused, never reused.
    mine, theirs = (next(tmp_path.glob(f"shot_2-seed_1-{fewshot_source(s)[:12]}.json")) for s in (splits, other))
    theirs.write_bytes(mine.read_bytes())
    with pytest.raises(ValueError, match=r"is for \{'dataset': 'OxfordPets'.*; delete it to resample"):
        fewshot_subset(other, 2, seed=1, store_dir=tmp_path)
    # Keys that vanished from the lists (the file's name and fields edited to match) are detected too.
    record = json.loads(mine.read_text())
    record["train"][0] = "images/gone.jpg"
    mine.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"is stale: 1 of its 10 'train' images"):
        fewshot_subset(splits, 2, seed=1, store_dir=tmp_path)


# ------------------------------------------------------------------------------------------------------ base / new


def test_base_new_split_relabels_from_zero(data_root):
    splits = load_dataset("Caltech101", data_root)  # 7 classes: base = 4 (with the middle one), new = 3
    base, new = subsample_classes(splits, "base"), subsample_classes(splits, "new")
    assert base.classnames == ("face", "leopard", "motorbike", "accordion")
    assert new.classnames == ("airplane", "anchor", "ant")
    for part, offset in ((base, 0), (new, 4)):
        for name in ("train", "val", "test"):
            items = getattr(part, name)
            assert items and all(d.classname == splits.classnames[d.label + offset] for d in items)
            assert len(items) == sum(1 for d in getattr(splits, name) if d.classname in part.classnames)
    assert subsample_classes(splits, "all").train == splits.train
    assert new.subset == {"classes": "new"}
    with pytest.raises(ValueError, match=r"one of \('base', 'new', 'all'\)"):
        subsample_classes(splits, "novel")


def test_base_new_after_fewshot_uses_train_labels(data_root):
    imagenet = fewshot_subset(load_dataset("ImageNet", data_root), 1, seed=1)
    base = subsample_classes(imagenet, "base")
    assert base.subset == {"shots": 1, "seed": 1, "classes": "base"}
    assert base.num_classes == 2 and base.val == base.test and {d.label for d in base.test} == {0, 1}
    with pytest.raises(ValueError, match="before subsample_classes"):
        fewshot_subset(base, 1, seed=1)
    with pytest.raises(ValueError, match="test-only"):
        subsample_classes(load_dataset("imagenet_a", data_root), "new")


def test_relabeling_keeps_every_other_field():
    from dataclasses import replace

    from atlas_fast.data.base import Datum
    from atlas_fast.data.fewshot import _relabeled

    datum = Datum("/data/a/b.jpg", 7, "cat", "a/b.jpg", domain=2)
    assert _relabeled(datum, 3) == replace(datum, label=3) and datum.label == 7


def test_a_run_with_the_clip_lora_order_is_another_record_and_the_default_names_are_kept(data_root, tmp_path):
    """The order is part of a run only when it is not the default: records of CoOp's order keep their names."""
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig
    from atlas_fast.engine.spec import plan_run

    common = dict(dataset="OxfordPets", data_root=data_root, backbone=BackboneConfig("atlas-tiny", None), shots=2,
                  epochs=2, device="cpu", cache_root=tmp_path / "cache", results_dir=tmp_path / "results",
                  progress=False)
    coop, lora = (plan_run(TrainConfig(**common, fewshot_order=order)) for order in ("coop", "clip-lora"))
    assert "fewshot_order" not in coop.described and lora.described["fewshot_order"] == "clip-lora"
    assert coop.record_key != lora.record_key and coop.config_key != lora.config_key
    assert coop.data.fewshot.train != lora.data.fewshot.train
    with pytest.raises(ValueError, match="fewshot_order must be one of"):
        TrainConfig(**common, fewshot_order="lora")
