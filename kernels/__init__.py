"""LAVO and GSA attention as functions of `[batch, time, heads, dim]` tensors.

`backend="auto"` runs the Triton kernels on CUDA tensors and the chunked PyTorch path
otherwise (see `backend.resolve_backend`). The math is docs/design.md §2; the
slow token-loop references the tests compare against are in `lavo/reference.py` and
`gsa/reference.py`. Tasks never import the attention functions from here: they use
`lavo_tasks.attention`. (Point-cloud completion's geometry runs `nearest.py` and `fps.py`
directly.)
"""

from .backend import resolve_backend
from .gsa import GsaState, gsa_attn, gsa_decode_step
from .lavo import LavoDecodeState, lavo_attn, lavo_decode_step

__all__ = [
    "GsaState",
    "gsa_attn",
    "gsa_decode_step",
    "lavo_attn",
    "lavo_decode_step",
    "LavoDecodeState",
    "resolve_backend",
]
