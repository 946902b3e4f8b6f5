"""Attention blocks: `softmax` and `local` against slow references, and the contract every
registered block must keep (causality, decode == full forward, padding, patterns).

The references below are written from the definitions (docs/design.md §2.4-2.5),
in float64 with a loop over (batch, query, head); they share nothing with the blocks
but the weights.
"""

import importlib.resources
import inspect
import math

import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.attention import ATTENTION_NAMES, block_class, build_attention
from lavo_tasks.attention.rope import apply_rope
from lavo_tasks.errors import ConfigError
from attention_cases import (D_MODEL, N_HEADS, attention_cfg, make_block, padding_mask, patterns_of, rope_reference,
                             supported, unsupported)
from compare import assert_near

T = 9

# --------------------------------------------------------------------------------------
# Rotary positions


def test_rope_hand_computed():
    # d = 2: one pair, frequency 1; (1, 0) at position 1 turns by 1 radian, (0, 2) at 3 by 3.
    x = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]).view(1, 3, 1, 2)
    y = apply_rope(x, offset=1)
    expected = torch.tensor([[math.cos(1), math.sin(1)], [0.0, 0.0], [-2 * math.sin(3), 2 * math.cos(3)]])
    assert_near(y.view(3, 2), expected, 1e-6)
    # An odd head dim leaves the last channel alone.
    x = torch.randn(1, 4, 2, 5)
    y = apply_rope(x, offset=7)
    assert torch.equal(y[..., 4], x[..., 4])
    for t in range(4):
        assert_near(y[0, t, 1], rope_reference(x[0, t, 1], 7 + t), 1e-6)


def test_rope_scores_depend_on_distance_only():
    g = torch.Generator().manual_seed(0)  # (unseeded, 3 and 4 apart scored within 1e-3 now and then)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)
    scores = [(apply_rope(q, p + 3) * apply_rope(k, p)).sum().item() for p in (0, 5, 1000)]
    assert scores[1] == pytest.approx(scores[0], rel=1e-4) and scores[2] == pytest.approx(scores[0], rel=1e-4)
    assert (apply_rope(q, 4) * apply_rope(k, 0)).sum().item() != pytest.approx(scores[0], rel=1e-3)


# --------------------------------------------------------------------------------------
# softmax and local against the reference


def reference_attention(block, x, context=None, mask=None, context_mask=None, *, visible, bias=None):
    """Multi-head attention with the block's weights, float64, one query at a time.
    visible(t, j, m) says whether query t may see source position j of m; bias(h, t, j),
    if given, is added to the score of head h, query t, key j."""
    w_q = block.q_proj.weight.double()
    w_k, w_v = block.kv_proj.weight.double().chunk(2, dim=0)
    w_o = block.out_proj.weight.double()
    cross = context is not None
    x = x.double()
    src = context.double() if cross else x
    key_mask = context_mask if cross else mask
    B, n, D = x.shape
    m, H = src.shape[1], block.n_heads
    d = D // H
    q, k, v = (x @ w_q.T).view(B, n, H, d), (src @ w_k.T).view(B, m, H, d), (src @ w_v.T).view(B, m, H, d)
    if not cross:  # rotary positions, self-attention only
        q = torch.stack([torch.stack([rope_reference(q[b, t, h], t) for h in range(H)]) for b in range(B) for t in range(n)])
        k = torch.stack([torch.stack([rope_reference(k[b, j, h], j) for h in range(H)]) for b in range(B) for j in range(m)])
        q, k = q.view(B, n, H, d), k.view(B, m, H, d)
    rows = []
    for b in range(B):
        for t in range(n):
            for h in range(H):
                js = [j for j in range(m) if (key_mask is None or key_mask[b, j]) and visible(t, j, m)]
                if (mask is not None and not mask[b, t]) or not js:
                    rows.append(torch.zeros(d, dtype=torch.float64))
                    continue
                scores = torch.stack([q[b, t, h] @ k[b, j, h] for j in js]) / math.sqrt(d)
                if bias is not None:
                    scores = scores + torch.tensor([bias(h, t, j) for j in js], dtype=torch.float64)
                p = torch.softmax(scores, dim=0)
                rows.append(sum(p[i] * v[b, j, h] for i, j in enumerate(js)))
    out = torch.stack(rows).view(B, n, D) @ w_o.T
    return out if mask is None else out * mask[..., None]


