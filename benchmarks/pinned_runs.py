"""Behaviour pinned across a refactor: a fixed set of tiny runs, and what each produced, bit for bit.

Every registered method trained alone, every method that batches trained as a group of two seeds, groups whose runs
share their first epochs and fork (cached features and pixels), and the label schedules and soft labels of
tests/test_pinned_runs.py (ATLaS with CSL, ISL and mix, OLS, TF-KD) run on the tiny random CLIP and an 8-class
synthetic OxfordPets written in the dataset's real on-disk layout (tests/layouts.py), one thread, no worker
processes. For each run the script writes the record's file stem, its key and config key, its metrics (accuracies,
calibration figures, reliability bins, zero-shot references: floats as stored), its per-epoch logs (every loss, the
learning rate, the soft-label flag, the accuracy where evaluated), the group size it trained in, and the sha256 of
every learned tensor's bytes (contiguous, on the CPU, with dtype and shape).

The bytes of float tensors depend on the CPU's vector units, so compare files written on one machine::

    OMP_NUM_THREADS=1 python benchmarks/pinned_runs.py --out before.json
    ... change the code ...
    OMP_NUM_THREADS=1 python benchmarks/pinned_runs.py --out after.json
    python benchmarks/pinned_runs.py --compare before.json after.json   # every difference; exit status 1 if any

The run set is fixed here (not read from the registry), so both sides train the same runs; a registered method the
set does not cover is named in the output (add it here and take a new baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# The registered methods when the baseline was taken (registry order), and those whose class batches runs.
LONE = ("zsclip", "coop", "cocoop", "kgcoop", "ivlp", "maple", "dept-coop", "dept-cocoop", "dept-kgcoop", "dept-maple",
        "promptsrc", "clip-lora", "clip-lora-text", "tcp", "kdpl-coop", "kdpl-cocoop", "kdpl-maple", "kdpl-promptsrc",
        "coprompt", "mmrl", "mmrl++", "promptkd")
BATCHED = ("coop", "cocoop", "kgcoop", "ivlp", "maple", "dept-coop", "dept-cocoop", "dept-kgcoop", "dept-maple",
           "promptsrc", "tcp", "coprompt", "mmrl", "mmrl++", "promptkd")
# Methods that share their first epochs between a seed's plain and ATLaS runs, then fork (one cached, one pixel).
FORKED = ("coop", "ivlp")

TINY_TEACHER = dict(teacher="atlas-tiny-teacher", teacher_pretrained="none")
# Options that fit each method to the tiny model's 2-block towers (as tests/registry_cases.py gives them).
SMALL_OPTIONS: dict[str, dict[str, Any]] = {
    "ivlp": dict(n_ctx_text=2, n_ctx_vision=2, depth_text=2, depth_vision=2),
    "maple": dict(n_ctx=2, depth=2),
    "dept-maple": dict(n_ctx=2, depth=2),
    "promptsrc": dict(depth_text=2, depth_vision=2, gpa_mean=2, gpa_std=1),
    "tcp": dict(depth=2),
    "kdpl-coop": dict(TINY_TEACHER),
    "kdpl-cocoop": dict(TINY_TEACHER),
    "kdpl-maple": dict(n_ctx=2, depth=2, **TINY_TEACHER),
    "kdpl-promptsrc": dict(depth_text=2, depth_vision=2, **TINY_TEACHER),
    "coprompt": dict(depth=2),
    "mmrl": dict(depth=1, rep_dim=16),
    "mmrl++": dict(depth=1, rep_dim=16),
    "promptkd": dict(depth_vision=2, kd_weight=1.0, teacher_prompts="none", teacher_depth_text=2,
                     teacher_depth_vision=2, **TINY_TEACHER),
}
DESCRIBED = ("coprompt",)  # methods that read a file of class descriptions
# CoPrompt's config, and so its keys, hold the descriptions file's absolute path: one fixed path, on every side
DESCRIPTIONS = Path(tempfile.gettempdir()) / "atlas-pinned-runs" / "coprompt-descriptions.json"


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def make_data(root: Path) -> None:
    """The 8-class synthetic OxfordPets of tests/helpers.eight_class_pets, and CoPrompt's class descriptions."""
    sys.path.insert(0, str(ROOT / "tests"))
    from layouts import make_oxford_pets

    make_oxford_pets(root / "data", n_classes=8, n_train=4, n_val=2, n_test=3, size=36)
    names = [f"breed_{chr(ord('a') + i)}_cat" if i % 2 else f"dog_{chr(ord('a') + i)}" for i in range(8)]
    DESCRIPTIONS.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({n.replace("_", " "): [f"a photo of a {n.replace('_', ' ')}."] for n in names})
    if not DESCRIPTIONS.exists() or DESCRIPTIONS.read_text() != text:  # the same text whoever writes it
        part = DESCRIPTIONS.with_suffix(f".{os.getpid()}.part")
        part.write_text(text)
        os.replace(part, DESCRIPTIONS)


