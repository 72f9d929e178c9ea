"""``atlas-fast doctor``: what this machine will do with atlas_fast, in about a minute, as one table a user pastes into
a bug report.

Rows: the versions (Python, torch and its CUDA, the NVIDIA driver, open_clip, faiss), the device and its memory;
then for CoOp, CoCoOp, IVLP and TCP a few training steps at small shapes: **eager steps** (finite; host traffic of
one steady-state step, :class:`~atlas_fast.engine.graphs.DispatchCount`; ms per step), **graphed = eager** (CUDA:
learned tensors bit-equal, every post-warm-up step replayed, no fallback; memory reserved) and **group = alone**
(two runs as one group against the first alone, fp32). Then the R the memory plan picks for CoOp and IVLP at
ViT-B/16 and 1,000 classes, and where faiss searches. A GPU uses ViT-B/16 with random weights under fp16 autocast;
a CPU ``atlas-tiny`` in fp32, eagerly (GPU rows say they need one). Any mismatch is a FAIL row and a non-zero exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

#: Status words of a row: the check passed, failed (the command exits non-zero), cannot run on this device, or only
#: reports.
OK, FAIL, NEEDS_GPU, INFO = "ok", "FAIL", "needs a GPU", "info"

#: The method families the doctor trains, with the method standing for each.
FAMILIES: tuple[tuple[str, str], ...] = (("cached text", "coop"), ("CoCoOp", "cocoop"), ("pixel", "ivlp"),
                                         ("Adam-based", "tcp"))
#: Classes, images per step and run, and runs of a group in the doctor's steps (small shapes: a minute in all).
CLASSES, BATCH, RUNS = 6, 4, 2
#: Largest difference of a learned tensor between a group's run and the same run alone (fp32: float reordering).
GROUP_TOLERANCE = 1e-4
#: Where the memory plan is priced: ViT-B/16 at ImageNet's classes, up to the GPU's default R.
PLAN_MODEL, PLAN_CLASSES, PLAN_METHODS = "ViT-B-16", 1000, ("coop", "ivlp")


@dataclass
class Row:
    check: str
    status: str
    measured: str = ""
    note: str = ""


@dataclass
class DoctorReport:
    """The doctor's rows, in order, and how long it took."""

    device: str
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Row]:
        return [row for row in self.rows if row.status == FAIL]

    def markdown(self) -> str:
        gpu_rows = [row.check for row in self.rows if row.status == NEEDS_GPU]
        lines = [f"## atlas-fast doctor on {self.device} ({self.seconds:.0f} s)", "",
                 "| check | status | measured | note |", "|---|---|---|---|"]
        lines += [f"| {r.check} | {r.status} | {r.measured} | {r.note} |".replace("\n", " ") for r in self.rows]
        lines.append("")
        if gpu_rows:
            lines.append(f"Rows that need a GPU (checked on a CUDA device only): {', '.join(gpu_rows)}.")
        failed = self.failed
        lines.append(f"{len(failed)} mismatch(es): " + "; ".join(r.check for r in failed) if failed
                     else "No mismatch: every check this device can run passed.")
        return "\n".join(lines)


def _guarded(rows: list[Row], check: str, function: Callable[[], list[Row]]) -> None:
    """Add ``function()``'s rows; an exception becomes one FAIL row naming it (the other checks still run)."""
    try:
        rows.extend(function())
    except Exception as exc:  # noqa: BLE001 - every failure must reach the table
        first = (str(exc).splitlines() or [""])[0][:160]
        rows.append(Row(check, FAIL, f"{type(exc).__name__}: {first}"))


# --- versions and device -------------------------------------------------------------------------------------------

def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "not installed"


def _faiss_version() -> str:
    try:
        import faiss
    except ImportError:
        return "not installed"
    return faiss.__version__


