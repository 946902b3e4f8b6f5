"""ROUGE against values worked out by hand, and the lead baseline."""

import pytest

from lavo_tasks.tasks.summarization.metrics import Rouge, lead


def values(rouge: Rouge) -> list[float]:
    return [float(v) for v in rouge.compute().values()]


# (reference, prediction, (ROUGE-1, ROUGE-2, ROUGE-L) F1 x 100, worked out by hand)
PAIRS = [
    # 5 of 6 unigrams; bigrams the-cat, on-the, the-mat of 5; LCS "the cat on the mat" = 5
    ("the cat sat on the mat", "the cat lay on the mat", (500 / 6, 60.0, 500 / 6)),
    # every unigram, no bigram, LCS 1 of 4
    ("a b c d", "d c b a", (100.0, 0.0, 25.0)),
    # R1: P 4/6, R 4/4 -> 0.8; R2: "the gunman", P 1/5, R 1/3 -> 0.25; LCS "the gunman": P 2/6, R 2/4 -> 0.4
    ("police killed the gunman", "the gunman was killed by police", (80.0, 25.0, 40.0)),
]


@pytest.mark.parametrize("reference, prediction, expected", PAIRS)
def test_rouge_of_one_pair(reference, prediction, expected):
    rouge = Rouge(stemming=False)
    rouge.update([prediction], [reference])
    assert values(rouge) == pytest.approx(expected, abs=1e-9)


def test_rouge_is_the_mean_over_examples():
    rouge = Rouge(stemming=False)
    rouge.update([p for _, p, _ in PAIRS[:2]], [r for r, _, _ in PAIRS[:2]])
    rouge.update([PAIRS[2][1]], [PAIRS[2][0]])
    means = [sum(e[i] for _, _, e in PAIRS) / 3 for i in range(3)]  # 87.78, 28.33, 49.44
    assert values(rouge) == pytest.approx(means, abs=1e-9)
    with pytest.raises(ValueError):
        Rouge(stemming=True).compute()


def test_stemming_case_and_punctuation():
    # tokens of more than 3 characters are stemmed: cats -> cat, running -> run; "were" and "was" differ
    reference, prediction = "The cats were running.", "the cat was run"
    unstemmed, stemmed = Rouge(stemming=False), Rouge(stemming=True)
    for rouge in (unstemmed, stemmed):
        rouge.update([prediction], [reference])
    assert float(unstemmed.compute()["rouge1"]) == pytest.approx(25.0)  # "the" of 4
    assert float(stemmed.compute()["rouge1"]) == pytest.approx(75.0)  # the, cat, run of 4
    exact = Rouge(stemming=False)
    exact.update(["the cat"], ["The Cat!"])
    assert values(exact) == pytest.approx([100.0] * 3)


def test_lead_takes_the_first_source_words_as_many_as_the_reference_has():
    assert lead("One two three. ||||| Four five six.", "a b c d") == "One two three. Four"
    assert lead("Short.", "a b c") == "Short."
