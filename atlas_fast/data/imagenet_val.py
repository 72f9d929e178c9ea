"""Sort ImageNet's validation images into class folders by the ILSVRC-2012 devkit's ground truth.

``ILSVRC2012_img_val.tar`` holds 50,000 images in one flat folder; the ImageNet reader (as CoOp's) wants them in
``images/val/<wnid>/``. In the devkit, ``data/ILSVRC2012_validation_ground_truth.txt`` holds, on line i, the
ILSVRC2012_ID of ``ILSVRC2012_val_<i, 8 digits>.JPEG``, and ``data/meta.mat`` maps each ID to its wnid. Both are
checked before anything moves (docs/data-check.md lists the faults named); nothing moves unless every flat image has
a class.
"""

from __future__ import annotations

import codecs
import io
import re
import tarfile
from pathlib import Path

GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
META = "data/meta.mat"
#: ILSVRC-2012's validation images: the ground truth has one line per image.
VALIDATION_IMAGES = 50_000
#: The devkit's files are a few hundred kilobytes; nothing larger is read into memory.
MAX_DEVKIT_FILE_BYTES = 64 << 20
_WNID = re.compile(r"n\d{8}")


def _devkit_files(devkit: Path) -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    """((where, bytes) of the ground truth, (where, bytes) of meta.mat) from the devkit archive or its extracted
    folder; ``where`` names the file for error messages."""
    if devkit.is_dir():
        root = devkit / "ILSVRC2012_devkit_t12" if (devkit / "ILSVRC2012_devkit_t12").is_dir() else devkit
        files = [root / GROUND_TRUTH, root / META]
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(f"{file} not found: --devkit takes ILSVRC2012_devkit_t12.tar.gz or the "
                                        f"folder it extracts to.")
            if file.stat().st_size > MAX_DEVKIT_FILE_BYTES:
                raise ValueError(f"{file} is larger than {MAX_DEVKIT_FILE_BYTES:,} bytes: not the ILSVRC-2012 "
                                 f"devkit's.")
        return (str(files[0]), files[0].read_bytes()), (str(files[1]), files[1].read_bytes())
    if not devkit.is_file():
        raise FileNotFoundError(f"devkit {devkit} not found (ILSVRC2012_devkit_t12.tar.gz, from image-net.org).")
    wanted = {}
    try:
        with tarfile.open(devkit) as archive:
            for member in archive.getmembers():
                for suffix in (GROUND_TRUTH, META):
                    if member.isfile() and member.name.endswith(suffix):
                        where = f"{devkit}:{member.name}"
                        if member.size > MAX_DEVKIT_FILE_BYTES:
                            raise ValueError(f"{where} is larger than {MAX_DEVKIT_FILE_BYTES:,} bytes: not the "
                                             f"ILSVRC-2012 devkit's.")
                        wanted[suffix] = (where, archive.extractfile(member).read())  # type: ignore[union-attr]
    except (tarfile.TarError, EOFError) as exc:
        raise ValueError(f"devkit {devkit} is not a readable tar archive ({exc}): --devkit takes "
                         f"ILSVRC2012_devkit_t12.tar.gz or the folder it extracts to.") from None
    missing = [s for s in (GROUND_TRUTH, META) if s not in wanted]
    if missing:
        raise ValueError(f"{devkit} lacks {', '.join(missing)}: it is not the ILSVRC-2012 devkit.")
    return wanted[GROUND_TRUTH], wanted[META]


