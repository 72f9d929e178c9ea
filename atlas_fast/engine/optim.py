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
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

#: GradScaler's defaults (torch.amp.GradScaler), which the references use
INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


class RunsSGD:
    """SGD with momentum and weight decay over the learned tensors of R runs (every tensor leads with R, or, for a
    lone run, any shape), with a gradient scaler per run under ``amp``; every state tensor lives on the
    parameters' device.

    ``groups``: the method's parameter groups (``{"params": [...], "lr_scale": s}``); the lr of a group is set per
    epoch (:meth:`set_lrs`) into a device scalar, so a captured step needs no recapture when it changes."""

    def __init__(self, groups: Sequence[dict[str, Any]], runs: int, momentum: float, weight_decay: float,
                 amp: bool) -> None:
        self.runs, self.momentum, self.weight_decay, self.amp = runs, float(momentum), float(weight_decay), amp
        self.groups = [{"params": list(group["params"]), "lr_scale": float(group.get("lr_scale", 1.0))}
                       for group in groups]
        self.params = [p for group in self.groups for p in group["params"]]
        self.group_of = [g for g, group in enumerate(self.groups) for _ in group["params"]]
        if not self.params:
            raise ValueError("RunsSGD needs at least one parameter to train")
        device = self.params[0].device
        for p in self.params:
            if p.numel() % runs or (runs > 1 and p.shape[0] != runs):
                raise ValueError(f"A learned tensor of shape {tuple(p.shape)} has no leading dimension of the "
                                 f"{runs} runs; this method cannot train its runs together.")
        self.lrs = [torch.zeros((), device=device) for _ in self.groups]
        # zero until a run's first step writes its slice (torch creates the buffer then)
        self.momentum_buffers = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.scale = torch.full((runs,), INIT_SCALE if amp else 1.0, device=device)
        self.growth_tracker = torch.zeros(runs, dtype=torch.int32, device=device)

    def set_lrs(self, lrs: Sequence[float]) -> None:
        """The lr of each parameter group (written into the device scalars the step reads)."""
        for tensor, value in zip(self.lrs, lrs):
            tensor.fill_(value)

    def scale_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """What to differentiate: ``sum_r scale_r * loss_r`` under AMP, ``sum_r loss_r`` otherwise."""
        return (losses * self.scale).sum() if self.amp else losses.sum()

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor | None], active: torch.Tensor | None = None) -> None:
        """One update from the (scaled) gradients of :attr:`params` (None: the tensor got no gradient and is left
        alone, as SGD leaves a tensor whose ``.grad`` is None). ``active`` (R,) bool: the runs that take part in
        this step (None: all). A few multi-tensor kernels for all the tensors, and, where some run may not step,
        one ``where`` per tensor and buffer."""
        runs = self.runs
        chosen = [i for i, grad in enumerate(grads) if grad is not None]
        grads = [grads[i].reshape(runs, -1) for i in chosen]
        params = [self.params[i].detach().view(runs, -1) for i in chosen]
        buffers = [self.momentum_buffers[i].view(runs, -1) for i in chosen]
        found_inf = None
        if self.amp:  # GradScaler's own kernel, once per run: unscale in place, flag a non-finite value
            inverse = self.scale.double().reciprocal().float()
            found_inf = torch.zeros(runs, device=self.scale.device)
            for r in range(runs):
                torch._amp_foreach_non_finite_check_and_unscale_([grad[r] for grad in grads], found_inf[r:r + 1],
                                                                 inverse[r:r + 1])
        ok = None if found_inf is None else found_inf == 0
        if active is not None:
            ok = active if ok is None else ok & active
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
        return {"momentum_buffers": [b.reshape(self.runs, -1).index_select(0, index) for b in self.momentum_buffers],
                "scale": self.scale.index_select(0, index),
                "growth_tracker": self.growth_tracker.index_select(0, index)}

    @torch.no_grad()
    def load_state_of_runs(self, state: dict[str, Any]) -> None:
        """Take over :meth:`state_of_runs` of another optimiser (same tensors, fewer runs)."""
        for buffer, value in zip(self.momentum_buffers, state["momentum_buffers"]):
            buffer.view(self.runs, -1).copy_(value)
        self.scale.copy_(state["scale"])
        self.growth_tracker.copy_(state["growth_tracker"])
