"""The optimiser of R runs, on the device: Dassl's SGD and, under AMP, one gradient scaler per run, written as tensor
arithmetic that never reads a value back to the host, so that a whole training step (batch, loss, backward, update)
can be captured in one CUDA graph (:mod:`atlas_fast.engine.graphs`) and replayed.

Each run keeps exactly what ``torch.optim.SGD`` and ``torch.amp.GradScaler`` keep for a lone run: its slices of the
momentum buffers, its loss scale and its growth tracker. One step of run r, given
the gradients of ``sum_r scale_r * loss_r`` (each run's parameters reach only its own loss, so run r's slices hold
``scale_r`` times its own gradient):

1. AMP: unscale run r's slices by ``1 / scale_r`` (computed as GradScaler does, in double, then rounded to float);
   ``found_inf_r``: any of them is not finite.
2. Run r steps iff it takes part in this step (``active``) and, under AMP, nothing overflowed (``found_inf_r`` false),
   as SGD (momentum m, weight decay w, no dampening, no Nesterov): ``d = g + w p``; ``buf = m buf + d`` (the buffer
   is zero until the run's first step, so that step's buffer is ``d``, as torch's); ``p = p - lr buf``. A run that
   does not step keeps its parameters and buffers bit for bit (the lone run's scaler skips ``optimizer.step()``).
3. AMP, for the runs that take part: an overflow halves ``scale_r`` and resets its tracker; otherwise the tracker
   counts up and at 2,000 the scale doubles (if that stays finite) and the tracker restarts: GradScaler's update.

An overflow in one run therefore skips that run alone, as the run trained alone would skip it; the other runs of
the group step as usual. The unscaling and overflow check are GradScaler's own kernel, and the update is SGD's
arithmetic in multi-tensor kernels (a few launches for all the tensors, which matters where steps run eagerly on a
GPU), so a lone run's tensors equal torch's (``tests/test_optim.py``).

:class:`RunsAdam` is the same per-run machinery around Adam (TCP) or AdamW (CLIP-LoRA): each run's bias
corrections count its own steps (a skipped or idle step counts none), and its lr and step size are device scalars,
so a graphed step replays it too.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

#: GradScaler's defaults (torch.amp.GradScaler), which the references use
INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


class RunsOptimizer:
    """What the optimisers of R runs share: the learned tensors of R runs (each leads with R, or, for a lone run, any
    shape) in the method's parameter groups (``{"params": [...], "lr_scale": s}``), each group's lr in a device
    scalar (:meth:`set_lrs`: a captured step needs no recapture when it changes), and under ``amp`` a gradient scaler
    per run. Subclasses name their per-tensor and per-run state (:attr:`tensor_state`, :attr:`run_state`) and write
    :meth:`step`."""

    tensor_state: tuple[str, ...] = ()
    run_state: tuple[str, ...] = ("scale", "growth_tracker")
    lr_dtype = torch.float32

    def __init__(self, groups: Sequence[dict[str, Any]], runs: int, weight_decay: float, amp: bool) -> None:
        self.runs, self.weight_decay, self.amp = runs, float(weight_decay), amp
        self.groups = [{"params": list(group["params"]), "lr_scale": float(group.get("lr_scale", 1.0))}
                       for group in groups]
        self.params = [p for group in self.groups for p in group["params"]]
        self.group_of = [g for g, group in enumerate(self.groups) for _ in group["params"]]
        if not self.params:
            raise ValueError(f"{type(self).__name__} needs at least one parameter to train")
        device = self.params[0].device
        for p in self.params:
            if p.numel() % runs or (runs > 1 and p.shape[0] != runs):
                raise ValueError(f"A learned tensor of shape {tuple(p.shape)} has no leading dimension of the "
                                 f"{runs} runs; this method cannot train its runs together.")
        self.lrs = [torch.zeros((), dtype=self.lr_dtype, device=device) for _ in self.groups]
        self.scale = torch.full((runs,), INIT_SCALE if amp else 1.0, device=device)
        self.growth_tracker = torch.zeros(runs, dtype=torch.int32, device=device)

    def _zeros_like_params(self) -> list[torch.Tensor]:
        return [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]

    def set_lrs(self, lrs: Sequence[float]) -> None:
        """The lr of each parameter group (written into the device scalars the step reads)."""
        for tensor, value in zip(self.lrs, lrs):
            tensor.fill_(value)

    def scale_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """What to differentiate: ``sum_r scale_r * loss_r`` under AMP, ``sum_r loss_r`` otherwise."""
        return (losses * self.scale).sum() if self.amp else losses.sum()

    def _chosen(self, grads: Sequence[torch.Tensor | None]) -> list[int]:
        """The tensors that got a gradient (the others are left alone, as torch leaves a tensor whose ``.grad`` is
        None)."""
        return [i for i, grad in enumerate(grads) if grad is not None]

    def _unscale(self, grads: list[torch.Tensor], active: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Under AMP, GradScaler's own kernel once per run on the (R, n) gradients: unscaled in place, a non-finite
        value flagged. Returns (found_inf (R,) or None, which runs step (R,) bool, or None: all)."""
        found_inf = None
        if self.amp:
            inverse = self.scale.double().reciprocal().float()
            found_inf = torch.zeros(self.runs, device=self.scale.device)
            for r in range(self.runs):
                torch._amp_foreach_non_finite_check_and_unscale_([grad[r] for grad in grads], found_inf[r:r + 1],
                                                                 inverse[r:r + 1])
        ok = None if found_inf is None else found_inf == 0
        if active is not None:
            ok = active if ok is None else ok & active
        return found_inf, ok

    def step(self, grads: Sequence[torch.Tensor | None], active: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def _update_scale(self, found_inf: torch.Tensor, active: torch.Tensor | None) -> None:
        """GradScaler's update, per run, for the runs that took part."""
        counted = torch.where(found_inf, torch.zeros_like(self.growth_tracker), self.growth_tracker + 1)
        grow = counted >= GROWTH_INTERVAL
        grown = self.scale * GROWTH_FACTOR
        scale = torch.where(found_inf, self.scale * BACKOFF_FACTOR,
                            torch.where(grow & torch.isfinite(grown), grown, self.scale))
        tracker = torch.where(grow, torch.zeros_like(counted), counted)
        if active is not None:
            scale = torch.where(active, scale, self.scale)
            tracker = torch.where(active, tracker, self.growth_tracker)
        self.scale.copy_(scale)
        self.growth_tracker.copy_(tracker)

    def state_of_runs(self, keep: Sequence[int]) -> dict[str, Any]:
        """The state of the runs at positions ``keep`` (for a smaller group that carries them on)."""
        index = torch.tensor(list(keep), device=self.scale.device)
        state: dict[str, Any] = {name: [b.reshape(self.runs, -1).index_select(0, index) for b in getattr(self, name)]
                                 for name in self.tensor_state}
        state.update({name: getattr(self, name).index_select(0, index) for name in self.run_state})
        return state

    @torch.no_grad()
    def load_state_of_runs(self, state: dict[str, Any]) -> None:
        """Take over :meth:`state_of_runs` of another optimiser (same tensors, fewer runs)."""
        for name in self.tensor_state:
            for buffer, value in zip(getattr(self, name), state[name]):
                buffer.view(self.runs, -1).copy_(value)
        for name in self.run_state:
            getattr(self, name).copy_(state[name])


class RunsSGD(RunsOptimizer):
    """SGD with momentum and weight decay over the learned tensors of R runs, with a gradient scaler per run under
    ``amp``; every state tensor lives on the parameters' device."""

    tensor_state = ("momentum_buffers",)

    def __init__(self, groups: Sequence[dict[str, Any]], runs: int, momentum: float, weight_decay: float,
                 amp: bool) -> None:
        super().__init__(groups, runs, weight_decay, amp)
        self.momentum = float(momentum)
        # zero until a run's first step writes its slice (torch creates the buffer then)
        self.momentum_buffers = self._zeros_like_params()

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor | None], active: torch.Tensor | None = None) -> None:
        """One update from the (scaled) gradients of :attr:`params` (None: the tensor got no gradient and is left
        alone, as SGD leaves a tensor whose ``.grad`` is None). ``active`` (R,) bool: the runs that take part in
        this step (None: all). A few multi-tensor kernels for all the tensors, and, where some run may not step,
        one ``where`` per tensor and buffer."""
        runs = self.runs
        chosen = self._chosen(grads)
        grads = [grads[i].reshape(runs, -1) for i in chosen]
        params = [self.params[i].detach().view(runs, -1) for i in chosen]
        buffers = [self.momentum_buffers[i].view(runs, -1) for i in chosen]
        found_inf, ok = self._unscale(grads, active)
        directions = torch._foreach_add(grads, params, alpha=self.weight_decay) if self.weight_decay else grads
        if self.momentum:  # a buffer is zero until its run's first step, so m * 0 + d is that step's d (torch: d)
            stepped = torch._foreach_mul(buffers, self.momentum)
            torch._foreach_add_(stepped, directions)
            directions = stepped
        lrs = [self.lrs[self.group_of[i]] for i in chosen]
        if ok is None:  # p - lr buf fused as torch's own step computes it (addcmul with a tensor lr)
            torch._foreach_addcmul_(params, directions, lrs, value=-1)
            if self.momentum:
                torch._foreach_copy_(buffers, directions)
        else:
            keep = ok.unsqueeze(1)
            for param, value in zip(params, torch._foreach_addcmul(params, directions, lrs, value=-1)):
                torch.where(keep, value, param, out=param)
            if self.momentum:
                for buffer, value in zip(buffers, directions):
                    torch.where(keep, value, buffer, out=buffer)
        if self.amp:
            self._update_scale(found_inf > 0, active)


