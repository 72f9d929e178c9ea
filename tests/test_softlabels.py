"""Soft labels: LS, CSL, ISL and their mix against hand-computed cases, the paper presets, validation and the store."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.data.base import DatasetSplits, Datum
from atlas_fast.atlas.softlabels import (SoftLabelConfig, soft_label_preset, class_soft_labels,
                                   compute_soft_labels, instance_soft_labels, mixed_soft_labels, uniform_ls)


@pytest.fixture(scope="module")
def tiny():
    return load_backbone(BackboneConfig("atlas-tiny", None))


def small_splits(n_items: int = 10) -> DatasetSplits:
    classnames = ("abyssinian", "american_bulldog", "boxer", "sphynx")
    train = tuple(Datum(impath=f"/data/pets/images/{i}.jpg", label=i % 4, classname=classnames[i % 4],
                        key=f"images/{i}.jpg") for i in range(n_items))
    return DatasetSplits(name="OxfordPets", dataset_dir=Path("/data/pets"), train=train, val=(), test=(),
                         classnames=classnames, template="a photo of a {}, a type of pet.")


def test_uniform_ls_by_hand():
    rows = uniform_ls(torch.tensor([2, 0]), 4, 0.1)
    torch.testing.assert_close(rows, torch.tensor([[0.025, 0.025, 0.925, 0.025], [0.925, 0.025, 0.025, 0.025]]))


def test_csl_by_hand():
    # t1 = e1, t2 = e2, t3 = (e1 + e2) (normalised inside): cosines 0 and 1/sqrt(2)
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 2.0]])
    csl = class_soft_labels(embeddings, tau_c=0.5)
    r = 1 / math.sqrt(2)
    row0 = [math.exp(1 / 0.5), math.exp(0 / 0.5), math.exp(r / 0.5)]
    row2 = [math.exp(r / 0.5), math.exp(r / 0.5), math.exp(1 / 0.5)]
    expected = torch.tensor([[v / sum(row0) for v in row0], [row0[1] / sum(row0), row0[0] / sum(row0),
                             row0[2] / sum(row0)], [v / sum(row2) for v in row2]])
    torch.testing.assert_close(csl, expected, atol=1e-6, rtol=1e-5)


def test_csl_rows_sum_to_one_diagonal_is_max_and_top_k():
    torch.manual_seed(0)
    embeddings = torch.randn(12, 16)
    full = class_soft_labels(embeddings, tau_c=0.05)
    torch.testing.assert_close(full.sum(1), torch.ones(12))
    assert torch.equal(full.argmax(1), torch.arange(12))
    assert torch.equal(full.max(0).values, full.diagonal())  # the paper states it column-wise; A is symmetric in cos

    top = class_soft_labels(embeddings, tau_c=0.05, top_k=3)
    assert ((top > 0).sum(1) == 3).all()
    torch.testing.assert_close(top.sum(1), torch.ones(12))
    assert torch.equal(top.argmax(1), torch.arange(12))
    cos = F.normalize(embeddings, dim=-1) @ F.normalize(embeddings, dim=-1).t()
    kept = cos.topk(3, dim=1).indices
    for c in range(12):
        expected = torch.softmax(cos[c, kept[c]] / 0.05, dim=0)
        torch.testing.assert_close(top[c, kept[c]], expected, atol=1e-5, rtol=1e-4)
    # identical embeddings tie with the class itself: it still keeps its own entry
    tied = class_soft_labels(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), tau_c=0.1, top_k=1)
    torch.testing.assert_close(tied, torch.eye(3))


def test_isl_by_hand_for_both_deltas():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1]])
    labels = torch.tensor([1, 0])  # item 0: CLIP is wrong; item 1: CLIP is right
    wrong_only = instance_soft_labels(probs, labels, alpha=0.1, delta="wrong_only")
    torch.testing.assert_close(wrong_only, torch.tensor([[0.6 / 1.1, 0.4 / 1.1, 0.1 / 1.1], [0.6, 0.3, 0.1]]))
    always = instance_soft_labels(probs, labels, alpha=0.1, delta="always")
    torch.testing.assert_close(always, torch.tensor([[0.6 / 1.1, 0.4 / 1.1, 0.1 / 1.1], [0.7 / 1.1, 0.3 / 1.1,
                                                                                        0.1 / 1.1]]))
    for rows in (wrong_only, always):
        torch.testing.assert_close(rows.sum(1), torch.ones(2))
    torch.testing.assert_close(mixed_soft_labels(torch.eye(3)[labels], always, 0.25),
                               0.25 * torch.eye(3)[labels] + 0.75 * always)


def test_presets_follow_the_paper():
    b2n, fs, xd = soft_label_preset("base2new", "csl"), soft_label_preset("few_shot", "isl"), soft_label_preset("cross_dataset")
    assert (b2n.kind, b2n.theta, b2n.tau_c, b2n.alpha, b2n.delta) == ("csl", 0.1, 0.05, 0.1, "wrong_only")
    assert (fs.kind, fs.theta, fs.tau_c, fs.alpha, fs.delta) == ("isl", 0.05, 0.02, 0.1, "always")
    assert (xd.kind, xd.theta, xd.tau_c, xd.alpha, xd.delta) == ("ls", 0.1, 0.04, 1.0, "wrong_only")
    assert soft_label_preset("few_shot", "mix", w=0.5).w == 0.5
    with pytest.raises(ValueError, match="known"):
        soft_label_preset("zero_shot")


@pytest.mark.parametrize("field,value,message", [
    ("theta", 1.5, r"theta .* must be in \[0, 1\], got 1.5"),
    ("theta", -0.1, r"must be in \[0, 1\]"),
    ("tau_c", 0.0, r"tau_c .* must be > 0, got 0.0"),
    ("alpha", -1.0, r"alpha .* must be >= 0"),
    ("w", 2.0, r"w .* must be in \[0, 1\]"),
    ("top_k", 0, r"top_k must be None \(all classes\) or >= 1"),
    ("kind", "kd", r"kind must be one of \('ls', 'csl', 'isl', 'mix'\)"),
    ("delta", "never", r"delta must be one of"),
])
def test_invalid_hyper_parameters_name_the_valid_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        SoftLabelConfig(**{field: value})


def test_compute_isl_and_csl_from_the_backbone(tiny):
    splits = small_splits()
    torch.manual_seed(0)
    features = torch.randn(10, tiny.embed_dim)
    labels = torch.tensor([d.label for d in splits.train])
    text = tiny.encode_text(splits.prompts())
    probs = torch.softmax(tiny.model.logit_scale.exp() * F.normalize(features, dim=-1)
                          @ F.normalize(text, dim=-1).t(), dim=1)

    isl = compute_soft_labels(soft_label_preset("base2new", "isl"), tiny, splits, features)
    torch.testing.assert_close(isl, instance_soft_labels(probs, labels, 0.1, "wrong_only"))
    csl = compute_soft_labels(soft_label_preset("base2new", "csl"), tiny, splits, features)
    torch.testing.assert_close(csl, class_soft_labels(text, 0.05)[labels])
    mix = compute_soft_labels(soft_label_preset("base2new", "mix", w=0.3), tiny, splits, features)
    torch.testing.assert_close(mix, 0.3 * csl + 0.7 * isl)
    ls = compute_soft_labels(soft_label_preset("few_shot"), tiny, splits, features)
    torch.testing.assert_close(ls, uniform_ls(labels, 4, 0.05))
    for rows in (isl, csl, mix, ls):
        assert rows.shape == (10, 4) and rows.dtype == torch.float32
        torch.testing.assert_close(rows.sum(1), torch.ones(10))
    with pytest.raises(ValueError, match=r"must be \(10, D\)"):
        compute_soft_labels(soft_label_preset("base2new", "isl"), tiny, splits, features[:3])


def test_store_computes_once_and_keys_on_inputs(tiny, tmp_path, monkeypatch):
    splits = small_splits()
    features = torch.randn(10, tiny.embed_dim)
    config = soft_label_preset("base2new", "mix")
    first = compute_soft_labels(config, tiny, splits, features, store_dir=tmp_path)
    assert len(list(tmp_path.glob("mix-*.pt"))) == 1

    def no_text_encoding(texts):
        raise AssertionError("the stored soft labels should have been reused")

    monkeypatch.setattr(tiny, "encode_text", no_text_encoding)
    assert torch.equal(compute_soft_labels(config, tiny, splits, features, store_dir=tmp_path), first)
    monkeypatch.undo()

    # anything the rows depend on gives a new entry: hyper-parameters, image features, class prompts
    compute_soft_labels(soft_label_preset("base2new", "mix", w=0.6), tiny, splits, features, store_dir=tmp_path)
    compute_soft_labels(config, tiny, splits, features + 1, store_dir=tmp_path)
    compute_soft_labels(config, tiny, splits.with_lists(template="a photo of a {}."), features, store_dir=tmp_path)
    assert len(list(tmp_path.glob("mix-*.pt"))) == 4
    assert not list(tmp_path.glob("*.tmp"))
