"""ROUGE-1/2/L F1 (x 100, averaged over examples) with rouge-score, and the lead baseline.

rouge-score lowercases, keeps runs of letters and digits as tokens and, with
`use_stemmer`, Porter-stems tokens longer than 3 characters. ROUGE-L here is the
sentence-level LCS over the whole summary (`rougeL`, not the summary-level `rougeLsum`),
as CAB reports it; CAB used no stemming (`metrics.rouge_stemming=false`).
"""

from rouge_score import rouge_scorer

from .data import DOCUMENT_SEPARATOR

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


class RougeAverage:
    """Sums the F1 of each (prediction, reference) pair; `compute()` -> {type: mean F1 x 100}."""

    def __init__(self, stemming: bool):
        self.scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=stemming)
        self.sums = dict.fromkeys(ROUGE_TYPES, 0.0)
        self.count = 0

    def update(self, predictions: list[str], references: list[str]) -> None:
        for prediction, reference in zip(predictions, references, strict=True):
            scores = self.scorer.score(reference, prediction)  # rouge-score's order: (target, prediction)
            for name in ROUGE_TYPES:
                self.sums[name] += scores[name].fmeasure
            self.count += 1

    def compute(self) -> dict[str, float]:
        if self.count == 0:
            raise ValueError("ROUGE of zero examples")
        return {name: 100 * total / self.count for name, total in self.sums.items()}


def lead(source: str, reference: str) -> str:
    """The lead baseline: the source's first sentences up to the reference's length, i.e.
    its first n whitespace-separated words (document separators skipped), n = the
    reference's word count."""
    words = [w for w in source.split() if w != DOCUMENT_SEPARATOR]
    return " ".join(words[: len(reference.split())])
