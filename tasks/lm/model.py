"""The decoder-only language model (GPT-2 style, pre-norm) and its generation loop.

There is no absolute position embedding: the attentions carry position themselves
(softmax and local rotate q/k with RoPE, lavo has a relative bias, gsa its recurrence),
so the model runs on sequences longer than it was trained on.
"""

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from lavo_tasks.layers import TransformerDecoderLayer


class LanguageModel(nn.Module):
    def __init__(self, vocab_size: int, model: DictConfig, attention: DictConfig):
        """model: the `model.*` keys (d_model, n_layers, n_heads, d_ff, dropout);
        attention: the `attention.*` group every layer's self-attention is built from."""
        super().__init__()
        self.embed = nn.Embedding(vocab_size, model.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's scale; the head shares it
        self.drop = nn.Dropout(model.dropout)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(model.d_model, model.n_heads, attention, d_ff=model.d_ff, dropout=model.dropout)
            for _ in range(model.n_layers)
        )
        self.norm = nn.LayerNorm(model.d_model)

    def forward(self, tokens: torch.Tensor, states: list | None = None) -> tuple[torch.Tensor, list | None]:
        """tokens [B, T] -> logits [B, T, V]. With `states` (from init_state, or returned
        by the previous call) the tokens continue the sequences already fed and the new
        states are returned; without, the tokens are whole sequences (states None)."""
        x = self.drop(self.embed(tokens))
        new_states = None if states is None else []
        for i, layer in enumerate(self.layers):
            x, state = layer(x, state=None if states is None else states[i])
            if states is not None:
                new_states.append(state)
        return self.norm(x) @ self.embed.weight.T, new_states  # tied output head

    def init_state(self, batch_size: int) -> list:
        return [layer.init_state(batch_size) for layer in self.layers]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Continue prompt [B, P] by max_new_tokens tokens -> [B, max_new_tokens].

        The prompt goes through once (prefill) and each new token once, through the
        layers' decode states: lavo and gsa keep a state of fixed size however long the
        text grows. temperature 0 picks the most likely token; otherwise sampling from
        softmax(logits / temperature), restricted to the top_k most likely when top_k > 0,
        with `generator` (on the CPU) for reproducible draws.
        """
        states = self.init_state(prompt.shape[0])
        logits, states = self(prompt, states)
        new = []
        for i in range(max_new_tokens):
            token = self._pick(logits[:, -1], temperature, top_k, generator)  # [B, 1]
            new.append(token)
            if i + 1 < max_new_tokens:
                logits, states = self(token, states)
        return torch.cat(new, dim=1)

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, top_k: int, generator) -> torch.Tensor:
        """logits [B, V] -> next tokens [B, 1]."""
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits.float() / temperature
        if top_k > 0:
            kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1).cpu()
        return torch.multinomial(probs, 1, generator=generator).to(logits.device)
