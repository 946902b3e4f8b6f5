"""The fused rotary-position kernel (kernels/rope.py) against the float64 complex rotation
of attention_cases.rope_reference, on the CPU through Triton's interpreter; on a GPU,
`apply_rope` (which runs the kernel on CUDA tensors) against its PyTorch form."""

import pytest
import torch

from lavo_tasks.attention.rope import apply_rope, inv_freq, rope_reference as rope_in_torch
from lavo_tasks.kernels import rope as kernel_module
from attention_cases import rope_reference
from compare import max_rel_error, rms_rel_error


def rope_op(x: torch.Tensor, offset: int) -> torch.Tensor:
    """The kernel's op with the table apply_rope passes it."""
    return kernel_module.rope_op(x, offset, inv_freq(x.shape[-1] // 2, x.device))


def rotated(x: torch.Tensor, offset: int, back: bool = False) -> torch.Tensor:
    """x [B, T, H, d] through the float64 reference, one vector at a time, at positions
    offset + t (back: rotated by minus those positions' angles)."""
    batch, length, heads, _ = x.shape
    sign = -1 if back else 1
    return torch.stack([torch.stack([torch.stack([rope_reference(x[b, t, h], sign * (offset + t))
                                                  for h in range(heads)])
                                     for t in range(length)]) for b in range(batch)])


# d = 1 has no pair (the channel is copied), 7 an odd last channel, 130 a half that is not
# a power of two; offsets up to 40 keep fp32's rounding of the angle below 2e-6.
@pytest.mark.parametrize("d", [1, 2, 7, 8, 130])
@pytest.mark.parametrize("offset", [0, 33])
def test_forward_and_backward_match_the_complex_rotation(d, offset):
    g = torch.Generator().manual_seed(d + offset)
    x = torch.randn(2, 5, 3, d, generator=g, requires_grad=True)
    w = torch.randn(2, 5, 3, d, generator=g)
    y = rope_op(x, offset)
    (y * w).sum().backward()
    assert y.dtype == x.dtype and y.shape == x.shape
    assert max_rel_error(y, rotated(x.detach(), offset)) <= 1e-5
    # the gradient of sum(w * R x) is R^T w: w rotated by minus each position's angle
    assert max_rel_error(x.grad, rotated(w, offset, back=True)) <= 1e-5


def test_far_positions_round_the_angles_as_the_pytorch_form_does():
    """At positions near 4,096 fp32 rounds an angle by up to 2.4e-4; the kernel takes the
    same fp32 angles as the PyTorch form, so the two agree far closer than either does
    with the exact rotation."""
    x = torch.randn(1, 6, 2, 64, generator=torch.Generator().manual_seed(1))
    got, want = rope_op(x, 4090), rope_in_torch(x, 4090)
    assert max_rel_error(got, want) <= 2e-6
    assert max_rel_error(want, rotated(x, 4090)) > 1e-5  # (what the exact rotation would tell apart)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rotates_in_fp32_and_rounds_once(dtype):
    x = torch.randn(2, 9, 2, 16, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = rope_op(x, 3)
    assert y.dtype == dtype
    # the fp32 rotation rounded once: within one ulp of it (a rotation computed in the half
    # type rounds its products and their sum too, and misses by more where they cancel)
    want = rope_op(x.float(), 3)
    assert ((y.float() - want).abs() <= torch.finfo(dtype).eps * want.abs() + 1e-6).all()
    assert rms_rel_error(y, rotated(x.float(), 3)) <= 4e-3


def test_a_second_derivative_is_refused():
    x = torch.randn(1, 3, 1, 4, requires_grad=True)
    (grad,) = torch.autograd.grad(rope_op(x, 0).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


def test_a_non_contiguous_input_and_no_rows():
    x = torch.randn(3, 2, 4, 8, generator=torch.Generator().manual_seed(3)).transpose(0, 1)  # [2, 3, 4, 8] strided
    assert max_rel_error(rope_op(x, 1), rotated(x, 1)) <= 1e-5
    assert rope_op(torch.empty(0, 3, 4, 8), 0).shape == (0, 3, 4, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope_on_cuda_runs_the_kernel_and_matches_pytorch(monkeypatch, dtype):
    calls = []
    real = kernel_module.rope_rotate
    monkeypatch.setattr(kernel_module, "rope_rotate", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(4, 300, 4, 64, device="cuda", generator=g).to(dtype).requires_grad_()
    w = torch.randn(4, 300, 4, 64, device="cuda", generator=g).to(dtype)
    (apply_rope(x, 0) * w).float().sum().backward()
    got, grad = apply_rope(x.detach(), 0), x.grad
    assert len(calls) == 3  # two forwards and the backward
    apply_rope(x.detach(), 0, backend="torch")  # (a block's backend=torch keeps PyTorch's ops)
    assert len(calls) == 3
    x.grad = None
    (rope_in_torch(x, 0) * w).float().sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 4e-3
    assert rms_rel_error(got, rope_in_torch(x.detach(), 0)) <= tol
    assert rms_rel_error(grad, x.grad) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [7, 130])
@pytest.mark.parametrize("offset", [1, 4090, 100_000])
def test_the_compiled_kernel_at_far_offsets_odd_and_wide_heads(d, offset, dtype):
    """The compiled kernel's sines and cosines (which the interpreter does not run) against
    torch's on the same fp32 angles: the PyTorch form in fp32 is the reference for every
    dtype, forward and backward, at offsets where fp32 angles are coarse."""
    g = torch.Generator(device="cuda").manual_seed(d + offset)
    x32 = torch.randn(2, 70, 3, d, device="cuda", generator=g)
    w32 = torch.randn(2, 70, 3, d, device="cuda", generator=g).to(dtype).float()  # (the backward gets w in dtype)
    x = x32.to(dtype).requires_grad_()
    y = rope_op(x, offset)
    (y.float() * w32).sum().backward()
    want = rope_in_torch(x.detach().float(), offset)
    # R^T w: w rotated back, which the PyTorch form gives as the gradient of sum(w * R x)
    x_ref = x.detach().float().requires_grad_()
    (rope_in_torch(x_ref, offset) * w32).sum().backward()
    for got, fp32 in ((y, want), (x.grad, x_ref.grad)):
        if dtype == torch.float32:
            assert max_rel_error(got, fp32) <= 2e-6
        else:  # the fp32 rotation rounded once: within one ulp of it, element by element
            assert ((got.float() - fp32).abs() <= torch.finfo(dtype).eps * fp32.abs() + 1e-6).all()
    if d % 2:  # the last channel has no pair and is copied
        assert torch.equal(y[..., -1], x.detach()[..., -1])
