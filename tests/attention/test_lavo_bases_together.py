"""A stack evaluates its blocks' learned LAVO bases together (attention.lavo.CayleyBases):
one solve per forward for all of them, each basis and its gradient what the closed-form
Cayley map gives in float64, and the stack's output and gradients the same as with every
block evaluating its own basis. On a CPU the Triton kernel runs under the interpreter."""

import functools

import pytest
import torch

from lavo_tasks.attention import cayley as cayley_module
from lavo_tasks.attention.cayley import CayleyBasis
from lavo_tasks.attention.lavo import LavoAttention
from lavo_tasks.stacks import Decoder, Encoder

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
D_MODEL, HEADS, RANK = 32, 2, 8  # head_dim 16


def lavo(backend="torch", **options):
    return functools.partial(LavoAttention, window=4, rank=RANK, backend=backend, **options)


def encoder(backend="torch", layers=3):
    torch.manual_seed(0)
    stack = Encoder(d_model=D_MODEL, n_heads=HEADS, n_layers=layers, attention=lavo(backend), d_ff=64).to(DEVICE)
    randomise_skews(stack)
    return stack


def decoder(backend="torch"):
    torch.manual_seed(1)
    stack = Decoder(d_model=D_MODEL, n_heads=HEADS, n_layers=2, self_attention=lavo(backend),
                    cross_attention=lavo(backend), d_ff=64, cross_causal=True).to(DEVICE)
    randomise_skews(stack)
    return stack


def randomise_skews(stack):
    """Skews far from their zero start, so that each basis is a different rotation."""
    with torch.no_grad():
        for m in stack.modules():
            if isinstance(m, CayleyBasis):
                m.skew.normal_(std=0.3)


def cayley_float64(m: CayleyBasis, skew: torch.Tensor) -> torch.Tensor:
    """The basis by its definition: the first r columns of base (I - A/2)^-1 (I + A/2), transposed."""
    heads, dim = m.base.shape[:2]
    rows, cols = torch.tril_indices(dim, dim, -1)
    lower = torch.zeros(heads, dim, dim, dtype=torch.float64, device=skew.device)
    lower[:, rows, cols] = skew
    a = lower - lower.transpose(1, 2)
    eye = torch.eye(dim, dtype=torch.float64, device=skew.device)
    rotation = torch.linalg.solve(eye - a / 2, eye + a / 2)
    return (m.base.double() @ rotation)[:, :, : m.rank].transpose(1, 2)


def two_ranks():
    """A decoder whose self and cross blocks have different ranks: two groups of two."""
    torch.manual_seed(3)
    stack = Decoder(d_model=D_MODEL, n_heads=HEADS, n_layers=2, self_attention=lavo(),
                    cross_attention=functools.partial(LavoAttention, window=4, rank=4), d_ff=64).to(DEVICE)
    randomise_skews(stack)
    return stack


@pytest.mark.parametrize("build", [lambda: encoder("torch"), lambda: encoder("triton"), two_ranks],
                         ids=["torch", "triton", "two-groups"])
