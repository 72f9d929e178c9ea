"""The optimisers of R runs on the device (engine/optim.py): a lone run steps exactly as torch.optim.SGD (or
torch.optim.Adam / AdamW, the TCP and CLIP-LoRA recipes') under a torch.amp.GradScaler, overflows included; in a group
each run keeps its own scaler, so an overflow skips the run that overflowed and no other, and a run that sits a step
out keeps every tensor and buffer bit for bit.

fp16 overflows in the first steps are routine under AMP: torch's fused SGD once left its momentum buffer uninitialised
on such a step and the next step wrote garbage into the prompts (the GPU demo diverged in epoch 0); here a skipped
step leaves the run as it was and the next one steps as if the overflow never happened (the first test, overflow in
step 0)."""

import math

import pytest
import torch

from atlas_fast.engine.optim import INIT_SCALE, RunsAdam, RunsSGD

pytestmark = pytest.mark.usefixtures("one_thread")

MOMENTUM, DECAY = 0.9, 5e-4


def _gradient_stream(shape, steps, overflow_at=(), seed=0):
    """Gradients of a loss of scale ~1, an inf in the steps ``overflow_at``."""
    generator = torch.Generator().manual_seed(seed)
    grads = []
    for step in range(steps):
        grad = torch.randn(shape, generator=generator) * 0.1
        if step in overflow_at:
            grad[(0,) * len(shape)] = float("inf")
        grads.append(grad)
    return grads


def _torch_run(start, grads, lrs, amp):
    """torch's own SGD (+ GradScaler) on one tensor, stepped with ``grads`` (unscaled) at the epochs' lrs."""
    param = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.SGD([param], lr=lrs[0], momentum=MOMENTUM, weight_decay=DECAY)
    scaler = torch.amp.GradScaler("cpu", enabled=amp)
    scales = []
    for grad, lr in zip(grads, lrs):
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        scaler.scale((param * grad).sum()).backward()  # d/dparam = scale * grad
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale() if amp else 1.0)
    return param.detach(), optimizer, scales


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_a_lone_run_steps_exactly_as_torch_sgd_under_a_grad_scaler(amp):
    start = torch.randn(4, 8) * 0.02
    steps = 6
    grads = _gradient_stream(start.shape, steps, overflow_at={0, 3} if amp else ())
    lrs = [1e-5, 1e-5, 0.002, 0.002, 0.0019, 0.0017]
    expected, optimizer, scales = _torch_run(start, grads, lrs, amp)

    param = torch.nn.Parameter(start.clone())
    ours = RunsSGD([{"params": [param]}], runs=1, momentum=MOMENTUM, weight_decay=DECAY, amp=amp)
    for step, (grad, lr) in enumerate(zip(grads, lrs)):
        ours.set_lrs([lr])
        (scaled,) = torch.autograd.grad(ours.scale_losses((param * grad).sum().reshape(1)), [param])
        ours.step([scaled])
        assert ours.scale.item() == scales[step]
    assert torch.equal(param.detach(), expected)
    (torch_param,) = optimizer.param_groups[0]["params"]
    assert torch.equal(ours.momentum_buffers[0], optimizer.state[torch_param]["momentum_buffer"])


