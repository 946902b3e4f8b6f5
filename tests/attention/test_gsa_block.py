"""The `gsa` block: its layer math against a composition written here from docs/design.md §2
section 2 over the token-loop reference, causality, decode == full forward, padding,
configuration errors."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from lavo_tasks.attention import build_attention, check_attention_config
from lavo_tasks.attention.gsa import GatedSlotAttention
from lavo_tasks.errors import ConfigError
from lavo_tasks.kernels.gsa.reference import reference_gsa_attn

PATTERNS = {"CS": (True, False), "NS": (False, False), "CC": (True, True), "NC": (False, True)}
D_MODEL, HEADS, SLOTS, TAU = 16, 2, 5, 2.0


def gsa_cfg(**overrides):
    return OmegaConf.create({"name": "gsa", "slots": SLOTS, "tau": TAU, "backend": "torch", **overrides})


def make_block(pattern, seed=0):
    causal, cross = PATTERNS[pattern]
    torch.manual_seed(seed)
    block = build_attention(gsa_cfg(), D_MODEL, n_heads=HEADS, causal=causal, cross=cross)
    with torch.no_grad():  # RMSNorm's weight starts at 1; make it count
        block.norm.weight.uniform_(0.5, 1.5)
    return block.eval()


def inputs(batch, n, m, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, D_MODEL, generator=g)
    context = torch.randn(batch, m, D_MODEL, generator=g)
    mask = torch.rand(batch, n, generator=g) > 0.3
    context_mask = torch.rand(batch, m, generator=g) > 0.3
    mask[:, :1] = context_mask[:, :1] = True
    return x, context, mask, context_mask


def layer_by_hand(block, x, source, kv_mask, causal, cross):
    """docs/design.md §2.3's layer in float64: swish q, k; SiLU v; log alpha =
    logsigmoid(W_f x) / tau; op (the token-loop reference); SiLU -> RMSNorm -> W_o."""
    w = {name: getattr(block, name).weight.double() for name in ("q_proj", "k_proj", "v_proj", "f_proj", "out_proj")}
    x, source = x.double(), source.double()
    per_head = lambda t, d: t.view(*t.shape[:2], HEADS, d)  # noqa: E731
    q = per_head(F.silu(x @ w["q_proj"].T), D_MODEL // HEADS)
    k = per_head(F.silu(source @ w["k_proj"].T), D_MODEL // HEADS)
    v = per_head(F.silu(source @ w["v_proj"].T), D_MODEL // HEADS)
    log_alpha = per_head(F.logsigmoid(source @ w["f_proj"].T), SLOTS) / TAU
    o, _ = reference_gsa_attn(q, k, v, log_alpha, causal=causal, cross=cross, kv_mask=kv_mask)
    o = F.silu(o)
    eps = torch.finfo(torch.float32).eps
    o = o / (o.pow(2).mean(-1, keepdim=True) + eps).sqrt() * block.norm.weight.double()
    return o.reshape(x.shape) @ w["out_proj"].T


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_block_matches_layer_by_hand(pattern):
    causal, cross = PATTERNS[pattern]
    block = make_block(pattern)
    x, context, mask, context_mask = inputs(2, 11, 13)
    if cross:
        y, state = block(x, context=context, mask=mask, context_mask=context_mask)
        expected = layer_by_hand(block, x, context, context_mask, causal, cross)
    else:
        y, state = block(x, mask=mask)
        expected = layer_by_hand(block, x, x, mask, causal, cross)
    expected = expected * mask[..., None]
    assert state is None
    err = (y.double() - expected).abs().max().item()
    assert err <= 1e-4 * expected.abs().max().item(), f"{pattern}: max abs error {err:.3g}"


@pytest.mark.parametrize("pattern", ["CS", "NS", "CC", "NC"])
def test_padding_changes_nothing_and_padded_queries_are_zero(pattern):
    causal, cross = PATTERNS[pattern]
    block = make_block(pattern)
    x, context, mask, context_mask = inputs(2, 10, 9)
    noise_x = torch.where(mask[..., None], x, 100 * torch.randn_like(x))
    noise_c = torch.where(context_mask[..., None], context, 100 * torch.randn_like(context))
    if cross:
        y, _ = block(x, context=context, mask=mask, context_mask=context_mask)
        y2, _ = block(x, context=noise_c, mask=mask, context_mask=context_mask)
    else:
        y, _ = block(x, mask=mask)
        y2, _ = block(noise_x, mask=mask)
    torch.testing.assert_close(y, y2, rtol=0, atol=1e-6)
    assert (y[~mask] == 0).all()


@pytest.mark.parametrize("pattern", ["CS", "CC"])
def test_causality_prefix(pattern):
    cross = pattern == "CC"
    block = make_block(pattern)
    x, context, _, _ = inputs(1, 20, 14)
    full, _ = block(x, context=context if cross else None)
    for t in (0, 7, 13, 19):
        cut = slice(0, t + 1)
        y, _ = block(x[:, cut], context=context[:, cut] if cross else None)
        torch.testing.assert_close(y[:, t], full[:, t], rtol=0, atol=1e-6)


@pytest.mark.parametrize("pattern,n,m", [("CS", 21, 0), ("CC", 21, 14), ("CC", 9, 14), ("NC", 12, 14)])
@pytest.mark.parametrize("steps", ["one by one", "mixed"])
def test_decode_equals_full_forward(pattern, n, m, steps):
    """Feeding x a piece at a time through the decode state gives the full outputs."""
    cross = pattern != "CS"
    block = make_block(pattern)
    x, context, _, context_mask = inputs(2, n, m)
    if cross:
        full, _ = block(x, context=context, context_mask=context_mask)
        state = block.init_state(2, context=context, context_mask=context_mask)
    else:
        full, _ = block(x)
        state = block.init_state(2)
    sizes = [1] * n if steps == "one by one" else [5, 1, 1, 7, n]
    outputs, start = [], 0
    for size in sizes:
        piece = x[:, start:start + size]
        if piece.shape[1] == 0:
            break
        y, state = block(piece, context=context if cross else None, state=state)
        outputs.append(y)
        start += piece.shape[1]
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=0, atol=1e-5)
    # the decode state does not grow with the number of positions seen
    assert all(t.shape == (2, HEADS, SLOTS, D_MODEL // HEADS) for t in state.memory)


def test_noncausal_self_attention_cannot_decode():
    with pytest.raises(ValueError, match="NS"):
        make_block("NS").init_state(2)


def test_cross_attention_needs_a_context():
    with pytest.raises(ValueError, match="context"):
        make_block("CC")(torch.randn(1, 3, D_MODEL))
    with pytest.raises(ValueError, match="context"):
        make_block("NC").init_state(1)


@pytest.mark.parametrize("key,value", [
    ("slots", 0), ("slots", 2.5), ("slots", True), ("tau", 0.0), ("tau", -1.0), ("tau", "hot"),
    ("backend", "cuda"),
])
def test_bad_config_names_the_key(key, value):
    with pytest.raises(ConfigError, match=f"attention.{key}="):
        build_attention(gsa_cfg(**{key: value}), D_MODEL, n_heads=HEADS, causal=True, cross=False)
    with pytest.raises(ConfigError, match=f"attention.{key}="):
        check_attention_config(gsa_cfg(**{key: value}), D_MODEL, HEADS, "CS")
    with pytest.raises(ValueError, match=f"^{key}="):  # by keywords: the argument's name
        GatedSlotAttention(D_MODEL, HEADS, causal=True, cross=False, **{key: value})


def test_default_config_file_builds():
    from lavo_tasks.config import attention_defaults

    cfg = attention_defaults("gsa")
    block = build_attention(cfg, 32, n_heads=4, causal=True, cross=False)
    assert isinstance(block, GatedSlotAttention) and block.slots == cfg.slots and block.tau == cfg.tau
