"""Captured decoding (lavo_tasks.generation with cuda_graph) on a GPU (marker `gpu`), and
the argument's checks and the static KV cache on the CPU.

On the GPU, for every attention as the self-attention (with a causal and a noncausal
cross-attention over a padded memory), in fp32 and under bf16 autocast: greedy decoding
and beam search captured as CUDA graphs give the tokens, lengths and scores of the same
decode run eagerly, with no_repeat_ngram, min_len and an end token that ends some rows
before others; the frame loop likewise.
"""

import pytest
import torch
from torch import nn

from lavo_tasks.attention import ATTENTION_NAMES
from lavo_tasks.generation import (_Beam, _GreedyOrSample, _Rules, generate, generate_frames, reorder,
                                   static_state)
from lavo_tasks.stacks import Decoder
from attention_cases import attention_cfg, make_block, patterns_of

VOCAB, EOS, PAD, D_MODEL, HEADS, SOURCE = 64, 1, 0, 128, 2, 40


class Model(nn.Module):
    """Embedding -> Decoder (self-attention `name`, cross-attention `cross` over a random
    memory whose last positions are padding in row 1) -> a linear head, peaked, whose eos
    logit jumps after some tokens, so that eos ends some hypotheses early."""

    def __init__(self, name: str, cross: str, cross_causal: bool, device: str = "cuda"):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.decoder = Decoder(d_model=D_MODEL, n_heads=HEADS, n_layers=2, self_attention=attention_cfg(name),
                               cross_attention=attention_cfg(cross), d_ff=256, cross_causal=cross_causal)
        self.head = nn.Linear(D_MODEL, VOCAB)
        with torch.no_grad():
            self.head.weight.mul_(4.0)
            self.head.bias[EOS] += 1.0
        self.to(device).eval()
        self.memory = torch.randn(3, SOURCE, D_MODEL, device=device)
        self.memory_mask = torch.ones(3, SOURCE, dtype=torch.bool, device=device)
        self.memory_mask[1, SOURCE - 7 :] = False

    def init_state(self):
        return self.decoder.init_state(3, self.memory, self.memory_mask)

    def step(self, tokens, state):
        y, state = self.decoder.step(self.embed(tokens), state)
        logits = self.head(y)
        # eos likely after a token = 3 mod 4, so that rows end at different steps
        logits[..., EOS] += 6.0 * (tokens % 4 == 3)
        return logits, state


def model_cases():
    """(self-attention, cross-attention, causal cross) for every attention: itself at the
    cross site where it can serve both patterns, softmax otherwise."""
    for name in ATTENTION_NAMES:
        cross = name if {"CC", "NC"} <= patterns_of(name) else "softmax"
        for cross_causal in (True, False):
            yield name, cross, cross_causal


def gpu_cases():
    for case in model_cases():
        for dtype in ("fp32", "bf16"):
            yield pytest.param(*case, dtype, marks=pytest.mark.gpu)


def _decode(model, dtype, **options):
    prefix = torch.tensor([[2, 5], [7, 3], [4, 4]], device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        return generate(model.step, model.init_state(), prefix, eos_id=EOS, pad_id=PAD, **options)


@pytest.mark.parametrize(("name", "cross", "cross_causal", "dtype"), list(gpu_cases()))
def test_captured_decode_equals_eager(name, cross, cross_causal, dtype):
    model = Model(name, cross, cross_causal)
    for options in (dict(max_len=24, min_len=3, no_repeat_ngram=2), dict(max_len=20, min_len=2, beam=3),
                    dict(max_len=12, beam=4, no_repeat_ngram=3, length_penalty=0.5)):
        eager = _decode(model, dtype, cuda_graph=False, **options)
        captured = _decode(model, dtype, cuda_graph=True, **options)
        assert torch.equal(captured.tokens, eager.tokens), options
        assert torch.equal(captured.lengths, eager.lengths), options
        torch.testing.assert_close(captured.scores, eager.scores, rtol=1e-6, atol=1e-6)
        assert eager.lengths.min() < options["max_len"] or options.get("beam"), "some row should end early"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "lavo", "gsa"])
def test_captured_frames_equal_eager(name):
    torch.manual_seed(0)
    decoder = Decoder(d_model=D_MODEL, n_heads=HEADS, n_layers=2, self_attention=attention_cfg(name),
                      cross_attention=attention_cfg(name), d_ff=256, cross_causal=True).cuda().eval()
    project, stop = nn.Linear(D_MODEL, 8).cuda(), nn.Linear(D_MODEL, 1).cuda()
    lift = nn.Linear(8, D_MODEL).cuda()
    memory = torch.randn(2, SOURCE, D_MODEL, device="cuda")

    def step(x, state):
        h, state = decoder.step(lift(x), state)
        # row 1 stops once its stop logit, which grows with the frames' drift, passes 0
        return project(h), stop(h)[..., 0] + 0.5 * x.abs().sum(-1) - 3.0, state

    def run(cuda_graph):
        start = torch.zeros(2, 1, 8, device="cuda")
        return generate_frames(step, decoder.init_state(2, memory), start, max_steps=40, cuda_graph=cuda_graph)

    eager, captured = run(False), run(True)
    assert torch.equal(captured.lengths, eager.lengths)
    assert torch.equal(captured.frames, eager.frames) and torch.equal(captured.stop_probs, eager.stop_probs)


