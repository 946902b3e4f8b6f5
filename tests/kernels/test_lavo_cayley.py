"""The inverse inside LAVO's learned basis (kernels/lavo/cayley.py) against float64
torch.linalg.inv, and the basis it gives: orthonormal, and the same through the kernel
as through the PyTorch path. On a CPU the kernel runs under Triton's interpreter."""

import pytest
import torch

from lavo_tasks.attention.cayley import CayleyBasis
from lavo_tasks.kernels.lavo.cayley import MAX_DIM, unit_skew_inverse

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def skew(heads, dim, scale, seed):
    g = torch.Generator().manual_seed(seed)
    lower = torch.randn(heads, dim, dim, generator=g).tril(-1) * scale
    return (lower - lower.transpose(1, 2)).to(DEVICE)


@pytest.mark.parametrize("dim,scale", [(5, 1.0), (16, 0.3), (40, 1.0), (64, 0.5), (64, 3.0), (100, 1.0), (128, 0.5),
                                       (128, 3.0)])  # 5, 40, 100: padded tiles
def test_inverse_and_its_gradient_equal_float64_inv(dim, scale):
    s = skew(3, dim, scale, seed=dim)
    eye = torch.eye(dim, dtype=torch.float64, device=DEVICE)
    ours = s.clone().requires_grad_()
    ref = s.double().requires_grad_()
    w = unit_skew_inverse(ours)
    w_ref = torch.linalg.inv(eye - ref)
    grad = torch.randn(w.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    w.backward(grad)
    w_ref.backward(grad.double())
    # fp32 elimination: an error of a few units of rounding times I - S's condition number
    # (44 at 64 / 3.0, where the errors reach 9e-6)
    bound = 16 * torch.linalg.cond(eye - s.double()).max().item() * 2**-24
    for name, got, want in [("inverse", w, w_ref), ("grad", ours.grad, ref.grad)]:
        err = (got.double() - want).abs().max() / want.abs().max()
        assert err < bound, f"{name}: relative max error {err:.2e}, bound {bound:.2e}"
    cayley = 2 * w.double() - eye  # orthogonal up to the fp32 inverse's rounding
    assert (cayley @ cayley.transpose(1, 2) - eye).abs().max() < 1e-5


def test_inverse_refuses_what_the_kernel_does_not_cover():
    with pytest.raises(NotImplementedError, match="fp32"):
        unit_skew_inverse(skew(1, 8, 1.0, 0).double())
    with pytest.raises(NotImplementedError, match=str(MAX_DIM)):
        unit_skew_inverse(torch.zeros(1, MAX_DIM + 1, MAX_DIM + 1, device=DEVICE))


def test_learned_basis_is_the_same_through_the_kernel_and_the_torch_path():
    torch.manual_seed(0)
    initial = torch.randn(4, 16, 64)
    kernel, torch_path = CayleyBasis(initial, backend="triton").to(DEVICE), CayleyBasis(initial, backend="torch").to(DEVICE)
    with torch.no_grad():
        kernel.skew.normal_(std=0.2)
        torch_path.skew.copy_(kernel.skew)
    a, b = kernel.weight, torch_path.weight
    assert a.shape == (4, 16, 64)
    torch.testing.assert_close(a, b, atol=2e-6, rtol=0)
    eye = torch.eye(16, device=DEVICE)
    assert (a @ a.transpose(1, 2) - eye).abs().max() < 1e-5
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(kernel.skew.grad, torch_path.skew.grad, atol=1e-5, rtol=1e-4)