def full(t, j, m):
    return True


def causal_self(t, j, m):
    return j <= t


def causal_cross(t, j, m):
    return j <= min(t, m - 1)


def check_against_reference(block, x, context, mask, context_mask, visible, bias=None):
    """Outputs and the gradients of x and context, fp32 block vs float64 reference."""
    inputs = [x] + ([context] if context is not None else [])
    for t in inputs:
        t.requires_grad_(True)
    y, state = block(x, context=context, mask=mask, context_mask=context_mask)
    assert state is None
    y_ref = reference_attention(block, x, context, mask, context_mask, visible=visible, bias=bias)
    assert_near(y, y_ref)
    if mask is not None:
        assert torch.equal(y[~mask], torch.zeros_like(y[~mask]))
    weight = torch.randn_like(y_ref)
    grads = torch.autograd.grad((y * weight).sum(), inputs)
    grads_ref = torch.autograd.grad((y_ref * weight).sum(), inputs)
    for g, g_ref in zip(grads, grads_ref):
        assert torch.isfinite(g).all()
        assert_near(g, g_ref)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("pattern", ["CS", "NS"])
def test_softmax_self_matches_reference(pattern, padded):
    block = make_block("softmax", pattern)
    x = torch.randn(3, T, D_MODEL)
    mask = padding_mask(T) if padded else None
    check_against_reference(block, x, None, mask, None, causal_self if pattern == "CS" else full)


@pytest.mark.parametrize("m", [5, 12])  # source shorter and longer than the target
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("pattern", ["CC", "NC"])
def test_softmax_cross_matches_reference(pattern, padded, m):
    block = make_block("softmax", pattern)
    x, context = torch.randn(3, T, D_MODEL), torch.randn(3, m, D_MODEL)
    # With the source's first 2 positions padded, CC queries 0 and 1 see no key: output 0.
    mask, context_mask = (padding_mask(T), padding_mask(m)) if padded else (None, None)
    check_against_reference(block, x, context, mask, context_mask, causal_cross if pattern == "CC" else full)


def alibi_reference(n_heads: int):
    """ALiBi's penalty written out: head h (from 0) of H has slope 2 ** (-8 (h + 1) / H)
    and adds -slope |t - j|; with H = 2 the slopes are 1/16 and 1/256."""
    def bias(h, t, j):
        return -(2.0 ** (-8.0 * (h + 1) / n_heads)) * abs(t - j)
    return bias


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("pattern", ["CS", "NS"])
def test_softmax_alibi_matches_reference(pattern, padded):
    # Scaled-up inputs and steep slopes would hide nothing: N_HEADS = 2 gives 1/16 and
    # 1/256, so the penalty over 9 positions is comparable to the scores.
    assert alibi_reference(2)(0, 3, 0) == -3 / 16 and alibi_reference(2)(1, 0, 3) == -3 / 256
    block = make_block("softmax", pattern, alibi=True)
    x = 4 * torch.randn(3, T, D_MODEL)
    mask = padding_mask(T) if padded else None
    visible = causal_self if pattern == "CS" else full
    check_against_reference(block, x, None, mask, None, visible, bias=alibi_reference(N_HEADS))
    # The penalty changes the output, or the check above would pass without it.
    plain = make_block("softmax", pattern)
    assert not torch.allclose(run(plain, x.detach(), mask=mask), run(block, x.detach(), mask=mask), atol=1e-3)


def test_softmax_alibi_decode_matches_reference():
    """The KV-cache decode puts the penalty at the right positions: token by token and in
    uneven chunks against the reference."""
    block = make_block("softmax", "CS", alibi=True)
    x = 4 * torch.randn(2, T, D_MODEL)
    y_ref = reference_attention(block, x, visible=causal_self, bias=alibi_reference(N_HEADS))
    with torch.no_grad():
        for sizes in ([1] * T, [4, 1, T - 5]):
            state, outs = block.init_state(2), []
            for chunk in torch.split(x, sizes, dim=1):
                out, state = block(chunk, state=state)
                outs.append(out)
            assert_near(torch.cat(outs, dim=1), y_ref)


