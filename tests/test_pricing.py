"""The estimator (atlas_fast.pricing): its arithmetic against a hand-worked example, the calibration store's reuse,
the cache's state subtracted, ``--estimate`` training nothing, and its errors."""

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

import atlas_fast
from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig
from atlas_fast.progress import process_seconds
from atlas_fast.pricing import calibrate, unit_keys as keys
from atlas_fast.pricing import command_units
from atlas_fast.pricing import estimate as est
from atlas_fast.pricing import facts as plan
from atlas_fast.pricing import units as measure
from atlas_fast.pricing.estimate import price
from atlas_fast.pricing.facts import EvalFacts, GroupFacts, PlanFacts
from atlas_fast.pricing.timing import Unit
from layouts import make_oxford_pets

pytestmark = pytest.mark.usefixtures("one_thread")


def hand_worked():
    """Two groups: CoOp (R = 2 runs, C = 10, batch 4, 3 epochs, 10 and 8 training images, ISL on the first run,
    3 views; base and new sets of 10 classes with 20 and 30 test images) and IVLP on pixels (R = 2 runs on the same
    training images (one training set), C = 10, batch 2, 2 epochs, 5 images each, CSL on the first, their first
    epoch shared: trained by 1 trunk run; a base set of 10 classes with 20 test images and an all set of 20 classes
    with 40, the base images among them: 40 distinct).
    5 planned runs, 1 finished; 100 features of 40 images to encode; D = 8; planning took 0.5 s."""
    coop = GroupFacts("coop", "Pets", 10, 2, 4, 3, (10, 8), (EvalFacts("base", 10, 20), EvalFacts("new", 10, 30)),
                      ("isl", None), views=3, config_digest="d")
    ivlp = GroupFacts("ivlp", "Pets", 10, 2, 2, 2, (5, 5), (EvalFacts("base", 10, 20), EvalFacts("all", 20, 40)),
                      ("csl", None), reads_pixels=True, views=2, config_digest="e", training_sets=1, test_images=40,
                      trunk_runs=1, trunk_epochs=1)
    facts = PlanFacts((coop, ivlp), runs=5, finished=1, features_to_encode=100, images_to_decode=40, embed_dim=8,
                      device="cpu", plan_seconds=0.5)
    units = {
        keys.LOAD_KEY: Unit(2.0), keys.encode_key(64): Unit(0.01), keys.DECODE_KEY: Unit(0.002, fixed_seconds=0.003),
        keys.CUT_KEY: Unit(0.002, fixed_seconds=0.003),
        keys.LOADER_KEY: Unit(0.1),
        keys.step_key("coop", 10, 4, 2, "d"): Unit(0.05, peak_host_bytes=1000),
        keys.step_key("ivlp", 10, 2, 2, "e"): Unit(0.3, peak_host_bytes=3000),
        keys.step_key("ivlp", 10, 2, 1, "e"): Unit(0.2),
        keys.overhead_key("coop", 10, "d"): Unit(0.1), keys.overhead_key("ivlp", 10, "e"): Unit(0.3),
        keys.eval_key("coop", 10, "d", 2): Unit(0.002, fixed_seconds=0.04, peak_host_bytes=1500),
        keys.eval_key("ivlp", 10, "e", 2): Unit(0.02, fixed_seconds=0.1, peak_host_bytes=2000),
        keys.eval_key("ivlp", 20, "e", 2): Unit(0.025, fixed_seconds=0.15),
        keys.eval_key("zsclip", 10): Unit(0.0001, fixed_seconds=0.01),
        keys.eval_key("zsclip", 20): Unit(0.0002, fixed_seconds=0.02),
        keys.soft_key("isl", 10, 10): Unit(0.4), keys.soft_key("csl", 10, 5): Unit(0.3),
    }
    return facts, units


