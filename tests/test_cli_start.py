"""The command line starts without torch: ``--help`` of every command (every experiment module's included) and
argument errors import neither torch nor open_clip (benchmarks/cli_start.py times it)."""

import json
import subprocess
import sys

import pytest

# --help of every command and argument errors (each answers 0 or 2), run one after another in one process and checked
# after each: none may have imported torch (one process instead of one per command keeps the suite short).
ARGVS = [["--help"], ["train", "--help"], ["eval", "--help"], ["cache", "build", "--help"],
         ["demo", "--help"], ["report", "--help"], ["train", "--dataset", "OxfordPets"],
         ["train", "--dataset", "X", "--data-root", "d", "--method-option", "depth"],
         ["experiment", "--list"], ["experiment", "table9"], ["data", "check", "--help"],
         ["data", "standins", "--help"], ["data", "standins", "/nonexistent/x", "--test-fraction", "2"],
         ["data", "sort-imagenet-val", "--help"],
         ["train", "--method", "coopp"], ["train", "--dataset", "OxfordPetz"],
         ["train", "--method", "coopp", "--dataset", "OxfordPets", "--data-root", "d"],
         ["report", "/nonexistent/results"], ["experiment", "no_such_experiment"],
         ["experiment", "table_cross_dataset", "--methods", "coopp"],
         ["experiment", "table3_base_to_new"],
         ["experiment", "fig_sensitivity", "--param", "alpha", "--data-root", "/nonexistent"],
         ["experiment", "theorem1_kappa", "--kinds", "xx", "--world"],
         ["train", "--dataset", "WorldPhotos", "--data-root", "d", "--seeds", "1", "1"],
         ["demo", "--seeds", "2", "2"], ["experiment", "table3_base_to_new", "--world", "--methods", "coop", "coop"],
         ["doctor", "--help"], ["doctor", "--steps", "many"]]

EVERY_ARGV = """
import contextlib, io, sys
from atlas_fast.cli import main
for argv in {argvs!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
    heavy = sorted(m for m in ("torch", "open_clip", "h5py", "faiss") if m in sys.modules)
    print("ARGV", repr(argv), "ERR", repr(err.getvalue()[:300]), "HEAVY", ",".join(heavy) or "-", "STATUS", status)
"""


def test_help_and_argument_errors_do_not_import_torch(tmp_path):
    """... and a report on a folder without records, which names the nearest folder with one (found by the
    records' validator, which imports no torch either)."""
    (tmp_path / "results" / "demo" / "WorldPhotos").mkdir(parents=True)
    record = {"status": "finished", "key": "k" * 32, "metrics": {"base": 50.0, "zero_shot": {"base": 40.0}},
              "config": {"backbone": {"model": "atlas-world"}, "method": "coop", "method_config": {}, "shots": 2,
                         "seed": 1}, "backbone": {"fingerprint": "b" * 32}, "data": {"fingerprint": "f" * 32}}
    (tmp_path / "results" / "demo" / "WorldPhotos" / "run.json").write_text(json.dumps(record))
    argvs = ARGVS + [["report", str(tmp_path / "results")]]
    result = subprocess.run([sys.executable, "-c", EVERY_ARGV.format(argvs=argvs)], capture_output=True, text=True,
                            timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.startswith("ARGV")]
    assert len(lines) == len(argvs), (result.stdout[-1000:], result.stderr[-2000:])
    for argv, line in zip(argvs, lines):
        assert "HEAVY - STATUS" in line and line.split()[-1] in ("0", "2"), (argv, line)
    assert lines[-1].endswith("STATUS 2") and f"nearest folder with records is {tmp_path / 'results' / 'demo'}" in (
        lines[-1])


EVERY_EXPERIMENT_HELP = """
import contextlib, io, sys
from atlas_fast.cli import main
from atlas_fast.experiments import experiment_names
for name in experiment_names():
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        try:
            status = main(["experiment", name, "--help"])
        except SystemExit as exc:
            status = exc.code
    heavy = sorted(m for m in ("torch", "open_clip", "h5py", "faiss") if m in sys.modules)
    print("HELP", name, ",".join(heavy) or "-", status, "usage: atlas-fast experiment " + name in shown.getvalue())
"""


