"""Audio in and out: reading wavs, the model's log-mel features, Griffin-Lim back to audio.

Features (Transformer-TTS / fairseq's LJSpeech recipe): the magnitude STFT (n_fft 1024,
Hann window of 1024, hop 256) through an 80-band Slaney mel filter bank from 20 to
8,000 Hz, then the natural log with magnitudes clamped at 1e-5. Griffin-Lim inverts it:
exp, the least-squares inverse of the filter bank (torchaudio's InverseMelScale, clipped at
0), then 32 Griffin-Lim iterations with momentum 0.99 from a zero phase (so the same mel
gives the same audio every time).
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio

from ...errors import DataError

SAMPLE_RATE = 22_050
LOG_FLOOR = 1e-5
GRIFFIN_LIM_ITERATIONS = 32
GRIFFIN_LIM_MOMENTUM = 0.99


@dataclass(frozen=True)
class MelConfig:
    sample_rate: int = SAMPLE_RATE
    n_fft: int = 1024
    hop_length: int = 256
    n_mels: int = 80
    f_min: float = 20.0
    f_max: float = 8000.0


def read_wav(path: Path, sample_rate: int) -> torch.Tensor:
    """float32 [samples] in [-1, 1] at `sample_rate` (resampled with torchaudio when the
    file's rate differs); DataError naming the file when it cannot be read, is empty or
    has more than one channel."""
    try:
        samples, rate = sf.read(path, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as err:
        raise DataError(f"{path}: not a readable audio file ({' '.join(str(err).split())})") from None
    if samples.shape[1] != 1:
        raise DataError(f"{path}: {samples.shape[1]} channels; the TTS data must be mono")
    if len(samples) == 0:
        raise DataError(f"{path}: no audio samples")
    audio = torch.from_numpy(np.ascontiguousarray(samples[:, 0]))
    if rate != sample_rate:
        audio = torchaudio.functional.resample(audio, rate, sample_rate)
    return audio


class LogMel(torch.nn.Module):
    """audio [..., samples] -> log-mel [..., frames, n_mels] (frames = samples // hop + 1)."""

    def __init__(self, config: MelConfig = MelConfig()):
        super().__init__()
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=config.sample_rate, n_fft=config.n_fft, win_length=config.n_fft,
            hop_length=config.hop_length, f_min=config.f_min, f_max=config.f_max, n_mels=config.n_mels,
            power=1.0, norm="slaney", mel_scale="slaney",
        )

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.mel(audio).clamp(min=LOG_FLOOR).log().transpose(-1, -2)


class GriffinLim(torch.nn.Module):
    """log-mel [frames, n_mels] -> audio [samples] (see the module docstring)."""

    def __init__(self, config: MelConfig = MelConfig()):
        super().__init__()
        self.inverse_mel = torchaudio.transforms.InverseMelScale(
            n_stft=config.n_fft // 2 + 1, n_mels=config.n_mels, sample_rate=config.sample_rate,
            f_min=config.f_min, f_max=config.f_max, norm="slaney", mel_scale="slaney",
        )
        self.griffin_lim = torchaudio.transforms.GriffinLim(
            n_fft=config.n_fft, win_length=config.n_fft, hop_length=config.hop_length, power=1.0,
            n_iter=GRIFFIN_LIM_ITERATIONS, momentum=GRIFFIN_LIM_MOMENTUM, rand_init=False,
        )

    @torch.no_grad()
    def forward(self, log_mel: torch.Tensor) -> torch.Tensor:
        magnitude = self.inverse_mel(log_mel.float().exp().T)  # [n_mels, frames] -> [n_fft // 2 + 1, frames]
        return self.griffin_lim(magnitude).clamp(-1.0, 1.0)


def write_wav(path: Path, audio: torch.Tensor, sample_rate: int) -> None:
    """16-bit PCM mono."""
    sf.write(path, audio.detach().cpu().numpy(), sample_rate, subtype="PCM_16")
