"""Issue 16's engine options on the CPU: the evaluated class sets (``evaluate``), graph_steps' refusals, cached views
on the device only on a GPU, and the GPU's default R. The GPU side itself is benchmarks/gpu_check.py's."""

import dataclasses

import pytest
import torch

from atlas_fast.atlas.schedules import Alternating, OneHot, OnlineLabelSmoothing
from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.engine import TrainConfig, run
from atlas_fast.engine.spec import evaluation_subsamples, plan_run
from atlas_fast.methods.registry import method_class
from helpers import eight_class_pets, tiny_pets_config

TINY = BackboneConfig("atlas-tiny", None)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    return eight_class_pets(tmp_path_factory, "pets")


tiny_config = tiny_pets_config


# --- evaluate: the class sets a run is evaluated on ------------------------------------------------------------------

def test_evaluating_base_and_new_leaves_out_all_and_is_the_same_run(pets):
    reported = run(tiny_config(pets, evaluate=("base", "new"), eval_every_epoch=True))
    assert set(reported["metrics"]) == {"base", "new", "H", "calibration", "zero_shot"}
    assert set(reported["metrics"]["zero_shot"]) == {"base", "new", "H"}
    assert set(reported["data"]["num_test"]) == {"base", "new"}
    assert all(set(e["accuracy"]) == {"base", "new", "H"} for e in reported["epochs"])
    # which sets are evaluated does not name the run (tests/test_run_identity.py): the default run finds this record
    # and evaluates "all" on its saved prompts; the per-epoch log keeps the sets evaluated while training
    default = run(tiny_config(pets, eval_every_epoch=True))
    assert "evaluate" not in reported["config"] and default["skipped"]
    assert reported["key"] == default["key"] and reported["path"] == default["path"]
    assert set(default["metrics"]) == {"base", "new", "all", "H", "calibration", "zero_shot"}
    for name in ("base", "new", "H"):
        assert reported["metrics"][name] == default["metrics"][name]
    assert default["epochs"] == reported["epochs"]


def test_the_default_sets_named_explicitly_are_the_default_run(pets):
    default = plan_run(tiny_config(pets))
    explicit = plan_run(tiny_config(pets, evaluate=("all", "new", "base")))
    assert explicit.config.evaluate == ("base", "new", "all")
    assert explicit.record_key == default.record_key and explicit.described == default.described
    assert list(default.data.splits) == ["base", "new", "all"]
    shuffled = plan_run(tiny_config(pets, evaluate=("new", "base")))
    assert shuffled.config.evaluate == ("base", "new") and list(shuffled.data.splits) == ["base", "new"]
    assert shuffled.record_key == plan_run(tiny_config(pets, evaluate=["base", "new"])).record_key


def test_evaluate_is_checked_when_the_config_is_made(pets):
    with pytest.raises(ValueError, match=r"within \('base', 'new', 'all'\).*'everything'"):
        tiny_config(pets, evaluate=("base", "everything"))
    with pytest.raises(ValueError, match=r"within \('base', 'new', 'all'\)"):
        tiny_config(pets, evaluate=())
    with pytest.raises(ValueError, match=r"leaves out 'base', the class set this run trains on"):
        tiny_config(pets, evaluate=("new", "all"))
    with pytest.raises(ValueError, match=r"leaves out 'all'"):
        tiny_config(pets, setting="few_shot", evaluate=("base", "new"))
    assert tiny_config(pets, evaluate="base").evaluate == ("base",)
    assert tiny_config(pets, setting="few_shot", evaluate=("new", "all")).evaluate == ("new", "all")


def test_evaluation_subsamples_follow_the_choice_except_for_class_specific_context():
    coop = method_class("coop").config_class()
    csc = dataclasses.replace(coop, csc=True, ctx_init="")
    assert evaluation_subsamples("base", coop) == ["base", "new", "all"]
    assert evaluation_subsamples("all", coop) == ["all"]
    assert evaluation_subsamples("base", coop, ("base", "new")) == ["base", "new"]
    assert evaluation_subsamples("all", coop, ("base", "all")) == ["base", "all"]
    assert evaluation_subsamples("base", csc, ("base", "new")) == ["base"]  # CSC context never leaves its classes
    assert evaluation_subsamples("base", csc) == ["base"]


BASE_TO_NEW_MODULES = {"table3_base_to_new": [], "table_a_per_dataset": [], "table_ablation": [],
                       "fig_sensitivity": ["--param", "K"], "fig1_label_smoothing": [], "fig5_new_class_curves": [],
                       "views_study": [], "table5_cost": [], "theorem1_kappa": []}


@pytest.mark.parametrize("name", sorted(BASE_TO_NEW_MODULES))
def test_base_to_new_experiments_evaluate_only_what_they_print(name, tmp_path):
    from atlas_fast.experiments import load_experiment
    from atlas_fast.experiments.common import build_parser

    module = load_experiment(name)
    args = build_parser(module).parse_args(["--data-root", str(tmp_path), "--datasets", "OxfordPets",
                                            "--seeds", "1", *BASE_TO_NEW_MODULES[name]])
    configs = module.plan(args)
    assert configs and all(c.evaluate == ("base", "new") for c in configs)