def options(method: str, root: Path) -> dict[str, Any] | None:
    """``method``'s small options (CoPrompt's with the descriptions file at :data:`DESCRIPTIONS`)."""
    chosen = dict(SMALL_OPTIONS.get(method, {}))
    if method in DESCRIBED:
        chosen["descriptions"] = str(DESCRIPTIONS)
    return chosen or None


def variant(setting: str, kind: str, schedule: str = "auto") -> dict[str, Any]:
    from atlas_fast.atlas.variants import label_variant

    chosen = label_variant(setting, kind, schedule)
    return dict(schedule=chosen.schedule, soft_labels=chosen.soft_labels)


def config(root: Path, case: str, **changes: Any):
    """tests/helpers.tiny_pets_config (4 shots, 2 epochs, 1 view, batch 3, lr 0.05) with content hashes, on the CPU,
    no decoding workers; each case writes its own results folder (a group's run is not skipped as finished)."""
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig

    base = dict(dataset="OxfordPets", data_root=root / "data", backbone=BackboneConfig("atlas-tiny", None), shots=4,
                seed=1, epochs=2, views=1, batch_size=3, lr=0.05, cache_root=root / "cache",
                results_dir=root / "results" / case.replace("/", "-"), progress=False, content_hash=True,
                device="cpu", workers=0)
    return TrainConfig(**{**base, **changes})


def cases(root: Path) -> list[tuple[str, list]]:
    """(case id, the configs trained as one ``run_group`` call) in a fixed order."""
    from atlas_fast.methods import METHODS

    out: list[tuple[str, list]] = []
    for method in LONE:
        out.append((f"lone/{method}", [config(root, f"lone/{method}", method=method,
                                              method_options=options(method, root))]))
    for method in BATCHED:
        out.append((f"batched/{method}", [config(root, f"batched/{method}", method=method, seed=seed,
                                                 method_options=options(method, root)) for seed in (1, 2)]))
    for method in FORKED:
        case = f"forked/{method}"
        common = dict(method=method, method_options=options(method, root), epochs=3, views=2)
        out.append((case, [config(root, case, seed=1, **common, **variant("base2new", "none")),
                           config(root, case, seed=1, **common, **variant("base2new", "csl")),
                           config(root, case, seed=1, **common, eval_every_epoch=True,
                                  **variant("base2new", "isl")),
                           config(root, case, seed=2, **common, **variant("base2new", "none"))]))
        assert METHODS[method].uses_labels
    # tests/test_pinned_runs.py's CASES
    schedules = [("atlas-csl", [dict(**variant("base2new", "csl"))]),
                 ("kgcoop-isl", [dict(method="kgcoop", setting="few_shot", **variant("few_shot", "isl"))]),
                 ("dept-coop-tfkd", [dict(method="dept-coop", **variant("base2new", "none", "tfkd"))]),
                 ("cocoop-ols", [dict(method="cocoop", **variant("base2new", "none", "ols"))]),
                 ("ivlp-depth2", [dict(method="ivlp", method_options={"depth_text": 2, "depth_vision": 2})]),
                 ("atlas-mix-batched", [dict(seed=seed, **variant("base2new", "mix")) for seed in (1, 2)])]
    for name, changes in schedules:
        out.append((f"schedule/{name}", [config(root, f"schedule/{name}", **c) for c in changes]))
    return out


