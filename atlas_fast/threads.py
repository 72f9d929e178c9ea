"""Intra-op CPU threads that fit the machine: how many CPUs this process may use (:func:`available_cpus`), the
default count, a short probe for small cached steps (:func:`probe_threads`), and :func:`set_threads`. The policy
and why it exists (torch ignores CPU quotas, and small cached steps suffer most on a shared machine) are in
docs/threads.md.

No count above the available CPUs reaches torch (a fixed count is lowered to them, with a warning): an absurd one
(100,000 threads) would crash the process. The thread count is not part of a run's identity: it changes no record
name, and the numbers only up to float reordering in parallel reductions.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from atlas_fast.files import JsonFileError, atomic_write, read_json

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: Set to the policy by :func:`set_threads`, so worker processes (Ray, SLURM, spawned) follow it.
POLICY_VARIABLE = "ATLAS_FAST_THREADS"
PROBE_MAX_AGE_S = 24 * 3600
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class CpuLimit:
    """A number of CPUs and what set it (``affinity``, ``cgroup cpu.max``, ``SLURM_CPUS_PER_TASK``, ...)."""

    count: int
    source: str


def affinity_cpus() -> int | None:
    """CPUs in this process's affinity mask (``taskset``, SLURM's binding), or None where the OS has no mask."""
    getter = getattr(os, "sched_getaffinity", None)
    return len(getter(0)) if getter is not None else None


def _cgroup_paths(proc_cgroup: Path) -> dict[str, str]:
    """``{controller or "": path}`` of this process's cgroups (v2: the ``""`` entry)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _ancestors(root: Path, path: str) -> list[Path]:
    """``root/path`` and each of its parents up to ``root`` (a quota anywhere above applies)."""
    parts = [p for p in path.strip("/").split("/") if p]
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> CpuLimit | None:
    """The CPU quota of this process's cgroup (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``),
    rounded up to whole CPUs; the tightest one from its cgroup up to the root; None without a quota."""
    paths = _cgroup_paths(proc_cgroup)
    quotas: list[tuple[float, str]] = []
    if "" in paths:  # cgroup v2
        for folder in _ancestors(root, paths[""]):
            text = _read(folder / "cpu.max")
            if text and not text.startswith("max"):
                quota, _, period = text.partition(" ")
                quotas.append((int(quota) / int(period or 100_000), "cgroup cpu.max"))
    for controller in ("cpu", "cpu,cpuacct"):  # cgroup v1: the cpu controller's mount
        if "cpu" not in paths:
            break
        for folder in _ancestors(root / controller, paths["cpu"]):
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            if quota and period and int(quota) > 0:
                quotas.append((int(quota) / int(period), "cgroup cpu.cfs_quota_us"))
    if not quotas:
        return None
    cpus, source = min(quotas)
    return CpuLimit(max(1, math.ceil(cpus - 1e-9)), source)