@pytest.mark.parametrize("name", ["fig_few_shot", "table_cross_dataset"])
def test_experiments_that_print_all_keep_the_default(name, tmp_path):
    from atlas_fast.experiments import load_experiment
    from atlas_fast.experiments.common import build_parser

    module = load_experiment(name)
    configs = module.plan(build_parser(module).parse_args(["--data-root", str(tmp_path), "--seeds", "1"]))
    assert configs and all(c.evaluate is None for c in configs)


# --- graph_steps: CUDA only, refused where a graph could not replay the eager step ---------------------------------

def test_graph_steps_are_refused_on_the_cpu(pets):
    with pytest.raises(ValueError, match="needs a CUDA device; this run is on cpu"):
        plan_run(tiny_config(pets, graph_steps=True, device="cpu"))


def test_graph_steps_refusals_name_the_reason():
    from atlas_fast.engine.graphs import graph_steps_refusal

    cuda = torch.device("cuda")  # a device object only: nothing runs
    coop = method_class("coop")
    assert graph_steps_refusal(coop, [OneHot(), Alternating(2)], cuda) is None
    for pixel_method in ("ivlp", "maple", "promptsrc", "dept-maple"):  # pixel steps replay like cached ones
        assert graph_steps_refusal(method_class(pixel_method), [OneHot(), Alternating(2)], cuda) is None
        assert "'ols'" in graph_steps_refusal(method_class(pixel_method), [OnlineLabelSmoothing()], cuda)
    assert "learns nothing" in graph_steps_refusal(method_class("zsclip"), [OneHot()], cuda)
    assert "'ols'" in graph_steps_refusal(coop, [OneHot(), OnlineLabelSmoothing()], cuda)


def test_train_runs_refuses_graph_steps_off_cuda():
    from atlas_fast.engine.loop import TrainingRuns, train_runs

    class Learner:
        num_runs, learns = 1, True

    with pytest.raises(ValueError, match="needs a CUDA device, not cpu"):
        train_runs(TrainingRuns(Learner(), [object()]), None, torch.device("cpu"), amp=False, graph_steps=True)


def test_graph_steps_default_to_wherever_a_graph_can_replay_the_step():
    from atlas_fast.engine.graphs import use_graph_steps

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    coop, maple = method_class("coop"), method_class("maple")
    assert use_graph_steps([None, None], coop, [OneHot(), Alternating(2)], cuda)
    assert use_graph_steps([True, None], coop, [OneHot()], cuda)
    assert not use_graph_steps([None, False], coop, [OneHot()], cuda)  # one run asks for eager steps: all eager
    assert use_graph_steps([None, None], maple, [OneHot(), Alternating(2)], cuda)
    # where no graph applies, None is eager, silently
    assert not use_graph_steps([None], maple, [OnlineLabelSmoothing()], cuda)
    assert not use_graph_steps([None], coop, [OnlineLabelSmoothing()], cuda)
    assert not use_graph_steps([None], coop, [OneHot()], cpu)
    with pytest.raises(ValueError, match="'ols'"):
        use_graph_steps([True], maple, [OnlineLabelSmoothing()], cuda)


def test_a_cpu_run_with_the_default_graph_steps_trains_eagerly(pets, recwarn):
    record = run(tiny_config(pets, seed=5, results_dir=pets / "results-default-graphs"))
    assert TrainConfig(dataset="x", data_root=".").graph_steps is None
    assert all("graphed_steps" not in epoch for epoch in record["epochs"])
    assert record["graphs"] == {"on": False}  # the record says its steps ran eagerly (sealed with the rest)
    assert not [w for w in recwarn if "graph" in str(w.message)]


def test_the_sync_debug_modes_prototype_notice_is_not_a_sync():
    from atlas_fast.engine.graphs import sync_messages

    notice = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
              "operations")
    sync = "called a synchronizing CUDA operation\nat line 3"
    assert sync_messages([notice, sync, "an unrelated warning"]) == ["called a synchronizing CUDA operation"]
    assert sync_messages([notice]) == []


def test_graph_steps_do_not_name_the_run(pets):
    assert "graph_steps" not in plan_run(tiny_config(pets)).described


# --- cached views stay on the host on the CPU; the GPU's default R ---------------------------------------------------

def test_cached_views_are_device_resident_only_on_a_gpu(pets):
    from atlas_fast.engine.feed import CachedViews, fits_on_device
    from atlas_fast.engine.spec import plan_run as plan

    assert not fits_on_device(1, torch.device("cpu"))
    spec = plan(tiny_config(pets, views=2))
    from atlas_fast.engine.feed import prepare_inputs

    inputs = prepare_inputs(spec, spec.backbone()).train_inputs
    assert isinstance(inputs, CachedViews) and not inputs.resident
    assert inputs.preloaded.device.type == "cpu" and inputs.preloaded.shape[1] == 2


def test_runs_are_batched_by_twelve_on_a_gpu():
    from atlas_fast.sweep import DEFAULT_BATCH_RUNS, Execution

    assert DEFAULT_BATCH_RUNS == {"cuda": 12, "cpu": 4}
    assert Execution().runs_per_group("cuda") == 12 and Execution(batch_runs=3).runs_per_group("cuda") == 3
