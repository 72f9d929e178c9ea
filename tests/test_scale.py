"""What must not grow with the test set or the number of runs at the paper's scale (ImageNet: 1,000 classes, 50,000
test images, sweeps of many runs): evaluation streams its logits chunk by chunk; planning a sweep lists,
fingerprints and relabels the shared data once, not once per run; the runs of a group on the same images share
their preloaded views; PromptSRC's teacher text is encoded once per process. The figures at the real sizes are
measured by benchmarks/scale_overhead.py; these tests check the mechanisms on small data."""

from __future__ import annotations

import weakref

import pytest
import torch

import atlas_fast.methods.base as method_base
from atlas_fast.engine.evaluate import EvalSet, evaluate_method, streamed_top1, top1_accuracy
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.registry import build_method

CLASSNAMES = tuple(f"class {i}" for i in range(9))


class ChunkCounter(PromptMethod):
    """A method that serves fixed logits chunk by chunk and records how many earlier chunks were still alive (held
    by the evaluation) each time it made the next one."""

    name = "chunk-counter"

    def __init__(self, logits: torch.Tensor, chunk: int) -> None:
        torch.nn.Module.__init__(self)
        self.logits, self.chunk, self.alive_at_each_chunk = logits, chunk, []
        self.classnames = ()
        self.register_buffer("anchor", torch.zeros(1))

    def set_classnames(self, classnames):
        self.classnames = tuple(classnames)

    def eval_logit_chunks(self, features):
        made: list[weakref.ref] = []
        for part in self.logits.split(self.chunk, dim=1):
            self.alive_at_each_chunk.append(sum(ref() is not None for ref in made))
            out = part.clone()
            made.append(weakref.ref(out))
            yield out


def test_evaluation_holds_one_chunk_of_logits_not_the_whole_test_set():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 1000, len(CLASSNAMES), generator=generator)
    labels = torch.randint(0, len(CLASSNAMES), (1000,), generator=generator)
    method = ChunkCounter(logits, chunk=37)
    eval_set = EvalSet("all", CLASSNAMES, torch.zeros(1000, 4), labels)
    accuracy = evaluate_method(method, [eval_set])["all"]
    assert len(method.alive_at_each_chunk) == 28
    # the chunk before the one being made is the only one the evaluation may still hold (its loop variable)
    assert max(method.alive_at_each_chunk) <= 1
    assert accuracy == top1_accuracy(logits, labels).tolist()


def test_streamed_accuracy_equals_the_whole_split_accuracy_exactly():
    generator = torch.Generator().manual_seed(1)
    for n, chunk in ((1, 1), (50_000, 1024), (4097, 4096), (333, 7)):
        logits = torch.randn(3, n, 5, generator=generator)
        labels = torch.randint(0, 5, (n,), generator=generator)
        streamed = streamed_top1(logits.split(chunk, dim=1), labels)
        assert streamed.tolist() == top1_accuracy(logits, labels).tolist()
    with pytest.raises(ValueError, match="cover 4 images but there are 5 labels"):
        streamed_top1([torch.zeros(1, 4, 2)], torch.zeros(5, dtype=torch.long))


