"""κ of Theorem 1 (atlas_fast.atlas.kappa): the vectorised per-sample gradients equal a per-sample loop through the
method's own training loss, κ is 1 when the soft label is the one-hot label, the bounds' variance factors follow the
formulas, and the engine saves the learned tensors along a run when asked (TrainConfig.snapshot_epochs)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from atlas_fast.atlas.kappa import (gradient_variance, measure_kappa, per_sample_gradients, smoothing_parts,
                                    variance_factors)
from atlas_fast.atlas.criterion import LossCriterion
from atlas_fast.atlas.schedules import soft_cross_entropy
from atlas_fast.atlas.softlabels import uniform_ls
from atlas_fast.engine import run
from atlas_fast.engine.record import load_learned, split_snapshots, with_snapshots
from atlas_fast.methods.registry import build_method
from atlas_fast.methods.coop import CoOp, CoOpConfig
from atlas_fast.methods.ivlp import IVLPConfig
from atlas_fast.methods.kgcoop import KgCoOpConfig
from helpers import tiny_pets_config
from layouts import make_oxford_pets

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSNAMES = ["cat", "great_crested_newt", "dog", "sea_lion"]


def _loop_gradients(method, features, labels, targets=None):
    """The brute force: one backward pass of the method's training loss per item."""
    rows = []
    for i in range(len(labels)):
        method.zero_grad(set_to_none=True)
        if targets is None:
            criterion = LossCriterion(lambda logits, r: F.cross_entropy(logits, labels[i:i + 1]), [1])
        else:
            criterion = LossCriterion(lambda logits, r: soft_cross_entropy(logits, targets[i:i + 1]), [1])
        method.training_loss(features[i:i + 1], labels[i:i + 1], criterion).backward()
        rows.append(torch.cat([p.grad.flatten() for p in method.trainable_parameters()]))
    return torch.stack(rows)


def _problem(tiny, method_name="coop", config=None, n=9):
    torch.manual_seed(0)
    method = build_method(method_name, tiny, CLASSNAMES, config or CoOpConfig(n_ctx=3))
    features = torch.randn(n, tiny.embed_dim)
    labels = torch.arange(n) % len(CLASSNAMES)
    soft = torch.softmax(torch.randn(n, len(CLASSNAMES)) * 2, dim=1)
    return method, features, labels, soft


@pytest.mark.parametrize("method_name,config", [("coop", CoOpConfig(n_ctx=3)), ("kgcoop", KgCoOpConfig(n_ctx=2))])
def test_vectorised_per_sample_gradients_equal_a_per_sample_loop(tiny, method_name, config):
    method, features, labels, soft = _problem(tiny, method_name, config)
    for targets in (None, soft):
        fast = per_sample_gradients(method, features, labels, targets, chunk_size=4)
        slow = _loop_gradients(method, features, labels, targets)
        assert fast.shape == slow.shape and slow.abs().max() > 0
        torch.testing.assert_close(fast, slow, atol=1e-5 * float(slow.abs().max()), rtol=1e-5)


def test_kappa_equals_the_brute_force_variances(tiny):
    method, features, labels, soft = _problem(tiny)
    theta, period = 0.1, 2
    ls_rows = uniform_ls(labels, len(CLASSNAMES), theta)
    measures = {m.kind: m for m in measure_kappa(method, features, labels,
                                                 {"ls": (ls_rows, theta), "isl": (soft, 0.1)}, period, chunk_size=5)}
    one_hot = _loop_gradients(method, features, labels)
    full = one_hot.mean(dim=0)
    sigma2 = float(((one_hot - full) ** 2).sum(dim=1).mean())
    uniform = torch.full_like(soft, 1 / len(CLASSNAMES))
    for kind, hat, target, kind_theta in (("ls", uniform, ls_rows, theta), ("isl", soft, soft, 1.0)):
        sigma_hat2 = float(((_loop_gradients(method, features, labels, hat) - full) ** 2).sum(dim=1).mean())
        target2 = float(((_loop_gradients(method, features, labels, target) - full) ** 2).sum(dim=1).mean())
        m = measures[kind]
        assert m.theta == kind_theta and m.period == period
        assert m.sigma2 == pytest.approx(sigma2, rel=1e-4)
        assert m.sigma_hat2 == pytest.approx(sigma_hat2, rel=1e-4)
        assert m.kappa == pytest.approx(sigma_hat2 / sigma2, rel=1e-4)
        assert m.kappa_target == pytest.approx(target2 / sigma2, rel=1e-4)
        assert (m.atlas_factor, m.ls_factor) == pytest.approx(variance_factors(m.kappa, kind_theta, period))
        # the bounds' convexity step: the smoothing epoch's own variance never exceeds (1 - θ + θκ) σ²
        assert m.kappa_target <= m.ls_factor + 1e-6
    assert measures["ls"].kappa_target < measures["ls"].ls_factor  # strict here: LS's ŷ is not collinear with y


