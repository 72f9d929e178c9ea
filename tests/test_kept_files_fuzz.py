"""Property-based tests of the files atlas_fast keeps for itself (the pricing calibration, the thread probe, the
stand-ins' manifest, the world's stamp) and of the ILSVRC-2012 devkit's readers: whatever bytes or JSON they hold,
a cache is a miss (measured again) and never a crash, and a devkit file is read or refused with a ``ValueError``
naming it.

Few examples each and no deadline: all of them take a second or two in the default suite.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
import warnings
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NUMBER = (st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
          | st.sampled_from([0, 1, -1, 2, 100_000, 1e300, -155.4, float("nan"), float("inf")]))
SCALAR = st.none() | st.booleans() | NUMBER | st.text(max_size=8)
JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=10)
UNIT_FIELDS = ("seconds", "fixed_seconds", "peak_host_bytes", "peak_device_bytes", "repeats", "other")
UNIT = st.dictionaries(st.sampled_from(UNIT_FIELDS), SCALAR, max_size=4) | JSON
# Whole files: JSON as written (NaN and Infinity included), deep nesting, or bytes that are not JSON at all.
FILE_TEXT = (JSON.map(json.dumps) | st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)
             | st.binary(max_size=30).map(lambda b: b.decode("latin-1")))


@FAST
@given(units=st.dictionaries(st.sampled_from(["encode", "decode", "step/coop"]), UNIT, max_size=3) | JSON,
       whole=FILE_TEXT, use_whole=st.booleans())
def test_the_calibration_store_reads_anything_as_units_or_a_miss(units, whole, use_whole):
    from atlas_fast.pricing.calibration import CALIBRATION_FILE, CalibrationStore
    from atlas_fast.pricing.timing import Unit

    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / CALIBRATION_FILE
        path.parent.mkdir()
        path.write_text(whole if use_whole else json.dumps({"ctx": units}))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store = CalibrationStore(root, "ctx")
        assert len(caught) <= 1
        for unit in store.units.values():
            assert math.isfinite(unit.seconds) and unit.seconds >= 0 and unit.repeats >= 1
        assert store.unit("encode", lambda: Unit(0.5)).seconds >= 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # what was written back reads without a warning
            assert CalibrationStore(root, "ctx").get("encode") is not None


@settings(FAST, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(entry=st.fixed_dictionaries({}, optional={"threads": SCALAR, "time": SCALAR, "seconds": JSON}) | JSON,
       whole=FILE_TEXT, use_whole=st.booleans())
def test_the_thread_probe_reads_anything_as_a_count_in_range_or_a_miss(entry, whole, use_whole, monkeypatch):
    from atlas_fast import threads

    with tempfile.TemporaryDirectory() as root:
        monkeypatch.setenv("XDG_CACHE_HOME", root)
        monkeypatch.setattr(threads, "measure_step_seconds", lambda n: {1: 0.2, 2: 0.1}[n])
        path = Path(root) / "atlas_fast" / "threads.json"
        path.parent.mkdir()
        path.write_text(whole if use_whole else json.dumps({threads._machine_key(2): entry}))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert threads.probe_threads(limit=2) in (1, 2)


@FAST
@given(files=st.dictionaries(st.sampled_from(["a.jpg", "../x", "/abs", "", "d/b.jpg"]),
                             st.none() | st.lists(SCALAR, max_size=3) | SCALAR, max_size=3) | JSON,
       keys=st.dictionaries(st.sampled_from(["dataset", "request", "complete", "format"]), JSON, max_size=2))
def test_the_standin_manifest_reads_anything_as_a_list_of_files_or_a_refusal(files, keys):
    from atlas_fast.world.standins import MANIFEST, _listed_files, _unchanged_files, read_manifest

    with tempfile.TemporaryDirectory() as root:
        folder = Path(root)
        (folder / "a.jpg").write_bytes(b"x")
        (folder / MANIFEST).write_text(json.dumps({"standin": True, **keys, "files": files}))
        manifest = read_manifest(folder)
        try:
            listed = _listed_files(folder, manifest)
            ours = _unchanged_files(folder, listed, legacy=False)
        except FileExistsError as exc:
            assert str(folder) in str(exc)
            return
        assert ours <= set(listed) and all((folder / name).resolve().is_relative_to(folder.resolve())
                                           for name in ours)


@FAST
@given(stamp=FILE_TEXT)
def test_the_world_stamp_reads_anything_as_a_match_or_not(stamp):
    from atlas_fast.world.benchmark import _stamp_matches

    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "world_stamp.json"
        path.write_text(stamp)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert _stamp_matches(path, {"seed": 0}, warn=True) in (True, False)


# ------------------------------------------------------------------------------------------- the devkit readers

FIELD_VALUE = (st.integers(-5, 2000) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=10)
               | st.sampled_from(["n01440764", "n00001740", "", "n1"]) | st.lists(st.integers(0, 3), max_size=2))
SYNSET_FIELDS = ("ILSVRC2012_ID", "WNID", "num_children", "words")


@st.composite
def meta_mats(draw) -> bytes:
    """A MATLAB file: ``synsets`` with some of the devkit's fields and values of any type, or other variables."""
    from scipy.io import savemat

    fields = draw(st.lists(st.sampled_from(SYNSET_FIELDS), unique=True, min_size=1, max_size=4))
    rows = draw(st.integers(0, 3))
    synsets = np.zeros((rows,), dtype=[(name, "O") for name in fields])
    for row in range(rows):
        synsets[row] = tuple(np.array(draw(FIELD_VALUE), dtype=object) for _ in fields)
    variables = {"synsets": synsets} if draw(st.booleans()) else {}
    if draw(st.booleans()):
        variables["other"] = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3))
    buffer = io.BytesIO()
    savemat(buffer, variables)
    return buffer.getvalue()


@FAST
@given(meta=meta_mats() | st.binary(max_size=200), cut=st.integers(0, 400))
def test_meta_mat_is_read_or_refused_naming_it(meta, cut):
    from atlas_fast.data.imagenet_val import read_synsets

    for data in (meta, meta[:cut]):  # whole, and truncated
        try:
            classes = read_synsets(data, "devkit/data/meta.mat")
        except ValueError as exc:
            assert "devkit/data/meta.mat" in str(exc)
            continue
        assert classes and all(isinstance(k, int) and v.startswith("n") and len(v) == 9 for k, v in classes.items())


@FAST
@given(truth=st.lists(st.integers(0, 1100).map(str) | st.text(alphabet="0123456789.-x \t", max_size=4),
                      max_size=8).map(lambda lines: "\n".join(lines).encode())
       | st.binary(max_size=40) | st.text(max_size=20).map(lambda t: t.encode("utf-16")))
def test_the_ground_truth_is_read_or_refused_naming_the_file(truth):
    from atlas_fast.data.imagenet_val import read_ground_truth

    try:
        ids = read_ground_truth(truth, "devkit/data/ground_truth.txt")
    except ValueError as exc:
        assert "devkit/data/ground_truth.txt" in str(exc) and len(str(exc)) < 300
        return
    assert ids and all(isinstance(i, int) and i >= 0 for i in ids)
