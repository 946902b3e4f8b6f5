"""The cross variant's source: what its cross-attention reads binds each value to its key
and to nothing else, and softmax cross-attention learns to recall from it."""

import torch
from omegaconf import OmegaConf

from lavo_tasks.config import attention_defaults
from lavo_tasks.tasks.mqar.data import IGNORE, make_sequences
from lavo_tasks.tasks.mqar.model import RecallModel

MODEL = OmegaConf.create(dict(d_model=32, n_layers=2, n_heads=2, d_ff=64, token_shift=True, cross_causal=False))


def cross_model(vocab: int = 32, pairs: int = 4) -> RecallModel:
    torch.manual_seed(0)
    return RecallModel(vocab, pairs, "cross", MODEL, attention_defaults("softmax"))


def test_value_position_reads_its_own_key_and_value_only():
    model = cross_model()
    source = torch.tensor([[3, 20, 7, 25, 1, 17, 9, 30]])  # k1 v1 k2 v2 k3 v3 k4 v4
    with torch.no_grad():
        memory = model.memory(source)  # [1, 8, 32]
        # By hand: the layer norm of the value's embedding plus its key's shift embedding.
        for i in range(4):
            key, value = source[0, 2 * i].item(), source[0, 2 * i + 1].item()
            a = model.embed.weight[value] + model.shift.weight[key]
            mean, var = sum(a.tolist()) / 32, sum((e - sum(a.tolist()) / 32) ** 2 for e in a.tolist()) / 32
            by_hand = (a - mean) / (var + model.source_norm.eps) ** 0.5 * model.source_norm.weight + model.source_norm.bias
            torch.testing.assert_close(memory[0, 2 * i + 1], by_hand, rtol=1e-5, atol=1e-5)
        # Another pair changed: the first value's representation stays as it was.
        other = source.clone()
        other[0, 4:6] = torch.tensor([11, 28])
        torch.testing.assert_close(model.memory(other)[0, 1], memory[0, 1])


def test_softmax_cross_attention_learns_to_recall():
    """A tiny cross model with softmax learns recall far beyond guessing among the values
    not yet asked (~0.52 for 4 queries of 4 pairs), which a source that hides the binding
    never passed."""
    model = cross_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(150):
        x, y = make_sequences(32, 32, 16, 4, 4, g)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits[y != IGNORE], y[y != IGNORE])
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, y = make_sequences(256, 32, 16, 4, 4, torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(x)
    hits = [int(logits[b, t].argmax() == y[b, t]) for b in range(256) for t in range(16) if y[b, t] != IGNORE]
    assert sum(hits) / len(hits) > 0.9