@pytest.mark.parametrize("pattern", ["CC", "NC"])
def test_softmax_alibi_leaves_cross_attention_alone(pattern):
    x, context = torch.randn(2, T, D_MODEL), torch.randn(2, 6, D_MODEL)
    with_alibi, without = make_block("softmax", pattern, alibi=True), make_block("softmax", pattern)
    assert torch.equal(run(with_alibi, x, context), run(without, x, context))


def test_softmax_alibi_config_errors():
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match=r"^attention\.alibi=.*: must be true or false$"):
            make_block("softmax", "CS", alibi=bad)


@pytest.mark.parametrize("length", [7, 13])
@pytest.mark.parametrize(("pattern", "window"), [("CS", 1), ("CS", 3), ("CS", 4), ("CS", 20), ("NS", 2), ("NS", 4)])
def test_local_matches_reference(pattern, window, length):
    block = make_block("local", pattern, window=window)
    if pattern == "CS":
        def visible(t, j, m):
            return t - window < j <= t
    else:
        def visible(t, j, m):
            return abs(t - j) <= window // 2
    x = torch.randn(3, length, D_MODEL)
    check_against_reference(block, x, None, padding_mask(length), None, visible)
    check_against_reference(block, x.detach(), None, None, None, visible)


@pytest.mark.parametrize("window", [1, 2, 5, 20])  # 20: more than the sequence
def test_local_decode_buffer_edges(window):
    """Decoding keeps only the last window-1 positions; chunks longer than the window."""
    block = make_block("local", "CS", window=window)
    x = torch.randn(2, 13, D_MODEL)
    y_ref = reference_attention(block, x, visible=lambda t, j, m: t - window < j <= t)
    with torch.no_grad():
        for sizes in ([1] * 13, [7, 1, 5], [13]):
            state, outs = block.init_state(2), []
            for chunk in torch.split(x, sizes, dim=1):
                out, state = block(chunk, state=state)
                outs.append(out)
                assert state.k.shape[2] == window - 1
            assert_near(torch.cat(outs, dim=1), y_ref)


def test_local_config_errors():
    for bad in (0, -2, 2.5):
        with pytest.raises(ConfigError, match=r"attention\.window"):
            make_block("local", "CS", window=bad)
    with pytest.raises(ConfigError, match=r"attention\.window=3.*even"):
        make_block("local", "NS", window=3)


def test_softmax_rejects_wrong_inputs():
    block = make_block("softmax", "NC")
    x = torch.randn(2, T, D_MODEL)
    with pytest.raises(ValueError, match="context"):
        block(x)
    with pytest.raises(ValueError, match="context_mask"):
        block(x, context=x, context_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="NS"):
        make_block("softmax", "NS").init_state(2)


# --------------------------------------------------------------------------------------
# The contract of every registered attention


def run(block, x, context=None, **kwargs):
    return block(x, context=context, **kwargs)[0]


@pytest.mark.parametrize(("name", "pattern"), supported({"CS", "CC"}))
def test_causal_prefix(name, pattern):
    """CAB's check: the output at t on the whole input == on the input cut after t (the
    target and, in CC, the source)."""
    block = make_block(name, pattern)
    for m in [12, 5] if pattern == "CC" else [None]:
        x = torch.randn(2, T, D_MODEL)
        context = torch.randn(2, m, D_MODEL) if m else None
        y = run(block, x, context)
        for t in range(T):
            cut = context[:, : min(t + 1, m)] if m else None
            assert_near(run(block, x[:, : t + 1], cut)[:, t], y[:, t])


@pytest.mark.parametrize(("name", "pattern"), supported({"CS", "CC", "NC"}))
def test_decode_matches_full_forward(name, pattern):
    """Token by token, and in uneven chunks, through the decode state."""
    block = make_block(name, pattern)
    for m in [12, 5] if pattern != "CS" else [None]:
        x = torch.randn(3, T, D_MODEL)
        context = torch.randn(3, m, D_MODEL) if m else None
        context_mask = padding_mask(m) if m else None
        y = run(block, x, context, context_mask=context_mask)
        with torch.no_grad():
            for sizes in ([1] * T, [3, 1, T - 4]):
                state = block.init_state(3, context=context, context_mask=context_mask)
                outs, start = [], 0
                for size in sizes:
                    out, state = block(x[:, start : start + size], context=context, state=state)
                    outs.append(out)
                    start += size
                assert_near(torch.cat(outs, dim=1), y)


