"""The `lavo` block: config errors, the orthonormal basis under training, the wiring of
projections, rotary positions (self-attention) and parameters (against the float64
reference), and decoding."""

import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.attention import build_attention
from lavo_tasks.attention.rope import apply_rope
from lavo_tasks.errors import ConfigError
from lavo_tasks.kernels.lavo.reference import reference_lavo_attn

PATTERNS = {"CS": (True, False), "NS": (False, False), "CC": (True, True), "NC": (False, True)}
D_MODEL, HEADS = 16, 2  # head dim 8


def config(**overrides):
    base = dict(name="lavo", window=4, rank=4, basis="learned", cross_segments=1, backend="torch")
    return OmegaConf.create({**base, **overrides})


def make_block(pattern="CS", seed=0, **overrides):
    torch.manual_seed(seed)
    causal, cross = PATTERNS[pattern]
    block = build_attention(config(**overrides), D_MODEL, n_heads=HEADS, causal=causal, cross=cross).double()
    with torch.no_grad():  # the biases start at 0; make them matter
        for p in (block.rel_bias, block.mem_bias):
            if p is not None:
                p.normal_()
    return block


def orthonormality_error(basis):
    gram = basis @ basis.transpose(1, 2)
    return (gram - torch.eye(basis.shape[1], dtype=basis.dtype)).abs().max().item()


@pytest.mark.parametrize(
    "overrides,pattern,message",
    [
        (dict(window=0), "CS", "attention.window=0: must be an integer >= 1"),
        (dict(window="8"), "CS", "attention.window='8'"),
        (dict(window=3), "NS", "attention.window=3: must be even"),
        (dict(rank=9), "CS", "attention.rank=9: must be an integer between 1 and the head dim 8"),
        (dict(rank=0), "CC", "attention.rank=0"),
        (dict(basis="random"), "CS", "attention.basis='random': allowed learned, fixed"),
        (dict(cross_segments=0), "NC", "attention.cross_segments=0: must be an integer >= 1"),
        (dict(backend="cuda"), "CS", "attention.backend='cuda': allowed auto, triton, torch"),
    ],
)
def test_config_errors_name_the_key(overrides, pattern, message):
    causal, cross = PATTERNS[pattern]
    with pytest.raises(ConfigError, match=message):
        build_attention(config(**overrides), D_MODEL, n_heads=HEADS, causal=causal, cross=cross)


def test_learned_basis_stays_orthonormal_after_optimiser_steps():
    block = make_block("CS")
    before = block.basis.detach().clone()
    assert before.shape == (HEADS, 4, 8) and orthonormality_error(before) < 1e-6  # made in float32
    optimiser = torch.optim.AdamW(block.parameters(), lr=0.05, weight_decay=0.1)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    for _ in range(3):
        optimiser.zero_grad()
        y, _ = block(x)
        y.pow(2).sum().backward()
        optimiser.step()
    after = block.basis.detach()
    assert (after - before).abs().max() > 1e-3  # the basis did move
    assert orthonormality_error(after) < 1e-6


@pytest.mark.parametrize("rank", [4, 8])  # below the head dim 8, and equal to it
def test_learned_basis_starts_as_the_fixed_one_and_stays_fp32_under_autocast(rank):
    learned, fixed = make_block("CS", rank=rank).float(), make_block("CS", rank=rank, basis="fixed").float()
    torch.testing.assert_close(learned.basis, fixed.basis)  # the same seeded Gaussian, its QR
    # one parameter per entry of the strictly lower triangle of a [d, d] skew matrix, per head
    assert [p.shape for p in learned.basis_map.parameters()] == [(HEADS, 8 * 7 // 2)]
    with torch.no_grad():
        learned.basis_map.skew.normal_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        basis = learned.basis
    assert basis.dtype == torch.float32 and orthonormality_error(basis) < 1e-6


def test_fixed_basis_is_an_orthonormal_buffer():
    block = make_block("CS", basis="fixed")
    names = [name for name, _ in block.named_parameters()]
    assert not any("basis" in name for name in names)
    assert "fixed_basis" in dict(block.named_buffers())
    assert orthonormality_error(block.basis) < 1e-6  # QR done in float32, then cast


def test_no_window_parameter_in_noncausal_cross():
    block = make_block("NC", cross_segments=3)
    assert block.rel_bias is None and block.mem_bias.shape == (HEADS, 3)


@pytest.mark.parametrize("pattern,segments", [("CS", 1), ("NS", 1), ("CC", 1), ("NC", 3)])
def test_block_equals_reference_on_its_projections(pattern, segments):
    causal, cross = PATTERNS[pattern]
    block = make_block(pattern, cross_segments=segments)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, D_MODEL, generator=g, dtype=torch.float64)
    context = torch.randn(2, 7, D_MODEL, generator=g, dtype=torch.float64) if cross else None
    mask = torch.ones(2, 9 if not cross else 7, dtype=torch.bool)
    mask[1, -2:] = False
    y, state = block(x, context=context, mask=None if cross else mask, context_mask=mask if cross else None)
    assert state is None

    source = context if cross else x
    split = lambda t: t.view(*t.shape[:2], HEADS, 8)  # noqa: E731
    q, k, v = split(block.q_proj(x)), split(block.k_proj(source)), split(block.v_proj(source))
    if not cross:  # self-attention rotates queries and keys at their positions
        q, k = apply_rope(q), apply_rope(k)
    o = reference_lavo_attn(
        q, k, v, block.basis, block.rel_bias, block.mem_bias, window=4, causal=causal, cross=cross,
        segments=segments, kv_mask=mask,
    )
    expected = block.out_proj(o.reshape(2, 9, D_MODEL))
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pattern,segments", [("CS", 1), ("CC", 1), ("NC", 2)])
@pytest.mark.parametrize("source_len,sizes", [(5, (1, 4, 1, 1, 3)), (13, (6, 1, 3))])
def test_block_decode_equals_full_forward(pattern, segments, source_len, sizes):
    """Token by token and in uneven chunks (a first chunk > 1 is a CS prompt prefill)."""
    causal, cross = PATTERNS[pattern]
    block = make_block(pattern, cross_segments=segments)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 10, D_MODEL, generator=g, dtype=torch.float64)
    context = torch.randn(2, source_len, D_MODEL, generator=g, dtype=torch.float64) if cross else None
    context_mask = torch.ones(2, source_len, dtype=torch.bool) if cross else None
    if cross:
        context_mask[0, 1] = False
    with torch.no_grad():
        full, _ = block(x, context=context, context_mask=context_mask)
        state = block.init_state(2, context=context, context_mask=context_mask)
        pieces, start = [], 0
        for size in sizes:
            y, state = block(x[:, start : start + size], context=context, state=state)
            pieces.append(y)
            start += size
            assert state.position == start
            if not cross:  # constant-size state: w-1 slots whatever the length
                assert state.memory.keys.shape == (2, HEADS, 3, 8) and state.memory.count == start
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("pattern", ["CS", "CC"])
def test_triton_decode_steps_equal_the_torch_forward(pattern, device):
    """The block's decode steps on Triton (the interpreter on a CPU), token by token from
    its own init_state (the basis broadcast over the batch, rank 4 against 2 heads), give
    the PyTorch path's whole forward of the same weights, in fp32, over a padded source
    shorter than the target (CC: the last positions read the source's end)."""
    causal, cross = PATTERNS[pattern]
    blocks = [make_block(pattern, backend=backend).float().to(device) for backend in ("torch", "triton")]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 10, D_MODEL, generator=g).to(device)
    context = torch.randn(2, 7, D_MODEL, generator=g).to(device) if cross else None
    context_mask = torch.ones(2, 7, dtype=torch.bool, device=device) if cross else None
    if cross:
        context_mask[1, 5:] = False
    with torch.no_grad():
        full, _ = blocks[0](x, context=context, context_mask=context_mask)
        state = blocks[1].init_state(2, context=context, context_mask=context_mask)
        steps = []
        for t in range(10):
            y, state = blocks[1](x[:, t : t + 1], context=context, state=state)
            steps.append(y)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


