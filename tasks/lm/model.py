"""The decoder-only language model (GPT-2 style, pre-norm): an embedding, the shared
Decoder stack (causal self-attention, no cross-attention) and a head tied to the
embedding; generation through lavo_tasks.generation.

There is no absolute position embedding: the attentions carry position themselves
(softmax and local rotate q/k with RoPE, lavo has a relative bias, gsa its recurrence),
so the model runs on sequences longer than it was trained on.
"""

import torch
from omegaconf import DictConfig
from torch import nn

from lavo_tasks.generation import generate
from lavo_tasks.stacks import Decoder


class LanguageModel(nn.Module):
    def __init__(self, vocab_size: int, model: DictConfig, attention: DictConfig):
        """model: the `model.*` keys (d_model, n_layers, n_heads, d_ff, dropout);
        attention: the `attention.*` group every layer's self-attention is built from."""
        super().__init__()
        self.embed = nn.Embedding(vocab_size, model.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's scale; the head shares it
        self.drop = nn.Dropout(model.dropout)
        self.decoder = Decoder(d_model=model.d_model, n_heads=model.n_heads, n_layers=model.n_layers,
                               self_attention=attention, d_ff=model.d_ff, dropout=model.dropout)

    def forward(self, tokens: torch.Tensor, states: tuple | None = None) -> tuple[torch.Tensor, tuple | None]:
        """tokens [B, T] -> logits [B, T, V]. With `states` (from init_state, or returned
        by the previous call) the tokens continue the sequences already fed and the new
        states are returned; without, the tokens are whole sequences (states None)."""
        x = self.drop(self.embed(tokens))
        if states is None:
            h = self.decoder(x)
        else:
            h, states = self.decoder.step(x, states)
        return h @ self.embed.weight.T, states  # tied output head

    def init_state(self, batch_size: int) -> tuple:
        return self.decoder.init_state(batch_size)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0,
                 generator: torch.Generator | None = None, **options) -> torch.Tensor:
        """Continue prompt [B, P] by max_new_tokens tokens -> [B, max_new_tokens].

        The prompt goes through once (prefill) and each new token once, through the
        decoder's states: lavo and gsa keep a state of fixed size however long the text
        grows. temperature 0 picks the most likely token; otherwise sampling from
        softmax(logits / temperature), restricted to the top_k most likely when top_k > 0,
        with `generator` for reproducible draws. `options`: the other arguments of
        lavo_tasks.generation.generate (top_p, beam, no_repeat_ngram, eos_id, ...); with
        an eos_id a row may end early and the result is padded with pad_id.
        """
        # The eager forward, not the module's call: under trainer.compile that call is the
        # compiled model, whose CUDA graphs (reduce-overhead) would record a graph for each
        # prompt length and write over the outputs a decode state still holds;
        # generation captures the one-token step in a CUDA graph of its own.
        out = generate(self.forward, self.init_state(prompt.shape[0]), prompt, max_len=max_new_tokens,
                       temperature=temperature, top_k=top_k, generator=generator, **options)
        return out.tokens