def test_every_experiments_help_does_not_import_torch():
    """``atlas-fast experiment NAME --help`` of every experiment module (one process, checked after each)."""
    from atlas_fast.experiments import experiment_names

    result = subprocess.run([sys.executable, "-c", EVERY_EXPERIMENT_HELP], capture_output=True, text=True, timeout=120)
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("HELP")]
    assert [line[1] for line in lines] == experiment_names(), (result.stdout[-1000:], result.stderr[-2000:])
    assert all(line[2:] == ["-", "0", "True"] for line in lines), lines


def test_python_m_experiments_help_does_not_import_torch():
    probe = ("import runpy, sys\nsys.argv = ['x', 'fig_sensitivity', '--help']\ntry:\n"
             "    runpy.run_module('atlas_fast.experiments', run_name='__main__')\nexcept SystemExit as exc:\n"
             "    status = exc.code\n"
             "heavy = sorted(m for m in ('torch', 'open_clip', 'h5py', 'faiss') if m in sys.modules)\n"
             "print('HEAVY', ','.join(heavy) or '-', 'STATUS', status)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "--param" in result.stdout and "HEAVY - STATUS 0" in result.stdout, (result.stdout[-500:],
                                                                              result.stderr[-2000:])


def test_a_missing_weights_file_or_data_root_is_refused_before_torch(tmp_path):
    """A ``--pretrained`` file that is not there (any command: it is checked as the line is parsed) and a data root
    without the dataset (``cache build``, ``search``, ``eval``, ``train``) are refused with status 2 before torch is
    imported. The weights hint says where such files come from and never repeats the path just typed: for a file in
    the clip package's download folder, it does not name that folder again."""
    absent = str(tmp_path / "clip" / "ViT-B-16.pt")
    data = tmp_path / "data"
    (data / "oxford_pets").mkdir(parents=True)
    record = tmp_path / "run.json"
    record.write_text("{}")
    argvs = [["train", "--dataset", "OxfordPets", "--data-root", str(data), "--pretrained", absent],
             ["experiment", "table3_base_to_new", "--datasets", "OxfordPets", "--data-root", str(data),
              "--pretrained", absent],
             ["cache", "build", "--dataset", "OxfordPets", "--data-root", str(tmp_path / "nowhere")],
             ["search", "--dataset", "OxfordPets", "--data-root", str(tmp_path / "nowhere"), "--method", "coop",
              "--param", "lr=log:1e-3:1e-2"],
             ["eval", "--record", str(record), "--dataset", "OxfordPets", "--data-root", str(tmp_path / "nowhere")],
             ["train", "--dataset", "OxfordPets", "--data-root", str(tmp_path / "nowhere")],
             *[["train", "--dataset", "OxfordPets", "--data-root", str(data), "--model", "atlas-tiny", "--pretrained",
                "none", "--method", "kdpl-coop", "--method-option", *options]
               for options in ([f"teacher_pretrained={absent}"],
                               ["class_agnostic=true", f"agnostic_classnames={tmp_path / 'names.csv'}"])],
             ["train", "--dataset", "OxfordPets", "--data-root", str(data), "--pretrained",
              "~/.cache/clip/ViT-B-16.pt"]]
    script = EVERY_ARGV.replace("[:300]", "")
    result = subprocess.run([sys.executable, "-c", script.format(argvs=argvs)], capture_output=True, text=True,
                            timeout=120, env={**__import__("os").environ, "HOME": str(tmp_path)})
    lines = [line for line in result.stdout.splitlines() if line.startswith("ARGV")]
    assert len(lines) == len(argvs), (result.stdout[-1000:], result.stderr[-2000:])
    for argv, line in zip(argvs, lines):
        assert line.endswith("HEAVY - STATUS 2"), (argv, line)
    errors = [line.split(" ERR ", 1)[1] for line in lines]
    for error in errors[:2]:
        assert error.count(absent) == 1 and "come from" in error, error
    for error in errors[2:-3]:
        assert str(tmp_path / "nowhere") in error and "not found" in error, error
    # a teacher's weights file and KDPL-CA's dictionary (--method-option) too: they were read after imports and planning
    assert "error: --method-option teacher_pretrained: the teacher's checkpoint file not found" in errors[-3]
    assert errors[-3].count(absent) == 1 and "--model" not in errors[-3], errors[-3]
    assert f"error: KDPL's class-agnostic dictionary {tmp_path / 'names.csv'} cannot be read" in errors[-2], errors[-2]
    assert errors[-1].count(".cache/clip") == 1 and "clip.load" in errors[-1], errors[-1]  # the folder named once
