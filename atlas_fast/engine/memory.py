"""How many runs of a group fit the device's memory, estimated from the towers' shapes before anything runs.

A step keeps, for the backward pass, about :data:`KEPT_BYTES` bytes per token, width and block of every tower with a
gradient path (the text tower over each run's C class prompts past their shared prefix; a prompted image tower over
each run's B images), so R runs need R times one run's activations plus the frozen CLIP once. CUDA-graphed steps
keep theirs in the graphs' private pool while the eager steps beside them (warm-ups, ragged batches, re-warming)
need another set: :data:`GRAPHED_ACTIVATION_SETS` times the activations. The planner
(:func:`atlas_fast.engine.group.group_size`) lowers R where that would pass :data:`DEVICE_SHARE` of the device's
memory; ``benchmarks/gpu_check.py`` measures the reserved peak beside this estimate.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from atlas_fast.clip.backbones import Backbone
from atlas_fast.threads import CGROUP_ROOT, PROC_CGROUP, cgroup_memory_bytes

#: Bytes kept per token, width and transformer block in a training step, under fp16 autocast (True) and in fp32:
#: about 15 on an H100 (CoOp's steps at C = 1,000 and 500 with R = 12 peaked at 16 and 7.7 GiB: 1.4 MB per prompt of
#: about 15 positions, 12 blocks of width 512) and 58 on the CPU in fp32 (IVLP at batch 4 kept 430 MiB), rounded up.
KEPT_BYTES = {True: 16, False: 60}
#: Positions each class prompt runs beyond the prefix its run shares: its class tokens, '.' and EOT, at most
#: ImageNet's longest (a GPU pads them to the longest), and the visual prompts' tokens at most.
PROMPT_POSITIONS = 16
#: The share of the device's memory a group may plan to use.
DEVICE_SHARE = 0.8
#: The sets of a step's activations a graphed group holds at once: the live graph's private pool and an eager step
#: beside it (CoOp at C = 1,000, R = 12: about 19 GB in the pool and 19 GB more for an eager step).
GRAPHED_ACTIVATION_SETS = 2


def step_bytes_per_run(entry, backbone: Backbone, classes: int, batch: int, amp: bool) -> int:
    """The activations one run adds to a training step of method ``entry`` (a registered method class) at
    ``classes`` classes and batch ``batch``."""
    model = backbone.model
    text = len(model.transformer.resblocks) * int(model.positional_embedding.shape[1]) * PROMPT_POSITIONS * classes
    if not getattr(entry, "trains_text_tower", True):  # a fixed classifier (PromptKD: its teacher's text)
        text = 0
    vision = 0
    if entry.reads_pixels:
        visual = model.visual
        tokens = int(visual.positional_embedding.shape[0]) + PROMPT_POSITIONS  # + the visual prompts, at most
        vision = len(visual.transformer.resblocks) * int(visual.class_embedding.shape[-1]) * tokens * batch
    return KEPT_BYTES[bool(amp)] * (text + vision)


def frozen_bytes(backbone: Backbone, amp: bool) -> int:
    """The frozen CLIP on the device (and its fp16 copies under autocast)."""
    weights = sum(p.numel() * p.element_size() for p in backbone.model.parameters())
    return weights * (3 // 2 if not amp else 2)


def device_bytes(device: torch.device, cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP
                 ) -> int | None:
    """The memory of ``device``, None where it cannot be read here (a GPU that only the workers have). For the CPU,
    the host's RAM or, when lower, the memory limit of this process's cgroup (a container's ``memory.max`` /
    ``memory.limit_in_bytes``, :func:`~atlas_fast.threads.cgroup_memory_bytes`): a capped container would otherwise
    plan groups for memory it may not use."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        physical: int | None = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        physical = None
    limit = cgroup_memory_bytes(cgroup_root, proc_cgroup)
    return min(x for x in (physical, limit) if x is not None) if (physical, limit) != (None, None) else None


def runs_that_fit(runs: int, per_run: int, fixed: int, memory: int | None, graphs: bool = False) -> int:
    """At most ``runs`` runs whose steps need ``fixed + R x per_run`` bytes (``fixed + R x per_run x``
    :data:`GRAPHED_ACTIVATION_SETS` when their steps are CUDA-graphed: ``graphs``) within :data:`DEVICE_SHARE` of
    ``memory`` (at least 1; ``runs`` when the memory is unknown)."""
    if memory is None or per_run <= 0:
        return runs
    per_run *= GRAPHED_ACTIVATION_SETS if graphs else 1
    return max(1, min(runs, int((DEVICE_SHARE * memory - fixed) // per_run)))
