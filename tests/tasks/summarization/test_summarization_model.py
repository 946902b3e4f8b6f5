"""The summarizer: teacher forcing against step-by-step decoding, beam search through the
decode states against beam search that recomputes the whole prefix, greedy at beam 1,
the length and n-gram rules, for every attention."""

import pytest
import torch

from lavo_tasks.bench_decode import state_bytes
from lavo_tasks.config import attention_defaults
from lavo_tasks.generation import generate
from lavo_tasks.tasks.summarization.model import Summarizer

VOCAB, EOS = 23, 22
# (decoder self-attention, cross-attention) with keys that fit head dim 8 and short sequences
ATTENTIONS = {
    "softmax": ("softmax", "softmax", {}),
    "softmax-alibi": ("softmax", "softmax", {"alibi": True}),  # the task's default softmax
    "local": ("local", "softmax", {"window": 4}),  # local has no cross pattern
    "lavo": ("lavo", "lavo", {"window": 4, "rank": 4}),
    "gsa": ("gsa", "gsa", {"slots": 5}),
}


def site(name, **keys):
    cfg = attention_defaults(name)
    for key, value in keys.items():
        if key in cfg:
            cfg[key] = value
    return cfg


def tiny_model(attention, cross_causal=True, seed=0):
    self_name, cross_name, keys = ATTENTIONS[attention]
    torch.manual_seed(seed)
    model = Summarizer(VOCAB, d_model=16, n_heads=2, encoder_layers=1, decoder_layers=2, d_ff=32, dropout=0.0,
                       encoder_attention=site(self_name, **keys), decoder_attention=site(self_name, **keys),
                       cross_attention=site(cross_name, **keys), cross_causal=cross_causal)
    with torch.no_grad():  # output embeddings spread enough that beams do not tie
        model.embed.weight.mul_(40)
    return model.eval()


def source_batch():
    torch.manual_seed(1)
    source = torch.randint(0, EOS, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, 7:] = False  # a padded source
    return source, mask


def recompute_step(model):
    """A token step function without decode states: the state is (memory, memory mask, every
    token fed so far) and each step runs the decoder over the whole prefix again."""
    def step(tokens, state):
        memory, memory_mask, fed = state
        fed = torch.cat([fed, tokens], dim=1)
        h = model.decoder(model.embed(fed), memory, None, memory_mask)
        return model.head(h)[:, -tokens.shape[1]:], (memory, memory_mask, fed)

    return step


def recompute_state(model, source, mask):
    return model.encode(source, mask), mask, source.new_zeros(len(source), 0)


@pytest.mark.parametrize("cross_causal", [True, False], ids=["CC", "NC"])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_decode_states_give_the_teacher_forcing_logits(attention, cross_causal):
    model = tiny_model(attention, cross_causal)
    source, mask = source_batch()
    decoder_input = torch.randint(0, VOCAB, (3, 9))
    with torch.no_grad():
        whole = model(source, decoder_input, mask)  # [3, 9, V]
        state = model.init_state(source, mask)
        pieces = []
        for chunk in (decoder_input[:, :1], decoder_input[:, 1:4], *decoder_input[:, 4:].split(1, dim=1)):
            logits, state = model.step(chunk, state)
            pieces.append(logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("cross_causal", [True, False], ids=["CC", "NC"])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_a_state_for_a_few_positions_keeps_only_the_source_they_read(attention, cross_causal):
    """init_state(..., positions=9) over an 11-token source (row 1 padded from 7, so the cut
    keeps some padding): decoding those 9 positions token by token gives the
    teacher-forcing logits; under CC the state holds less than the whole source's, under
    NC the same."""
    model = tiny_model(attention, cross_causal)
    source, mask = source_batch()
    decoder_input = torch.randint(0, VOCAB, (3, 9))
    with torch.no_grad():
        whole = model(source, decoder_input, mask)
        state = step_state = model.init_state(source, mask, positions=9)
        pieces = []
        for t in range(9):
            logits, step_state = model.step(decoder_input[:, t : t + 1], step_state)
            pieces.append(logits)
        full = model.init_state(source, mask)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=2e-4, rtol=2e-4)
    if cross_causal:
        assert state_bytes(state) < state_bytes(full)
    else:
        assert state_bytes(state) == state_bytes(full)