def nvidia_driver() -> str:
    """The NVIDIA driver's version from ``nvidia-smi`` (none: no driver visible)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none (no nvidia-smi)"
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({type(exc).__name__})"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"


def version_rows() -> list[Row]:
    from atlas_fast.vocabulary import GRAPH_STEPS_VARIABLE
    import os

    cuda = torch.version.cuda or "none (a CPU build)"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    graphs = os.environ.get(GRAPH_STEPS_VARIABLE, "")
    return [Row("versions", INFO,
                f"Python {platform.python_version()}, torch {torch.__version__} (CUDA {cuda}"
                + (f", cuDNN {cudnn}" if cudnn else "") + f"), NVIDIA driver {nvidia_driver()}, open_clip "
                f"{_version('open_clip_torch')}, faiss {_faiss_version()}, "
                f"atlas_fast {_version('atlas_fast')}",
                f"{platform.system()} {platform.machine()}; {GRAPH_STEPS_VARIABLE}="
                f"{graphs or 'unset (auto)'}")]


def device_rows(device: torch.device) -> list[Row]:
    from atlas_fast.cache.space import human_bytes
    from atlas_fast.engine import memory

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        return [Row("device", INFO, f"{props.name} (compute capability {props.major}.{props.minor}), "
                                    f"{human_bytes(total)} memory, {human_bytes(free)} free",
                    f"{torch.cuda.device_count()} CUDA device(s) visible; checks on {device}")]
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    total = memory.device_bytes(device)
    return [Row("device", INFO, f"CPU: {platform.processor() or platform.machine()}, {cpus} CPU(s) usable, "
                                f"{human_bytes(total) if total else 'unknown'} memory for the memory plan, "
                                f"torch threads {torch.get_num_threads()}",
                f"CUDA available to torch: {torch.cuda.is_available()}; checks on the CPU")]


def graph_setting_rows(device: torch.device) -> list[Row]:
    """What the environment's graph-steps setting does to this machine's commands: a FAIL where it makes every command
    that trains refuse to start (a value that is not auto/on/off, or on where the device has no CUDA graphs); no row
    where it leaves them alone (unset, auto, off)."""
    from atlas_fast.engine.graphs import device_refusal
    from atlas_fast.vocabulary import GRAPH_STEPS_VARIABLE, environment_graph_steps

    check = f"graph steps setting ({GRAPH_STEPS_VARIABLE})"
    try:
        asked = environment_graph_steps()
    except ValueError as exc:
        return [Row(check, FAIL, "every command that trains refuses to start", str(exc))]
    refusal = device_refusal(device) if asked else None
    if refusal:
        return [Row(check, FAIL, f"{GRAPH_STEPS_VARIABLE}=on: every command that trains on {device.type} refuses "
                                 f"to start", f"{refusal}; unset it or set it to auto or off (or pass --graph-steps)")]
    return []


# --- the method families -------------------------------------------------------------------------------------------

@dataclass
class Trained:
    """A group's training: its module (learned tensors), epoch logs, seconds, ``graph_steps`` warnings and the
    device memory the training reserved beyond what was reserved before it (CUDA)."""

    method: Any
    logs: list[list[dict[str, Any]]]
    seconds: float
    fallbacks: list[str]
    reserved: int | None


def _recipe(entry, epochs: int, steps: int):
    """Plain SGD at a visible lr (no warmup), or the method's own optimiser (TCP's Adam) with a cosine over the
    steps, at the doctor's batch size."""
    from atlas_fast.methods.config import OptimRecipe

    _, own = entry.recipe_function("paper", "base2new", 16, "ImageNet")
    if own.optimizer != "sgd":
        return dataclasses.replace(own, epochs=epochs, batch_size=BATCH, warmup_epochs=0,
                                   iterations=epochs * steps if own.iterations is not None else None)
    return OptimRecipe(epochs=epochs, batch_size=BATCH, lr=0.01, warmup_epochs=0)