def test_cuda_graph_on_a_cpu_names_the_argument():
    step = lambda tokens, state: (torch.zeros(len(tokens), tokens.shape[1], 5), state)  # noqa: E731
    with pytest.raises(ValueError, match="cuda_graph=True: CUDA graphs need a CUDA device"):
        generate(step, torch.zeros(1), torch.tensor([[0]]), max_len=3, cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph=True"):
        generate_frames(lambda x, s: (x, x[..., 0], s), torch.zeros(1), torch.zeros(1, 1, 2), max_steps=2,
                        cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph='yes'"):
        generate(step, torch.zeros(1), torch.tensor([[0]]), max_len=3, cuda_graph="yes")


@pytest.mark.parametrize("alibi", [False, True])
def test_static_kv_cache_steps_like_the_growing_cache(alibi):
    """softmax (CS) from a static cache with room, the position a 0-dim tensor: the
    outputs of the growing KV cache, and the buffers hold the keys it grew."""
    block = make_block("softmax", "CS", alibi=alibi).eval().double()
    x = torch.randn(2, 9, block.d_model, dtype=torch.float64)
    with torch.no_grad():
        _, grown = block(x[:, :4], state=block.init_state(2))
        static = static_state(grown, room=5, device=x.device)
        assert static.k.shape[2] == 9 and static.position.dim() == 0
        for t in range(4, 9):
            want, grown = block(x[:, t : t + 1], state=grown)
            got, static = block(x[:, t : t + 1], state=static)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(static.k, grown.k, rtol=0, atol=0)
    assert int(static.position) == 9


HOST_READS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist")


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize(("name", "cross", "cross_causal"), list(model_cases()))
def test_a_decode_step_never_reads_the_device(name, cross, cross_causal, padded, monkeypatch):
    """A captured step must not read a tensor back to the host (a CUDA graph cannot wait
    for one, and the capture fails): greedy and beam steps (the model step, the rules,
    the choice, the bookkeeping) run here with every such read from Python raising (a
    read inside a torch op, e.g. a 0-dim tensor as arange's start, is not seen here)."""
    model = Model(name, cross, cross_causal, device="cpu")
    if not padded:
        model.memory_mask = None
    prefix = torch.tensor([[2, 5], [7, 3], [4, 4]])
    rules = _Rules(min_len=2, eos_id=EOS, no_repeat_ngram=2)
    with torch.no_grad():
        logits, state = model.step(prefix, model.init_state())
        greedy = _GreedyOrSample(model.step, state, logits[:, -1], prefix, rules, max_len=6, pad_id=PAD,
                                 temperature=0.0, top_k=0, top_p=1.0, generator=None)
        expand = torch.arange(3).repeat_interleave(2)
        beam = _Beam(model.step, reorder(state, expand), logits[expand, -1], prefix[expand], rules, beam=2,
                     max_len=6, pad_id=PAD, length_penalty=1.0)
        for search in (greedy, beam):
            search.choose()
        for read in HOST_READS:
            monkeypatch.setattr(torch.Tensor, read, _refuse(read))
        for search in (greedy, beam):
            search.advance()
            search.advance()


def _refuse(read):
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"a decode step read a tensor back to the host (Tensor.{read})")

    return refuse


@pytest.mark.gpu
@pytest.mark.parametrize("own_generator", [False, True])
def test_a_failed_capture_leaves_the_random_state_as_eager_decoding_would(own_generator, capsys):
    """A step that draws noise from the default CUDA generator and then reads a tensor back
    to the host cannot be captured: the decode falls back to eager steps with a notice, and
    samples exactly what a decode run eagerly from the same seeds samples (the warm-up
    steps and the failed capture drew nothing that counts)."""

    def step(tokens, state):
        noise = torch.rand(tokens.shape[0], tokens.shape[1], VOCAB, device="cuda")
        if noise.sum() < 0:  # a host read: never true, but the capture cannot wait for it
            raise AssertionError("rand gave a negative number")
        logits = 3.0 * torch.nn.functional.one_hot((tokens * 7 + 3) % VOCAB, VOCAB).float() + 2.0 * noise
        return logits, state + 1

    def run(cuda_graph):
        torch.manual_seed(0)
        generator = torch.Generator(device="cuda").manual_seed(1) if own_generator else None
        prefix = torch.tensor([[2], [5]], device="cuda")
        return generate(step, torch.zeros(2, device="cuda"), prefix, max_len=12, temperature=1.0,
                        generator=generator, cuda_graph=cuda_graph)

    eager = run(False)
    next_after_eager = torch.rand(4, device="cuda")  # the default generator's state after the decode
    fallback = run(True)
    next_after_fallback = torch.rand(4, device="cuda")
    assert "could not be captured" in capsys.readouterr().err
    assert torch.equal(fallback.tokens, eager.tokens)
    torch.testing.assert_close(fallback.scores, eager.scores, rtol=0, atol=0)
    assert torch.equal(next_after_fallback, next_after_eager)
