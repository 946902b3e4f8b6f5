"""The MQAR task's data, config checks, state sizes and decode path (no training)."""

import itertools

import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.config import compose, validate
from lavo_tasks.errors import ConfigError, DataError
from lavo_tasks.tasks.mqar.data import IGNORE, MQARDataModule, TrainBatches, make_sequences
from lavo_tasks.tasks.mqar.model import RecallModel
from lavo_tasks.tasks.mqar.state import state_size

TINY = ["data.vocab_size=32", "data.seq_len=24", "data.num_kv_pairs=5", "data.num_queries=3", "data.val_size=6",
        "data.test_size=10", "data.batch_size=4", "model.d_model=16", "model.n_heads=2", "model.d_ff=32"]
TINY_ATTENTION = {"softmax": [], "local": ["attention.window=4"], "lavo": ["attention.window=4", "attention.rank=4"],
                  "gsa": ["attention.slots=5"]}


def tiny_cfg(tmp_path, *extra):
    cfg = compose(["task=mqar", *TINY, f"run.dir={tmp_path / 'run'}", *extra])
    validate(cfg)
    return cfg


def check_construction(inputs, targets, vocab, n, q):
    """An independent, token-by-token reading of Zoology's construction; returns nothing,
    asserts every rule of tasks/mqar/data.py's docstring on every sequence."""
    half = vocab // 2
    for x, y in zip(inputs.tolist(), targets.tolist()):
        keys, values = x[0:2 * n:2], x[1:2 * n:2]
        assert len(set(keys)) == n and all(1 <= k < half for k in keys)
        assert len(set(values)) == n and all(half <= v < vocab for v in values)
        value_of = dict(zip(keys, values))
        assert all(t == IGNORE for t in y[:2 * n])
        asked = [p for p in range(2 * n, len(x)) if y[p] != IGNORE]
        assert len(asked) == q
        assert len({x[p] for p in asked}) == q  # each pair asked once
        for p in asked:
            assert (p - 2 * n) % 2 == 0  # a query starts a two-token slot of the query region
            assert y[p] == value_of[x[p]]  # the answer is the key's value
            if p + 1 < len(x):
                assert x[p + 1] == value_of[x[p]]  # the value follows its key in the input
        shown = set(asked) | {p + 1 for p in asked}
        assert all(x[p] == 0 for p in range(2 * n, len(x)) if p not in shown)  # the rest is blank


@pytest.mark.parametrize("vocab,seq_len,n,q", [(32, 24, 5, 3), (16, 15, 7, 1), (64, 64, 8, 8), (10, 7, 2, 2)])
def test_sequences_follow_the_construction(vocab, seq_len, n, q):
    inputs, targets = make_sequences(200, vocab, seq_len, n, q, torch.Generator().manual_seed(1))
    assert inputs.shape == targets.shape == (200, seq_len)
    check_construction(inputs, targets, vocab, n, q)


def test_queries_use_every_slot_and_pair_over_many_draws():
    """Uniform draws: over many sequences every pair is asked and every slot is used."""
    inputs, targets = make_sequences(500, 16, 13, 3, 2, torch.Generator().manual_seed(0))
    positions = {p for row in targets.tolist() for p, t in enumerate(row) if t != IGNORE}
    assert positions == {6, 8, 10, 12}  # slots of the query region z[6:14]; the last one's value is z[13]
    pairs = {row[:6:2].index(x[p]) for row, x, y in zip(inputs.tolist(), inputs.tolist(), targets.tolist())
             for p in range(6, 13) if y[p] != IGNORE}
    assert pairs == {0, 1, 2}


def test_training_batches_depend_on_seed_and_step_only(tmp_path):
    cfg = tiny_cfg(tmp_path)
    fresh = list(itertools.islice(iter(TrainBatches(cfg.data, 3, 0)), 4))
    resumed = next(iter(TrainBatches(cfg.data, 3, 2)))
    assert torch.equal(fresh[2][0], resumed[0]) and torch.equal(fresh[2][1], resumed[1])
    assert not torch.equal(fresh[0][0], fresh[1][0])
    assert not torch.equal(fresh[0][0], next(iter(TrainBatches(cfg.data, 4, 0)))[0])
    check_construction(*fresh[0], 32, 5, 3)


def test_saved_set_is_reused_exactly_and_checked(tmp_path):
    dm = MQARDataModule(tiny_cfg(tmp_path))
    dm.setup("fit")
    saved = tmp_path / "run" / "mqar_set.pt"
    other = MQARDataModule(tiny_cfg(tmp_path, f"data.path={saved}", "seed=7", f"run.dir={tmp_path / 'other'}"))
    other.setup("test")
    for split in ("val", "test"):
        assert all(torch.equal(a, b) for a, b in zip(dm.sets[split], other.sets[split]))
    assert not torch.equal(dm.sets["val"][0], dm.sets["test"][0][:6])
    check_construction(*dm.sets["test"], 32, 5, 3)
    for key, value in [("vocab_size", 40), ("seq_len", 30), ("num_kv_pairs", 4), ("num_queries", 2)]:
        with pytest.raises(ConfigError, match=rf"^data\.{key}={value}: the saved set .* data\.{key}="):
            tiny_cfg(tmp_path, f"data.path={saved}", f"data.{key}={value}")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a set")
    with pytest.raises(DataError, match=r"^data\.path=.*junk\.pt: not an MQAR set"):
        tiny_cfg(tmp_path, f"data.path={junk}")


