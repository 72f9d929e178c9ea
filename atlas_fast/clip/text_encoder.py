"""CLIP's text tower applied to prompt *embeddings* (learned context + class tokens), truncated to the longest prompt.

This is CoOp's ``TextEncoder`` (``docs/method-zoo.md``, section Common CLIP pieces) on the open_clip model. Under the
causal mask the EOT output depends only on positions <= EOT, so running just the first ``max(eot_index) + 1``
positions gives the same features and gradients as the full 77-token pass, at a fraction of the cost; that stays
exact with deep text prompts, which replace positions 1..M, all before the EOT.

**Shared prefix** (:meth:`PromptTextEncoder.encode_classes`). Every class's prompt starts with the same positions
``[SOT][ctx_1..M]``; under the causal mask their hidden states do not depend on what follows, so they are computed
once per prompt set (per run, per image for CoCoOp), and each class runs only its own positions, attending to the
prefix's keys and values. Deep text prompts replace prefix positions only. The class suffixes are packed: token-wise
operations run once over all of them without padding, and attention runs per length group (:func:`length_groups`).
Same arithmetic per position as the plain pass, so features and gradients agree to fp32 rounding.

Both passes run the blocks fused where open_clip's blocks allow it, and the last block only for the EOT rows.
``fused_attention``, ``shared_prefix`` and ``length_groups`` switch each part off (benchmarks, tests); with all three
off the pass is open_clip's own blocks.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.prompted_towers import (attention_input, block_residuals, fused_tower_supported, is_causal_mask,
                                        merge_heads, replace_slot, run_blocks, runs_to_batch, split_heads)

#: per extra attention group, the suffix positions it costs to run it instead of padding (see :func:`length_groups`).
#: Devices not listed run one group padded to the longest suffix when the step runs eagerly: an eager GPU step is
#: bound by kernel launches (length groups made a C = 500 step 0.51x as fast on an H100, benchmarks/step_speed.py).
GROUP_COST_POSITIONS = {"cpu": 2.0}
#: the same price inside a captured CUDA graph (:func:`graph_length_groups`), where an extra group's kernels cost no
#: launches, only their own small run time: about a hundred small kernels per group over a ViT-B/16 text tower's
#: forward and backward, taken as the time of 256 positions of one sequence (a position's forward and backward is
#: about 0.6 us at 40 % of an H100's fp16 peak; benchmarks/gpu_check.py times grouped against padded replays)
GRAPHED_GROUP_COST = 256.0
_GRAPHED: contextvars.ContextVar[bool] = contextvars.ContextVar("graphed_length_groups", default=False)


@contextlib.contextmanager
def graph_length_groups() -> Iterator[None]:
    """Within this block class suffixes run in length groups priced at :data:`GRAPHED_GROUP_COST` on every device:
    for the steps of a run whose steps are captured in CUDA graphs (every step of it, eager warm-ups included, so
    a replay computes what the eager step computes)."""
    token = _GRAPHED.set(True)
    try:
        yield
    finally:
        _GRAPHED.reset(token)


def group_cost(device: torch.device) -> float | None:
    """The price of an extra length group on ``device`` now (None: one group padded to the longest suffix)."""
    return GRAPHED_GROUP_COST if _GRAPHED.get() else GROUP_COST_POSITIONS.get(device.type)


@dataclass(frozen=True)
class PromptTokens:
    """Tokenized prompt strings: ids (N, L), their frozen token embeddings (N, L, d) and EOT positions (N,)."""

    ids: torch.Tensor
    embeddings: torch.Tensor
    eot_index: torch.Tensor


def eot_positions(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Where the text tower pools each sequence: argmax of the ids (EOT has the largest id in CLIP's vocabulary),
    or the first ``text_eos_id`` for models pooled with ``eos``."""
    pool_type = getattr(model, "text_pool_type", "argmax")
    if pool_type == "argmax":
        return ids.argmax(dim=-1)
    if pool_type == "eos":
        return (ids == model.text_eos_id).int().argmax(dim=-1)
    raise ValueError(f"Prompt tuning needs a text tower pooled at the EOT token ('argmax' or 'eos'); this model pools "
                     f"with {pool_type!r}")


@torch.no_grad()
def tokenize_prompts(backbone: Backbone, texts: Sequence[str], labels: Sequence[str] | None = None) -> PromptTokens:
    """Tokenize strings with the backbone's tokenizer and look up their (frozen) token embeddings. A text that does
    not fit the context length is a ValueError naming it (and its label, e.g. the class name), never cut."""
    model = backbone.model
    ids = backbone.tokenize(texts, labels).to(backbone.device)
    embeddings = model.token_embedding(ids).to(model.transformer.get_cast_dtype())
    return PromptTokens(ids=ids, embeddings=embeddings, eot_index=eot_positions(model, ids))