def test_price_matches_the_hand_worked_example():
    """By hand (units of a group's R runs evaluated together are measured at its R):

    setup        = load 2.0 + planning 0.5                                                        = 2.5
    cache build  = 100 features x (encode 0.01 + cut 0.002) + 40 images x 0.003 (CPU: in turn)    = 1.32
    soft labels  = ISL(C=10, N=10) 0.4 + CSL(C=10, N=5) 0.3 (the plain runs have none)             = 0.7
    training     = CoOp: 3 epochs x ceil(10 / 4) = 3 steps x 0.05                                 = 0.45
                 + IVLP: ceil(5 / 2) = 3 steps per epoch, each decoding 2 images x 1 training set x
                   (0.002 + 0.003) = 0.01 (the two runs' views decoded once): epoch 0 by the trunk
                   run, 3 x (0.2 + 0.01), epoch 1 by both, 3 x (0.3 + 0.01)                          = 1.56
                 + the decoding pool, started once                                                 = 0.1    -> 2.11
    evaluation   = CoOp base: 0.04 (R = 2) + zero-shot 0.01 + 20 x 0.0001 + 20 x 0.002             = 0.092
                 + CoOp new:  0.04 + 0.01 + 30 x 0.0001 + 30 x 0.002                                = 0.113
                 + IVLP base: 0.1 + 0.01 + 20 x 0.0001 (its images are all's)                      = 0.112
                 + IVLP all:  0.15 + 0.02 + 40 x 0.0002                                            = 0.178
                 + IVLP's 40 distinct test images once: 40 x (0.025 + 0.005 decoding)              = 1.2    -> 1.695
    overhead     = 2 x 0.1 + 2 x 0.3                                                               = 0.8
    report       = none (a train command's); an experiment's: the report unit 1.5                  = 0
    process end  = none (the Python API's runs, in the caller's process)                            = 0
    total        = 9.125 s (10.625 s with the report); cache bytes = 100 x 8 x 2 (float16) = 1600
    peak host    = CoOp: max(step 1000, eval 1500) + test features (20 + 30) x 8 x 4 = 1600
                   + training views (10 + 8) x 3 views x 8 x 4 = 1728                              = 4828
                   IVLP: max(3000, 2000) + (20 + 40) x 8 x 4 = 1920 (no cached training views)    = 4920 -> 4920
    """
    facts, units = hand_worked()
    estimate = price(facts, units)
    expected = {"setup": 2.5, "cache build": 1.32, "soft labels": 0.7, "training": 2.11, "evaluation": 1.695,
                "per-run overhead": 0.8, "report": 0.0, "process end": 0.0}
    assert estimate.phases == pytest.approx(expected)
    assert estimate.total_seconds == pytest.approx(9.125)
    reported = price(dataclasses.replace(facts, report=True), {**units, keys.REPORT_KEY: Unit(1.5)})
    assert reported.phases["report"] == 1.5 and reported.total_seconds == pytest.approx(10.625)
    assert estimate.cache_bytes == 1600
    assert estimate.peak_host_bytes == 4920
    assert (estimate.runs, estimate.finished, estimate.groups) == (5, 1, 2)
    assert "| **total** | **9.1 s** |" in estimate.markdown()


def test_price_on_cuda_overlaps_decoding_with_the_encoder_and_the_steps():
    """CUDA, 2 decoding workers for the cache build and 4 for the pixel steps: cache build = 100 x max(encode 0.01,
    cut 0.002 / 2) + 40 x 0.003 / 2 = 1.06; IVLP's steps = 3 x max(0.2, 2 x 0.005 / 4) + 3 x max(0.3, ...) = 1.5, so training = 0.45 + 1.5 + 0.1 (pool) =
    2.05; IVLP's test
    images = 40 x max(0.025, 0.005 / 4) = 1.0, so evaluation = 0.205 + 0.29 + 1.0 = 1.495."""
    facts, units = hand_worked()
    facts = PlanFacts(facts.groups, 5, 1, 100, 40, 8, device="cuda", plan_seconds=0.5, decode_workers=4,
                      cache_workers=2)
    phases = price(facts, units).phases
    assert (phases["cache build"], phases["training"], phases["evaluation"]) == pytest.approx((1.06, 2.05, 1.495))


