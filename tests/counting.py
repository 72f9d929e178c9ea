"""Counts how often a process plans a run, lists a dataset, fingerprints a run's data and trains a group: one line per call is
appended to the file named by ``ATLAS_FAST_TEST_COUNTS`` (so Ray workers, other processes, count into the same file).
``install()`` is also a Ray ``worker_process_setup_hook``."""

import os

COUNTS_VARIABLE = "ATLAS_FAST_TEST_COUNTS"


def _counted(kind, function):
    def wrapper(*args, **kwargs):
        with open(os.environ[COUNTS_VARIABLE], "a") as f:
            f.write(f"{os.getpid()} {kind}\n")
        return function(*args, **kwargs)

    wrapper.counted = True
    return wrapper


def install() -> None:
    import atlas_fast.data.datasets as datasets
    import atlas_fast.data.identity as identity
    import atlas_fast.engine.pipeline as pipeline
    import atlas_fast.engine.spec as spec

    if getattr(spec.load_run_data, "counted", False):
        return
    spec.load_run_data = _counted("plan", spec.load_run_data)  # plan_run calls it once per plan
    datasets.DatasetSpec.load = _counted("listing", datasets.DatasetSpec.load)
    identity.subset_fingerprint = _counted("fingerprint", identity.subset_fingerprint)
    pipeline.train_group = _counted("train", pipeline.train_group)  # shows where the runs trained


def read(path) -> dict[str, dict[str, int]]:
    """``{"driver"|"workers": {kind: calls}}`` from the count file, ``driver`` being this process."""
    counts = {"driver": {}, "workers": {}}
    if not os.path.exists(path):
        return counts
    for line in open(path).read().splitlines():
        pid, kind = line.split()
        side = counts["driver" if int(pid) == os.getpid() else "workers"]
        side[kind] = side.get(kind, 0) + 1
    return counts
