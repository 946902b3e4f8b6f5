"""The library's building blocks in one import, for models of your own (no run config):

    from lavo_tasks.nn import LavoAttention, Decoder

- attention blocks: `SoftmaxAttention`, `LocalAttention`, `LavoAttention`,
  `GatedSlotAttention` (the interface: lavo_tasks.attention's docstring), built from
  keyword arguments; a bad one raises ValueError naming it;
- `build_attention(spec, d_model, n_heads, causal=, cross=)`: a block from a mapping
  `{"name": "lavo", "rank": 8}` (a dict or a DictConfig; its errors name the keys);
- pre-norm layers `TransformerEncoderLayer`, `TransformerDecoderLayer` and the stacks
  `Encoder`, `Decoder` (with a final LayerNorm; `Decoder.init_state` / `Decoder.step`
  decode step by step). Their attention arguments take a block class, a factory such as
  `functools.partial(LavoAttention, rank=8)`, or a mapping as build_attention does.
"""

from .attention import AttentionBlock, build_attention
from .attention.gsa import GatedSlotAttention
from .attention.lavo import LavoAttention
from .attention.local import LocalAttention
from .attention.softmax import SoftmaxAttention
from .layers import TransformerDecoderLayer, TransformerEncoderLayer
from .stacks import Decoder, Encoder

__all__ = [
    "AttentionBlock", "Decoder", "Encoder", "GatedSlotAttention", "LavoAttention", "LocalAttention", "SoftmaxAttention",
    "TransformerDecoderLayer", "TransformerEncoderLayer", "build_attention",
]