class RunsAdam(RunsOptimizer):
    """Adam or AdamW over the learned tensors of R runs, with a gradient scaler per run under ``amp``: for each run
    that steps (it takes part and, under AMP, nothing overflowed), torch's Adam on its slices,

    ``g += w p`` (Adam; AdamW instead ``p *= 1 - lr w``); ``m = lerp(m, g, 1 - b1)``; ``v = b2 v + (1 - b2) g^2``;
    ``t += 1``; ``p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)``,

    with the bias corrections and step size computed in double from the run's own step count ``t`` (torch computes
    them in Python floats) and rounded to float where torch rounds them; a run that does not step keeps every tensor
    and its ``t``. No AMSGrad, no maximise (no recipe uses them)."""

    tensor_state = ("exp_avgs", "exp_avg_sqs")
    run_state = ("steps", "scale", "growth_tracker")
    lr_dtype = torch.float64  # torch's lr is a Python float: lr / bias correction in double, as there

    def __init__(self, groups: Sequence[dict[str, Any]], runs: int, betas: tuple[float, float], weight_decay: float,
                 amp: bool, decoupled: bool = False, eps: float = 1e-8) -> None:
        super().__init__(groups, runs, weight_decay, amp)
        self.betas, self.decoupled, self.eps = (float(betas[0]), float(betas[1])), decoupled, float(eps)
        self.exp_avgs, self.exp_avg_sqs = self._zeros_like_params(), self._zeros_like_params()
        self.steps = torch.zeros(runs, dtype=torch.float64, device=self.scale.device)  # each run's steps taken

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor | None], active: torch.Tensor | None = None) -> None:
        """One update from the (scaled) gradients of :attr:`params` (None: left alone); ``active`` (R,) bool: the
        runs that take part in this step (None: all)."""
        runs, (beta1, beta2) = self.runs, self.betas
        chosen = self._chosen(grads)
        grads = [grads[i].reshape(runs, -1) for i in chosen]
        params = [self.params[i].detach().view(runs, -1) for i in chosen]
        found_inf, ok = self._unscale(grads, active)
        steps = self.steps + 1 if ok is None else torch.where(ok, self.steps + 1, self.steps)
        correction1 = 1 - beta1 ** steps  # (R,) double
        correction2_sqrt = (1 - beta2 ** steps).sqrt().float().unsqueeze(1)
        for i, grad, param in zip(chosen, grads, params):
            lr = self.lrs[self.group_of[i]]
            exp_avg, exp_avg_sq = self.exp_avgs[i].view(runs, -1), self.exp_avg_sqs[i].view(runs, -1)
            moved = param
            if self.weight_decay and self.decoupled:
                moved = param * (1 - lr * self.weight_decay).float()
            elif self.weight_decay:
                grad = grad.add(param, alpha=self.weight_decay)
            avg = exp_avg.lerp(grad, 1 - beta1)
            avg_sq = exp_avg_sq.mul(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (avg_sq.sqrt() / correction2_sqrt).add_(self.eps)
            step_size = (lr / correction1).float().unsqueeze(1)
            value = moved - step_size * avg / denom
            if ok is None:
                param.copy_(value)
                exp_avg.copy_(avg)
                exp_avg_sq.copy_(avg_sq)
            else:
                keep = ok.unsqueeze(1)
                torch.where(keep, value, param, out=param)
                torch.where(keep, avg, exp_avg, out=exp_avg)
                torch.where(keep, avg_sq, exp_avg_sq, out=exp_avg_sq)
        self.steps.copy_(steps)
        if self.amp:
            self._update_scale(found_inf > 0, active)
