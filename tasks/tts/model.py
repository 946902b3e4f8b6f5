"""Transformer-TTS (Li et al., 2019) on the shared stacks.

    text:    symbols -> Embedding -> 3 x [Conv1d(k=5) -> BatchNorm -> ReLU -> Dropout] -> Linear
             + alpha_text * sinusoidal positions (at rate rho) -> Encoder (NS)
    decoder: each step reads the last mel frame of the step before (zeros at the start)
             -> prenet (2 x [Linear -> ReLU -> Dropout 0.5]) -> Linear
             + alpha_mel * sinusoidal positions -> Decoder (CS self, CC or NC cross)
    heads:   Linear -> r = n_frames_per_step mel frames per step; Linear -> a stop logit per step
    postnet: 5 x Conv1d(k=5) with BatchNorm (tanh between them), added to the frames

Text position p is encoded as the decoder step rho * p, rho = the training data's
decoder steps per text symbol (Deep Voice 3's position rate): a text position and the
decoder step that speaks it get similar sinusoids, so the cross-attention can find the
near-diagonal alignment by position alone, with any attention.

The mel prenet's dropout stays on at inference, as in Tacotron 2 and Transformer-TTS: it
is the only noise the autoregressive loop has, and without it the decoder copies its
input. Frames are in the data module's normalised units (per-band z-scores). Padding:
convolutions see zeros where a mask marks padding, so a padded batch gives each
utterance the same outputs as the utterance alone (up to BatchNorm's batch statistics in
training).
"""

import math

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from ...stacks import Decoder, Encoder
from .text import PAD

CONV_KERNEL = 5
TEXT_CONV_LAYERS = 3
POSTNET_LAYERS = 5
PRENET_DROPOUT = 0.5


