"""Transformer-TTS: decoding step by step through generate_frames gives the frames and
stop logits of teacher forcing on the same frames, for every attention; the loss by hand."""

import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.generation import generate_frames
from lavo_tasks.tasks.tts.model import TransformerTTS, sinusoids

N_MELS = 8
ATTENTIONS = {
    "softmax": {"name": "softmax"},
    "lavo": {"name": "lavo", "window": 4, "rank": 4, "basis": "learned", "cross_segments": 1, "backend": "torch"},
    "gsa": {"name": "gsa", "slots": 4, "tau": 8.0, "backend": "torch"},
    "local": {"name": "local", "window": 4},
}


def tiny_model(name: str, cross_causal: bool = True) -> TransformerTTS:
    attention = OmegaConf.create(ATTENTIONS[name])
    cross = attention if name != "local" else OmegaConf.create(ATTENTIONS["softmax"])  # local has no cross pattern
    torch.manual_seed(0)
    model = TransformerTTS(12, N_MELS, d_model=16, n_heads=2, encoder_layers=1, decoder_layers=2, d_ff=32,
                           dropout=0.0, conv_channels=16, prenet_dim=16, n_frames_per_step=3,
                           encoder_attention=attention, decoder_attention=attention, cross_attention=cross,
                           cross_causal=cross_causal, prenet_dropout=0.0)
    return model.eval()


# local's cross site is softmax (local has no cross pattern), so its NC case is softmax's.
CASES = [(name, True) for name in ATTENTIONS] + [(name, False) for name in ("softmax", "lavo", "gsa")]


@pytest.mark.parametrize("name, cross_causal", CASES, ids=[f"{n}-{'CC' if c else 'NC'}" for n, c in CASES])
def test_step_by_step_equals_teacher_forcing(name, cross_causal):
    model = tiny_model(name, cross_causal)
    tokens = torch.tensor([[3, 4, 5, 6, 7, 1], [8, 9, 10, 1, 0, 0]])
    token_lengths = torch.tensor([6, 4])
    steps = 7
    with torch.no_grad():
        state = model.init_state(tokens, token_lengths)
        start = torch.zeros(2, 1, N_MELS)
        # threshold 1: no stop logit reaches it in 7 steps, so every step runs
        out = generate_frames(model.step, state, start, max_steps=steps, stop_threshold=1.0,
                              feedback=model.last_frame)
        decoded = out.frames.reshape(2, steps * 3, N_MELS)
        before, after, stop = model(tokens, token_lengths, decoded, torch.tensor([steps, steps]))
    assert out.frames.shape == (2, steps, 3 * N_MELS)
    torch.testing.assert_close(decoded, before, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(torch.sigmoid(stop), out.stop_probs, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(before, after)  # the postnet adds something


def test_padding_does_not_change_an_utterance():
    model = tiny_model("softmax")
    tokens = torch.tensor([[3, 4, 5, 1, 0, 0, 0]])
    mels = torch.randn(1, 12, N_MELS)
    with torch.no_grad():
        alone = model(tokens[:, :4], torch.tensor([4]), mels[:, :6], torch.tensor([2]))
        padded = model(tokens, torch.tensor([4]), mels, torch.tensor([2]))
    for a, p in zip(alone, padded):
        n = a.shape[1]
        torch.testing.assert_close(a, p[:, :n], atol=1e-5, rtol=1e-5)


def test_prenet_dropout_stays_on_in_eval():
    model = tiny_model("softmax")
    model.mel_prenet.p = 0.5
    x = torch.randn(1, 5, N_MELS)
    assert not torch.equal(model.mel_prenet(x), model.mel_prenet(x))


def test_sinusoids():
    table = sinusoids(torch.tensor([0, 3]), 6)
    # frequencies 1, 10000^(-1/3), 10000^(-2/3)
    frequencies = torch.tensor([1.0, 10000 ** (-1 / 3), 10000 ** (-2 / 3)])
    torch.testing.assert_close(table[1], torch.cat([(3 * frequencies).sin(), (3 * frequencies).cos()]))
    torch.testing.assert_close(table[0], torch.tensor([0.0, 0, 0, 1, 1, 1]))