def test_kappa_is_one_when_the_soft_label_is_the_one_hot_label(tiny):
    method, features, labels, _ = _problem(tiny)
    one_hot = F.one_hot(labels, len(CLASSNAMES)).float()
    (measure,) = measure_kappa(method, features, labels, {"csl": (one_hot, 0.1)}, period=2)
    assert measure.kappa == pytest.approx(1.0, rel=1e-6) and measure.kappa_target == pytest.approx(1.0, rel=1e-6)
    assert (measure.atlas_factor, measure.ls_factor) == pytest.approx((1.0, 1.0), rel=1e-6)


def test_variance_factors_on_a_hand_worked_case():
    # θ = 0.1, K = 2, κ = 3: ATLaS 1 - 0.05 + 0.15 = 1.10, vanilla LS 1 - 0.1 + 0.3 = 1.20
    assert variance_factors(3.0, 0.1, 2) == pytest.approx((1.10, 1.20))
    # κ = 0.5 < 1: ATLaS 1 - 0.05 + 0.025 = 0.975, vanilla LS 1 - 0.1 + 0.05 = 0.95 (LS has the tighter bound)
    assert variance_factors(0.5, 0.1, 2) == pytest.approx((0.975, 0.95))
    assert variance_factors(1.0, 0.3, 3) == pytest.approx((1.0, 1.0))  # κ = 1: neither bound moves
    # CSL/ISL replace the target (θ = 1): ATLaS 1 - 1/K + κ/K, LS κ
    assert variance_factors(2.0, 1.0, 4) == pytest.approx((1.25, 2.0))
    with pytest.raises(ValueError, match="period"):
        variance_factors(1.0, 0.1, 0)


def test_smoothing_parts_name_the_paper_s_y_hat():
    rows = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    theta, hat = smoothing_parts("ls", 0.1, rows)
    assert theta == 0.1 and torch.equal(hat, torch.full_like(rows, 1 / 3))
    for kind in ("csl", "isl", "mix"):
        theta, hat = smoothing_parts(kind, 0.1, rows)
        assert theta == 1.0 and hat is rows


def test_gradient_variance_on_a_hand_worked_case():
    grads = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 2.0]])
    # centred on (2, 0): squared norms 1, 1, 4 -> mean 2
    assert gradient_variance(grads, torch.tensor([2.0, 0.0])) == pytest.approx(2.0)


def test_pixel_methods_and_grouped_runs_are_refused(tiny):
    grouped = CoOp(tiny, CLASSNAMES, CoOpConfig(n_ctx=2), runs=2)
    with pytest.raises(ValueError, match="one run at a time"):
        per_sample_gradients(grouped, torch.randn(2, tiny.embed_dim), torch.tensor([0, 1]))
    ivlp = build_method("ivlp", tiny, CLASSNAMES, IVLPConfig(depth_text=1, depth_vision=1))
    with pytest.raises(ValueError, match="pixels"):
        per_sample_gradients(ivlp, torch.randn(2, tiny.embed_dim), torch.tensor([0, 1]))


# --- the learned tensors along a run -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pets(tmp_path_factory):
    root = tmp_path_factory.mktemp("pets")
    make_oxford_pets(root / "data", n_classes=8, n_train=4, n_val=2, n_test=3, size=36)
    return root


def test_snapshots_are_saved_beside_the_final_tensors_and_only_then_name_the_run(pets, tiny):
    plain = run(tiny_pets_config(pets, epochs=3))
    snapped = run(tiny_pets_config(pets, epochs=3, snapshot_epochs=(2, 0, 3)))
    assert snapped["path"] != plain["path"] and snapped["metrics"] == plain["metrics"]
    final, snapshots = split_snapshots(load_learned(snapped["path"]))
    plain_final, none = split_snapshots(load_learned(plain["path"]))
    assert none == {} and set(final) == set(plain_final) == {"ctx"}
    assert list(snapshots) == [0, 2, 3]
    torch.testing.assert_close(final["ctx"], plain_final["ctx"])
    torch.testing.assert_close(snapshots[3]["ctx"], final["ctx"])
    torch.manual_seed(1)  # the run's seed initialises the method
    initial = build_method("coop", tiny, ["x"], CoOpConfig(ctx_init="a photo of a")).ctx.detach()
    torch.testing.assert_close(snapshots[0]["ctx"], initial)
    assert not torch.equal(snapshots[2]["ctx"], snapshots[0]["ctx"])
    saved, rebuilt = load_learned(snapped["path"]), with_snapshots(final, snapshots)
    assert list(rebuilt) == list(saved) and all(torch.equal(rebuilt[k], saved[k]) for k in saved)


