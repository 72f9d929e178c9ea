"""The command line starts without torch: ``--help`` of every command and argument errors import neither torch nor
open_clip (benchmarks/cli_start.py times it)."""

import subprocess
import sys

import pytest

PROBE = """
import sys
from atlas_fast.cli import main
try:
    status = main({argv!r})
except SystemExit as exc:
    status = exc.code
heavy = sorted(m for m in ("torch", "open_clip", "h5py", "faiss") if m in sys.modules)
print("HEAVY", ",".join(heavy) or "-", "STATUS", status)
"""


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"], ["cache", "build", "--help"],
                                  ["demo", "--help"], ["report", "--help"], ["train", "--dataset", "OxfordPets"],
                                  ["train", "--dataset", "X", "--data-root", "d", "--method-option", "depth"],
                                  ["experiment", "--list"], ["experiment", "table9"], ["data", "check", "--help"],
                                  ["data", "sort-imagenet-val", "--help"],
                                  ["train", "--method", "coopp"], ["train", "--dataset", "OxfordPetz"],
                                  ["train", "--method", "coopp", "--dataset", "OxfordPets", "--data-root", "d"],
                                  ["report", "/nonexistent/results"], ["experiment", "no_such_experiment"]])
def test_help_and_argument_errors_do_not_import_torch(argv):
    result = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                            timeout=60)
    line = [l for l in result.stdout.splitlines() if l.startswith("HEAVY")]
    assert line and line[0].startswith("HEAVY - STATUS"), (result.stdout[-500:], result.stderr[-2000:])
    assert line[0].split()[-1] in ("0", "2"), line


def test_the_train_flags_offer_the_atlas_packages_variants():
    """``train``'s --atlas/--schedule choices are spelled in the command module (so parsing imports no torch): they
    must be the ATLaS package's."""
    from atlas_fast.cli import train
    from atlas_fast.atlas import variants

    assert train.SOFT_CHOICES == variants.SOFT_CHOICES and train.SCHEDULE_CHOICES == variants.SCHEDULE_CHOICES


def test_report_on_a_folder_without_records_does_not_import_torch(tmp_path):
    (tmp_path / "results" / "demo" / "WorldPhotos").mkdir(parents=True)
    (tmp_path / "results" / "demo" / "WorldPhotos" / "run.json").write_text('{"config": {}, "metrics": {}}')
    result = subprocess.run([sys.executable, "-c", PROBE.format(argv=["report", str(tmp_path / "results")])],
                            capture_output=True, text=True, timeout=60)
    assert "HEAVY - STATUS 2" in result.stdout, (result.stdout[-500:], result.stderr[-2000:])
    assert "results/demo" in result.stderr
