"""Transformer layers: decoding through the layer state == the full forward, padding
never leaks, causality of the causal encoder, input errors."""

import pytest
import torch

from lavo_tasks.attention import ATTENTION_NAMES
from lavo_tasks.layers import TransformerDecoderLayer, TransformerEncoderLayer
from attention_cases import attention_cfg, padding_mask, patterns_of
from compare import assert_near

D_MODEL, N_HEADS, D_FF, T, M = 16, 2, 32, 9, 7


def cross_name(name: str, causal: bool) -> str:
    """The attention itself at the cross site when it can do that pattern, else softmax."""
    return name if ("CC" if causal else "NC") in patterns_of(name) else "softmax"


def decoder_cases():
    for name in ATTENTION_NAMES:
        yield name, None, False
        for causal in (True, False):
            yield name, cross_name(name, causal), causal


@pytest.mark.parametrize(("self_name", "cross", "cross_causal"), list(decoder_cases()))
def test_decoder_decode_matches_full_forward(self_name, cross, cross_causal):
    torch.manual_seed(0)
    layer = TransformerDecoderLayer(
        D_MODEL, N_HEADS, attention_cfg(self_name), attention_cfg(cross) if cross else None,
        d_ff=D_FF, dropout=0.1, cross_causal=cross_causal,
    ).eval()  # eval: dropout off, so both paths are deterministic
    x = torch.randn(3, T, D_MODEL)
    memory = torch.randn(3, M, D_MODEL) if cross else None
    memory_mask = padding_mask(M) if cross else None
    y, state = layer(x, memory, memory_mask=memory_mask)
    assert state is None
    with torch.no_grad():
        for sizes in ([1] * T, [4, T - 4]):
            state = layer.init_state(3, memory, memory_mask)
            outs, start = [], 0
            for size in sizes:
                out, state = layer(x[:, start : start + size], memory, state=state)
                outs.append(out)
                start += size
            assert_near(torch.cat(outs, dim=1), y)


def changed_padding(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask[..., None], x, 100 * torch.randn_like(x))


@pytest.mark.parametrize(
    ("name", "causal"), [(n, c) for n in ATTENTION_NAMES for c in (False, True) if ("CS" if c else "NS") in patterns_of(n)]
)
def test_encoder_padding_invariance(name, causal):
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(D_MODEL, N_HEADS, attention_cfg(name), d_ff=D_FF, causal=causal)
    x, mask = torch.randn(3, T, D_MODEL), padding_mask(T)
    y = layer(x, mask)
    assert torch.equal(y[~mask], torch.zeros_like(y[~mask]))
    assert_near(layer(changed_padding(x, mask), mask), y)


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_decoder_padding_invariance(name):
    torch.manual_seed(0)
    layer = TransformerDecoderLayer(D_MODEL, N_HEADS, attention_cfg(name), attention_cfg(cross_name(name, False)),
                                    d_ff=D_FF)
    x, mask = torch.randn(3, T, D_MODEL), padding_mask(T)
    memory, memory_mask = torch.randn(3, M, D_MODEL), padding_mask(M)
    y, _ = layer(x, memory, mask, memory_mask)
    assert torch.equal(y[~mask], torch.zeros_like(y[~mask]))
    y2, _ = layer(changed_padding(x, mask), changed_padding(memory, memory_mask), mask, memory_mask)
    assert_near(y2, y)


def test_causal_encoder_prefix():
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(D_MODEL, N_HEADS, attention_cfg("local", window=3), d_ff=D_FF, causal=True)
    x = torch.randn(2, T, D_MODEL)
    y = layer(x)
    for t in range(T):
        assert_near(layer(x[:, : t + 1])[:, t], y[:, t])


def test_decoder_memory_errors():
    cfg = attention_cfg("softmax")
    x = torch.randn(2, T, D_MODEL)
    with pytest.raises(ValueError, match="needs a memory"):
        TransformerDecoderLayer(D_MODEL, N_HEADS, cfg, cfg, d_ff=D_FF)(x)
    with pytest.raises(ValueError, match="no memory"):
        TransformerDecoderLayer(D_MODEL, N_HEADS, cfg, d_ff=D_FF)(x, memory=x)


def test_layer_arguments_are_named():
    """A layer built from plain arguments names the bad one (ValueError, not the CLI's
    ConfigError); a block class stands for an attention site as a config does."""
    from lavo_tasks.attention import LocalAttention
    from lavo_tasks.errors import ConfigError

    for bad, message in [(dict(d_ff=0), "d_ff=0: must be an integer >= 1"),
                         (dict(dropout=1.0), "dropout=1.0: must be a number in [0, 1)"),
                         (dict(dropout=True), "dropout=True: must be a number in [0, 1)")]:
        with pytest.raises(ValueError) as err:
            TransformerEncoderLayer(D_MODEL, N_HEADS, LocalAttention, **{"d_ff": D_FF, **bad})
        assert type(err.value) is ValueError and str(err.value) == message
    with pytest.raises(ValueError) as err:
        TransformerDecoderLayer(D_MODEL, 3, LocalAttention, d_ff=D_FF)
    assert type(err.value) is ValueError and str(err.value) == f"n_heads=3: must be >= 1 and divide d_model={D_MODEL}"
    with pytest.raises(ConfigError, match=r"^attention\.window=0: must be an integer >= 1$"):
        TransformerEncoderLayer(D_MODEL, N_HEADS, {"name": "local", "window": 0}, d_ff=D_FF)
    with pytest.raises(TypeError, match="^attention: expected a block class"):
        TransformerEncoderLayer(D_MODEL, N_HEADS, "local", d_ff=D_FF)
    with pytest.raises(TypeError, match="not an attention block"):
        TransformerEncoderLayer(D_MODEL, N_HEADS, lambda d, h, causal, cross: torch.nn.Linear(d, d), d_ff=D_FF)
