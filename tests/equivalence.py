"""Equivalence checks that keep their margin: every comparison with a re-implemented reference records its worst
ratio of difference to tolerance (1.0 = at the tolerance), and every negative control (a deliberately wrong
reference) must fall outside the same tolerance. ``pytest -s`` prints each module's worst ratios
(:func:`report_ratios`)."""

from __future__ import annotations

import torch

# label -> worst |actual - expected| / (atol + rtol * |expected|) seen in this process
RATIOS: dict[str, float] = {}


def _ratio(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> float:
    actual, expected = actual.detach().double(), expected.detach().double()
    return float(((actual - expected).abs() / (atol + rtol * expected.abs())).max())


def assert_equivalent(label: str, actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5,
                      rtol: float = 1e-5) -> None:
    """``torch.testing.assert_close(actual, expected, atol, rtol)``, recording the worst ratio under ``label``."""
    assert actual.shape == expected.shape, f"{label}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    RATIOS[label] = max(RATIOS.get(label, 0.0), _ratio(actual, expected, atol, rtol))
    torch.testing.assert_close(actual.detach(), expected.detach().to(actual.dtype), atol=atol, rtol=rtol)


def assert_gradient_equivalent(label: str, actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    """Gradients equal up to ``atol`` of the largest reference entry; a zero reference gradient must be zero here
    too (LoRA's A at init, where B = 0)."""
    scale = expected.abs().max()
    if scale == 0:
        assert actual.abs().max() == 0, f"{label}: the reference gradient is zero, this one is not"
        RATIOS.setdefault(label, 0.0)
        return
    assert_equivalent(label, actual / scale, expected / scale, atol=atol, rtol=0.0)


def assert_caught(label: str, actual: torch.Tensor, wrong: torch.Tensor, atol: float = 1e-5,
                  rtol: float = 1e-5) -> None:
    """A negative control: ``wrong`` (the reference with one detail changed) must fail the tolerance the real
    comparison passes, or the equivalence test could not see that detail."""
    assert _ratio(actual, wrong, atol, rtol) > 1.0, f"negative control {label!r} is not caught at this tolerance"


def report_ratios(prefix: str) -> str:
    """The worst ratios recorded under labels starting with ``prefix``, one per line (worst first)."""
    rows = sorted(((v, k) for k, v in RATIOS.items() if k.startswith(prefix)), reverse=True)
    return "\n".join(f"{v:10.4f}  {k}" for v, k in rows)