def test_on_the_cpu_decoding_overlaps_encoding_where_its_process_has_a_core_of_its_own():
    """The CPU build decodes in one process beside the encoder: with one torch thread on two cores (the demo) it has a
    core of its own, and the build costs 100 x max(encode 0.01, cut 0.002) + 40 x 0.003 = 1.12 (it was priced
    as if they took turns, 1.32: the large world build came out far above its cost); with every core taken by the
    encoder's threads they do take turns."""
    facts, units = hand_worked()
    assert price(dataclasses.replace(facts, spare_cores=True), units).phases["cache build"] == pytest.approx(1.12)
    assert price(facts, units).phases["cache build"] == pytest.approx(1.32)


def test_a_command_s_measured_start_replaces_load_and_planning():
    facts, units = hand_worked()
    facts = PlanFacts(facts.groups, 5, 1, 100, 40, 8, plan_seconds=0.5, startup_seconds=4.0)
    assert price(facts, units).phases["setup"] == 4.0


def test_process_seconds_counts_this_process_s_life():
    assert 0 < process_seconds() < 24 * 3600


def test_price_names_a_unit_that_was_not_measured():
    facts, units = hand_worked()
    del units[keys.soft_key("csl", 10, 5)]
    with pytest.raises(ValueError, match="soft/csl/C=10/N=5"):
        price(facts, units)


def test_a_dataset_whose_cache_is_full_needs_no_decode_unit():
    """After the demo filled WorldPhotos' cache, an experiment over WorldPhotos and another dataset encodes only the
    other one's features: its estimate needs (and reads) no WorldPhotos decode unit (it was a KeyError)."""
    facts, units = hand_worked()
    facts = dataclasses.replace(facts, encode_parts=(("cut/WorldPhotos", 64, 0, 0), ("cut/Other", 64, 100, 40)))
    units = {**units, "cut/Other": units[keys.CUT_KEY]}
    assert "cut/WorldPhotos" not in calibrate.needed_units(facts)
    assert price(facts, units).phases["cache build"] == pytest.approx(1.32)


def test_each_part_of_the_cache_build_is_priced_at_its_encoder_batch():
    """A 200-epoch recipe's 201 views of an image are one encoder batch, and a view costs more in a batch of 201 than
    in one of 64 (1.1-1.25x of CPU time on the world's CLIP): the large world job's build, 67,737 training views of
    337 images and 1,248 test and validation images, was priced at the unit of a batch of 64 for all of them. Now
    each part reads the unit of its batch: 2 x 201 x 0.012 + 10 x 0.01 (+ 12 images x 0.003 decoding) = 4.96 s."""
    facts, units = hand_worked()
    facts = dataclasses.replace(facts, features_to_encode=412, images_to_decode=12,
                                encode_parts=(("cut", 64, 10, 10), ("cut", 201, 402, 2)))
    units = {**units, keys.encode_key(201): Unit(0.012)}
    assert keys.encode_key(201) in calibrate.needed_units(facts)
    expected = 402 * (0.012 + 0.002) + 10 * (0.01 + 0.002) + 12 * 0.003
    assert price(facts, units).phases["cache build"] == pytest.approx(expected)


def test_the_estimate_s_encoder_batches_are_the_build_s():
    """The views per batch the price assumes (batch_views) are those the build's batcher makes of images lacking as
    many views each."""
    from atlas_fast.cache.build import _batches, batch_views

    for views in (1, 3, 6, 21, 63, 64, 65, 201):
        units = [(None, i, list(range(views))) for i in range(200)]
        assert len(_batches(units, 64)[0]) * views == batch_views(views)


