"""The recall models: the attention under test sits at the one site that must recall.

- `self` (data.variant=self): a decoder-only LM (pre-norm, n_layers) over the whole
  sequence; `model.attention` is its causal self-attention (CS).
- `cross` (data.variant=cross): the pairs z[:2N] are the source, embedded (with the
  token shift below, so each value carries its key) and layer-normed, with no encoder
  layers; the decoder (n_layers, causal softmax self-attention) reads the sequence with
  the pairs' positions blanked, so the value of a queried key can only come through
  `model.attention`, its cross-attention to the source (CC when model.cross_causal, else
  NC). Target position t is position t of the sequence: under CC, a query (after the
  pairs) reads the whole source. No encoder, because a softmax encoder stack over the
  pairs kept even softmax cross-attention at ~0.34 test accuracy (guessing among the
  values not yet asked) after 1,000 steps, while the layer-normed embeddings are
  solved in 200 steps: the encoder's mixing hides the key-value binding that the
  cross-attention must match on (README, "Associative recall").

Both read the tokens through one embedding that also serves as the output head, and
decode step by step through the attentions' states (`decode`), the path generation uses.

With model.token_shift, each position also adds an embedding of the token before it (a
shift, as the short convolutions of Zoology's gated-convolution models and RWKV's token
shift do): a value then carries its key from the first layer on, so the runs measure
whether the attention can store and find the pairs, not how long a model takes to learn
a previous-token head (without it, a 2-layer softmax model must first learn one, which
takes longer than the default run: README, "Associative recall"). It adds d_model
numbers per sequence to the decode state, for the whole model.
"""

import torch
from omegaconf import DictConfig
from torch import nn

from lavo_tasks.config import attention_defaults
from lavo_tasks.stacks import Decoder

from .data import BLANK


class RecallModel(nn.Module):
    def __init__(self, vocab_size: int, num_kv_pairs: int, variant: str, model: DictConfig, attention: DictConfig):
        """model: the `model.*` keys (d_model, n_layers, n_heads, d_ff, cross_causal);
        attention: the config of the attention under test."""
        super().__init__()
        self.source_len = 2 * num_kv_pairs
        self.cross = variant == "cross"
        self.embed = nn.Embedding(vocab_size, model.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.shift = None
        if model.token_shift:
            self.shift = nn.Embedding(vocab_size, model.d_model)
            nn.init.normal_(self.shift.weight, std=0.02)
        sizes = dict(d_model=model.d_model, n_heads=model.n_heads, n_layers=model.n_layers, d_ff=model.d_ff)
        if self.cross:
            self.source_norm = nn.LayerNorm(model.d_model)
            self.decoder = Decoder(self_attention=attention_defaults("softmax"), cross_attention=attention,
                                   cross_causal=model.cross_causal, **sizes)
        else:
            self.decoder = Decoder(self_attention=attention, **sizes)

    def split(self, inputs: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """inputs [B, T] -> (source [B, 2N] or None, decoder tokens [B, T]): the cross
        variant moves the pairs to the source and leaves blanks in their place."""
        if not self.cross:
            return None, inputs
        target = inputs.clone()
        target[:, : self.source_len] = BLANK
        return inputs[:, : self.source_len], target

    def read(self, tokens: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, t] -> [B, t, D]: their embeddings, plus with token_shift those of the
        tokens one position earlier (`previous` [B, 1]: the token before tokens[:, 0];
        None at the start of a sequence, where nothing is added)."""
        x = self.embed(tokens)
        if self.shift is None:
            return x
        before = self.shift(tokens[:, :-1])  # [B, t - 1]: for positions 1.. of tokens
        first = self.shift(previous) if previous is not None else x.new_zeros(x.shape[0], 1, x.shape[2])
        return x + torch.cat([first, before], dim=1)

    def memory(self, source: torch.Tensor) -> torch.Tensor:
        """source [B, 2N] -> [B, 2N, D]: what the cross-attention reads; at a value's
        position, its embedding plus (token_shift) its key's."""
        return self.source_norm(self.read(source))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embed.weight.T  # [B, T, D] -> [B, T, V]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: inputs [B, T] -> logits [B, T, V], every position at once."""
        source, tokens = self.split(inputs)
        x = self.read(tokens)
        h = self.decoder(x, self.memory(source)) if self.cross else self.decoder(x)
        return self.head(h)

    def init_state(self, source: torch.Tensor | None, batch_size: int) -> tuple:
        """The decode state before the first token (the cross variant encodes the source here, once)."""
        if self.cross:
            return self.decoder.init_state(batch_size, self.memory(source))
        return self.decoder.init_state(batch_size)

    @torch.no_grad()
    def decode(self, inputs: torch.Tensor) -> torch.Tensor:
        """The decode path: inputs [B, T] fed one token at a time through the states ->
        logits [B, T, V]. Each prediction comes from the state left by the tokens before
        it; it must equal forward's."""
        source, tokens = self.split(inputs)
        state = self.init_state(source, tokens.shape[0])
        logits = []
        for t in range(tokens.shape[1]):
            x = self.read(tokens[:, t : t + 1], tokens[:, t - 1 : t] if t > 0 else None)
            h, state = self.decoder.step(x, state)
            logits.append(self.head(h))
        return torch.cat(logits, dim=1)
