"""The recall models: the attention under test sits at the one site that must recall.

- `self` (data.variant=self): a decoder-only LM (pre-norm, n_layers) over the whole
  sequence; `model.attention` is its causal self-attention (CS).
- `cross` (data.variant=cross): the pairs z[:2N] are the source, read by an encoder
  (n_layers, noncausal softmax); the decoder (n_layers, causal softmax self-attention)
  reads the sequence with the pairs' positions blanked, so the value of a queried key can
  only come through `model.attention`, its cross-attention to the encoder (CC when
  model.cross_causal, else NC). Target position t is position t of the sequence: under
  CC, a query (after the pairs) reads the whole source.

Both read the tokens through one embedding that also serves as the output head, and
decode step by step through the attentions' states (`decode`), the path generation uses.
"""

import torch
from omegaconf import DictConfig
from torch import nn

from lavo_tasks.config import attention_defaults
from lavo_tasks.stacks import Decoder, Encoder

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
        sizes = dict(d_model=model.d_model, n_heads=model.n_heads, n_layers=model.n_layers, d_ff=model.d_ff)
        if self.cross:
            softmax = attention_defaults("softmax")
            self.encoder = Encoder(attention=softmax, **sizes)
            self.decoder = Decoder(self_attention=softmax, cross_attention=attention,
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

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embed.weight.T  # [B, T, D] -> [B, T, V]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: inputs [B, T] -> logits [B, T, V], every position at once."""
        source, tokens = self.split(inputs)
        x = self.embed(tokens)
        h = self.decoder(x, self.encoder(self.embed(source))) if self.cross else self.decoder(x)
        return self.head(h)

    def init_state(self, source: torch.Tensor | None, batch_size: int) -> tuple:
        """The decode state before the first token (the cross variant encodes the source here, once)."""
        if self.cross:
            return self.decoder.init_state(batch_size, self.encoder(self.embed(source)))
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
            h, state = self.decoder.step(self.embed(tokens[:, t : t + 1]), state)
            logits.append(self.head(h))
        return torch.cat(logits, dim=1)
