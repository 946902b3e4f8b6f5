"""Generation (lavo_tasks.generation) and the decode-state protocol.

Every attention, on a small random Decoder-based model (float64, CPU): beam 1 chooses as
greedy decoding does; beam search through the states gives the tokens and scores of a
slow beam search written here, which recomputes the whole prefix of every hypothesis at
every step without states; a reorder inside the beam is exact; a state handed to a step
is unchanged afterwards; LAVO's and GSA's states keep their size. The rules (no-repeat
n-gram, min/max length, EOS, top-k/top-p, the frame loop's stop threshold) on hand-made
logits with hand-worked answers.
"""

import math

import pytest
import torch
from torch import nn

from lavo_tasks.attention import ATTENTION_NAMES
from lavo_tasks.generation import (beam_search, generate, generate_frames, own_buffers, reorder, reorder_changing,
                                   static_state)
from lavo_tasks.stacks import Decoder
from attention_cases import attention_cfg, make_block, patterns_of, supported

VOCAB, EOS, PAD, D_MODEL = 11, 1, 0, 16


class ToyModel(nn.Module):
    """Embedding -> Decoder -> linear head; with `cross`, a causal (or not) cross-attention
    over a random memory."""

    def __init__(self, name: str, cross: str | None = None, cross_causal: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.decoder = Decoder(d_model=D_MODEL, n_heads=2, n_layers=2, self_attention=attention_cfg(name),
                               cross_attention=attention_cfg(cross) if cross else None, d_ff=32,
                               cross_causal=cross_causal)
        self.head = nn.Linear(D_MODEL, VOCAB)
        with torch.no_grad():  # peakier than at initialisation, and eos likely enough to end some hypotheses
            self.head.weight.mul_(6.0)
            self.head.bias[EOS] += 1.0
        self.double().eval()
        self.memory = torch.randn(3, 6, D_MODEL, dtype=torch.float64) if cross else None

    def full_logits(self, tokens, memory):
        return self.head(self.decoder(self.embed(tokens), memory))

    def init_state(self, rows):
        return self.decoder.init_state(len(rows), None if self.memory is None else self.memory[rows])

    def step(self, tokens, state):
        y, state = self.decoder.step(self.embed(tokens), state)
        return self.head(y), state


def model_cases():
    """Every attention as the self-attention, without and with (CC) cross-attention."""
    for name in ATTENTION_NAMES:
        yield name, None
        yield name, name if "CC" in patterns_of(name) else "softmax"


PREFIX = torch.tensor([[2, 5], [7, 3], [4, 4]])


def slow_beam_search(model, prefix, memory, *, beam, max_len, min_len, length_penalty, no_repeat_ngram):
    """One sequence: prefix (list of ints), memory [S, D] or None -> (score, tokens).

    The rules of `generate`'s beam search written out over Python lists; every
    hypothesis's next-token log-probs come from the model's full forward over prefix +
    hypothesis (no decode state)."""

    def next_logprobs(sequence):
        with torch.no_grad():
            logits = model.full_logits(torch.tensor([sequence]), None if memory is None else memory[None])[0, -1]
        banned = {EOS} if len(sequence) - len(prefix) < min_len else set()
        n = no_repeat_ngram
        if n:
            tail = sequence[len(sequence) - n + 1 :] if n > 1 else []
            for j in range(len(sequence) - n + 1):
                if sequence[j : j + n - 1] == tail:
                    banned.add(sequence[j + n - 1])
        for token in banned:
            logits[token] = -math.inf
        return torch.log_softmax(logits, -1).tolist()

    live, finished = [(0.0, [])], []
    for i in range(max_len):
        candidates = []
        for score, tokens in live:
            logprobs = next_logprobs(prefix + tokens)
            candidates += [(score + logprobs[t], tokens, t) for t in range(VOCAB)]
        candidates.sort(key=lambda c: -c[0])  # stable: equal scores keep (hypothesis, token) order
        new_live = []
        for score, tokens, t in candidates[: 2 * beam]:
            if t == EOS:
                if len(new_live) < beam and score > -math.inf and len(finished) < beam:
                    finished.append((score / (i + 1) ** length_penalty, tokens + [t]))
            elif len(new_live) < beam:
                new_live.append((score, tokens + [t]))
        if len(finished) == beam:
            break
        live = new_live
        if i + 1 == max_len:
            finished += [(score / max_len**length_penalty, tokens) for score, tokens in live]
    return max(finished, key=lambda f: f[0])


@pytest.mark.parametrize(("name", "cross"), list(model_cases()))
def test_beam_search_matches_slow_beam_search(name, cross):
    model = ToyModel(name, cross)
    rows = torch.arange(3)
    options = dict(beam=3, max_len=7, min_len=2, length_penalty=1.0, no_repeat_ngram=2)
    got = beam_search(model.step, model.init_state(rows), PREFIX, eos_id=EOS, pad_id=PAD, **options)
    for b in range(3):
        memory = None if model.memory is None else model.memory[b]
        score, tokens = slow_beam_search(model, PREFIX[b].tolist(), memory, **options)
        length = int(got.lengths[b])
        assert got.tokens[b, :length].tolist() == tokens
        assert torch.all(got.tokens[b, length:] == PAD)
        assert got.scores[b].item() == pytest.approx(score, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(("name", "cross"), list(model_cases()))
def test_beam_one_equals_greedy(name, cross):
    model = ToyModel(name, cross)
    rows = torch.arange(3)
    for options in (dict(max_len=8, min_len=1, no_repeat_ngram=3), dict(max_len=6, min_len=2)):
        options.update(eos_id=EOS, pad_id=PAD)
        greedy = generate(model.step, model.init_state(rows), PREFIX, **options)
        beam = beam_search(model.step, model.init_state(rows), PREFIX, beam=1, length_penalty=0.0, **options)
        assert torch.equal(beam.tokens, greedy.tokens) and torch.equal(beam.lengths, greedy.lengths)
        torch.testing.assert_close(beam.scores, greedy.scores, rtol=1e-12, atol=1e-12)
    # greedy from the full forward: each token the most likely (eos banned before min_len),
    # the score the sum of their log-probs
    for b in range(3):
        length = int(greedy.lengths[b])
        sequence = torch.cat([PREFIX[b], greedy.tokens[b, :length]])[None]
        with torch.no_grad():
            logits = model.full_logits(sequence, None if model.memory is None else model.memory[b : b + 1])[0]
        logits = logits[PREFIX.shape[1] - 1 : -1].clone()  # [length, V]: the logits each token was chosen from
        logits[: options["min_len"], EOS] = -math.inf
        assert logits.argmax(-1).tolist() == greedy.tokens[b, :length].tolist()
        score = torch.log_softmax(logits, -1).gather(1, sequence[0, PREFIX.shape[1] :, None]).sum()
        assert greedy.scores[b].item() == pytest.approx(score.item(), rel=1e-9)


def assert_states_close(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_states_close(x, y)
    else:
        assert a == b


@pytest.mark.parametrize(("name", "cross"), list(model_cases()))
def test_reorder_inside_the_beam_is_exact(name, cross):
    """Reorder the state after the prefix, then step == step the reordered batch from scratch."""
    model = ToyModel(name, cross)
    index = torch.tensor([2, 0, 0, 1])
    tokens = torch.tensor([[6], [9], [3], [6]])
    with torch.no_grad():
        _, state = model.step(PREFIX, model.init_state(torch.arange(3)))
        got_logits, got_state = model.step(tokens, reorder(state, index))
        _, fresh = model.step(PREFIX[index], model.init_state(index))
        want_logits, want_state = model.step(tokens, fresh)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-10, atol=1e-10)
    assert_states_close(got_state, want_state)


def clone_state(state):
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(clone_state(s) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(clone_state(s) for s in state)
    return state


def assert_states_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, (tuple, list)):
        for x, y in zip(a, b, strict=True):
            assert_states_equal(x, y)
    else:
        assert a == b


@pytest.mark.parametrize(("name", "pattern"), supported({"CS", "CC", "NC"}))
def test_a_step_leaves_its_state_unchanged(name, pattern):
    block = make_block(name, pattern).eval()
    context = torch.randn(2, 7, D_MODEL) if pattern[1] == "C" else None
    x = torch.randn(2, 6, D_MODEL)
    with torch.no_grad():
        state = block.init_state(2, context=context)
        for chunk in (x[:, :3], x[:, 3:4], x[:, 4:]):  # a prefill, one token, two tokens
            before = clone_state(state)
            _, new_state = block(chunk, state=state)
            assert_states_equal(state, before)
            state = new_state


def state_bytes(state) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, (tuple, list)):
        return sum(state_bytes(s) for s in state)
    return 0


@pytest.mark.parametrize(("name", "pattern"), [("lavo", "CS"), ("gsa", "CS"), ("lavo", "CC"), ("gsa", "CC")])
def test_constant_state_size(name, pattern):
    block = make_block(name, pattern).eval()
    context = torch.randn(1, 7, D_MODEL) if pattern == "CC" else None
    x = torch.randn(1, 1000, D_MODEL)
    sizes = {}
    with torch.no_grad():
        state = block.init_state(1, context=context)
        for t in range(1000):
            _, state = block(x[:, t : t + 1], state=state)
            if t + 1 in (10, 1000):
                sizes[t + 1] = state_bytes(state)
    assert sizes[10] == sizes[1000] > 0


def test_softmax_state_grows():
    """The measure above can fail: softmax's KV cache grows with every position."""
    block = make_block("softmax", "CS").eval()
    with torch.no_grad():
        state = block.init_state(1)
        _, small = block(torch.randn(1, 10, D_MODEL), state=state)
        _, large = block(torch.randn(1, 30, D_MODEL), state=small)
    assert state_bytes(large) == 4 * state_bytes(small)


# --------------------------------------------------------------------------------------
# Rules on hand-made logits


def table_step(logits_after):
    """A token step whose logits depend on the last token only: logits_after(token [N]) ->
    [N, V]. Its state is the count of tokens fed, [N] (a batch-first tensor)."""

    def step(tokens, count):
        logits = torch.stack([logits_after(tokens[:, j]) for j in range(tokens.shape[1])], dim=1)
        return logits, count + tokens.shape[1]

    return step


def fixed_preference(vocab):
    """Always prefers 0, then 1, then 2, ..."""
    return table_step(lambda last: -torch.arange(vocab, dtype=torch.float32).expand(len(last), vocab))


def test_no_repeat_ngram():
    step, prefix = fixed_preference(6), torch.tensor([[0]])
    # bigrams: 0 (0 0 is new), then 0 0 exists -> 1, then 1 0 is new -> 0, then 0 0 and 0 1 exist -> 2, ...
    out = generate(step, torch.zeros(1), prefix, max_len=8, no_repeat_ngram=2)
    assert out.tokens.tolist() == [[0, 1, 0, 2, 0, 3, 0, 4]]
    out = generate(step, torch.zeros(1), prefix, max_len=5, no_repeat_ngram=1)  # no token twice, 0 in the prefix
    assert out.tokens.tolist() == [[1, 2, 3, 4, 5]]
    out = generate(step, torch.zeros(1), prefix, max_len=6, no_repeat_ngram=3)  # 0 0, then 0 0 0 exists -> 1, ...
    assert out.tokens.tolist() == [[0, 0, 1, 0, 0, 2]]
    out = generate(step, torch.zeros(1), prefix, max_len=8, no_repeat_ngram=2, beam=2)
    grams = [tuple(g) for g in torch.cat([prefix, out.tokens], 1)[0].unfold(0, 2, 1).tolist()]
    assert len(grams) == len(set(grams)) == 8


def test_min_len_max_len_and_eos():
    # eos = 1, pad = 0; after 2: eos (logit 10), else 3 (logit 5); after anything else: 2
    def logits_after(last):
        logits = torch.zeros(len(last), 5)
        logits[last == 2, 1], logits[last == 2, 3] = 10.0, 5.0
        logits[last != 2, 2] = 10.0
        return logits

    step = table_step(logits_after)
    prefix = torch.tensor([[2], [3]])
    out = generate(step, torch.zeros(2), prefix, max_len=4, eos_id=1, pad_id=0)
    assert out.tokens.tolist() == [[1, 0], [2, 1]] and out.lengths.tolist() == [1, 2]
    out = generate(step, torch.zeros(2), prefix, max_len=4, eos_id=1, pad_id=7, min_len=2)  # eos banned at first
    assert out.tokens.tolist() == [[3, 2, 1, 7], [2, 3, 2, 1]] and out.lengths.tolist() == [3, 4]
    # beam 2: row 1 is done when two hypotheses ended (2 2 1 and 2 0 1, at step 3), before the
    # better 2 3 2 1 could: the rule of fairseq's generator (and HF's early_stopping=True)
    out = generate(step, torch.zeros(2), prefix, max_len=4, eos_id=1, pad_id=7, min_len=2, beam=2)
    assert out.tokens.tolist() == [[3, 2, 1], [2, 2, 1]] and out.lengths.tolist() == [3, 3]
    after_3, after_2_no_eos, after_2 = (10 - math.log(math.exp(10) + 4), -math.log(math.exp(5) + 3),
                                        10 - math.log(math.exp(10) + math.exp(5) + 3))
    assert out.scores[1].item() == pytest.approx((after_3 + after_2_no_eos + after_2) / 3, rel=1e-5)
    out = generate(step, torch.zeros(2), prefix, max_len=3)  # no eos: every row runs max_len
    assert out.tokens.shape == (2, 3) and out.lengths.tolist() == [3, 3]
    # greedy's score: the log-prob of each chosen token
    out = generate(step, torch.zeros(1), prefix[:1], max_len=2, eos_id=1)
    assert out.scores.item() == pytest.approx(10 - math.log(math.exp(10) + math.exp(5) + 3), rel=1e-4)


def test_beam_search_beats_greedy_by_hand():
    """After 0: 1 at 0.5, 2 at 0.4; after 1: four tokens at 0.24; after 2: 3 at 0.9.
    Greedy: 1 then 0 (p 0.12); beam 2 finds 2 3 (p 0.36), scored log(0.36) / 2."""
    table = torch.tensor([
        [0.05, 0.5, 0.4, 0.03, 0.02],
        [0.24, 0.24, 0.24, 0.24, 0.04],
        [0.025, 0.025, 0.025, 0.9, 0.025],
        [0.2] * 5,
        [0.2] * 5,
    ])
    step = table_step(lambda last: table.log()[last])
    greedy = generate(step, torch.zeros(1), torch.tensor([[0]]), max_len=2)
    assert greedy.tokens.tolist() == [[1, 0]] and greedy.scores.item() == pytest.approx(math.log(0.12), rel=1e-6)
    out = generate(step, torch.zeros(1), torch.tensor([[0]]), max_len=2, beam=2, length_penalty=1.0)
    assert out.tokens.tolist() == [[2, 3]] and out.scores.item() == pytest.approx(math.log(0.36) / 2, rel=1e-6)


def test_sampling_top_k_top_p_temperature():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    step = table_step(lambda last: probs.log().expand(len(last), 4))
    prefix, state = torch.zeros(4000, 1, dtype=torch.long), torch.zeros(4000)

    def draw(**options):
        out = generate(step, state, prefix, max_len=1, generator=torch.Generator().manual_seed(0), **options)
        return torch.bincount(out.tokens[:, 0], minlength=4).double() / 4000

    freq = draw(temperature=1.0, top_p=0.7)  # the smallest set reaching 0.7: tokens 0 and 1
    assert freq[2:].sum() == 0 and freq[0].item() == pytest.approx(0.5 / 0.8, abs=0.03)
    freq = draw(temperature=1.0, top_k=3)
    assert freq[3] == 0 and freq[2].item() == pytest.approx(0.15 / 0.95, abs=0.03)
    freq = draw(temperature=0.5)  # probabilities squared, renormalised
    assert freq[0].item() == pytest.approx(0.25 / probs.pow(2).sum().item(), abs=0.03)
    assert torch.equal(draw(temperature=1.0), draw(temperature=1.0))  # one generator seed, one draw
    assert draw(temperature=1.0, top_k=1)[0] == 1 and draw(temperature=1.0, top_p=0.01)[0] == 1  # = greedy


@pytest.mark.parametrize(("options", "argument"), [
    (dict(beam=0), "beam=0"), (dict(top_p=0.0), "top_p=0.0"), (dict(top_p=1.5), "top_p=1.5"),
    (dict(temperature=-1.0), "temperature=-1.0"), (dict(max_len=0), "max_len=0"), (dict(min_len=9), "min_len=9"),
    (dict(max_positions=5), "prefix: 2 tokens"), (dict(beam=2, temperature=1.0), "temperature=1.0"),
    (dict(top_k=-1), "top_k=-1"), (dict(no_repeat_ngram=-1), "no_repeat_ngram=-1"),
])
def test_bad_arguments(options, argument):
    options = {"max_len": 4, **options}
    with pytest.raises(ValueError, match=argument.replace("(", r"\(")):
        generate(fixed_preference(5), torch.zeros(1), torch.tensor([[0, 1]]), **options)


def test_bad_prefix():
    with pytest.raises(ValueError, match="prefix"):
        generate(fixed_preference(5), torch.zeros(1), torch.zeros(1, 0, dtype=torch.long), max_len=2)
    with pytest.raises(ValueError, match="prefix"):
        generate(fixed_preference(5), torch.zeros(1), torch.zeros(1, 2), max_len=2)


def test_a_state_of_another_batch_names_the_prefix():
    """A state made for 3 rows and a prefix of 2: one error naming the prefix, before any
    step (greedy and beam alike); the frame loop names its start."""
    model = ToyModel("softmax")
    for options in (dict(), dict(beam=2)):
        with pytest.raises(ValueError, match=r"prefix: 2 rows, but the decode state holds a batch of 3"):
            generate(model.step, model.init_state([0, 1, 2]), PREFIX[:2], max_len=3, **options)
    with pytest.raises(ValueError, match=r"start: 2 rows, but the decode state holds a batch of 3"):
        generate_frames(frame_step([1, 1, 1]), torch.zeros(3), torch.zeros(2, 1, 4), max_steps=3)


def test_a_step_that_changes_the_batch_mid_generation():
    """A step that drops a row after the prefix: one error naming the step and the batch."""

    def step(tokens, state):
        rows = tokens.shape[0] if tokens.shape[1] > 1 else tokens.shape[0] - 1
        return torch.zeros(rows, tokens.shape[1], 5), state

    for options in (dict(), dict(beam=2)):
        with pytest.raises(ValueError, match="step: gave logits for .* the batch must not change mid-generation"):
            generate(step, torch.zeros(2), torch.zeros(2, 2, dtype=torch.long), max_len=4, **options)


def test_max_len_above_the_room_of_a_static_cache():
    """A softmax state already in a static KV cache with room for 3 more positions: a
    generation that needs more (its prefix and max_len tokens) names both, before the
    prefix is stepped (a prefix longer than the room would write past the buffers),
    greedy and beam alike."""
    model = ToyModel("softmax")
    with torch.no_grad():
        _, state = model.step(PREFIX, model.init_state([0, 1, 2]))
    static = static_state(state, room=3, device=PREFIX.device)
    for options in (dict(), dict(beam=2)):
        with pytest.raises(ValueError, match=r"prefix of 1 and max_len=5: the static KV cache has room for 3 more "
                                             r"positions \(2 of 5 filled\), 6 asked"):
            generate(model.step, static, PREFIX[:, -1:], max_len=5, **options)
        long_prefix = PREFIX[:, -1:].repeat(1, 4)
        with pytest.raises(ValueError, match=r"prefix of 4 and max_len=1: .* room for 3 more positions"):
            generate(model.step, static, long_prefix, max_len=1, **options)
    assert generate(model.step, static, PREFIX[:, -1:], max_len=2).tokens.shape[0] == 3  # what fits decodes


# --------------------------------------------------------------------------------------
# Frames


def frame_step(stop_at):
    """y = x + 1; row b's stop logit is +2 from its step stop_at[b] on (1-based), -2 before."""
    stop_at = torch.tensor(stop_at)

    def step(x, count):
        count = count + 1
        stop_logit = torch.where(count >= stop_at, 2.0, -2.0)[:, None]
        return x + 1, stop_logit, count

    return step


def test_generate_frames_stops_at_the_threshold():
    start = torch.zeros(2, 1, 3)
    out = generate_frames(frame_step([3, 5]), torch.zeros(2, dtype=torch.long), start, max_steps=10)
    assert out.frames.shape == (2, 5, 3) and out.lengths.tolist() == [3, 5]
    assert torch.equal(out.frames[:, :, 0], torch.arange(1.0, 6.0).expand(2, 5))  # each step fed back
    sigmoid2 = 1 / (1 + math.exp(-2))
    assert out.stop_probs[0].tolist() == pytest.approx([1 - sigmoid2] * 2 + [sigmoid2] * 3)
    # a threshold above every probability: no row stops, max_steps is the limit
    out = generate_frames(frame_step([3, 5]), torch.zeros(2, dtype=torch.long), start, max_steps=4,
                          stop_threshold=0.95)
    assert out.frames.shape == (2, 4, 3) and out.lengths.tolist() == [4, 4]
    # feedback: the next input is 2 y
    out = generate_frames(frame_step([3, 3]), torch.zeros(2, dtype=torch.long), start, max_steps=9,
                          feedback=lambda y: 2 * y)
    assert out.frames[0, :, 0].tolist() == [1.0, 3.0, 7.0] and out.lengths.tolist() == [3, 3]


def test_generate_frames_bad_arguments():
    start = torch.zeros(2, 1, 3)
    with pytest.raises(ValueError, match="max_steps=0"):
        generate_frames(frame_step([1, 1]), torch.zeros(2), start, max_steps=0)
    with pytest.raises(ValueError, match="stop_threshold=1.5"):
        generate_frames(frame_step([1, 1]), torch.zeros(2), start, max_steps=3, stop_threshold=1.5)
    with pytest.raises(ValueError, match="start"):
        generate_frames(frame_step([1, 1]), torch.zeros(2), torch.zeros(2, 3), max_steps=3)


def source_parts(cross_state) -> list:
    """The tensors of a cross-attention state that hold the source: read by every step,
    never changed (softmax's projected keys and values, LAVO's prepared source, GSA's
    causal source or noncausal final state)."""
    if hasattr(cross_state, "k"):  # softmax KVCache
        return [cross_state.k, cross_state.v]
    if hasattr(cross_state, "basis"):  # LavoState
        return [cross_state.source.keys, cross_state.source.values, cross_state.source.means]
    if cross_state.source is not None:  # gsa CC
        return list(cross_state.source[:3])
    return list(cross_state.memory)  # gsa NC


@pytest.mark.parametrize(("name", "cross", "cross_causal"),
                         [(n, c, causal) for n, c in model_cases() if c for causal in (True, False)])
def test_beam_reorder_leaves_the_source_alone(name, cross, cross_causal):
    """Beam search reorders only what a step changes: the source parts stay the same
    tensors (never re-indexed), and a step from that state equals the step from the
    state recomputed for the chosen hypotheses."""
    model = ToyModel(name, cross, cross_causal)
    beam, rows = 2, torch.arange(3)
    parents = torch.tensor([1, 1, 2, 3, 5, 4])  # within each sequence's beam rows
    tokens = torch.tensor([[6], [9], [3], [6], [2], [8]])
    expand = rows.repeat_interleave(beam)
    with torch.no_grad():
        _, state = model.step(PREFIX, model.init_state(rows))
        static = static_state(reorder(state, expand), room=4, device=torch.device("cpu"))
        static, changing, fixed_shape = own_buffers(static, lambda s: model.step(tokens, s)[1], parents)
        assert fixed_shape
        partly = reorder_changing(static, parents, changing)
        for layer_static, layer_partly in zip(static, partly):
            for a, b in zip(source_parts(layer_static.cross_attn), source_parts(layer_partly.cross_attn), strict=True):
                assert a is b
        got_logits, got_state = model.step(tokens, partly)
        _, fresh = model.step(PREFIX[expand[parents]], model.init_state(expand[parents]))
        want_logits, want_state = model.step(tokens, static_state(fresh, room=4, device=torch.device("cpu")))
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-10, atol=1e-10)
    for got, want in zip(got_state, want_state):
        assert_states_close(got.self_attn, want.self_attn)


def test_reorder_of_one_row_is_a_view():
    state = torch.randn(1, 5, 3)
    out = reorder(state, torch.zeros(4, dtype=torch.long))
    assert out.shape == (4, 5, 3) and out.stride(0) == 0 and out.data_ptr() == state.data_ptr()
    assert torch.equal(out, state.expand(4, 5, 3))