def test_an_overflow_skips_exactly_the_run_that_overflowed():
    """Three runs stacked; run 1 overflows in its first and fourth steps, run 2 sits out the last two steps. Each
    run's tensor, buffer and scale equal those of torch's SGD + GradScaler trained on that run alone (run 2: on its
    own steps only)."""
    runs, steps = 3, 6
    start = torch.randn(runs, 5, 3) * 0.02
    streams = [_gradient_stream((1, 5, 3), steps, overflow_at={0, 3} if r == 1 else (), seed=r) for r in range(runs)]
    lrs = [1e-5, 0.002, 0.002, 0.0018, 0.0015, 0.001]
    active_steps = [steps, steps, steps - 2]
    param = torch.nn.Parameter(start.clone())
    ours = RunsSGD([{"params": [param]}], runs=runs, momentum=MOMENTUM, weight_decay=DECAY, amp=True)
    before_overflow = None
    for step in range(steps):
        ours.set_lrs([lrs[step]])
        active = torch.tensor([step < active_steps[r] for r in range(runs)])
        grad = torch.cat([streams[r][step] for r in range(runs)])
        losses = (param * grad).flatten(1).sum(dim=1)  # run r's loss reaches only run r's slice
        (scaled,) = torch.autograd.grad(ours.scale_losses(losses), [param])
        if step == 3:
            before_overflow = (param.detach()[1].clone(), ours.momentum_buffers[0][1].clone())
        ours.step([scaled], None if active.all() else active)
        if step == 3:  # the overflowing run kept its tensor and momentum bit for bit; the others stepped
            assert torch.equal(param.detach()[1], before_overflow[0])
            assert torch.equal(ours.momentum_buffers[0][1], before_overflow[1])
    for r in range(runs):
        expected, optimizer, scales = _torch_run(start[r:r + 1], streams[r][:active_steps[r]],
                                                 lrs[:active_steps[r]], amp=True)
        assert torch.equal(param.detach()[r:r + 1], expected), r
        assert ours.scale[r].item() == scales[-1]
    assert ours.scale.tolist() == [INIT_SCALE, INIT_SCALE / 4, INIT_SCALE]
    assert ours.growth_tracker.tolist() == [6, 2, 4]


def test_the_scale_grows_after_the_growth_interval_per_run(monkeypatch):
    from atlas_fast.engine import optim

    monkeypatch.setattr(optim, "GROWTH_INTERVAL", 3)
    param = torch.nn.Parameter(torch.zeros(2, 4))
    ours = RunsSGD([{"params": [param]}], runs=2, momentum=MOMENTUM, weight_decay=DECAY, amp=True)
    ours.set_lrs([0.01])
    for step in range(4):
        grad = torch.ones(2, 4)
        if step == 1:
            grad[0, 0] = float("nan")
        ours.step([grad * ours.scale.unsqueeze(1)])
    # run 1: three clean steps -> doubled, then one more; run 0: overflow in step 1, then two clean steps
    assert ours.scale.tolist() == [INIT_SCALE / 2, INIT_SCALE * 2]
    assert ours.growth_tracker.tolist() == [2, 1]


def test_state_of_runs_carries_the_kept_runs_over():
    params = torch.nn.Parameter(torch.randn(3, 2))
    ours = RunsSGD([{"params": [params]}], runs=3, momentum=MOMENTUM, weight_decay=DECAY, amp=True)
    ours.set_lrs([0.1])
    grad = torch.randn(3, 2)
    grad[1, 0] = float("inf")
    ours.step([grad])
    smaller = RunsSGD([{"params": [torch.nn.Parameter(params.detach()[[0, 2]].clone())]}], runs=2,
                      momentum=MOMENTUM, weight_decay=DECAY, amp=True)
    smaller.load_state_of_runs(ours.state_of_runs([0, 2]))
    assert torch.equal(smaller.momentum_buffers[0], ours.momentum_buffers[0][[0, 2]])
    assert not ours.momentum_buffers[0][1].any()  # run 1 overflowed in its first step: its buffer was never written
    assert torch.equal(smaller.scale, ours.scale[[0, 2]])


def test_tensors_without_the_runs_dimension_are_refused():
    with pytest.raises(ValueError, match="no leading dimension of the 3 runs"):
        RunsSGD([{"params": [torch.nn.Parameter(torch.zeros(2, 3))]}], runs=3, momentum=0.9, weight_decay=0.0,
                amp=False)


ADAM_BETAS, ADAM_DECAY = (0.9, 0.999), 1e-2


