"""The size of an attention's decode state per sequence and layer, in stored numbers.

What one layer keeps between two decoded tokens, summed over its heads (D = d_model,
H = heads, so H * head_dim = D); the recall an attention can do is bounded by it:

| attention | self (CS), after `length` tokens | cross, over a source of `length` tokens |
|---|---|---|
| softmax | keys and values of every token: 2 * length * D | the projected source: 2 * length * D |
| local   | keys and values of the last w - 1 tokens: 2 * (w - 1) * D | (no cross pattern) |
| lavo    | local's ring buffer + the r memory coordinates per head: 2 * (w - 1) * D + r * H | CC: as self; NC: r * cross_segments * H |
| gsa     | the key and value slot memories: M * (d_k + d_v) * H = 2 * M * D | the same (the source's final state) |

LAVO's memory slots are h_i b_i with the basis b a parameter, so the state holds the r
coordinates h_i; its memory count (an integer) is left out. Fixed-size states do not
depend on `length`.
"""

from omegaconf import DictConfig


def state_size(attention: DictConfig, pattern: str, d_model: int, n_heads: int, length: int) -> int:
    """Numbers one layer's `attention` keeps per sequence (module docstring); pattern is
    CS, CC or NC; length: the tokens seen (self) or the source length (cross)."""
    name = attention.name
    if name == "softmax":
        return 2 * length * d_model
    if name == "local":
        return 2 * (attention.window - 1) * d_model
    if name == "lavo":
        if pattern == "NC":
            return attention.rank * attention.cross_segments * n_heads
        return 2 * (attention.window - 1) * d_model + attention.rank * n_heads
    if name == "gsa":
        return 2 * attention.slots * d_model
    raise ValueError(f"state_size: no formula for attention {name!r}")
