"""Where the groups of a sweep train: this process, Ray tasks, or a SLURM job array through submitit.

Every executor has one method, ``map(groups)``, that trains each group (a list of compatible planned runs) with
:func:`train_specs` and yields ``(group index, records)`` as groups finish (a run that failed on its own is a
:class:`~atlas_fast.engine.record.FailedRun` among them). Workers write the records themselves, so ``results_dir``,
``cache_root`` and ``data_root`` must be visible to every worker (a shared file system on a cluster). Ray and
submitit are optional extras (``ray`` / ``slurm``), imported only here and only when their executor is used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from atlas_fast.engine.spec import RunSpec
from atlas_fast.errors import install_extra

Groups = Sequence[Sequence[RunSpec]]


@dataclass(frozen=True)
class WorkerFailure:
    """What a worker returns instead of records when the group failed on a user error (bad data, a damaged file):
    the error's one-line message, without the worker's stack."""

    message: str


def train_specs(specs: Sequence[RunSpec]) -> list[dict[str, Any]] | WorkerFailure:
    """Train one group (what a worker runs): its planned runs as one module, finished runs skipped; nothing is
    planned again."""
    from atlas_fast.engine.pipeline import run_specs
    from atlas_fast.errors import user_errors

    from atlas_fast.engine.record import FailedRun

    try:  # a run that failed on its own comes back as a FailedRun, its message only
        return [r.sendable() if isinstance(r, FailedRun) else r for r in run_specs(list(specs))]
    except user_errors() as exc:
        return WorkerFailure(f"{type(exc).__name__}: {exc}")


class LocalExecutor:
    """Train the groups one after another in this process (runs the sweep's driver has just found unfinished: they
    are not looked up again)."""

    def map(self, groups: Groups) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        from atlas_fast.engine.pipeline import run_specs

        for i, group in enumerate(groups):
            yield i, run_specs(list(group), looked_up=True)  # in this process an error keeps its type and traceback


class RayExecutor:
    """Each group is one Ray task. ``gpus_per_group`` may be fractional (0.25: four groups share a GPU); ``workers``
    caps the tasks in flight. Connects to ``address`` (a cluster, or ``auto``) or, without one and with Ray not yet
    initialised, starts a local instance with ``num_cpus`` CPUs whose workers import this process's atlas_fast."""

    def __init__(self, address: str | None = None, gpus_per_group: float = 0.0, cpus_per_group: float = 1.0,
                 workers: int | None = None, num_cpus: int | None = None) -> None:
        if gpus_per_group < 0 or cpus_per_group <= 0:
            raise ValueError(f"gpus_per_group must be >= 0 and cpus_per_group > 0, got {gpus_per_group}, "
                             f"{cpus_per_group}.")
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}.")
        self.address, self.gpus_per_group, self.cpus_per_group = address, gpus_per_group, cpus_per_group
        self.workers, self.num_cpus = workers, num_cpus

    def _init(self):
        try:
            import ray
        except ImportError as exc:
            raise ImportError(f"The ray executor needs Ray: {install_extra('ray')}") from exc
        if not ray.is_initialized():
            if self.address is not None:
                ray.init(address=self.address)
            else:
                package_root = str(Path(__file__).resolve().parents[2])
                path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
                ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": {"PYTHONPATH": path}})
        return ray

    def map(self, groups: Groups) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        ray = self._init()
        task = ray.remote(num_cpus=self.cpus_per_group, num_gpus=self.gpus_per_group)(train_specs)
        limit = self.workers or len(groups)
        pending: dict[Any, int] = {}
        queue = list(enumerate(groups))
        while queue or pending:
            while queue and len(pending) < limit:
                i, group = queue.pop(0)
                pending[task.remote(list(group))] = i
            (done,), _ = ray.wait(list(pending), num_returns=1)
            yield pending.pop(done), ray.get(done)


class SlurmExecutor:
    """One SLURM job array per sweep (one task per group) through submitit; ``folder`` holds its logs and pickles, the
    other arguments become the sbatch options. ``cluster="local"`` runs the array as local processes (submitit's
    LocalExecutor: tests and a dry rehearsal on a workstation)."""

    def __init__(self, folder: str | Path = "results/submitit", partition: str | None = None, timeout_min: int = 240,
                 gpus_per_node: int = 1, cpus_per_task: int = 4, mem_gb: int | None = None,
                 array_parallelism: int = 64, cluster: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        self.folder, self.cluster = Path(folder), cluster
        self.parameters: dict[str, Any] = {"timeout_min": timeout_min, "gpus_per_node": gpus_per_node,
                                           "cpus_per_task": cpus_per_task, "slurm_array_parallelism": array_parallelism}
        if partition is not None:
            self.parameters["slurm_partition"] = partition
        if mem_gb is not None:
            self.parameters["mem_gb"] = mem_gb
        self.parameters.update(extra or {})

    def map(self, groups: Groups) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        try:
            import submitit
        except ImportError as exc:
            raise ImportError(f"The slurm executor needs submitit: {install_extra('slurm')}") from exc
        executor = submitit.AutoExecutor(folder=self.folder, cluster=self.cluster)
        parameters = dict(self.parameters)
        if executor.cluster != "slurm":  # the local/debug executors take no slurm_* options
            parameters = {k: v for k, v in parameters.items() if not k.startswith("slurm_")}
        executor.update_parameters(name="atlas-fast-sweep", **parameters)
        jobs = executor.map_array(train_specs, [list(group) for group in groups])
        print(f"submitted {len(jobs)} group(s) as job array {jobs[0].job_id.split('_')[0] if jobs else '-'} "
              f"(logs: {self.folder})", file=sys.stderr)
        for i, job in enumerate(jobs):
            yield i, job.result()


EXECUTOR_CLASSES = {"local": LocalExecutor, "ray": RayExecutor, "slurm": SlurmExecutor}


def make_executor(name: str, **options: Any):
    """An executor by name with its options (unknown options are rejected with the valid ones)."""
    if name not in EXECUTOR_CLASSES:
        raise ValueError(f"Unknown executor {name!r}; valid: {', '.join(EXECUTOR_CLASSES)}.")
    cls = EXECUTOR_CLASSES[name]
    try:
        return cls(**options)
    except TypeError as exc:
        import inspect

        valid = [p for p in inspect.signature(cls).parameters]
        raise ValueError(f"Invalid option for the {name} executor ({exc}); valid: {valid}.") from exc