def test_a_command_s_process_end_is_priced(tmp_path, monkeypatch):
    """A command's process ends after its report: Python tearing down its modules and objects took 2.2-4.1 s at load
    5.6 (1.3 s of CPU) with the engine loaded, after everything the estimate priced ("setup and report" came out at
    0.71-0.80 of its measured time). The exit unit times a fresh interpreter's end once it holds the modules, here
    one whose end waits 0.3 s; the price adds it when the runs are a command's (not for the Python API's runs)."""
    from atlas_fast.pricing.command_units import measure_exit

    (tmp_path / "slow_end.py").write_text("import atexit, time\nprint('imported', end='')\n"
                                          "atexit.register(time.sleep, 0.3)\n")  # it prints, then ends slowly
    monkeypatch.syspath_prepend(str(tmp_path))
    unit = measure_exit(["json", "slow_end", "no_such_module_here"])
    assert 0.3 <= unit.seconds < 10
    facts, units = hand_worked()
    assert keys.EXIT_KEY not in calibrate.needed_units(facts) and price(facts, units).phases["process end"] == 0
    ended = dataclasses.replace(facts, ends_process=True)
    assert calibrate.needed_units(ended)[-1] == keys.EXIT_KEY  # timed last: after what the other units load
    assert price(ended, {**units, keys.EXIT_KEY: unit}).phases["process end"] == unit.seconds


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("pricing")
    make_oxford_pets(root / "data", n_classes=4, n_train=4, n_val=1, n_test=2, size=32)
    return root


def configs(pets, where, seeds=(1, 2), **changes):
    """CoOp on the small OxfordPets, one run per seed, its cache and records under ``pets / where``."""
    return [TrainConfig("OxfordPets", pets / "data", backbone=BackboneConfig("atlas-tiny", None), shots=2, seed=seed,
                        epochs=2, batch_size=4, views=1, device="cpu", cache_root=pets / where / "cache",
                        results_dir=pets / where / "results", progress=False, **changes) for seed in seeds]


def test_a_second_estimate_measures_nothing(pets, monkeypatch):
    calls = []
    for module, name in [(measure, "measure_step"), (measure, "measure_eval"), (command_units, "measure_encode"),
                         (command_units, "measure_decode"), (measure, "measure_run_overhead"),
                         (command_units, "measure_backbone_load"), (measure, "measure_soft_labels")]:
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    first = est.estimate_configs(configs(pets, "reuse"))
    assert first.units_measured == len(calls) > 0
    assert "measure_step" in calls and "measure_encode" in calls
    count = len(calls)
    second = est.estimate_configs(configs(pets, "reuse"))
    assert len(calls) == count and second.units_measured == 0 and second.units_reused == first.units_measured
    unchanged = [phase for phase in est.PHASES if phase != "setup"]  # setup holds the planning, timed again
    assert [second.phases[p] for p in unchanged] == pytest.approx([first.phases[p] for p in unchanged])
    assert first.runs == 2 and first.groups == 1  # CoOp batches its two seeds
    store = json.loads((pets / "reuse" / "cache" / "pricing" / "calibration.json").read_text())
    assert "cut/OxfordPets" in next(iter(store.values()))  # timed on the dataset's own files


