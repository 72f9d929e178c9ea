"""``atlas-fast data standins``: stand-ins of the 15 CoOp benchmarks written under a data root, each dataset in its
real on-disk layout, with its real class names, class count and split sizes (:mod:`~atlas_fast.world.standin_plan`),
but small generated images (:mod:`~atlas_fast.world.standin_images`).

Each dataset folder gets a ``STANDIN.json`` manifest, written before the first image (``files``: every file the
generator writes there) and marked complete after the last (with each file's size and modification time); what is
skipped, completed, rewritten or refused, and why a user's files are never deleted, is in docs/data-check.md
(section Stand-ins of the 15 benchmarks). A folder that holds files but no manifest is never touched; a lock per
dataset makes concurrent generators safe.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from atlas_fast.data.check import PUBLISHED_SIZES, STANDIN_MANIFEST
from atlas_fast.files import atomic_write, exclusive_lock, read_json, temporary_target
from atlas_fast.world.standin_images import IMAGE_SIZE, write_images
from atlas_fast.world.standin_plan import SPLITS, StandinPlan, StandinRequest, image_paths, layout_files, plan_standin

MANIFEST = STANDIN_MANIFEST
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class StandinResult:
    """What :func:`write_standin` did: ``written``, ``skipped`` (complete for this request), ``completed`` (an
    interrupted run of this request finished) or ``rewritten`` (a stand-in of another request replaced)."""

    plan: StandinPlan
    action: str
    dataset_dir: Path
    images_written: int
    bytes_written: int
    seconds: float


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def _manifest(plan: StandinPlan, complete: bool, files: dict[str, list[int] | None] | None = None) -> dict:
    published = PUBLISHED_SIZES[plan.name]
    return {
        "standin": True,
        "about": "Synthetic stand-in written by 'atlas-fast data standins': the real layout, class names and split "
                 f"sizes of {plan.name}, with generated {IMAGE_SIZE}x{IMAGE_SIZE} JPEG images (not the real ones). "
                 "Test and val splits hold the given fraction of the published sizes; the training set holds "
                 "train_per_class images per class.",
        "dataset": plan.name,
        "format": MANIFEST_FORMAT,
        "request": asdict(plan.request) | {"image_size": IMAGE_SIZE},
        "counts": plan.counts(),
        "published": {split: getattr(published, split) for split in ("classes", *SPLITS)},
        "images": plan.images(),
        "complete": complete,
        # every file written here: [size, mtime_ns] once complete (what a rewrite may delete), null before
        "files": files or {},
    }


def read_manifest(dataset_dir: Path) -> dict | None:
    """The stand-in manifest of a dataset folder, or None when there is none (or it is not one of ours)."""
    path = Path(dataset_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = read_json(path)
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("standin") is True else None


def _same_request(manifest: dict, plan: StandinPlan) -> bool:
    expected = _manifest(plan, complete=True)
    return all(manifest.get(key) == expected[key] for key in ("dataset", "format", "request", "counts", "images"))


def write_standin(name: str, root: str | Path, request: StandinRequest = StandinRequest(),
                  progress: bool = True) -> StandinResult:
    """Write (or skip, complete or rewrite, see the module's docstring) the stand-in of benchmark ``name`` under
    ``root``. Raises FileExistsError when its folder holds files but no stand-in manifest (real data, perhaps), or
    when a rewrite would delete or overwrite a file the generator did not write as it is now (nothing is deleted)."""
    started = time.perf_counter()
    plan = plan_standin(name, request)
    root = Path(os.path.abspath(os.path.expanduser(str(root))))
    root.mkdir(parents=True, exist_ok=True)
    dataset_dir = root / plan.folder
    with exclusive_lock(root / f".{plan.folder}.standin-lock"):  # outside the folder, which a rewrite deletes
        manifest = read_manifest(dataset_dir)
        if manifest is not None and manifest.get("complete") is True and _same_request(manifest, plan):
            return StandinResult(plan, "skipped", dataset_dir, 0, 0, time.perf_counter() - started)
        paths = image_paths(plan)
        layout = layout_files(plan, paths)
        planned = [*layout, *(relative for split in SPLITS for _, relative in paths[split])]
        listed: dict[str, list[int] | None] = {}
        if manifest is None:
            if dataset_dir.is_dir() and any(dataset_dir.iterdir()):
                raise FileExistsError(
                    f"{dataset_dir} holds files but no {MANIFEST}: it is not a stand-in (real data?), so nothing was "
                    f"written there. Choose another root, or move the folder away.")
            action = "written"
        else:
            action = "completed" if _same_request(manifest, plan) else "rewritten"
            listed = _listed_files(dataset_dir, manifest)
        _remove_temporaries(dataset_dir, {*planned, *listed, MANIFEST})  # of a generator killed mid-write
        ours = _unchanged_files(dataset_dir, listed, legacy=manifest is not None and "files" not in manifest)
        in_the_way = [relative for relative in planned if relative not in ours
                      and os.path.lexists(dataset_dir / relative)]
        if in_the_way:
            raise FileExistsError(
                f"{dataset_dir / in_the_way[0]}{_and_more(in_the_way)} is not the stand-in's but lies where it "
                f"would write; nothing was deleted or written. Move it (or the folder {dataset_dir}) away and run "
                f"again.")
        if action == "rewritten":
            _remove_files(dataset_dir, ours)
        dataset_dir.mkdir(parents=True, exist_ok=True)
        _write_text(dataset_dir / MANIFEST, json.dumps(_manifest(plan, False, dict.fromkeys(planned)), indent=1)
                    + "\n")
        for relative, text in layout.items():
            _write_text(dataset_dir / relative, text)
        written, size = write_images(plan, dataset_dir, paths, progress)
        os.sync()  # the images reach the disk before the manifest says they are all there
        files = {relative: _identity(dataset_dir / relative) for relative in planned}
        _write_text(dataset_dir / MANIFEST, json.dumps(_manifest(plan, True, files), indent=1) + "\n")
    return StandinResult(plan, action, dataset_dir, written, size, time.perf_counter() - started)


def _identity(path: Path) -> list[int]:
    """What says a file is still the one the generator wrote: its size and modification time (ns)."""
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def _and_more(items: list) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _listed_files(dataset_dir: Path, manifest: dict) -> dict[str, list[int] | None]:
    """The files a manifest says the generator wrote (relative path -> [size, mtime_ns], or None when it was not
    complete); for a manifest of an earlier version, which lists none, the files its request writes. Refused
    (FileExistsError, nothing deleted) when the list is not one of relative paths inside the folder."""
    path = dataset_dir / MANIFEST
    files = manifest.get("files")
    if files is None:  # an earlier version's manifest: its request says what it wrote
        try:
            request = manifest["request"]
            plan = plan_standin(manifest["dataset"], StandinRequest(
                request["test_fraction"], request["train_per_class"], request["seed"]))
        except (KeyError, TypeError, ValueError):
            raise FileExistsError(f"{path} does not say which files the stand-in wrote; nothing was deleted. Move "
                                  f"the folder {dataset_dir} away (after saving any files of your own in it)."
                                  ) from None
        paths = image_paths(plan)
        return dict.fromkeys([*layout_files(plan, paths), *(r for split in SPLITS for _, r in paths[split])])
    sound = isinstance(files, dict) and all(
        isinstance(relative, str) and relative and not Path(relative).is_absolute() and ".." not in Path(relative).parts
        and (identity is None or (isinstance(identity, list) and len(identity) == 2
                                  and all(isinstance(v, int) and not isinstance(v, bool) for v in identity)))
        for relative, identity in files.items())
    if not sound:
        raise FileExistsError(f"{path}: 'files' is not a list of the files the stand-in wrote inside {dataset_dir}; "
                              f"nothing was deleted. Move the folder away (after saving any files of your own in it).")
    return files


def _unchanged_files(dataset_dir: Path, listed: dict[str, list[int] | None], legacy: bool) -> set[str]:
    """The listed files that are still as the generator wrote them (same size and modification time; a file listed
    by an unfinished run, which recorded none, counts as its own). A listed file changed since is the user's now:
    FileExistsError naming it, nothing deleted. ``legacy`` (a manifest that listed no files): any file besides the
    listed ones is refused the same way, since nothing tells the stand-in's files from others at those paths."""
    ours, changed = set(), []
    for relative, identity in listed.items():
        path = dataset_dir / relative
        if not os.path.lexists(path):
            continue
        if path.is_symlink() or not path.is_file() or (identity is not None and _identity(path) != identity):
            changed.append(relative)
        else:
            ours.add(relative)
    if changed:
        raise FileExistsError(
            f"{dataset_dir / changed[0]}{_and_more(changed)} was changed since the stand-in wrote it (real data "
            f"extracted over it?): it is yours now, so nothing was deleted or written. Move the folder {dataset_dir} "
            f"away (or the files you keep out of it) and run again.")
    if legacy:
        others = sorted(str(p.relative_to(dataset_dir)) for p in dataset_dir.rglob("*")
                        if not p.is_dir() and p.name != MANIFEST and str(p.relative_to(dataset_dir)) not in ours)
        if others:
            raise FileExistsError(
                f"{dataset_dir / others[0]}{_and_more(others)} is not the stand-in's, and its {MANIFEST} (of an "
                f"earlier version) does not list the files it wrote; nothing was deleted. Move your files out of "
                f"{dataset_dir} and run again.")
    return ours


def _remove_temporaries(dataset_dir: Path, relatives: set[str]) -> None:
    """Remove the temporary files a killed generator left beside the files it writes (under the dataset's lock no
    other generator writes there)."""
    targets = {dataset_dir / relative for relative in relatives}
    for folder in {target.parent for target in targets}:
        try:
            entries = [entry.name for entry in os.scandir(folder) if entry.name.startswith(".")]
        except OSError:
            continue
        for entry in entries:
            target = temporary_target(entry)
            if target is not None and folder / target in targets:
                (folder / entry).unlink(missing_ok=True)


def _remove_files(dataset_dir: Path, relatives: set[str]) -> None:
    """Delete these files and the folders this leaves empty (a folder holding anything else stays)."""
    folders: set[Path] = set()
    for relative in relatives:
        path = dataset_dir / relative
        path.unlink(missing_ok=True)
        folders.update(p for p in path.parents if dataset_dir in p.parents)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:
            pass


def describe(result: StandinResult) -> str:
    """One line for the command's output: what was done, the counts written against the published ones."""
    plan = result.plan
    published = PUBLISHED_SIZES[plan.name]
    counts = plan.counts()
    parts = [f"{counts['classes']:,} classes"]
    for split in SPLITS:
        if split not in counts:
            continue
        full = getattr(published, split)
        if split == "train":
            parts.append(f"train {counts[split]:,} ({plan.request.train_per_class} per class; published {full:,})")
        else:
            parts.append(f"{split} {counts[split]:,}/{full:,}")
    done = (f"{result.images_written:,} image(s), {result.bytes_written / 1e6:.1f} MB in {result.seconds:.1f} s"
            if result.action != "skipped" else "already complete for this request")
    return f"{plan.name}: {result.action}: {', '.join(parts)}; {done} -> {result.dataset_dir}"
