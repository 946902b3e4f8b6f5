"""Perplexity: exp of the mean negative log-likelihood per token over a whole split."""

import math

import torch


class Perplexity:
    """Sums NLL and counts tokens across batches, so every token weighs the same however
    the tokens fall into batches (a mean of per-batch perplexities would not)."""

    def __init__(self):
        self.nll_sum = 0.0
        self.n_tokens = 0

    def update(self, nll: torch.Tensor) -> None:
        """nll: the per-token negative log-likelihoods (natural log) of one batch, any shape."""
        self.nll_sum += float(nll.detach().double().sum())
        self.n_tokens += nll.numel()

    def mean_nll(self) -> float:
        if self.n_tokens == 0:
            raise ValueError("perplexity of zero tokens")
        return self.nll_sum / self.n_tokens

    def compute(self) -> float:
        return math.exp(self.mean_nll())