def test_evaluation_units_are_timed_in_proportion_to_the_plan_s_test_sets(pets, monkeypatch):
    """A small job's calibration is small: an evaluation unit is timed on a few times the plan's largest test set
    (at least EVAL_IMAGES_FLOOR), not on 16,384 images; a stored one timed on fewer than a later plan needs is
    measured again, one timed on enough is reused."""
    asked = []
    real = measure.measure_eval
    monkeypatch.setattr(measure, "measure_eval", lambda *a, **k: asked.append(k["max_images"]) or real(*a, **k))
    first = est.estimate_configs(configs(pets, "evals"))
    assert asked and set(asked) == {calibrate.EVAL_IMAGES_FLOOR}  # the tiny test sets: the floor
    store = json.loads((pets / "evals" / "cache" / "pricing" / "calibration.json").read_text())
    timed = [u["images"] for k, u in next(iter(store.values())).items() if k.startswith("eval/")]
    assert timed and all(0 < n for n in timed)
    asked.clear()
    est.estimate_configs(configs(pets, "evals"))
    assert asked == [] and first.units_measured > 0  # enough for the same plan: reused
    monkeypatch.setattr(calibrate, "EVAL_IMAGES_FLOOR", 4 * measure.MAX_EVAL_IMAGES)  # a plan needing more than was timed
    est.estimate_configs(configs(pets, "evals"))
    short = [n for n in timed if n < measure.MAX_EVAL_IMAGES]
    assert len(asked) == len(short) and set(asked) <= {measure.MAX_EVAL_IMAGES}


def test_zero_shot_runs_train_nothing_and_need_no_step(pets):
    estimate = est.estimate_configs(configs(pets, "zero-shot", seeds=(1,), method="zsclip"))
    assert estimate.phases["training"] == 0 and estimate.phases["evaluation"] > 0
    store = json.loads((pets / "zero-shot" / "cache" / "pricing" / "calibration.json").read_text())
    assert not [key for units in store.values() for key in units if key.startswith("step/")]


def test_features_already_cached_are_not_counted(pets, tiny):
    """2 seeds x 2 shots x 2 base classes of OxfordPets' 4: the union of their training images (views 0 and 1) and
    the 8 test images (view 0), and the few-shot validation images the runs calibrate on (view 0; they were left
    out). After the cache holds the test features, only the training and validation ones are left."""
    from atlas_fast.cache import FeatureCache
    from atlas_fast.sweep import plan_sweep

    root = pets / "subtraction"
    specs = plan_sweep(configs(pets, "subtraction"))
    train = {d.key: d for spec in specs for d in spec.data.train_split.train}
    test = specs[0].data.fewshot.test
    held_out = {d.key for spec in specs if not spec.data.fewshot.val_is_test for d in spec.data.train_split.val}
    assert held_out  # the few-shot validation split the runs calibrate on is built too
    before = plan.plan_facts(specs, 4, tiny)
    assert before.features_to_encode == 2 * len(train) + len(test) + len(held_out)
    assert before.images_to_decode == len(train) + len(test) + len(held_out)
    assert before.encode_parts == (("cut/OxfordPets", 64, before.features_to_encode, before.images_to_decode),)
    FeatureCache(root / "cache").build(tiny, "OxfordPets", test, num_views=0, progress=False)
    after = plan.plan_facts(specs, 4, tiny)
    assert after.features_to_encode == 2 * len(train) + len(held_out)
    assert after.images_to_decode == len(train) + len(held_out)


