"""LAVO attention (docs/design.md §2.2 and §2.6): `lavo_attn` for whole
sequences; for causal decoding `lavo_prefill` (the first positions at once) and
`lavo_decode_step` (one token at a time); the cross-attention decoding helpers
(`lavo_source`, `lavo_cross_decode`) the block uses; the decode states."""

from .attn import lavo_attn
from .decode import lavo_cross_decode, lavo_decode_step, lavo_prefill, lavo_source
from .state import LavoDecodeState, LavoSource

__all__ = [
    "LavoDecodeState",
    "LavoSource",
    "lavo_attn",
    "lavo_cross_decode",
    "lavo_decode_step",
    "lavo_prefill",
    "lavo_source",
]