def host_positions(eot_index: torch.Tensor) -> list[int]:
    """The values of an EOT-position tensor on the host, read once per tensor (and again only if it is modified in
    place). A class set's EOT positions do not change from step to step; reading them from a GPU every step would
    make each step wait for the device (and forbid capturing it in a CUDA graph)."""
    cached = getattr(eot_index, "_host_positions", None)
    if cached is None or cached[0] != eot_index._version:
        cached = (eot_index._version, [int(v) for v in eot_index.flatten().tolist()])
        eot_index._host_positions = cached
    return cached[1]


@dataclass
class PackedLayout:
    """How the shared-prefix pass packs one class set's suffixes (fixed for a class set, so built once per EOT
    tensor, prefix length, prefix count and device): the length groups, their class indices and attention masks on
    the device, and the packed row of each class's EOT."""

    suffix_lengths: list[int]
    groups: list[tuple[list[int], int]]
    indices: list[torch.Tensor]  # per group: its classes, on the device
    masks: list[torch.Tensor]  # per group: (L_g, P + L_g) suffix-to-[prefix; suffix] causal mask
    last_masks: list[torch.Tensor]  # per group: (runs * C_g, 1, 1, P + L_g) mask of each class's EOT query
    pooled: torch.Tensor  # (runs, C) packed row of each class's EOT, on the device


def packed_layout(eot_index: torch.Tensor, runs: int, length: int, device: torch.device,
                  group_cost: float | None) -> PackedLayout:
    """The :class:`PackedLayout` of ``eot_index`` for ``runs`` prefixes of ``length`` positions (cached on the EOT
    tensor, like :func:`host_positions`)."""
    positions = host_positions(eot_index)
    key = (eot_index._version, runs, length, str(device), group_cost)
    layouts = getattr(eot_index, "_packed_layouts", None)
    if layouts is None:
        layouts = eot_index._packed_layouts = {}
    if key not in layouts:
        if len(layouts) > 16:  # CoCoOp's last partial batch adds a variant; never grow without bound
            layouts.clear()
        suffix_lengths = [e - length + 1 for e in positions]
        groups = length_groups(suffix_lengths, group_cost)
        indices, masks, last_masks = [], [], []
        pooled = torch.empty(runs, len(suffix_lengths), dtype=torch.long)
        offset = runs * length
        for classes, group_length in groups:
            indices.append(torch.tensor(classes, device=device))
            keys = torch.arange(length + group_length)
            # suffix position i sees every prefix position and suffix positions <= i
            masks.append((keys.unsqueeze(0) <= torch.arange(group_length).unsqueeze(1) + length).to(device))
            last = torch.tensor([suffix_lengths[c] - 1 for c in classes]) + length
            last_mask = keys <= last.unsqueeze(1)
            last_masks.append(last_mask.unsqueeze(0).expand(runs, -1, -1).reshape(runs * len(classes), 1, 1, -1)
                              .to(device))
            local = torch.tensor([suffix_lengths[c] - 1 for c in classes])
            rows = (torch.arange(runs).unsqueeze(1) * len(classes) + torch.arange(len(classes))) * group_length
            pooled[:, classes] = offset + rows + local
            offset += runs * len(classes) * group_length
        layouts[key] = PackedLayout(suffix_lengths, groups, indices, masks, last_masks, pooled.to(device))
    return layouts[key]


def cached_layouts(eot_index: torch.Tensor) -> list[PackedLayout]:
    """The :class:`PackedLayout` objects cached on an EOT tensor (what a captured step that encodes its classes
    reads: a CUDA graph holds them so that the cache's bound cannot free them under it)."""
    return list(getattr(eot_index, "_packed_layouts", {}).values())


