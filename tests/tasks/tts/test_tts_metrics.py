"""MCD / MSD pieces against hand-computed values and an exhaustive DTW over every path."""

import itertools

import numpy as np
import pytest
import torch
import torchaudio

from lavo_tasks.tasks.tts.metrics import CorpusDistortion, DistortionFeatures, dtw_cost, rms_distance

RATE = 22_050


def every_path_cost(distance: np.ndarray) -> float:
    """The cheapest of all monotone paths (0, 0) -> (m-1, n-1), listed one by one."""
    m, n = distance.shape
    best = np.inf
    # A path is a sequence of moves: right (0, 1), down (1, 0), diagonal (1, 1).
    for length in range(max(m, n) - 1, m + n - 1):
        for moves in itertools.product(((0, 1), (1, 0), (1, 1)), repeat=length):
            i = j = 0
            cost = distance[0, 0]
            for di, dj in moves:
                i, j = i + di, j + dj
                if i >= m or j >= n:
                    break
                cost += distance[i, j]
            else:
                if (i, j) == (m - 1, n - 1):
                    best = min(best, cost)
    return best


def test_dtw_by_hand():
    # Right-then-down 1 + 2 + 4 = 7, down-then-right 1 + 3 + 4 = 8, diagonal 1 + 4 = 5.
    assert dtw_cost(np.array([[1.0, 2.0], [3.0, 4.0]])) == 5.0
    # One row: every cell is on the only path.
    assert dtw_cost(np.array([[1.0, 2.0, 3.0]])) == 6.0
    # [[0, 5, 5], [5, 0, 0]]: (0,0) -> (1,1) -> (1,2) costs 0.
    assert dtw_cost(np.array([[0.0, 5.0, 5.0], [5.0, 0.0, 0.0]])) == 0.0
    # [[1, 9, 9], [1, 9, 9], [9, 1, 1]]: down, diagonal, right = 1 + 1 + 1 + 1.
    assert dtw_cost(np.array([[1.0, 9, 9], [1, 9, 9], [9, 1, 1]])) == 4.0


@pytest.mark.parametrize("shape", [(3, 4), (4, 3), (4, 4), (2, 5), (1, 4)])
def test_dtw_is_the_cheapest_of_every_path(shape):
    distance = np.random.default_rng(sum(shape)).uniform(size=shape)
    assert dtw_cost(distance) == pytest.approx(every_path_cost(distance), abs=1e-12)
    assert dtw_cost(distance.T) == pytest.approx(dtw_cost(distance), abs=1e-12)  # symmetric in its arguments


def test_rms_distance_by_hand():
    x = np.array([[0.0, 0.0], [1.0, 1.0]])
    y = np.array([[3.0, 4.0]])
    expected = np.array([[np.sqrt(25 / 2)], [np.sqrt((4 + 9) / 2)]])
    np.testing.assert_allclose(rms_distance(x, y), expected, rtol=1e-12)