def train_group(name: str, backbone, device: torch.device, runs: int, steps: int, epochs: int,
                graph_steps: bool, amp: bool, length_groups: bool) -> Trained:
    """``runs`` runs of method ``name`` as one group (run r initialised as it would be alone, with seed r; its data
    order seeded r + 1) for ``epochs`` epochs of ``steps`` full steps on random inputs shaped as the feed serves
    them, through the engine's one training loop. ``length_groups``: eager steps with a graph's class-suffix
    groups, so that they run the kernels a replay runs."""
    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.clip.text_encoder import graph_length_groups
    from atlas_fast.engine.group import stacked_method
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.engine.step import RunState
    from atlas_fast.methods.registry import method_class
    from atlas_fast.pricing.units import _SyntheticInputs, _training_inputs, method_config_for

    entry = method_class(name)
    classnames = [f"class {i}" for i in range(CLASSES)]
    config = method_config_for(name, None, backbone)
    singles = []
    for r in range(runs):
        torch.manual_seed(r)
        singles.append(entry.build(backbone, classnames, config))
    method = singles[0].to(device) if runs == 1 else stacked_method(
        entry, backbone, classnames, config, [single.state_for_checkpoint() for single in singles], device)
    inputs = _SyntheticInputs(_training_inputs(entry, backbone, BATCH * steps, device))
    labels = torch.arange(BATCH * steps) % CLASSES
    states = [RunState(inputs, labels, None, OneHot(), seed=r + 1, device=device) for r in range(runs)]
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_reserved(device)
        torch.cuda.reset_peak_memory_stats(device)
    with warnings.catch_warnings(record=True) as caught, \
            graph_length_groups() if length_groups else contextlib.nullcontext():
        warnings.simplefilter("always")
        start = time.perf_counter()
        logs = train_runs(TrainingRuns(method, states), _recipe(entry, epochs, steps), device, amp=amp,
                          progress=False, graph_steps=graph_steps)
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    reserved = torch.cuda.max_memory_reserved(device) - before if cuda else None
    fallbacks = [str(w.message) for w in caught if "graph_steps" in str(w.message)]
    fallbacks += [e["graph_fallback"] for log in logs for e in log if e.get("graph_fallback")]  # the logs say so
    return Trained(method, logs, seconds, fallbacks, reserved)


def largest_difference(a, b, run: int | None = None) -> float:
    """The largest difference of the learned tensors of ``b`` (its run ``run``, where given) against ``a``."""
    pairs = zip(a.trainable_parameters(), b.trainable_parameters())
    return max((p.detach().float().cpu() - (q.detach()[run:run + 1] if run is not None else q.detach()).float().cpu())
               .abs().max().item() for p, q in pairs)


def step_traffic(name: str, backbone, device: torch.device, amp: bool, steps: int = 3) -> tuple[float, float, int]:
    """Host traffic of one steady-state training step of ``name`` (R = 1, eager): (reads back, uploads, operators)
    per step as :class:`~atlas_fast.engine.graphs.DispatchCount` counts them, the difference between one epoch of
    ``2 * steps`` steps and one of ``steps`` divided by ``steps`` (what an epoch does once, its warm-up and its loss
    read-back included, cancels)."""
    from atlas_fast.engine.graphs import DispatchCount

    counts = []
    for n in (steps, 2 * steps):
        with DispatchCount() as count:
            train_group(name, backbone, device, 1, n, 1, graph_steps=False, amp=amp, length_groups=True)
        counts.append((count.read_backs, count.uploads, count.total))
    return tuple((b - a) / steps for a, b in zip(*counts))  # type: ignore[return-value]


