"""The shared stacks: step-by-step decoding through the Decoder's state == its full
forward, padding, the noncausal Decoder, the final norm, input errors; and `reorder` on
hand-made nested states."""

from typing import NamedTuple

import pytest
import torch

from lavo_tasks.attention import ATTENTION_NAMES
from lavo_tasks.generation import reorder
from lavo_tasks.stacks import Decoder, Encoder
from attention_cases import attention_cfg, padding_mask, patterns_of
from compare import assert_near
from test_layers import changed_padding, decoder_cases

D_MODEL, N_HEADS, D_FF, N_LAYERS, T, M = 16, 2, 32, 2, 9, 7


def make_decoder(self_name, cross=None, cross_causal=False, causal=True, dropout=0.0):
    torch.manual_seed(0)
    return Decoder(d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, self_attention=attention_cfg(self_name),
                   cross_attention=attention_cfg(cross) if cross else None, d_ff=D_FF, dropout=dropout,
                   causal=causal, cross_causal=cross_causal)


@pytest.mark.parametrize(("self_name", "cross", "cross_causal"), list(decoder_cases()))
def test_decoder_step_matches_forward(self_name, cross, cross_causal):
    decoder = make_decoder(self_name, cross, cross_causal, dropout=0.1).eval()
    x = torch.randn(3, T, D_MODEL)
    memory = torch.randn(3, M, D_MODEL) if cross else None
    memory_mask = padding_mask(M) if cross else None
    with torch.no_grad():
        y = decoder(x, memory, memory_mask=memory_mask)
        for sizes in ([1] * T, [4, T - 4]):
            state = decoder.init_state(3, memory, memory_mask)
            assert isinstance(state, tuple) and len(state) == N_LAYERS
            outs, start = [], 0
            for size in sizes:
                out, state = decoder.step(x[:, start : start + size], state)
                outs.append(out)
                start += size
            assert_near(torch.cat(outs, dim=1), y)


def test_final_norm_is_applied():
    """The stacks end in a LayerNorm: every real output row has mean 0 and variance 1
    (weight 1 and bias 0 at the start)."""
    decoder = make_decoder("softmax")
    torch.manual_seed(1)
    encoder = Encoder(d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, attention=attention_cfg("softmax"),
                      d_ff=D_FF)
    x = 3 * torch.randn(2, T, D_MODEL) + 1
    for y in (decoder(x), encoder(x)):
        assert y.mean(-1).abs().max() < 1e-5 and (y.var(-1, unbiased=False) - 1).abs().max() < 1e-3


@pytest.mark.parametrize(
    ("name", "causal"), [(n, c) for n in ATTENTION_NAMES for c in (False, True) if ("CS" if c else "NS") in patterns_of(n)]
)
def test_encoder_padding(name, causal):
    torch.manual_seed(0)
    encoder = Encoder(d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, attention=attention_cfg(name), d_ff=D_FF,
                      causal=causal)
    x, mask = torch.randn(3, T, D_MODEL), padding_mask(T)
    y = encoder(x, mask)
    assert torch.equal(y[~mask], torch.zeros_like(y[~mask]))  # after the final norm too
    assert_near(encoder(changed_padding(x, mask), mask), y)
    if causal:  # a causal encoder's output at t depends on positions <= t only
        y = encoder(x)
        assert_near(encoder(x[:, :4]), y[:, :4])


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_noncausal_decoder(name):
    """PCC's query decoder: noncausal self-attention (NS) and NC cross-attention; forward
    runs, sees later positions, ignores padding; decoding it step by step is refused."""
    cross = name if "NC" in patterns_of(name) else "softmax"
    decoder = make_decoder(name, cross, cross_causal=False, causal=False)
    x, mask = torch.randn(3, T, D_MODEL), padding_mask(T)
    memory, memory_mask = torch.randn(3, M, D_MODEL), padding_mask(M)
    y = decoder(x, memory, mask, memory_mask)
    assert y.shape == (3, T, D_MODEL) and torch.equal(y[~mask], torch.zeros_like(y[~mask]))
    assert_near(decoder(changed_padding(x, mask), changed_padding(memory, memory_mask), mask, memory_mask), y)
    later = x.clone()
    later[:, 1] += torch.randn(D_MODEL)  # (a constant shift would vanish in the first norm)
    assert not torch.allclose(decoder(later, memory)[:, 0], decoder(x, memory)[:, 0])  # position 0 sees position 1
    with pytest.raises(ValueError, match="causal=False"):
        decoder.init_state(3, memory, memory_mask)
    with pytest.raises(ValueError, match="causal=False"):
        decoder.step(x[:, :1], ())


def test_decoder_errors():
    decoder = make_decoder("softmax", "softmax")
    x = torch.randn(2, T, D_MODEL)
    with pytest.raises(ValueError, match="needs a memory"):
        decoder(x)
    with pytest.raises(ValueError, match="needs a memory"):
        decoder.init_state(2)
    with pytest.raises(ValueError, match="no memory"):
        make_decoder("softmax")(x, memory=x)
    with pytest.raises(ValueError, match="tuple of 2 layer states"):
        decoder.step(x[:, :1], decoder.init_state(2, x)[:1])


# --------------------------------------------------------------------------------------
# reorder


class Pair(NamedTuple):
    a: torch.Tensor
    b: object


def test_reorder_nested_containers():
    rows = torch.arange(4.0)
    state = (
        Pair(rows[:, None] * torch.ones(4, 3), None),
        [rows.long(), {"x": rows * 10, "count": 7}],
        torch.ones(1, 5).expand(4, 5),  # one row broadcast over the batch
        "tag",
    )
    index = torch.tensor([2, 2, 0, 3, 1])  # 4 rows -> 5: a beam's survivors, one row twice
    out = reorder(state, index)
    assert isinstance(out, tuple) and isinstance(out[0], Pair) and isinstance(out[1], list)
    assert torch.equal(out[0].a, torch.tensor([2.0, 2, 0, 3, 1])[:, None].expand(5, 3))
    assert out[0].b is None and out[1][1]["count"] == 7 and out[3] == "tag"
    assert torch.equal(out[1][0], torch.tensor([2, 2, 0, 3, 1]))
    assert torch.equal(out[1][1]["x"], torch.tensor([20.0, 20, 0, 30, 10]))
    assert out[2].shape == (5, 5) and out[2].stride(0) == 0 and torch.equal(out[2], torch.ones(5, 5))
    # the input is a value: untouched
    assert torch.equal(state[1][0], torch.arange(4)) and torch.equal(state[0].a[:, 0], rows)


def test_reorder_refuses_unknown_objects():
    class Box:
        tensor = torch.zeros(2)

    with pytest.raises(TypeError, match="Box"):
        reorder((torch.zeros(2), Box()), torch.tensor([1, 0]))
