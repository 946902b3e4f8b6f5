"""The size of an attention's decode state per sequence and layer, in stored numbers.

What one layer must keep between two decoded tokens once the model has read `length`
tokens (self) or, in cross-attention, past the source's end, where every MQAR query
stands; summed over its heads (D = d_model, H = heads, so H * head_dim = D). The recall
an attention can do is bounded by it:

| attention | self (CS), after `length` tokens | cross, over a source of `length` tokens |
|---|---|---|
| softmax | keys and values of every token: 2 * length * D | the projected source: 2 * length * D |
| local   | keys and values of the last w - 1 tokens: 2 * (w - 1) * D | (no cross pattern) |
| lavo    | local's ring buffer + the r memory coordinates per head: 2 * (w - 1) * D + r * H | CC: the window's w last source keys and values + r * H; NC: r * cross_segments * H |
| gsa     | the key and value slot memories: M * (d_k + d_v) * H = 2 * M * D | the same (the source's final state) |

A window never holds more tokens than there are: w - 1 is capped at `length` (self),
and w at the source's `length` (CC, where past the source's end the window is its last
w positions, the anchor included). NC's segments are capped the same way: only `length`
of them can hold a source token (the others are empty, h = 0). LAVO's memory slots are
h_i b_i with the basis b a parameter, so the state holds the r coordinates h_i; its
memory count (an integer) is left out. Fixed-size states do not depend on `length`.

The implementation's cross states keep more than this, for positions before the
source's end and to prepare the source once: LAVO's LavoSource also holds every source
key and value (CC and NC), GSA's CC state the projected source.
"""

from omegaconf import DictConfig


def state_size(attention: DictConfig, pattern: str, d_model: int, n_heads: int, length: int) -> int:
    """Numbers one layer's `attention` keeps per sequence (module docstring); pattern is
    CS, CC or NC; length: the tokens seen (self) or the source length (cross)."""
    name = attention.name
    if name == "softmax":
        return 2 * length * d_model
    if name == "local":
        return 2 * min(attention.window - 1, length) * d_model
    if name == "lavo":
        memory = attention.rank * n_heads
        if pattern == "NC":
            return memory * min(attention.cross_segments, length)
        window = min(attention.window, length) if pattern == "CC" else min(attention.window - 1, length)
        return 2 * window * d_model + memory
    if name == "gsa":
        return 2 * attention.slots * d_model
    raise ValueError(f"state_size: no formula for attention {name!r}")