@pytest.mark.parametrize(("name", "pattern"), supported({"CS", "NS", "CC", "NC"}))
def test_padding_invariance(name, pattern):
    """Padded positions' values change nothing; padded queries output 0 (self)."""
    block = make_block(name, pattern)
    x = torch.randn(3, T, D_MODEL)
    mask = padding_mask(T)
    if pattern[1] == "S":
        y = run(block, x, mask=mask)
        assert torch.equal(y[~mask], torch.zeros_like(y[~mask]))
        x2 = torch.where(mask[..., None], x, 100 * torch.randn_like(x))
        assert_near(run(block, x2, mask=mask), y)
    else:
        context = torch.randn(3, 12, D_MODEL)
        context_mask = padding_mask(12)
        y = run(block, x, context, context_mask=context_mask)
        context2 = torch.where(context_mask[..., None], context, 100 * torch.randn_like(context))
        assert_near(run(block, x, context2, context_mask=context_mask), y)
        # Padding must matter, or the check above proves nothing.
        assert not torch.allclose(run(block, x, context2), y, atol=1e-3)


@pytest.mark.parametrize(("name", "pattern"), unsupported())
def test_unsupported_pattern_raises(name, pattern):
    with pytest.raises(ConfigError) as err:
        make_block(name, pattern)
    assert repr(name) in str(err.value) and f"({pattern})" in str(err.value)


def relative_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return (diff / expected.double().pow(2).mean().sqrt()).item()


@pytest.mark.parametrize(("name", "pattern"), supported({"CS", "CC", "NC"}))
def test_bf16_autocast_decode(name, pattern):
    """Under bf16 autocast (a GPU's training precision, here on the CPU) the state made by
    init_state and the new positions' tensors mix dtypes; the decode must still run and
    stay within bf16 error of the fp32 forward."""
    block = make_block(name, pattern)
    x = torch.randn(2, T, D_MODEL)
    context = torch.randn(2, 6, D_MODEL) if pattern[1] == "C" else None
    y = run(block, x, context)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = block.init_state(2, context=context)
        outs = []
        for t in range(T):
            out, state = block(x[:, t : t + 1], context=context, state=state)
            outs.append(out)
    assert relative_rms(torch.cat(outs, dim=1), y) <= 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "pattern"), supported({"CS", "NS", "CC", "NC"}))
def test_block_on_cuda(name, pattern):
    """The same block on a GPU (Triton kernels for lavo/gsa, SDPA kernels for softmax/local)
    agrees with the CPU: fp32 within 1e-3 of the max, bf16 autocast within 3e-2 relative RMS;
    gradients are finite."""
    block = make_block(name, pattern)
    x = torch.randn(2, 33, D_MODEL)
    context = torch.randn(2, 21, D_MODEL) if pattern[1] == "C" else None
    mask, context_mask = padding_mask(33)[:2], (padding_mask(21)[:2] if context is not None else None)
    y = run(block, x, context, mask=mask, context_mask=context_mask)
    block = block.cuda()
    to_cuda = [t.cuda() if t is not None else None for t in (x, context, mask, context_mask)]
    xg, cg, mg, cmg = to_cuda
    assert_near(run(block, xg, cg, mask=mg, context_mask=cmg).cpu(), y, 1e-3)
    xg.requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yb = run(block, xg, cg, mask=mg, context_mask=cmg)
    assert relative_rms(yb.float().cpu(), y) <= 3e-2
    (grad,) = torch.autograd.grad(yb.float().sum(), xg)
    assert torch.isfinite(grad).all()


# --------------------------------------------------------------------------------------
# Keyword arguments


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_keyword_defaults_are_the_yaml_defaults(name):
    cls = block_class(name)
    parameters = inspect.signature(cls.__init__).parameters
    defaults = {key: parameters[key].default for key in cls.option_names()}
    path = importlib.resources.files("lavo_tasks.configs") / "attention" / f"{name}.yaml"
    assert {"name": name, **defaults} == OmegaConf.to_container(OmegaConf.load(str(path)).attention)


