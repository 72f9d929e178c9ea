"""Sort ImageNet's validation images into class folders by the ILSVRC-2012 devkit's ground truth.

``ILSVRC2012_img_val.tar`` holds 50,000 images in one flat folder; the ImageNet reader (as CoOp's) wants them in
``images/val/<wnid>/`` like the train set. The devkit (``ILSVRC2012_devkit_t12.tar.gz``, from image-net.org)
gives the class of each: ``data/ILSVRC2012_validation_ground_truth.txt`` holds, on line i, the ILSVRC2012_ID of
``ILSVRC2012_val_<i, 8 digits>.JPEG``, and ``data/meta.mat`` maps each ID to its wnid. Every move is checked first:
nothing moves unless every flat image has a class.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
META = "data/meta.mat"


def _devkit_files(devkit: Path) -> tuple[bytes, bytes]:
    """(ground-truth text, meta.mat bytes) from the devkit archive or its extracted folder."""
    if devkit.is_dir():
        root = devkit / "ILSVRC2012_devkit_t12" if (devkit / "ILSVRC2012_devkit_t12").is_dir() else devkit
        files = [root / GROUND_TRUTH, root / META]
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(f"{file} not found: --devkit takes ILSVRC2012_devkit_t12.tar.gz or the "
                                        f"folder it extracts to.")
        return files[0].read_bytes(), files[1].read_bytes()
    if not devkit.is_file():
        raise FileNotFoundError(f"devkit {devkit} not found (ILSVRC2012_devkit_t12.tar.gz, from image-net.org).")
    wanted = {}
    with tarfile.open(devkit) as archive:
        for member in archive.getmembers():
            for suffix in (GROUND_TRUTH, META):
                if member.isfile() and member.name.endswith(suffix):
                    wanted[suffix] = archive.extractfile(member).read()  # type: ignore[union-attr]
    missing = [s for s in (GROUND_TRUTH, META) if s not in wanted]
    if missing:
        raise ValueError(f"{devkit} lacks {', '.join(missing)}: it is not the ILSVRC-2012 devkit.")
    return wanted[GROUND_TRUTH], wanted[META]


def wnid_of_validation_images(devkit: str | Path) -> dict[str, str]:
    """``{"ILSVRC2012_val_00000001.JPEG": "n01751748", ...}`` from the devkit."""
    from scipy.io import loadmat

    truth, meta = _devkit_files(Path(devkit))
    synsets = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
    wnid_of_id = {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["num_children"]) == 0}
    mapping = {}
    for number, line in enumerate(truth.decode().split(), start=1):
        class_id = int(line)
        if class_id not in wnid_of_id:
            raise ValueError(f"{devkit}: {GROUND_TRUTH} line {number} names class {class_id}, which meta.mat lacks.")
        mapping[f"ILSVRC2012_val_{number:08d}.JPEG"] = wnid_of_id[class_id]
    return mapping


def sort_validation_images(val_dir: str | Path, devkit: str | Path) -> int:
    """Move every image lying directly in ``val_dir`` into ``val_dir/<wnid>/``; returns how many moved. Refuses
    (moving nothing) when a flat image is not in the ground truth. Images already in class folders stay."""
    val_dir = Path(val_dir)
    if not val_dir.is_dir():
        raise FileNotFoundError(f"ImageNet val folder {val_dir} not found (extract ILSVRC2012_img_val.tar there).")
    mapping = wnid_of_validation_images(devkit)
    flat = sorted(p for p in val_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    unknown = [p.name for p in flat if p.name not in mapping]
    if unknown:
        raise ValueError(f"{len(unknown)} file(s) in {val_dir} are not ILSVRC-2012 validation images of the devkit's "
                         f"ground truth (e.g. {unknown[0]}); nothing was moved.")
    for path in flat:
        target = val_dir / mapping[path.name]
        target.mkdir(exist_ok=True)
        path.replace(target / path.name)
    return len(flat)