# The command line's way to a group: `atlas-fast train` with several methods and seeds and --batch-runs 2 (a method
# that cannot batch trains its seeds one by one), ATLaS-CSL from its flags.
CLI_CASES = {
    "cli/train-batch-runs-2": ["--methods", "coop", "ivlp", "mmrl", "--seeds", "1", "2", "--batch-runs", "2", "--atlas",
                               "csl", "--K", "2", "--method-option", "ivlp:depth_text=2", "ivlp:depth_vision=2",
                               "mmrl:depth=1", "mmrl:rep_dim=16"],
    "cli/train-cannot-batch": ["--methods", "cocoop", "kdpl-coop", "--seeds", "1", "2", "--batch-runs", "2",
                               "--method-option", "kdpl-coop:teacher=atlas-tiny-teacher",
                               "kdpl-coop:teacher_pretrained=none"],
    "cli/train-alone": ["--methods", "cocoop", "--seeds", "1", "2", "--batch-runs", "1", "--schedule", "ols"],
}


def cli_records(root: Path, case: str, extra: list[str]) -> list[dict]:
    """``atlas-fast train`` in this process (one thread) on the tiny CLIP; its records, in file-name order."""
    from atlas_fast.cli import main

    results = root / "results" / case.replace("/", "-")
    argv = ["--threads", "1", "train", "--dataset", "OxfordPets", "--data-root", str(root / "data"), "--model",
            "atlas-tiny", "--pretrained", "none", "--shots", "4", "--epochs", "2", "--views", "1", "--batch-size", "3",
            "--lr", "0.05", "--cache-root", str(root / "cache"), "--results-dir", str(results), "--device", "cpu",
            "--workers", "0", "--content-hash", "--no-progress", *extra]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        status = main(argv)
    if status != 0:
        raise RuntimeError(f"atlas-fast {' '.join(argv)} failed: {printed.getvalue()[-2000:]}")
    records = []
    for path in sorted(results.rglob("*.json")):
        if path.with_suffix(".pt").exists():
            records.append({**json.loads(path.read_text()), "path": str(path)})
    return records


# The search's way to a group: a small study of trials batched two at a time, pruned by successive halving.
def search_trials(root: Path, case: str) -> dict[str, Any]:
    from atlas_fast.search import SearchConfig, log_uniform, run_study, uniform

    base = config(root, case, epochs=3, views=2, **variant("base2new", "isl"))
    search = SearchConfig(base=base, space={"alpha": uniform(0.1, 1.0), "lr": log_uniform(1e-3, 30.0)},
                          objective="H", n_trials=4, sampler="random", pruner="halving", batch_trials=2,
                          seeds=(1, 2), finalize=False)
    study = run_study(search, progress=False)
    return {f"trial{t.number}": dict(state=t.state.name, params=t.params, value=t.value,
                                     steps={str(k): v for k, v in sorted(t.intermediate_values.items())},
                                     epochs=t.user_attrs.get("epochs")) for t in study.trials}


def tensor_digest(tensor) -> dict[str, Any]:
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else flat
    return dict(dtype=str(tensor.dtype).replace("torch.", ""), shape=list(tensor.shape),
                sha256=hashlib.sha256(raw.numpy().tobytes()).hexdigest())


