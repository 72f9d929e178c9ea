"""CPU threads that fit the machine (issue 27): the CPUs this process may use (affinity, cgroup v1/v2 quota,
SLURM_CPUS_PER_TASK), the defaults under a restricted affinity, --threads and set_threads, the probe for small cached
steps (cached per machine), and that the thread count is not part of a run's identity."""

import os
import subprocess
import sys

from contextlib import nullcontext

import pytest
import torch

import atlas_fast
from atlas_fast import threads
from atlas_fast.threads import (POLICY_VARIABLE, CpuLimit, available_cpus, cgroup_cpus, command_threads,
                                measure_step_seconds, set_threads, threads_policy)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def clean_policy(monkeypatch):
    """Each test starts with no policy and none of the thread variables set; what it sets is undone."""
    for name in (*threads.THREAD_VARIABLES, threads.POLICY_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_policy", None)
    count = torch.get_num_threads()
    yield
    torch.set_num_threads(count)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in (*threads.THREAD_VARIABLES, threads.POLICY_VARIABLE,
                                                             "SLURM_CPUS_PER_TASK")}
    return {**env, **extra}


RESTRICTED = """
import os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from atlas_fast.threads import available_cpus, command_threads
limit = available_cpus()
with command_threads(None):  # what the command line does without --threads
    import torch
    print("LIMIT", limit.count, limit.source, "| TORCH", torch.get_num_threads(), "| OMP",
          os.environ["OMP_NUM_THREADS"])
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the OS has no CPU affinity")
def test_the_default_under_a_restricted_affinity_is_one_thread():
    result = subprocess.run([sys.executable, "-c", RESTRICTED], capture_output=True, text=True, timeout=120,
                            env=_clean_env(PYTHONPATH=os.pathsep.join(sys.path)))
    line = [l for l in result.stdout.splitlines() if l.startswith("LIMIT")]
    assert line, result.stderr[-2000:]
    count, source = line[0].split("|")[0].split(maxsplit=2)[1:]
    assert int(count) == 1 and line[0].endswith("| TORCH 1 | OMP 1")
    if (os.cpu_count() or 1) > 1:
        assert source.strip() == "CPU affinity"


def test_slurm_cpus_per_task_limits_the_default():
    limit = available_cpus(environ={"SLURM_CPUS_PER_TASK": "1"}, proc_cgroup=threads.Path("/nonexistent"))
    assert limit.count == 1
    if min(os.cpu_count() or 1, len(os.sched_getaffinity(0))) > 1:
        assert limit.source == "SLURM_CPUS_PER_TASK"
    assert threads.slurm_cpus({"SLURM_CPUS_PER_TASK": "x"}) is None


def _cgroup(tmp_path, proc_line, files):
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(proc_line + "\n")
    root = tmp_path / "sys_fs_cgroup"
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text + "\n")
    return root, proc


def test_cgroup_v2_quota_is_read_up_to_the_root_and_rounded_up(tmp_path):
    root, proc = _cgroup(tmp_path, "0::/kubepods/pod1", {"cpu.max": "max 100000",
                                                         "kubepods/pod1/cpu.max": "150000 100000"})
    assert cgroup_cpus(root, proc) == CpuLimit(2, "cgroup cpu.max")
    (root / "kubepods" / "cpu.max").write_text("50000 100000\n")  # a tighter quota above the process's cgroup
    assert cgroup_cpus(root, proc) == CpuLimit(1, "cgroup cpu.max")
    assert available_cpus(environ={}, cgroup_root=root, proc_cgroup=proc) == CpuLimit(1, "cgroup cpu.max")
    root, proc = _cgroup(tmp_path / "none", "0::/", {"cpu.max": "max 100000"})
    assert cgroup_cpus(root, proc) is None


def test_cgroup_v1_quota(tmp_path):
    root, proc = _cgroup(tmp_path, "4:cpu,cpuacct:/docker/abc",
                         {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "100000",
                          "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"})
    assert cgroup_cpus(root, proc) == CpuLimit(1, "cgroup cpu.cfs_quota_us")
    (root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert cgroup_cpus(root, proc) is None


def test_set_threads_applies_a_count_to_torch_and_the_environment():
    assert set_threads(1) == 1 and torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1" and threads.threads_policy() == 1
    assert atlas_fast.set_threads is set_threads
    with pytest.raises(ValueError, match="count >= 1 or 'auto', got 0"):
        set_threads(0)
    assert set_threads("auto") == available_cpus().count and threads.threads_policy() == "auto"
    assert set_threads(None) is None and threads.threads_policy() is None


def test_a_command_s_own_default_gives_way_to_the_user_s_count(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(POLICY_VARIABLE, raising=False)
    with command_threads(None, default=1):
        assert threads_policy() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with command_threads(None, default=1):
        assert threads_policy() == 2


def test_a_command_keeps_its_threads_to_itself(monkeypatch):
    torch.set_num_threads(1)
    with command_threads("2"):
        assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
    assert torch.get_num_threads() == 1 and "OMP_NUM_THREADS" not in os.environ
    assert threads.threads_policy() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's own setting is a fixed count
    with command_threads(None):
        assert threads.threads_policy() == 1


def test_the_command_line_takes_threads_anywhere_and_refuses_nonsense(tmp_path, capsys):
    from atlas_fast.cli import main

    assert main(["data", "check", "--data-root", str(tmp_path), "--datasets", "all", "--sample", "0",
                 "--threads", "1"]) == 1  # parsed (nothing there: every dataset is missing)
    capsys.readouterr()
    assert main(["--threads", "0", "report", str(tmp_path)]) == 2
    assert "error: --threads takes a count >= 1 or 'auto', got '0'" in capsys.readouterr().err


def test_deterministic_is_one_thread_anywhere_on_the_line(monkeypatch, capsys):
    import argparse

    from atlas_fast.app.thread_options import command_threads as option_threads, split_threads
    from atlas_fast.cli import main

    assert split_threads(["report", "r", "--deterministic", "--threads", "1"]) == (
        ["report", "r"], ["--deterministic", "--threads", "1"])
    seen = []
    monkeypatch.setattr("atlas_fast.threads.command_threads",
                        lambda threads, default="auto": seen.append((threads, default)) or nullcontext())
    option_threads(argparse.Namespace(threads=None, deterministic=True))
    assert seen == [("1", "auto")]
    from atlas_fast.cli import build_parser

    seen.clear()  # the demo runs one thread unless --threads says otherwise (an OMP_NUM_THREADS of the user's too)
    for argv in (["demo"], ["--threads", "2", "demo"], ["train", "--dataset", "OxfordPets", "--data-root", "d"]):
        option_threads(build_parser().parse_args(argv))
    assert seen == [(None, 1), ("2", 1), (None, "auto")]
    monkeypatch.undo()
    assert main(["report", "r", "--deterministic", "--threads", "2"]) == 2
    assert "error: --deterministic runs one CPU thread; drop --threads 2." in capsys.readouterr().err


def test_small_cached_steps_use_the_probe_only_under_auto(monkeypatch):
    monkeypatch.setattr(threads, "probe_threads", lambda: 1)
    torch.set_num_threads(2)
    with threads.small_step_threads("cpu", small_steps=True):  # no policy: torch's own count stays
        assert torch.get_num_threads() == min(2, available_cpus().count)
    monkeypatch.setattr(threads, "available_cpus", lambda: CpuLimit(1, "cgroup cpu.max"))
    with threads.small_step_threads("cpu", small_steps=True):  # ... but never above what the process may use
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    monkeypatch.setattr(threads, "available_cpus", available_cpus)
    set_threads(2)
    with threads.small_step_threads("cpu", small_steps=True):  # a fixed count stays
        assert torch.get_num_threads() == 2
    set_threads("auto")
    torch.set_num_threads(2)
    with threads.small_step_threads("cpu", small_steps=True):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with threads.small_step_threads("cpu", small_steps=False):  # pixel steps: the available CPUs
        assert torch.get_num_threads() == available_cpus().count


def test_the_probe_keeps_the_fastest_count_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    monkeypatch.setattr(threads, "measure_step_seconds",
                        lambda n: measured.append(n) or {1: 0.3, 2: 0.1, 4: 0.2}[n])
    assert threads.probe_threads(limit=4) == 2 and measured == [1, 2, 4]
    assert threads.probe_threads(limit=4) == 2 and measured == [1, 2, 4]  # kept: not measured again
    assert (tmp_path / "atlas_fast" / "threads.json").is_file()
    assert threads.probe_threads(limit=1) == 1
    monkeypatch.setattr(threads, "measure_step_seconds", measure_step_seconds)
    assert threads.measure_step_seconds(1, tokens=8, width=8, repeats=1) > 0


def test_the_thread_count_is_not_part_of_a_run(tmp_path, monkeypatch):
    from atlas_fast.engine import run
    from helpers import tiny_pets_config
    from layouts import make_oxford_pets

    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=3, n_val=1, n_test=2, size=16)
    set_threads(1)
    one = run(tiny_pets_config(tmp_path, results_dir=tmp_path / "one"))
    set_threads(2)
    two = run(tiny_pets_config(tmp_path, results_dir=tmp_path / "two"))
    assert one["key"] == two["key"] and not two["skipped"]
    for name in ("base", "new", "all"):
        assert one["metrics"][name] == pytest.approx(two["metrics"][name], abs=1e-6)



def test_the_memory_plan_on_a_cpu_honours_a_containers_cgroup_limit(tmp_path):
    """Issue 44: a memory-capped container's limit (v2 memory.max, v1 memory.limit_in_bytes), not the host's RAM,
    is the CPU's memory the planner sizes groups for; the tightest one up to the root counts."""
    import torch

    from atlas_fast.engine import memory

    cpu = torch.device("cpu")
    host = memory.device_bytes(cpu, tmp_path / "none", tmp_path / "nonexistent")
    assert host is not None and host > 1 << 28  # no cgroup file: the host's physical memory
    root, proc = _cgroup(tmp_path / "v2", "0::/kubepods/pod1", {"memory.max": "max",
                                                               "kubepods/pod1/memory.max": str(1 << 28)})
    assert threads.cgroup_memory_bytes(root, proc) == 1 << 28
    assert memory.device_bytes(cpu, root, proc) == 1 << 28
    (root / "kubepods" / "memory.max").write_text(f"{1 << 27}\n")  # a tighter limit above the process's cgroup
    assert memory.device_bytes(cpu, root, proc) == 1 << 27
    root, proc = _cgroup(tmp_path / "v1", "4:memory:/docker/abc",
                         {"memory/docker/abc/memory.limit_in_bytes": str(3 << 26)})
    assert memory.device_bytes(cpu, root, proc) == 3 << 26
    (root / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    assert threads.cgroup_memory_bytes(root, proc) is None and memory.device_bytes(cpu, root, proc) == host
    # the planner's R falls with the container's limit: 1 GiB of runs' steps fit the host, not a 256 MiB cap
    assert memory.runs_that_fit(8, 1 << 26, 0, memory.device_bytes(cpu, *_cgroup(
        tmp_path / "cap", "0::/c", {"c/memory.max": str(1 << 28)}))) == 3
