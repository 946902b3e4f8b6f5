"""RevIN (model.instance_norm) against a hand-computed normalisation and its defining
invariance, and the linear baseline against numpy's least squares."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.tasks.tsf.baselines import LinearForecast, last_value_forecast
from lavo_tasks.tasks.tsf.model import Forecaster, InstanceNorm

# --- instance normalisation


def test_instance_norm_by_hand_and_round_trip():
    torch.manual_seed(0)
    x = torch.randn(3, 10, 4, dtype=torch.float64) * 5 + 2
    norm = InstanceNorm(4).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64))
        norm.bias.copy_(torch.tensor([0.1, -1.0, 0.0, 2.0], dtype=torch.float64))
    mean, std = norm.statistics(x)
    normalised = norm.normalise(x, mean, std)

    values = x.numpy()
    mu = values.mean(axis=1, keepdims=True)
    sigma = np.sqrt(((values - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)  # population variance + eps
    expected = (values - mu) / sigma * np.array([0.5, 2.0, 1.0, 3.0]) + np.array([0.1, -1.0, 0.0, 2.0])
    assert np.allclose(normalised.detach().numpy(), expected, atol=1e-12)
    # the affine-free part: each window's channels have mean 0, population std ~1
    plain = (normalised.detach().numpy() - [0.1, -1.0, 0.0, 2.0]) / [0.5, 2.0, 1.0, 3.0]
    assert np.allclose(plain.mean(axis=1), 0, atol=1e-12)

    # de-normalising the last n channels gives their values back
    for n in (4, 1):
        back = norm.denormalise(normalised[..., -n:], mean, std)
        assert torch.allclose(back, x[..., -n:], atol=1e-8)


def tiny_forecaster(instance_norm: bool) -> Forecaster:
    softmax = OmegaConf.create({"name": "softmax"})
    return Forecaster(2, 2, d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32, dropout=0.0,
                      instance_norm=instance_norm, encoder_attention=softmax, decoder_attention=softmax,
                      cross_attention=softmax).eval()


def test_instance_norm_makes_the_forecast_follow_level_and_scale():
    # RevIN's point: the same window shifted by c and scaled by a > 0 is forecast as the
    # original forecast shifted and scaled alike (the known steps normalised with the
    # window's statistics); without it the forecast does not follow.
    torch.manual_seed(0)
    x, x_mark = torch.randn(2, 12, 2), torch.zeros(2, 12, 5, dtype=torch.long)
    y_mark = torch.zeros(2, 6 + 3, 5, dtype=torch.long)
    a, c = 3.0, torch.tensor([10.0, -4.0])
    for instance_norm, follows in ((True, True), (False, False)):
        torch.manual_seed(1)
        model = tiny_forecaster(instance_norm)
        with torch.no_grad():
            base = model(x, x_mark, x[:, -6:], y_mark)
            moved = model(a * x + c, x_mark, (a * x + c)[:, -6:], y_mark)
        assert torch.allclose(moved, a * base + c, atol=1e-3) is follows


# --- the baselines


def windows(series: np.ndarray, seq_len: int, pred_len: int):
    """Every (inputs [seq_len], targets [pred_len]) pair of a 1-d series, by a plain loop."""
    pairs = [(series[i:i + seq_len], series[i + seq_len:i + seq_len + pred_len])
             for i in range(len(series) - seq_len - pred_len + 1)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def test_linear_forecast_matches_numpy_least_squares():
    rng = np.random.default_rng(0)
    series = np.cumsum(rng.normal(size=(60, 2)), axis=0)  # two random walks
    seq_len, pred_len = 5, 3
    linear = LinearForecast(seq_len, pred_len).fit(series)
    new = torch.as_tensor(rng.normal(size=(4, seq_len, 2)))
    forecast = linear(new).numpy()
    for c in range(2):
        inputs, targets = windows(series[:, c], seq_len, pred_len)
        design = np.concatenate([inputs, np.ones((len(inputs), 1))], axis=1)
        weights = np.linalg.lstsq(design, targets, rcond=None)[0]  # [seq_len + 1, pred_len]
        assert np.allclose(linear.weights[c], weights, atol=1e-6)
        expected = np.concatenate([new[:, :, c].numpy(), np.ones((4, 1))], axis=1) @ weights
        assert np.allclose(forecast[:, :, c], expected, atol=1e-6)


def test_linear_forecast_is_exact_on_a_line_beyond_the_training_range():
    t = np.arange(50, dtype=np.float64)
    series = np.stack([3 * t + 7, -0.5 * t], axis=1)
    linear = LinearForecast(8, 4).fit(series)
    later = torch.as_tensor(np.stack([3 * (t[:8] + 200) + 7, -0.5 * (t[:8] + 200)], axis=1))[None]  # rows 200..207
    expected = np.stack([3 * np.arange(208, 212) + 7, -0.5 * np.arange(208, 212)], axis=1)
    assert np.allclose(linear(later)[0].numpy(), expected, atol=1e-6)


def test_linear_forecast_needs_a_window():
    with pytest.raises(ValueError, match="hold no window"):
        LinearForecast(8, 4).fit(np.zeros((11, 1)))


def test_last_value_forecast_repeats_the_last_step():
    x = torch.arange(12.0).reshape(2, 3, 2)
    assert torch.equal(last_value_forecast(x, 4), x[:, 2:3].repeat(1, 4, 1))