@pytest.mark.parametrize("args,message", [
    (["data.num_kv_pairs=16"], r"^data\.num_kv_pairs=16: must be in \[1, 15\]"),  # keys: [1, 16) of vocabulary 32
    (["data.num_queries=6"], r"^data\.num_queries=6: must be in \[1, data\.num_kv_pairs=5\]"),
    (["data.seq_len=14"], r"^data\.seq_len=14: must be >= 2 \* num_kv_pairs \+ 2 \* num_queries - 1 = 15"),
    (["data.variant=both"], r"^data\.variant='both': must be one of self, cross"),
    (["data.variant=cross", "attention=local", "attention.window=4"], r"^model.attention=local: .* does not support noncausal cross-attention \(NC\)"),
])
def test_bad_input_names_the_key(tmp_path, args, message):
    with pytest.raises(ConfigError, match=message):
        tiny_cfg(tmp_path, *args)


def test_shortest_sequence_holds_the_pairs_and_queries(tmp_path):
    cfg = tiny_cfg(tmp_path, "data.seq_len=15")  # 5 pairs (10 tokens), then 3 slots of 2, the last value z[15]
    check_construction(*make_sequences(50, 32, 15, 5, 3, torch.Generator().manual_seed(0)), 32, 5, 3)
    assert cfg.data.seq_len == 15


def test_state_sizes_hand_computed():
    """d_model 64 (2 heads of 32), sequence 128, source 16 tokens."""
    def size(pattern, length, **attention):
        return state_size(OmegaConf.create(attention), pattern, 64, 2, length)

    assert size("CS", 128, name="softmax") == 2 * 128 * 64  # a key and a value of 64 numbers per token
    assert size("NC", 16, name="softmax") == 2 * 16 * 64
    assert size("CS", 128, name="local", window=8) == 2 * 7 * 64
    assert size("CS", 128, name="lavo", window=8, rank=4, cross_segments=1) == 2 * 7 * 64 + 4 * 2
    assert size("NC", 16, name="lavo", window=8, rank=4, cross_segments=3) == 4 * 3 * 2
    assert size("CS", 128, name="gsa", slots=16) == 16 * (32 + 32) * 2
    assert size("CS", 4096, name="gsa", slots=16) == size("NC", 16, name="gsa", slots=16)


@pytest.mark.parametrize("variant,cross_causal,attention", [
    *(("self", False, a) for a in TINY_ATTENTION),
    *(("cross", c, a) for c in (False, True) for a in ("softmax", "lavo", "gsa")),
])
def test_decode_path_equals_teacher_forcing(tmp_path, variant, cross_causal, attention):
    cfg = tiny_cfg(tmp_path, f"data.variant={variant}", f"model.cross_causal={cross_causal}", f"attention={attention}",
                   *TINY_ATTENTION[attention])
    torch.manual_seed(0)
    model = RecallModel(32, 5, variant, cfg.model, cfg.model.attention).eval()
    inputs, _ = make_sequences(3, 32, 24, 5, 3, torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(inputs)
    stepped = model.decode(inputs)
    assert (stepped - full).abs().max() <= 1e-4 * full.abs().max()


def test_cross_variant_reads_the_pairs_only_through_the_cross_site(tmp_path):
    """Changing a value in the pairs changes the cross model's answers; its decoder sees blanks there."""
    cfg = tiny_cfg(tmp_path, "data.variant=cross")
    torch.manual_seed(0)
    model = RecallModel(32, 5, "cross", cfg.model, cfg.model.attention).eval()
    inputs, _ = make_sequences(1, 32, 24, 5, 3, torch.Generator().manual_seed(2))
    source, tokens = model.split(inputs)
    assert torch.equal(source, inputs[:, :10]) and (tokens[:, :10] == 0).all() and torch.equal(tokens[:, 10:],
                                                                                            inputs[:, 10:])
    changed = inputs.clone()
    changed[0, 1] = 31 if changed[0, 1] != 31 else 30
    with torch.no_grad():
        assert not torch.allclose(model(inputs)[:, 10:], model(changed)[:, 10:])


def test_token_shift_adds_the_previous_tokens_embedding(tmp_path):
    cfg = tiny_cfg(tmp_path)
    model = RecallModel(32, 5, "self", cfg.model, cfg.model.attention)
    tokens = torch.tensor([[3, 17, 0, 5]])
    x = model.read(tokens)
    E, S = model.embed.weight, model.shift.weight
    expected = torch.stack([E[3], E[17] + S[3], E[0] + S[17], E[5] + S[0]])
    assert torch.allclose(x[0], expected)
    assert torch.allclose(model.read(tokens[:, 2:], previous=tokens[:, 1:2])[0], expected[2:])
    plain = RecallModel(32, 5, "self", OmegaConf.merge(cfg.model, {"token_shift": False}), cfg.model.attention)
    assert plain.shift is None and torch.equal(plain.read(tokens)[0], plain.embed.weight[tokens[0]])