def test_noncausal_self_cannot_be_decoded():
    with pytest.raises(ValueError, match="noncausal self-attention \\(NS\\) cannot be decoded"):
        make_block("NS").init_state(2)


def test_gradients_reach_every_parameter():
    block = make_block("CS").float()
    y, _ = block(torch.randn(2, 9, D_MODEL))
    y.pow(2).sum().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("basis", ["learned", "fixed"])
def test_state_dict_restores_the_trained_basis(basis):
    """A checkpoint holds the whole basis (the parametrization's base and parameter, or
    the fixed buffer): a block built with another seed and loaded from it agrees."""
    block = make_block("CS", basis=basis)
    optimiser = torch.optim.AdamW(block.parameters(), lr=0.05)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    block(x)[0].pow(2).sum().backward()
    optimiser.step()
    restored = make_block("CS", seed=1, basis=basis)
    restored.load_state_dict(block.state_dict())
    torch.testing.assert_close(restored.basis, block.basis)
    torch.testing.assert_close(restored(x)[0], block(x)[0])


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_memory_bias_is_where_mu_starts(pattern):
    causal, cross = PATTERNS[pattern]
    block = build_attention(config(memory_bias=-3, cross_segments=2), D_MODEL, n_heads=HEADS, causal=causal,
                            cross=cross)
    assert torch.equal(block.mem_bias.detach(), torch.full((HEADS, 2) if pattern == "NC" else (HEADS,), -3.0))
    default = build_attention(config(cross_segments=2), D_MODEL, n_heads=HEADS, causal=causal, cross=cross)
    assert torch.equal(default.mem_bias.detach(), torch.zeros_like(block.mem_bias))


@pytest.mark.parametrize("bad", ["x", True, None, float("nan")])
def test_memory_bias_must_be_a_number(bad):
    with pytest.raises(ConfigError, match=r"^attention\.memory_bias=.*: must be a number"):
        build_attention(config(memory_bias=bad), D_MODEL, n_heads=HEADS, causal=True, cross=False)


@pytest.mark.parametrize("pattern", ["CS", "NS"])
def test_a_very_negative_memory_bias_leaves_the_window_alone(pattern):
    """mu far below the window's logits: the memory gets no weight, and the block is
    softmax over its window of rotated keys (rho = 0), written here as a dense loop."""
    causal = pattern == "CS"
    torch.manual_seed(0)
    block = build_attention(config(memory_bias=-1e4), D_MODEL, n_heads=HEADS, causal=causal, cross=False).double()
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    split = lambda t: t.view(*t.shape[:2], HEADS, 8)  # noqa: E731
    q, k, v = apply_rope(split(block.q_proj(x))), apply_rope(split(block.k_proj(x))), split(block.v_proj(x))
    out = torch.zeros_like(q)
    for b in range(2):
        for h in range(HEADS):
            for t in range(9):
                js = [j for j in range(9) if (t - 4 < j <= t if causal else abs(t - j) <= 2)]
                p = torch.softmax(torch.stack([q[b, t, h] @ k[b, j, h] for j in js]) / 8 ** 0.5, dim=0)
                out[b, t, h] = sum(p[i] * v[b, j, h] for i, j in enumerate(js))
    y, _ = block(x)
    torch.testing.assert_close(y, block.out_proj(out.reshape(2, 9, D_MODEL)), rtol=1e-9, atol=1e-10)
