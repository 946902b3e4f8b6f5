"""ROUGE-1/2/L F1 (x 100, averaged over examples) with rouge-score, and the lead baseline.

rouge-score lowercases, keeps runs of letters and digits as tokens and, with
`use_stemmer`, Porter-stems tokens longer than 3 characters. ROUGE-L here is the
sentence-level LCS over the whole summary (`rougeL`, not the summary-level `rougeLsum`),
as CAB reports it; CAB used no stemming (`metrics.rouge_stemming=false`).

`Rouge` is a torchmetrics `Metric`: rouge-score scores each pair in the process that
holds it, and only the sums of the F1s and the count of pairs are added up over the
processes, so a test whose examples are shared among processes gets the mean of all.
"""

import torch
from rouge_score import rouge_scorer
from torchmetrics import Metric

from .formats import DOCUMENT_SEPARATOR

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


class Rouge(Metric):
    """Sums the F1 of each (prediction, reference) pair per ROUGE type (float64) and counts
    the pairs; `compute()` -> {type: mean F1 x 100 over every pair of every process}."""

    full_state_update = False  # update() only adds to the states

    def __init__(self, stemming: bool):
        super().__init__()
        self.scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=stemming)
        for name in ROUGE_TYPES:
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, predictions: list[str], references: list[str]) -> None:
        sums = dict.fromkeys(ROUGE_TYPES, 0.0)  # Python floats are float64
        for prediction, reference in zip(predictions, references, strict=True):
            scores = self.scorer.score(reference, prediction)  # rouge-score's order: (target, prediction)
            for name in ROUGE_TYPES:
                sums[name] += scores[name].fmeasure
        for name, total in sums.items():
            setattr(self, name, getattr(self, name) + total)
        self.count += len(predictions)

    def compute(self) -> dict[str, torch.Tensor]:
        """float64 scalars; ValueError when no process scored a pair."""
        if self.count == 0:
            raise ValueError("ROUGE of zero examples")
        return {name: 100 * getattr(self, name) / self.count for name in ROUGE_TYPES}


def lead(source: str, reference: str) -> str:
    """The lead baseline: the source's first sentences up to the reference's length, i.e.
    its first n whitespace-separated words (document separators skipped), n = the
    reference's word count."""
    words = [w for w in source.split() if w != DOCUMENT_SEPARATOR]
    return " ".join(words[: len(reference.split())])