def cgroup_memory_bytes(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``): the tightest one
    from its cgroup up to the root, None without a limit (``max``, or v1's "unlimited", a value near 2**63). A
    container's limit is what a CPU run may use, not the host's physical memory."""
    paths = _cgroup_paths(proc_cgroup)
    limits: list[int] = []
    folders = _ancestors(root, paths[""]) if "" in paths else []  # cgroup v2
    if "memory" in paths:  # cgroup v1: the memory controller's mount
        folders += [folder for folder in _ancestors(root / "memory", paths["memory"])]
    for folder in folders:
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = _read(folder / name)
            if text and text.isdigit() and 0 < int(text) < 1 << 60:
                limits.append(int(text))
    return min(limits) if limits else None


def slurm_cpus(environ: Mapping[str, str] = os.environ) -> int | None:
    """``SLURM_CPUS_PER_TASK`` when it is a positive whole number."""
    value = environ.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def cpu_limits(environ: Mapping[str, str] = os.environ, cgroup_root: Path = CGROUP_ROOT,
               proc_cgroup: Path = PROC_CGROUP) -> list[CpuLimit]:
    """Every limit on the CPUs this process may use, the machine's CPU count first."""
    limits = [CpuLimit(os.cpu_count() or 1, "CPUs of the machine")]
    affinity = affinity_cpus()
    if affinity is not None:
        limits.append(CpuLimit(affinity, "CPU affinity"))
    quota = cgroup_cpus(cgroup_root, proc_cgroup)
    if quota is not None:
        limits.append(quota)
    slurm = slurm_cpus(environ)
    if slurm is not None:
        limits.append(CpuLimit(slurm, "SLURM_CPUS_PER_TASK"))
    return limits


def available_cpus(environ: Mapping[str, str] = os.environ, cgroup_root: Path = CGROUP_ROOT,
                   proc_cgroup: Path = PROC_CGROUP) -> CpuLimit:
    """The CPUs this process may use: the tightest of :func:`cpu_limits`."""
    return min(cpu_limits(environ, cgroup_root, proc_cgroup), key=lambda limit: limit.count)


# ------------------------------------------------------------------------------------------------------------ policy

_policy: int | str | None = None  # None: untouched; "auto"; or a fixed count


def parse_threads(value: str | int | None) -> int | str | None:
    """``"auto"``, a count >= 1 (as an int), or None; anything else is a ``ValueError`` naming the value."""
    if value is None or value == "auto":
        return value
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or str(value).strip() != str(count):
        raise ValueError(f"threads takes a count >= 1 or 'auto', got {value!r}.")
    return count


def set_threads(threads: int | str | None = "auto") -> int | None:
    """Set this process's intra-op thread policy and apply it: a count, or ``"auto"`` (:func:`available_cpus`; small
    cached steps then use :func:`probe_threads`' count); None restores "not set". A count above the available CPUs is
    lowered to them, with a warning. Sets ``OMP_NUM_THREADS`` (and MKL's, OpenBLAS's) for later workers, and torch's
    count if torch is imported; returns the count now in force (None when not set)."""
    global _policy
    threads = parse_threads(threads)
    if isinstance(threads, int):
        available = available_cpus()
        if threads > available.count:
            warnings.warn(f"{threads} threads asked for, but this process may use {available.count} CPU(s) "
                          f"({available.source}); using {available.count}.", stacklevel=2)
            threads = available.count
    _policy = threads
    if threads is None:
        os.environ.pop(POLICY_VARIABLE, None)
        return None
    count = available_cpus().count if threads == "auto" else threads
    os.environ[POLICY_VARIABLE] = str(threads)
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(count)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(count)
    return count


def threads_policy() -> int | str | None:
    """The policy in force: set in this process, or inherited from the process that started it."""
    if _policy is not None:
        return _policy
    inherited = os.environ.get(POLICY_VARIABLE)
    try:
        return parse_threads(inherited)
    except ValueError:
        return None


@contextlib.contextmanager
def command_threads(threads: str | int | None, default: str | int = "auto") -> Iterator[None]:
    """The thread policy of one command-line command, applied before torch is imported: ``--threads`` as given, else
    the policy inherited from a parent atlas_fast process, else the user's ``OMP_NUM_THREADS`` as a fixed count, else
    the command's ``default``. The policy, the environment and torch's count are restored when the command returns."""
    global _policy
    if threads is None:
        user = os.environ.get("OMP_NUM_THREADS", "")
        inherited = os.environ.get(POLICY_VARIABLE)
        threads = inherited or (user if user.isdigit() and int(user) > 0 else default)
    saved_policy = _policy
    saved_environ = {name: os.environ.get(name) for name in (*THREAD_VARIABLES, POLICY_VARIABLE)}
    torch = sys.modules.get("torch")
    saved_count = torch.get_num_threads() if torch is not None else None
    set_threads(threads)
    try:
        yield
    finally:
        _policy = saved_policy
        for name, value in saved_environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(saved_count if saved_count is not None else available_cpus().count)


# ------------------------------------------------------------------------------------------------------------- probe

def _probe_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "atlas_fast" / "threads.json"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` where there is none): part of every key
    that stores a measurement made on this machine."""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor()


def _machine_key(limit: int) -> str:
    import torch

    return f"{platform.node()}|{cpu_model()}|{limit} cpus|torch {torch.__version__}"


def measure_step_seconds(threads: int, tokens: int = 256, width: int = 256, repeats: int = 3) -> float:
    """Median seconds of one small cached step (a two-layer MLP forward and backward over ``tokens`` x ``width``
    activations, the size of a prompt learner's step on cached features) at ``threads`` intra-op threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, width, generator=generator)
        first = torch.randn(width, 4 * width, generator=generator, requires_grad=True)
        second = torch.randn(4 * width, width, generator=generator, requires_grad=True)

        def step() -> None:
            loss = (torch.nn.functional.gelu(x @ first) @ second).square().mean()
            loss.backward()

        step()
        times = []
        for _ in range(repeats):
            clock = time.perf_counter()
            for _ in range(2):
                step()
            times.append(time.perf_counter() - clock)
        return sorted(times)[len(times) // 2] / 2
    finally:
        torch.set_num_threads(previous)


def _probe_problem(entry: Any, limit: int, now: float) -> str | None:
    """What makes a stored probe unusable (None: it is sound): ``threads`` a whole number in [1, limit], ``time`` a
    finite time that is not in the future."""
    if not isinstance(entry, dict):
        return f"the entry is {type(entry).__name__}, not an object"
    count, when = entry.get("threads"), entry.get("time")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= limit:
        return f"threads is {str(count)[:20]!r}, not a whole number in [1, {limit}]"
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when) or when > now + 60:
        return f"time is {str(when)[:20]!r}, not a time before now"
    return None


def _read_probes(path: Path) -> dict[str, Any]:
    """The stored probes (key -> entry), or {} with a warning naming the file when it is not a JSON object."""
    if not path.is_file():
        return {}
    try:
        stored = read_json(path)
    except JsonFileError as exc:
        warnings.warn(f"thread probe cache {exc}; measuring again.", stacklevel=3)
        return {}
    if not isinstance(stored, dict):
        warnings.warn(f"thread probe cache {path} is not a JSON object; measuring again.", stacklevel=3)
        return {}
    return stored


def probe_threads(limit: int | None = None) -> int:
    """The thread count (1, 2, 4, ... up to ``limit``, default :func:`available_cpus`) whose small cached step
    measures fastest now; kept per machine for a day (a busy machine at probe time biases it low). A stored entry of
    the wrong type or range is measured again, with a warning."""
    limit = available_cpus().count if limit is None else limit
    if limit <= 1:
        return 1
    key = _machine_key(limit)
    path = _probe_cache_path()
    stored = _read_probes(path)
    now = time.time()
    if key in stored:
        problem = _probe_problem(stored[key], limit, now)
        if problem is None and now - stored[key]["time"] < PROBE_MAX_AGE_S:
            return stored[key]["threads"]
        if problem is not None:
            warnings.warn(f"thread probe cache {path}: {problem}; measuring again.", stacklevel=2)
    candidates = sorted({min(2 ** i, limit) for i in range(limit.bit_length() + 1)})
    seconds = {n: measure_step_seconds(n) for n in candidates}
    best = min(candidates, key=lambda n: seconds[n])
    stored[key] = {"threads": best, "time": time.time(), "seconds": {str(n): s for n, s in seconds.items()}}
    text = json.dumps(stored, indent=1).encode()
    try:
        atomic_write(path, lambda f: f.write(text))
    except OSError:
        pass  # an unwritable cache folder only means probing again next time
    return best


@contextlib.contextmanager
def small_step_threads(device_type: str, small_steps: bool) -> Iterator[None]:
    """Within the block (a group's training loop), the thread count for its steps: under ``"auto"``, the probe's
    count for small cached steps on the CPU; with no policy set, torch's own count, but never more than the CPUs
    this process may use (a container's quota, a SLURM allocation); a fixed count stays. Restored afterwards."""
    policy = threads_policy()
    if isinstance(policy, int) or device_type != "cpu":
        yield
        return
    import torch

    previous = torch.get_num_threads()
    available = available_cpus().count
    if policy == "auto":
        count = probe_threads() if small_steps else available
    else:
        count = previous
    torch.set_num_threads(max(1, min(count, available)))
    try:
        yield
    finally:
        torch.set_num_threads(previous)