def family_rows(family: str, name: str, backbone, device: torch.device, steps: int) -> list[Row]:
    """The rows of one method family: eager steps (finite, host traffic, ms per step), graphed = eager (CUDA) and
    group = alone."""
    from atlas_fast.engine import graphs as engine_graphs  # (looked up when called: the tests fake CUDA graphs)
    from atlas_fast.engine.graphs import GRAPH_WARMUP_STEPS
    from atlas_fast.engine.group import batches_runs
    from atlas_fast.methods.registry import method_class

    cuda = device.type == "cuda"
    row_name = f"{family} ({name})"
    rows: list[Row] = []
    entry = method_class(name)
    runs = RUNS if batches_runs(entry) else 1
    eager = train_group(name, backbone, device, runs, steps, 2, graph_steps=False, amp=cuda, length_groups=True)
    reads, uploads, ops = step_traffic(name, backbone, device, amp=cuda)
    traffic = reads > 0 or uploads > 0
    rows.append(Row(f"{row_name}: eager steps", FAIL if traffic else OK,
                    f"{1000 * eager.seconds / (2 * steps):.1f} ms/step (R = {runs}); host traffic per steady-state "
                    f"step: {reads:g} read(s) back, {uploads:g} upload(s) ({ops:.0f} operators)",
                    f"{CLASSES} classes, batch {BATCH}, {'fp16 autocast' if cuda else 'fp32'}; a CUDA graph can "
                    "replay no host traffic" + ("" if not traffic else ": this step would train eagerly")))
    if engine_graphs.graphs_available(device):
        graphed = train_group(name, backbone, device, runs, steps, 2, graph_steps=True, amp=cuda, length_groups=False)
        diff = largest_difference(eager.method, graphed.method)
        replayed = sum(e.get("graphed_steps", 0) for e in graphed.logs[0])
        expected = 2 * steps - GRAPH_WARMUP_STEPS
        good = diff == 0.0 and not graphed.fallbacks and replayed >= expected
        from atlas_fast.cache.space import human_bytes

        memory = (f"; {human_bytes(graphed.reserved)} reserved by the graphed steps "
                  f"({human_bytes(eager.reserved or 0)} eagerly)" if graphed.reserved is not None else "")
        rows.append(Row(f"{row_name}: graphed = eager", OK if good else FAIL,
                        f"largest learned-tensor difference {diff:.1e}; {replayed}/{2 * steps} steps replayed"
                        f"{memory}",
                        "must be 0, every step after the warm-ups replayed, no fallback"
                        + (f"; fell back: {graphed.fallbacks[0][:200]}" if graphed.fallbacks else "")))
    else:
        rows.append(Row(f"{row_name}: graphed = eager", NEEDS_GPU, "", "CUDA graphs replay on a CUDA device only"))
    if runs > 1:
        group = train_group(name, backbone, device, runs, steps, 2, graph_steps=False, amp=False, length_groups=False)
        alone = train_group(name, backbone, device, 1, steps, 2, graph_steps=False, amp=False, length_groups=False)
        diff = largest_difference(alone.method, group.method, run=0)
        rows.append(Row(f"{row_name}: group = alone", OK if diff <= GROUP_TOLERANCE else FAIL,
                        f"run 1 of a group of {runs} vs alone: largest learned-tensor difference {diff:.1e}",
                        f"fp32, eager; at most {GROUP_TOLERANCE:g} (float reordering)"))
    else:
        rows.append(Row(f"{row_name}: group = alone", INFO, "trains its runs one by one", ""))
    return rows


# --- memory plan and faiss -----------------------------------------------------------------------------------------

