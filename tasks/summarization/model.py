"""The summarizer: a pre-norm Transformer encoder-decoder with shared embeddings.

    source tokens -> embed -> Encoder (noncausal self-attention, NS)          -> memory
    [end id] + target[:-1] -> embed -> Decoder (causal self, CS; cross to the memory,
                                       CC or NC) -> logits through the same embedding

One embedding table serves the source, the decoder input and the output head. There is
no absolute position embedding: the self-attentions carry position themselves (softmax
and local rotate q/k with RoPE, lavo has a relative bias, gsa its recurrence), so a
source longer than those seen in training is read the same way. Generation reads the
source once: `init_state` encodes it and hands the memory to the decoder's state, and
`step` feeds new tokens through the decode states (lavo and gsa keep self-attention
states of fixed size however long the summary grows).
"""

import torch
from omegaconf import DictConfig
from torch import nn

from lavo_tasks.stacks import Decoder, Encoder


class Summarizer(nn.Module):
    def __init__(self, vocab_size: int, *, d_model: int, n_heads: int, encoder_layers: int, decoder_layers: int,
                 d_ff: int, dropout: float, encoder_attention: DictConfig, decoder_attention: DictConfig,
                 cross_attention: DictConfig, cross_causal: bool):
        super().__init__()
        self.cross_causal = cross_causal
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's scale; the output head shares it
        self.drop = nn.Dropout(dropout)
        self.encoder = Encoder(d_model=d_model, n_heads=n_heads, n_layers=encoder_layers,
                               attention=encoder_attention, d_ff=d_ff, dropout=dropout)
        self.decoder = Decoder(d_model=d_model, n_heads=n_heads, n_layers=decoder_layers,
                               self_attention=decoder_attention, cross_attention=cross_attention, d_ff=d_ff,
                               dropout=dropout, cross_causal=cross_causal)

    def encode(self, source: torch.Tensor, source_mask: torch.Tensor | None = None) -> torch.Tensor:
        """source [B, S] -> memory [B, S, D] (0 at padded positions)."""
        return self.encoder(self.drop(self.embed(source)), source_mask)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embed.weight.T  # [B, T, D] -> [B, T, V]

    def forward(self, source: torch.Tensor, decoder_input: torch.Tensor, source_mask: torch.Tensor | None = None,
                target_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher forcing: source [B, S], decoder_input [B, T] -> logits [B, T, V]."""
        memory = self.encode(source, source_mask)
        h = self.decoder(self.drop(self.embed(decoder_input)), memory, target_mask, source_mask)
        return self.head(h)

    def init_state(self, source: torch.Tensor, source_mask: torch.Tensor | None = None,
                   positions: int | None = None) -> tuple:
        """The decode state before the first summary token: the source encoded, once.

        `positions`: how many target positions the decode will feed (prefix and generated
        tokens), if known. Causal cross-attention (CC) lets target position p read source
        positions <= p only, so the cross sites then keep the first `positions` source
        positions and the state no longer grows with the source; the encoder still reads
        all of it. Feeding more positions than that would read a shortened source, so pass
        the same number to `generate` as `max_positions`, which refuses a longer decode.
        Noncausal cross-attention reads the whole source whatever `positions`."""
        if positions is not None and (not isinstance(positions, int) or positions < 1):
            raise ValueError(f"positions={positions!r}: the target positions the decode feeds, an integer >= 1")
        memory = self.encode(source, source_mask)
        if positions is not None and self.cross_causal and positions < memory.shape[1]:
            memory = memory[:, :positions]  # [B, S, D] -> [B, positions, D]
            source_mask = None if source_mask is None else source_mask[:, :positions]
        return self.decoder.init_state(source.shape[0], memory, source_mask)

    def step(self, tokens: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """tokens [B, t] following those fed so far -> (logits [B, t, V], new state):
        the token step function of lavo_tasks.generation.generate."""
        h, state = self.decoder.step(self.embed(tokens), state)
        return self.head(h), state
