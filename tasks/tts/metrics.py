"""MCD and MSD as fairseq's `examples/speech_synthesis/evaluation/eval_sp.py` computes
them for CAB's text-to-speech results.

For each (reference, synthesised) pair of waveforms:

- features, both from a power mel spectrogram of 80 bands (torchaudio's defaults: HTK
  mel scale, no filter normalisation, up to half the sample rate) with a Hann window and
  FFT of 0.05 s and a hop of 0.0125 s, from 20 Hz, taken as log(mel + 1e-6):
  MCD: 13 MFCCs of it (orthonormal DCT-II, c0 kept); MSD: the 80 log-mels themselves;
- frame distance sqrt(||x - y||^2 / D), D = 13 or 80: an RMS difference, no dB scale;
- the cost of the cheapest unconstrained DTW path from the first pair of frames to the
  last (steps right, down, diagonal; every cell on the path counted once).

The corpus score is the sum of the path costs over the utterances divided by the total
number of reference frames: the distortion per reference frame, as eval_sp reports it
beside the length ratio. Every synthesised frame lies on the path, so frames an output
adds beyond what the reference needs add to the cost while the divisor stays fixed: an
output that never stops scores worse than one that stops (dividing by the synthesised
frames instead would reward it). The task reports the length ratio (`test_length_ratio`)
beside the score, so a reader sees how long the output ran.
"""

import numpy as np
import torch
import torchaudio

from ...metrics import SumRatio

WINDOW_S, HOP_S = 0.05, 0.0125
N_MELS, N_MFCC, F_MIN = 80, 13, 20.0
LOG_OFFSET = 1e-6
ROW_BLOCK = 64


def dtw_cost(distance: np.ndarray) -> float:
    """The cost of the cheapest monotonic path through `distance` [m, n] from (0, 0) to
    (m-1, n-1), moving by (0, 1), (1, 0) or (1, 1). Filled one anti-diagonal at a time
    (O(m + n) vector steps), in float64."""
    distance = np.asarray(distance, dtype=np.float64)
    m, n = distance.shape
    cost = np.empty((m, n))
    cost[0, :] = np.cumsum(distance[0, :])
    cost[:, 0] = np.cumsum(distance[:, 0])
    for k in range(2, m + n - 1):  # cells i + j = k with i, j >= 1
        i = np.arange(max(1, k - n + 1), min(m - 1, k - 1) + 1)
        j = k - i
        best = np.minimum(np.minimum(cost[i, j - 1], cost[i - 1, j - 1]), cost[i - 1, j])
        cost[i, j] = distance[i, j] + best
    return float(cost[-1, -1])


def rms_distance(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x [m, D], y [n, D] -> [m, n]: sqrt(||x_i - y_j||^2 / D), from the differences
    themselves (equal frames give exactly 0), ROW_BLOCK rows of x at a time."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    out = np.empty((len(x), len(y)))
    for start in range(0, len(x), ROW_BLOCK):
        difference = x[start:start + ROW_BLOCK, None, :] - y[None, :, :]  # [rows, n, D]
        out[start:start + ROW_BLOCK] = np.sqrt((difference * difference).mean(-1))
    return out


class DistortionFeatures(torch.nn.Module):
    """waveform [samples] -> (MFCC [frames, 13], log-mel [frames, 80]) as eval_sp takes them."""

    def __init__(self, sample_rate: int):
        super().__init__()
        n_fft = int(WINDOW_S * sample_rate)
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate, n_fft=n_fft, win_length=n_fft, hop_length=int(HOP_S * sample_rate), f_min=F_MIN,
            n_mels=N_MELS, window_fn=torch.hann_window,
        )
        self.register_buffer("dct", torchaudio.functional.create_dct(N_MFCC, N_MELS, norm="ortho"))  # [80, 13]

    @torch.no_grad()
    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 features whatever autocast the caller runs under (bf16-mixed on a GPU
        would otherwise round the DCT's product, and numpy has no bfloat16)."""
        with torch.autocast(audio.device.type, enabled=False):
            log_mel = torch.log(self.mel(audio.float()) + LOG_OFFSET).T  # [80, frames] -> [frames, 80]
            return log_mel @ self.dct, log_mel


class CorpusDistortion(torch.nn.Module):
    """Accumulates MCD and MSD over utterances: `update(reference, synthesised)` with
    waveforms [samples]; `compute()` -> {"mcd", "msd"} (see the module docstring).

    Each score is a `lavo_tasks.metrics.SumRatio` (summed DTW costs / reference frames,
    float64): `compute()` adds the sums up over the processes, so each may score its own
    share of the test split. It is a collective call: every process makes it. The features
    are computed where the audio is; the DTW runs on the CPU.
    """

    def __init__(self, sample_rate: int):
        super().__init__()
        self.features = DistortionFeatures(sample_rate)
        self.scores = torch.nn.ModuleDict({"mcd": SumRatio(), "msd": SumRatio()})

    def reset(self) -> None:
        for metric in self.scores.values():
            metric.reset()

    def update(self, reference: torch.Tensor, synthesised: torch.Tensor) -> None:
        """Adds one utterance: reference and synthesised waveforms [samples]."""
        reference_features, synthesised_features = self.features(reference), self.features(synthesised)
        for name, ref, syn in zip(("mcd", "msd"), reference_features, synthesised_features):
            self.add_features(name, ref.cpu().numpy(), syn.cpu().numpy())

    def add_features(self, name: str, reference: np.ndarray, synthesised: np.ndarray) -> None:
        """Adds one utterance's features, reference [m, D] and synthesised [n, D], to the
        score `name` ("mcd" or "msd"): its DTW cost over the reference's m frames."""
        self.scores[name].update(dtw_cost(rms_distance(reference, synthesised)), len(reference))

    def compute(self) -> dict[str, float]:
        """ValueError when no utterance was added on any process."""
        return {name: float(metric.compute()) for name, metric in self.scores.items()}