@pytest.mark.parametrize("attention", ["softmax-alibi", "lavo", "gsa"])  # the cut per attention: the test above
def test_beam_search_from_a_state_for_its_positions_equals_the_whole_source(attention):
    """The summarizer's CC beam search from init_state(positions=prefix + max_len) gives the
    tokens and scores of the search from the whole source's state; a decode longer than
    the positions is refused (max_positions)."""
    model = tiny_model(attention)
    source, mask = source_batch()
    prefix = torch.full((3, 1), EOS)
    options = dict(max_len=8, min_len=2, eos_id=EOS, pad_id=EOS, beam=3, no_repeat_ngram=2)
    with torch.no_grad():
        cut = generate(model.step, model.init_state(source, mask, positions=9), prefix, max_positions=9, **options)
        whole = generate(model.step, model.init_state(source, mask), prefix, **options)
        with pytest.raises(ValueError, match="max_len=9"):
            generate(model.step, model.init_state(source, mask, positions=9), prefix, max_positions=9,
                     **{**options, "max_len": 9})
    assert torch.equal(cut.tokens, whole.tokens) and torch.equal(cut.lengths, whole.lengths)
    torch.testing.assert_close(cut.scores, whole.scores)


def test_positions_must_be_a_count():
    model = tiny_model("lavo")
    source, mask = source_batch()
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match=f"positions={bad!r}"):
            model.init_state(source, mask, positions=bad)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_beam_search_through_decode_states_equals_recomputing_the_prefix(attention):
    model = tiny_model(attention)
    source, mask = source_batch()
    prefix = torch.full((3, 1), EOS)
    options = dict(max_len=7, min_len=2, eos_id=EOS, pad_id=EOS, beam=3, length_penalty=0.8, no_repeat_ngram=2)
    with torch.no_grad():
        cached = generate(model.step, model.init_state(source, mask), prefix, **options)
        again = generate(recompute_step(model), recompute_state(model, source, mask), prefix, **options)
    assert torch.equal(cached.tokens, again.tokens) and torch.equal(cached.lengths, again.lengths)
    torch.testing.assert_close(cached.scores, again.scores, atol=1e-4, rtol=1e-4)
    assert (cached.lengths >= 2).all()  # min_len


@pytest.mark.parametrize("attention", ["softmax", "gsa"])
def test_beam_one_is_greedy_by_hand(attention):
    model = tiny_model(attention)
    source, mask = source_batch()
    with torch.no_grad():
        out = generate(model.step, model.init_state(source, mask), torch.full((3, 1), EOS), max_len=6, beam=1)
        # greedy by hand: the most likely next token after the whole prefix, recomputed each time
        tokens = torch.full((3, 1), EOS)
        memory = model.encode(source, mask)
        for _ in range(6):
            logits = model.head(model.decoder(model.embed(tokens), memory, None, mask))[:, -1]
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.tokens, tokens[:, 1:])


def test_no_repeat_ngram_and_max_len_rules():
    model = tiny_model("softmax")
    source, mask = source_batch()
    with torch.no_grad():
        free = generate(model.step, model.init_state(source, mask), torch.full((3, 1), EOS), max_len=30, beam=2)
        banned = generate(model.step, model.init_state(source, mask), torch.full((3, 1), EOS), max_len=30, beam=2,
                          no_repeat_ngram=2)

    def repeats(row):
        pairs = list(zip(row, row[1:]))
        return len(pairs) - len(set(pairs))

    assert any(repeats([EOS, *row]) for row in free.tokens.tolist())  # untied, 23 tokens: 30 steps repeat
    assert all(repeats([EOS, *row[:n]]) == 0 for row, n in zip(banned.tokens.tolist(), banned.lengths.tolist()))
    assert free.tokens.shape[1] <= 30 and (free.lengths <= 30).all()


def test_the_output_head_is_the_input_embedding():
    model = tiny_model("softmax")
    h = torch.randn(2, 3, 16)
    torch.testing.assert_close(model.head(h), h @ model.embed.weight.T)
    assert sum(p.numel() for p in model.parameters() if p.shape == (VOCAB, 16)) == VOCAB * 16  # one table


@pytest.mark.parametrize("cross_causal", [True, False], ids=["CC", "NC"])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_which_memory_positions_a_summary_position_reads(attention, cross_causal):
    """CC (docs/design.md §2): summary position t reads memory positions j <= t only, so a
    summary token that copies from later in the source cannot see what it copies; NC reads
    the whole memory. Perturbing memory position 6 must leave positions 0-5 unchanged under
    CC and change them under NC; position 6 and later change under both."""
    model = tiny_model(attention, cross_causal)
    source, _ = source_batch()
    decoder_input = torch.randint(0, VOCAB, (3, 9))
    with torch.no_grad():
        memory = model.encode(source)  # [3, 11, 16]
        changed = memory.clone()
        changed[:, 6] += torch.randn(3, 16)
        before, after = (model.head(model.decoder(model.embed(decoder_input), m, None, None)) for m in (memory, changed))
    moved = (after - before).abs().amax(dim=(0, 2))  # [9]: the largest change at each summary position
    assert (moved[6:] > 1e-3).all()
    if cross_causal:
        assert (moved[:6] == 0).all()
    else:
        assert (moved[:6] > 1e-3).all()
