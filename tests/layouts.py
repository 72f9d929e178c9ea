"""Writers of small synthetic datasets in the exact on-disk layouts of the CoOp benchmarks (test stand-ins).

Images are tiny random-colour PNG/JPEG files; what matters is the folder structure, split files and names.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, seed: int, size: int = 40) -> None:
    """A deterministic noisy image whose mean colour depends on ``seed`` (JPEG or PNG by suffix)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=3)
    pixels = np.clip(base + rng.normal(0, 30, size=(size, size + 8, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def write_split_json(path: Path, split: dict) -> None:
    """Dassl's ``write_json``: indent 4, separators (",", ": ")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(split, f, indent=4, separators=(",", ": "))


def make_oxford_pets(data_root: Path, n_classes: int = 6, n_train: int = 8, n_val: int = 3, n_test: int = 4,
                     size: int = 40, seed: int = 0) -> Path:
    """``oxford_pets/images/*.jpg`` + ``split_zhou_OxfordPets.json`` with breed-style class names."""
    dataset_dir = Path(data_root) / "oxford_pets"
    rng = random.Random(seed)
    split: dict[str, list] = {"train": [], "val": [], "test": []}
    for label in range(n_classes):
        cname = f"breed_{chr(ord('a') + label)}_cat" if label % 2 else f"dog_{chr(ord('a') + label)}"
        for name, n in (("train", n_train), ("val", n_val), ("test", n_test)):
            for i in range(n):
                rel = f"{cname}_{name}{i}.jpg"
                write_image(dataset_dir / "images" / rel, seed=label * 1000 + ("train", "val", "test").index(name) * 100 + i, size=size)
                split[name].append([rel, label, cname])
    for items in split.values():
        rng.shuffle(items)
    write_split_json(dataset_dir / "split_zhou_OxfordPets.json", split)
    return dataset_dir


def _write_list_images(dataset_dir: Path, split: dict[str, list], size: int, seed: int) -> None:
    """One image per split entry ``[relative_path, label, classname]`` of a JSON whose paths are relative to
    ``dataset_dir`` (the caller adds any image prefix)."""
    for s_index, items in enumerate(split.values()):
        for i, (rel, label, _) in enumerate(items):
            write_image(dataset_dir / rel, seed=seed + label * 1000 + s_index * 100 + i, size=size)


def make_stanford_cars(data_root: Path, n_classes: int = 4, n_train: int = 5, n_val: int = 2, n_test: int = 3,
                       size: int = 8, seed: int = 0) -> Path:
    """``stanford_cars/cars_{train,test}/*.jpg`` + JSON whose paths are relative to the *dataset folder* and whose
    class names put the year first ("2012 Make Model 3"). Train/val come from ``cars_train``; label groups appear
    in a non-ascending order (as in the real JSON, grouped by first appearance in the annotations)."""
    dataset_dir = Path(data_root) / "stanford_cars"
    order = list(range(n_classes))
    random.Random(seed).shuffle(order)
    split: dict[str, list] = {"train": [], "val": [], "test": []}
    counter = {"cars_train": 0, "cars_test": 0}
    for name, n, folder in (("train", n_train, "cars_train"), ("val", n_val, "cars_train"),
                            ("test", n_test, "cars_test")):
        for label in order:
            for _ in range(n):
                counter[folder] += 1
                split[name].append([f"{folder}/{counter[folder]:05d}.jpg", label, f"{2007 + label} Make Model {label}"])
    _write_list_images(dataset_dir, split, size, seed)
    write_split_json(dataset_dir / "split_zhou_StanfordCars.json", split)
    return dataset_dir


CALTECH_FOLDERS = {"Faces": "face", "Leopards": "leopard", "Motorbikes": "motorbike", "accordion": "accordion",
                   "airplanes": "airplane", "anchor": "anchor", "ant": "ant"}


def make_caltech101(data_root: Path, n_train: int = 4, n_val: int = 2, n_test: int = 2, size: int = 8,
                    seed: int = 0) -> Path:
    """``caltech-101/101_ObjectCategories/<folder>/image_XXXX.jpg`` + JSON as CoOp generated it: labels follow the
    case-sensitive sort of the original folders (capitalised first), paths keep the folder (``Faces/``) while the
    class name is the renamed one (``face``). ``BACKGROUND_Google`` holds images that no split lists."""
    dataset_dir = Path(data_root) / "caltech-101"
    image_dir = dataset_dir / "101_ObjectCategories"
    split: dict[str, list] = {"train": [], "val": [], "test": []}
    for label, folder in enumerate(sorted(CALTECH_FOLDERS)):
        index = 0
        for name, n in (("train", n_train), ("val", n_val), ("test", n_test)):
            for _ in range(n):
                index += 1
                split[name].append([f"{folder}/image_{index:04d}.jpg", label, CALTECH_FOLDERS[folder]])
    _write_list_images(image_dir, split, size, seed)
    write_image(image_dir / "BACKGROUND_Google" / "image_0001.jpg", seed=seed + 99_999, size=size)
    write_split_json(dataset_dir / "split_zhou_Caltech101.json", split)
    return dataset_dir


AIRCRAFT_VARIANTS = ("Falcon 2000", "707-320", "Cessna 172", "F-16A/B", "A300B4", "DC-10")


def make_fgvc_aircraft(data_root: Path, n_train: int = 3, n_val: int = 2, n_test: int = 2, size: int = 8,
                       seed: int = 0) -> Path:
    """``fgvc_aircraft/{images/<id>.jpg, variants.txt, images_variant_{train,val,test}.txt}``: variant names with
    spaces and slashes, listed in a non-alphabetical order (label = line index), list lines ``<id> <variant>``."""
    dataset_dir = Path(data_root) / "fgvc_aircraft"
    dataset_dir.mkdir(parents=True, exist_ok=True)
    (dataset_dir / "variants.txt").write_text("".join(v + "\n" for v in AIRCRAFT_VARIANTS))
    image_id = 1_000_000
    for s_index, (name, n) in enumerate((("train", n_train), ("val", n_val), ("test", n_test))):
        lines = []
        for i in range(n):
            for label, variant in enumerate(AIRCRAFT_VARIANTS):
                image_id += 7
                lines.append(f"{image_id:07d} {variant}\n")
                write_image(dataset_dir / "images" / f"{image_id:07d}.jpg", seed=seed + image_id, size=size)
        (dataset_dir / f"images_variant_{name}.txt").write_text("".join(lines))
    return dataset_dir


def imagenet_classnames(n: int = 1000) -> list[tuple[str, str]]:
    """Synthetic ``(wnid, class name)`` pairs in sorted wnid order, names with spaces (as in CLIP's names)."""
    return [(f"n{1_440_764 + 37 * i:08d}", f"class {i} name") for i in range(n)]


def write_classnames(path: Path, pairs: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{wnid} {name}\n" for wnid, name in pairs))


def make_imagenet(data_root: Path, n_classes: int = 4, n_train: int = 3, n_val: int = 2, size: int = 8,
                  seed: int = 0) -> Path:
    """``imagenet/images/{train,val}/<wnid>/*.JPEG`` + ``classnames.txt``. The class-name file lists the wnids in a
    shuffled order, so names must be looked up by wnid (labels come from the sorted folders)."""
    dataset_dir = Path(data_root) / "imagenet"
    pairs = imagenet_classnames(n_classes)
    shuffled = list(pairs)
    random.Random(seed).shuffle(shuffled)
    write_classnames(dataset_dir / "classnames.txt", shuffled)
    for label, (wnid, _) in enumerate(pairs):
        for split, n in (("train", n_train), ("val", n_val)):
            for i in range(n):
                write_image(dataset_dir / "images" / split / wnid / f"{wnid}_{split}{i:03d}.JPEG",
                            seed=seed + label * 1000 + i + (500 if split == "val" else 0), size=size)
    return dataset_dir


def make_imagenet_a(data_root: Path, present: tuple[int, ...] = (3, 17, 250, 999), n_images: int = 2,
                    n_total: int = 1000, variant: str = "a", size: int = 8, seed: int = 0) -> Path:
    """ImageNet-A (``variant="a"``) or -R (``"r"``): ``imagenet-{adversarial,rendition}/imagenet-{a,r}/<wnid>/`` for
    the ImageNet class indices in ``present`` + the full ``classnames.txt`` (``n_total`` lines) + ``README.txt``."""
    folder, image_folder = {"a": ("imagenet-adversarial", "imagenet-a"),
                            "r": ("imagenet-rendition", "imagenet-r")}[variant]
    dataset_dir = Path(data_root) / folder
    pairs = imagenet_classnames(n_total)
    write_classnames(dataset_dir / "classnames.txt", pairs)
    (dataset_dir / image_folder).mkdir(parents=True, exist_ok=True)
    (dataset_dir / image_folder / "README.txt").write_text("synthetic stand-in\n")
    for index in present:
        for i in range(n_images):
            write_image(dataset_dir / image_folder / pairs[index][0] / f"{i}.jpg", seed=seed + index * 10 + i,
                        size=size)
    return dataset_dir


def make_imagenet_sketch(data_root: Path, n_classes: int = 5, n_images: int = 2, size: int = 8,
                         seed: int = 0) -> Path:
    """``imagenet-sketch/images/<wnid>/*.JPEG`` for every class + ``classnames.txt``."""
    dataset_dir = Path(data_root) / "imagenet-sketch"
    pairs = imagenet_classnames(n_classes)
    write_classnames(dataset_dir / "classnames.txt", pairs)
    for label, (wnid, _) in enumerate(pairs):
        for i in range(n_images):
            write_image(dataset_dir / "images" / wnid / f"sketch_{i}.JPEG", seed=seed + label * 10 + i, size=size)
    return dataset_dir


def make_imagenetv2(data_root: Path, n_classes: int = 5, n_images: int = 2, size: int = 8, seed: int = 0) -> Path:
    """``imagenetv2/imagenetv2-matched-frequency-format-val/<label>/*.jpeg`` + ``classnames.txt`` (line i: label i)."""
    dataset_dir = Path(data_root) / "imagenetv2"
    write_classnames(dataset_dir / "classnames.txt", imagenet_classnames(n_classes))
    for label in range(n_classes):
        for i in range(n_images):
            write_image(dataset_dir / "imagenetv2-matched-frequency-format-val" / str(label) / f"{i}.jpeg",
                        seed=seed + label * 10 + i, size=size)
    return dataset_dir


def make_class_folders(path: Path, classes: tuple[str, ...] = ("zebra", "ant", "moth"), n_train: int = 3,
                       n_val: int = 1, n_test: int = 2, size: int = 8, seed: int = 0) -> Path:
    """A user's ``<path>/{train,val,test}/<class>/*.png`` dataset (no ``val/`` folder when ``n_val == 0``)."""
    path = Path(path)
    for s_index, (split, n) in enumerate((("train", n_train), ("val", n_val), ("test", n_test))):
        for c_index, cname in enumerate(classes):
            for i in range(n):
                write_image(path / split / cname / f"{cname}_{i}.png", seed=seed + c_index * 1000 + s_index * 100 + i,
                            size=size)
    return path


# --- faults of real data (atlas-fast data check) ----------------------------------------------------------------------

def corrupt_image(path: Path) -> None:
    """Replace an image's bytes by the first bytes of a JPEG and garbage: it no longer decodes."""
    Path(path).write_bytes(b"\xff\xd8\xff\xe0" + b"not an image" * 8)


def make_flat_imagenet_val(data_root: Path, n_classes: int = 4, n_train: int = 2, n_val: int = 2, size: int = 8,
                           seed: int = 0) -> tuple[Path, Path]:
    """ImageNet as the archives extract it: ``images/train/<wnid>/`` but ``images/val/ILSVRC2012_val_<8 digits>.JPEG``
    flat, plus a synthetic ILSVRC-2012 devkit (``ILSVRC2012_devkit_t12.tar.gz``: ``data/meta.mat`` whose
    ILSVRC2012_IDs are not in wnid order, and ``data/ILSVRC2012_validation_ground_truth.txt``). Returns (dataset
    folder, devkit archive)."""
    import io
    import tarfile

    from scipy.io import savemat

    dataset_dir = make_imagenet(data_root, n_classes=n_classes, n_train=n_train, n_val=n_val, size=size, seed=seed)
    val = dataset_dir / "images" / "val"
    wnids = sorted(p.name for p in val.iterdir())
    ids = {wnid: n_classes - i for i, wnid in enumerate(wnids)}  # ILSVRC2012_IDs in reverse wnid order
    truth = []
    for wnid in wnids:
        for image in sorted((val / wnid).iterdir()):
            truth.append(ids[wnid])
            image.rename(val / f"ILSVRC2012_val_{len(truth):08d}.JPEG")
        (val / wnid).rmdir()
    synsets = np.zeros((n_classes + 1,), dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"),
                                                ("num_children", "O")])
    for i, wnid in enumerate(wnids):
        synsets[i] = (ids[wnid], wnid, f"words {i}", 0)
    synsets[n_classes] = (n_classes + 1, "n00001740", "entity", 3)  # an inner node of the hierarchy: not a class
    meta = io.BytesIO()
    savemat(meta, {"synsets": synsets})
    devkit = Path(data_root) / "ILSVRC2012_devkit_t12.tar.gz"
    with tarfile.open(devkit, "w:gz") as archive:
        for name, payload in (("data/meta.mat", meta.getvalue()),
                              ("data/ILSVRC2012_validation_ground_truth.txt",
                               "".join(f"{t}\n" for t in truth).encode())):
            info = tarfile.TarInfo(f"ILSVRC2012_devkit_t12/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return dataset_dir, devkit
