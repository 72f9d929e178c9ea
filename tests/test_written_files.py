"""Every OS error of a write names its file, the free space is checked before the first write, a report is written
whole or not at all, ``report --verify`` names every record file the report neither used nor left out (symbolic
links too), and a report with no record left says which it left out and why (issue 44)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from atlas_fast.cli import main
from atlas_fast.files import atomic_write
from test_trust_cases import _report_records


def _full_disk(monkeypatch):
    """Every folder has 1,000 bytes free."""
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("atlas_fast.files.shutil.disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))


def test_a_write_that_fails_names_its_file_and_leaves_it_as_it_was(tmp_path):
    target = tmp_path / "results" / "record.json"
    atomic_write(target, lambda f: f.write(b"old"))
    for code, advice in ((errno.ENOSPC, "free some space or write elsewhere"),
                         (errno.EFBIG, "the file is over a file-size limit (ulimit -f)"),
                         (errno.EROFS, "the file system is read-only")):
        def fail(f, code=code):
            f.write(b"new, half")
            raise OSError(code, os.strerror(code))  # what a write to a file descriptor raises: no file named

        with pytest.raises(OSError) as caught:
            atomic_write(target, fail)
        assert caught.value.errno == code
        assert str(caught.value).startswith(f"[Errno {code}] {os.strerror(code)}: cannot write {target} ({advice}")
        assert target.read_bytes() == b"old" and sorted(p.name for p in target.parent.iterdir()) == ["record.json"]


def test_the_free_space_is_checked_before_the_first_write_of_a_run(tmp_path, monkeypatch, capsys):
    """A full disk is refused at the run's first write (its few-shot subset file, before any feature is encoded),
    naming that file, where it used to be ``[Errno 28] No space left on device`` alone."""
    from layouts import make_oxford_pets

    make_oxford_pets(tmp_path / "data", n_classes=4, n_train=3, n_val=1, n_test=2, size=8)
    _full_disk(monkeypatch)
    assert main(["train", "--dataset", "OxfordPets", "--data-root", str(tmp_path / "data"), "--model", "atlas-tiny",
                 "--pretrained", "none", "--shots", "2", "--epochs", "2", "--cache-root", str(tmp_path / "cache"),
                 "--results-dir", str(tmp_path / "results"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"error: [Errno 28] No space left on device: cannot write {tmp_path / 'cache'}" in err, err
    assert "(only 1000 bytes are free in" in err and "; free some space or write elsewhere)" in err
    assert not list(tmp_path.rglob("*.h5")) and not (tmp_path / "results").exists()


def test_a_report_that_cannot_be_written_whole_leaves_the_previous_one(tmp_path, monkeypatch):
    """A report failing part way (here its CSV over a file-size limit, after part of it was written; a plot the same
    way) leaves every file of the previous report as it was, and names the file."""
    from atlas_fast.report import collect, formats
    from atlas_fast.report.verify import verify_report

    results = tmp_path / "results"
    _report_records(results)
    collect.report_folder(results, formats=["md", "tex", "csv"])
    out = results / "report"
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert sorted(before) == ["report.csv", "report.md", "report.tex", "sources.json"]

    def too_large(path, lines, fields):
        Path(path).write_text("setting,shots\nbase2new,")
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(formats, "write_csv_lines", too_large)
    with pytest.raises(OSError) as caught:
        collect.report_folder(results, metrics=["base"], formats=["md", "tex", "csv"])  # every file would change
    assert str(caught.value) == (f"[Errno 27] File too large: cannot write {out / 'report.csv'} (the report in "
                                 f"{out} is unchanged)")
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # whole, no staging folder left
    monkeypatch.undo()
    assert verify_report(results) == []


def test_verify_names_a_record_linked_in_after_the_report(tmp_path, capsys):
    results = tmp_path / "results"
    paths = _report_records(results)
    assert main(["report", str(results), "--format", "md", "csv"]) == 0
    link = paths[0].with_name("copy-of-seed1.json")
    link.symlink_to(paths[0].name)  # the same run's record again: the report would not count it twice
    capsys.readouterr()
    assert main(["report", str(results), "--verify"]) == 1
    assert (f"verify: {link} (a symbolic link to {paths[0].name}) is not in the report (written after it?)"
            in capsys.readouterr().out)
    # a report made with the link there lists it as left out, and then verifies
    assert main(["report", str(results), "--format", "md", "csv"]) == 0
    assert f"- {link}: another record of the same run is used: " in capsys.readouterr().out
    assert main(["report", str(results), "--verify"]) == 0


def test_a_report_with_every_record_left_out_says_which_and_why(tmp_path, capsys):
    results = tmp_path / "results"
    paths = _report_records(results)[:2]
    for path in _report_records(results)[2:]:
        path.unlink()
    assert main(["report", str(results), "--format", "md", "csv"]) == 0  # a report was written before
    for path in paths:
        edited = json.loads(path.read_text())
        edited["metrics"]["new"] = 99.0
        path.write_text(json.dumps(edited))
    capsys.readouterr()
    assert main(["report", str(results)]) == 2
    err = capsys.readouterr().err
    assert (f"error: No finished result record under {results} (records are <results_dir>/<dataset>/*.json; "
            f"dataset folders with records here: OxfordPets). 2 record file(s) were left out: ") in err
    assert "2 record file(s) were left out: " in err
    for path in paths:
        assert f"{path}: not a valid finished record (its seal does not match its content" in err


def test_a_results_folder_without_room_is_refused_before_training(tmp_path, monkeypatch):
    """``ResultStore.check_writable`` (called before a group trains) refuses a folder whose records would not fit."""
    from atlas_fast.engine.record import ResultStore

    _full_disk(monkeypatch)
    with pytest.raises(OSError, match=r"\[Errno 28\] No space left on device: The results folder "
                                      rf"{tmp_path / 'results' / 'OxfordPets'} has only 1000 bytes free; free some "
                                      r"space or write elsewhere before any compute is spent"):
        ResultStore(tmp_path / "results").check_writable("OxfordPets")
