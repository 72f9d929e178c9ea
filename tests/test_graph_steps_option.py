"""``--graph-steps auto|on|off`` on every command that trains (train, search, experiment, demo), declared once, and the
environment variable scripts set instead (the flag wins over it; a bad value is refused naming the variable)."""

import pytest

from atlas_fast.app.options import train_config
from atlas_fast.cli import build_parser, main
from atlas_fast.vocabulary import GRAPH_STEPS, GRAPH_STEPS_VARIABLE, environment_graph_steps

DATA = ["--data-root", "data", "--model", "atlas-tiny", "--pretrained", "none"]
COMMANDS = {
    "train": ["train", "--dataset", "OxfordPets", *DATA],
    "search": ["search", "--datasets", "OxfordPets", *DATA, "--param", "lr=log:1e-4:1e-1"],
}


@pytest.fixture(autouse=True)
def no_variable(monkeypatch):
    monkeypatch.delenv(GRAPH_STEPS_VARIABLE, raising=False)


def command_config(argv):
    """The TrainConfig a command's words give (parsed as the command line does; nothing trains)."""
    return train_config(build_parser().parse_args(argv), dataset="OxfordPets", data_root="data", method="coop")


def experiment_config(argv):
    from atlas_fast.experiments import load_experiment
    from atlas_fast.experiments.common import base_config, build_parser as experiment_parser

    args = experiment_parser(load_experiment("table3_base_to_new")).parse_args(["--data-root", "data", *argv])
    return base_config(args, "base2new", method="coop")


def demo_config(monkeypatch, argv):
    """The DemoConfig ``atlas-fast demo`` hands :func:`run_demo` (which is replaced: nothing runs)."""
    import atlas_fast.app.demo as demo

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda config, progress=True: seen.append(config) or "")
    assert main(["demo", *argv]) == 0
    return seen[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("choice", sorted(GRAPH_STEPS))
def test_train_and_search_take_the_flag(command, choice):
    assert command_config(COMMANDS[command] + ["--graph-steps", choice]).graph_steps is GRAPH_STEPS[choice]


@pytest.mark.parametrize("choice", sorted(GRAPH_STEPS))
def test_experiments_take_the_flag(choice):
    assert experiment_config(["--graph-steps", choice]).graph_steps is GRAPH_STEPS[choice]


@pytest.mark.parametrize("choice", sorted(GRAPH_STEPS))
def test_demo_takes_the_flag(monkeypatch, choice):
    config = demo_config(monkeypatch, ["--graph-steps", choice])
    assert config.graph_steps is GRAPH_STEPS[choice]


def test_the_demo_hands_its_choice_to_every_run(monkeypatch, tmp_path):
    """DemoConfig.graph_steps reaches the TrainConfig its grid starts from."""
    import atlas_fast.app.demo as demo
    import atlas_fast.sweep as sweep
    import atlas_fast.world.benchmark as benchmark

    class Stop(Exception):
        pass

    def grid(base, *args, **kwargs):
        raise Stop(base.graph_steps)

    monkeypatch.setattr(benchmark, "generate_benchmark", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "run_grid", grid)
    with pytest.raises(Stop) as stopped:
        demo.run_demo(demo.DemoConfig(data_root=tmp_path, graph_steps=False), progress=False)
    assert stopped.value.args == (False,)


def test_the_variable_sets_the_default_of_every_command(monkeypatch):
    monkeypatch.setenv(GRAPH_STEPS_VARIABLE, "off")
    assert command_config(COMMANDS["train"]).graph_steps is False
    assert command_config(COMMANDS["search"]).graph_steps is False
    assert experiment_config([]).graph_steps is False
    assert demo_config(monkeypatch, []).graph_steps is False
    monkeypatch.setenv(GRAPH_STEPS_VARIABLE, " ON ")  # spaces and case do not matter
    assert command_config(COMMANDS["train"]).graph_steps is True


def test_the_flag_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv(GRAPH_STEPS_VARIABLE, "off")
    assert command_config(COMMANDS["train"] + ["--graph-steps", "auto"]).graph_steps is None
    assert command_config(COMMANDS["search"] + ["--graph-steps", "on"]).graph_steps is True
    assert experiment_config(["--graph-steps", "auto"]).graph_steps is None
    assert demo_config(monkeypatch, ["--graph-steps", "on"]).graph_steps is True


def test_without_flag_or_variable_graphs_are_auto():
    assert command_config(COMMANDS["train"]).graph_steps is None
    assert environment_graph_steps({GRAPH_STEPS_VARIABLE: ""}) is None


def test_library_configs_follow_the_variable_too(monkeypatch):
    """A script that builds its TrainConfig in Python is switched by the same variable (read when the config is
    made); an explicit field wins."""
    from atlas_fast.engine.config import TrainConfig

    monkeypatch.setenv(GRAPH_STEPS_VARIABLE, "off")
    assert TrainConfig("OxfordPets", "data").graph_steps is False
    assert TrainConfig("OxfordPets", "data", graph_steps=None).graph_steps is None


def test_a_bad_variable_is_refused_naming_it_and_the_valid_values(monkeypatch, capsys):
    monkeypatch.setenv(GRAPH_STEPS_VARIABLE, "sometimes")
    import atlas_fast.app.demo as demo

    monkeypatch.setattr(demo, "run_demo", lambda config, progress=True: pytest.fail("the demo ran"))
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert f"environment variable {GRAPH_STEPS_VARIABLE}='sometimes' is not a --graph-steps choice" in err
    assert "valid: auto, on, off" in err
    with pytest.raises(ValueError, match=GRAPH_STEPS_VARIABLE):
        command_config(COMMANDS["train"])
    # the flag given, the variable is not read
    assert command_config(COMMANDS["train"] + ["--graph-steps", "off"]).graph_steps is False


@pytest.mark.parametrize("argv", [["train", "--help"], ["search", "--help"], ["demo", "--help"]])
def test_help_says_the_default_and_the_variable(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    text = " ".join(capsys.readouterr().out.split())
    assert "--graph-steps {auto,on,off}" in text
    assert "for every method, cached or pixel, wherever the device is CUDA" in text
    assert f"Default: the {GRAPH_STEPS_VARIABLE} environment variable" in text


def test_a_studys_rerun_line_keeps_its_choice():
    """The `atlas-fast train` line a search prints for its best configuration keeps --graph-steps when the study
    set it (flag or variable); auto is the default and is left out."""
    from atlas_fast.engine.config import TrainConfig
    from atlas_fast.search.outputs import command_line

    assert "--graph-steps off" in command_line(TrainConfig("OxfordPets", "data", graph_steps=False), [1])
    assert "--graph-steps on" in command_line(TrainConfig("OxfordPets", "data", graph_steps=True), [1])
    assert "--graph-steps" not in command_line(TrainConfig("OxfordPets", "data", graph_steps=None), [1])