def read_synsets(meta: bytes, where: str) -> dict[int, str]:
    """``{ILSVRC2012_ID: wnid}`` of the leaf synsets (the 1,000 classes) of the devkit's ``meta.mat``, checked field
    by field: a ``ValueError`` naming the file (and the entry) when it is not that file."""
    import numpy as np
    from scipy.io import loadmat

    try:
        mat = loadmat(io.BytesIO(meta), squeeze_me=True)
    except Exception as exc:  # a foreign or damaged file: scipy raises many kinds of errors on those
        raise ValueError(f"{where} is not a MATLAB file scipy can read ({type(exc).__name__}): not the ILSVRC-2012 "
                         f"devkit's meta.mat.") from None
    if "synsets" not in mat:
        found = ", ".join(sorted(k for k in mat if not k.startswith("__"))[:5]) or "none"
        raise ValueError(f"{where} has no 'synsets' (its variables: {found}): not the ILSVRC-2012 devkit's meta.mat.")
    synsets = np.atleast_1d(mat["synsets"])
    fields = ("ILSVRC2012_ID", "WNID", "num_children")
    missing = [f for f in fields if f not in (synsets.dtype.names or ())]
    if missing:
        raise ValueError(f"{where}: 'synsets' has no field {', '.join(missing)}: not the ILSVRC-2012 devkit's "
                         f"meta.mat.")
    wnid_of_id: dict[int, str] = {}
    for index, synset in enumerate(synsets, start=1):
        try:
            class_id, wnid, children = int(synset["ILSVRC2012_ID"]), str(synset["WNID"]), int(synset["num_children"])
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{where}: synset {index} is not (ILSVRC2012_ID, WNID, num_children) of whole numbers "
                             f"and a wnid.") from None
        if children == 0:
            if not _WNID.fullmatch(wnid) or class_id in wnid_of_id:
                problem = f"wnid {wnid[:20]!r} is not n + 8 digits" if not _WNID.fullmatch(wnid) else \
                    f"ILSVRC2012_ID {class_id} is given twice"
                raise ValueError(f"{where}: synset {index}: {problem}.")
            wnid_of_id[class_id] = wnid
    if not wnid_of_id:
        raise ValueError(f"{where}: 'synsets' holds no leaf synset (num_children 0): no class to sort into.")
    return wnid_of_id


def read_ground_truth(truth: bytes, where: str) -> list[int]:
    """The class ID of each validation image, one line each, checked line by line: plain ASCII digits (not UTF-16,
    not ``1.0``), no empty line but the last, at most :data:`VALIDATION_IMAGES` lines; a ``ValueError`` naming the
    file and the line."""
    if truth.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in truth[:64]:
        raise ValueError(f"{where} is UTF-16 (saved by an editor?): the devkit's file is plain ASCII digits, one "
                         f"line per image; extract it again from ILSVRC2012_devkit_t12.tar.gz.")
    try:
        text = truth.decode("ascii")
    except UnicodeDecodeError as exc:
        line = truth[:exc.start].count(b"\n") + 1
        raise ValueError(f"{where} line {line} holds a byte that is not ASCII (0x{truth[exc.start]:02x}): the "
                         f"devkit's file is plain digits, one line per image.") from None
    lines = text.split("\n")
    if lines and lines[-1].strip() == "":
        lines.pop()  # the final newline
    if len(lines) > VALIDATION_IMAGES:
        raise ValueError(f"{where} holds {len(lines):,} lines; the ILSVRC-2012 ground truth has one per validation "
                         f"image, {VALIDATION_IMAGES:,}.")
    ids = []
    for number, line in enumerate(lines, start=1):
        value = line.strip()
        if not value:
            raise ValueError(f"{where} line {number} is empty: every line is the class of one image (the images "
                             f"after it would get the wrong class).")
        if not value.isdigit():
            raise ValueError(f"{where} line {number}: {value[:20]!r} is not a class number (a whole number, one "
                             f"per line).")
        ids.append(int(value))
    if not ids:
        raise ValueError(f"{where} is empty: it holds the class of each validation image, one line each.")
    return ids


def wnid_of_validation_images(devkit: str | Path) -> dict[str, str]:
    """``{"ILSVRC2012_val_00000001.JPEG": "n01751748", ...}`` from the devkit, whose files are checked first
    (:func:`read_synsets`, :func:`read_ground_truth`)."""
    (truth_where, truth), (meta_where, meta) = _devkit_files(Path(devkit))
    wnid_of_id = read_synsets(meta, meta_where)
    mapping = {}
    for number, class_id in enumerate(read_ground_truth(truth, truth_where), start=1):
        if class_id not in wnid_of_id:
            raise ValueError(f"{truth_where} line {number} names class {class_id}, which {meta_where} lacks.")
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
