"""Label schedules: the ATLaS epoch pattern and each loss on tiny hand-computed cases."""

import math

import pytest
import torch

from atlas_fast.atlas.schedules import Alternating, Joint, OneHot, OnlineLabelSmoothing, TeacherFreeKD, soft_cross_entropy


@pytest.mark.parametrize("period, soft_epochs", [
    (1, [0, 1, 2, 3, 4, 5, 6, 7, 8]),
    (2, [1, 3, 5, 7]),
    (3, [2, 5, 8]),
])
def test_atlas_epoch_pattern(period, soft_epochs):
    schedule = Alternating(period)
    assert [e for e in range(9) if schedule.uses_soft_labels(e)] == soft_epochs


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_atlas_rejects_bad_period(bad):
    with pytest.raises(ValueError, match=">= 1"):
        Alternating(bad)


def test_soft_cross_entropy_hand_case():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # softmax = [0.25, 0.75]
    q = torch.tensor([[0.5, 0.5]])
    expected = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    assert soft_cross_entropy(logits, q).item() == pytest.approx(expected, rel=1e-6)


def test_atlas_loss_switches_between_one_hot_and_soft():
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0]])
    labels = torch.tensor([1, 1])
    soft = torch.tensor([[0.1, 0.9], [0.1, 0.9]])
    schedule = Alternating(2)
    hard = -(math.log(0.75) + math.log(0.25)) / 2
    softv = -((0.1 * math.log(0.25) + 0.9 * math.log(0.75)) + (0.1 * math.log(0.75) + 0.9 * math.log(0.25))) / 2
    assert schedule.loss(0, logits, labels, soft).item() == pytest.approx(hard, rel=1e-6)
    assert schedule.loss(1, logits, labels, soft).item() == pytest.approx(softv, rel=1e-6)
    assert OneHot().loss(1, logits, labels, None).item() == pytest.approx(hard, rel=1e-6)
    assert Joint().loss(0, logits, labels, soft).item() == pytest.approx(hard + softv, rel=1e-6)
    with pytest.raises(ValueError, match="needs soft labels"):
        schedule.loss(1, logits, labels, None)


def test_ols_accumulates_correct_predictions_for_next_epoch():
    schedule = OnlineLabelSmoothing(alpha=0.5)
    schedule.reset(2)
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0], [0.0, math.log(9.0)]])
    labels = torch.tensor([1, 1, 1])  # rows 0 and 2 correct (class 1), row 1 wrong
    hard = torch.nn.functional.cross_entropy(logits, labels).item()
    # epoch 0: S = 0, so only the one-hot term (weighted by alpha) is active
    assert schedule.loss(0, logits, labels).item() == pytest.approx(0.5 * hard, rel=1e-6)
    schedule.loss(0, -logits, labels)  # loss is pure: only observed predictions build the next targets
    schedule.observe(logits, labels)
    schedule.end_epoch(0)
    expected_row = (torch.tensor([0.25, 0.75]) + torch.tensor([0.1, 0.9])) / 2
    torch.testing.assert_close(schedule.matrix[1], expected_row)
    torch.testing.assert_close(schedule.matrix[0], torch.zeros(2))  # no correct sample of class 0
    soft = soft_cross_entropy(logits, expected_row.expand(3, 2)).item()
    assert schedule.loss(1, logits, labels).item() == pytest.approx(0.5 * hard + 0.5 * soft, rel=1e-6)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        OnlineLabelSmoothing(alpha=1.5)


def test_tfkd_teacher_and_loss():
    schedule = TeacherFreeKD(a=0.7, alpha=0.4, tau=1.0)
    labels = torch.tensor([2])
    teacher = schedule.teacher(labels, 3)
    torch.testing.assert_close(teacher, torch.tensor([[0.15, 0.15, 0.7]]))
    logits = torch.tensor([[0.2, -0.1, 0.5]])
    p = torch.softmax(logits, -1)[0]
    kl = sum(t * math.log(t / q) for t, q in zip(teacher[0].tolist(), p.tolist()))
    ce = -math.log(p[2].item())
    assert schedule.loss(0, logits, labels).item() == pytest.approx(0.6 * ce + 0.4 * kl, rel=1e-5)
    # temperature: teacher_tau = softmax(log(teacher) / tau), the KL is scaled by tau^2
    hot = TeacherFreeKD(a=0.7, alpha=1.0, tau=2.0)
    t2 = torch.softmax(teacher.log() / 2.0, -1)[0]
    p2 = torch.softmax(logits / 2.0, -1)[0]
    kl2 = sum(t * math.log(t / q) for t, q in zip(t2.tolist(), p2.tolist()))
    assert hot.loss(0, logits, labels).item() == pytest.approx(4.0 * kl2, rel=1e-5)
    for bad in (dict(a=1.0), dict(alpha=-0.1), dict(tau=0.0)):
        with pytest.raises(ValueError):
            TeacherFreeKD(**bad)