def plan_rows(device: torch.device) -> list[Row]:
    """The R the memory plan picks at ViT-B/16 and C = 1,000 for CoOp and IVLP on this device (the architecture is
    built on the meta device: no weights, no memory)."""
    from types import SimpleNamespace

    import open_clip

    from atlas_fast.cache.space import human_bytes
    from atlas_fast.engine import memory
    from atlas_fast.methods.registry import method_class
    from atlas_fast.sweep import DEFAULT_BATCH_RUNS

    import logging

    logging.disable(logging.WARNING)  # open_clip's notice that no pretrained weights were loaded: none are wanted
    try:
        with torch.device("meta"):
            model = open_clip.create_model(PLAN_MODEL, pretrained=None, device="meta")
    finally:
        logging.disable(logging.NOTSET)
    backbone = SimpleNamespace(model=model)
    amp = device.type == "cuda"
    total = memory.device_bytes(device)
    most = DEFAULT_BATCH_RUNS[device.type]
    fixed = memory.frozen_bytes(backbone, amp)
    parts = []
    for name in PLAN_METHODS:
        entry = method_class(name)
        _, recipe = entry.recipe_function("paper", "base2new", 16, "ImageNet")
        per_run = memory.step_bytes_per_run(entry, backbone, PLAN_CLASSES, recipe.batch_size, amp)
        r = memory.runs_that_fit(most, per_run, fixed, total, graphs=amp)  # graphed by default on CUDA
        parts.append(f"{name}: R = {r} of {most} (one run's step {human_bytes(per_run)}, batch {recipe.batch_size})")
    graphed = (f"graphed: a live graph's pool beside an eager step, {memory.GRAPHED_ACTIVATION_SETS} sets of "
               "activations per run" if amp else "eager")
    return [Row("memory plan", INFO, "; ".join(parts),
                f"{PLAN_MODEL}, C = {PLAN_CLASSES:,}, {'fp16 autocast' if amp else 'fp32'}, {graphed}; frozen CLIP "
                f"{human_bytes(fixed)}; {human_bytes(total) if total else 'unknown'} on {device.type}, "
                f"{int(100 * memory.DEVICE_SHARE)} % of it planned")]


def faiss_rows() -> list[Row]:
    """Where faiss searches: atlas_fast calls its CPU index (CSL's C x C class similarities), timed at C = 1,000."""
    import numpy as np

    try:
        import faiss
    except ImportError:
        return [Row("faiss", FAIL, "not importable", "ATLaS-CSL's class similarities need faiss-cpu")]
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    vectors = np.ascontiguousarray(np.random.default_rng(0).standard_normal((PLAN_CLASSES, 512), dtype=np.float32))
    start = time.perf_counter()
    index = faiss.IndexFlatIP(512)
    index.add(vectors)
    index.search(vectors, PLAN_CLASSES)
    seconds = time.perf_counter() - start
    return [Row("faiss", OK, f"faiss {faiss.__version__} on the CPU: C = {PLAN_CLASSES:,} class similarities in "
                             f"{1000 * seconds:.0f} ms",
                f"GPUs faiss sees: {gpus}; atlas_fast searches on the CPU (once per dataset and backbone, "
                "docs/install.md)")]


# --- the whole check -----------------------------------------------------------------------------------------------

def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__}, built for "
                         f"CUDA {torch.version.cuda or 'none'}); run `atlas-fast doctor` without --device.")
    return resolved


def run_doctor(device: str = "auto", model: str | None = None, families: Sequence[str] | None = None,
               steps: int = 4, say: Callable[[str], None] = lambda line: None) -> DoctorReport:
    """Every check on ``device`` (auto: CUDA if torch sees one); ``model``: the steps' open_clip architecture with
    random weights (default ViT-B-16 on CUDA, atlas-tiny on the CPU); ``families``: the methods to train (default
    :data:`FAMILIES`' methods); ``steps``: full steps per epoch. ``say`` hears one line per stage."""
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone

    start = time.perf_counter()
    resolved = resolve_device(device)
    cuda = resolved.type == "cuda"
    name = torch.cuda.get_device_name(resolved) if cuda else "CPU"
    report = DoctorReport(name)
    rows = report.rows
    _guarded(rows, "versions", version_rows)
    _guarded(rows, "device", lambda: device_rows(resolved))
    _guarded(rows, "graph steps setting", lambda: graph_setting_rows(resolved))
    model = model or ("ViT-B-16" if cuda else "atlas-tiny")
    backbone = load_backbone(BackboneConfig(model, None), str(resolved))
    wanted = [(family, method) for family, method in FAMILIES if families is None or method in families]
    for family, method in wanted:
        say(f"doctor: {family} ({method}) on {resolved.type}, {model} with random weights")
        _guarded(rows, f"{family} ({method})", lambda: family_rows(family, method, backbone, resolved, steps))
    say("doctor: the memory plan and faiss")
    _guarded(rows, "memory plan", lambda: plan_rows(resolved))
    _guarded(rows, "faiss", faiss_rows)
    report.seconds = time.perf_counter() - start
    return report
