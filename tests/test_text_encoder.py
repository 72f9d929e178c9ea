"""The truncated prompt text encoder equals CLIP's full 77-token text tower, in outputs and in gradients."""

from __future__ import annotations

import pytest
import torch

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.clip.text_encoder import PromptTextEncoder, tokenize_prompts
from helpers import token_embeddings_replaced_by

TEXTS = ["a photo of a cat.", "a photo of a great crested newt, a type of pet.", "X X X X dog."]


def full_clip_pass(model, ids, prompts):
    """CLIP's ``encode_text`` over all 77 positions on (R, C, 77, d) prompt embeddings."""
    runs, classes = prompts.shape[:2]
    with token_embeddings_replaced_by(model, prompts.reshape(runs * classes, *prompts.shape[2:])):
        out = model.encode_text(ids.repeat(runs, 1))
    return out.reshape(runs, classes, -1)


def test_plain_token_embeddings_give_encode_text(tiny):
    tokens = tokenize_prompts(tiny, TEXTS)
    assert tokens.embeddings.shape == (3, 77, tiny.architecture["text_width"])
    assert tokens.eot_index.tolist() == (tokens.ids == 49407).int().argmax(-1).tolist()
    ours = PromptTextEncoder(tiny)(tokens.embeddings, tokens.eot_index)
    torch.testing.assert_close(ours, tiny.encode_text(TEXTS), atol=1e-5, rtol=1e-5)


def test_truncated_pass_matches_full_pass_in_outputs_and_gradients(tiny):
    torch.manual_seed(0)
    tokens = tokenize_prompts(tiny, TEXTS)
    base = tokens.embeddings.unsqueeze(0).repeat(2, 1, 1, 1)
    base = base + 0.05 * torch.randn_like(base)  # two different "runs" of learned prompts
    weights = torch.randn(2, 3, tiny.embed_dim)

    full_in = base.clone().requires_grad_(True)
    full = full_clip_pass(tiny.model, tokens.ids, full_in)
    (full * weights).sum().backward()

    seen_lengths = []
    first_norm = tiny.model.transformer.resblocks[0].ln_1  # sees the (N, L, w) states in both block paths
    hook = first_norm.register_forward_pre_hook(lambda module, args: seen_lengths.append(args[0].shape[1]))
    try:
        ours_in = base.clone().requires_grad_(True)
        ours = PromptTextEncoder(tiny)(ours_in, tokens.eot_index)
        (ours * weights).sum().backward()
    finally:
        hook.remove()

    assert seen_lengths == [int(tokens.eot_index.max()) + 1] and seen_lengths[0] < 77
    assert ours.shape == (2, 3, tiny.embed_dim)
    torch.testing.assert_close(ours, full, atol=1e-5, rtol=1e-5)
    # fp32 summation order differs (14 vs 77 keys), so compare gradients relative to their scale
    scale = full_in.grad.abs().max()
    assert scale > 0
    torch.testing.assert_close(ours_in.grad / scale, full_in.grad / scale, atol=1e-5, rtol=0)
    # positions after each prompt's EOT never influence its features
    for c, eot in enumerate(tokens.eot_index.tolist()):
        assert ours_in.grad[:, c, eot + 1:].abs().max() == 0


def test_truncation_is_exact_in_float64():
    tiny64 = load_backbone(BackboneConfig("atlas-tiny", None))
    tiny64.model.double()
    tokens = tokenize_prompts(tiny64, TEXTS)
    full_in = tokens.embeddings.unsqueeze(0).clone().requires_grad_(True)
    full_clip_pass(tiny64.model, tokens.ids, full_in).sum().backward()
    ours_in = tokens.embeddings.unsqueeze(0).clone().requires_grad_(True)
    PromptTextEncoder(tiny64)(ours_in, tokens.eot_index).sum().backward()
    torch.testing.assert_close(ours_in.grad, full_in.grad, atol=1e-10, rtol=1e-10)


def test_per_run_eot_index_and_pre_truncated_prompts(tiny):
    tokens = tokenize_prompts(tiny, TEXTS)
    n_used = int(tokens.eot_index.max()) + 1
    short = tokens.embeddings[:, :n_used].unsqueeze(0).repeat(2, 1, 1, 1)
    encoder = PromptTextEncoder(tiny)
    out = encoder(short, tokens.eot_index.unsqueeze(0).repeat(2, 1))
    torch.testing.assert_close(out[1], tiny.encode_text(TEXTS), atol=1e-5, rtol=1e-5)


def test_shape_errors_name_the_problem(tiny):
    tokens = tokenize_prompts(tiny, TEXTS)
    encoder = PromptTextEncoder(tiny)
    with pytest.raises(ValueError, match=r"\(\.\.\., C, L, 64\)"):
        encoder(tokens.embeddings[..., :10], tokens.eot_index)
    with pytest.raises(ValueError, match="only 5 positions"):
        encoder(tokens.embeddings[:, :5], tokens.eot_index)