def worktree_experiments():
    """This tree's ``experiments`` package as ``atlas_fast.experiments`` (an editable install may map that name to
    another checkout)."""
    folder = Path(atlas_fast.__file__).resolve().parents[1] / "experiments"
    loaded = sys.modules.get("atlas_fast.experiments")
    if loaded is not None and Path(loaded.__file__).resolve().parent == folder:
        return
    for name in [n for n in sys.modules if n.startswith("atlas_fast.experiments")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location("atlas_fast.experiments", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["atlas_fast.experiments"] = module
    atlas_fast.experiments = module  # as an import would bind it
    spec.loader.exec_module(module)


@pytest.fixture
def quick_exit(monkeypatch):
    """The exit unit timed on a bare interpreter's end: the test process holds far more modules than a command's."""
    real = command_units.measure_exit
    monkeypatch.setattr(command_units, "measure_exit", lambda: real(["json"]))


def test_train_estimate_trains_nothing_and_writes_no_record(pets, capsys, quick_exit):
    from atlas_fast.cli import main

    root = pets / "cli"
    args = ["train", "--dataset", "OxfordPets", "--data-root", str(pets / "data"), "--model", "atlas-tiny",
            "--pretrained", "none", "--shots", "2", "--epochs", "2", "--batch-size", "4", "--views", "1",
            "--seeds", "1", "2", "--atlas", "csl", "--cache-root", str(root / "cache"), "--results-dir",
            str(root / "results"), "--no-progress", "--estimate"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "nothing was trained" in out and "| **total** |" in out and "| soft labels |" in out
    assert not list((root / "results").rglob("*.json"))
    assert not list((root / "cache").rglob("*.h5"))  # nothing encoded either


def test_experiment_estimate_trains_nothing(pets, capsys, quick_exit):
    worktree_experiments()
    from atlas_fast.experiments import table3_base_to_new
    from atlas_fast.experiments.common import run_experiment

    root = pets / "experiment"
    text = run_experiment(table3_base_to_new, [
        "--data-root", str(pets / "data"), "--datasets", "OxfordPets", "--model", "atlas-tiny", "--pretrained",
        "none", "--methods", "coop", "--seeds", "1", "--epochs", "2", "--cache-root", str(root / "cache"),
        "--results-dir", str(root / "results"), "--out", str(root / "out"), "--estimate"])
    assert "4 run(s), 0 finished" in text  # one seed x the four label variants
    assert not list((root / "results").rglob("*.json")) and not (root / "out" / "table3_base_to_new.md").exists()
    report = re.search(r"^\| report \| ([\d.]+) s \|$", text, re.M)  # the experiment's report is priced too
    assert report and float(report.group(1)) > 0
    assert re.search(r"^\| process end \| [\d.]+ s \|$", text, re.M)  # and its process's end


def test_estimate_refuses_an_empty_sweep():
    with pytest.raises(ValueError, match="no runs to price"):
        est.estimate_configs([])


def test_a_method_config_keeps_the_digest_its_stored_units_are_found_by():
    """The units a machine keeps are found by the digest of a method config's text as it was when R was a config
    field (``num_runs=1`` first): taking R out of the config changed no digest (values from the version before)."""
    from atlas_fast.methods.registry import method_class

    paper = {name: method_class(name).recipe_function("paper", "base2new", 16, "ImageNet")[0]
             for name in ("coop", "maple", "kdpl-coop")}
    assert {name: keys.config_digest(config) for name, config in paper.items()} == {
        "coop": "6a961f1666d1", "maple": "fd86e0f09d1b", "kdpl-coop": "37e9c707dde9"}
    assert keys.config_digest(method_class("zsclip").config_class()) == "808a1e7618ab"


def test_measure_step_refuses_batched_runs_of_a_method_that_does_not_batch(tiny, monkeypatch):
    from atlas_fast.methods.registry import method_class

    monkeypatch.setattr(method_class("kgcoop"), "supports_batched_runs", False)
    with pytest.raises(ValueError, match="one by one"):
        measure.measure_step(tiny, "kgcoop", ["a", "b"], batch=2, runs=2)


def test_a_pixel_group_is_planned_with_its_training_sets_its_distinct_test_images_and_the_r_that_fits(
        pets, monkeypatch):
    """Four IVLP runs (two seeds x two label variants) form one group of R = 4 with two training sets (a seed's
    variants read the same images) and the distinct test images of base, new and all; on a device too small for
    four runs' steps the planner lowers R to what fits and the plan says so."""
    from atlas_fast.atlas.schedules import Alternating
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.engine import memory
    from atlas_fast.methods.ivlp import IVLPConfig
    from atlas_fast.sweep import describe_plan, plan_sweep

    small = IVLPConfig(n_ctx_text=2, n_ctx_vision=2, depth_text=2, depth_vision=2)
    plain = configs(pets, "pixel-plan", method="ivlp", method_config=small)
    atlas = configs(pets, "pixel-plan", method="ivlp", method_config=small, schedule=Alternating(2),
                    soft_labels=soft_label_preset("base2new", "ls"))
    specs = plan_sweep(plain + atlas)
    (group,) = plan.plan_facts(specs, 4).groups
    tests = {d.impath for split in specs[0].data.splits.values() for d in split.test}
    assert (group.runs, group.training_sets, group.test_images) == (4, 2, len(tests))
    assert (group.trunk_runs, group.trunk_epochs) == (2, 1)  # a seed's plain and ATLaS runs share epoch 0
    assert group.test_images < sum(e.images for e in group.eval_sets)  # all holds base's and new's images
    backbone = specs[0].backbone()
    per_run = memory.step_bytes_per_run(specs[0].method, backbone, 2, 4, amp=False)
    room = (memory.frozen_bytes(backbone, False) + 2.5 * per_run) / memory.DEVICE_SHARE
    monkeypatch.setattr(memory, "device_bytes", lambda device: int(room))
    assert [g.runs for g in plan.plan_facts(specs, 4).groups] == [2, 2]
    assert "4 to run in 2 group(s) (R = 2, 2)" in describe_plan(specs, 4)


def test_the_memory_plan_counts_a_live_graphs_pool_beside_the_eager_steps(tiny, monkeypatch):
    """A graphed group holds two sets of a step's activations at once: the live graph's private pool and an eager
    step beside it (another key's warm-ups, a soft epoch, a ragged last batch, a re-warm). Where 12 CoOp runs at
    C = 1,000 fit eagerly, 6 fit graphed; the planner counts the pool where the group's steps will be graphed (CUDA,
    graphs not turned off) and not where they will not."""
    from types import SimpleNamespace

    import torch

    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.engine import memory
    from atlas_fast.methods.registry import method_class
    from atlas_fast.engine.group import group_size

    entry = method_class("coop")
    per_run = memory.step_bytes_per_run(entry, tiny, 1000, 32, True)
    fixed = memory.frozen_bytes(tiny, True)
    card = int((fixed + 12 * per_run) / memory.DEVICE_SHARE) + 1
    config = SimpleNamespace(graph_steps=None, schedule=OneHot())
    spec = SimpleNamespace(device=torch.device("cuda"), method=entry, method_config=None, backbone=lambda: tiny,
                           amp=True, config=config,
                           data=SimpleNamespace(train_split=SimpleNamespace(num_classes=1000)),
                           optim_recipe=SimpleNamespace(batch_size=32))
    monkeypatch.setattr(memory, "device_bytes", lambda device: card)
    assert group_size(spec, 12) == 6
    config.graph_steps = False  # --graph-steps off: eager steps only
    assert group_size(spec, 12) == 12
    assert memory.runs_that_fit(12, per_run, fixed, card) == 12
    assert memory.runs_that_fit(12, per_run, fixed, card, graphs=True) == 6


def test_the_run_and_its_estimate_count_the_groups_that_train_alike(pets, monkeypatch):
    """A method that does not batch runs trains each seed as its own group: the dry-run listing, the run's progress
    line and the estimate all say so from one function (``group_runs``); the run said '3 to train in 1 group(s)
    (R = 1)' where the estimate said 3 groups."""
    from atlas_fast.methods.registry import method_class
    from atlas_fast.engine.group import group_runs
    from atlas_fast.sweep import describe_plan, plan_sweep

    monkeypatch.setattr(method_class("coop"), "supports_batched_runs", False)
    specs = plan_sweep(configs(pets, "unbatched", seeds=(1, 2, 3)))
    assert [len(group) for group in group_runs(specs, 4)] == [1, 1, 1]
    assert "3 to run in 3 group(s) (R = 1, 1, 1)" in describe_plan(specs, 4)
    assert len(plan.plan_facts(specs, 4).groups) == 3