def test_features_are_fairseqs():
    audio = torch.randn(RATE // 2)
    mfcc, log_mel = DistortionFeatures(RATE)(audio)
    melkwargs = {"n_fft": 1102, "win_length": 1102, "hop_length": 275, "f_min": 20, "n_mels": 80,
                 "window_fn": torch.hann_window}
    expected_mfcc = torchaudio.transforms.MFCC(RATE, n_mfcc=13, log_mels=True, melkwargs=melkwargs)(audio).T
    expected_mel = torch.log(torchaudio.transforms.MelSpectrogram(RATE, **melkwargs)(audio) + 1e-6).T
    torch.testing.assert_close(mfcc, expected_mfcc, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(log_mel, expected_mel)
    assert mfcc.shape == (RATE // 2 // 275 + 1, 13)


def test_features_stay_float32_under_bf16_autocast():
    # a GPU run tests under bf16-mixed; the features must come out as outside autocast
    audio = torch.randn(RATE // 2)
    plain = DistortionFeatures(RATE)(audio)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = DistortionFeatures(RATE)(audio)
    for a, b in zip(plain, mixed):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a)


def noise(seconds: float, seed: int) -> torch.Tensor:
    return 0.1 * torch.randn(int(seconds * RATE), generator=torch.Generator().manual_seed(seed))


def test_identical_audio_scores_zero():
    scores = CorpusDistortion(RATE)
    scores.update(noise(0.3, 0), noise(0.3, 0))
    assert scores.compute() == {"mcd": 0.0, "msd": 0.0}


def test_equal_lengths_are_symmetric():
    a, b = noise(0.3, 1), noise(0.3, 2) * 3
    forward, backward = CorpusDistortion(RATE), CorpusDistortion(RATE)
    forward.update(a, b)
    backward.update(b, a)
    assert forward.compute()["mcd"] > 0
    for key in ("mcd", "msd"):
        assert forward.compute()[key] == pytest.approx(backward.compute()[key], rel=1e-9)


def test_corpus_score_is_total_cost_over_reference_frames():
    pairs = [(noise(0.2, 3), noise(0.35, 4)), (noise(0.4, 5), noise(0.1, 6))]
    features = DistortionFeatures(RATE)
    costs, frames = 0.0, 0
    for ref, syn in pairs:
        (ref_mfcc, _), (syn_mfcc, _) = features(ref), features(syn)
        distance = torch.cdist(ref_mfcc.double(), syn_mfcc.double()) / np.sqrt(13)  # sqrt(||x - y||^2 / D)
        costs += every_path_cost(distance.numpy()) if distance.numel() <= 12 else dtw_cost(distance.numpy())
        frames += len(ref_mfcc)
    scores = CorpusDistortion(RATE)
    for ref, syn in pairs:
        scores.update(ref, syn)
    assert scores.compute()["mcd"] == pytest.approx(costs / frames, rel=1e-9)
    per_utterance = []
    for ref, syn in pairs:
        one = CorpusDistortion(RATE)
        one.update(ref, syn)
        per_utterance.append(one.compute()["mcd"])
    assert scores.compute()["mcd"] != pytest.approx(np.mean(per_utterance))  # not a mean of utterance scores


def test_score_by_hand_is_per_reference_frame():
    # D = 1, so the frame distance is |x - y|: every cell of [[1, 1, 1], [1, 1, 1]] is 1, and
    # the cheapest path (0,0) -> (1,1) -> (1,2) visits 3 cells: cost 3 over 2 reference frames.
    scores = CorpusDistortion(RATE)
    scores.add_features("mcd", np.array([[0.0], [2.0]]), np.array([[1.0], [1.0], [1.0]]))
    assert float(scores.scores["mcd"].compute()) == 1.5


def test_a_never_stopping_output_scores_worse_than_the_stopping_one():
    reference = noise(0.5, 7)
    stopping = noise(0.5, 8)  # as long as the reference
    never_stopping = torch.cat([stopping, noise(2.0, 9)])  # the same frames, then more up to a cap
    scores = {}
    for name, synthesised in (("stopping", stopping), ("never", never_stopping)):
        metric = CorpusDistortion(RATE)
        metric.update(reference, synthesised)
        scores[name] = metric.compute()
    for key in ("mcd", "msd"):
        assert scores["never"][key] > 1.5 * scores["stopping"][key]

    # The case tells the normalisations apart: per synthesised frame, the longer output
    # would have scored better.
    features = DistortionFeatures(RATE)
    ref_mfcc = features(reference)[0].double().numpy()
    per_synthesised_frame = {}
    for name, synthesised in (("stopping", stopping), ("never", never_stopping)):
        syn_mfcc = features(synthesised)[0].double().numpy()
        per_synthesised_frame[name] = dtw_cost(rms_distance(ref_mfcc, syn_mfcc)) / len(syn_mfcc)
    assert per_synthesised_frame["never"] < per_synthesised_frame["stopping"]
