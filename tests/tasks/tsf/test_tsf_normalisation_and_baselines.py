"""RevIN (model.instance_norm) against a hand-computed normalisation and its defining
invariance, the model's linear shortcut (model.linear_shortcut) and the linear baseline
against numpy's least squares."""

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


def tiny_forecaster(instance_norm: bool, linear_shortcut: bool = False, n_outputs: int = 2) -> Forecaster:
    softmax = OmegaConf.create({"name": "softmax"})
    return Forecaster(2, n_outputs, seq_len=12, pred_len=3, d_model=16, n_heads=2, encoder_layers=1,
                      decoder_layers=1, d_ff=32, dropout=0.0, instance_norm=instance_norm,
                      linear_shortcut=linear_shortcut, calendar=["hour"], encoder_attention=softmax,
                      decoder_attention=softmax, cross_attention=softmax).eval()


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
        model = tiny_forecaster(instance_norm)  # no shortcut: its map follows the level only
        with torch.no_grad():
            base = model(x, x_mark, x[:, -6:], y_mark)
            moved = model(a * x + c, x_mark, (a * x + c)[:, -6:], y_mark)
        assert torch.allclose(moved, a * base + c, atol=1e-3) is follows


# --- the linear shortcut


def test_shortcut_fit_and_forecast_match_numpy_least_squares():
    # NLinear's map, fitted by hand: every (window, forecast channel) pair is one sample,
    # its inputs and targets taken relative to the window's last input value.
    rng = np.random.default_rng(0)
    series = np.cumsum(rng.normal(size=(80, 2)), axis=0)  # two random walks
    seq_len, pred_len = 12, 3
    model = tiny_forecaster(instance_norm=True, linear_shortcut=True, n_outputs=1).double()
    starts = range(len(series) - seq_len - pred_len + 1)
    x = torch.as_tensor(np.stack([series[i:i + seq_len] for i in starts]))  # [N, seq_len, 2]
    y = torch.as_tensor(np.stack([series[i + seq_len:i + seq_len + pred_len] for i in starts]))
    model.fit_shortcut(x, y, ridge=1e-12, chunk=7)  # a ridge only for the last input, always 0 relative
    # to itself; 7 windows at a time, so the normal equations are summed over uneven chunks

    inputs, targets = [], []
    for i in starts:  # the forecast channel is the last one
        last = series[i + seq_len - 1, 1]
        inputs.append(np.append(series[i:i + seq_len, 1] - last, 1.0))
        targets.append(series[i + seq_len:i + seq_len + pred_len, 1] - last)
    weights = np.linalg.lstsq(np.array(inputs), np.array(targets), rcond=None)[0]  # [seq_len + 1, pred_len], min-norm
    assert np.allclose(model.shortcut.weight.detach().numpy(), weights[:-1].T, atol=1e-6)
    assert np.allclose(model.shortcut.bias.detach().numpy(), weights[-1], atol=1e-6)

    new = rng.normal(size=(4, seq_len, 2)) * 3 + 5
    last = new[:, -1:, 1]  # [4, 1]
    expected = last + np.concatenate([new[:, :, 1] - last, np.ones((4, 1))], axis=1) @ weights  # [4, pred_len]
    linear = model.linear_forecast(torch.as_tensor(new))
    assert np.allclose(linear[..., 0].detach().numpy(), expected, atol=1e-6)
    # The transformer's head starts at zero: a new model forecasts the shortcut's forecast.
    marks = torch.zeros(4, seq_len, 5, dtype=torch.long), torch.zeros(4, 6 + pred_len, 5, dtype=torch.long)
    with torch.no_grad():
        forecast = model(torch.as_tensor(new), marks[0], torch.as_tensor(new[:, -6:]), marks[1])
    assert np.allclose(forecast[..., 0].numpy(), expected, atol=1e-6)


def test_shortcut_is_shared_by_the_channels_and_follows_the_level():
    # One map for every forecast channel, fitted on all of them; a window moved by c per
    # channel is forecast moved by c (the inputs enter only relative to the last value).
    t = np.arange(60, dtype=np.float64)
    series = np.stack([0.5 * t, -2.0 * t + 40], axis=1)  # lines: each step continues the slope
    model = tiny_forecaster(instance_norm=False, linear_shortcut=True)
    starts = range(len(series) - 15 + 1)
    x = torch.as_tensor(np.stack([series[i:i + 12] for i in starts]), dtype=torch.float32)
    y = torch.as_tensor(np.stack([series[i + 12:i + 15] for i in starts]), dtype=torch.float32)
    model.fit_shortcut(x, y)
    later = torch.as_tensor(series[None, :12] + [100.0, -7.0], dtype=torch.float32)  # rows 0..11, moved
    expected = series[12:15] + [100.0, -7.0]
    assert np.allclose(model.linear_forecast(later)[0].detach().numpy(), expected, atol=1e-3)


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