def sinusoids(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """positions [...] (any numbers) -> [..., d_model]: sin on the first half of the
    features, cos on the second, frequencies 1 / 10000^(2i / d_model)."""
    half = d_model // 2
    frequency = torch.exp(torch.arange(half, device=positions.device) * (-math.log(10000.0) * 2 / d_model))
    angle = positions.float()[..., None] * frequency  # [..., half]
    table = torch.cat([angle.sin(), angle.cos()], dim=-1)
    return F.pad(table, (0, d_model - 2 * half))  # an odd width gets a zero last feature


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x [B, C, T] with padded time steps (mask [B, T] False) set to 0."""
    return x if mask is None else x * mask[:, None, :]


class ConvStack(nn.Module):
    """n x [Conv1d(k=5, same length) -> BatchNorm -> activation -> Dropout] over [B, C, T];
    the last layer has no activation when `last_linear`."""

    def __init__(self, channels: list[int], activation: nn.Module, dropout: float, last_linear: bool):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(a, b, CONV_KERNEL, padding=CONV_KERNEL // 2)
                                   for a, b in zip(channels[:-1], channels[1:]))
        self.norms = nn.ModuleList(nn.BatchNorm1d(b) for b in channels[1:])
        self.activation, self.last_linear = activation, last_linear
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            x = norm(conv(_masked(x, mask)))
            if not (self.last_linear and i == len(self.convs) - 1):
                x = self.activation(x)
            x = self.drop(x)
        return _masked(x, mask)


class MelPrenet(nn.Module):
    """frames [..., n_mels] -> [..., d_model]; dropout `p` in training and inference alike."""

    def __init__(self, n_mels: int, hidden: int, d_model: int, p: float = PRENET_DROPOUT):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(n_mels, hidden), nn.Linear(hidden, hidden)])
        self.project = nn.Linear(hidden, d_model)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.dropout(F.relu(layer(x)), self.p, training=True)
        return self.project(x)


class TransformerTTS(nn.Module):
    def __init__(self, n_symbols: int, n_mels: int, *, d_model: int, n_heads: int, encoder_layers: int,
                 decoder_layers: int, d_ff: int, dropout: float, conv_channels: int, prenet_dim: int,
                 n_frames_per_step: int, encoder_attention: DictConfig, decoder_attention: DictConfig,
                 cross_attention: DictConfig, cross_causal: bool, text_position_rate: float = 1.0,
                 prenet_dropout: float = PRENET_DROPOUT):
        super().__init__()
        self.n_mels, self.r, self.d_model = n_mels, n_frames_per_step, d_model
        self.text_position_rate = text_position_rate
        self.embedding = nn.Embedding(n_symbols, conv_channels, padding_idx=PAD)
        self.text_prenet = ConvStack([conv_channels] * (TEXT_CONV_LAYERS + 1), nn.ReLU(), dropout, last_linear=False)
        self.text_project = nn.Linear(conv_channels, d_model)
        self.text_alpha = nn.Parameter(torch.ones(()))
        self.encoder = Encoder(d_model=d_model, n_heads=n_heads, n_layers=encoder_layers,
                               attention=encoder_attention, d_ff=d_ff, dropout=dropout)
        self.mel_prenet = MelPrenet(n_mels, prenet_dim, d_model, prenet_dropout)
        self.mel_alpha = nn.Parameter(torch.ones(()))
        self.decoder = Decoder(d_model=d_model, n_heads=n_heads, n_layers=decoder_layers,
                               self_attention=decoder_attention, cross_attention=cross_attention, d_ff=d_ff,
                               dropout=dropout, cross_causal=cross_causal)
        self.mel_head = nn.Linear(d_model, n_mels * n_frames_per_step)
        self.stop_head = nn.Linear(d_model, 1)
        self.postnet = ConvStack([n_mels] + [conv_channels] * (POSTNET_LAYERS - 1) + [n_mels], nn.Tanh(), dropout,
                                 last_linear=True)

    def encode(self, tokens: torch.Tensor, token_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, L], token_lengths [B] -> (memory [B, L, D], mask [B, L])."""
        mask = torch.arange(tokens.shape[1], device=tokens.device) < token_lengths[:, None]
        h = self.text_prenet(self.embedding(tokens).transpose(1, 2), mask)  # [B, L, C] -> [B, C, L]
        h = self.text_project(h.transpose(1, 2))  # [B, L, D]
        positions = torch.arange(tokens.shape[1], device=tokens.device) * self.text_position_rate
        h = h + self.text_alpha * sinusoids(positions, self.d_model)
        return self.encoder(h, mask), mask

    def decoder_inputs(self, mels: torch.Tensor) -> torch.Tensor:
        """mels [B, N * r, n_mels] -> the frame each step reads [B, N, n_mels]: zeros,
        then the last frame of each step but the final one."""
        last = mels[:, self.r - 1::self.r]  # [B, N, n_mels]
        return torch.cat([torch.zeros_like(last[:, :1]), last[:, :-1]], dim=1)

    def embed_frames(self, frames: torch.Tensor, first_position: int | torch.Tensor) -> torch.Tensor:
        """frames [B, t, n_mels] read at steps first_position .. + t - 1 -> [B, t, D];
        first_position an int or a 0-dim tensor (a captured decode step's)."""
        positions = first_position + torch.arange(frames.shape[1], device=frames.device)
        return self.mel_prenet(frames) + self.mel_alpha * sinusoids(positions, self.d_model)

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """decoder outputs [B, t, D] -> (frames [B, t, r * n_mels], stop logits [B, t])."""
        return self.mel_head(h), self.stop_head(h)[..., 0]

    def refine(self, frames: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """frames [B, T, n_mels] + postnet(frames); mask [B, T] marks the real frames."""
        return frames + self.postnet(frames.transpose(1, 2), mask).transpose(1, 2)

    def forward(self, tokens: torch.Tensor, token_lengths: torch.Tensor, mels: torch.Tensor,
                step_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher forcing. mels [B, N * r, n_mels] (padded to whole steps), step_lengths
        [B] (real steps). Returns (frames before the postnet, after it, both
        [B, N * r, n_mels]; stop logits [B, N])."""
        memory, memory_mask = self.encode(tokens, token_lengths)
        n_steps = mels.shape[1] // self.r
        step_mask = torch.arange(n_steps, device=mels.device) < step_lengths[:, None]  # [B, N]
        h = self.decoder(self.embed_frames(self.decoder_inputs(mels), 0), memory, step_mask, memory_mask)
        frames, stop = self.heads(h)
        before = frames.reshape(mels.shape)  # [B, N, r * n_mels] -> [B, N * r, n_mels]
        frame_mask = step_mask.repeat_interleave(self.r, dim=1)  # [B, N * r]
        return before, self.refine(before, frame_mask), stop

    def init_state(self, tokens: torch.Tensor, token_lengths: torch.Tensor) -> tuple:
        """The decode state before the first step: (steps fed, the decoder's state); the
        encoder runs here, once."""
        memory, memory_mask = self.encode(tokens, token_lengths)
        return 0, self.decoder.init_state(tokens.shape[0], memory, memory_mask)

    def step(self, x: torch.Tensor, state: tuple) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """`lavo_tasks.generation`'s frame step: x [B, 1, n_mels] the last frame so far ->
        (the next r frames [B, 1, r * n_mels], stop logit [B, 1], new state)."""
        position, decoder_state = state
        h, decoder_state = self.decoder.step(self.embed_frames(x, position), decoder_state)
        frames, stop = self.heads(h)
        return frames, stop, (position + x.shape[1], decoder_state)

    def last_frame(self, frames: torch.Tensor) -> torch.Tensor:
        """A step's output [B, 1, r * n_mels] -> the frame the next step reads [B, 1, n_mels]."""
        return frames[..., -self.n_mels:]
