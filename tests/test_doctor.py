"""``atlas-fast doctor`` on the CPU: the tiny model's eager checks pass (exit 0) and say which rows need a GPU; a
mismatch (a group's run unlike the run alone, host traffic inside a step) is a FAIL row and a non-zero exit."""

import pytest
import torch

from atlas_fast.cli import main
from atlas_fast.cli.doctor import MISMATCH_STATUS
from helpers import fake_cuda_streams

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # the whole doctor: 4 families (7 s here at load 8; the default run checks one family below)
def test_the_cpu_run_passes_and_names_the_rows_that_need_a_gpu(capsys):
    assert main(["doctor", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## atlas-fast doctor on CPU (")
    assert "| check | status | measured | note |" in out
    for family in ("cached text (coop)", "CoCoOp (cocoop)", "pixel (ivlp)", "Adam-based (tcp)"):
        assert f"| {family}: eager steps | ok | " in out
        assert f"| {family}: graphed = eager | needs a GPU |" in out
        assert f"| {family}: group = alone | ok | " in out
    assert "host traffic per steady-state step: 0 read(s) back" in out
    assert "| versions | info | Python " in out and "torch " + torch.__version__ in out
    assert "| memory plan | info | coop: R = " in out and "ViT-B-16, C = 1,000" in out
    assert "| faiss | ok | faiss " in out and "on the CPU" in out
    assert "Rows that need a GPU (checked on a CUDA device only): cached text (coop): graphed = eager" in out
    assert out.rstrip().endswith("No mismatch: every check this device can run passed.")


def test_one_family_on_the_cpu_passes(capsys):
    assert main(["doctor", "--device", "cpu", "--methods", "ivlp", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "| pixel (ivlp): eager steps | ok | " in out and "| pixel (ivlp): graphed = eager | needs a GPU |" in out
    assert "| pixel (ivlp): group = alone | ok | run 1 of a group of 2 vs alone" in out
    assert "coop" not in out.split("| memory plan")[0]  # the family asked for, only
    assert out.rstrip().endswith("No mismatch: every check this device can run passed.")


def test_a_graph_steps_setting_that_refuses_every_run_here_fails_the_doctor(monkeypatch):
    """ATLAS_FAST_GRAPH_STEPS=on on a CPU, or a value that is not auto/on/off, makes every command that trains refuse
    to start: the doctor says so in a FAIL row (it printed the value and 'No mismatch'); unset, auto and off add no
    row."""
    from atlas_fast.app.doctor import FAIL, graph_setting_rows

    cpu = torch.device("cpu")
    for value in ("", "auto", "off", "OFF"):
        monkeypatch.setenv("ATLAS_FAST_GRAPH_STEPS", value)
        assert graph_setting_rows(cpu) == []
    monkeypatch.setenv("ATLAS_FAST_GRAPH_STEPS", "on")
    [row] = graph_setting_rows(cpu)
    assert row.status == FAIL and "every command that trains on cpu refuses to start" in row.measured
    assert "needs a CUDA device" in row.note and "unset it or set it to auto or off" in row.note
    assert graph_setting_rows(torch.device("cuda")) == []  # a device object only: nothing runs
    monkeypatch.setenv("ATLAS_FAST_GRAPH_STEPS", "bogus")
    [row] = graph_setting_rows(cpu)
    assert row.status == FAIL and "'bogus' is not a --graph-steps choice" in row.note


@pytest.mark.slow  # (the default run injects an upload and a failing capture instead)
def test_a_group_unlike_its_run_alone_fails_the_doctor(monkeypatch, capsys):
    """Injected: the run trained alone ends with a learned tensor moved by 0.01."""
    from atlas_fast.app import doctor

    real = doctor.train_group

    def perturbed(name, backbone, device, runs, *args, **kwargs):
        trained = real(name, backbone, device, runs, *args, **kwargs)
        if runs == 1 and not kwargs["length_groups"]:
            with torch.no_grad():
                next(iter(trained.method.trainable_parameters())).add_(0.01)
        return trained

    monkeypatch.setattr(doctor, "train_group", perturbed)
    assert main(["doctor", "--methods", "coop", "--steps", "3"]) == MISMATCH_STATUS
    out = capsys.readouterr().out
    assert "| cached text (coop): group = alone | FAIL | run 1 of a group of 2 vs alone: largest learned-tensor " \
           "difference 1.0e-02" in out
    assert "1 mismatch(es): cached text (coop): group = alone" in out


@pytest.mark.parametrize("traffic, expected", [
    pytest.param(lambda loss: float(loss.detach().sum()), "1 read(s) back, 0 upload(s)",  # read back to the host
                 marks=pytest.mark.slow),  # (the default run keeps the upload: one such test is enough there)
    (lambda loss: loss * torch.tensor(1.0), "0 read(s) back, 1 upload(s)"),  # a constant built on the host
], ids=["read-back", "upload"])
def test_a_step_with_host_traffic_fails_the_doctor(monkeypatch, capsys, traffic, expected):
    """Injected into CoOp's loss in every step (as CLIP-LoRA's logit scale once was built): a graph could not
    replay it."""
    from atlas_fast.methods.registry import method_class

    entry = method_class("coop")
    real = entry.training_loss

    def with_traffic(self, *args, **kwargs):
        loss = real(self, *args, **kwargs)
        result = traffic(loss)
        return result if isinstance(result, torch.Tensor) else loss

    monkeypatch.setattr(entry, "training_loss", with_traffic)
    assert main(["doctor", "--methods", "coop", "--steps", "3"]) == MISMATCH_STATUS
    out = capsys.readouterr().out
    assert "| cached text (coop): eager steps | FAIL | " in out
    assert f"host traffic per steady-state step: {expected}" in out


def test_bad_options_are_named(capsys):
    assert main(["doctor", "--methods", "maple"]) == 2
    assert "--methods 'maple': the doctor trains coop, cocoop, ivlp, tcp." in capsys.readouterr().err
    assert main(["doctor", "--steps", "2"]) == 2
    assert "--steps must be in [3, 1000], got 2" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["doctor", "--device", "cuda"]) == 2
        assert "--device cuda: torch sees no CUDA device here" in capsys.readouterr().err


@pytest.fixture
def fake_graphs(monkeypatch):
    """CUDA graphs faked on the CPU (as tests/test_step_graphs.py fakes them): a capture runs nothing and a replay
    runs the captured step again, so the doctor's graphed rows run their bookkeeping here."""
    from atlas_fast.engine import graphs

    fake_cuda_streams(monkeypatch)
    record = {"fail": False}

    def capture(body, stream, pool=None, **kwargs):
        if record["fail"]:
            raise RuntimeError("operation not permitted when stream is capturing")
        return body, None

    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(graphs, "host_syncs", lambda function: (function(), []))
    return record


def test_the_graphed_rows_judge_replays_and_fallbacks(fake_graphs, capsys):
    """With CUDA graphs faked, the graphed = eager row is ok when every step after the warm-ups replays the eager
    step; a capture that raises (as a real one would when a step breaks its rules) is a fallback, and a FAIL."""
    assert main(["doctor", "--methods", "coop", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "| cached text (coop): graphed = eager | ok | largest learned-tensor difference 0.0e+00; 4/6 steps " \
           "replayed |" in out
    fake_graphs["fail"] = True
    assert main(["doctor", "--methods", "coop", "--steps", "3"]) == MISMATCH_STATUS
    out = capsys.readouterr().out
    assert "| cached text (coop): graphed = eager | FAIL | largest learned-tensor difference 0.0e+00; 0/6 steps " \
           "replayed |" in out and "fell back: graph_steps: " in out