def test_block_by_keywords_equals_block_by_config():
    from lavo_tasks.attention.lavo import LavoAttention

    torch.manual_seed(0)
    by_config = build_attention(OmegaConf.create({"name": "lavo", "window": 6, "rank": 4}), D_MODEL, n_heads=N_HEADS,
                                causal=True, cross=False)  # the keys left out take their defaults
    torch.manual_seed(0)
    by_keywords = LavoAttention(D_MODEL, N_HEADS, causal=True, cross=False, window=6, rank=4)
    assert by_keywords.window == 6 and by_keywords.backend == "auto" and hasattr(by_keywords, "basis_map")
    for (key, a), (_, b) in zip(by_config.state_dict().items(), by_keywords.state_dict().items(), strict=True):
        assert torch.equal(a, b), key
    with pytest.raises(TypeError, match="'windw'"):
        LavoAttention(D_MODEL, N_HEADS, causal=True, cross=False, windw=6)
    with pytest.raises(TypeError, match="SoftmaxAttention: unknown argument 'window'; its own are: alibi"):
        block_class("softmax")(D_MODEL, N_HEADS, causal=True, cross=False, window=4)
    with pytest.raises(ConfigError, match=r"attention\.windw: not a key of attention 'lavo'; allowed: window"):
        build_attention(OmegaConf.create({"name": "lavo", "windw": 6}), D_MODEL, n_heads=N_HEADS, causal=True,
                        cross=False)


def test_blocks_by_keywords_name_the_argument():
    """A block built from keyword arguments names the argument; build_attention (the config
    layer) names the config key for the same value, with the same message otherwise."""
    from lavo_tasks.attention import LavoAttention, LocalAttention

    cases = [
        (LavoAttention, dict(rank=99), "rank=99: must be an integer between 1 and the head dim 8 "
                                        "(d_model=16 / n_heads=2)",
         "attention.rank=99: must be an integer between 1 and the head dim 8 (model.d_model=16 / model.n_heads=2)"),
        (LocalAttention, dict(window=0), "window=0: must be an integer >= 1",
         "attention.window=0: must be an integer >= 1"),
    ]
    for cls, options, plain, keyed in cases:
        with pytest.raises(ValueError) as err:
            cls(D_MODEL, N_HEADS, causal=True, cross=False, **options)
        assert type(err.value) is ValueError and str(err.value) == plain
        with pytest.raises(ConfigError) as err:
            build_attention({"name": cls.name, **options}, D_MODEL, N_HEADS, causal=True, cross=False)
        assert str(err.value) == keyed
    with pytest.raises(ValueError) as err:
        LavoAttention(D_MODEL, 3, causal=True, cross=False)
    assert type(err.value) is ValueError and str(err.value) == "n_heads=3: must be >= 1 and divide d_model=16"
    with pytest.raises(ConfigError, match=r"^model\.n_heads=3: must be >= 1 and divide model\.d_model=16$"):
        build_attention({"name": "lavo"}, D_MODEL, 3, causal=True, cross=False)
    with pytest.raises(ValueError) as err:
        LocalAttention(D_MODEL, N_HEADS, causal=True, cross=True)
    assert type(err.value) is ValueError and "'local' does not support causal cross-attention (CC)" in str(err.value)


def test_build_attention_takes_a_dict_or_a_dictconfig():
    spec = {"name": "lavo", "window": 6, "rank": 4}
    torch.manual_seed(0)
    from_dict = build_attention(spec, D_MODEL, N_HEADS, causal=False, cross=True)
    torch.manual_seed(0)
    from_config = build_attention(OmegaConf.create(spec), D_MODEL, n_heads=N_HEADS, causal=False, cross=True)
    assert from_dict.pattern == "NC" and from_dict.window == 6 and from_dict.rank == 4
    for (key, a), (_, b) in zip(from_dict.state_dict().items(), from_config.state_dict().items(), strict=True):
        assert torch.equal(a, b), key
    with pytest.raises(ConfigError, match=r"^attention\.name: missing"):
        build_attention({"window": 6}, D_MODEL, N_HEADS, causal=True, cross=False)
