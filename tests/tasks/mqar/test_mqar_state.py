"""The recorded state size (tasks/mqar/state.py) against the decode states themselves:
the numbers per sequence of the tensors one layer of the attention under test holds."""

import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.tasks.mqar.data import make_sequences
from lavo_tasks.tasks.mqar.model import RecallModel
from lavo_tasks.tasks.mqar.state import state_size

from test_mqar_data import TINY_ATTENTION, tiny_cfg

D_MODEL, HEADS, SEQ_LEN, PAIRS = 16, 2, 24, 5  # test_mqar_data.TINY's sizes


def numbers_per_sequence(state) -> int:
    """Numbers per batch row in every tensor of a decode state (nested tuples). A tensor
    broadcast over the batch (batch stride 0: LAVO's basis, a function of the weights)
    is not per sequence; ints (positions, counts) are not tensors."""
    if isinstance(state, torch.Tensor):
        return 0 if state.stride(0) == 0 else state[0].numel()
    if isinstance(state, tuple):
        return sum(numbers_per_sequence(part) for part in state)
    return 0


def model_and_inputs(tmp_path, variant, attention, *extra):
    cfg = tiny_cfg(tmp_path, f"data.variant={variant}", f"attention={attention}", *TINY_ATTENTION[attention], *extra)
    torch.manual_seed(0)
    model = RecallModel(32, PAIRS, variant, cfg.model, cfg.model.attention).eval()
    inputs, _ = make_sequences(3, 32, SEQ_LEN, PAIRS, 3, torch.Generator().manual_seed(1))
    return cfg.model.attention, model, inputs


@pytest.mark.parametrize("attention", ["softmax", "local", "lavo", "gsa"])
def test_self_state_size_is_what_the_layer_holds_after_the_sequence(tmp_path, attention):
    options, model, inputs = model_and_inputs(tmp_path, "self", attention)
    state = model.init_state(None, inputs.shape[0])
    with torch.no_grad():
        for t in range(SEQ_LEN):
            _, state = model.decoder.step(model.read(inputs[:, t:t + 1], inputs[:, t - 1:t] if t else None), state)
    held = numbers_per_sequence(state[0].self_attn)
    assert held > 0
    assert state_size(options, "CS", D_MODEL, HEADS, SEQ_LEN) == held


@pytest.mark.parametrize("attention", ["softmax", "gsa"])
def test_noncausal_cross_state_size_is_what_the_layer_holds(tmp_path, attention):
    """NC softmax keeps the projected source, NC GSA the source's final slot memories."""
    options, model, inputs = model_and_inputs(tmp_path, "cross", attention)
    source, _ = model.split(inputs)
    with torch.no_grad():
        state = model.init_state(source, inputs.shape[0])
    held = numbers_per_sequence(state[0].cross_attn)
    assert held > 0
    assert state_size(options, "NC", D_MODEL, HEADS, 2 * PAIRS) == held


def test_noncausal_lavo_state_size_is_its_segment_means(tmp_path):
    """NC LAVO reads only the segments' memory coordinates (its LavoSource also keeps the
    projected source, which NC never reads: no window)."""
    options, model, inputs = model_and_inputs(tmp_path, "cross", "lavo", "attention.cross_segments=3")
    with torch.no_grad():
        source = model.init_state(model.split(inputs)[0], inputs.shape[0])[0].cross_attn.source
    assert source.means[0].numel() == 4 * 3 * HEADS  # rank 4, 3 segments, per head
    assert state_size(options, "NC", D_MODEL, HEADS, 2 * PAIRS) == source.means[0].numel()


def test_windows_hold_no_more_tokens_than_there_are():
    """Hand-computed, D 64, H 2: a window longer than the sequence (self) or the source
    (CC) stores the tokens there are, and NC keeps no more segments than source tokens;
    CC's window past the source's end is w positions."""
    def size(pattern, length, **attention):
        return state_size(OmegaConf.create(attention), pattern, 64, 2, length)

    assert size("CS", 64, name="local", window=128) == 2 * 64 * 64 == size("CS", 64, name="softmax")
    assert size("CS", 64, name="lavo", window=16, rank=8) == 2 * 15 * 64 + 8 * 2
    assert size("CC", 16, name="lavo", window=4, rank=8) == 2 * 4 * 64 + 8 * 2
    assert size("CC", 16, name="lavo", window=32, rank=8) == 2 * 16 * 64 + 8 * 2  # > softmax's 2 * 16 * 64
    assert size("NC", 16, name="lavo", rank=8, cross_segments=32) == 8 * 16 * 2  # 16 segments hold a token