def test_describe_gives_the_name_and_every_hyper_parameter():
    """A record stores a schedule as its description; the report names variants from it."""
    assert OneHot().describe() == {"name": "onehot"} and Joint().describe() == {"name": "joint"}
    assert Alternating(3).describe() == {"name": "atlas", "period": 3}
    assert OnlineLabelSmoothing(0.3).describe() == {"name": "ols", "alpha": 0.3}
    assert TeacherFreeKD(0.8, 0.2, 4.0).describe() == {"name": "tfkd", "a": 0.8, "alpha": 0.2, "tau": 4.0}


def test_only_one_hot_is_plain_and_only_ols_observes_predictions():
    schedules = (OneHot(), Alternating(2), Joint(), OnlineLabelSmoothing(), TeacherFreeKD())
    assert [s.name for s in schedules if s.plain] == ["onehot"]
    assert [s.name for s in schedules if s.observes_predictions] == ["ols"]


def test_runs_cross_entropy_is_each_run_s_own_loss():
    """R runs' plain CE losses in one pass (hard and soft runs interleaved) equal each run's hard or soft CE, values
    and gradients."""
    from atlas_fast.atlas.schedules import hard_cross_entropy, runs_cross_entropy, soft_cross_entropy

    generator = torch.Generator().manual_seed(0)
    kinds = ["hard", "hard", "soft", "soft", "hard"]
    logits = torch.randn(5, 4, 6, generator=generator, requires_grad=True)
    labels = torch.randint(6, (5, 4), generator=generator)
    soft = [torch.softmax(torch.randn(4, 6, generator=generator), dim=-1) if k == "soft" else None for k in kinds]
    together = runs_cross_entropy(kinds, logits, labels, soft)
    (grad,) = torch.autograd.grad(together.sum(), logits)
    alone = torch.stack([hard_cross_entropy(logits[r], labels[r]) if k == "hard" else
                         soft_cross_entropy(logits[r], soft[r]) for r, k in enumerate(kinds)])
    (expected,) = torch.autograd.grad(alone.sum(), logits)
    torch.testing.assert_close(together, alone, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-7)
    assert [Alternating(2).cross_entropy_kind(e) for e in range(3)] == ["hard", "soft", "hard"]
    assert OneHot().cross_entropy_kind(1) == "hard" and OnlineLabelSmoothing().cross_entropy_kind(0) is None


def test_the_criterion_gives_each_run_its_schedule_loss_over_its_own_rows():
    """A padded step of three runs (sizes 4, 2, 0): the criterion's per-run losses are each run's schedule loss of
    its own rows (0 for the run that sits out), their sum is the criterion's value, and the padding mask marks each
    run's rows (None where no run is padded)."""
    from atlas_fast.atlas.criterion import LossCriterion, ScheduleCriterion, size_rows
    from atlas_fast.atlas.schedules import hard_cross_entropy

    generator = torch.Generator().manual_seed(1)
    sizes = [4, 2, 0]
    logits = torch.randn(3, 4, 5, generator=generator)
    labels = torch.randint(5, (3, 4), generator=generator)
    soft = torch.softmax(torch.randn(2, 5, generator=generator), dim=-1)
    ols = OnlineLabelSmoothing()
    ols.reset(5)
    schedules = [OneHot(), Alternating(1), ols]
    targets = [(0, labels[0], None), (1, labels[1, :2], soft)]
    criterion = ScheduleCriterion(schedules, 0, labels, targets, sizes, size_rows(sizes, "cpu"))
    expected = torch.stack([hard_cross_entropy(logits[0], labels[0]), soft_cross_entropy(logits[1, :2], soft),
                            torch.tensor(0.0)])
    torch.testing.assert_close(criterion.per_run(logits), expected)
    torch.testing.assert_close(criterion(logits), expected.sum())
    assert criterion.sizes == (4, 2, 0) and criterion.rows.tolist() == sizes
    assert criterion.padding_mask(4).sum(dim=1).tolist() == sizes
    full = LossCriterion(lambda z, r: hard_cross_entropy(z, labels[r]), [4, 4])
    assert full.padding_mask(4) is None
    torch.testing.assert_close(full.per_run(logits[:2]), expected.new_tensor(
        [float(hard_cross_entropy(logits[r], labels[r])) for r in range(2)]))
