"""Small test utilities (helpers the fixtures and tests call; the fixtures themselves are in conftest.py)."""

import contextlib

import torch
import torch.nn.functional as F


@contextlib.contextmanager
def token_embeddings_replaced_by(model, embeddings):
    """Make CLIP's own ``encode_text`` read ``embeddings`` instead of its token-embedding lookup."""
    handle = model.token_embedding.register_forward_hook(lambda module, args, output: embeddings)
    try:
        yield
    finally:
        handle.remove()


def reference_text_features(backbone, ctx, classnames, prompt_prefix, position="end", normalize=True):
    """CoOp's PromptLearner.forward + TextEncoder: per-class concatenation over all 77 positions, CLIP encode_text
    (L2-normalised unless ``normalize=False``)."""
    model, tokenizer = backbone.model, backbone.tokenizer
    m = ctx.shape[-2]
    names = [n.replace("_", " ") for n in classnames]
    ids = tokenizer([f"{prompt_prefix} {n}." for n in names])
    with torch.no_grad():
        embedding = model.token_embedding(ids)
    prefix, suffix = embedding[:, :1], embedding[:, 1 + m:]
    ctx = ctx if ctx.dim() == 3 else ctx.unsqueeze(0).expand(len(names), -1, -1)
    prompts = []
    for i, name in enumerate(names):
        n, half = len(tokenizer.encode(name)), m // 2
        name_tokens, rest = suffix[i:i + 1, :n], suffix[i:i + 1, n:]
        if position == "end":
            parts = [prefix[i:i + 1], ctx[i:i + 1], suffix[i:i + 1]]
        elif position == "middle":
            parts = [prefix[i:i + 1], ctx[i:i + 1, :half], name_tokens, ctx[i:i + 1, half:], rest]
        else:
            parts = [prefix[i:i + 1], name_tokens, ctx[i:i + 1], rest]
        prompts.append(torch.cat(parts, dim=1))
    with token_embeddings_replaced_by(model, torch.cat(prompts)):
        features = model.encode_text(ids)
    return F.normalize(features, dim=-1) if normalize else features


def pixel_test_logits(method, pixels):
    """Test-time logits (R, B, C) of a pixel method on pixels (B, 3, H, W) for its current class set, as the engine
    computes them (engine/evaluate.py's pixel_scores): the class set's classifier of the batch's pixel features."""
    return method.pixel_classifier()(method.eval_pixel_features(pixels))


def cross_entropy_criterion(labels, sizes=None, runs=1):
    """The plain one-hot criterion (``atlas_fast.atlas.criterion.LossCriterion``) of a batch: ``labels`` (B,) seen
    by ``runs`` runs, or (R, B) one batch per run whose first ``sizes[r]`` rows are run r's (default: all of them)."""
    from atlas_fast.atlas.criterion import LossCriterion

    per_run = labels if labels.dim() == 2 else labels.expand(runs, -1)
    sizes = list(sizes) if sizes is not None else [per_run.shape[1]] * per_run.shape[0]
    return LossCriterion(lambda z, r: F.cross_entropy(z, per_run[r, :len(z)]), sizes)


def assert_gradients_close(actual, expected):
    """Gradients equal up to 1e-5 of the largest entry (fp32; the cached and literal paths sum in different orders)."""
    scale = expected.abs().max()
    assert scale > 0, "the reference gradient is zero: the test would not see a wrong gradient"
    torch.testing.assert_close(actual / scale, expected / scale, atol=1e-5, rtol=0)


def small_pets(tmp_path_factory, name: str):
    """A fresh folder ``<name>N/`` holding the small synthetic OxfordPets the end-to-end tests train on (4 classes,
    4 train / 1 val / 2 test images each, 32 px, under ``data/``); returns the folder (caches and results go beside)."""
    from layouts import make_oxford_pets

    root = tmp_path_factory.mktemp(name)
    make_oxford_pets(root / "data", n_classes=4, n_train=4, n_val=1, n_test=2, size=32)
    return root


def eight_class_pets(tmp_path_factory, name: str):
    """A fresh folder ``<name>N/`` holding an 8-class synthetic OxfordPets (4 train / 2 val / 3 test images each,
    36 px, under ``data/``): enough classes for a 4/4 base/new split; the record names pinned in the tests that use
    it depend on these sizes."""
    from layouts import make_oxford_pets

    root = tmp_path_factory.mktemp(name)
    make_oxford_pets(root / "data", n_classes=8, n_train=4, n_val=2, n_test=3, size=36)
    return root


def tiny_pets_config(root, **changes):
    """A TrainConfig for the tiny random CLIP on the synthetic OxfordPets written under ``root / "data"`` (4 shots,
    2 epochs, 1 cached view, batch 3, lr 0.05, no progress); ``changes`` replace any field."""
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig

    base = dict(dataset="OxfordPets", data_root=root / "data", backbone=BackboneConfig("atlas-tiny", None), shots=4,
                seed=1, epochs=2, views=1, batch_size=3, lr=0.05, cache_root=root / "cache",
                results_dir=root / "results", progress=False)
    return TrainConfig(**{**base, **changes})


def run_killed_at_step(monkeypatch, module, step: int, run) -> None:
    """Call ``run()`` with ``module._lr_at`` (the learning-rate schedule a pretraining loop asks every step) raising
    KeyboardInterrupt at ``step``: a training run killed mid-way, after the checkpoints before that step."""
    import pytest

    real_lr = module._lr_at

    def crash(at, cfg):
        if at == step:
            raise KeyboardInterrupt("killed")
        return real_lr(at, cfg)

    monkeypatch.setattr(module, "_lr_at", crash)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(module, "_lr_at", real_lr)


def assert_same_calibration(got, expected, abs=1e-3):
    """Two records' calibration figures (``metrics["calibration"]``) equal up to float reordering (a group's pass
    against a run's own, a resumed sweep against a fresh run): every figure of the method's logits to ``abs`` (ECE and
    confidence are in percent: 1e-3 is 1e-5 of a probability, what logits 1e-5 apart give); the
    fitted temperature, the minimum of an NLL that is flat around it (logits 1e-6 apart move it by ~1e-3 relative),
    to 1e-2 relative, and the figures after dividing by it to 1e-2."""
    import pytest

    assert got.keys() == expected.keys()
    for name, figures in got.items():
        assert figures.keys() == expected[name].keys(), name
        for key, value in figures.items():
            if key == "temperature":
                tolerance = pytest.approx(expected[name][key], rel=1e-2)
            else:
                tolerance = pytest.approx(expected[name][key], abs=1e-2 if key.endswith("_ts") else abs)
            assert value == tolerance, (name, key, value, expected[name][key])


def fake_cuda_streams(monkeypatch) -> None:
    """torch.cuda's streams, stream context and graph pool faked on the CPU, and CUDA graphs declared available to the
    engine: what every fake of graphed steps starts from (each test file fakes the capture and replay itself)."""
    from atlas_fast.engine import graphs, loop

    class Stream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(graphs, "graphs_available", lambda device: True)
    monkeypatch.setattr(loop, "graphs_available", lambda device: True)
