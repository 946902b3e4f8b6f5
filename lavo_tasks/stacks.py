"""The shared stacks every task builds its model from: `Encoder` and `Decoder`.

A stack is n_layers pre-norm layers (lavo_tasks.layers) and a final LayerNorm; each
attention site is an AttentionSpec: a block class or factory (functools.partial(
LavoAttention, rank=8)), or a site's config ({"name": "lavo", "rank": 8}). A bad
argument raises ValueError naming it (a config's key: ConfigError naming the key). Padding:
where `mask` (bool [B, T], True = a real position) marks padding, the output is 0, after
the final norm as after every layer. The Decoder decodes step by step: `init_state`
reads the memory once (each cross-attention block projects and summarises it there),
then each `step` feeds the positions that follow those already fed and returns their
outputs with the new state. The learned LAVO bases of a stack's blocks are evaluated
together, once per forward and init_state (attention.cayley.CayleyBases). States are
values: nested tuples of batch-first tensors (plus plain ints), never changed in place,
so `lavo_tasks.generation.reorder` serves beam search.
"""

from torch import Tensor, nn

from .attention import AttentionSpec
from .attention.base import is_int
from .attention.cayley import CayleyBases
from .layers import DecoderState, TransformerDecoderLayer, TransformerEncoderLayer, zero_padding


def check_n_layers(n_layers) -> None:
    if not is_int(n_layers) or n_layers < 1:
        raise ValueError(f"n_layers={n_layers!r}: must be an integer >= 1")


class Encoder(nn.Module):
    """n_layers pre-norm self-attention layers (noncausal unless causal=True) + a final LayerNorm."""

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, attention: AttentionSpec, d_ff: int,
                 dropout: float = 0.0, causal: bool = False):
        super().__init__()
        check_n_layers(n_layers)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, n_heads, attention, d_ff=d_ff, dropout=dropout, causal=causal)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.bases = CayleyBases(self)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x [B, T, D], mask bool [B, T] (True = real) or None -> [B, T, D]."""
        with self.bases():
            for layer in self.layers:
                x = layer(x, mask)
        return zero_padding(self.norm(x), mask)


class Decoder(nn.Module):
    """n_layers pre-norm layers: self-attention (causal unless causal=False), optional
    cross-attention over a memory (CC when cross_causal else NC), feed-forward; a final
    LayerNorm. Only a causal Decoder decodes step by step."""

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, self_attention: AttentionSpec,
                 cross_attention: AttentionSpec | None = None, d_ff: int, dropout: float = 0.0, causal: bool = True,
                 cross_causal: bool = False):
        super().__init__()
        check_n_layers(n_layers)
        self.causal = causal
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(d_model, n_heads, self_attention, cross_attention, d_ff=d_ff, dropout=dropout,
                                    causal=causal, cross_causal=cross_causal)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.bases = CayleyBases(self)

    def forward(self, x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        """The whole sequence at once (teacher forcing): x [B, T, D], memory [B, S, D] (a
        Decoder with cross-attention only), mask [B, T] / memory_mask [B, S] bool or None
        -> [B, T, D]."""
        with self.bases():
            for layer in self.layers:
                x, _ = layer(x, memory, mask, memory_mask)
        return zero_padding(self.norm(x), mask)

    def init_state(self, batch_size: int, memory: Tensor | None = None,
                   memory_mask: Tensor | None = None) -> tuple[DecoderState, ...]:
        """The state before the first decoded position, one DecoderState per layer; the
        memory [B, S, D] (and memory_mask [B, S]) is read here, once."""
        self._check_decodable()
        with self.bases():
            return tuple(layer.init_state(batch_size, memory, memory_mask) for layer in self.layers)

    def step(self, x: Tensor, state: tuple[DecoderState, ...]) -> tuple[Tensor, tuple[DecoderState, ...]]:
        """x [B, t, D]: the t >= 1 positions after those already fed -> (y [B, t, D], new
        state). `state` itself is left as it was."""
        self._check_decodable()
        if not isinstance(state, tuple) or len(state) != len(self.layers):
            raise ValueError(f"Decoder.step: state must be the tuple of {len(self.layers)} layer states "
                             "that init_state or step returned")
        new_state = []
        for layer, layer_state in zip(self.layers, state):
            x, layer_state = layer(x, state=layer_state)
            new_state.append(layer_state)
        return self.norm(x), tuple(new_state)

    def _check_decodable(self) -> None:
        if not self.causal:
            raise ValueError("Decoder(causal=False): noncausal self-attention sees later positions, so it cannot "
                             "be decoded step by step; run forward on the whole sequence")