def test_snapshot_epochs_are_checked(pets):
    with pytest.raises(ValueError, match="integer >= 0"):
        tiny_pets_config(pets, snapshot_epochs=(-1,))
    from atlas_fast.engine.spec import plan_run

    with pytest.raises(ValueError, match="go past the run's 2 epochs"):
        plan_run(tiny_pets_config(pets, snapshot_epochs=(3,)))
    assert dataclasses.replace(tiny_pets_config(pets), snapshot_epochs=(2, 1, 2)).snapshot_epochs == (1, 2)


def test_the_kappa_sentence_compares_the_order_of_kappa_with_the_order_of_h():
    from atlas_fast.app.kappa_runs import kappa_sentence

    def row(run, epochs, kind, kappa, seed=1):
        return {"dataset": "W", "seed": seed, "run": run, "epochs": epochs, "kind": kind, "kappa": kappa}

    def record(soft, seed, new):
        schedule = {"name": "onehot"} if soft is None else {"name": "atlas", "period": 2}
        return {"config": {"dataset": "W", "seed": seed, "method": "coop", "schedule": schedule,
                           "soft_labels": None if soft is None else {"kind": soft}},
                "metrics": {"base": 90.0, "new": new}}

    rows = [row("+ ATLaS", 0, "ls", 3.0), row("+ ATLaS", 200, "ls", 4.0), row("+ ATLaS-CSL", 0, "csl", 1.0),
            row("+ ATLaS-CSL", 200, "csl", 1.5), row("+ ATLaS-ISL", 0, "isl", 0.2), row("+ ATLaS-ISL", 200, "isl", 0.4),
            row("+ ATLaS-ISL", 200, "isl", 0.6, seed=2)]
    records = [record("ls", 1, 40.0), record("csl", 1, 50.0), record("isl", 1, 60.0)]
    text = kappa_sentence(rows, records, "W")
    assert "LS 3.00 -> 4.00, CSL 1.00 -> 1.50, ISL 0.20 -> 0.50" in text  # ISL's end: mean of seeds 1 and 2
    assert ("Highest H first (the table's: H of the mean base and new accuracies): ISL 72.00, CSL 64.29, LS 55.38 "
            "(one seed: the H order has no interval)") in text
    assert "at the initial context (known before training): ISL, CSL, LS (the same order)" in text
    assert text.endswith("at the end of the runs: ISL, CSL, LS (the same order).")
    records[0]["metrics"]["new"] = 70.0  # LS now reaches the highest H
    assert "(known before training): ISL, CSL, LS (not the same order)" in kappa_sentence(rows, records, "W")
    # with seeds, each step of the H order is tested paired by seed: ISL > CSL holds, CSL > LS does not
    records = [record(kind, seed, new) for seed, news in ((1, (50, 55, 60)), (2, (56, 56.5, 61)), (3, (49, 57, 62)))
               for kind, new in zip(("ls", "csl", "isl"), news)]
    assert "(of the 2 steps of the H order, 1 holds at 95 %, paired by seed)" in kappa_sentence(rows, records, "W")
    assert kappa_sentence(rows, records, "Other") == ""


def test_the_kappa_sentence_gives_the_tables_h_not_the_mean_of_per_seed_h():
    """``demo --kappa`` printed the table's CSL H 68.97 and then 'CSL 68.91' (the mean of per-seed H, unsaid): the
    sentence now gives the table's H, of the mean base and mean new accuracies (two seeds at (95, 40) and (60, 80):
    H(77.5, 60) = 67.64, where the mean of per-seed H is 62.43)."""
    from atlas_fast.app.kappa_runs import kappa_sentence

    def record(seed, base, new):
        return {"config": {"dataset": "W", "seed": seed, "method": "coop", "schedule": {"name": "atlas", "period": 2},
                           "soft_labels": {"kind": "isl"}}, "metrics": {"base": base, "new": new}}

    rows = [{"dataset": "W", "seed": 1, "run": "+ ATLaS-ISL", "epochs": e, "kind": "isl", "kappa": 0.5} for e in (0, 2)]
    text = kappa_sentence(rows, [record(1, 95.0, 40.0), record(2, 60.0, 80.0)], "W")
    assert "accuracies): ISL 67.64 " in text and "62.43" not in text


def test_snapshot_points_follow_the_recipe_s_epochs(tmp_path):
    from atlas_fast.app.kappa_runs import with_snapshots as at_fractions
    from atlas_fast.engine import TrainConfig

    config = TrainConfig("OxfordPets", tmp_path)  # CoOp's base-to-new recipe: 200 epochs (ImageNet: 50)
    assert at_fractions(config, [0.05, 0.5]).snapshot_epochs == (0, 10, 100, 200)
    assert at_fractions(TrainConfig("ImageNet", tmp_path), [0.5]).snapshot_epochs == (0, 25, 50)
    assert at_fractions(TrainConfig("ImageNet", tmp_path, epochs=4), [0.3, 2.0]).snapshot_epochs == (0, 1, 4)