@pytest.mark.parametrize("name", ["coop", "cocoop", "dept-coop"])
def test_a_method_evaluated_in_small_chunks_gives_the_accuracy_and_logits_of_one_pass(tiny, monkeypatch, name):
    torch.manual_seed(0)
    config = build_method(name, tiny, CLASSNAMES).config
    method = build_method(name, tiny, CLASSNAMES, config)
    features = torch.randn(300, tiny.embed_dim)
    whole = method.eval_logits(features)
    labels = whole[0].argmax(-1).roll(3)
    labels[::4] = whole[0].argmax(-1)[::4]  # some hits, some misses
    eval_set = EvalSet("all", CLASSNAMES, features, labels)
    one_pass = evaluate_method(method, [eval_set])["all"]
    monkeypatch.setattr(method_base, "EVAL_BATCH", 16)
    if name in ("cocoop", "dept-coop") and hasattr(getattr(method, "base", method), "eval_sequences"):
        monkeypatch.setattr(getattr(method, "base", method), "eval_sequences", 16 * len(CLASSNAMES))
    chunks = list(method.eval_logit_chunks(features))
    assert len(chunks) == 300 // 16 + 1
    torch.testing.assert_close(torch.cat(chunks, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert evaluate_method(method, [eval_set])["all"] == one_pass == top1_accuracy(whole, labels).tolist()


@pytest.fixture(scope="module")
def small_imagenet(tmp_path_factory):
    """A 6-class ImageNet in its real layout (val is the test list): 5 train and 4 val images per class."""
    from layouts import make_imagenet

    root = tmp_path_factory.mktemp("scale")
    make_imagenet(root / "data", n_classes=6, n_train=5, n_val=4)
    return root


def _configs(root, seeds):
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine.config import TrainConfig

    return [TrainConfig("ImageNet", root / "data", backbone=BackboneConfig("atlas-tiny", None), shots=2, seed=seed,
                        cache_root=root / "cache", results_dir=root / "results", device="cpu", progress=False)
            for seed in seeds]


def test_a_sweep_looks_at_each_file_and_hashes_the_full_listing_once_not_once_per_run(small_imagenet, monkeypatch):
    import atlas_fast.data.fewshot as fewshot
    import atlas_fast.data.identity as identity
    from atlas_fast.engine.spec import plan_run
    from atlas_fast.sweep.grid import plan_sweep

    seeds = (1, 2, 3, 4, 5)
    alone = [plan_run(config) for config in _configs(small_imagenet, seeds)]  # no sweep: nothing shared
    calls: dict[str, list] = {"identity": [], "listing": [], "source": [], "relabel": []}

    def counted(kind, function, record=lambda *args: args[0]):
        def wrapper(*args, **kwargs):
            calls[kind].append(record(*args))
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(identity, "image_identity", counted("identity", identity.image_identity))
    monkeypatch.setattr(identity, "listing_fingerprint", counted("listing", identity.listing_fingerprint,
                                                                 lambda splits: len(splits.train)))
    monkeypatch.setattr(fewshot, "fewshot_source", counted("source", fewshot.fewshot_source))
    monkeypatch.setattr(fewshot, "_relabeled", counted("relabel", fewshot._relabeled))
    specs = plan_sweep(_configs(small_imagenet, seeds))
    assert [s.stem for s in specs] == [s.stem for s in alone]  # the same runs, the same record names
    assert [s.data.fingerprint for s in specs] == [s.data.fingerprint for s in alone]
    test_files = {d.impath for d in alone[0].data.fewshot.test}
    looked_at = [path for path in calls["identity"] if path in test_files]
    assert sorted(looked_at) == sorted(test_files)  # each of the 24 test images once for the 5 runs
    assert calls["listing"].count(30) == 1  # the full listing (6 x 5 train images) hashed once
    assert len(calls["source"]) == 1
    # relabelled per run: its 2 x 6 few-shot train images (base + new); once per sweep: the 24 test images and
    # the 24 of val (ImageNet's val is the test list), each in the base or the new half
    assert len(calls["relabel"]) == len(seeds) * 12 + 2 * 24


def test_runs_of_a_group_on_the_same_images_share_one_copy_of_their_preloaded_views(small_imagenet):
    """The label variants of one seed train on the same images: one preloaded copy of their cached views per group
    (ImageNet base-to-new: 800 MB per copy), the same features a lone run reads."""
    import dataclasses

    from atlas_fast.engine.feed import prepare_inputs
    from atlas_fast.engine.spec import plan_run

    first, other_seed = _configs(small_imagenet, (1, 2))
    configs = [first, dataclasses.replace(first, eval_every_epoch=True), other_seed]
    specs = [plan_run(dataclasses.replace(c, views=2, epochs=2)) for c in configs]
    backbone = specs[0].backbone()
    read_once: dict = {}
    inputs = [prepare_inputs(spec, backbone, read_once) for spec in specs]
    assert inputs[0].train_inputs is inputs[1].train_inputs
    assert inputs[2].train_inputs is not inputs[0].train_inputs
    alone = prepare_inputs(specs[1], backbone)
    for epoch in (0, 1):
        assert torch.equal(alone.train_inputs.for_epoch(epoch), inputs[1].train_inputs.for_epoch(epoch))


def test_promptsrc_encodes_its_teacher_text_once_per_process_not_once_per_run(tiny, monkeypatch):
    """PromptSRC's runs train one by one; its teacher features (60 templates x C prompts: 60,000 full-length
    sequences for ImageNet) are the same for every run on a class set, so the second run reuses the first's."""
    import atlas_fast.methods.promptsrc as promptsrc
    from atlas_fast.data.templates import IMAGENET_TEMPLATES
    from atlas_fast.methods.promptsrc import PromptSRCConfig

    monkeypatch.setattr(promptsrc, "_TEMPLATE_FEATURES", {})
    calls = []
    encode = promptsrc.encode_class_prompts
    monkeypatch.setattr(promptsrc, "encode_class_prompts",
                        lambda backbone, prompts: calls.append(len(prompts)) or encode(backbone, prompts))
    config = PromptSRCConfig(depth_text=2, depth_vision=2)
    runs = [build_method("promptsrc", tiny, CLASSNAMES[:2], config) for _ in range(2)]
    first, second = (run.template_text_features(CLASSNAMES[:2]) for run in runs)
    assert calls == [len(CLASSNAMES[:2])] * len(IMAGENET_TEMPLATES)  # one run's worth of prompts, not two
    assert second is first
    expected = sum(encode(tiny, [t.format(n) for n in CLASSNAMES[:2]]) for t in IMAGENET_TEMPLATES)
    expected = expected / len(IMAGENET_TEMPLATES)
    torch.testing.assert_close(first, expected, atol=0, rtol=0)
    runs[0].set_classnames(CLASSNAMES[:1])
    runs[0].template_text_features(CLASSNAMES[:1])
    assert len(calls) == 2 * len(IMAGENET_TEMPLATES)  # another class set is its own entry