def test_each_basis_evaluated_together_is_its_cayley_map(build):
    stack = build()
    maps = [m for m in stack.modules() if isinstance(m, CayleyBasis)]
    assert len(maps) in (3, 4)
    directions = [torch.randn(m.skew.shape[0], m.rank, D_MODEL // HEADS, device=DEVICE) for m in maps]
    with stack.bases():
        weights = [m.weight for m in maps]
    assert all(m.evaluated is None for m in maps)  # dropped on exit
    sum((w * g).sum() for w, g in zip(weights, directions)).backward()
    for m, w, g in zip(maps, weights, directions):
        skew = m.skew.detach().double().requires_grad_()
        want = cayley_float64(m, skew)
        (want * g.double()).sum().backward()
        assert (w.double() - want).abs().max() < 1e-5
        assert (m.skew.grad.double() - skew.grad).abs().max() < 1e-4 * skew.grad.abs().max()


@pytest.mark.parametrize("build", [encoder, decoder], ids=["encoder", "decoder"])
def test_a_stack_solves_once_per_forward_with_the_same_outputs_and_gradients(build, monkeypatch):
    together, alone = build(), build()
    alone.bases.groups = []  # every block evaluates its own basis
    solves = []
    inverse = cayley_module._unit_skew_inverse
    monkeypatch.setattr(cayley_module, "_unit_skew_inverse", lambda half, backend: solves.append(len(half))
                        or inverse(half, backend))
    torch.manual_seed(2)
    x = torch.randn(2, 12, D_MODEL, device=DEVICE)
    memory = torch.randn(2, 12, D_MODEL, device=DEVICE)
    args = (x,) if isinstance(together, Encoder) else (x, memory)
    blocks = sum(isinstance(m, CayleyBasis) for m in together.modules())
    out = together(*args)
    assert solves == [blocks * HEADS]  # one solve, every head of every block
    solves.clear()
    ref = alone(*args)
    assert solves == [HEADS] * blocks
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    ref.square().sum().backward()
    for (name, p), q in zip(together.named_parameters(), alone.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_decoder_init_state_solves_once(monkeypatch):
    stack = decoder()
    solves = []
    inverse = cayley_module._unit_skew_inverse
    monkeypatch.setattr(cayley_module, "_unit_skew_inverse", lambda half, backend: solves.append(len(half))
                        or inverse(half, backend))
    stack.init_state(2, torch.randn(2, 12, D_MODEL, device=DEVICE))
    assert solves == [4 * HEADS]  # two layers, a self and a cross block each


def test_blocks_of_different_sizes_are_grouped_apart():
    """Bases of another head size or rank are not stacked with the rest; a lone basis
    evaluates itself."""
    stack = two_ranks()
    groups = sorted(len(maps) for maps in stack.bases.groups)
    assert groups == [2, 2]
    lone = Encoder(d_model=D_MODEL, n_heads=HEADS, n_layers=1, attention=lavo(), d_ff=64)
    assert lone.bases.groups == []


def test_a_compiled_stack_is_one_graph_and_equals_eager():
    """The bases set on entry and dropped on exit are side effects Dynamo replays: the
    stack still compiles with fullgraph=True (aot_eager: the CPU suite checks tracing,
    not Inductor)."""
    stack = encoder()
    x = torch.randn(2, 12, D_MODEL, device=DEVICE)
    compiled = torch.compile(stack, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), stack(x), atol=1e-5, rtol=1e-5)
    assert all(m.evaluated is None for m in stack.modules() if isinstance(m, CayleyBasis))


def test_a_failed_solve_leaves_no_basis_set(monkeypatch):
    """When the solve of a later group fails, the bases already set for an earlier one
    are dropped too: a block called on its own afterwards evaluates its current skew."""
    stack = two_ranks()
    inverse, calls = cayley_module._unit_skew_inverse, []

    def second_fails(half, backend):
        calls.append(len(half))
        if len(calls) == 2:
            raise RuntimeError("solve failed")
        return inverse(half, backend)

    monkeypatch.setattr(cayley_module, "_unit_skew_inverse", second_fails)
    with pytest.raises(RuntimeError, match="solve failed"):
        stack(torch.randn(2, 12, D_MODEL, device=DEVICE))
    maps = [m for m in stack.modules() if isinstance(m, CayleyBasis)]
    assert all(m.evaluated is None for m in maps)


def test_blocks_moved_to_another_dtype_solve_alone(monkeypatch):
    """A group whose blocks no longer share a dtype is not stacked: each block solves its own."""
    stack = encoder()
    stack.layers[0].double()
    solves = []
    inverse = cayley_module._unit_skew_inverse
    monkeypatch.setattr(cayley_module, "_unit_skew_inverse", lambda half, backend: solves.append(len(half))
                        or inverse(half, backend))
    with stack.bases():
        assert all(m.evaluated is None for m in stack.modules() if isinstance(m, CayleyBasis))
    stack.layers[0].attn.basis  # noqa: B018  (the property solves)
    assert solves == [HEADS]
