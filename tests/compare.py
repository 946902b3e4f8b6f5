"""The comparisons the tests make between a result and its reference.

Errors are relative to the reference's size, so one tolerance serves outputs and gradients
of any scale: the largest absolute error against the reference's largest magnitude
(`max_rel_error`, the rule for fp32/fp64 checks), or the error's norm against the
reference's norm (`rms_rel_error`, the rule for bf16 checks, where single elements
round by a few per cent). Both compute in float64.
"""

import torch

# A reference whose largest magnitude is below this is compared in absolute terms against it
# (an all-zero reference, e.g. the output at padded positions, must then match exactly).
FLOOR = 1e-12


def max_rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|."""
    err = (actual.double() - expected.double()).abs().max().item()
    return err / max(expected.double().abs().max().item(), FLOOR)


def rms_rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (Frobenius norms, which also rank the mean-square error)."""
    diff = (actual.double() - expected.double()).norm().item()
    return diff / max(expected.double().norm().item(), FLOOR)


def assert_near(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-4, what: str = "") -> None:
    """Same shape, and max |actual - expected| <= tol * max |expected|."""
    label = f"{what}: " if what else ""
    assert actual.shape == expected.shape, f"{label}shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = max_rel_error(actual, expected)
    assert err <= tol, f"{label}max abs error {err:.3g} x max|expected| (limit {tol:.3g})"


def assert_rms_near(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "") -> None:
    """Same shape, and ||actual - expected|| <= tol * ||expected||."""
    label = f"{what}: " if what else ""
    assert actual.shape == expected.shape, f"{label}shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = rms_rel_error(actual, expected)
    assert err <= tol, f"{label}relative RMS error {err:.3g} (limit {tol:.3g})"
