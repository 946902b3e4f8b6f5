"""A block compiled with dynamic shapes (what torch.compile falls back to once a length
changes, e.g. a test at several lengths after training) equals the eager block at a length
that fills its last window block exactly and at one that does not. LAVO's PyTorch path
pads the queries to whole blocks: with a pad that is 0 only at run time, its compiled views
of the padded queries failed ("view size is not compatible")."""

import torch
import torch._dynamo

from attention_cases import D_MODEL, make_block, padding_mask


def forward_backward(block, x):
    """y and the gradients of x and of every parameter, for one call over x [3, T, D]."""
    x = x.clone().requires_grad_()
    y, _ = block(x, mask=padding_mask(x.shape[1]))
    y.backward(torch.linspace(-1, 1, y.numel()).view(y.shape))
    grads = [x.grad] + [p.grad.clone() for p in block.parameters() if p.grad is not None]
    block.zero_grad(set_to_none=True)
    return [y.detach(), *grads]


def test_lavo_compiled_with_dynamic_lengths_equals_eager():
    """NS only (the CS pattern pads its queries the same way; half a minute a pattern)."""
    torch._dynamo.reset()
    block = make_block("lavo", "NS")  # window 4: blocks of 2 positions
    compiled = torch.compile(block, backend="aot_eager", dynamic=True, fullgraph=True)
    g = torch.Generator().manual_seed(0)
    for length in (12, 13):  # a whole number of blocks (no pad), then not
        x = torch.randn(3, length, D_MODEL, generator=g)
        want, got = forward_backward(block, x), forward_backward(compiled, x)
        assert len(want) == len(got) > 4
        for i, (w, c) in enumerate(zip(want, got)):
            torch.testing.assert_close(c, w, rtol=1e-5, atol=1e-6, msg=lambda m: f"length {length}, tensor {i}: {m}")
