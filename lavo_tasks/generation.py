"""Generation over decode states: `reorder` for beam search.

A decode state (of a block, a layer, a stack, a whole model) is a value: nested tuples,
NamedTuples, lists and dicts of tensors whose first dimension is the batch, with plain
ints, floats, bools, strings or None beside them (positions and counts, the same for
every row). Nothing in it is changed in place, so a state handed to a step is still
valid afterwards and can be reordered, copied or dropped freely.
"""

from torch import Tensor

_PLAIN = (int, float, bool, str, type(None))


def reorder(state, index: Tensor):
    """The state whose row i is row index[i] of `state` (index: long [N]): index_select(0,
    index) on every tensor of the nested containers; plain values pass through.

    Beam search calls it to follow the surviving hypotheses, and to expand a batch of B
    rows to B * beam (index = arange(B).repeat_interleave(beam)). A tensor broadcast over
    the batch (stride 0 in dim 0, all rows one) stays a broadcast view of N rows.
    """
    if isinstance(state, Tensor):
        index = index.to(state.device)
        if state.dim() and state.stride(0) == 0:
            return state[:1].expand(len(index), *state.shape[1:])
        return state.index_select(0, index)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a NamedTuple
        return type(state)(*(reorder(part, index) for part in state))
    if isinstance(state, (tuple, list)):
        return type(state)(reorder(part, index) for part in state)
    if isinstance(state, dict):
        return {key: reorder(part, index) for key, part in state.items()}
    if isinstance(state, _PLAIN):
        return state
    raise TypeError(f"reorder: a decode state holds tensors in tuples, lists and dicts; got {type(state).__name__}")


__all__ = ["reorder"]