def learned_digests(value, prefix: str = "") -> dict[str, Any]:
    """sha256 of every tensor in a saved .pt (nested dicts and lists flattened to dotted names)."""
    import torch

    if isinstance(value, torch.Tensor):
        return {prefix or "<tensor>": tensor_digest(value)}
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return {prefix or "<value>": repr(value)}
    out: dict[str, Any] = {}
    for key, item in items:
        out.update(learned_digests(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


EPOCH_TIMES = ("seconds",)  # what an epoch's log holds that is a wall time, not behaviour


def epoch_values(entry: dict) -> dict[str, Any]:
    """An epoch's log without its wall times: every loss, lr, the soft-label flag, accuracies where evaluated."""
    return {k: v for k, v in entry.items() if k not in EPOCH_TIMES and "second" not in k and "time" not in k}


def summary(record: dict) -> dict[str, Any]:
    import torch

    path = Path(record["path"])
    pt = path.with_suffix(".pt")
    return dict(stem=path.stem, key=record["key"], config_key=record["config_key"], metrics=record.get("metrics"),
                reliability=record.get("reliability"), epochs=[epoch_values(e) for e in record.get("epochs", [])],
                batch_runs=record.get("timings", {}).get("batch_runs"),
                tensors=learned_digests(torch.load(pt, weights_only=True)) if pt.exists() else None)


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "?"


def run_all(out: Path, only: list[str] | None, work: Path | None) -> int:
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from atlas_fast.engine import run_group
    from atlas_fast.methods import METHODS

    uncovered = [m for m in METHODS if m not in LONE]
    if uncovered:
        print(f"note: registered methods this run set does not cover: {', '.join(uncovered)}", flush=True)
    results: dict[str, Any] = {}
    start = time.perf_counter()
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="pinned-runs-", dir=work))
    try:
        make_data(root)
        todo: list[tuple[str, Any]] = [*cases(root), *CLI_CASES.items(), ("search/tiny-study", None)]
        todo = [(case, what) for case, what in todo if not only or any(o in case for o in only)]
        for index, (case, what) in enumerate(todo, 1):
            before, began = load(), time.perf_counter()
            try:
                if case.startswith("search/"):
                    trials = search_trials(root, case)
                    results.update({f"{case}#{name}": trial for name, trial in trials.items()})
                    status = f"{len(trials)} trial(s)"
                else:
                    records = cli_records(root, case, what) if case.startswith("cli/") else run_group(what)
                    torch.set_num_threads(1)
                    for position, record in enumerate(records):
                        results[f"{case}#{position}"] = summary(record)
                    status = f"{len(records)} run(s)"
            except Exception as error:  # a run that fails is a difference too
                results[f"{case}#error"] = dict(error=f"{type(error).__name__}: {error}")
                status = f"FAILED: {type(error).__name__}: {error}"
            print(f"[{index}/{len(todo)}] {case}: {status}, {time.perf_counter() - began:.2f} s (load {before})",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = time.perf_counter() - start
    runs = sum(1 for k in results if not k.endswith("#error") and not k.startswith("search/"))
    trials = sum(1 for k in results if k.startswith("search/"))
    out.write_text(json.dumps(dict(commit=commit(), threads=torch.get_num_threads(), seconds=round(total, 1),
                                   runs=results), indent=1, sort_keys=True))
    print(f"{runs} runs and {trials} search trials in {len(todo)} cases, {total:.1f} s, written to {out}")
    return 0


def differences(a: Any, b: Any, where: str) -> list[str]:
    """Every leaf where ``a`` and ``b`` differ (exact: floats as stored), as ``field: A -> B`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            here = f"{where}.{key}" if where else str(key)
            if key not in a:
                out.append(f"{here}: (absent) -> {json.dumps(b[key])[:200]}")
            elif key not in b:
                out.append(f"{here}: {json.dumps(a[key])[:200]} -> (absent)")
            else:
                out.extend(differences(a[key], b[key], here))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b)) for line in differences(x, y, f"{where}[{i}]")]
    if a != b or type(a) is not type(b):
        return [f"{where}: {json.dumps(a)[:200]} -> {json.dumps(b)[:200]}"]
    return []


def compare(first: Path, second: Path) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (first, second))
    print(f"{first} ({a.get('commit')}) vs {second} ({b.get('commit')})")
    names = sorted(set(a["runs"]) | set(b["runs"]))
    differ = 0
    for name in names:
        if name not in a["runs"] or name not in b["runs"]:
            lines = [f"only in {first if name in a['runs'] else second}"]
        else:
            lines = differences(a["runs"][name], b["runs"][name], "")
        if lines:
            differ += 1
            print(f"{name}: {len(lines)} difference(s)")
            for line in lines:
                print(f"  {line}")
    print(f"{len(names)} runs: identical" if not differ else f"{len(names)} runs, {differ} differ")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="train the run set and write its summary here (JSON)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="print every difference")
    parser.add_argument("--work", type=Path, help="the folder the runs' temporary folder is made in (default: the "
                                                  "system's); it is removed after")
    parser.add_argument("--only", nargs="+", help="only the cases whose id contains one of these (a quick check)")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.out:
        return run_all(args.out, args.only, args.work)
    parser.error("give --out FILE or --compare A B")
    return 2


if __name__ == "__main__":
    sys.exit(main())