class PromptTextEncoder:
    """The frozen text tower of ``backbone`` as a function of prompt embeddings.

    Not an ``nn.Module`` on purpose: it owns no tensors, so methods holding one keep the frozen CLIP out of their
    parameters, checkpoints and ``train()``/``eval()`` switches."""

    def __init__(self, backbone: Backbone) -> None:
        model = backbone.model
        eot_positions(model, torch.zeros(1, 1, dtype=torch.long))  # fail early on a tower not pooled at EOT
        self.model = model
        self.context_length = int(model.positional_embedding.shape[0])
        self.width = int(model.positional_embedding.shape[1])
        # Truncation is exact only under a causal mask; a tower without one runs every position it is given.
        self.causal = getattr(model, "attn_mask", None) is not None
        # CLIP's own causal mask (checked once): the fused blocks and the shared prefix may use is_causal for it
        self.clip_causal_mask = self.causal and is_causal_mask(model.attn_mask)
        #: run the blocks fused (one input-projection matmul + scaled_dot_product_attention) where supported
        self.fused_attention = True
        #: encode_classes computes the positions every class shares once (needs the causal mask, fused blocks)
        self.shared_prefix = True
        #: encode_classes groups class suffixes by length (False: one group padded to the longest suffix)
        self.length_groups = True

    def shares_prefix(self) -> bool:
        """Whether :meth:`encode_classes` takes the shared-prefix pass: it is on, the tower is causal with CLIP's
        mask, every block runs fused, and :meth:`forward` is this class's own (a subclass that redefines the pass
        gets every prompt through it)."""
        model = self.model
        return (self.shared_prefix and self.fused_attention and self.clip_causal_mask
                and type(self).forward is PromptTextEncoder.forward and fused_tower_supported(model.transformer))

    def __call__(self, prompt_embeddings: torch.Tensor, eot_index: torch.Tensor,
                 deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        if len(deep_prompts):
            return self.forward(prompt_embeddings, eot_index, deep_prompts)
        return self.forward(prompt_embeddings, eot_index)  # the two-argument call the text-only methods make

    def forward(self, prompt_embeddings: torch.Tensor, eot_index: torch.Tensor,
                deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Un-normalised text features (..., C, D) of prompt embeddings (..., C, L, d) pooled at ``eot_index``.

        ``eot_index`` is (C,) (shared by the leading dims) or (..., C); ``L`` is from ``max(eot_index) + 1`` to the
        context length. ``deep_prompts``: one (R, M, d) tensor per block 1..J-1 (R = the product of the leading dims
        before C), written into positions 1..M."""
        if prompt_embeddings.dim() < 3 or prompt_embeddings.shape[-1] != self.width:
            raise ValueError(f"prompt_embeddings must be (..., C, L, {self.width}), got {tuple(prompt_embeddings.shape)}")
        *lead, length, width = prompt_embeddings.shape
        if length > self.context_length:
            raise ValueError(f"prompts have {length} positions, more than the context length {self.context_length}")
        positions = host_positions(eot_index)
        eot_index = eot_index.to(prompt_embeddings.device).long().expand(*lead)
        n_used = max(positions) + 1 if self.causal else length
        if n_used > length:
            raise ValueError(f"eot_index points at position {n_used - 1} but prompts have only {length} positions")

        model = self.model
        x = prompt_embeddings[..., :n_used, :].reshape(-1, n_used, width)
        x = x.to(model.transformer.get_cast_dtype()) + model.positional_embedding[:n_used].to(x.dtype)
        mask = model.attn_mask[:n_used, :n_used] if self.causal else None
        if deep_prompts:
            runs = math.prod(lead[:-1])
            deep = [runs_to_batch(p.reshape(runs, *p.shape[-2:]), lead[-1]) for p in deep_prompts]
            if any(p.shape[1] >= min(positions) for p in deep):
                raise ValueError(f"deep text prompts of {deep[0].shape[1]} tokens would overwrite an EOT token "
                                 f"(the earliest is at position {min(positions)})")
            x = run_blocks(model.transformer, x, mask, deep, "text", fused=self.fused_attention,
                           pooled_rows=eot_index.reshape(-1), causal=self.clip_causal_mask)
        elif self.fused_attention:
            x = run_blocks(model.transformer, x, mask, [], "text", pooled_rows=eot_index.reshape(-1),
                           causal=self.clip_causal_mask)
        else:
            x = model.transformer(x, attn_mask=mask)
            x = x[torch.arange(x.shape[0], device=x.device), eot_index.reshape(-1)]
        return self.project(x).reshape(*lead, -1)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``ln_final`` and ``text_projection`` of pooled hidden states (N, w) -> (N, D). LayerNorm is per position,
        so normalising only the pooled rows is the same as normalising all and pooling after."""
        model = self.model
        x = model.ln_final(x)
        projection = model.text_projection
        if isinstance(projection, nn.Linear):
            x = projection(x)
        elif projection is not None:
            x = x @ projection
        return x

    def encode_classes(self, prefix: torch.Tensor, suffix: torch.Tensor, eot_index: torch.Tensor,
                       deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Un-normalised text features (*lead, C, D) of the prompts ``[prefix; suffix[c]]``.

        ``prefix`` (*lead, P, d): positions 0..P-1, the same for every class (SOT, the context, ...), e.g. lead
        (R,) for R runs or (R, B) for CoCoOp's per-image context; ``suffix`` (C, S, d): positions P..P+S-1 of each
        class, the same for every leading index (frozen class tokens); ``eot_index`` (C,): each class's EOT
        position, P <= eot < P + S; ``deep_prompts``: one (prod(lead), M, d) tensor per block 1..J-1, written into
        positions 1..M (1 + M <= P). The prefix is computed once per leading index (see the module docstring);
        where :meth:`shares_prefix` is False every prompt is assembled and runs through :meth:`forward`.
        """
        if prefix.dim() < 2 or suffix.dim() != 3 or prefix.shape[-1] != self.width or suffix.shape[-1] != self.width:
            raise ValueError(f"prefix must be (..., P, {self.width}) and suffix (C, S, {self.width}), got "
                             f"{tuple(prefix.shape)} and {tuple(suffix.shape)}")
        *lead, length, width = prefix.shape
        classes = suffix.shape[0]
        if eot_index.shape != (classes,):
            raise ValueError(f"eot_index must be ({classes},), one position per class, got {tuple(eot_index.shape)}")
        positions = host_positions(eot_index)
        if min(positions) < length or max(positions) >= length + suffix.shape[1]:
            raise ValueError(f"every EOT must lie in the class suffix (positions {length}..{length + suffix.shape[1] - 1}"
                             f"), got positions {min(positions)}..{max(positions)}")
        if len(deep_prompts) >= len(self.model.transformer.resblocks):
            raise ValueError(f"{len(deep_prompts)} deep prompt sets need more than the tower's "
                             f"{len(self.model.transformer.resblocks)} blocks")
        if any(1 + p.shape[-2] > length for p in deep_prompts):
            raise ValueError(f"deep text prompts of {deep_prompts[0].shape[-2]} tokens do not fit the shared prefix "
                             f"of {length} positions")
        if not self.shares_prefix():
            prompts = torch.cat([prefix.unsqueeze(-3).expand(*lead, classes, length, width),
                                 suffix.to(prefix.dtype).expand(*lead, *suffix.shape)], dim=-2)
            return self.forward(prompts, eot_index, deep_prompts)
        return self._shared_prefix_pass(prefix, suffix, eot_index, deep_prompts)

    def _shared_prefix_pass(self, prefix: torch.Tensor, suffix: torch.Tensor, eot_index: torch.Tensor,
                            deep_prompts: Sequence[torch.Tensor]) -> torch.Tensor:
        model = self.model
        *lead, length, width = prefix.shape
        runs = math.prod(lead)  # prefixes (the leading indices)
        dtype = model.transformer.get_cast_dtype()
        positional = model.positional_embedding.to(dtype)
        cost = group_cost(prefix.device) if self.length_groups else None
        layout = packed_layout(eot_index, runs, length, prefix.device, cost / runs if cost is not None else None)
        suffix_lengths, groups = layout.suffix_lengths, layout.groups

        # Packed states: the prefixes (runs * P rows), then each group's suffixes (runs * C_g * L_g rows).
        parts = [(prefix.reshape(runs, length, width).to(dtype) + positional[:length]).reshape(-1, width)]
        for (classes, group_length), index in zip(groups, layout.indices):
            x = suffix.index_select(0, index)[:, :group_length].to(dtype) + positional[length:length + group_length]
            parts.append(x.expand(runs, *x.shape).reshape(-1, width))
        sizes = [p.shape[0] for p in parts]
        x = torch.cat(parts)

        deep = [p.reshape(runs, *p.shape[-2:]) for p in deep_prompts]
        blocks = model.transformer.resblocks
        for i, block in enumerate(blocks):
            if 1 <= i <= len(deep):
                head = replace_slot(x[:sizes[0]].view(runs, length, width), deep[i - 1], "text")
                x = torch.cat([head.reshape(-1, width), x[sizes[0]:]])
            if i == len(blocks) - 1:
                x = self._pooled_last_block(block, x, sizes, layout, runs, length)
                break
            heads = block.attn.num_heads
            qkv = attention_input(block, x).split(sizes)
            q, k_prefix, v_prefix = split_heads(qkv[0].view(runs, length, -1), heads)  # (runs, H, P, d_h)
            attended = [merge_heads(F.scaled_dot_product_attention(q, k_prefix, v_prefix, is_causal=True))
                        .reshape(-1, width)]
            for (classes, group_length), part, mask in zip(groups, qkv[1:], layout.masks):
                n = runs * len(classes)
                q, k, v = split_heads(part.view(n, group_length, -1), heads)  # (runs * C_g, H, L_g, d_h)
                k = torch.cat([_per_class(k_prefix, len(classes)), k], dim=2)
                v = torch.cat([_per_class(v_prefix, len(classes)), v], dim=2)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                attended.append(merge_heads(out).reshape(-1, width))
            x = block_residuals(block, x, torch.cat(attended))
        return self.project(x).reshape(*lead, len(suffix_lengths), -1)

    @staticmethod
    def _pooled_last_block(block: nn.Module, x: torch.Tensor, sizes: list[int], layout: PackedLayout, runs: int,
                           length: int) -> torch.Tensor:
        """The last block at the pooled (EOT) rows only, (runs * C, w) run-major: keys and values of every packed
        row, the query, output projection and MLP of the EOT rows (the prefix and the other suffix rows are only
        read as keys)."""
        attn = block.attn
        width, heads = x.shape[-1], attn.num_heads
        bias = attn.in_proj_bias
        h = block.ln_1(x)
        suffix_lengths = layout.suffix_lengths
        rows = layout.pooled.flatten()
        q = F.linear(h.index_select(0, rows), attn.in_proj_weight[:width], None if bias is None else bias[:width])
        q = q.view(runs, len(suffix_lengths), heads, 1, width // heads)
        kv = F.linear(h, attn.in_proj_weight[width:], None if bias is None else bias[width:]).split(sizes)
        k_prefix, v_prefix = kv[0].view(runs, length, 2, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attended = torch.zeros(runs, len(suffix_lengths), width, dtype=q.dtype, device=q.device)
        for (classes, group_length), part, index, mask in zip(layout.groups, kv[1:], layout.indices,
                                                              layout.last_masks):
            n = runs * len(classes)
            k, v = part.view(n, group_length, 2, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
            k = torch.cat([_per_class(k_prefix, len(classes)), k], dim=2)
            v = torch.cat([_per_class(v_prefix, len(classes)), v], dim=2)
            # the EOT of class c (suffix position suffix_lengths[c] - 1) sees the prefix and its suffix up to there
            out = F.scaled_dot_product_attention(q.index_select(1, index).reshape(n, heads, 1, -1), k, v,
                                                 attn_mask=mask)
            attended = attended.index_copy(1, index, out.reshape(runs, len(classes), width))
        return block_residuals(block, x.index_select(0, rows), attended.reshape(-1, width))


def _per_class(prefix_states: torch.Tensor, classes: int) -> torch.Tensor:
    """(runs, H, P, d) -> (runs * classes, H, P, d), run-major: each class of a run reads its run's prefix."""
    runs = prefix_states.shape[0]
    return prefix_states.unsqueeze(1).expand(runs, classes, *prefix_states.shape[1:]).reshape(
        runs * classes, *prefix_states.shape[1:])


def length_groups(lengths: Sequence[int], group_cost: float | None) -> list[tuple[list[int], int]]:
    """Partition classes by suffix length into groups of (class indices, padded group length).

    ``group_cost`` None: one group padded to the longest suffix. Otherwise classes sorted by length are cut into
    consecutive groups minimising ``sum_g C_g * L_g + group_cost * (number of groups)``, i.e. the positions run
    (padding included) plus a fixed price per extra attention call, measured in positions of one prefix
    (``GROUP_COST_POSITIONS[device] / prefixes``): on a CPU padding is dear and calls are cheap, so nearly every
    length gets its own group; on a GPU calls cost more than padding, so there is one group.
    """
    if group_cost is None:
        return [(list(range(len(lengths))), max(lengths))]
    distinct = sorted(set(lengths))
    count = [sum(1 for n in lengths if n == value) for value in distinct]
    # best[j]: cheapest cost of grouping the first j distinct lengths; cut[j]: where its last group starts
    best, cut = [0.0] + [math.inf] * len(distinct), [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        members = 0
        for i in range(j, 0, -1):  # last group = distinct[i-1 .. j-1], padded to distinct[j-1]
            members += count[i - 1]
            cost = best[i - 1] + members * distinct[j - 1] + group_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    bounds, j = [], len(distinct)
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    groups = []
    for start, end in reversed(bounds):
        low, high = distinct[start], distinct[end - 1]
        groups.append(([c for c, n in enumerate(lengths) if low <= n <= high], high))
    return groups