def _torch_adam_run(start, grads, lrs, amp, decoupled):
    """torch's Adam (or AdamW) + GradScaler on one tensor, stepped with ``grads`` at per-step lrs."""
    param = torch.nn.Parameter(start.clone())
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    optimizer = kind([param], lr=lrs[0], betas=ADAM_BETAS, weight_decay=ADAM_DECAY)
    scaler = torch.amp.GradScaler("cpu", enabled=amp)
    for grad, lr in zip(grads, lrs):
        optimizer.param_groups[0]["lr"] = lr
        optimizer.zero_grad()
        scaler.scale((param * grad).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    return param.detach(), optimizer.state[param]


def _cosine_lrs(steps, lr=2e-4, min_lr=1e-6):
    return [min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t / steps)) for t in range(steps)]


@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_a_lone_run_steps_exactly_as_torch_adam_under_a_grad_scaler(amp, decoupled):
    start = torch.randn(4, 8) * 0.02
    steps = 7
    grads = _gradient_stream(start.shape, steps, overflow_at={0, 4} if amp else ())
    lrs = _cosine_lrs(steps)
    expected, state = _torch_adam_run(start, grads, lrs, amp, decoupled)
    param = torch.nn.Parameter(start.clone())
    ours = RunsAdam([{"params": [param]}], runs=1, betas=ADAM_BETAS, weight_decay=ADAM_DECAY, amp=amp,
                    decoupled=decoupled)
    for grad, lr in zip(grads, lrs):
        ours.set_lrs([lr])
        (scaled,) = torch.autograd.grad(ours.scale_losses((param * grad).sum().reshape(1)), [param])
        ours.step([scaled])
    assert torch.equal(param.detach(), expected)
    assert torch.equal(ours.exp_avgs[0], state["exp_avg"]) and torch.equal(ours.exp_avg_sqs[0], state["exp_avg_sq"])
    assert ours.steps.item() == state["step"].item() == steps - (2 if amp else 0)  # skipped steps count none


def test_adam_runs_together_each_step_as_alone():
    """Three runs under AdamW: run 1 overflows in steps 0 and 3, run 2 sits out the last two; each equals torch's
    AdamW on that run alone (its own step count in the bias corrections), and the carried state is the kept runs'."""
    runs, steps = 3, 6
    start = torch.randn(runs, 5, 3) * 0.02
    streams = [_gradient_stream((1, 5, 3), steps, overflow_at={0, 3} if r == 1 else (), seed=r) for r in range(runs)]
    lrs = _cosine_lrs(steps)
    active_steps = [steps, steps, steps - 2]
    param = torch.nn.Parameter(start.clone())
    ours = RunsAdam([{"params": [param]}], runs=runs, betas=ADAM_BETAS, weight_decay=ADAM_DECAY, amp=True,
                    decoupled=True)
    for step in range(steps):
        ours.set_lrs([lrs[step]])
        active = torch.tensor([step < active_steps[r] for r in range(runs)])
        grad = torch.cat([streams[r][step] for r in range(runs)])
        (scaled,) = torch.autograd.grad(ours.scale_losses((param * grad).flatten(1).sum(dim=1)), [param])
        ours.step([scaled], None if active.all() else active)
    for r in range(runs):
        expected, state = _torch_adam_run(start[r:r + 1], streams[r][:active_steps[r]], lrs[:active_steps[r]],
                                          amp=True, decoupled=True)
        assert torch.equal(param.detach()[r:r + 1], expected), r
        assert ours.steps[r].item() == state["step"].item()
    assert ours.steps.tolist() == [6, 4, 4]
    smaller = RunsAdam([{"params": [torch.nn.Parameter(param.detach()[[0, 2]].clone())]}], runs=2,
                       betas=ADAM_BETAS, weight_decay=ADAM_DECAY, amp=True, decoupled=True)
    smaller.load_state_of_runs(ours.state_of_runs([0, 2]))
    assert torch.equal(smaller.exp_avg_sqs[0], ours.exp_avg_sqs[0][[0, 2]])
    assert smaller.steps.tolist() == [6, 4]
